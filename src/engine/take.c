/* SPDX-License-Identifier: MIT */
/* Taking work: a worker's takes from the weighted queues, the tasks it
 * took and has not started going back (a recheck, a shrink, a thread that
 * ends), the recheck itself, the running of a batch taken, and the takes
 * of a wait that helps (tko__help_one, tko__help_member, tko__run_queued)
 * or withdraws its tasks (tko__take_queued).
 *
 * Each take visits one shard's lock - its home shard first, another that
 * holds a heavier task, any other when that one is empty (pick_for_take,
 * tko__take_batch) - and takes a share of that shard's backlog split by
 * the workers there could be, so that one worker does not hoard the work
 * of many (take_from), within a cap set by time (worker.c:
 * size_next_take) and max_batch. Before it starts a task of its batch
 * lighter than the weight ceiling, a worker whose take or last look is
 * older than recheck_ns looks again and hands the rest back if a heavier
 * task waits (recheck_hands_back). */
#include "engine.h"
#include "wake.h"

size_t tko__take_queued(tko_pool *pool, uintptr_t ctx, tko__item *out, size_t max) {
  size_t n = 0;
  for (unsigned i = 0; i < pool->nshards && n < max; i++) {
    tko__shard *sh = &pool->shards[i];
    tko__lock_acquire(&sh->lock);
    tko__shard_drain_locked(pool, sh);
    n += tko__queue_remove_ctx(&sh->queue, ctx, out + n, max - n);
    if (i == 0 && n < max)
      n += tko__queue_remove_ctx(&pool->held, ctx | TKO__CTX_HELD, out + n, max - n);
    tko__refresh_backlog(pool, sh);
    tko__unlock(&sh->lock);
  }
  size_t room = 0;
  for (size_t i = 0; i < n; i++) room += tko__item_room(&out[i]);
  tko__release_room(pool, room);
  return n;
}

bool tko__holds_taken(const tko__worker *w, uintptr_t ctx) {
  for (const tko__batch_frame *b = w->batch; b; b = b->outer)
    for (size_t i = b->next; i < b->n; i++)
      if (b->items[i].ctx == ctx) return true;
  return false;
}

size_t tko__withdraw_owned(tko_pool *pool, tko__task_owner *owner, void **args, size_t max) {
  tko__item batch[TKO__GRAB_MAX];
  if (max > TKO__GRAB_MAX) max = TKO__GRAB_MAX;
  size_t n = tko__take_queued(pool, (uintptr_t)owner | TKO__CTX_ALONE, batch, max);
  for (size_t i = 0; i < n; i++) args[i] = batch[i].arg;
  /* seq_cst: as a cancelled task is counted (tko__cancel_item). */
  if (n) tko__add_seq(owner->kind->internal ? &pool->runners_done : &pool->cancelled, n);
  if (n) tko__notify_idle(pool);
  return n;
}

/* Under the lock: moves every submitted task into the queue, and says
 * whether the pool is paused. paused first, then the drain's tails (the
 * inbox's and every ring's): seq_cst all (plain loads on x86). A take that sees a resume then also
 * sees every task submitted before it, so the tasks queued while paused
 * are all in the queue - and run in priority order - before any is taken.
 * (Read only after the drain, a stale tail plus a fresh resume let a take
 * pick from half the backlog.) And paused again after the drain: a task
 * the drain saw was submitted after a pause that happened before it, which
 * that load then sees. While paused nothing is moved: nothing starts, and
 * a paused backlog waits in its submitters' rings, whose size then says
 * what a burst needs (ring.c: seg_take) whatever the workers did. */
static bool drain_staged_for_take(tko_pool *pool, tko__shard *sh, const tko__ring_stage *st) {
  if (tko__load_seq(&pool->paused)) return true;
  tko__shard_drain_staged(pool, sh, st);
  return tko__load_seq(&pool->paused);
}

static bool drain_for_take(tko_pool *pool, tko__shard *sh) {
  return drain_staged_for_take(pool, sh, NULL);
}

