/* SPDX-License-Identifier: MIT */
/* Running a task: the kind dispatch (an internal runner, a kind that runs
 * its tasks itself, a kind that withdrew its task), the host's hooks and
 * the worker's counters around the call, the cancel of a task that will
 * never run, and the start of a task a worker took (tko__run_or_cancel:
 * its room, TKO_CANCEL, its blocking hint, and the cleanup handler that
 * a task ending its thread unwinds through). Counters are per worker, so
 * running a task writes no cache line that another thread writes. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>

#include "engine.h"
#include "seam.h"

_Thread_local tko_pool *tko__current_pool;
_Thread_local tko__worker *tko__current_worker;
_Thread_local const tko__item *tko__cancelling_item;
_Thread_local tko__task_frame *tko__off_worker_task;

#ifdef TKO_TEST_SEAMS
void (*_Atomic tko__test_start_window)(tko_pool *pool, void *arg); /* prim.h, seam.h */
#endif

/* The caller slot is shared by any thread that runs tasks outside a worker. */
void tko__count(tko_pool *pool, tko__worker *w, atomic_uint_fast64_t *c) {
  if (w == &pool->caller) tko__add_seq(c, 1);
  else tko__count_own(c);
}

static void fill_info(tko_task_info *info, const tko__worker *w, const tko__item *item) {
  *info = (tko_task_info){.id = item->id, .fn = item->fn, .arg = item->arg,
                          .weight = item->weight, .worker = w->index, .kind = w->kind};
}

/* A task of an internal kind (the keyed table's runner) is the library's
 * own: no hooks, no task counters (the keyed tasks it runs have their
 * own), only its runners_done. seq_cst: with the finished counts, wait_idle's half of the
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
 * stored under its lock when they change, read here as hints). A held
 * task its source does not let start is not in shard 0's top (it cannot
 * start: tko__refresh_backlog), so starts past it are not late.
 * A keyed task (a side task: id with the top bit set) runs inside its
 * lane's runner, which never looks at the queue, so a heavier task
 * submitted meanwhile would stay in its submitter's ring, unseen, for the
 * whole drain: the start first moves the submissions into the queues
 * (cheap when there are none), as a take or a look would. */
static void count_late(tko_pool *pool, tko__worker *w, const tko__item *item, uint64_t now) {
  if (item->id >> 63) tko__shards_sweep(pool, w, NULL);
  for (unsigned i = 0; i < pool->nshards; i++) {
    const tko__shard *sh = &pool->shards[i];
    if (tko__load_relaxed(&sh->top) <= item->weight) continue;
    uint64_t since = tko__load_relaxed(&sh->top_since);
    if (since && now > since && now - since > pool->recheck_ns) {
      tko__count_own(&w->late_inversions);
      return;
    }
  }
}

/* The kind of a task about to start: a plain task (ctx 0) pays this one
 * test, and a NULL kind at its end. */
static const tko__task_kind *starting_kind(const tko__item *item) {
  return item->ctx ? tko__item_kind(item) : NULL;
}

