/* SPDX-License-Identifier: MIT */
/* The limits on options and arguments, at their edges: the limit itself is
 * accepted and works, one past it is -EINVAL with nothing created (out stays
 * NULL, no callback runs), and a zero field means its documented default.
 * An off-by-one in a bound check, or a check dropped, fails here. */
#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "taskorch.h"
#include "taskorch/coalescer.h"
#include "taskorch/lanes.h"
#include "tko_test.h"
#include "tko_test_fault.h"
#include "tko_test_sync.h"

/* Creates a pool from o, runs one task on it and destroys it. */
static void pool_works(tko_options o, const char *what) {
  tko_pool *p = NULL;
  cr_assert_eq(tko_pool_create(&p, &o), 0, "%s: the limit itself is refused", what);
  tft_token t = {0};
  cr_assert_eq(tko_submit(p, tft_run, &t, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&t.runs), 1, "%s", what);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

static void pool_refused(tko_options o, const char *what) {
  tko_pool *p = (tko_pool *)&o; /* not NULL: create must clear it */
  cr_assert_eq(tko_pool_create(&p, &o), -EINVAL, "%s: one past the limit is accepted", what);
  cr_assert_null(p, "%s", what);
}

Test(bounds, pool_options_take_each_limit_and_refuse_one_past_it) {
  tko_options o = tko_basic_options(1);
  o.spin_yields = 1000000u;
  pool_works(o, "spin_yields");
  o.spin_yields++;
  pool_refused(o, "spin_yields");

  o = tko_basic_options(1);
  o.max_batch = 64; /* the header's 1..64 */
  pool_works(o, "max_batch");
  o.max_batch++;
  pool_refused(o, "max_batch");

  o = tko_basic_options(1);
  o.aging_ms = TKO_MAX_IDLE_MS;
  pool_works(o, "aging_ms");
  o.aging_ms++;
  pool_refused(o, "aging_ms");

  o = tko_elastic_options(1, 1, TKO_MAX_IDLE_MS);
  pool_works(o, "elastic_idle_ms");
  o.elastic_idle_ms++;
  pool_refused(o, "elastic_idle_ms");

  /* A bound, not an allocation: the limit itself costs nothing up front. */
  o = tko_basic_options(1);
  o.queue_capacity = (size_t)1 << 31;
  pool_works(o, "queue_capacity");
  o.queue_capacity++;
  pool_refused(o, "queue_capacity");

  o = tko_basic_options(1);
  o.initial_capacity = ((size_t)1 << 30) + 1;
  pool_refused(o, "initial_capacity");
  o = tko_basic_options(1);
  o.full_policy = (tko_full_policy)(TKO_FULL_CALLER_RUNS + 1);
  pool_refused(o, "full_policy");
  o = tko_basic_options(1);
  o.workers = TKO_MAX_WORKERS + 1;
  pool_refused(o, "workers");
  o = tko_elastic_options(1, TKO_MAX_ELASTIC + 1, 10);
  pool_refused(o, "max_elastic");
}

static int count_fn(void *arg) {
  atomic_fetch_add((atomic_int *)arg, 1);
  return 0;
}

static void lanes_refused(tko_pool *p, tko_lane_options o, const char *what) {
  tko_lanes *l = (tko_lanes *)&o;
  cr_assert_eq(tko_lanes_create(&l, p, &o), -EINVAL, "%s: one past the limit is accepted", what);
  cr_assert_null(l, "%s", what);
}

Test(bounds, lane_options_take_each_limit_and_refuse_one_past_it) {
  tko_options po = tko_basic_options(1);
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &po), 0);

  tko_lane_options o = tko_lane_default_options();
  o.lane_capacity = TKO_MAX_LANE_CAPACITY; /* allocated at a lane's first use only */
  o.max_drain = TKO_MAX_LANE_DRAIN;
  o.lanes = 1;
  tko_lanes *l;
  cr_assert_eq(tko_lanes_create(&l, p, &o), 0);
  cr_assert_eq(tko_lanes_destroy(l), 0);
  o.lane_capacity++;
  lanes_refused(p, o, "lane_capacity");
  o = tko_lane_default_options();
  o.max_drain = TKO_MAX_LANE_DRAIN + 1;
  lanes_refused(p, o, "max_drain");
  o = tko_lane_default_options();
  o.lanes = TKO_MAX_LANES + 1;
  lanes_refused(p, o, "lanes");

  /* Zero fields are the defaults: 256 lanes (so indexes spread over all
   * of 0..255), and working rings and drains. */
  memset(&o, 0, sizeof o);
  cr_assert_eq(tko_lanes_create(&l, p, &o), 0);
  unsigned top = 0;
  for (uint64_t k = 0; k < 4096; k++) {
    unsigned i = tko_lanes_index(l, k);
    cr_assert_lt(i, 256u);
    if (i > top) top = i;
  }
  cr_assert_eq(top, 255u, "zero lanes is not the default of 256");
  atomic_int ran = 0;
  for (int i = 0; i < 100; i++) cr_assert_eq(tko_lanes_submit(l, 7, count_fn, &ran, 0), 0);
  cr_assert_eq(tko_lanes_wait_idle(l, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&ran), 100);
  cr_assert_eq(tko_lanes_destroy(l), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

static void never_flush(void *user, const tko_coalesce_entry *e, size_t n) {
  (void)e;
  (void)n;
  atomic_fetch_add((atomic_int *)user, 1);
}

Test(bounds, coalescer_options_take_each_limit_and_refuse_one_past_it) {
  tko_options po = tko_basic_options(1);
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &po), 0);
  atomic_int flushes = 0;
  tko_coalesce_options o;
  memset(&o, 0, sizeof o);
  o.initial_keys = TKO_MAX_COALESCE_KEYS + 1;
  tko_coalescer *c = (tko_coalescer *)&o;
  cr_assert_eq(tko_coalescer_create(&c, p, 0, never_flush, &flushes, &o), -EINVAL);
  cr_assert_null(c);
  cr_assert_eq(tko_coalescer_create(&c, p, TKO_MAX_COALESCE_INTERVAL_MS + 1, never_flush, &flushes,
                                    NULL),
               -EINVAL);
  cr_assert_null(c);
  /* The longest interval is accepted; its first tick is an hour away. */
  cr_assert_eq(tko_coalescer_create(&c, p, TKO_MAX_COALESCE_INTERVAL_MS, never_flush, &flushes,
                                    NULL),
               0);
  cr_assert_eq(tko_coalescer_destroy(c), 0);
  cr_assert_eq(atomic_load(&flushes), 0, "nothing was marked: nothing to flush");
  cr_assert_eq(tko_pool_destroy(p), 0);
}