/* Takes up to max tasks from shard sh for w: a share of its backlog. It
 * copies the shard's ring slots before it locks (ring.h: the stage), so
 * that its drain fetches no slot under the lock. */
static size_t take_from(tko_pool *pool, tko__worker *w, tko__shard *sh, tko__item *batch,
                        size_t max) {
  const tko__ring_stage *st = tko__shard_stage(pool, w, sh); /* before the lock */
  tko__lock_acquire(&sh->lock);
  bool paused = drain_staged_for_take(pool, sh, st);
  size_t len = sh->queue.len, n = 0;
  /* The held queue is read, and its source asked, only where it holds a
   * task: a plain task's take pays one load for it. */
  bool held_ready = !paused && sh->index == 0 && pool->held.len && tko__held_may_start(pool);
  if (held_ready && (!len || tko__queue_top_before(&pool->held, &sh->queue))) {
    /* The best task is held: take it alone, while its source allows it. */
    n = tko__queue_pop(&pool->held, batch, 1);
    pool->held_running++;
    tko__store_relaxed(&pool->held_inflight, pool->held_running); /* under lock */
    tko__refresh_backlog(pool, sh);
  } else if (len && !paused) {
    /* Share by the workers there could be, elastic ones included (any of
     * them may take from any shard), so one worker does not hoard tasks
     * that an elastic worker could have run (blocking tasks above all). */
    unsigned workers =
        tko__load_relaxed(&pool->basic_alive) + tko__load_relaxed(&pool->elastic_max);
    size_t share = workers > 1 ? len / workers : len;
    if (share < 1) share = 1;
    if (share > max) share = max;
    if (held_ready) {
      /* The batch ends where a held task that may start comes first, so
       * that equal weights start in submit order across the two queues. */
      while (n < share && sh->queue.len && !tko__queue_top_before(&pool->held, &sh->queue))
        n += tko__queue_pop(&sh->queue, batch + n, 1);
    } else {
      n = tko__queue_pop(&sh->queue, batch, share);
    }
    tko__refresh_backlog(pool, sh);
  }
  tko__unlock(&sh->lock);
  return n;
}

/* A take with several shards drains the others' submissions first when
 * recheck_ns has passed since this worker's last sweep (shard.c: the
 * contract across shards) and the shard it would take from has nothing at
 * the weight ceiling, which no task can outrank. The time is the worker's
 * last clock read - its last batch's end, take's or recheck's - so takes
 * read no clock of their own, except where nothing else reads it: with
 * max_batch 1, and in a helping group wait, whose takes of one task each
 * leave that reading where the wait began: a helping worker would never
 * look at the other shards, and a heavy task there would wait for its
 * whole group (test queues/a_helping_group_wait_looks_at_every_queue).
 * Returns the shard to take from. */
static tko__shard *pick_for_take(tko_pool *pool, tko__worker *w, bool helping) {
  tko__shard *pick = tko__shard_pick(pool, w);
  /* Acquire: pairs with tko__refresh_backlog's release store of top
   * (wake.h), as tko__shard_pick's loads do. Relaxed, the ceiling:
   * submit.c's raise_ceiling. */
  if (tko__load_acquire(&pick->top) >= tko__load_relaxed(&pool->weight_ceiling)) return pick;
  uint64_t now = pool->opts.max_batch > 1 && !helping ? w->clocked_ns : tko__now_ns();
  if (w->swept_ns != TKO__SWEEP_DUE && now - w->swept_ns < pool->recheck_ns) return pick;
  w->swept_ns = now;
  /* Every shard, its own included: a take that goes to another shard
   * (heavier, or its own is empty) does not drain its own, and a heavy
   * task submitted to an idle worker's own shard must not wait out a flood
   * that worker steals from another. */
  tko__shards_sweep(pool, w, NULL);
  return tko__shard_pick(pool, w);
}

