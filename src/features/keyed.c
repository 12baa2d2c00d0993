/* SPDX-License-Identifier: MIT */
/* Keyed tasks' host side: keyed serial lanes on the pool's own lane table,
 * whose tasks are the host's tasks (keyed_host.h): admitted by the full
 * policy, counted, run with the hooks and cancelled through on_cancel like
 * any other task, while their lanes' runners stay the library's own. The
 * lanes sit a layer above: tko_submit_keyed is theirs (lane_keyed.c), and
 * this file reaches them only through the ops they pass down with it. */
#include <errno.h>
#include <pthread.h>

#include "engine.h"
#include "keyed_host.h"

uint64_t tko__keyed_accept(tko_pool *pool, uint64_t *enq_ns) {
  *enq_ns = tko__enqueue_time(pool);
  return tko__side_task(pool); /* counted submitted: seq_cst */
}

bool tko__pool_caller_runs(const tko_pool *pool) {
  return pool->opts.full_policy == TKO_FULL_CALLER_RUNS;
}

/* The worker slot that counts a task run on this thread: the thread's own
 * if it is one of the pool's workers, else the shared caller slot. */
static tko__worker *counting_slot(tko_pool *pool) {
  tko__worker *w = tko__current_worker;
  return w && w->pool == pool ? w : &pool->caller;
}

/* A keyed task that ends its thread (pthread_exit) on a worker: started,
 * it now counts as finished and failed, as the pool's own tasks do
 * (worker.c: tko__task_exited, which then ends its lane's runner, after the
 * lane's visit has handed the lane on: lane_runner.c, visit_exited). */
static void keyed_exited(void *worker) {
  tko__worker *w = worker;
  tko__count(w->pool, w, &w->failed);
  tko__count(w->pool, w, &w->finished);
}

int tko__keyed_run(tko_pool *pool, const tko_lane_task *task, uint64_t id, uint64_t enq_ns) {
  /* A runner's keyed task starts as a task a worker took does (run.c:
   * tko__run_or_cancel): once a CANCEL changed the state it goes to
   * on_cancel instead, so none starts after a thread saw the CANCEL's
   * refusal, though the lanes' own cancel comes later in the shutdown
   * (test keyed/a_running_runner_cancels_the_keyed_tasks_it_takes_once_a_cancel_refuses_submits). */
  if (tko__pool_cancel_began(pool)) {
    tko__keyed_cancel(pool, task, id, enq_ns);
    return 0;
  }
  tko__release_room(pool, 1); /* a task holds its room until it starts */
  tko__item item = {.fn = task->fn, .arg = task->arg, .id = id, .enq_ns = enq_ns,
                    .weight = task->weight};
  tko__worker *w = counting_slot(pool);
  if (w != &pool->caller) {
    int status;
    /* A cleanup attribute: keyed.c is built with -fexceptions. */
    pthread_cleanup_push(keyed_exited, w);
    status = tko__run_item(pool, w, &item);
    pthread_cleanup_pop(0);
    return status;
  }
  /* On a thread the pool does not own (a caller-runs submitter, or the
   * shutting-down thread): it counts as the pool's meanwhile (-EDEADLK for
   * its waits), and in stats.caller_runs, as submit.c's run_on_caller's
   * tasks do (test keyed_tasks/caller_run_keyed_tasks_count_in_caller_runs). */
  tko__add_relaxed(&pool->off_worker_runs, 1); /* relaxed: a statistic only */
  tko_pool *prev = tko__enter_pool(pool);
  int status = tko__run_item(pool, w, &item);
  tko__leave_pool(prev);
  tko__notify_idle(pool);
  return status;
}

void tko__keyed_cancel(tko_pool *pool, const tko_lane_task *task, uint64_t id, uint64_t enq_ns) {
  tko__release_room(pool, 1);
  tko__item item = {.fn = task->fn, .arg = task->arg, .id = id, .enq_ns = enq_ns,
                    .weight = task->weight};
  tko__cancel_item(pool, &item); /* on_cancel with the id, counted cancelled */
}

/* A full TKO_FULL_CALLER_RUNS queue: runs the task on this thread, inside
 * the gate (shutdown waits for it), if its lane is idle. The task holds
 * room while it runs, as a queued one does until it starts, so that
 * tko__keyed_run gives back what it took; TKO__LANE_BUSY (nothing done,
 * the room given back) when the lane has earlier tasks. */
