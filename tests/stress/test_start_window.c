/* SPDX-License-Identifier: MIT */
/* The window between a worker's take of a task and its start, through the
 * library's test seam (tko__test_start_window in src/platform/prim.h): a
 * TKO_CANCEL that begins there cancels the taken task rather than start
 * it, and what the take gave the task goes back first - an async task's
 * in-flight slot, which its kind's dropped gives back (kind.h:
 * tko__task_kind). The window is the few instructions after the take, so
 * no scene driven from outside lands in it; the seam parks the worker
 * there, every time. */
#include <errno.h>
#include <stdatomic.h>
#include <string.h>

#include "prim.h"
#include "taskorch.h"
#include "tko_test.h"
#include "tko_test_feature.h"
#include "tko_test_sync.h"

static tt_gate window = TT_GATE_INIT; /* the parked worker waits here */
static tt_count parked = TT_COUNT_INIT, async_cancels = TT_COUNT_INIT,
                marker_cancels = TT_COUNT_INIT;
static atomic_int async_started, marker_ran;
static int async_arg, marker_arg; /* their addresses tell the tasks apart */

static int async_fn(tko_async *op, void *arg) {
  (void)arg;
  atomic_fetch_add(&async_started, 1);
  return tko_async_complete(op, 0) == 0 ? 0 : 1;
}

static int marker_fn(void *arg) {
  (void)arg;
  atomic_fetch_add(&marker_ran, 1);
  return 0;
}

static void on_cancel(void *user, const tko_task_info *t) {
  (void)user;
  if (t->arg == &async_arg) tt_count_add(&async_cancels, 1);
  if (t->arg == &marker_arg) tt_count_add(&marker_cancels, 1);
}

/* Runs on the worker that took the async task, before it looks at the
 * cancel: parks it there, once, until the test opens the window. */
static void park_async(struct tko_pool *pool, void *arg) {
  (void)pool;
  if (arg != &async_arg) return;
  atomic_store(&tko__test_start_window, NULL);
  tt_count_add(&parked, 1);
  (void)tt_gate_wait(&window);
}

static int shutdown_cancel(void *pool) { return tko_pool_shutdown(pool, TKO_CANCEL); }

/* Kills async-dropped-keeps-the-slot (scripts/mutants.list). */
Test(start_window, a_taken_async_task_cancelled_before_its_start_gives_its_slot_back) {
  tko_options o = tko_basic_options(1);
  o.hooks.on_cancel = on_cancel;
  tko_pool *pool = NULL;
  cr_assert_eq(tko_pool_create(&pool, &o), 0);
  atomic_store(&tko__test_start_window, park_async);
  cr_assert_eq(tko_submit_async(pool, async_fn, &async_arg, 0), 0);
  cr_assert(tt_count_wait_geq(&parked, 1), "the worker never took the async task");
  /* The only worker is parked: the marker stays queued, and the cancel
   * hands it to on_cancel once the pool is cancelling - the sign that the
   * parked worker will see the cancel when it goes on. */
  cr_assert_eq(tko_submit(pool, marker_fn, &marker_arg, 0), 0);
  tf_thread t;
  cr_assert_eq(tf_thread_start(&t, shutdown_cancel, pool), 0);
  cr_assert(tt_count_wait_geq(&marker_cancels, 1), "the cancel never reached the queued task");
  tt_gate_open(&window);
  /* The shutdown waits for async tasks in flight: a slot kept by the
   * cancelled task would keep it waiting for good. */
  int rc = -1;
  cr_assert(tf_thread_join(&t, &rc), "shutdown waits on the slot of a task it cancelled");
  cr_assert_eq(rc, 0);
  cr_assert_eq(tt_count_get(&async_cancels), 1, "the taken async task skipped on_cancel");
  cr_assert_eq(atomic_load(&async_started), 0, "a task taken before the cancel started");
  cr_assert_eq(atomic_load(&marker_ran), 0);
  tko_stats s = tf_stats(pool);
  cr_assert_eq(s.async_inflight, 0);
  cr_assert_eq(s.cancelled, 2);
  cr_assert_eq(s.completed, 0);
  cr_assert_eq(tko_pool_destroy(pool), 0);
}