/* Takes up to max tasks for worker w; *from: the shard they came from. */
size_t tko__take_batch(tko_pool *pool, tko__worker *w, tko__item *batch, size_t max,
                       tko__shard **from, bool helping) {
  if (pool->nshards == 1) {
    *from = &pool->shards[0];
    return take_from(pool, w, *from, batch, max);
  }
  tko__shard *pick = pick_for_take(pool, w, helping);
  size_t n = take_from(pool, w, pick, batch, max);
  /* Nothing there: every shard in turn, home first. */
  for (unsigned i = 0; n == 0 && i < pool->nshards; i++) {
    tko__shard *sh = &pool->shards[(w->home + i) % pool->nshards];
    if (sh == pick || !tko__shard_work_hint(pool, sh)) continue;
    n = take_from(pool, w, sh, batch, max);
    pick = sh;
  }
  *from = pick;
  /* Idle from here on (it found nothing): its next take sweeps, whatever
   * its last clock reading says, so that its first take after a sleep or a
   * resume cannot start a lighter task before a heavier one still in
   * another shard's ring. */
  if (n == 0) w->swept_ns = TKO__SWEEP_DUE;
  return n;
}

/* ---- handing taken tasks back ----------------------------------------
 *
 * The tasks this thread took and had not started go back to the queue, at
 * the places they were taken from (last taken first, each ahead of the
 * later tasks of its weight: tko__queue_push_ordered). Their room in a
 * bounded queue is still held. Each hold of the lock that puts some back
 * ends with tko__publish_backlog_seq, and the caller then signals the work
 * (tko__runnable_seq, tko__signal_work): the Dekker pair with a sleeper's
 * sleep_prepare RMW and its seq_cst re-check of backlog (signal.c), as a
 * submitter's move into the queue does. */

static tko__queue *queue_of(tko_pool *pool, const tko__batch_frame *b, const tko__item *it) {
  return it->ctx & TKO__CTX_HELD ? &pool->held : &b->shard->queue;
}

/* Under sh's lock: makes room for every task this thread took from sh and
 * has not started, so that put_back_locked cannot fail; false if the
 * queues could not grow. Their slots were freed by the take, and their
 * weights' buckets usually kept, so this allocates nothing in a steady
 * state (pool/steady_state_allocates_nothing_per_task*). */
static bool room_for_taken_locked(tko_pool *pool, const tko__worker *w, tko__shard *sh) {
  tko__queue *qs[2] = {&sh->queue, &pool->held};
  size_t items[2] = {0, 0}, weights[2] = {0, 0}; /* new weights, counted with repeats */
  for (const tko__batch_frame *b = w->batch; b; b = b->outer) {
    if (b->shard != sh) continue;
    for (size_t i = b->next; i < b->n; i++) {
      size_t k = queue_of(pool, b, &b->items[i]) != qs[0];
      items[k]++;
      weights[k] += !tko__queue_has_bucket(qs[k], b->items[i].weight);
    }
  }
  /* The held queue is shard 0's: another shard's lock does not guard it,
   * and its batches hold no held task. */
  for (size_t k = 0; k < (sh->index == 0 ? 2u : 1u); k++) {
    if (tko__queue_reserve(qs[k], items[k])) return false;
    if (weights[k] && tko__queue_reserve_buckets(qs[k], weights[k])) return false;
  }
  return true;
}

/* Under sh's lock, after room_for_taken_locked: puts them back. */
static void put_back_locked(tko_pool *pool, tko__worker *w, tko__shard *sh) {
  for (tko__batch_frame *b = w->batch; b; b = b->outer) {
    while (b->shard == sh && b->n > b->next) {
      const tko__item *it = &b->items[--b->n];
      (void)tko__queue_push_ordered(queue_of(pool, b, it), it); /* cannot fail: reserved */
    }
  }
  tko__refresh_backlog(pool, sh);
  tko__publish_backlog_seq(sh);
}

