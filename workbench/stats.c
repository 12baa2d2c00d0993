/* SPDX-License-Identifier: MIT */
/* Summaries of a finished run: queue-wait and run-time distributions, overall
 * and per weight class. Count, mean and max are over every task that ran.
 * Percentiles are nearest-rank over every task that ran too, up to
 * WB_PERCENTILE_SAMPLE of them in a distribution; past that, over an even
 * sample of at most that many (every k-th task, in the order of the mix,
 * so the sample spans the whole run). They are found by selection, not by
 * a sort, so summarising is linear in the tasks and capped in the sample:
 * a run stopped by Ctrl-C with millions of finished tasks prints its
 * summary promptly.
 *
 * A weight range of up to 8 values gets one class per weight; a wider one
 * is cut into classes of one width, the fewest that make at most 8, counted
 * up from the lowest weight (so only the highest class may be narrower). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "wb.h"

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

static void swap_u64(uint64_t *a, uint64_t *b) {
  uint64_t t = *a;
  *a = *b;
  *b = t;
}

/* Moves the k-th smallest of v[0..n) to v[k], the smaller ones before it
 * and the larger ones after it (Hoare's quickselect, median-of-three
 * pivots). Hoare's partition stops on values equal to the pivot, so runs of
 * equal latencies split evenly; a range that still shrinks too slowly
 * (2 log2 n rounds without converging) is sorted instead, which bounds the
 * worst case at n log n. */
static void select_kth(uint64_t *v, size_t n, size_t k) {
  size_t lo = 0, hi = n - 1; /* v[k] is in [lo, hi] */
  unsigned budget = 2;
  for (size_t m = n; m > 1; m >>= 1) budget += 2;
  while (hi > lo) {
    if (hi - lo < 16 || budget-- == 0) {
      qsort(v + lo, hi - lo + 1, sizeof *v, cmp_u64);
      return;
    }
    size_t mid = lo + (hi - lo) / 2;
    if (v[mid] < v[lo]) swap_u64(&v[mid], &v[lo]);
    if (v[hi] < v[lo]) swap_u64(&v[hi], &v[lo]);
    if (v[hi] < v[mid]) swap_u64(&v[hi], &v[mid]);
    uint64_t pivot = v[mid];
    size_t i = lo, j = hi;
    /* Every element left of i is <= pivot and right of j is >= pivot;
     * v[lo] <= pivot <= v[hi] keeps both scans inside [lo, hi]. */
    for (;;) {
      while (v[i] < pivot) i++;
      while (v[j] > pivot) j--;
      if (i >= j) break;
      swap_u64(&v[i], &v[j]);
      i++;
      j--;
    }
    /* Now v[lo..j] <= pivot <= v[j+1..hi]. */
    if (k <= j)
      hi = j;
    else
      lo = j + 1;
  }
}

/* The nearest rank of pct in n values: ceil(n * pct / 100), from 0. */
static size_t rank_index(size_t n, unsigned pct) {
  size_t k = (size_t)(((uint64_t)n * pct + 99) / 100);
  return k ? k - 1 : 0;
}

void wb_dist_describe(uint64_t *v, size_t n, wb_dist *d) {
  memset(d, 0, sizeof *d);
  if (!n) return;
  long double sum = 0;
  uint64_t max = 0;
  for (size_t i = 0; i < n; i++) {
    sum += v[i];
    if (v[i] > max) max = v[i];
  }
  d->count = n;
  d->mean = (double)(sum / n);
  d->max = max;
  /* Lowest rank first: each selection leaves the larger values after its
   * rank, so the next one looks at that suffix only (half, then a tenth of
   * the values). */
  size_t k50 = rank_index(n, 50), k90 = rank_index(n, 90), k99 = rank_index(n, 99);
  select_kth(v, n, k50);
  if (k90 > k50) select_kth(v + k50 + 1, n - k50 - 1, k90 - k50 - 1);
  if (k99 > k90) select_kth(v + k90 + 1, n - k90 - 1, k99 - k90 - 1);
  d->p50 = v[k50];
  d->p90 = v[k90];
  d->p99 = v[k99];
}

unsigned wb_weight_classes(wb_range r, wb_class out[WB_MAX_CLASSES]) {
  uint64_t span = (uint64_t)((int64_t)r.hi - r.lo) + 1;
  uint64_t width = (span + WB_MAX_CLASSES - 1) / WB_MAX_CLASSES;
  unsigned n = (unsigned)((span + width - 1) / width);
  for (unsigned c = 0; c < n; c++) {
    /* Class c holds the weights lo + c * width ... the same + width - 1. */
    int64_t first = (int64_t)r.lo + (int64_t)(c * width);
    int64_t last = first + (int64_t)width - 1;
    wb_class *k = &out[n - 1 - c]; /* highest weights first */
    memset(k, 0, sizeof *k);
    k->lo = (int)first;
    k->hi = (int)(last < r.hi ? last : r.hi);
  }
  return n;
}

