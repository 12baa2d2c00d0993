/* SPDX-License-Identifier: MIT */
/* The worker loop: take a few tasks, run them, look for more, sleep.
 *
 * A worker is in one of three states, as counted in idle.state (signal.c):
 * busy (running tasks it took), searching (awake, looking at the queue), or
 * sleeping (in the idle set). Each take visits one shard's lock - its
 * home shard first, another that holds a heavier task, any other when that
 * one is empty (pick_for_take, take_batch) - and takes a share of that
 * shard's backlog split by the workers there could be, so that one worker
 * does not hoard the work of many (take_from), within a cap set by time
 * (size_next_take) and max_batch. Before it starts a task of its batch
 * lighter than the weight ceiling, a worker whose take or last look is
 * older than recheck_ns looks again and hands the rest back if a heavier
 * task waits (recheck_hands_back). Counters are per worker, so running a
 * task writes no cache line that another thread writes. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>

#include "internal.h"
#include "seam.h"

_Thread_local tko_pool *tko__current_pool;
_Thread_local tko__worker *tko__current_worker;
_Thread_local const tko__item *tko__cancelling_item;

#ifdef TKO_TEST_SEAMS
void (*_Atomic tko__test_start_window)(tko_pool *pool, void *arg); /* prim.h, seam.h */
#endif

/* Owner-only counter bump: only this worker writes the slot, so no RMW is
 * needed. The store is a release (a plain store on x86): a waiter whose
 * load reads it - wait_idle, a stats reader - then also sees everything the
 * task wrote. The seq_cst publish at the end of each batch is what makes
 * wait_idle's wake-up race-free (see run_batch). */
static void count_own(atomic_uint_fast64_t *c) {
  tko__store_release(c, tko__load_relaxed(c) + 1);
}

/* The caller slot is shared by any thread that runs tasks outside a worker. */
void tko__count(tko_pool *pool, tko__worker *w, atomic_uint_fast64_t *c) {
  if (w == &pool->caller) tko__add_seq(c, 1);
  else count_own(c);
}

static void fill_info(tko_task_info *info, const tko__worker *w, const tko__item *item) {
  *info = (tko_task_info){.id = item->id, .fn = item->fn, .arg = item->arg,
                          .weight = item->weight, .worker = w->index, .kind = w->kind};
}

/* Tells the task's kind, if any, that it is done (an owned task's owner
 * hears of a cancel in tko__cancel_item; a plain task has no one to tell). */
static void ctx_done(const tko__item *item, int status, bool cancelled) {
  const tko__task_kind *kind = tko__item_kind(item);
  if (!kind) return;
  if (cancelled) kind->cancelled(item);
  else kind->done(item, status);
}

/* An internal task (the keyed table's runner) is the library's own: no hooks, no
 * task counters (the keyed tasks it runs have their own), only its
 * runners_done. seq_cst: with the finished counts, wait_idle's half of the
 * Dekker pair (see tko__notify_idle). */
static int run_runner(tko_pool *pool, const tko__item *item) {
  tko__witness_assert_none_held(); /* the keyed tasks it runs are the host's */
  item->fn(item->arg);
  tko__add_seq(&pool->runners_done, 1);
  return 0;
}

/* tko_stats.late_inversions: a worker's start of *item at now is late if
 * some queue's heaviest queued task is heavier and its weight's oldest
 * submit is more than recheck_ns old (the queue's top and top_since,
 * stored under its lock when they change, read here as hints). An async
 * task held back by max_async_inflight is not in shard 0's top (it cannot
 * start: tko__refresh_backlog), so starts past it are not late.
 * A keyed task (a side task: id with the top bit set) runs inside its
 * lane's runner, which never looks at the queue, so a heavier task
 * submitted meanwhile would stay in its submitter's ring, unseen, for the
 * whole drain: the start first moves the submissions into the queues
 * (cheap when there are none), as a take or a look would. */
static void count_late(tko_pool *pool, tko__worker *w, const tko__item *item, uint64_t now) {
  if (item->id >> 63) tko__shards_sweep(pool, NULL);
  for (unsigned i = 0; i < pool->nshards; i++) {
    const tko__shard *sh = &pool->shards[i];
    if (tko__load_relaxed(&sh->top) <= item->weight) continue;
    uint64_t since = tko__load_relaxed(&sh->top_since);
    if (since && now > since && now - since > pool->recheck_ns) {
      count_own(&w->late_inversions);
      return;
    }
  }
}