/* The shard of the innermost frame that still holds tasks not started,
 * NULL if none does. */
static tko__shard *next_taken_shard(const tko__worker *w) {
  for (const tko__batch_frame *b = w->batch; b; b = b->outer)
    if (b->n > b->next) return b->shard;
  return NULL;
}

/* Puts back every task this thread took from sh and has not started, in
 * one hold of sh's lock, all or nothing; false (nothing changed) if the
 * queues could not grow. */
static bool put_back(tko_pool *pool, tko__worker *w, tko__shard *sh) {
  tko__lock_acquire(&sh->lock);
  bool room = room_for_taken_locked(pool, w, sh);
  if (room) put_back_locked(pool, w, sh);
  tko__unlock(&sh->lock);
  return room;
}

/* Puts them back, shard by shard; one the queue cannot take back (no
 * memory) is cancelled. */
void tko__requeue_taken(tko_pool *pool, tko__worker *w) {
  for (tko__shard *sh; (sh = next_taken_shard(w)) != NULL;) {
    bool room = put_back(pool, w, sh);
    /* Without room, one by one: those that fit go back, the rest cancelled. */
    for (tko__batch_frame *b = room ? NULL : w->batch; b; b = b->outer) {
      while (b->shard == sh && b->n > b->next) {
        const tko__item *it = &b->items[--b->n];
        tko__lock_acquire(&sh->lock);
        int rc = tko__queue_push_ordered(queue_of(pool, b, it), it);
        tko__refresh_backlog(pool, sh);
        tko__publish_backlog_seq(sh);
        tko__unlock(&sh->lock);
        if (rc) {
          tko__release_room(pool, tko__item_room(it));
          tko__cancel_item(pool, it);
        }
      }
    }
  }
  w->batch = NULL;
}

/* ---- the recheck: bounded priority inversion ------------------------
 *
 * The contract (taskorch.h, tko_submit): once a submit has returned, no
 * worker starts a lighter task more than recheck_ns later while that task
 * is still queued. A take moves every submitted task into the queue and
 * takes the heaviest, so only the rest of a batch already taken can start
 * after a heavier task came. Before it starts each of those, a worker looks
 * at the queue again - drains it and compares its best task - if recheck_ns
 * has passed since its take or its last look; a heavier task sends the
 * rest of the batch back and the loop takes again. A worker helping inside
 * a group wait looks before each task of its batch too (tko__help_one).
 *
 * A start without a look is in time: a heavier task it passes came after
 * the last look's drain, so less than recheck_ns ago - give or take:
 * - looked_ns after a take is the clock read just after it (the few
 *   instructions since its drain), not before it: size_next_take times the
 *   batch from there, and a slow take - a big drain, a first touch of the
 *   slab - must not shrink the next one;
 * - the clock is read before a batch's second task, then only once per
 *   TKO__CLOCK_STRIDE_NS of work as the tasks since the last read ran
 *   (clock_from_take), so the tasks started since that read add theirs;
 * - a worker descheduled between a look and a start is late by that long,
 *   as any thread would be.
 * A task at the pool's weight ceiling (the heaviest weight ever submitted)
 * needs no look: no task can outrank it, and with aging a task outranks an
 * older one only with a higher weight (queue.c's key). So pools of one
 * weight never read the clock for it. */

/* The look with several shards (shard.c): sweeps every shard, then
 * compares their tops (and, under shard 0's lock, the held queue's best)
 * with *than. The hand-back goes shard by shard, each all or nothing,
 * innermost batch first; one a shard cannot take back (no memory) stays
 * with this thread. True if the innermost batch went back. */
