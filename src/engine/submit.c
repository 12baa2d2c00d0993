/* SPDX-License-Identifier: MIT */
/* Submitting: single tasks and batches go through the submitting thread's
 * own ring (ring.h), or the shared lock-free inbox (inbox.h) when the pool
 * has one worker or every ring is taken. A ring never fills (ring.h); only
 * a full inbox, or a batch larger than it, takes the queue lock to move
 * tasks along. */
#include <errno.h>
#include <limits.h>

#include "engine.h"
#include "invariant.h"
#include "seam.h"
#include "wake.h"

/* What make_room did: QUEUED, the tasks are in the queue; ROOM, the ring
 * has room again (reserve); or a negative errno. */
enum { QUEUED = 0, ROOM = TKO__INBOX_ROOM };

/* A submitter that drained (the rings, the inbox) into the queue under the
 * lock publishes backlog seq_cst (tko__publish_backlog_seq): other
 * threads' tasks may be among those moved, whose submits saw a worker
 * searching and woke nobody, and a sleeper's re-check now finds them only
 * in backlog. */

/* Caller holds shard 0's lock (the inbox's) and has drained: puts n tasks
 * (all carrying ctx) straight into its queue, on positions claimed past
 * the inbox, when the inbox has no room for them - head waits at a
 * reservation that is not published yet, or the batch is larger than the
 * inbox. */
static int claim_locked(tko_pool *pool, const tko_task *tasks, size_t n, uintptr_t ctx,
                        uint64_t enq_ns, uint64_t *id) {
  tko__shard *first = &pool->shards[0];
  tko__queue *q = ctx & TKO__CTX_HELD ? &pool->held : &first->queue;
  if (tko__inbox_has_room(&pool->inbox, n)) return ROOM; /* the drain made some */
  /* Room for all first, so that no push below can fail (all or nothing). */
  int rc = tko__queue_reserve(q, n);
  if (rc == 0) rc = tko__queue_reserve_buckets(q, n);
  uint64_t pos;
  if (rc == 0) rc = tko__inbox_claim(&pool->inbox, n, &pos);
  if (rc) return rc;
  if (id) *id = pos + 1; /* the first task's, before any can start */
  for (size_t i = 0; i < n; i++) {
    tko__item item = {.fn = tasks[i].fn, .arg = tasks[i].arg, .ctx = ctx, .id = pos + i + 1,
                      .enq_ns = enq_ns, .weight = tasks[i].weight};
    (void)tko__queue_push(q, &item); /* cannot fail: reserved above */
  }
  tko__refresh_backlog(pool, first);
  tko__publish_backlog_seq(first);
  return QUEUED;
}

/* How many steps a submitter waits for another one's room making before
 * it goes round it (that one may have been stopped: preempted, or in a
 * debugger); 32 of them spin, the rest yield. */
enum { ROOM_WAIT_STEPS = 256 };

/* The inbox is full: move it into the queue ourselves (workers are busy),
 * and when that frees no room - head waits at a reservation not yet
 * published - put the tasks straight into the queue.
 * One submitter at a time does: another that finds one at it waits for
 * head to move (or for it to finish) and lets its caller retry, rather
 * than queue for the lock behind it and then move what little came in
 * meanwhile while the workers wait (`probe_flood submit 4`: four producers,
 * four interleaved weights). One producer never meets another room maker,
 * so nothing changes for it. It waits for a room maker, not for the queue
 * lock: waiting whenever the lock is held would cost one producer on fresh
 * pools, where a worker's drain also grows the queue (bench_quick, fresh
 * pools). */
