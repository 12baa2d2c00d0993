/* SPDX-License-Identifier: MIT */
/* tko_pool_resize when threads cannot start, through the library's test
 * seam (tko__test_thread_create_errno, src/platform/prim.h): a grow that cannot
 * start its threads is -EAGAIN, keeps the workers it had and can be
 * retried; a basic worker that a task's pthread_exit ended with no
 * replacement leaves its slot to the next grow, which joins the old thread
 * and starts a new one. The seam is process-wide: each test clears it
 * before it returns. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "prim.h"
#include "taskorch.h"
#include "tko_test.h"
#include "tko_test_feature.h"
#include "tko_test_sync.h"

static void seam_set(int err) {
  atomic_store(&tko__test_thread_create_errno, err);
}

static unsigned basic_workers(tko_pool *p) {
  tko_stats s;
  tko_pool_stats(p, &s);
  return s.basic_workers;
}

/* Two tasks that each wait for the other: they need two workers at once. */
static int pair_fn(void *arg) {
  tt_count *c = arg;
  tt_count_add(c, 1);
  return tt_count_wait_geq(c, 2) ? 0 : 1;
}

static void two_at_once(tko_pool *p) {
  tt_count c;
  tt_count_init(&c);
  tko_stats s;
  tko_pool_stats(p, &s);
  uint64_t failed = s.failed;
  cr_assert_eq(tko_submit(p, pair_fn, &c, 0), 0);
  cr_assert_eq(tko_submit(p, pair_fn, &c, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS + 10000), 0);
  tko_pool_stats(p, &s);
  cr_assert_eq(s.failed, failed, "two tasks never ran at once");
  tt_count_fini(&c);
}

Test(resize_threads, a_grow_that_cannot_start_threads_is_eagain) {
  tko_options o = tko_basic_options(1);
  o.max_threads = 4;
  o.max_batch = 1;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  seam_set(EAGAIN);
  int rc = tko_pool_resize(p, 3, 0);
  seam_set(0);
  cr_assert_eq(rc, -EAGAIN);
  cr_assert_eq(basic_workers(p), 1);
  cr_assert_eq(tko_pool_resize(p, 3, 0), 0); /* a retry starts them */
  cr_assert_eq(basic_workers(p), 3);
  two_at_once(p);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

static int exit_fn(void *arg) {
  atomic_store((atomic_int *)arg, (int)tf_gettid());
  pthread_exit(NULL);
  return 0;
}

static void count_stop(void *user, unsigned index, tko_worker_kind kind) {
  (void)index, (void)kind;
  tt_count_add(user, 1);
}

Test(resize_threads, a_grow_staffs_a_slot_whose_replacement_failed) {
  tt_count stops;
  tt_count_init(&stops);
  tko_options o = tko_basic_options(2);
  o.max_batch = 1;
  o.hooks.user = &stops;
  o.hooks.thread_stop = count_stop;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  atomic_int exiting = 0;
  seam_set(EAGAIN);
  cr_assert_eq(tko_submit(p, exit_fn, &exiting, 0), 0);
  cr_assert(tt_count_wait_geq(&stops, 1));
  /* The exiting thread leaves /proc once it has ended: its slot is then
   * RETIRING, and its replacement has failed. Its own tid is what this
   * waits for; a count of the process's threads would also move for any
   * other thread that starts or ends meanwhile. */
  cr_assert(tf_wait_thread_gone(atomic_load(&exiting)), "the exiting worker never ended");
  seam_set(0);
  cr_assert_eq(basic_workers(p), 1);
  cr_assert_eq(tko_pool_resize(p, 2, 0), 0);
  cr_assert_eq(basic_workers(p), 2);
  two_at_once(p);
  cr_assert_eq(tko_pool_destroy(p), 0);
  tt_count_fini(&stops);
}