static bool hand_back_across_shards(tko_pool *pool, tko__worker *w, const tko__item *than) {
  tko__shards_sweep(pool, w, NULL);
  w->swept_ns = w->clocked_ns;
  /* seq_cst, after the sweep's drains, as drain_for_take's second load:
   * pairs with tko_pool_pause's store (pool.c). */
  if (tko__load_seq(&pool->paused)) return false; /* nothing outranks: nothing starts */
  bool heavier = tko__shards_outrank(pool, than->weight);
  if (!heavier && tko__load_relaxed(&pool->held_waiting)) {
    tko__shard *first = &pool->shards[0];
    tko__lock_acquire(&first->lock);
    heavier = pool->held.len && tko__queue_outranks(&pool->held, than) &&
              tko__held_may_start(pool);
    tko__unlock(&first->lock);
  }
  if (!heavier) return false;
  tko__batch_frame *inner = w->batch;
  for (tko__shard *sh; (sh = next_taken_shard(w)) != NULL;)
    if (!put_back(pool, w, sh)) break;
  bool all = next_taken_shard(w) == NULL;
  if (all) w->batch = NULL;
  return inner->n == inner->next;
}

/* The look, under one hold of the lock: drains as take_batch does and, if
 * a task queued now outranks *than, puts back what this thread took and
 * has not started (all of it, or - when the queue cannot grow - none: a
 * task is never cancelled for a recheck). Nothing outranks while paused
 * (nothing starts), and a held task only while its source allows one. */
static bool hand_back_if_outranked(tko_pool *pool, tko__worker *w, const tko__item *than) {
  if (pool->nshards > 1) return hand_back_across_shards(pool, w, than);
  tko__shard *sh = &pool->shards[0];
  tko__lock_acquire(&sh->lock);
  bool paused = drain_for_take(pool, sh);
  bool back = !paused &&
              (tko__queue_outranks(&sh->queue, than) ||
               (pool->held.len && tko__queue_outranks(&pool->held, than) &&
                tko__held_may_start(pool))) &&
              room_for_taken_locked(pool, w, sh);
  if (back) put_back_locked(pool, w, sh);
  tko__unlock(&sh->lock);
  if (back) w->batch = NULL;
  return back;
}

static size_t stride_for(uint64_t ns_per_task) {
  if (ns_per_task >= TKO__CLOCK_STRIDE_NS) return 1;
  uint64_t n = TKO__CLOCK_STRIDE_NS / (ns_per_task ? ns_per_task : 1);
  return n < TKO__GRAB_MAX ? (size_t)n : TKO__GRAB_MAX;
}

/* Whether this worker handed what it took back, looking before it starts
 * *next, a later task of a batch it took; the caller then signals the
 * work. The ceiling's load is relaxed: submit.c's raise_ceiling. */
static bool recheck_look(tko_pool *pool, tko__worker *w, const tko__item *next);
static inline bool recheck_hands_back(tko_pool *pool, tko__worker *w, const tko__item *next) {
  w->unclocked++;
  if (next->weight >= tko__load_relaxed(&pool->weight_ceiling)) return false;
  if (w->unclocked < w->clock_stride) return false;
  return recheck_look(pool, w, next);
}

/* The rest of recheck_hands_back, once a clock reading is due: out of
 * line, so that the tasks between two readings pay three tests. */
static bool recheck_look(tko_pool *pool, tko__worker *w, const tko__item *next) {
  uint64_t now = tko__now_ns();
  w->clock_stride = stride_for((now - w->clocked_ns) / w->unclocked);
  w->clocked_ns = now;
  w->unclocked = 0;
  if (now - w->looked_ns < pool->recheck_ns) return false;
  w->looked_ns = now;
  if (!hand_back_if_outranked(pool, w, next)) return false;
  tko__count_own(&w->handbacks);
  return true;
}

/* Runs a batch this worker took. Its cursor lives in the worker, so that a
 * group wait inside one of these tasks can run the batch's remaining tasks
 * itself (tko__help_one): a member of the awaited group may be among them,
 * and nobody else can reach this worker's private batch.
 * A batch taken by the work loop itself (top: no task of this thread below
 * it) stops early when a shrink retires the worker (resize.c): after the
 * task that was running, the rest goes back to the queue; so does it when
 * a recheck finds a heavier task queued (above). */