static int make_room(tko_pool *pool, const tko_task *tasks, size_t n, uintptr_t ctx,
                     uint64_t enq_ns, uint64_t *id) {
  uint64_t before = tko__load_relaxed(&pool->inbox.head);
  /* Acquire: pairs with the release that gives the role back below. Only
   * the role is handed over; the inbox's own orderings (inbox.h) cover
   * the tasks, and the spin's relaxed loads are hints to retry. */
  bool role = !atomic_exchange_explicit(&pool->room_maker, 1, memory_order_acquire);
  if (!role) {
    unsigned spins = 0;
    while (tko__load_relaxed(&pool->room_maker) &&
           tko__load_relaxed(&pool->inbox.head) == before && spins < ROOM_WAIT_STEPS)
      tko__wait_step(spins++, 32);
    if (spins < ROOM_WAIT_STEPS) return ROOM;
  }
  tko__shard *first = &pool->shards[0];
  tko__lock_acquire(&first->lock);
  /* An out-of-memory drain may still have made room; if not, the claim's
   * own reservation in the queue fails the same way. */
  (void)tko__shard_drain_locked(pool, first);
  int rc = claim_locked(pool, tasks, n, ctx, enq_ns, id);
  tko__unlock(&first->lock);
  if (role) tko__store_release(&pool->room_maker, 0);
  return rc;
}

/* The seam of inbox.h (seam.h: a constant NULL outside the test library). */
typedef void (*publish_seam)(uint64_t pos, bool published);
static publish_seam seam_now(void) { return TKO__SEAM(tko__test_publish_window); }

uint64_t tko__enqueue_time(tko_pool *pool) {
  return pool->stamp_enqueue ? tko__now_ns() : 0;
}

enum { ADMITTED = TKO__ADMITTED, RUN_HERE = TKO__RUN_HERE };

/* Runs one task on the calling thread (caller-runs); the caller is inside
 * the gate. */
static void run_on_caller(tko_pool *pool, tko_task_fn fn, void *arg, uintptr_t ctx, int weight) {
  tko__item item = {.fn = fn, .arg = arg, .ctx = ctx, .weight = weight,
                    .enq_ns = tko__enqueue_time(pool)};
  /* seq_cst: counted as submitted before it can count as finished. */
  tko__add_seq(&pool->caller_runs, 1);
  if (ctx & TKO__CTX_HELD) {
    /* It counts as in flight like any started held task (its source gives
     * the count back); caller-runs does not ask the source. */
    tko__shard *first = &pool->shards[0]; /* the held queue's */
    tko__lock_acquire(&first->lock);
    pool->held_running++;
    tko__store_relaxed(&pool->held_inflight, pool->held_running); /* under lock */
    tko__refresh_backlog(pool, first);
    tko__unlock(&first->lock);
  }
  tko_pool *prev = tko__enter_pool(pool);
  tko__run_item(pool, &pool->caller, &item);
  tko__leave_pool(prev);
  tko__notify_idle(pool);
}

/* Caller-runs: the tasks run here, inside the gate, so a shutdown waits for
 * them; all of them or (-ESHUTDOWN, once the pool is closed) none. */
static int run_here(tko_pool *pool, const tko_task *tasks, size_t n, uintptr_t ctx) {
  int rc = tko__gate_enter(pool);
  if (rc) return rc;
  for (size_t i = 0; i < n; i++) run_on_caller(pool, tasks[i].fn, tasks[i].arg, ctx, tasks[i].weight);
  tko__gate_leave(pool);
  return 0;
}

/* How long a submitter whose ring holds a segment's worth waits for the
 * workers to move it before it grows the ring (wait_for_room). */
#define ROOM_WAIT_NS 1000000u

/* The seam of a full ring (engine.h; seam.h: a constant NULL outside the
 * test library). */
#ifdef TKO_TEST_SEAMS
void (*_Atomic tko__test_full_ring_window)(tko_pool *pool);
#endif
typedef void (*full_ring_seam)(tko_pool *pool);

/* The ring holds a segment's worth that no drain has moved: the workers
 * are behind. A ring never fills, so the submitter needs no lock to go on;
 * it waits a moment for the workers to move the backlog, so that a
 * producer faster than the workers is held to their pace rather than grow
 * its ring without end, taking no lock and holding nothing (a submitter
 * stopped here holds up no one). It does not wait where no drain may come:
 * on a paused pool (a take moves nothing then), or in a task of the pool,
 * whose worker may be the one to drain; nor longer than ROOM_WAIT_NS (the
 * workers may all be blocked, in tasks that wait for this thread), after
 * which the ring grows. Relaxed loads of head: a hint. */
