/* SPDX-License-Identifier: MIT */
/* Summaries of a finished run: queue-wait and run-time distributions, overall
 * and per weight class. Percentiles are nearest-rank over every task that
 * ran (no sampling, no histogram error). A weight range of up to 8 values
 * gets one class per weight; a wider one is cut into classes of one width,
 * the fewest that make at most 8, counted up from the lowest weight (so only
 * the highest class may be narrower). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "wb.h"

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

static uint64_t rank(const uint64_t *v, size_t n, unsigned pct) {
  size_t k = (size_t)(((uint64_t)n * pct + 99) / 100); /* ceil(n * pct / 100) */
  return v[k ? k - 1 : 0];
}

/* Sorts v in place and describes it. */
static void describe(uint64_t *v, size_t n, wb_dist *d) {
  memset(d, 0, sizeof *d);
  if (!n) return;
  qsort(v, n, sizeof *v, cmp_u64);
  long double sum = 0;
  for (size_t i = 0; i < n; i++) sum += v[i];
  d->count = n;
  d->mean = (double)(sum / n);
  d->p50 = rank(v, n, 50);
  d->p90 = rank(v, n, 90);
  d->p99 = rank(v, n, 99);
  d->max = v[n - 1];
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

int wb_summarize(wb_result *res) {
  size_t n = (size_t)res->cfg.tasks;
  uint64_t *scratch = malloc((n ? n : 1) * sizeof *scratch);
  if (!scratch) return -ENOMEM;

  size_t m = 0;
  res->ran_on_elastic = 0;
  for (size_t i = 0; i < n; i++) {
    if (res->wait_ns[i] == UINT64_MAX) continue;
    scratch[m++] = res->wait_ns[i];
    res->ran_on_elastic += res->on_elastic[i];
  }
  describe(scratch, m, &res->wait);
  m = 0;
  for (size_t i = 0; i < n; i++)
    if (res->wait_ns[i] != UINT64_MAX) scratch[m++] = res->run_ns[i];
  describe(scratch, m, &res->run);

  res->nclasses = wb_weight_classes(res->cfg.weights, res->classes);
  for (unsigned c = 0; c < res->nclasses; c++) {
    wb_class *k = &res->classes[c];
    m = 0;
    for (size_t i = 0; i < n; i++) {
      if (res->wait_ns[i] == UINT64_MAX) continue;
      int w = res->tasks[i].weight;
      if (w >= k->lo && w <= k->hi) scratch[m++] = res->wait_ns[i];
    }
    describe(scratch, m, &k->wait);
  }
  free(scratch);
  return 0;
}
