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
 * Variations: the heavy task async (counted while it may start, not while
 * max_async_inflight holds it back), keyed lights (a runner's drain), and
 * two queues each holding a heavy task (a late start counts once).
 * Public API only. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "taskorch.h"
#include "tko_test.h"
#include "tko_test_feature.h"
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

static int heavy_async_fn(tko_async *op, void *arg) {
  (void)arg;
  tt_count_add(&heavy_done, 1);
  cr_assert_eq(tko_async_complete(op, 0), 0);
  return 0;
}

/* An async task that stays in flight until the test completes it. */
static tko_async *holder_op;
static tt_count holder_in;

static int holder_fn(tko_async *op, void *arg) {
  (void)arg;
  holder_op = op;
  tt_count_add(&holder_in, 1);
  return 0;
}

/* The scene's variations: pause_again pauses after the heavy submit;
 * heavy_async makes the heavy task an async one; hold_slot fills the
 * pool's one async slot (max_async_inflight 1) first, so that the heavy
 * async task is held back until the lights ran. */
typedef struct scene {
  unsigned recheck_us;
  bool pause_again, heavy_async, hold_slot;
} scene;

/* Runs the scene. Returns the pool's late inversions once everything ran. */
static uint64_t run_scene(scene sc) {
  tt_count_init(&first_in);
  tt_count_init(&lights_done);
  tt_count_init(&heavy_done);
  tt_count_init(&holder_in);
  pthread_mutex_lock(&go.mu);
  go.open = false; /* the standalone runner (TSan) runs every test in one process */
  pthread_mutex_unlock(&go.mu);
  tko_options o = tko_basic_options(1);
  o.recheck_us = sc.recheck_us;
  o.hooks.before_run = timed; /* the pool times its tasks: it counts */
  if (sc.hold_slot) o.max_async_inflight = 1;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  if (sc.hold_slot) {
    cr_assert_eq(tko_submit_async(p, holder_fn, NULL, 0), 0);
    cr_assert(tt_count_wait_eq(&holder_in, 1));
  }
  cr_assert_eq(tko_pool_pause(p), 0);
  cr_assert_eq(tko_submit(p, first_fn, NULL, 0), 0);
  for (int i = 1; i < LIGHT; i++) cr_assert_eq(tko_submit(p, light_fn, NULL, 0), 0);
  cr_assert_eq(tko_pool_resume(p), 0);
  cr_assert(tt_count_wait_eq(&first_in, 1));
  if (sc.heavy_async) cr_assert_eq(tko_submit_async(p, heavy_async_fn, NULL, 5), 0);
  else cr_assert_eq(tko_submit(p, heavy_fn, NULL, 5), 0);
  if (sc.pause_again) cr_assert_eq(tko_pool_pause(p), 0);
  /* A group cancel moves what was submitted into the queue, the heavy task
   * included, so that it is queued (not still on its way) before any light
   * task starts, whether or not the worker looks. */
  tko_group g;
  cr_assert_eq(tko_group_init(&g), 0);
  cr_assert_eq(tko_group_submit(p, &g, light_fn, NULL, 0), 0);
  cr_assert_eq(tko_group_cancel(&g), 1);
  cr_assert_eq(tko_group_destroy(&g), 0);
  tt_gate_open(&go);
  if (sc.pause_again) {
    /* The lights the worker took start while paused (the first of them
     * four periods after the heavy submit); the heavy task waits. */
    cr_assert(tt_count_wait_geq(&lights_done, 1));
    cr_assert_eq(tt_count_get(&heavy_done), 0, "the heavy task started while paused");
    cr_assert_eq(tko_pool_resume(p), 0);
  }
  if (sc.hold_slot) {
    /* Every light starts past the held-back heavy task. */
    cr_assert(tt_count_wait_eq(&lights_done, LIGHT - 1));
    cr_assert_eq(tt_count_get(&heavy_done), 0, "the held-back async task started");
    cr_assert_eq(tko_async_complete(holder_op, 0), 0);
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
  tt_count_fini(&holder_in);
  return s.late_inversions;
}

static uint64_t scenario(unsigned recheck_us, bool pause_again) {
  return run_scene((scene){.recheck_us = recheck_us, .pause_again = pause_again});
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


/* A runnable async task (a free in-flight slot) waits in the queue as a
 * plain one does: the paused pool's held lights start late past it. */
Test(late_inversions, a_queued_runnable_async_task_counts) {
  uint64_t late =
      run_scene((scene){.recheck_us = RECHECK_US, .pause_again = true, .heavy_async = true});
  cr_assert_geq(late, 1, "no late start counted");
  cr_assert_leq(late, LIGHT - 1);
}

/* An async task held back by max_async_inflight cannot start, so the
 * lighter tasks that start meanwhile are not late: every light starts past
 * it and none counts. */
Test(late_inversions, an_async_task_held_back_by_max_async_inflight_does_not_count) {
  cr_assert_eq(
      run_scene((scene){.recheck_us = RECHECK_US, .heavy_async = true, .hold_slot = true}), 0);
}

/* Keyed tasks: a runner runs up to max_drain (32) of its lane's tasks
 * whatever their weights, without looking at the queue; a heavy task
 * submitted while it runs waits for them all. The lane's first task holds
 * the runner until the heavy task is submitted, then lasts four recheck
 * periods, so each of the other 31 starts late. */
enum { KEYED = 32 };

static uint64_t keyed_late(void) {
  tt_count_init(&first_in);
  tt_count_init(&lights_done);
  tt_count_init(&heavy_done);
  pthread_mutex_lock(&go.mu);
  go.open = false;
  pthread_mutex_unlock(&go.mu);
  tko_options o = tko_basic_options(1);
  o.recheck_us = RECHECK_US;
  o.hooks.before_run = timed;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  cr_assert_eq(tko_pool_pause(p), 0);
  cr_assert_eq(tko_submit_keyed(p, 1, first_fn, NULL, 0), 0);
  for (int i = 1; i < KEYED; i++) cr_assert_eq(tko_submit_keyed(p, 1, light_fn, NULL, 0), 0);
  cr_assert_eq(tko_pool_resume(p), 0);
  cr_assert(tt_count_wait_eq(&first_in, 1));
  cr_assert_eq(tko_submit(p, heavy_fn, NULL, 100), 0);
  tt_gate_open(&go);
  cr_assert_eq(tko_pool_wait_idle(p, 60000), 0);
  cr_assert_eq(tt_count_get(&lights_done), KEYED - 1);
  cr_assert_eq(tt_count_get(&heavy_done), 1);
  tko_stats s;
  tko_pool_stats(p, &s);
  cr_assert_eq(tko_pool_destroy(p), 0);
  tt_count_fini(&first_in);
  tt_count_fini(&lights_done);
  tt_count_fini(&heavy_done);
  return s.late_inversions;
}

Test(late_inversions, keyed_starts_past_a_heavier_submit_are_late) {
  uint64_t late = keyed_late();
  cr_assert_geq(late, 1, "no late keyed start counted");
  cr_assert_leq(late, KEYED - 1);
}

/* Each late start counts once, however many queues hold a heavier task.
 * Two workers and two queues: one worker stays in a blocker task; the
 * other holds first and some lights, taken before a pause; two threads
 * each queue a heavy task on their own queue (and a group member, so that
 * the group cancel moves both queues' submissions). Paused again, the
 * worker starts its held lights, each late past both heavy tasks; each
 * light reads the count, which its own start has updated, and records by
 * how much it exceeds the lights started so far. Only that worker starts
 * lights while paused, so the count is exact there. */
static tt_gate blocker_go = TT_GATE_INIT;
static tt_count blocker_in, paused_starts;
static tko_group two_queues_group;
static tko_pool *counted_pool;
static _Atomic long most_excess, least_late;
static atomic_bool recording; /* while paused: only the holding worker starts lights */

static int blocker_fn(void *arg) {
  (void)arg;
  tt_count_add(&blocker_in, 1);
  cr_assert(tt_gate_wait(&blocker_go));
  return 0;
}

static int counted_light(void *arg) {
  (void)arg;
  if (atomic_load(&recording)) {
    long starts = tt_count_add(&paused_starts, 1);
    tko_stats s;
    tko_pool_stats(counted_pool, &s);
    long excess = (long)s.late_inversions - starts;
    if (excess > most_excess) most_excess = excess;
    if ((long)s.late_inversions < least_late || least_late < 0) least_late = (long)s.late_inversions;
  }
  tt_count_add(&lights_done, 1);
  return 0;
}

static int submit_heavy_and_member(void *arg) {
  tko_pool *p = arg;
  if (tko_submit(p, heavy_fn, NULL, 5)) return -1;
  return tko_group_submit(p, &two_queues_group, light_fn, NULL, 0);
}

Test(late_inversions, a_late_start_counts_once_past_several_queues) {
  tt_count_init(&first_in);
  tt_count_init(&lights_done);
  tt_count_init(&heavy_done);
  tt_count_init(&blocker_in);
  tt_count_init(&paused_starts);
  most_excess = 0;
  least_late = -1;
  pthread_mutex_lock(&go.mu);
  go.open = false;
  pthread_mutex_unlock(&go.mu);
  pthread_mutex_lock(&blocker_go.mu);
  blocker_go.open = false;
  pthread_mutex_unlock(&blocker_go.mu);
  tko_options o = tko_basic_options(2);
  o.queues = 2;
  o.recheck_us = RECHECK_US;
  o.hooks.before_run = timed;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  counted_pool = p;
  cr_assert_eq(tko_submit(p, blocker_fn, NULL, 0), 0);
  cr_assert(tt_count_wait_eq(&blocker_in, 1));
  cr_assert_eq(tko_pool_pause(p), 0);
  cr_assert_eq(tko_submit(p, first_fn, NULL, 0), 0);
  for (int i = 1; i < LIGHT; i++) cr_assert_eq(tko_submit(p, counted_light, NULL, 0), 0);
  cr_assert_eq(tko_pool_resume(p), 0);
  cr_assert(tt_count_wait_eq(&first_in, 1));
  cr_assert_eq(tko_pool_pause(p), 0);
  cr_assert_eq(tko_group_init(&two_queues_group), 0);
  cr_assert_eq(submit_heavy_and_member(p), 0);
  tf_thread t;
  int rc = -1;
  cr_assert_eq(tf_thread_start(&t, submit_heavy_and_member, p), 0);
  cr_assert(tf_thread_join(&t, &rc));
  cr_assert_eq(rc, 0);
  cr_assert_eq(tko_group_cancel(&two_queues_group), 2);
  cr_assert_eq(tko_group_destroy(&two_queues_group), 0);
  atomic_store(&recording, true);
  tt_gate_open(&go);
  /* The first held light starts four periods after both heavy submits. */
  cr_assert(tt_count_wait_geq(&paused_starts, 1));
  atomic_store(&recording, false);
  cr_assert_eq(tko_pool_resume(p), 0);
  tt_gate_open(&blocker_go);
  cr_assert_eq(tko_pool_wait_idle(p, 60000), 0);
  cr_assert_eq(tt_count_get(&heavy_done), 2);
  cr_assert_eq(tt_count_get(&lights_done), LIGHT - 1);
  cr_assert_geq(least_late, 1, "the first held light's start was not counted late");
  cr_assert_leq(most_excess, 0, "a late start counted more than once (by %ld)", most_excess);
  cr_assert_eq(tko_pool_destroy(p), 0);
  tt_count_fini(&first_in);
  tt_count_fini(&lights_done);
  tt_count_fini(&heavy_done);
  tt_count_fini(&blocker_in);
  tt_count_fini(&paused_starts);
}
