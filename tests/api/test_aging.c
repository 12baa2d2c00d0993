/* SPDX-License-Identifier: MIT */
/* Tests for anti-starvation aging (aging_ms). The starvation tests run a
 * self-sustaining stream of higher-weight tasks on one worker (each stream
 * task submits the next, and 128 stay queued so a worker's take of up to 64
 * never reaches the low task by accident) with one low-weight task queued
 * before it:
 *  - aging off: the low task runs exactly last, after the whole stream;
 *  - aging on (1 ms, gap 20): the low task runs while the stream still goes,
 *    and the stream stops itself once it has, so the test does not depend
 *    on how long anything takes (the stream's length cap is only a guard:
 *    millions of tasks, far more than 20 ms of work on any machine).
 * Aging also keeps FIFO among equal weights and exact weight order over the
 * whole int range when the weights are far apart, and it works for async
 * tasks and across shutdown. No test sleeps to wait for something. */
#include <errno.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "taskorch.h"
#include "tko_test.h"
#include "tko_test_sync.h"

enum { LOW_W = 0, HIGH_W = 20, INITIAL_HIGH = 128 };

typedef struct actx {
  tko_pool *pool;
  long cap;         /* stream tasks submitted at most */
  bool stop_on_low; /* the stream ends once the low task has run */
  /* Only the one worker touches these while the stream runs; the test
   * reads them after wait_idle. Atomics keep that simple to reason about. */
  atomic_long submitted; /* stream tasks submitted */
  atomic_long ran;       /* stream tasks run */
  atomic_long low_pos;   /* stream tasks run before the low task; -1 = not yet */
  atomic_bool low_done;
  atomic_bool stream_alive_at_low; /* the stream could still submit when low ran */
  atomic_int errors;
} actx;

static void actx_init(actx *c, long cap, bool stop_on_low) {
  memset(c, 0, sizeof *c);
  c->cap = cap;
  c->stop_on_low = stop_on_low;
  atomic_init(&c->submitted, 0);
  atomic_init(&c->ran, 0);
  atomic_init(&c->low_pos, -1);
  atomic_init(&c->low_done, false);
  atomic_init(&c->stream_alive_at_low, false);
  atomic_init(&c->errors, 0);
}

static int high_fn(void *arg) {
  actx *c = arg;
  atomic_fetch_add(&c->ran, 1);
  if (c->stop_on_low && atomic_load(&c->low_done)) return 0;
  if (atomic_load(&c->submitted) < c->cap) {
    atomic_fetch_add(&c->submitted, 1);
    if (tko_submit(c->pool, high_fn, c, HIGH_W)) atomic_fetch_add(&c->errors, 1);
  }
  return 0;
}

static void low_ran(actx *c) {
  atomic_store(&c->low_pos, atomic_load(&c->ran));
  atomic_store(&c->stream_alive_at_low, atomic_load(&c->submitted) < c->cap);
  atomic_store(&c->low_done, true);
}

static int low_fn(void *arg) {
  low_ran(arg);
  return 0;
}

static int low_async_fn(tko_async *op, void *arg) {
  low_ran(arg);
  return tko_async_complete(op, 0);
}

static tko_pool *make_pool(unsigned aging_ms) {
  tko_options o = tko_basic_options(1);
  o.aging_ms = aging_ms;
  tko_pool *p = NULL;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  return p;
}

/* Queues the low task, then the stream's first INITIAL_HIGH tasks, on a
 * paused pool; resumes and waits for everything. */
static void run_stream(actx *c, bool async_low) {
  cr_assert_eq(tko_pool_pause(c->pool), 0);
  if (async_low)
    cr_assert_eq(tko_submit_async(c->pool, low_async_fn, c, LOW_W), 0);
  else
    cr_assert_eq(tko_submit(c->pool, low_fn, c, LOW_W), 0);
  for (int i = 0; i < INITIAL_HIGH; i++) {
    atomic_fetch_add(&c->submitted, 1);
    cr_assert_eq(tko_submit(c->pool, high_fn, c, HIGH_W), 0);
  }
  cr_assert_eq(tko_pool_resume(c->pool), 0);
  cr_assert_eq(tko_pool_wait_idle(c->pool, -1), 0);
  cr_assert_eq(atomic_load(&c->errors), 0);
  cr_assert(atomic_load(&c->low_done));
  cr_assert_eq(atomic_load(&c->ran), atomic_load(&c->submitted));
}

Test(aging, off_the_low_task_waits_for_the_whole_stream) {
  actx c;
  actx_init(&c, TT_SCALE(3000, 500), false);
  c.pool = make_pool(0);
  run_stream(&c, false);
  cr_assert_eq(atomic_load(&c.submitted), c.cap);
  cr_assert_eq(atomic_load(&c.low_pos), c.cap, "without aging the low task runs last");
  cr_assert_not(atomic_load(&c.stream_alive_at_low));
  cr_assert_eq(tko_pool_destroy(c.pool), 0);
}