/* Which class, counted up from the lowest weight, a weight is in:
 * (w - lo) / width, found with a multiplication and a correction rather
 * than a division per task (the quotient is at most 8 and the operands
 * under 2^33, so the estimate is off by at most one). */
typedef struct class_map {
  int64_t lo;
  uint64_t width;
  double inv_width;
} class_map;

static size_t class_index(const class_map *m, int32_t w) {
  uint64_t d = (uint64_t)((int64_t)w - m->lo);
  uint64_t c = (uint64_t)((double)d * m->inv_width);
  if (c * m->width > d)
    c--;
  else if ((c + 1) * m->width <= d)
    c++;
  return (size_t)c;
}

/* One distribution being gathered: exact count, sum and max, and every
 * stride-th value kept for the percentiles. The sum is 128 bits in two
 * words (50 million hour-long waits overflow 64), added in integers: a
 * long double add per value costs more than the rest of the pass. */
typedef struct gather {
  uint64_t count, max;
  uint64_t sum_lo, sum_hi;
  size_t stride, skip; /* skip counts down to the next value kept */
  uint64_t *v;
  size_t n;
} gather;

/* Sets g up for total values, keeping at most cap of them in v. */
static uint64_t *gather_init(gather *g, uint64_t total, size_t cap, uint64_t *v) {
  memset(g, 0, sizeof *g);
  g->stride = total > cap ? (size_t)((total + cap - 1) / cap) : 1;
  g->skip = 1;
  g->v = v;
  return v + (total + g->stride - 1) / g->stride;
}

static void gather_add(gather *g, uint64_t x) {
  g->count++;
  g->sum_lo += x;
  g->sum_hi += g->sum_lo < x; /* the carry */
  if (x > g->max) g->max = x;
  if (--g->skip == 0) {
    g->v[g->n++] = x;
    g->skip = g->stride;
  }
}

static void gather_finish(gather *g, wb_dist *d) {
  wb_dist_describe(g->v, g->n, d);
  if (!g->count) return;
  d->count = g->count;
  long double sum = (long double)g->sum_hi * 18446744073709551616.0L + (long double)g->sum_lo;
  d->mean = (double)(sum / g->count);
  d->max = g->max;
}

int wb_summarize_capped(wb_result *res, size_t cap) {
  size_t n = (size_t)res->cfg.tasks;
  if (cap == 0) cap = 1;
  res->nclasses = wb_weight_classes(res->cfg.weights, res->classes);
  unsigned nc = res->nclasses;
  /* classes[] lists the classes highest first; the lowest is full width. */
  class_map map = {.lo = res->cfg.weights.lo};
  map.width = (uint64_t)((int64_t)res->classes[nc - 1].hi - map.lo) + 1;
  map.inv_width = 1.0 / (double)map.width;

  /* First pass: how many tasks ran, in all and per class, which sets each
   * sample's stride. */
  uint64_t ran = 0, in_class[WB_MAX_CLASSES] = {0};
  res->ran_on_elastic = 0;
  for (size_t i = 0; i < n; i++) {
    if (res->wait_ns[i] == UINT64_MAX) continue;
    ran++;
    in_class[class_index(&map, res->tasks[i].weight)]++;
    res->ran_on_elastic += res->on_elastic[i];
  }
  uint64_t room = 2 * (ran < cap ? ran : cap);
  for (unsigned c = 0; c < nc; c++) room += in_class[c] < cap ? in_class[c] : cap;
  uint64_t *scratch = malloc((size_t)(room ? room : 1) * sizeof *scratch);
  if (!scratch) return -ENOMEM;
  gather wait, run, cls[WB_MAX_CLASSES];
  uint64_t *next = gather_init(&wait, ran, cap, scratch);
  next = gather_init(&run, ran, cap, next);
  for (unsigned c = 0; c < nc; c++) next = gather_init(&cls[c], in_class[c], cap, next);

  /* Second pass: every task that ran, into its distributions. */
  for (size_t i = 0; i < n; i++) {
    uint64_t w = res->wait_ns[i];
    if (w == UINT64_MAX) continue;
    gather_add(&wait, w);
    gather_add(&run, res->run_ns[i]);
    gather_add(&cls[class_index(&map, res->tasks[i].weight)], w);
  }
  gather_finish(&wait, &res->wait);
  gather_finish(&run, &res->run);
  for (unsigned c = 0; c < nc; c++) gather_finish(&cls[c], &res->classes[nc - 1 - c].wait);
  free(scratch);
  return 0;
}

int wb_summarize(wb_result *res) {
  return wb_summarize_capped(res, WB_PERCENTILE_SAMPLE);
}
