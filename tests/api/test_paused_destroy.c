/* SPDX-License-Identifier: MIT */
/* Issue 14, defect 4: tko_lanes_destroy and tko_coalescer_destroy hung on a
 * paused pool (they waited for work the pool would not start until it was
 * resumed). Now a lane table's destroy takes its queued runners back and
 * runs their lanes on the destroying thread, and a coalescer's destroy
 * takes back its queued sweep (its final flush covers it); the pool stays
 * paused for everything else. Each destroy runs on a helper thread that the
 * test joins within a bound, so a regression fails instead of hanging. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include <taskorch.h>
#include <taskorch/coalescer.h>
#include <taskorch/lanes.h>

#include "tko_test.h"
#include "tko_test_sync.h"

#define PD_BOUND_MS 10000L

typedef struct destroyer {
  tko_lanes *l;
  tko_coalescer *c;
  pthread_t thread;
  tt_count done;
  atomic_int rc;
} destroyer;

static void *destroy_main(void *arg) {
  destroyer *d = arg;
  atomic_store(&d->rc, d->l ? tko_lanes_destroy(d->l) : tko_coalescer_destroy(d->c));
  tt_count_add(&d->done, 1);
  return NULL;
}

static void destroy_start(destroyer *d) {
  tt_count_init(&d->done);
  atomic_init(&d->rc, 1);
  cr_assert_eq(pthread_create(&d->thread, NULL, destroy_main, d), 0);
}

/* True if the destroy returned within the bound (the thread is joined). */
static bool destroy_returned(destroyer *d) {
  if (!tt_count_wait_geq_within(&d->done, 1, PD_BOUND_MS)) return false;
  pthread_join(d->thread, NULL);
  tt_count_fini(&d->done);
  return true;
}

typedef struct lane_log {
  atomic_int ran;
  tt_gate gate; /* the first task of a blocking lane waits here */
  tt_count started;
} lane_log;

static int log_task(void *arg) {
  lane_log *g = arg;
  atomic_fetch_add(&g->ran, 1);
  return 0;
}

Test(paused_destroy, lanes_destroy_runs_the_queued_lanes_on_a_paused_pool) {
  enum { KEYS = 8, PER_KEY = 50 };
  tko_options o = tko_basic_options(2);
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  destroyer d = {0};
  cr_assert_eq(tko_lanes_create(&d.l, p, NULL), 0);
  lane_log g = {0};
  cr_assert_eq(tko_pool_pause(p), 0);
  for (int i = 0; i < KEYS * PER_KEY; i++)
    cr_assert_eq(tko_lanes_submit(d.l, (uint64_t)(i % KEYS), log_task, &g, 0), 0);
  cr_assert_eq(tko_submit(p, log_task, &g, 0), 0); /* a plain task stays paused */
  destroy_start(&d);
  cr_assert(destroy_returned(&d), "lanes destroy hung on a paused pool");
  cr_assert_eq(atomic_load(&d.rc), 0);
  cr_assert_eq(atomic_load(&g.ran), KEYS * PER_KEY, "every accepted lane task ran once");
  cr_assert_eq(tko_pool_wait_idle(p, 0), -ETIMEDOUT, "the pool is still paused");
  cr_assert_eq(tko_pool_resume(p), 0);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&g.ran), KEYS * PER_KEY + 1);
  tko_stats st;
  tko_pool_stats(p, &st);
  cr_assert_eq(st.submitted, st.completed + st.cancelled + st.queued + st.running);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

static int blocking_task(void *arg) {
  lane_log *g = arg;
  tt_count_add(&g->started, 1);
  tt_gate_wait(&g->gate);
  return log_task(g);
}

/* A runner running on a worker when the pool is paused and destroy begins:
 * once the table is closed it finishes its lane on its worker instead of
 * requeueing itself into the paused pool, where the destroy would wait for
 * it. */
Test(paused_destroy, lanes_destroy_on_a_paused_pool_while_a_runner_runs) {
  tko_options o = tko_basic_options(1);
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  tko_lane_options lo = tko_lane_default_options();
  lo.max_drain = 1; /* one task per visit: the runner requeues after each */
  destroyer d = {0};
  cr_assert_eq(tko_lanes_create(&d.l, p, &lo), 0);
  lane_log g = {.gate = TT_GATE_INIT};
  tt_count_init(&g.started);
  cr_assert_eq(tko_lanes_submit(d.l, 1, blocking_task, &g, 0), 0);
  cr_assert_eq(tko_lanes_submit(d.l, 1, log_task, &g, 0), 0);
  cr_assert_eq(tko_lanes_submit(d.l, 1, log_task, &g, 0), 0);
  cr_assert(tt_count_wait_geq(&g.started, 1)); /* the runner is running */
  cr_assert_eq(tko_pool_pause(p), 0);
  destroy_start(&d);
  /* The destroy finds no queued runner and waits for the running one. */
  tt_gate_open(&g.gate);
  cr_assert(destroy_returned(&d), "lanes destroy missed the runner's requeue");
  cr_assert_eq(atomic_load(&d.rc), 0);
  cr_assert_eq(atomic_load(&g.ran), 3);
  cr_assert_eq(tko_pool_resume(p), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
  tt_count_fini(&g.started);
}

typedef struct flush_count {
  atomic_long entries, value_sum;
} flush_count;

static void count_flush(void *user, const tko_coalesce_entry *e, size_t n) {
  flush_count *f = user;
  for (size_t i = 0; i < n; i++) atomic_fetch_add(&f->value_sum, (long)e[i].value);
  atomic_fetch_add(&f->entries, (long)n);
}

Test(paused_destroy, coalescer_destroy_returns_on_a_paused_pool_with_a_sweep_queued) {
  tko_options o = tko_basic_options(1);
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  cr_assert_eq(tko_pool_pause(p), 0);
  flush_count f = {0};
  destroyer d = {0};
  cr_assert_eq(tko_coalescer_create(&d.c, p, 1, count_flush, &f, NULL), 0);
  cr_assert_eq(tko_coalescer_mark(d.c, 5, 50), 0);
  /* The timer's submit has no hook to wait on; a tick skipped because a
   * sweep is already queued (the pool is paused) is the observable sign
   * that the sweep task sits in the pool. Yield, with a hang deadline. */
  uint64_t until = tt_now_ns() + (uint64_t)PD_BOUND_MS * 1000000u;
  tko_coalesce_stats st;
  for (;;) {
    tko_coalescer_stats(d.c, &st);
    if (st.skipped_ticks > 0) break;
    cr_assert_lt(tt_now_ns(), until);
    sched_yield();
  }
  destroy_start(&d);
  cr_assert(destroy_returned(&d), "coalescer destroy hung on a paused pool");
  cr_assert_eq(atomic_load(&d.rc), 0);
  cr_assert_eq(atomic_load(&f.entries), 1, "the key is flushed exactly once (the final flush)");
  cr_assert_eq(atomic_load(&f.value_sum), 50);
  cr_assert_eq(tko_pool_resume(p), 0);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  tko_stats ps;
  tko_pool_stats(p, &ps);
  cr_assert_eq(ps.submitted, ps.completed + ps.cancelled);
  cr_assert_eq(tko_pool_destroy(p), 0);
}
