/* SPDX-License-Identifier: MIT */
/* A resume after shutdown began wakes workers waiting in a group wait
 * (pool.c: tko_pool_resume). A task waits for a group member it queued;
 * a DRAIN shutdown begins; the pool is paused, so the waiter finds
 * nothing to run and sleeps as a helper; then a resume. Before the fix
 * the resume woke only idle workers: the helper slept on, its member
 * queued, and the shutdown waited for good (found by the attack on the
 * recheck). White-box: the test waits for the helper's count to know it
 * sleeps. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#include "internal.h"
#include "taskorch.h"
#include "tko_test.h"
#include "tko_test_sync.h"

static tko_pool *pool;
static tko_group group;
static tt_gate go = TT_GATE_INIT;
static tt_count queued_member = TT_COUNT_INIT, member_ran = TT_COUNT_INIT,
                shut = TT_COUNT_INIT;
static atomic_int wait_rc = 1;

static int member_fn(void *arg) {
  (void)arg;
  tt_count_add(&member_ran, 1);
  return 0;
}

static int waiter_fn(void *arg) {
  (void)arg;
  cr_assert_eq(tko_group_submit(pool, &group, member_fn, NULL, 0), 0);
  tt_count_add(&queued_member, 1);
  cr_assert(tt_gate_wait(&go));
  atomic_store(&wait_rc, tko_group_wait(&group, -1));
  return 0;
}

static void *shutter(void *arg) {
  (void)arg;
  cr_assert_eq(tko_pool_shutdown(pool, TKO_DRAIN), 0);
  tt_count_add(&shut, 1);
  return NULL;
}

Test(resume_helpers, a_resume_in_a_drain_wakes_a_paused_group_wait) {
  tko_options o = tko_basic_options(1);
  cr_assert_eq(tko_pool_create(&pool, &o), 0);
  cr_assert_eq(tko_group_init(&group), 0);
  cr_assert_eq(tko_submit(pool, waiter_fn, NULL, 5), 0);
  cr_assert(tt_count_wait_geq(&queued_member, 1));
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, shutter, NULL), 0);
  /* The drain has begun once submits are refused. */
  while (tko_submit(pool, tt_nop_fn, NULL, 0) != -ESHUTDOWN) sched_yield();
  cr_assert_eq(tko_pool_pause(pool), 0);
  tt_gate_open(&go);
  /* The waiter finds its pool paused and sleeps as a helper. */
  while (tko__load_seq(&pool->helpers) == 0) sched_yield();
  cr_assert_eq(tko_pool_resume(pool), 0);
  cr_assert(tt_count_wait_geq(&shut, 1));
  cr_assert_eq(pthread_join(t, NULL), 0);
  cr_assert_eq(tt_count_get(&member_ran), 1);
  cr_assert_eq(atomic_load(&wait_rc), 0);
  cr_assert_eq(tko_group_destroy(&group), 0);
  cr_assert_eq(tko_pool_destroy(pool), 0);
}
