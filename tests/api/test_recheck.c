/* SPDX-License-Identifier: MIT */
/* The bounded-inversion recheck (taskorch.h: tko_submit, recheck_us): a
 * worker working through a batch it took looks at the queue again before a
 * lighter start once recheck_us has passed since its take or its last look,
 * and hands the rest of its batch back if a heavier task is queued.
 * One worker, so the order is exact: the pool is paused while ten light
 * tasks are queued, so that its take holds them (as many as its batch
 * size, sized by time, allows; the assertions hold for any). The first of them
 * submits a task of its own and then runs for twice the recheck period (a
 * length of task, not a wait for anything); the order of starts then says
 * whether the worker looked. Public API only. */
#include <limits.h>
#include <stdatomic.h>
#include <stdint.h>

#include "taskorch.h"
#include "tko_test.h"
#include "tko_test_fault.h"
#include "tko_test_sync.h"

enum { LIGHT = 10, RECHECK_US = 50 };

/* How the first task submits the late one: tko_submit, a batch of one, or
 * tko_submit followed by a group member that it then waits for (its wait
 * helps: it runs tasks of its own batch first). */
typedef enum how { SINGLE, BATCH, THEN_WAIT } how;

typedef struct scenario {
  tko_pool *pool;
  int late_weight; /* the weight the first task submits */
  how via;
  atomic_int starts;
  /* by start: the task's number, LIGHT for the late one, LIGHT + 1 for the
   * group member (THEN_WAIT) */
  int order[LIGHT + 2];
} scenario;

typedef struct task {
  scenario *s;
  int number;
} task;

/* A task's length, not a wait for anything: twice the recheck period. */
static void run_two_periods(void) {
  uint64_t until = tt_now_ns() + 2000u * RECHECK_US;
  while (tt_now_ns() < until) {
  }
}

static void note_start(const task *t) {
  int k = atomic_fetch_add(&t->s->starts, 1);
  if (k <= LIGHT + 1) t->s->order[k] = t->number;
}

static int plain_fn(void *arg) {
  note_start(arg);
  return 0;
}

static task late_task, member_task;
static tko_group group;

/* The first light task: submits the late one, then lasts two periods. */
static int first_fn(void *arg) {
  task *t = arg;
  note_start(t);
  scenario *s = t->s;
  late_task = (task){s, LIGHT};
  if (s->via == SINGLE) {
    cr_assert_eq(tko_submit(s->pool, plain_fn, &late_task, s->late_weight), 0);
  } else {
    tko_task one[1] = {{plain_fn, &late_task, s->late_weight}};
    cr_assert_eq(tko_submit_batch(s->pool, one, 1), 0);
  }
  if (s->via == THEN_WAIT) {
    member_task = (task){s, LIGHT + 1};
    cr_assert_eq(tko_group_submit(s->pool, &group, plain_fn, &member_task, 0), 0);
  }
  run_two_periods();
  if (s->via == THEN_WAIT) cr_assert_eq(tko_group_wait(&group, -1), 0);
  return 0;
}

/* Runs the scenario; returns the pool's handbacks. ceiling: a weight
 * submitted (and run) first, so that the pool has seen it. */
static uint64_t run(scenario *s, unsigned recheck_us, int ceiling) {
  tko_options o = tko_basic_options(1);
  o.recheck_us = recheck_us;
  cr_assert_eq(tko_pool_create(&s->pool, &o), 0);
  cr_assert_eq(tko_submit(s->pool, tt_nop_fn, NULL, ceiling), 0);
  cr_assert_eq(tko_pool_wait_idle(s->pool, TT_LONG_MS), 0);
  atomic_store(&s->starts, 0);
  task tasks[LIGHT];
  cr_assert_eq(tko_pool_pause(s->pool), 0);
  for (int i = 0; i < LIGHT; i++) {
    tasks[i] = (task){s, i};
    cr_assert_eq(tko_submit(s->pool, i ? plain_fn : first_fn, &tasks[i], 0), 0);
  }
  cr_assert_eq(tko_pool_resume(s->pool), 0);
  cr_assert_eq(tko_pool_wait_idle(s->pool, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&s->starts), LIGHT + 1 + (s->via == THEN_WAIT));
  tko_stats st;
  tko_pool_stats(s->pool, &st);
  tko_pool_destroy(s->pool);
  return st.handbacks;
}

/* Where the late task started: its index in the order of starts. */
static int late_start(const scenario *s) {
  for (int k = 0; k <= LIGHT; k++)
    if (s->order[k] == LIGHT) return k;
  return -1;
}

/* The light tasks kept their order, whatever the late one did (a group
 * member may start among them: a helping wait runs its own group's
 * members before the queued tasks of their weight). */