int tko__run_item(tko_pool *pool, tko__worker *w, const tko__item *item) {
  /* A plain task (ctx 0) pays this one test, and a NULL kind at its end. */
  const tko__task_kind *kind = NULL;
  if (item->ctx) {
    if (tko__item_internal(item)) return run_runner(pool, item);
    kind = tko__item_kind(item);
    /* A kind that runs its tasks itself (an async task) takes it from here. */
    if (kind && kind->run) return kind->run(pool, w, item);
    /* A kind may have withdrawn its task (a handle's cancel won): it is
     * cancelled here, by whoever met it, exactly as a queued task is. */
    if (kind && kind->start && !kind->start(item)) {
      tko__cancel_item(pool, item);
      return -ECANCELED;
    }
  }
  const tko_hooks *h = &pool->opts.hooks;
  tko__count(pool, w, &w->started);
  tko__witness_assert_none_held(); /* the task and its hooks are the host's */
  if (!pool->timing) {
    int status = item->fn(item->arg);
    if (status) tko__count(pool, w, &w->failed);
    if (kind) kind->done(item, status);
    tko__count(pool, w, &w->finished);
    return status;
  }
  tko_task_info info;
  fill_info(&info, w, item);
  uint64_t start = tko__now_ns();
  info.wait_ns = start > item->enq_ns ? start - item->enq_ns : 0;
  if (pool->count_late && w != &pool->caller) count_late(pool, w, item, start);
  if (h->before_run) h->before_run(h->user, &info);
  info.status = item->fn(item->arg);
  info.run_ns = tko__now_ns() - start;
  if (h->after_run) h->after_run(h->user, &info);
  if (info.status) {
    if (h->on_failure) h->on_failure(h->user, &info);
    tko__count(pool, w, &w->failed);
  }
  if (kind) kind->done(item, info.status);
  tko__count(pool, w, &w->finished);
  return info.status;
}