Test(bounds, timers_take_the_longest_delay_and_period_and_refuse_one_past_it) {
  tko_options po = tko_basic_options(1);
  po.hooks.on_cancel = tft_on_cancel;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &po), 0);
  tft_token t[4];
  memset(t, 0, sizeof t);
  tko_timer a, b;
  tko_timer_init(&a);
  tko_timer_init(&b);
  cr_assert_eq(tko_submit_after(p, &a, (long)(TKO_MAX_TIMER_MS + 1), tft_run, &t[0], 0), -EINVAL);
  cr_assert_eq(tko_submit_every(p, &a, (long)(TKO_MAX_TIMER_MS + 1), tft_run, &t[0], 0), -EINVAL);
  cr_assert_eq(tko_submit_after(p, NULL, 1, tft_run, &t[0], 0), -EINVAL);
  cr_assert_eq(tko_submit_after(p, &a, 1, NULL, &t[0], 0), -EINVAL);
  cr_assert_eq(tko_submit_after(NULL, &a, 1, tft_run, &t[0], 0), -EINVAL);
  cr_assert_eq(tko_timer_cancel(&a), -ENOENT, "a refused timer is not armed");
  /* The limits themselves: armed, far away, and cancelled by shutdown. */
  cr_assert_eq(tko_submit_after(p, &a, (long)TKO_MAX_TIMER_MS, tft_run, &t[1], 0), 0);
  t[1].accepted = true;
  cr_assert_eq(tko_submit_every(p, &b, (long)TKO_MAX_TIMER_MS, tft_run, &t[2], 0), 0);
  t[2].accepted = true;
  cr_assert_eq(tko_pool_shutdown(p, TKO_DRAIN), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
  cr_assert_eq(tft_first_bad(t, 4), -1);
  cr_assert_eq(atomic_load(&t[1].cancels) + atomic_load(&t[2].cancels), 2, "they never ran");
}

Test(bounds, group_wait_refuses_a_timeout_below_minus_one) {
  tko_group g;
  cr_assert_eq(tko_group_init(&g), 0);
  cr_assert_eq(tko_group_wait(&g, -2), -EINVAL);
  cr_assert_eq(tko_group_wait(NULL, 0), -EINVAL);
  cr_assert_eq(tko_group_wait(&g, -1), 0, "an empty group is done");
  cr_assert_eq(tko_group_destroy(&g), 0);
}

Test(bounds, keyed_submit_refuses_a_null_pool_or_fn) {
  tko_options po = tko_basic_options(1);
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &po), 0);
  tft_token t = {0};
  cr_assert_eq(tko_submit_keyed(NULL, 1, tft_run, &t, 0), -EINVAL);
  cr_assert_eq(tko_submit_keyed(p, 1, NULL, &t, 0), -EINVAL);
  cr_assert_eq(tko_pool_destroy(p), 0);
  cr_assert_eq(atomic_load(&t.runs), 0);
}