static void wait_for_room(tko_pool *pool, tko__ring *r, uint64_t t) {
  full_ring_seam seam = TKO__SEAM(tko__test_full_ring_window);
  if (seam) seam(pool);
  if (tko__current_pool == pool || tko__load_relaxed(&pool->paused)) return;
  /* The last wait ran out and no drain came since: the workers are still
   * held, so this one would run out too. */
  uint64_t h = tko__load_relaxed(&r->head);
  if (h == r->waited_in_vain) return;
  uint64_t deadline = 0;
  for (unsigned step = 0; t - h >= TKO__RING_CAPACITY; step++, h = tko__load_relaxed(&r->head)) {
    tko__wait_step(step, 32);
    if (step % 64 != 63) continue;
    uint64_t now = tko__now_ns();
    if (!deadline) {
      deadline = now + ROOM_WAIT_NS;
    } else if (now > deadline) {
      r->waited_in_vain = h;
      return;
    }
  }
}

/* Puts n tasks into the calling thread's ring r and publishes them with
 * one CAS (ring.h), a batch of any size included: all or (-ENOMEM, when
 * a segment could not be had; -ESHUTDOWN) none. No lock is taken. */
static int ring_enqueue(tko_pool *pool, tko__ring *r, const tko_task *tasks, size_t n,
                        uintptr_t ctx, uint64_t enq_ns, uint64_t *id) {
  /* Only this thread moves the tail (the close sets a bit). Acquire: a
   * thread that took the ring over from one that ended (ring.h: owners)
   * sees what that one wrote before its last publish, wseg included. */
  uint64_t t = tko__load_acquire(&r->tail);
  if (t & TKO__RING_CLOSED) return -ESHUTDOWN;
  tko__ring_seg *const first = r->wseg, *seg = first;
  /* Past its segment: once a segment's worth, never per task. */
  if (t + n - 1 - seg->base >= TKO__RING_CAPACITY &&
      t - tko__load_relaxed(&r->head) >= TKO__RING_CAPACITY)
    wait_for_room(pool, r, t);
  for (size_t i = 0; i < n; i++) {
    seg = tko__ring_seg_for(r, seg, t + i);
    if (!seg) return -ENOMEM;
    tko__ring_write(seg, t + i, tasks[i].fn, tasks[i].arg, ctx, tasks[i].weight, enq_ns);
  }
  if (id) *id = r->id_base | (t + 1); /* the first task's (ring.h), before the publish */
  publish_seam seam = seam_now();
  if (seam) seam(r->id_base | t, false);
  r->wseg = seg; /* before the publish, which releases it (above) */
  int rc = tko__ring_publish(r, t, n);
  if (rc) {
    r->wseg = first; /* the tail did not move: the next write starts there */
    return rc;
  }
  if (seam) seam(r->id_base | t, true);
  return 0;
}

/* Raises the pool's weight ceiling (pool.h) to weight, before the task
 * it belongs to is published: a worker's take or recheck that moves the
 * task (acquiring its publish) then reads the new ceiling. Relaxed, the
 * load and the CAS: the line is read-mostly and written only by a weight
 * heavier than any before; the publish's release orders it. */
static void raise_ceiling(tko_pool *pool, int weight) {
  int seen = tko__load_relaxed(&pool->weight_ceiling);
  while (weight > seen && !tko__cas_relaxed(&pool->weight_ceiling, &seen, weight)) {
  }
}

/* Publishes the task in the thread's ring, or reserves an inbox slot and
 * publishes it there, or queues it directly when the inbox has no room
 * (after admit; a failure leaves the room it
 * took to the caller). *id (id not NULL): the task's id, stored before the
 * task is published, so before it can start. */
