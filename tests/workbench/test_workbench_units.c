/* SPDX-License-Identifier: MIT */
/* White-box tests of the workbench's pure parts, fed known inputs: the
 * progress line's rate and layout, the weight classes, the timeline's
 * period, the escaping of echoed values, and the summary's percentiles. Built with the stand-in runner of tko_test.h
 * (no Criterion needed) against the workbench's own object files. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tko_test.h"
#include "wb.h"

#define MS 1000000u

/* A known run: 1,000 tasks every 100 ms draw, so 10,000 tasks/s at every
 * draw after the first, before and after the history ring wraps (the ring
 * once read its oldest slot after overwriting it: a rate of 0 from the
 * second onwards). */
Test(workbench, rate_steady) {
  wb_rate r;
  memset(&r, 0, sizeof r);
  cr_assert_eq(wb_rate_push(&r, 0, 0), 0.0);
  for (uint64_t k = 1; k <= 5 * WB_RATE_HISTORY; k++) {
    double rate = wb_rate_push(&r, k * 100 * MS, k * 1000);
    cr_assert(rate > 9999.0 && rate < 10001.0, "draw %llu: rate %f", (unsigned long long)k, rate);
  }
}

/* The rate covers the last second only: after a stall the rate falls to 0
 * within WB_RATE_HISTORY draws, and recovers as completions resume. */
Test(workbench, rate_window) {
  wb_rate r;
  memset(&r, 0, sizeof r);
  uint64_t t = 0, done = 0;
  for (int k = 0; k < 30; k++) wb_rate_push(&r, t += 100 * MS, done += 500);
  double rate = 0;
  for (int k = 0; k < WB_RATE_HISTORY; k++) rate = wb_rate_push(&r, t += 100 * MS, done);
  cr_assert_eq(rate, 0.0);
  rate = wb_rate_push(&r, t += 100 * MS, done += 200);
  cr_assert(rate > 199.0 && rate < 201.0, "rate %f", rate); /* 200 over the last second */
}

static void check_classes(int lo, int hi, unsigned want_n, int want_width) {
  wb_class k[WB_MAX_CLASSES];
  unsigned n = wb_weight_classes((wb_range){lo, hi}, k);
  cr_assert_eq(n, want_n, "%d:%d: %u classes", lo, hi, n);
  cr_assert_eq(k[0].hi, hi);
  cr_assert_eq(k[n - 1].lo, lo);
  for (unsigned i = 0; i < n; i++) {
    cr_assert_leq(k[i].lo, k[i].hi);
    if (i + 1 < n) cr_assert_eq(k[i].lo, k[i + 1].hi + 1, "%d:%d: gap at %u", lo, hi, i);
    /* One width for every class; only the highest may be narrower. */
    if (i > 0) cr_assert_eq(k[i].hi - k[i].lo + 1, want_width, "%d:%d: class %u", lo, hi, i);
    else cr_assert_leq(k[i].hi - k[i].lo + 1, want_width);
  }
}

/* -5:5 once gave {5}, {4}, {2..3}, {1}, {0}, {-2..-1}, ...: classes of
 * uneven widths in no order. */
Test(workbench, weight_classes_even) {
  check_classes(-5, 5, 6, 2);
  wb_class k[WB_MAX_CLASSES];
  wb_weight_classes((wb_range){-5, 5}, k);
  cr_assert(k[0].lo == 5 && k[0].hi == 5);
  cr_assert(k[1].lo == 3 && k[1].hi == 4);
  cr_assert(k[5].lo == -5 && k[5].hi == -4);
  check_classes(0, 7, 8, 1);
  check_classes(3, 3, 1, 1);
  check_classes(0, 8, 5, 2);
  check_classes(-1000, 1000, 8, 251);
  check_classes(INT32_MIN, INT32_MAX, 8, 536870912);
}

static wb_sample at_ms(uint64_t ms) {
  return (wb_sample){.t_ns = ms * MS, .completed = ms};
}

/* The period scales with the run: 1 ms at first, doubled each time the
 * buffer fills, so any run keeps between half and all of it. */
