/* SPDX-License-Identifier: MIT */
/* Tests for argument checking and error reporting: every public function
 * with NULL or invalid arguments returns its documented negative errno and
 * has no effect; options over TKO_MAX_* and pools with no workers at all are
 * -EINVAL; allocation failures are -ENOMEM and leak nothing; tko_strerror
 * names every code; the version calls match the macros. */
#include <errno.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "taskorch.h"
#include "taskorch/coalescer.h"
#include "taskorch/lanes.h"
#include "tko_test.h"
#include "tko_test_sync.h"

static int count_fn(void *arg) {
  atomic_fetch_add((atomic_long *)arg, 1);
  return 0;
}

static int must_not_run_fn(void *arg) {
  atomic_store((atomic_int *)arg, 1);
  return 0;
}

static void expect_create_fails(const tko_options *o, int err) {
  tko_pool *p = NULL;
  cr_assert_eq(tko_pool_create(&p, o), err);
}

Test(errors, create_rejects_null_arguments) {
  tko_options o = tko_basic_options(1);
  cr_assert_eq(tko_pool_create(NULL, &o), -EINVAL);
  tko_pool *p = NULL;
  cr_assert_eq(tko_pool_create(&p, NULL), -EINVAL);
  cr_assert_eq(tko_pool_create(NULL, NULL), -EINVAL);
}

Test(errors, create_rejects_a_pool_without_workers) {
  tko_options o = tko_basic_options(1);
  o.workers = 0;
  o.max_elastic = 0;
  expect_create_fails(&o, -EINVAL);
  tko_options e = tko_elastic_options(0, 0, 100);
  expect_create_fails(&e, -EINVAL);
}

Test(errors, create_rejects_values_over_the_limits) {
  int baseline = tt_thread_count();
  tko_options o = tko_basic_options(1);
  o.workers = TKO_MAX_WORKERS + 1;
  expect_create_fails(&o, -EINVAL);
  o.workers = UINT_MAX;
  expect_create_fails(&o, -EINVAL);

  o = tko_elastic_options(1, TKO_MAX_ELASTIC + 1, 100);
  expect_create_fails(&o, -EINVAL);
  o.max_elastic = UINT_MAX;
  expect_create_fails(&o, -EINVAL);

  o = tko_elastic_options(1, 1, 100);
  o.elastic_idle_ms = TKO_MAX_IDLE_MS + 1;
  expect_create_fails(&o, -EINVAL);
  o.elastic_idle_ms = UINT_MAX;
  expect_create_fails(&o, -EINVAL);

  /* An absurd queue size is refused up front, with some negative errno,
   * rather than attempted. */
  o = tko_basic_options(1);
  o.initial_capacity = SIZE_MAX;
  tko_pool *p = NULL;
  int rc = tko_pool_create(&p, &o);
  cr_assert(rc == -EINVAL || rc == -ENOMEM, "rc %d", rc);

  /* Nothing was started by any of the refused calls. */
  cr_assert_leq(tt_wait_thread_count_leq(baseline), baseline);
}

Test(errors, values_at_the_limits_are_accepted) {
  tko_options o = tko_elastic_options(1, 1, TKO_MAX_IDLE_MS);
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

Test(errors, zero_filled_options_mean_defaults) {
  tko_options o;
  memset(&o, 0, sizeof o);
  o.workers = 1; /* everything else: the defaults noted in taskorch.h */
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  atomic_long n = 0;
  for (int i = 0; i < 300; i++) cr_assert_eq(tko_submit(p, count_fn, &n, i), 0);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&n), 300);
  cr_assert_eq(tko_pool_destroy(p), 0);

  memset(&o, 0, sizeof o);
  o.max_elastic = 1; /* elastic-only, idle timeout 0 = default */
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  cr_assert_eq(tko_submit(p, count_fn, &n, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&n), 301);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

Test(errors, options_constructors) {
  tko_options o = tko_basic_options(3);
  cr_assert_eq(o.workers, 3);
  cr_assert_eq(o.max_elastic, 0);
  o = tko_elastic_options(2, 5, 250);
  cr_assert_eq(o.workers, 2);
  cr_assert_eq(o.max_elastic, 5);
  cr_assert_eq(o.elastic_idle_ms, 250);
  o = tko_elastic_options(0, 4, 0);
  cr_assert_eq(o.workers, 0, "elastic-only is allowed");
  cr_assert_eq(o.max_elastic, 4);
}