enum tko__batch_end tko__run_batch(tko_pool *pool, tko__worker *w, const tko__item *batch,
                                   size_t n, tko__shard *from, bool top) {
  tko__batch_frame frame = {batch, n, 0, from, w->batch};
  w->batch = &frame;
  enum tko__batch_end end = TKO__RAN_ALL;
  while (frame.next < frame.n) {
    if (top && frame.next && recheck_hands_back(pool, w, &batch[frame.next])) {
      end = TKO__HANDED_BACK;
      break;
    }
    tko__run_or_cancel(pool, w, &batch[frame.next++]);
    if (top && frame.next < frame.n && tko__resize_hint(pool, w) && tko__resize_retire(pool, w)) {
      end = TKO__RETIRED_MIDWAY;
      break;
    }
  }
  tko__publish_finished(w);
  /* Either sets w->batch to NULL: this frame was the only one. */
  if (end == TKO__RETIRED_MIDWAY) tko__requeue_taken(pool, w);
  if (end != TKO__RAN_ALL && tko__runnable_seq(pool)) tko__signal_work(pool);
  w->batch = frame.outer;
  return end;
}

/* Only from a queue's next bucket, and only where no other queue's top is
 * heavier, after the look at the other queues' submissions that a take
 * makes once the recheck period has passed: a member goes before the
 * tasks of its own weight, never before a heavier one, so the weight order
 * and the recheck bound hold. */
bool tko__help_member(tko_pool *pool, tko__worker *w, uintptr_t ctx) {
  if (pool->nshards > 1) (void)pick_for_take(pool, w, true);
  for (unsigned i = 0; i < pool->nshards; i++) {
    tko__shard *sh = &pool->shards[(w->home + i) % pool->nshards];
    tko__item item;
    tko__lock_acquire(&sh->lock);
    bool paused = drain_for_take(pool, sh);
    bool found = !paused && sh->queue.len &&
                 !tko__shards_outrank(pool, tko__queue_top_weight(&sh->queue)) &&
                 tko__queue_remove_newest_top(&sh->queue, ctx, &item);
    if (found) tko__refresh_backlog(pool, sh);
    tko__unlock(&sh->lock);
    if (paused) return false;
    if (found) {
      tko__run_batch(pool, w, &item, 1, sh, false);
      return true;
    }
  }
  return false;
}

bool tko__run_queued(tko_pool *pool, tko__worker *w, uintptr_t ctx) {
  for (unsigned i = 0; i < pool->nshards; i++) {
    tko__shard *sh = &pool->shards[i];
    tko__item item;
    tko__lock_acquire(&sh->lock);
    bool paused = drain_for_take(pool, sh);
    bool found = !paused && tko__queue_remove_ctx(&sh->queue, ctx, &item, 1) == 1;
    if (found) tko__refresh_backlog(pool, sh);
    tko__unlock(&sh->lock);
    if (paused) return false;
    if (found) {
      /* Its room goes back as the task starts (run_or_cancel), as for a
       * task a take moved out. */
      tko__run_batch(pool, w, &item, 1, sh, false);
      return true;
    }
  }
  return false;
}

bool tko__help_one(tko_pool *pool, tko__worker *w) {
  tko__batch_frame *b = w->batch;
  if (b && b->next < b->n) { /* this worker's own batch first... */
    if (!recheck_hands_back(pool, w, &b->items[b->next])) {
      tko__run_or_cancel(pool, w, &b->items[b->next++]);
      tko__publish_finished(w);
      return true;
    }
    /* ...unless a heavier task waited: the batch went back (each frame's n
     * dropped to its next, so the loops below end) and the wait takes. */
    if (tko__runnable_seq(pool)) tko__signal_work(pool);
  }
  tko__item item;
  tko__shard *from;
  if (!tko__take_batch(pool, w, &item, 1, &from, true)) return false;
  tko__run_batch(pool, w, &item, 1, from, false);
  return true;
}