Test(workbench, timeline_period_scales) {
  wb_timeline tl;
  cr_assert_eq(wb_timeline_alloc(&tl, WB_TIMELINE_CAP), 0);
  for (uint64_t ms = 0; ms < 50; ms++) {
    wb_sample x = at_ms(ms);
    cr_assert(wb_timeline_add(&tl, &x, false));
  }
  cr_assert_eq(tl.n, 50u); /* a 50 ms run: a sample a millisecond */
  cr_assert_eq(tl.period_ns, (uint64_t)MS);
  /* Offered every 0.25 ms for 10 s: the sampler's ticks are never closer. */
  for (uint64_t us = 50000; us < 10000000; us += 250) {
    wb_sample x = {.t_ns = us * 1000u, .completed = us};
    wb_timeline_add(&tl, &x, false);
  }
  cr_assert_eq(tl.period_ns, 8 * (uint64_t)MS); /* 2048 x 4 ms < 10 s <= 2048 x 8 ms */
  cr_assert(tl.n >= WB_TIMELINE_CAP / 2 && tl.n <= WB_TIMELINE_CAP);
  for (size_t i = 1; i < tl.n; i++) cr_assert_gt(tl.s[i].t_ns, tl.s[i - 1].t_ns);
  /* The last sample is kept 1 us after the one before, not sooner. */
  wb_sample last = tl.s[tl.n - 1];
  size_t n = tl.n;
  last.t_ns += 999;
  cr_assert_not(wb_timeline_add(&tl, &last, true));
  last.t_ns += 1;
  cr_assert(wb_timeline_add(&tl, &last, true));
  cr_assert_eq(tl.n, n + 1);
  wb_timeline_free(&tl);
}

Test(workbench, quote) {
  char buf[WB_QUOTE_MAX];
  cr_assert_str_eq(wb_quote(buf, sizeof buf, "plain -x 1:2"), "plain -x 1:2");
  cr_assert_str_eq(wb_quote(buf, sizeof buf, "a\nb\tc\\d'e\033\x7f"), "a\\nb\\tc\\\\d\\'e\\x1b\\x7f");
  cr_assert_str_eq(wb_quote(buf, sizeof buf, "caf\xc3\xa9"), "caf\xc3\xa9");
  char small[8];
  cr_assert_str_eq(wb_quote(small, sizeof small, "abc"), "abc");
  cr_assert_str_eq(wb_quote(small, sizeof small, "abcdefgh"), "abcd...");
  cr_assert_str_eq(wb_quote(small, sizeof small, "a\n\n\n"), "a\\n...");
  char tiny[2];
  cr_assert_str_eq(wb_quote(tiny, sizeof tiny, "abc"), "");
}

static size_t visible(const char *s) {
  return strlen(s); /* the formatter writes no escapes: every byte is a column */
}

/* The line fits cols - 1 columns whatever the figures, and at 80 columns
 * keeps its bar even with the widest figures a run can show (a line whose
 * text took the bar's room once drew no bar after its first redraw). */
