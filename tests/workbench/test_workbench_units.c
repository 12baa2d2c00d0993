/* SPDX-License-Identifier: MIT */
/* White-box tests of the workbench's pure parts, fed known inputs: the
 * progress line's rate, the weight classes, the timeline's period, and the
 * escaping of echoed values. Built with the stand-in runner of tko_test.h
 * (no Criterion needed) against the workbench's own object files. */
#include <stdint.h>
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