static int enqueue(tko_pool *pool, tko_task_fn fn, void *arg, uintptr_t ctx, int weight,
                   uint64_t *id) {
  if (tko__pool_refusing(pool)) return -ESHUTDOWN; /* never seems to reopen */
  uint64_t enq_ns = tko__enqueue_time(pool);
  raise_ceiling(pool, weight);
  /* A held task goes through the inbox where there are several shards:
   * the held queue is shard 0's (shard.c). */
  tko__ring *r = ctx & TKO__CTX_HELD && pool->nshards > 1 ? NULL : tko__rings_mine(&pool->rings);
  if (r) {
    tko_task task = {fn, arg, weight};
    int rc = ring_enqueue(pool, r, &task, 1, ctx, enq_ns, id);
    if (rc == 0) tko__signal_work(pool);
    return rc;
  }
  uint64_t pos;
  int rc;
  while ((rc = tko__inbox_reserve(&pool->inbox, 1, &pos)) == -EAGAIN) {
    tko_task task = {fn, arg, weight};
    rc = make_room(pool, &task, 1, ctx, enq_ns, id);
    if (rc == QUEUED) {
      tko__signal_work(pool);
      return 0;
    }
    if (rc != ROOM) return rc;
  }
  if (rc) return rc;
  if (id) *id = pos + 1; /* inbox.c's id for pos */
  publish_seam seam = seam_now();
  if (seam) seam(pos, false);
  tko__inbox_publish(&pool->inbox, pos, fn, arg, ctx, weight, enq_ns);
  if (seam) seam(pos, true);
  tko__signal_work(pool);
  return 0;
}

/* may_run_here false: a full caller-runs queue waits as a blocking one. */
static int submit_item(tko_pool *pool, tko_task_fn fn, void *arg, uintptr_t ctx, int weight,
                       long timeout_ms, bool may_run_here, uint64_t *id) {
  int rc = tko__pool_check(pool);
  if (rc) return rc;
  tko_full_policy policy = pool->opts.full_policy;
  if (!may_run_here && policy == TKO_FULL_CALLER_RUNS) policy = TKO_FULL_BLOCK;
  bool gated;
  rc = tko__admit(pool, 1, timeout_ms, policy, &gated);
  if (rc == RUN_HERE) {
    tko_task task = {fn, arg, weight};
    if (id) *id = 0; /* a caller-runs task has no id (its hooks see 0), stored before it ends */
    return run_here(pool, &task, 1, ctx); /* never gated: caller-runs does not wait */
  }
  if (rc == ADMITTED) {
    rc = enqueue(pool, fn, arg, ctx, weight, id);
    if (rc) tko__release_room(pool, 1);
  }
  if (gated) tko__gate_leave(pool); /* after the last touch of a pool that may be closing */
  return rc;
}

int tko__submit_item(tko_pool *pool, tko_task_fn fn, void *arg, uintptr_t ctx, int weight,
                     long timeout_ms) {
  return submit_item(pool, fn, arg, ctx, weight, timeout_ms, true, NULL);
}

int tko__submit_item_id(tko_pool *pool, tko_task_fn fn, void *arg, uintptr_t ctx, int weight,
                        uint64_t *id) {
  return submit_item(pool, fn, arg, ctx, weight, -1, true, id);
}

/* The keyed table's runners (lifecycle.h: an internal owner's tasks). */
static int submit_internal(tko_pool *pool, uintptr_t ctx, tko_task_fn fn, void *arg, int weight) {
  /* seq_cst: counted out before the inbox reservation that counts it
   * submitted, so stats never count it as a task (pool.c). */
  tko__add_seq(&pool->runners_out, 1);
  int rc = enqueue(pool, fn, arg, ctx, weight, NULL);
  /* Never queued: counted neither submitted nor done, so it is counted
   * out no more either (test
   * faults/a_keyed_runner_the_queue_has_no_room_for_leaves_the_counts_balanced). */
  if (rc) tko__sub_seq(&pool->runners_out, 1);
  return rc;
}