Test(workbench, progress_fits) {
  const wb_progress_view views[] = {
      {0, 2000, 0, 0, 2, 0, 0},
      {123456, 10000000, 9876543, 6, 2, 4, 1234567.0},
      {WB_MAX_TASKS, WB_MAX_TASKS, WB_MAX_TASKS, 2047, TKO_MAX_WORKERS, TKO_MAX_ELASTIC, 123456789.0},
      {1, WB_MAX_TASKS, WB_MAX_TASKS - 1, 2047, TKO_MAX_WORKERS, TKO_MAX_ELASTIC, 0.001},
  };
  char buf[512];
  for (size_t i = 0; i < sizeof views / sizeof views[0]; i++) {
    for (unsigned cols = 0; cols <= 200; cols++) {
      size_t n = wb_progress_format(buf, sizeof buf, cols, &views[i]);
      cr_assert_eq(n, visible(buf));
      cr_assert_leq(n, cols ? cols - 1 : 0, "view %zu, %u columns: %zu: '%s'", i, cols, n, buf);
      if (cols >= 80) cr_assert_eq(buf[0], '[', "view %zu, %u columns: no bar: '%s'", i, cols, buf);
      if (cols >= 6) cr_assert(strchr(buf, '%'), "view %zu, %u columns: no percentage", i, cols);
    }
    /* Wide terminals get the whole line; the bar stops at 30. */
    wb_progress_format(buf, sizeof buf, 200, &views[i]);
    cr_assert(strstr(buf, "busy ") && strstr(buf, "ETA "), "'%s'", buf);
    cr_assert_eq(strspn(buf + 1, "#."), 30u, "'%s'", buf);
  }
  /* A small buffer cuts nothing in the middle of a character. */
  char small[8];
  size_t n = wb_progress_format(small, sizeof small, 80, &views[1]);
  cr_assert_eq(n, strlen(small));
  cr_assert_leq(n, sizeof small - 1);
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

/* Selection gives the same nearest-rank percentiles as a sort, with runs
 * of equal values and in sorted and reversed input too. */
Test(workbench, dist_matches_sort) {
  static uint64_t v[20011], ref[20011];
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (int shape = 0; shape < 5; shape++) {
    for (size_t n = 1; n <= 20011; n = n * 3 + 1) {
      for (size_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        v[i] = shape == 0 ? x : shape == 1 ? x % 3 : shape == 2 ? i : shape == 3 ? n - i : 7;
      }
      memcpy(ref, v, n * sizeof *v);
      qsort(ref, n, sizeof *ref, cmp_u64);
      wb_dist d;
      wb_dist_describe(v, n, &d);
      size_t k50 = (n * 50 + 99) / 100 - 1, k90 = (n * 90 + 99) / 100 - 1,
             k99 = (n * 99 + 99) / 100 - 1;
      cr_assert_eq(d.count, n);
      cr_assert_eq(d.p50, ref[k50], "shape %d n %zu", shape, n);
      cr_assert_eq(d.p90, ref[k90], "shape %d n %zu", shape, n);
      cr_assert_eq(d.p99, ref[k99], "shape %d n %zu", shape, n);
      cr_assert_eq(d.max, ref[n - 1]);
    }
  }
}

/* Past the cap, the percentiles come from an even sample and count, mean
 * and max stay exact; under it, every value counts. */
Test(workbench, summary_sample) {
  enum { N = 100000 };
  static wb_scenario sc = {.name = "unit"};
  wb_result r;
  memset(&r, 0, sizeof r);
  r.cfg.scenario = &sc;
  r.cfg.tasks = N;
  r.cfg.weights = (wb_range){0, 1};
  r.tasks = calloc(N, sizeof *r.tasks);
  r.wait_ns = malloc(N * sizeof *r.wait_ns);
  r.run_ns = calloc(N, sizeof *r.run_ns);
  r.on_elastic = calloc(N, 1);
  cr_assert(r.tasks && r.wait_ns && r.run_ns && r.on_elastic);
  /* Task i waited i ns, weight i % 2; every tenth never ran. */
  for (size_t i = 0; i < N; i++) {
    r.tasks[i].weight = (int32_t)(i % 2);
    r.wait_ns[i] = i % 10 == 9 ? UINT64_MAX : i;
  }
  for (int capped = 0; capped < 2; capped++) {
    cr_assert_eq(wb_summarize_capped(&r, capped ? 1000 : N), 0);
    cr_assert_eq(r.wait.count, N / 10 * 9);
    cr_assert_eq(r.wait.max, N - 2);
    double mean = 0;
    for (size_t i = 0; i < N; i++) mean += i % 10 == 9 ? 0 : (double)i;
    mean /= N / 10 * 9;
    cr_assert(r.wait.mean > mean - 0.01 && r.wait.mean < mean + 0.01, "%f", r.wait.mean);
    /* Without the cap, the nearest ranks of the waits that ran: the k-th
     * smallest is the k-th i with i % 10 != 9. With it, within 1%. */
    size_t k50 = (size_t)(N / 10 * 9) / 2 - 1, k99 = (size_t)(N / 10 * 9) * 99 / 100 - 1;
    uint64_t want50 = k50 / 9 * 10 + k50 % 9, want99 = k99 / 9 * 10 + k99 % 9;
    double err = capped ? N * 0.01 : 0.5;
    cr_assert(fabs((double)r.wait.p50 - (double)want50) < err, "p50 %llu, want %llu",
              (unsigned long long)r.wait.p50, (unsigned long long)want50);
    cr_assert(fabs((double)r.wait.p99 - (double)want99) < err, "p99 %llu, want %llu",
              (unsigned long long)r.wait.p99, (unsigned long long)want99);
    cr_assert_eq(r.nclasses, 2u);
    cr_assert_eq(r.classes[0].wait.count + r.classes[1].wait.count, N / 10 * 9);
    cr_assert_eq(r.classes[0].lo, 1); /* odd waits, highest first */
    cr_assert_eq(r.classes[0].wait.max % 2, 1u);
    cr_assert_eq(r.classes[1].wait.max % 2, 0u);
  }
  free(r.tasks);
  free(r.wait_ns);
  free(r.run_ns);
  free(r.on_elastic);
}
