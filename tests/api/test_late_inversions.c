/* SPDX-License-Identifier: MIT */
/* tko_stats.late_inversions (taskorch.h): starts of a task on a worker
 * while a heavier task submitted more than recheck_us earlier is still
 * queued, counted in pools that time their tasks. One worker, so the
 * order is exact: light tasks are queued while the pool is paused, so
 * that the resume's take holds them in one batch; the first blocks until
 * the test has submitted a heavy task, then lasts four recheck periods (a
 * length of task, not a wait). With the pool paused again meanwhile, the
 * worker's rechecks hand nothing back (nothing outranks while paused) and
 * it starts the lights it holds, each late; running, its recheck hands the
 * batch back and the heavy task starts first, and nothing is late.
 * Public API only. */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "taskorch.h"
#include "tko_test.h"
#include "tko_test_sync.h"

enum { LIGHT = 10, RECHECK_US = 50 };

static tt_count first_in, lights_done, heavy_done;
static tt_gate go = TT_GATE_INIT;

static void timed(void *user, const tko_task_info *t) { (void)user, (void)t; }

static int first_fn(void *arg) {
  (void)arg;
  tt_count_add(&first_in, 1);
  cr_assert(tt_gate_wait(&go));
  uint64_t until = tt_now_ns() + 4000u * RECHECK_US;
  while (tt_now_ns() < until) {
  }
  return 0;
}

static int light_fn(void *arg) {
  (void)arg;
  tt_count_add(&lights_done, 1);
  return 0;
}

static int heavy_fn(void *arg) {
  (void)arg;
  tt_count_add(&heavy_done, 1);
  return 0;
}

/* Runs the scenario; pause_again: pause after the heavy submit. Returns
 * the pool's late inversions once everything ran. */
static uint64_t scenario(unsigned recheck_us, bool pause_again) {
  tt_count_init(&first_in);
  tt_count_init(&lights_done);
  tt_count_init(&heavy_done);
  pthread_mutex_lock(&go.mu);
  go.open = false; /* the standalone runner (TSan) runs every test in one process */
  pthread_mutex_unlock(&go.mu);
  tko_options o = tko_basic_options(1);
  o.recheck_us = recheck_us;
  o.hooks.before_run = timed; /* the pool times its tasks: it counts */
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  cr_assert_eq(tko_pool_pause(p), 0);
  cr_assert_eq(tko_submit(p, first_fn, NULL, 0), 0);
  for (int i = 1; i < LIGHT; i++) cr_assert_eq(tko_submit(p, light_fn, NULL, 0), 0);
  cr_assert_eq(tko_pool_resume(p), 0);
  cr_assert(tt_count_wait_eq(&first_in, 1));
  cr_assert_eq(tko_submit(p, heavy_fn, NULL, 5), 0);
  if (pause_again) cr_assert_eq(tko_pool_pause(p), 0);
  /* A group cancel moves what was submitted into the queue, the heavy task
   * included, so that it is queued (not still on its way) before any light
   * task starts, whether or not the worker looks. */
  tko_group g;
  cr_assert_eq(tko_group_init(&g), 0);
  cr_assert_eq(tko_group_submit(p, &g, light_fn, NULL, 0), 0);
  cr_assert_eq(tko_group_cancel(&g), 1);
  cr_assert_eq(tko_group_destroy(&g), 0);
  tt_gate_open(&go);
  if (pause_again) {
    /* The lights the worker took start while paused (the first of them
     * four periods after the heavy submit); the heavy task waits. */
    cr_assert(tt_count_wait_geq(&lights_done, 1));
    cr_assert_eq(tt_count_get(&heavy_done), 0, "the heavy task started while paused");
    cr_assert_eq(tko_pool_resume(p), 0);
  }
  cr_assert_eq(tko_pool_wait_idle(p, 60000), 0);
  cr_assert_eq(tt_count_get(&lights_done), LIGHT - 1);
  cr_assert_eq(tt_count_get(&heavy_done), 1);
  tko_stats s;
  tko_pool_stats(p, &s);
  cr_assert_eq(tko_pool_destroy(p), 0);
  tt_count_fini(&first_in);
  tt_count_fini(&lights_done);
  tt_count_fini(&heavy_done);
  return s.late_inversions;
}

Test(late_inversions, a_paused_pools_held_batch_starts_late) {
  uint64_t late = scenario(RECHECK_US, true);
  cr_assert_geq(late, 1, "no late start counted");
  cr_assert_leq(late, LIGHT - 1, "%llu late starts counted for %d lights",
                (unsigned long long)late, LIGHT - 1);
}

Test(late_inversions, a_running_pool_hands_back_and_nothing_is_late) {
  cr_assert_eq(scenario(RECHECK_US, false), 0);
}

/* The same held batch with a recheck period longer than the test: its
 * starts are inversions, but not late ones. */
Test(late_inversions, starts_within_the_recheck_period_are_not_late) {
  cr_assert_eq(scenario(10u * 1000u * 1000u, true), 0);
}

/* One task per take, each four periods long: tasks of their own weight
 * wait longer than the period while each starts - no inversion. */
static int long_light(void *arg) {
  (void)arg;
  uint64_t until = tt_now_ns() + 4000u * RECHECK_US;
  while (tt_now_ns() < until) {
  }
  return 0;
}

Test(late_inversions, equal_weights_waiting_are_not_late) {
  tko_options o = tko_basic_options(1);
  o.recheck_us = RECHECK_US;
  o.max_batch = 1;
  o.hooks.before_run = timed;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  cr_assert_eq(tko_pool_pause(p), 0);
  for (int i = 0; i < LIGHT; i++) cr_assert_eq(tko_submit(p, long_light, NULL, 3), 0);
  cr_assert_eq(tko_pool_resume(p), 0);
  cr_assert_eq(tko_pool_wait_idle(p, 60000), 0);
  tko_stats s;
  tko_pool_stats(p, &s);
  cr_assert_eq(s.completed, LIGHT);
  cr_assert_eq(s.late_inversions, 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}