Test(aging, on_the_low_task_runs_during_the_stream) {
  actx c;
  /* The cap only guards against a hang: 20 ms of aging is reached long
   * before this many tasks have run. */
  actx_init(&c, TT_SCALE(20000000L, 2000000L), true);
  c.pool = make_pool(1);
  run_stream(&c, false);
  cr_assert(atomic_load(&c.stream_alive_at_low),
            "the low task waited for the stream to end (%ld of %ld submitted)",
            atomic_load(&c.submitted), c.cap);
  cr_assert_gt(atomic_load(&c.low_pos), 0);
  cr_assert_lt(atomic_load(&c.low_pos), c.cap);
  cr_assert_eq(tko_pool_destroy(c.pool), 0);
}

Test(aging, on_an_async_low_task_runs_during_the_stream) {
  actx c;
  actx_init(&c, TT_SCALE(20000000L, 2000000L), true);
  c.pool = make_pool(1);
  run_stream(&c, true);
  cr_assert(atomic_load(&c.stream_alive_at_low));
  cr_assert_eq(tko_pool_destroy(c.pool), 0);
}

Test(aging, off_an_async_low_task_waits_for_the_stream) {
  actx c;
  actx_init(&c, TT_SCALE(3000, 500), false);
  c.pool = make_pool(0);
  run_stream(&c, true);
  cr_assert_eq(atomic_load(&c.low_pos), c.cap);
  cr_assert_eq(tko_pool_destroy(c.pool), 0);
}

/* ---- order --------------------------------------------------------------- */

typedef struct octx {
  atomic_int next;
  int order[64];
} octx;

typedef struct otask {
  octx *o;
  int index;
} otask;

static int order_fn(void *arg) {
  otask *t = arg;
  t->o->order[atomic_fetch_add(&t->o->next, 1)] = t->index;
  return 0;
}

Test(aging, equal_weights_stay_fifo) {
  tko_pool *pool = make_pool(1);
  octx o;
  memset(&o, 0, sizeof o);
  atomic_init(&o.next, 0);
  otask ts[64];
  cr_assert_eq(tko_pool_pause(pool), 0);
  for (int i = 0; i < 64; i++) {
    ts[i] = (otask){&o, i};
    cr_assert_eq(tko_submit(pool, order_fn, &ts[i], 5), 0);
  }
  cr_assert_eq(tko_pool_resume(pool), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  for (int i = 0; i < 64; i++)
    cr_assert_eq(o.order[i], i);
  cr_assert_eq(tko_pool_destroy(pool), 0);
}

Test(aging, weight_order_is_exact_over_the_int_range) {
  /* One unit per hour of waiting: the weights below are far enough apart
   * that the submits cannot take long enough to reorder them. */
  tko_pool *pool = make_pool(TKO_MAX_IDLE_MS);
  static const int weights[] = {0, INT_MIN, INT_MAX, -1, INT_MAX - 1, 1, INT_MIN + 1, 1000};
  enum { N = sizeof weights / sizeof weights[0] };
  static const int want[N] = {2, 4, 7, 5, 0, 3, 6, 1}; /* indices by weight, highest first */
  octx o;
  memset(&o, 0, sizeof o);
  atomic_init(&o.next, 0);
  otask ts[N];
  cr_assert_eq(tko_pool_pause(pool), 0);
  for (int i = 0; i < N; i++) {
    ts[i] = (otask){&o, i};
    cr_assert_eq(tko_submit(pool, order_fn, &ts[i], weights[i]), 0);
  }
  cr_assert_eq(tko_pool_resume(pool), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  for (int i = 0; i < N; i++)
    cr_assert_eq(o.order[i], want[i], "position %d", i);
  cr_assert_eq(tko_pool_destroy(pool), 0);
}

/* ---- shutdown ------------------------------------------------------------ */

static void count_cancel(void *user, const tko_task_info *t) {
  atomic_fetch_add((atomic_int *)user, 1);
}

static int count_run(void *arg) {
  atomic_fetch_add((atomic_int *)arg, 1);
  return 0;
}

static void aged_shutdown(tko_shutdown_mode mode) {
  atomic_int runs = 0, cancels = 0;
  tko_options o = tko_basic_options(2);
  o.aging_ms = 1;
  o.hooks.user = &cancels;
  o.hooks.on_cancel = count_cancel;
  tko_pool *pool = NULL;
  cr_assert_eq(tko_pool_create(&pool, &o), 0);
  cr_assert_eq(tko_pool_pause(pool), 0);
  for (int i = 0; i < 100; i++)
    cr_assert_eq(tko_submit(pool, count_run, &runs, i % 7 - 3), 0);
  cr_assert_eq(tko_pool_shutdown(pool, mode), 0);
  cr_assert_eq(atomic_load(&runs) + atomic_load(&cancels), 100);
  cr_assert_eq(atomic_load(mode == TKO_DRAIN ? &runs : &cancels), 100);
  cr_assert_eq(tko_pool_destroy(pool), 0);
}

Test(aging, shutdown_drains_or_cancels_aged_tasks) {
  aged_shutdown(TKO_DRAIN);
  aged_shutdown(TKO_CANCEL);
}
