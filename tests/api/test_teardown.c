/* SPDX-License-Identifier: MIT */
/* Tests for what shutdown and destroy owe the pool's own features (async
 * tasks, timers, keyed tasks), each used for the first time at any moment
 * before the pool stops: destroy gives back everything they allocated (a
 * counting allocator's live blocks return to zero); a pool's first timer,
 * armed while a drain waits for an async task in flight, is accepted, fires
 * and completes that task, and the timers are closed before shutdown
 * returns (arming again is -ESHUTDOWN); a first timer armed once the pool
 * stopped is -ESHUTDOWN. No test sleeps to wait for something: completions
 * are counted under a condition variable, and a poll of tko_submit sees the
 * pool close. */
#include <errno.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#include "taskorch.h"
#include "tko_test.h"
#include "tko_test_fault.h"
#include "tko_test_feature.h"
#include "tko_test_sync.h"

static int count_fn(void *arg) {
  tt_count_add(arg, 1);
  return 0;
}

static int complete_at_once_fn(tko_async *op, void *arg) {
  tt_count_add(arg, 1);
  return tko_async_complete(op, 0);
}

Test(teardown, destroy_gives_back_what_every_feature_allocated) {
  tfa f;
  tfa_init(&f);
  tko_options o = tko_basic_options(2);
  o.allocator = &f.al;
  tko_pool *pool = NULL;
  cr_assert_eq(tko_pool_create(&pool, &o), 0);
  long created = atomic_load(&f.live);
  tt_count keyed, async, every, after;
  tt_count_init(&keyed);
  tt_count_init(&async);
  tt_count_init(&every);
  tt_count_init(&after);
  tko_timer periodic, once;
  tko_timer_init(&periodic);
  tko_timer_init(&once);
  cr_assert_eq(tko_submit_keyed(pool, 7, count_fn, &keyed, 0), 0);
  cr_assert_eq(tko_submit_async(pool, complete_at_once_fn, &async, 0), 0);
  cr_assert_eq(tko_submit_every(pool, &periodic, 1, count_fn, &every, 0), 0);
  cr_assert_eq(tko_submit_after(pool, &once, 0, count_fn, &after, 0), 0);
  cr_assert(tt_count_wait_geq(&keyed, 1));
  cr_assert(tt_count_wait_geq(&async, 1));
  cr_assert(tt_count_wait_geq(&every, 1));
  cr_assert(tt_count_wait_geq(&after, 1));
  /* The keyed table, the async records, the timer heap and the periodic
   * timer's record. */
  cr_assert_gt(atomic_load(&f.live), created, "the features allocated nothing of the pool's");
  cr_assert_eq(tko_pool_destroy(pool), 0);
  cr_assert_eq(atomic_load(&f.live), 0, "destroy left blocks of the features allocated");
}

typedef struct held_async {
  tko_pool *pool;
  tko_async *op;
  tt_count started;
  tt_count completed; /* by the timer's task, with tko_async_complete's 0 */
  atomic_int cancels;
} held_async;

static int hold_fn(tko_async *op, void *arg) {
  held_async *h = arg;
  h->op = op;
  tt_count_add(&h->started, 1);
  return 0; /* in flight until the timer's task completes it */
}

static int complete_held_fn(void *arg) {
  held_async *h = arg;
  if (tko_async_complete(h->op, 0) == 0) tt_count_add(&h->completed, 1);
  return 0;
}

static void count_cancel(void *user, const tko_task_info *info) {
  (void)info;
  atomic_fetch_add(&((held_async *)user)->cancels, 1);
}

static int drain_fn(void *pool) { return tko_pool_shutdown(pool, TKO_DRAIN); }

/* Until this pool's shutdown has closed it (a plain submit is refused);
 * false if that did not happen within TT_LONG_MS. */
static bool wait_closed(tko_pool *pool) {
  uint64_t end = tt_now_ns() + (uint64_t)TT_LONG_MS * 1000000u;
  while (tko_submit(pool, tt_nop_fn, NULL, 0) != -ESHUTDOWN) {
    if (tt_now_ns() > end) return false;
    sched_yield();
  }
  return true;
}

Test(teardown, a_first_timer_armed_while_a_drain_waits_for_an_async_task_completes_it) {
  held_async h;
  memset(&h, 0, sizeof h);
  tt_count_init(&h.started);
  tt_count_init(&h.completed);
  tko_options o = tko_basic_options(1);
  o.hooks.on_cancel = count_cancel;
  o.hooks.user = &h;
  cr_assert_eq(tko_pool_create(&h.pool, &o), 0);
  cr_assert_eq(tko_submit_async(h.pool, hold_fn, &h, 0), 0);
  cr_assert(tt_count_wait_geq(&h.started, 1));
  tf_thread t;
  cr_assert_eq(tf_thread_start(&t, drain_fn, h.pool), 0);
  cr_assert(wait_closed(h.pool), "the drain never closed the pool");
  /* The pool's first timer: its phase is registered while the shutdown
   * runs (before its phases, or while it waits in the async tasks'), and
   * must still be closed by it. */
  tko_timer timer;
  tko_timer_init(&timer);
  cr_assert_eq(tko_submit_after(h.pool, &timer, 0, complete_held_fn, &h, 0), 0);
  int rc = -1;
  cr_assert(tf_thread_join_within(&t, TT_LONG_MS, &rc), "the drain never ended");
  cr_assert_eq(rc, 0);
  cr_assert_eq(tt_count_get(&h.completed), 1);
  cr_assert_eq(atomic_load(&h.cancels), 0);
  tko_stats s = tf_stats(h.pool);
  cr_assert_eq(s.async_inflight, 0);
  /* The timers were closed: arming again is refused. */
  tko_timer again;
  tko_timer_init(&again);
  cr_assert_eq(tko_submit_after(h.pool, &again, 0, tt_nop_fn, NULL, 0), -ESHUTDOWN);
  cr_assert_eq(tko_pool_destroy(h.pool), 0);
}

Test(teardown, a_first_timer_armed_once_the_pool_stopped_is_eshutdown) {
  tko_options o = tko_basic_options(1);
  tko_pool *pool = NULL;
  cr_assert_eq(tko_pool_create(&pool, &o), 0);
  cr_assert_eq(tko_pool_shutdown(pool, TKO_DRAIN), 0);
  tko_timer once, every;
  tko_timer_init(&once);
  tko_timer_init(&every);
  cr_assert_eq(tko_submit_after(pool, &once, 0, tt_nop_fn, NULL, 0), -ESHUTDOWN);
  cr_assert_eq(tko_submit_every(pool, &every, 1, tt_nop_fn, NULL, 0), -ESHUTDOWN);
  cr_assert_eq(tko_timer_cancel(&once), -ENOENT);
  cr_assert_eq(tko_pool_destroy(pool), 0);
}