static int run_item(tko_pool *pool, tko__worker *w, const tko__item *item,
                    const tko__task_kind *kind) {
  if (kind) {
    if (kind->internal) return run_runner(pool, item);
    /* A kind that runs its tasks itself (an async task) takes it from here. */
    if (kind->run) return kind->run(pool, w, item);
    /* A kind may have withdrawn its task (a handle's cancel won): it is
     * cancelled here, by whoever met it, exactly as a queued task is. */
    if (kind->start && !kind->start(item)) {
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

/* The blocking hint belongs to the task that gave it (tko_blocking_begin
 * counts the thread's worker, of whichever pool): a task that returns
 * inside its own region ends it, so that no pool counts a blocked worker
 * forever. w's depth goes back to base, its depth at the task's start. */
static void blocking_back_to(tko__worker *w, unsigned base) {
  if (w->blocking_depth == base) return;
  if (base == 0) tko__sub_relaxed(&w->pool->blocking, 1);
  w->blocking_depth = base;
}

/* A worker keeps its tasks in its own frames (tko__run_or_cancel); a task
 * run in a pool's caller slot, on a thread that is not that pool's worker,
 * is kept in the thread's frames, so that a wait it makes on its own group
 * or handle is -EDEADLK there too (tko__thread_runs). On a worker's thread
 * outside a task of its own loop - a caller-run from its task or hook, a
 * keyed task of its runner's visit - a task's region ends at its return
 * too (test blocking/a_region_left_open_by_a_task_run_in_a_thread_hook_ends_with_it). */
int tko__run_item(tko_pool *pool, tko__worker *w, const tko__item *item) {
  tko__worker *thread_worker = tko__current_worker;
  unsigned base = thread_worker ? thread_worker->blocking_depth : 0;
  int rc;
  const tko__task_kind *kind = starting_kind(item);
  if (w != &pool->caller) {
    rc = run_item(pool, w, item, kind);
  } else {
    tko__task_frame f = {.item = item, .kind = kind, .outer = tko__off_worker_task};
    tko__off_worker_task = &f;
    rc = run_item(pool, w, item, kind);
    tko__off_worker_task = f.outer;
  }
  if (thread_worker) blocking_back_to(thread_worker, base);
  return rc;
}

bool tko__thread_runs(bool (*is)(const tko__item *item, const void *what), const void *what) {
  if (tko__cancelling_item && is(tko__cancelling_item, what)) return true;
  const tko__worker *w = tko__current_worker;
  for (const tko__task_frame *f = w ? w->task : NULL; f; f = f->outer)
    if (is(f->item, what)) return true;
  for (const tko__task_frame *f = tko__off_worker_task; f; f = f->outer)
    if (is(f->item, what)) return true;
  return false;
}

void tko__cancel_item(tko_pool *pool, const tko__item *item) {
  const tko_hooks *h = &pool->opts.hooks;
  tko_task_info info;
  fill_info(&info, &pool->caller, item);
  info.worker = UINT32_MAX;
  /* A kind with its own cancel (an owned task: a lane runner, a coalescer
   * sweep) knows what its argument is (a lane hands its queued tasks to
   * the lanes' on_cancel); the host's hook never sees (or frees) it. Read
   * before the callback: once the kind has its task back, its owner's
   * destroy may free the record (test
   * attack_lanes2/lanes_destroy_waiting_then_cancel_shutdown). */
  const tko__task_kind *kind = item->ctx ? tko__item_kind(item) : NULL;
  bool own_cancel = kind && kind->own_cancel, internal = kind && kind->internal;
  tko__witness_assert_none_held(); /* on_cancel, or a kind's, which calls the host's */
  if (!own_cancel && h->on_cancel) {
    tko_pool *prev = tko__enter_pool(pool);
    const tko__item *outer = tko__cancelling_item; /* a hook may cancel more */
    tko__cancelling_item = item;
    h->on_cancel(h->user, &info);
    tko__cancelling_item = outer;
    tko__leave_pool(prev);
  }
  if (kind) kind->cancelled(item);
  if (internal) { /* its keyed tasks counted as cancelled, one by one */
    tko__add_seq(&pool->runners_done, 1); /* seq_cst: as cancelled, below */
    tko__notify_idle(pool);
    return;
  }
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

/* A task that ends its thread (worker.c: tko__task_exited): the tasks
 * the thread had started (the exiting one, and any that were waiting in a
 * helping group wait below it) count as finished with status -ECANCELED,
 * failed, except one whose kind ran it (tko__task_kind.run), which is its
 * kind's to finish; its blocking hint ends. */
void tko__finish_started(tko_pool *pool, tko__worker *w) {
  for (tko__task_frame *f = w->task; f; f = f->outer) {
    const tko__task_kind *kind = f->kind; /* never the owner's record: see the frame */
    if (kind && kind->run) continue;
    if (kind && kind->internal) { /* a keyed lane's runner: not a task */
      tko__add_seq(&pool->runners_done, 1);
      continue;
    }
    tko__count(pool, w, &w->failed);
    if (kind) kind->done(f->item, -ECANCELED); /* it ran */
    tko__count(pool, w, &w->finished);
  }
  w->task = NULL;
  if (w->blocking_depth) tko__sub_relaxed(&pool->blocking, 1);
  w->blocking_depth = 0;
  tko__publish_finished(w);
}

/* Starts one task this worker took, or cancels it once TKO_CANCEL began. */
void tko__run_or_cancel(tko_pool *pool, tko__worker *w, const tko__item *item) {
  /* A bounded queue counts a task until it starts (or is cancelled), not
   * until a worker takes it: taken tasks still wait. */
  tko__give_room(pool, w, tko__item_room(item));
  const tko__task_kind *kind = starting_kind(item);
  void (*seam)(tko_pool *, void *) = TKO__SEAM(tko__test_start_window); /* 0 outside tests */
  if (seam) seam(pool, item->arg);
  /* Tasks this worker had taken are cancelled rather than run once a
   * TKO_CANCEL changed the state, its first mark (lifecycle.c: close_pool).
   * A thread that saw a submit's -ESHUTDOWN and then let this worker go
   * finds the state changed (coherence), so no task starts after that
   * refusal (test lifecycle/cancel_hands_each_queued_task_to_on_cancel_once). */
  if (tko__pool_cancel_began(pool)) {
    /* What the take gave the task goes back first (an async task's
     * in-flight slot), so that no snapshot taken once the cancel counts
     * shows the idle pool with an async task in flight. */
    if (kind && kind->dropped) kind->dropped(pool, item);
    tko__cancel_item(pool, item);
    return;
  }
  /* The blocking hint belongs to the task that gave it: the depth at its
   * start is its base (a task run while helping starts inside its waiter's
   * region), tko_blocking_end refuses to go below it, and a task that
   * returns inside its own region ends it here (blocking_back_to). The
   * frame is owner-only and on this stack: plain stores, no shared line. */
  tko__task_frame frame = {.item = item, .kind = kind, .blocking_base = w->blocking_depth,
                           .outer = w->task};
  w->task = &frame;
  /* A task that ends this thread (pthread_exit) unwinds through here:
   * run.c is built with -fexceptions, so this is a cleanup attribute
   * (a few stores, no setjmp) and the handler runs in this frame, with
   * every outer frame - batches taken, tasks waiting in a helping wait -
   * still intact above it. */
  pthread_cleanup_push(tko__task_exited, w);
  run_item(pool, w, item, kind);
  pthread_cleanup_pop(0);
  w->task = frame.outer;
  blocking_back_to(w, frame.blocking_base);
}