Test(errors, submit_rejects_null_arguments_and_runs_nothing) {
  tko_options o = tko_basic_options(1);
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  atomic_int ran = 0;
  cr_assert_eq(tko_submit(NULL, must_not_run_fn, &ran, 0), -EINVAL);
  cr_assert_eq(tko_submit(p, NULL, &ran, 0), -EINVAL);
  cr_assert_eq(tko_submit(NULL, NULL, NULL, 0), -EINVAL);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  tko_stats s;
  tko_pool_stats(p, &s);
  cr_assert_eq(s.submitted, 0, "failed submits are not counted");
  cr_assert_eq(tko_pool_destroy(p), 0);
  cr_assert_eq(atomic_load(&ran), 0);
}

Test(errors, wait_shutdown_destroy_reject_bad_arguments) {
  cr_assert_eq(tko_pool_wait_idle(NULL, -1), -EINVAL);
  cr_assert_eq(tko_pool_wait_idle(NULL, 0), -EINVAL);
  cr_assert_eq(tko_pool_shutdown(NULL, TKO_DRAIN), -EINVAL);
  cr_assert_eq(tko_pool_shutdown(NULL, TKO_CANCEL), -EINVAL);
  cr_assert_eq(tko_pool_destroy(NULL), -EINVAL);

  tko_options o = tko_basic_options(1);
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  /* -1 is "no limit"; anything below is meaningless. */
  cr_assert_eq(tko_pool_wait_idle(p, -2), -EINVAL);
  cr_assert_eq(tko_pool_wait_idle(p, LONG_MIN), -EINVAL);
  cr_assert_eq(tko_pool_shutdown(p, (tko_shutdown_mode)3), -EINVAL);
  cr_assert_eq(tko_pool_shutdown(p, (tko_shutdown_mode)-1), -EINVAL);
  /* The refused shutdowns did nothing: the pool still accepts work. */
  atomic_long n = 0;
  cr_assert_eq(tko_submit(p, count_fn, &n, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&n), 1);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

Test(errors, stats_with_null_does_nothing) {
  tko_stats s;
  memset(&s, 0xab, sizeof s);
  tko_stats before = s;
  tko_pool_stats(NULL, &s);
  cr_assert_eq(memcmp(&s, &before, sizeof s), 0, "stats(NULL, out) wrote to out");
  tko_options o = tko_basic_options(1);
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  tko_pool_stats(p, NULL); /* must not crash */
  tko_pool_stats(NULL, NULL);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* ---- allocation failures ------------------------------------------------- */

/* An allocator that fails every call once `budget` successful calls have
 * been made (budget < 0: never fails), and counts live blocks. */
typedef struct failing_alloc {
  atomic_long budget;
  atomic_long live;
  atomic_long calls;
} failing_alloc;

static int fa_take(failing_alloc *f) {
  atomic_fetch_add(&f->calls, 1);
  long b = atomic_load(&f->budget);
  for (;;) {
    if (b < 0) return 1;
    if (b == 0) return 0;
    if (atomic_compare_exchange_weak(&f->budget, &b, b - 1)) return 1;
  }
}

static void *fa_alloc(void *ctx, size_t size) {
  failing_alloc *f = ctx;
  if (!fa_take(f)) return NULL;
  void *p = malloc(size);
  if (p) atomic_fetch_add(&f->live, 1);
  return p;
}

static void noop_flush(void *user, const tko_coalesce_entry *e, size_t n) {
  (void)user;
  (void)e;
  (void)n;
}

static void *fa_realloc(void *ctx, void *ptr, size_t size) {
  failing_alloc *f = ctx;
  if (!fa_take(f)) return NULL;
  void *p = realloc(ptr, size);
  if (p && !ptr) atomic_fetch_add(&f->live, 1);
  return p;
}

static void fa_free(void *ctx, void *ptr) {
  failing_alloc *f = ctx;
  if (!ptr) return;
  atomic_fetch_sub(&f->live, 1);
  free(ptr);
}

/* Host memory must never reach the C library's realloc or free (or the
 * reverse): an allocator with some functions set and others NULL is
 * refused by everything that takes one. */
Test(errors, an_allocator_with_some_functions_missing_is_einval) {
  failing_alloc f = {0};
  atomic_store(&f.budget, -1);
  const tko_allocator partial[] = {{fa_alloc, NULL, fa_free, &f},
                                   {fa_alloc, fa_realloc, NULL, &f},
                                   {NULL, fa_realloc, fa_free, &f},
                                   {NULL, NULL, fa_free, &f}};
  tko_options o = tko_basic_options(1);
  tko_pool *p = NULL;
  for (size_t i = 0; i < sizeof partial / sizeof partial[0]; i++) {
    o.allocator = &partial[i];
    cr_assert_eq(tko_pool_create(&p, &o), -EINVAL, "partial allocator %zu", i);
    cr_assert_null(p);
  }
  const tko_allocator none = {NULL, NULL, NULL, NULL}, all = {fa_alloc, fa_realloc, fa_free, &f};
  o.allocator = &none;
  cr_assert_eq(tko_pool_create(&p, &o), 0, "no functions: the C library's");
  tko_lane_options lo = tko_lane_default_options();
  tko_coalesce_options co;
  memset(&co, 0, sizeof co);
  tko_lanes *l = NULL;
  tko_coalescer *c = NULL;
  for (size_t i = 0; i < sizeof partial / sizeof partial[0]; i++) {
    lo.allocator = co.allocator = &partial[i];
    cr_assert_eq(tko_lanes_create(&l, p, &lo), -EINVAL, "lanes, partial allocator %zu", i);
    cr_assert_eq(tko_coalescer_create(&c, p, 10, noop_flush, NULL, &co), -EINVAL,
                 "coalescer, partial allocator %zu", i);
  }
  lo.allocator = co.allocator = &all;
  cr_assert_eq(tko_lanes_create(&l, p, &lo), 0);
  cr_assert_eq(tko_coalescer_create(&c, p, 10, noop_flush, NULL, &co), 0);
  cr_assert_eq(tko_coalescer_destroy(c), 0);
  cr_assert_eq(tko_lanes_destroy(l), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
  cr_assert_eq(atomic_load(&f.live), 0, "lanes and coalescer gave back what they took");
}

Test(errors, create_reports_enomem_at_every_allocation_and_leaks_nothing) {
  int baseline = tt_thread_count();
  failing_alloc f = {0};
  tko_allocator al = {fa_alloc, fa_realloc, fa_free, &f};
  tko_options o = tko_elastic_options(2, 2, 100);
  o.allocator = &al;
  int created = 0;
  for (long budget = 0; budget < 100 && !created; budget++) {
    atomic_store(&f.budget, budget);
    tko_pool *p = NULL;
    int rc = tko_pool_create(&p, &o);
    if (rc == 0) {
      created = 1;
      atomic_store(&f.budget, -1);
      atomic_long n = 0;
      cr_assert_eq(tko_submit(p, count_fn, &n, 0), 0);
      cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
      cr_assert_eq(atomic_load(&n), 1);
      cr_assert_eq(tko_pool_destroy(p), 0);
    } else {
      cr_assert_eq(rc, -ENOMEM, "budget %ld: rc %d", budget, rc);
    }
    cr_assert_eq(atomic_load(&f.live), 0, "budget %ld: blocks leaked", budget);
  }
  cr_assert(created, "create never succeeded with up to 100 allocations");
  cr_assert_leq(tt_wait_thread_count_leq(baseline), baseline);
}

typedef struct gate_task {
  tt_gate gate;
  tt_count started;
} gate_task;

static int gate_fn(void *arg) {
  gate_task *g = arg;
  tt_count_add(&g->started, 1);
  tt_gate_wait(&g->gate);
  return 0;
}

Test(errors, submit_reports_enomem_when_the_queue_cannot_grow) {
  failing_alloc f = {0};
  atomic_store(&f.budget, -1);
  tko_allocator al = {fa_alloc, fa_realloc, fa_free, &f};
  tko_options o = tko_basic_options(1);
  o.initial_capacity = 16;
  o.allocator = &al;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  gate_task g = {TT_GATE_INIT, TT_COUNT_INIT};
  cr_assert_eq(tko_submit(p, gate_fn, &g, 0), 0);
  cr_assert(tt_count_wait_geq(&g.started, 1));
  /* From now on the allocator refuses: the queue fills its slots, then
   * submit must fail cleanly. */
  atomic_store(&f.budget, 0);
  atomic_long n = 0;
  long accepted = 0;
  int rc = 0;
  for (int i = 0; i < 10000 && rc == 0; i++) {
    rc = tko_submit(p, count_fn, &n, i % 3);
    if (rc == 0) accepted++;
  }
  cr_assert_eq(rc, -ENOMEM);
  cr_assert_geq(accepted, 1);
  atomic_int ran = 0;
  cr_assert_eq(tko_submit(p, must_not_run_fn, &ran, 1000), -ENOMEM, "still full");
  tko_stats s;
  tko_pool_stats(p, &s);
  cr_assert_eq(s.submitted, (uint64_t)accepted + 1, "failed submits are not counted");
  /* The allocator recovers: the queue grows and work continues. */
  atomic_store(&f.budget, -1);
  for (int i = 0; i < 100; i++) cr_assert_eq(tko_submit(p, count_fn, &n, 0), 0);
  tt_gate_open(&g.gate);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&n), accepted + 100);
  cr_assert_eq(atomic_load(&ran), 0, "a task whose submit failed ran");
  tko_pool_stats(p, &s);
  cr_assert_eq(s.submitted, (uint64_t)accepted + 101);
  cr_assert_eq(s.completed, s.submitted);
  cr_assert_eq(tko_pool_destroy(p), 0);
  cr_assert_eq(atomic_load(&f.live), 0);
}

/* ---- tko_strerror and version -------------------------------------------- */

/* Every code the library returns or reports (grep src/ for "-E"): a new
 * code gets its message in src/engine/error.c and its line here. */
Test(errors, strerror_names_every_code_distinctly) {
  const int codes[] = {0,          -EINVAL,    -ENOMEM, -EAGAIN,  -ETIMEDOUT, -ESHUTDOWN, -EDEADLK,
                       -ECANCELED, -EBUSY,     -ENOENT, -EPERM,   -EALREADY,  -ECHILD,
                       -EMFILE,    -ENFILE,    -ENOTSUP, -EINPROGRESS};
  const size_t n = sizeof codes / sizeof codes[0];
  const char *msg[sizeof codes / sizeof codes[0]];
  for (size_t i = 0; i < n; i++) {
    msg[i] = tko_strerror(codes[i]);
    cr_assert_not_null(msg[i], "code %d", codes[i]);
    cr_assert_gt(strlen(msg[i]), 0, "code %d", codes[i]);
    cr_assert_eq(msg[i], tko_strerror(codes[i]), "static strings");
  }
  for (size_t i = 0; i < n; i++)
    for (size_t j = i + 1; j < n; j++)
      cr_assert_neq(strcmp(msg[i], msg[j]), 0, "codes %d and %d share a message", codes[i], codes[j]);
  const char *unknown = tko_strerror(-123456);
  cr_assert_not_null(unknown);
  cr_assert_gt(strlen(unknown), 0);
  for (size_t i = 0; i < n; i++) cr_assert_neq(strcmp(unknown, msg[i]), 0, "unknown reads as a known code");
  const int odd[] = {INT_MIN, INT_MAX, 1, EINVAL, -4095};
  for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) {
    const char *m = tko_strerror(odd[i]);
    cr_assert_not_null(m);
    cr_assert_gt(strlen(m), 0);
  }
}

Test(errors, version_matches_the_macros) {
  char want[32];
  snprintf(want, sizeof want, "%d.%d.%d", TKO_VERSION_MAJOR, TKO_VERSION_MINOR, TKO_VERSION_PATCH);
  cr_assert_str_eq(TKO_VERSION_STRING, want);
  cr_assert_not_null(tko_version_string());
  cr_assert_str_eq(tko_version_string(), TKO_VERSION_STRING);
  cr_assert_eq(tko_version_number(), (unsigned)TKO_VERSION_NUMBER);
  cr_assert_eq(TKO_VERSION_NUMBER,
               TKO_VERSION_MAJOR * 10000 + TKO_VERSION_MINOR * 100 + TKO_VERSION_PATCH);
}