static void lights_in_order(const scenario *s) {
  int next = 0;
  for (int k = 0; k < LIGHT + 1 + (s->via == THEN_WAIT); k++)
    if (s->order[k] < LIGHT) cr_assert_eq(s->order[k], next++);
  cr_assert_eq(next, LIGHT);
}

/* The pool has seen weight 0 only: the late task raises its ceiling. */
static void heavier_goes_next(how via) {
  scenario s = {.late_weight = 5, .via = via};
  /* Whether the take held the ten or fewer (takes are sized by time), the
   * late task starts right after the task that submitted it. */
  cr_assert_leq(run(&s, RECHECK_US, 0), 1);
  cr_assert_eq(late_start(&s), 1);
  lights_in_order(&s);
}

Test(recheck, a_heavier_task_sends_the_rest_of_a_batch_back) { heavier_goes_next(SINGLE); }

Test(recheck, a_heavier_task_from_a_batch_submit_sends_it_back_too) { heavier_goes_next(BATCH); }

/* The first task waits for a group member it submitted after the late
 * task: its wait runs its own batch's tasks first, and looks before each. */
Test(recheck, a_helping_group_wait_looks_too) {
  cr_assert_eq(tko_group_init(&group), 0);
  heavier_goes_next(THEN_WAIT);
  cr_assert_eq(tko_group_destroy(&group), 0);
}

/* No look before the period is out: nothing handed back, and the late task
 * starts where the first take's size put it. */
Test(recheck, a_long_period_lets_the_batch_run_first) {
  scenario s = {.late_weight = 5, .via = SINGLE};
  cr_assert_eq(run(&s, UINT_MAX, 0), 0);
  cr_assert_geq(late_start(&s), 1);
  lights_in_order(&s);
}

/* The pool has seen weight 9, so the worker looks; an equal or lighter
 * task queued meanwhile does not outrank the batch. */
Test(recheck, an_equal_or_lighter_task_leaves_the_batch_alone) {
  int weights[] = {0, -1};
  for (int i = 0; i < 2; i++) {
    scenario s = {.late_weight = weights[i], .via = SINGLE};
    cr_assert_eq(run(&s, RECHECK_US, 9), 0);
    cr_assert_eq(late_start(&s), LIGHT);
    lights_in_order(&s);
  }
}

/* A hand-back needs room in the queue; when the queue cannot grow, the
 * worker keeps its batch and runs it: a recheck never sends a task to
 * on_cancel. One worker takes 16 tasks from a 16-slot queue (the first
 * holds it); 15 more and a heavier one fill the slots again; the allocator
 * then fails, and the first task lasts past the period. (Kept from the
 * attack on the recheck: before, the 15 went to on_cancel.) */
static atomic_int oom_ran, oom_cancelled;
static tt_pin oom_first = TT_PIN_INIT;

static int oom_task(void *arg) {
  if (arg) {
    tt_pin_fn(&oom_first);
    run_two_periods();
  }
  atomic_fetch_add(&oom_ran, 1);
  return 0;
}

static void oom_on_cancel(void *user, const tko_task_info *info) {
  (void)user, (void)info;
  atomic_fetch_add(&oom_cancelled, 1);
}

Test(recheck, a_hand_back_the_queue_cannot_take_keeps_the_batch) {
  tfa f;
  tfa_init(&f);
  tko_options o = tko_basic_options(1);
  o.initial_capacity = 16;
  o.allocator = &f.al;
  o.recheck_us = RECHECK_US;
  o.hooks.on_cancel = oom_on_cancel;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  /* The pool's first take holds 16 (a fresh worker's first cap), and the
   * queue's first buckets are allocated with it, so only the hand-back
   * itself needs room. */
  cr_assert_eq(tko_pool_pause(p), 0);
  for (int i = 0; i < 16; i++) cr_assert_eq(tko_submit(p, oom_task, i ? NULL : &oom_first, 0), 0);
  cr_assert_eq(tko_pool_resume(p), 0);
  cr_assert(tt_count_wait_geq(&oom_first.started, 1));
  for (int i = 0; i < 15; i++) cr_assert_eq(tko_submit(p, oom_task, NULL, 0), 0);
  cr_assert_eq(tko_submit(p, oom_task, NULL, 5), 0);
  tfa_fail_from(&f, 1);
  tt_gate_open(&oom_first.gate);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  tfa_heal(&f);
  tko_stats st;
  tko_pool_stats(p, &st);
  cr_assert_gt(atomic_load(&f.failures), 0); /* the hand-back asked for room */
  cr_assert_eq(st.handbacks, 0);
  cr_assert_eq(atomic_load(&oom_cancelled), 0);
  cr_assert_eq(atomic_load(&oom_ran), 32);
  cr_assert_eq(tko_pool_destroy(p), 0);
  cr_assert_eq(atomic_load(&f.live), 0);
}