static int run_here(tko_pool *pool, const tko__keyed_ops *ops, tko_lanes *l, uint64_t key,
                    tko_task_fn fn, void *arg, int weight) {
  int rc = tko__gate_enter(pool);
  if (rc) return rc;
  tko__take_room_unchecked(pool, 1);
  rc = ops->submit(l, key, fn, arg, weight, true);
  if (rc) tko__release_room(pool, 1);
  tko__gate_leave(pool);
  return rc;
}

static void keyed_free(tko_pool *pool);
static void keyed_cancel(tko_pool *pool);
/* The keyed table's phase (lifecycle.h): no close (the table is an
 * attachment, resolved when shutdown begins); a CANCEL's cancel hands its
 * queued tasks to on_cancel; its fini destroys the table. */
static const tko__phase keyed_phase = {
    .number = TKO__PHASE_KEYED, .cancel = keyed_cancel, .fini = keyed_free};

/* The pool's keyed table, made with ops->create on first use; NULL (with
 * *rc set) if making it failed. One thread makes it, under keyed_mu; the
 * others wait on that mutex and then find it made (or, after a failure,
 * try again themselves). */
static tko_lanes *keyed_table(tko_pool *pool, const tko__keyed_ops *ops, int *rc) {
  /* Acquire: pairs with the release store that publishes the table below,
   * so the table is seen initialised. */
  tko_lanes *l = tko__load_acquire(&pool->keyed);
  if (l) return l;
  tko__mutex_lock(&pool->keyed_mu);
  l = tko__load_relaxed(&pool->keyed); /* under keyed_mu, which its store holds */
  if (!l) {
    *rc = tko__phase_add(pool, &keyed_phase); /* before the table exists */
    if (!*rc) *rc = ops->create(&l, pool, pool->opts.allocator);
    if (!*rc) {
      pool->keyed_ops = ops; /* for keyed_free (the phase's fini) */
      /* Release: pairs with the acquire loads above and in keyed_cancel. */
      tko__store_release(&pool->keyed, l);
    }
  }
  tko__mutex_unlock(&pool->keyed_mu);
  return *rc ? NULL : l;
}

/* The full policy, applied before the lane is locked (a keyed task counts
 * against queue_capacity until it starts): BLOCK waits for room with no
 * lane lock held, REJECT is -EAGAIN, and CALLER_RUNS runs the task here if
 * its lane is idle - that task only, then the lane goes to the pool - or,
 * when the key's earlier tasks must run first, waits for room as BLOCK
 * does. */
int tko__keyed_submit(tko_pool *pool, const tko__keyed_ops *ops, uint64_t key, tko_task_fn fn,
                      void *arg, int weight) {
  int rc = tko__pool_check(pool);
  if (rc) return rc;
  if (!fn) return -EINVAL;
  /* Before the full policy: a shutdown that began refuses, rather than a
   * full queue's -EAGAIN or wait (test close/a_keyed_submit_on_a_full_
   * reject_queue_while_the_shutdown_resolves_is_eshutdown). */
  if (tko__pool_shutting_down(pool)) return -ESHUTDOWN;
  rc = 0;
  tko_lanes *l = keyed_table(pool, ops, &rc);
  if (!l) return rc;
  bool gated;
  rc = tko__admit(pool, 1, -1, pool->opts.full_policy, &gated);
  if (rc == TKO__RUN_HERE) {
    rc = run_here(pool, ops, l, key, fn, arg, weight);
    if (rc != TKO__LANE_BUSY) return rc;
    rc = tko__admit(pool, 1, -1, TKO_FULL_BLOCK, &gated);
  }
  if (rc == TKO__ADMITTED) {
    rc = ops->submit(l, key, fn, arg, weight, false);
    if (rc) tko__release_room(pool, 1);
  }
  if (gated) tko__gate_leave(pool); /* after the last touch of a pool that may be closing */
  return rc;
}

/* The phase's cancel. Acquire: pairs with the release that publishes the
 * table (keyed_table); a table still being made is refused its attach, as
 * the shutdown began. */
static void keyed_cancel(tko_pool *pool) {
  tko_lanes *l = tko__load_acquire(&pool->keyed);
  if (l) (void)pool->keyed_ops->cancel(l);
}

/* The phase's fini (destroy). */
static void keyed_free(tko_pool *pool) {
  tko_lanes *l = atomic_exchange(&pool->keyed, NULL);
  if (l) pool->keyed_ops->destroy(l); /* the ops that made it */
}