int tko__submit_owned(tko_pool *pool, tko__task_owner *owner, tko_task_fn fn, void *arg,
                      int weight, long timeout_ms, bool run_here) {
  uintptr_t ctx = (uintptr_t)owner | TKO__CTX_ALONE;
  if (owner->kind->internal) return submit_internal(pool, ctx, fn, arg, weight);
  return submit_item(pool, fn, arg, ctx, weight, timeout_ms, run_here, NULL);
}

int tko__run_owned_here(tko_pool *pool, tko__task_owner *owner, tko_task_fn fn, void *arg,
                        int weight) {
  int rc = tko__pool_check(pool);
  if (rc) return rc;
  TKO__INVARIANT(!owner->kind->internal); /* an internal owner's task never runs here */
  run_on_caller(pool, fn, arg, (uintptr_t)owner | TKO__CTX_ALONE, weight);
  return 0;
}

int tko_submit(tko_pool *pool, tko_task_fn fn, void *arg, int weight) {
  if (!fn) return -EINVAL;
  return tko__submit_item(pool, fn, arg, 0, weight, -1);
}

int tko_submit_timed(tko_pool *pool, tko_task_fn fn, void *arg, int weight, long timeout_ms) {
  if (!fn || timeout_ms < -1) return -EINVAL;
  return tko__submit_item(pool, fn, arg, 0, weight, timeout_ms);
}

/* Queues a batch admit let in: through the thread's ring, or the inbox,
 * or straight into the queue when it is larger than the inbox (positions
 * claimed past the inbox's, so its ids stay consecutive) or the inbox has
 * no room for it. */
static int enqueue_batch(tko_pool *pool, const tko_task *tasks, size_t n, int heaviest) {
  if (tko__pool_refusing(pool)) return -ESHUTDOWN; /* as enqueue's */
  uint64_t enq_ns = tko__enqueue_time(pool);
  raise_ceiling(pool, heaviest);
  tko__inbox *in = &pool->inbox;
  tko__ring *r = tko__rings_mine(&pool->rings);
  int rc;
  if (r) {
    rc = ring_enqueue(pool, r, tasks, n, 0, enq_ns, NULL);
  } else if (n > in->mask + 1) {
    tko__shard *first = &pool->shards[0];
    tko__lock_acquire(&first->lock);
    rc = tko__shard_drain_locked(pool, first);
    if (rc == 0) rc = claim_locked(pool, tasks, n, 0, enq_ns, NULL); /* never ROOM: too big */
    tko__unlock(&first->lock);
  } else {
    uint64_t pos;
    bool queued = false;
    while ((rc = tko__inbox_reserve(in, n, &pos)) == -EAGAIN) {
      rc = make_room(pool, tasks, n, 0, enq_ns, NULL);
      queued = rc == QUEUED;
      if (rc != ROOM) break;
    }
    if (rc == 0 && !queued) {
      publish_seam seam = seam_now();
      if (seam) seam(pos, false);
      tko__inbox_publish_batch(in, pos, tasks, n, 0, enq_ns);
      if (seam) seam(pos, true);
    }
  }
  if (rc) {
    tko__release_room(pool, n);
    return rc;
  }
  tko__signal_work(pool); /* one wake; each woken worker wakes the next */
  return 0;
}

int tko_submit_batch(tko_pool *pool, const tko_task *tasks, size_t n) {
  int rc = tko__pool_check(pool);
  if (rc) return rc;
  if (!tasks || n == 0) return -EINVAL;
  int heaviest = INT_MIN;
  for (size_t i = 0; i < n; i++) {
    if (!tasks[i].fn) return -EINVAL;
    if (tasks[i].weight > heaviest) heaviest = tasks[i].weight;
  }
  bool gated;
  rc = tko__admit(pool, n, -1, pool->opts.full_policy, &gated);
  if (rc == RUN_HERE) return run_here(pool, tasks, n, 0);
  if (rc == ADMITTED) rc = enqueue_batch(pool, tasks, n, heaviest);
  if (gated) tko__gate_leave(pool);
  return rc;
}