size_t tko__take_queued(tko_pool *pool, uintptr_t ctx, tko__item *out, size_t max) {
  size_t n = 0;
  for (unsigned i = 0; i < pool->nshards && n < max; i++) {
    tko__shard *sh = &pool->shards[i];
    tko__lock_acquire(&sh->lock);
    tko__shard_drain_locked(pool, sh);
    n += tko__queue_remove_ctx(&sh->queue, ctx, out + n, max - n);
    if (i == 0 && n < max)
      n += tko__queue_remove_ctx(&pool->async_queue, ctx | TKO__CTX_ASYNC, out + n, max - n);
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
  size_t n = tko__take_queued(pool, (uintptr_t)owner | TKO__CTX_OWNED, batch, max);
  for (size_t i = 0; i < n; i++) args[i] = batch[i].arg;
  /* seq_cst: as a cancelled task is counted (tko__cancel_item). */
  if (n) tko__add_seq(owner->internal ? &pool->runners_done : &pool->cancelled, n);
  if (n) tko__notify_idle(pool);
  return n;
}

void tko__cancel_item(tko_pool *pool, const tko__item *item) {
  const tko_hooks *h = &pool->opts.hooks;
  tko_task_info info;
  fill_info(&info, &pool->caller, item);
  info.worker = UINT32_MAX;
  /* An owned task (a lane runner, a coalescer sweep) goes to its owner,
   * which knows what its argument is (a lane hands its queued tasks to the
   * lanes' on_cancel); the host's hook never sees (or frees) it. */
  tko__task_owner *owner = tko__item_owner(item);
  /* Read before the callback: once the owner has its task back, its
   * destroy may free the record (test
   * attack_lanes2/lanes_destroy_waiting_then_cancel_shutdown). */
  bool internal = owner && owner->internal;
  tko__witness_assert_none_held(); /* on_cancel, or an owner's, which calls the host's */
  if (owner) owner->cancelled(owner, item->arg);
  if (internal) { /* its keyed tasks counted as cancelled, one by one */
    tko__add_seq(&pool->runners_done, 1); /* seq_cst: as cancelled, below */
    tko__notify_idle(pool);
    return;
  }
  if (!owner && h->on_cancel) {
    tko_pool *prev = tko__enter_pool(pool);
    const tko__item *outer = tko__cancelling_item; /* a hook may cancel more */
    tko__cancelling_item = item;
    h->on_cancel(h->user, &info);
    tko__cancelling_item = outer;
    tko__leave_pool(prev);
  }
  if (item->ctx) ctx_done(item, -ECANCELED, true);
  /* seq_cst: wait_idle reads cancelled with finished, before submitted;
   * and before notify_idle's load of idle_waiters, as a finish is. */
  tko__add_seq(&pool->cancelled, 1);
  tko__notify_idle(pool); /* a group cancel may leave the pool idle */
}

void tko__notify_idle(tko_pool *pool) {
  /* seq_cst: the other half of wait_idle's Dekker pair. This worker stored
   * its finished count seq_cst, then loads idle_waiters; the waiter adds
   * itself to idle_waiters, then loads the finished counts. */
  if (tko__load_seq(&pool->idle_waiters) == 0) return;
  tko__mutex_lock(&pool->idle_mu);
  pthread_cond_broadcast(&pool->idle_cv);
  tko__mutex_unlock(&pool->idle_mu);
}

/* Under the lock: moves every submitted task into the queue, and says
 * whether the pool is paused. paused first, then the drain's tail:
 * seq_cst both (plain loads on x86). A take that sees a resume then also
 * sees every task submitted before it, so the tasks queued while paused
 * are all in the queue - and run in priority order - before any is taken.
 * (Read only after the drain, a stale tail plus a fresh resume let a take
 * pick from half the backlog.) And paused again after the drain: a task
 * the drain saw was submitted after a pause that happened before it, which
 * that load then sees. */
static bool drain_for_take(tko_pool *pool, tko__shard *sh) {
  bool paused = tko__load_seq(&pool->paused);
  tko__shard_drain_locked(pool, sh);
  return paused || tko__load_seq(&pool->paused);
}

/* Takes up to max tasks from shard sh: a share of its backlog. */
static size_t take_from(tko_pool *pool, tko__shard *sh, tko__item *batch, size_t max) {
  tko__lock_acquire(&sh->lock);
  bool paused = drain_for_take(pool, sh);
  size_t len = sh->queue.len, n = 0;
  unsigned max_async = pool->opts.max_async_inflight;
  bool async_ready = !paused && sh->index == 0 && pool->async_queue.len &&
                     (!max_async || pool->async_running < max_async);
  if (async_ready && (!len || tko__queue_top_before(&pool->async_queue, &sh->queue))) {
    /* The best task is async: take it alone, inside the in-flight limit. */
    n = tko__queue_pop(&pool->async_queue, batch, 1);
    pool->async_running++;
    tko__store_relaxed(&pool->async_inflight, pool->async_running); /* under lock */
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
    if (async_ready) {
      /* The batch ends where an async task that may start comes first, so
       * that equal weights start in submit order across the two queues. */
      while (n < share && sh->queue.len && !tko__queue_top_before(&pool->async_queue, &sh->queue))
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
  /* Relaxed: submit.c's raise_ceiling. */
  if (tko__load_acquire(&pick->top) >= tko__load_relaxed(&pool->weight_ceiling)) return pick;
  uint64_t now = pool->opts.max_batch > 1 && !helping ? w->clocked_ns : tko__now_ns();
  if (w->swept_ns != TKO__SWEEP_DUE && now - w->swept_ns < pool->recheck_ns) return pick;
  w->swept_ns = now;
  /* Every shard, its own included: a take that goes to another shard
   * (heavier, or its own is empty) does not drain its own, and a heavy
   * task submitted to an idle worker's own shard must not wait out a flood
   * that worker steals from another. */
  tko__shards_sweep(pool, NULL);
  return tko__shard_pick(pool, w);
}

/* Takes up to max tasks for worker w; *from: the shard they came from. */
static size_t take_batch(tko_pool *pool, tko__worker *w, tko__item *batch, size_t max,
                         tko__shard **from, bool helping) {
  if (pool->nshards == 1) {
    *from = &pool->shards[0];
    return take_from(pool, *from, batch, max);
  }
  tko__shard *pick = pick_for_take(pool, w, helping);
  size_t n = take_from(pool, pick, batch, max);
  /* Nothing there: every shard in turn, home first. */
  for (unsigned i = 0; n == 0 && i < pool->nshards; i++) {
    tko__shard *sh = &pool->shards[(w->home + i) % pool->nshards];
    if (sh == pick || !tko__shard_work_hint(pool, sh)) continue;
    n = take_from(pool, sh, batch, max);
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

static void publish_finished(tko__worker *w);

/* ---- a task that ends its thread ------------------------------------
 *
 * pthread_exit from a task unwinds the worker's stack through the cleanup
 * handler run_or_cancel pushes around each task (glibc runs it during the
 * forced unwind; the innermost one acts, outer ones see `exiting`). The
 * handler puts the pool right before the thread goes:
 * the tasks the thread had started (the exiting one, and any that were
 * waiting in a helping group wait below it) count as finished with status
 * -ECANCELED, failed; the tasks it had taken and not started go back to
 * the queue; its blocking hint ends; the stop hook runs. A basic worker is
 * then replaced by a new thread on the same slot, which joins the old one
 * (if none can start, the pool has one worker fewer and says so in
 * stats.basic_workers); an elastic worker retires as if idle. A task
 * whose kind ran it (tko__task_kind.run) is its kind's to finish. Not
 * supported: pthread_exit from an async task's start function (its op
 * stays in flight) or from a caller-runs task; and leaving a task by
 * longjmp/siglongjmp in any way (the pool's frames are skipped: its
 * counts and locks are then wrong - taskorch.h). */

static void finish_started(tko_pool *pool, tko__worker *w) {
  for (tko__task_frame *f = w->task; f; f = f->outer) {
    const tko__task_kind *kind = tko__item_kind(f->item);
    if (kind && kind->run) continue;
    if (tko__item_internal(f->item)) { /* a keyed lane's runner: not a task */
      tko__add_seq(&pool->runners_done, 1);
      continue;
    }
    tko__count(pool, w, &w->failed);
    if (f->item->ctx) ctx_done(f->item, -ECANCELED, false); /* it ran */
    tko__count(pool, w, &w->finished);
  }
  w->task = NULL;
  if (w->blocking_depth) tko__sub_relaxed(&pool->blocking, 1);
  w->blocking_depth = 0;
  publish_finished(w);
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
  return it->ctx & TKO__CTX_ASYNC ? &pool->async_queue : &b->shard->queue;
}

/* Under sh's lock: makes room for every task this thread took from sh and
 * has not started, so that put_back_locked cannot fail; false if the
 * queues could not grow. Their slots were freed by the take, and their
 * weights' buckets usually kept, so this allocates nothing in a steady
 * state (pool/steady_state_allocates_nothing_per_task*). */
static bool room_for_taken_locked(tko_pool *pool, const tko__worker *w, tko__shard *sh) {
  tko__queue *qs[2] = {&sh->queue, &pool->async_queue};
  size_t items[2] = {0, 0}, weights[2] = {0, 0}; /* new weights, counted with repeats */
  for (const tko__batch_frame *b = w->batch; b; b = b->outer) {
    if (b->shard != sh) continue;
    for (size_t i = b->next; i < b->n; i++) {
      size_t k = queue_of(pool, b, &b->items[i]) != qs[0];
      items[k]++;
      weights[k] += !tko__queue_has_bucket(qs[k], b->items[i].weight);
    }
  }
  /* The async queue is shard 0's: another shard's lock does not guard it,
   * and its batches hold no async task. */
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
static void requeue_taken(tko_pool *pool, tko__worker *w) {
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

/* Starts a thread to take this basic worker's place; false if none could
 * start (then the slot is left to be staffed again by a grow). */
static bool replace_basic(tko_pool *pool, tko__worker *w) {
  w->predecessor = pthread_self();
  w->has_predecessor = true;
  tko__idle_search_begin(&pool->idle); /* the new thread starts searching */
  tko__thread_enter(pool);
  pthread_t t;
  if (tko__thread_create_placed(&t, tko__worker_main, w, &pool->place) == 0) return true; /* it records itself */
  w->has_predecessor = false; /* shutdown, or a grow, joins this thread (w->thread) */
  tko__thread_exit(pool);
  tko__idle_search_end(&pool->idle);
  tko__sub_seq(&pool->basic_alive, 1);
  return false;
}

static void retire_elastic(tko_pool *pool, tko__worker *w) {
  /* As tko__elastic_try_retire: the slot first (release: pairs with
   * claim_slot's acquire), then the count; the next spawn into the slot,
   * or shutdown, joins this thread. */
  tko__store_release(&w->slot_state, TKO__SLOT_RETIRING);
  tko__sub_seq(&pool->elastic_count, 1);
  tko__add_seq(&pool->elastic_retired, 1); /* seq_cst: see tko__elastic_started */
}

static void task_exited(void *arg) {
  tko__worker *w = arg;
  if (w->exiting) return; /* an inner task's frame did it all */
  w->exiting = true;
  tko_pool *pool = w->pool;
  const tko_hooks *h = &pool->opts.hooks;
  finish_started(pool, w);
  requeue_taken(pool, w);
  tko__witness_assert_none_held();
  if (h->thread_stop) h->thread_stop(h->user, w->index, w->kind);
  bool unstaffed = w->kind == TKO_WORKER_BASIC && !replace_basic(pool, w);
  if (w->kind != TKO_WORKER_BASIC) retire_elastic(pool, w);
  tko__notify_idle(pool);
  if (tko__runnable_seq(pool)) tko__signal_work(pool);
  /* A basic slot left without a thread is RETIRING, so that a grow
   * (tko_pool_resize) joins this thread and staffs it: marked last, when
   * nothing but the thread's exit is left for that join to wait for. */
  if (unstaffed) tko__resize_vacate(pool, w);
  tko__thread_exit(pool); /* this thread's own count: the last touch */
}

/* Starts one task this worker took, or cancels it once TKO_CANCEL began. */
static void run_or_cancel(tko_pool *pool, tko__worker *w, const tko__item *item) {
  /* A bounded queue counts a task until it starts (or is cancelled), not
   * until a worker takes it: taken tasks still wait. */
  tko__give_room(pool, w, tko__item_room(item));
  void (*seam)(tko_pool *, void *) = TKO__SEAM(tko__test_start_window); /* 0 outside tests */
  if (seam) seam(pool, item->arg);
  /* Acquire: pairs with the release in lifecycle.c (close_pool), so tasks this
   * worker had taken are cancelled rather than run once TKO_CANCEL began. */
  if (tko__load_acquire(&pool->cancelling)) {
    /* What the take gave the task goes back first (an async task's
     * in-flight slot), so that no snapshot taken once the cancel counts
     * shows the idle pool with an async task in flight. */
    const tko__task_kind *kind = item->ctx ? tko__item_kind(item) : NULL;
    if (kind && kind->dropped) kind->dropped(pool, item);
    tko__cancel_item(pool, item);
    return;
  }
  /* The blocking hint belongs to the task that gave it: the depth at its
   * start is its base (a task run while helping starts inside its waiter's
   * region), tko_blocking_end refuses to go below it, and a task that
   * returns inside its own region ends it here, so that the pool does not
   * count a blocked worker forever. The frame is owner-only and on this
   * stack: plain stores, no shared line. */
  tko__task_frame frame = {item, w->blocking_depth, w->task};
  w->task = &frame;
  /* A task that ends this thread (pthread_exit) unwinds through here:
   * worker.c is built with -fexceptions, so this is a cleanup attribute
   * (a few stores, no setjmp) and the handler runs in this frame, with
   * every outer frame - batches taken, tasks waiting in a helping wait -
   * still intact above it. */
  pthread_cleanup_push(task_exited, w);
  tko__run_item(pool, w, item);
  pthread_cleanup_pop(0);
  w->task = frame.outer;
  if (w->blocking_depth != frame.blocking_base) {
    if (frame.blocking_base == 0) tko__sub_relaxed(&pool->blocking, 1);
    w->blocking_depth = frame.blocking_base;
  }
}

/* Publishes the finished count seq_cst: one half of wait_idle's Dekker
 * pair (see tko__notify_idle). */
static void publish_finished(tko__worker *w) {
  tko__store_seq(&w->finished, tko__load_relaxed(&w->finished));
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
 * compares their tops (and, under shard 0's lock, the async queue's best)
 * with *than. The hand-back goes shard by shard, each all or nothing,
 * innermost batch first; one a shard cannot take back (no memory) stays
 * with this thread. True if the innermost batch went back. */
static bool hand_back_across_shards(tko_pool *pool, tko__worker *w, const tko__item *than) {
  tko__shards_sweep(pool, NULL);
  w->swept_ns = w->clocked_ns;
  if (tko__load_seq(&pool->paused)) return false; /* nothing outranks: nothing starts */
  bool heavier = tko__shards_outrank(pool, than->weight);
  if (!heavier && tko__load_relaxed(&pool->async_waiting)) {
    tko__shard *first = &pool->shards[0];
    unsigned max_async = pool->opts.max_async_inflight;
    tko__lock_acquire(&first->lock);
    heavier = (!max_async || pool->async_running < max_async) &&
              tko__queue_outranks(&pool->async_queue, than);
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
 * (nothing starts), and an async task only inside the in-flight limit. */
static bool hand_back_if_outranked(tko_pool *pool, tko__worker *w, const tko__item *than) {
  if (pool->nshards > 1) return hand_back_across_shards(pool, w, than);
  tko__shard *sh = &pool->shards[0];
  tko__lock_acquire(&sh->lock);
  bool paused = drain_for_take(pool, sh);
  unsigned max_async = pool->opts.max_async_inflight;
  bool back = !paused &&
              (tko__queue_outranks(&sh->queue, than) ||
               ((!max_async || pool->async_running < max_async) &&
                tko__queue_outranks(&pool->async_queue, than))) &&
              room_for_taken_locked(pool, w, sh);
  if (back) put_back_locked(pool, w, sh);
  tko__unlock(&sh->lock);
  if (back) w->batch = NULL;
  return back;
}

/* The clock reads a batch's rechecks make: the first before its second
 * task, then one per TKO__CLOCK_STRIDE_NS of work as the tasks since the
 * last read ran. Why not one per task: a flood of empty tasks of four
 * weights pays it on most tasks (`benchmarks/ab_probe.sh A B 30
 * probe_flood batch reused 1` shows it). */
static void clock_from_take(tko__worker *w, uint64_t now) {
  w->looked_ns = w->clocked_ns = now;
  w->unclocked = 0;
  w->clock_stride = 1;
}

static size_t stride_for(uint64_t ns_per_task) {
  if (ns_per_task >= TKO__CLOCK_STRIDE_NS) return 1;
  uint64_t n = TKO__CLOCK_STRIDE_NS / (ns_per_task ? ns_per_task : 1);
  return n < TKO__GRAB_MAX ? (size_t)n : TKO__GRAB_MAX;
}

/* Whether this worker handed what it took back, looking before it starts
 * *next, a later task of a batch it took; the caller then signals the
 * work. The ceiling's load is relaxed: submit.c's raise_ceiling. */
static bool recheck_hands_back(tko_pool *pool, tko__worker *w, const tko__item *next) {
  w->unclocked++;
  if (next->weight >= tko__load_relaxed(&pool->weight_ceiling)) return false;
  if (w->unclocked < w->clock_stride) return false;
  uint64_t now = tko__now_ns();
  w->clock_stride = stride_for((now - w->clocked_ns) / w->unclocked);
  w->clocked_ns = now;
  w->unclocked = 0;
  if (now - w->looked_ns < pool->recheck_ns) return false;
  w->looked_ns = now;
  if (!hand_back_if_outranked(pool, w, next)) return false;
  count_own(&w->handbacks);
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
enum batch_end { RAN_ALL, HANDED_BACK, RETIRED_MIDWAY };

static enum batch_end run_batch(tko_pool *pool, tko__worker *w, const tko__item *batch, size_t n,
                                tko__shard *from, bool top) {
  tko__batch_frame frame = {batch, n, 0, from, w->batch};
  w->batch = &frame;
  enum batch_end end = RAN_ALL;
  while (frame.next < frame.n) {
    if (top && frame.next && recheck_hands_back(pool, w, &batch[frame.next])) {
      end = HANDED_BACK;
      break;
    }
    run_or_cancel(pool, w, &batch[frame.next++]);
    if (top && frame.next < frame.n && tko__resize_hint(pool, w) && tko__resize_retire(pool, w)) {
      end = RETIRED_MIDWAY;
      break;
    }
  }
  publish_finished(w);
  /* Either sets w->batch to NULL: this frame was the only one. */
  if (end == RETIRED_MIDWAY) requeue_taken(pool, w);
  if (end != RAN_ALL && tko__runnable_seq(pool)) tko__signal_work(pool);
  w->batch = frame.outer;
  return end;
}

int tko_blocking_begin(void) {
  tko__worker *w = tko__current_worker;
  if (!w) return -EPERM;
  tko_pool *pool = w->pool;
  if (tko__pool_forked(pool)) return -ECHILD; /* a copy of a worker, in a child */
  if (w->blocking_depth++ > 0) return 0; /* nested: already counted */
  tko__add_relaxed(&pool->blocking, 1);
  /* This worker stops taking work for a while: if work is waiting and
   * nobody is idle, wake or start another worker now. */
  if (tko__runnable_seq(pool)) tko__signal_work(pool);
  return 0;
}

int tko_blocking_end(void) {
  tko__worker *w = tko__current_worker;
  if (!w) return -EPERM;
  if (tko__pool_forked(w->pool)) return -ECHILD;
  unsigned base = w->task ? w->task->blocking_base : 0;
  if (w->blocking_depth <= base) return -EPERM; /* no begin of this task's */
  if (--w->blocking_depth == 0) tko__sub_relaxed(&w->pool->blocking, 1);
  return 0;
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
      run_batch(pool, w, &item, 1, sh, false);
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
      run_batch(pool, w, &item, 1, sh, false);
      return true;
    }
  }
  return false;
}

bool tko__help_one(tko_pool *pool, tko__worker *w) {
  tko__batch_frame *b = w->batch;
  if (b && b->next < b->n) { /* this worker's own batch first... */
    if (!recheck_hands_back(pool, w, &b->items[b->next])) {
      run_or_cancel(pool, w, &b->items[b->next++]);
      publish_finished(w);
      return true;
    }
    /* ...unless a heavier task waited: the batch went back (each frame's n
     * dropped to its next, so the loops below end) and the wait takes. */
    if (tko__runnable_seq(pool)) tko__signal_work(pool);
  }
  tko__item item;
  tko__shard *from;
  if (!take_batch(pool, w, &item, 1, &from, true)) return false;
  run_batch(pool, w, &item, 1, from, false);
  return true;
}

/* Sizes this worker's next take from how long its last batch of n tasks
 * ran: about TKO__BATCH_BUDGET_NS of work, within 1..max_batch. Why: a
 * take is a visit to the queue lock and the queue's lines, so short tasks
 * want big takes (up to 64 empty tasks per take rather than 16:
 * `probe_flood submit 4`, 4 producers and 2 workers, shows it); but a task
 * taken is out of the
 * queue, and a later task with a higher weight waits behind the rest of
 * the batch, so long tasks want small ones - this bounds that wait by time
 * rather than by count. A preempted batch looks slow and shrinks the next
 * take; the cap then doubles back, one batch at a time. */
static void size_next_take(tko_pool *pool, tko__worker *w, size_t n, uint64_t ns) {
  size_t max = pool->opts.max_batch, cap;
  uint64_t per_task = ns / n;
  /* Judge the take the cap would allow, not the one just made: n is often
   * smaller than the cap (a short queue), and 9 us tasks taken one at a
   * time must not let the cap double up to 64 x 9 us. */
  if (per_task * 2 * w->batch_cap <= TKO__BATCH_BUDGET_NS) cap = 2 * w->batch_cap;
  else cap = per_task ? TKO__BATCH_BUDGET_NS / per_task : max;
  w->batch_cap = cap < 1 ? 1 : cap > max ? max : cap;
}

/* Searching: yield the core a few times (on a machine with fewer cores than
 * threads, a pause loop would steal the producer's core) before sleeping.
 * The loads are hints; take_batch decides under the lock. */
static bool spin_for_work(tko_pool *pool) {
  for (unsigned i = 0; i < pool->opts.spin_yields; i++) {
    if (tko__has_work_hint(pool) && !tko__load_relaxed(&pool->paused)) return true;
    if (tko__load_relaxed(&pool->closing) && tko__nothing_left(pool)) return true;
    sched_yield();
  }
  return false;
}

enum sleep_result { WOKEN, RETIRE };

/* How a work loop ended: the pool closed, the worker retired (an elastic
 * one, idle or above a lowered max_elastic), or a basic worker left after a
 * shrink. */
enum loop_end { CLOSED, RETIRED, LEFT };

/* Sleeps until woken (counted as searching again) or, for an elastic
 * worker, until idle long enough to retire. */
static enum sleep_result worker_sleep(tko_pool *pool, tko__worker *w) {
  tko__idle_sleep_prepare(&pool->idle, &w->sleeper);
  /* Step (2) of signal.c's essay: seq_cst, after sleep_prepare's RMW; pairs
   * with a submit's reservation CAS (inbox.h). closing is stored seq_cst
   * before shutdown wakes every sleeper. */
  /* A shrink stores its target seq_cst before it wakes every sleeper: a
   * sleeper it missed set its bit after that wake's claim, and reads the
   * new target here (resize.c, signal.c). */
  enum tko__look look = tko__look_seq(pool);
  if (look == TKO__LOOK_WORK || (tko__load_seq(&pool->closing) && tko__nothing_left(pool)) ||
      tko__resize_hint_seq(pool, w)) {
    tko__idle_sleep_cancel(&pool->idle, &w->sleeper); /* searching either way */
    return WOKEN;
  }
  /* Decay: after a burst, a worker that then sleeps elastic_idle_ms
   * without being woken gives the queue's slab back if the pool stayed
   * idle meanwhile: no task was submitted (jemalloc's decay,
   * Go's scavenger; tko_pool_trim does it on demand). This worker's sleep
   * alone says nothing: another worker may have run burst after burst
   * while it slept, and a trim between two bursts makes the next one grow
   * the slab again (pool/steady_state_allocates_nothing_per_task saw it on
   * a loaded machine). Only then does a basic worker sleep with a timeout. */
  bool trim = tko__pool_trimmable(pool);
  uint64_t submitted = trim ? tko__submitted(pool) : 0;
  uint64_t timeout = w->kind == TKO_WORKER_ELASTIC || trim
                         ? (uint64_t)pool->opts.elastic_idle_ms * 1000000u
                         : UINT64_MAX;
  /* Beside a hole: its publish may not wake this worker (inbox.h), so it
   * looks again a moment later; a stopped submitter then costs a look a
   * millisecond, not a spin. */
  unsigned poll_ms = 0;
  if (look == TKO__LOOK_HOLE) {
    poll_ms = w->hole_poll_ms ? 2 * w->hole_poll_ms : TKO__HOLE_POLL_MS;
    if (poll_ms > TKO__HOLE_POLL_MAX_MS) poll_ms = TKO__HOLE_POLL_MAX_MS;
    timeout = poll_ms * 1000000ull;
  }
  w->hole_poll_ms = poll_ms;
  if (tko__idle_sleep(&pool->idle, &w->sleeper, timeout)) {
    w->hole_poll_ms = 0; /* woken by a submit: the next hole starts afresh */
    return WOKEN;
  }
  if (!tko__idle_sleep_cancel(&pool->idle, &w->sleeper)) { /* a waker claimed us */
    w->hole_poll_ms = 0;
    return WOKEN;
  }
  if (look == TKO__LOOK_HOLE) return WOKEN;
  /* searching meanwhile: a submit counts on it */
  if (trim && tko__submitted(pool) == submitted) tko__pool_trim(pool);
  if (w->kind != TKO_WORKER_ELASTIC) return WOKEN;
  return tko__elastic_try_retire(pool, w) ? RETIRE : WOKEN;
}

/* The end of a work loop for a worker that a shrink retired. */
static enum loop_end left(const tko__worker *w) {
  return w->kind == TKO_WORKER_BASIC ? LEFT : RETIRED;
}

/* Takes and runs work until the pool closes or the worker retires. */
static enum loop_end work_loop(tko_pool *pool, tko__worker *w) {
  bool searching = true; /* the spawner (or a resurrection) counted it searching */
  enum loop_end end = CLOSED;
  w->batch_cap = pool->opts.max_batch < TKO__BATCH_START ? pool->opts.max_batch : TKO__BATCH_START;
  tko__item batch[TKO__GRAB_MAX];
  for (;;) {
    if (tko__resize_hint(pool, w) && tko__resize_retire(pool, w)) {
      end = left(w);
      break;
    }
    size_t cap = w->batch_cap;
    tko__shard *from;
    size_t n = take_batch(pool, w, batch, cap, &from, false);
    if (n) {
      /* The last searcher to find work wakes (or spawns) the next worker if
       * work remains, so parallelism ramps up one worker at a time. */
      if (searching) {
        searching = false;
        if (tko__idle_search_end(&pool->idle) && tko__runnable_seq(pool))
          tko__signal_work(pool);
      }
      /* Two clock reads a take, skipped where the cap
       * cannot move and a batch holds one task (max_batch 1: the
       * C-Thread-Pool layer's job per take). The first is also the time of
       * the recheck's first look: the take's drain, a moment before. */
      if (pool->opts.max_batch > 1) {
        uint64_t t0 = tko__now_ns();
        clock_from_take(w, t0);
        enum batch_end how = run_batch(pool, w, batch, n, from, true);
        if (how == RETIRED_MIDWAY) {
          end = left(w);
          break;
        }
        /* A batch cut short says little about its tasks' length (and its
         * recheck read the clock). The reading is the next take's time
         * too (pick_for_take): after a long task, the time of the take
         * before it would skip the look at the other shards that a heavy
         * task submitted meanwhile is waiting for (test
         * queues/a_take_after_a_long_task_looks_at_every_queue). */
        if (how == RAN_ALL) {
          uint64_t t1 = tko__now_ns();
          size_next_take(pool, w, n, t1 - t0);
          w->clocked_ns = t1;
        }
      } else {
        run_batch(pool, w, batch, n, from, true); /* one task: it never stops early */
      }
      /* A small take means this worker is right behind the submitters:
       * polling again at once would pull the inbox's lines away from the
       * producer every few tasks (its next CAS then waits for them). Yield
       * once instead, so that tasks pile up a little and the next take
       * gets a batch (bench_peers' 1-producer, 2-worker empty-task row on 2
       * cores shows it); a worker alone on its core is back at once.
       * It yields as a searcher, so a submit meanwhile counts on it rather
       * than waking or spawning another worker. A take as large as
       * the cap allows is not small: with max_batch 1 (the C-Thread-Pool
       * layer) a yield per task would multiply the cost of a job
       * (bench_thpool_compat shows it). */
      if (n < TKO__SMALL_TAKE && n < cap) {
        searching = true;
        tko__idle_search_begin(&pool->idle);
        sched_yield();
      }
      continue;
    }
    /* Exit once closed and nothing is left; a reservation made just before
     * the close is still pending in the inbox and is taken first. */
    if (tko__load_acquire(&pool->closing) && tko__nothing_left(pool)) break;
    tko__notify_idle(pool);
    if (!searching) {
      searching = true;
      tko__idle_search_begin(&pool->idle);
    }
    if (spin_for_work(pool)) continue;
    if (worker_sleep(pool, w) == RETIRE) {
      searching = false; /* try_retire ended the search */
      end = RETIRED;
      break;
    }
  }
  /* A worker that retires while searching may be what a submit counted on
   * (it skipped its wake-up): as the last searcher it re-reads for work,
   * seq_cst after its seq_cst RMW, and passes it on (signal.c's Dekker
   * pair). A closed pool's leftovers are shutdown's. */
  if (searching && tko__idle_search_end(&pool->idle) && end != CLOSED && tko__runnable_seq(pool))
    tko__signal_work(pool);
  return end;
}

void *tko__worker_main(void *arg) {
  tko__worker *w = arg;
  tko_pool *pool = w->pool;
  const tko_hooks *h = &pool->opts.hooks;
  tko__current_pool = pool;
  tko__current_worker = w;
  if (w->has_predecessor) { /* replacing a thread a task ended */
    pthread_join(w->predecessor, NULL);
    w->has_predecessor = false;
    w->thread = pthread_self(); /* before its thread_exit, which shutdown waits for */
  }
  w->exiting = false; /* a previous thread of this slot is joined: ours now */
  char name[32];
  snprintf(name, sizeof name, "%s-%c%u", pool->name,
           w->kind == TKO_WORKER_BASIC ? 'b' : 'e', w->index);
  tko__thread_set_name(name);
  /* A new thread copies its creator's nice value whatever the attributes
   * say, and an elastic worker's creator is whichever thread submitted:
   * take the pool creator's value instead (best effort: going back up to a
   * higher priority needs CAP_SYS_NICE). */
  tko__thread_set_nice(pool->creator_nice);
  if (w->kind == TKO_WORKER_ELASTIC) tko__elastic_started(pool);
  tko__witness_assert_none_held();
  if (h->thread_start) h->thread_start(h->user, w->index, w->kind);
  enum loop_end end;
restart:
  end = work_loop(pool, w);
  if (end == CLOSED) {
    /* seq_cst, before the count falls: a spawner whose reservation sees
     * the lower count then sees the flag (tko__elastic_spawn). */
    tko__store_seq(&pool->drained, true);
    if (w->kind == TKO_WORKER_BASIC) tko__sub_seq(&pool->basic_alive, 1);
    else tko__sub_seq(&pool->elastic_count, 1);
  }
  tko__notify_idle(pool);
  bool retired = end == RETIRED;
  bool stop_hook_spawns = retired && h->thread_stop; /* it may submit, and so spawn */
  if (stop_hook_spawns) tko__elastic_set_stopping(pool, w, true);
  tko__witness_assert_none_held();
  if (h->thread_stop) h->thread_stop(h->user, w->index, w->kind);
  if (stop_hook_spawns) tko__elastic_set_stopping(pool, w, false);
  /* Start over when the stop hook left work no one else may pick up
   * (elastic), or a grow handed this basic slot back meanwhile. */
  if ((stop_hook_spawns && tko__elastic_resurrect(pool, w)) ||
      (end == LEFT && tko__resize_left(pool, w))) {
    tko__witness_assert_none_held();
    if (h->thread_start) h->thread_start(h->user, w->index, w->kind);
    tko__idle_search_begin(&pool->idle);
    goto restart;
  }
  tko__thread_exit(pool); /* the last touch of the pool: shutdown may now join */
  return NULL;
}

int tko__worker_spawn(tko_pool *pool, tko__worker *w, pthread_t *t) {
  tko__idle_search_begin(&pool->idle); /* the new worker starts searching */
  tko__thread_enter(pool);
  int rc = tko__thread_create_placed(t, tko__worker_main, w, &pool->place);
  if (rc == 0) return 0;
  tko__thread_exit(pool);
  /* The worker that will not come was counted as searching, and a submit
   * meanwhile may have skipped its wake-up on that account: stop counting
   * it and, if it was the last searcher and work waits, wake a sleeper in
   * its place (signal.c: "A spawn that fails"). Only a wake, never another
   * spawn: creation may keep failing. */
  if (tko__idle_search_end(&pool->idle) && tko__runnable_seq(pool))
    tko__idle_wake_one(&pool->idle);
  return rc;
}

int tko__thread_start(tko_pool *pool, tko__worker *w) {
  pthread_t t;
  int rc = tko__thread_create_placed(&t, tko__worker_main, w, &pool->place);
  if (rc) return rc;
  w->thread = t;
  w->has_thread = true;
  return 0;
}
