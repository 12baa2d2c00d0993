/* SPDX-License-Identifier: MIT */
/* compare_submit: plain tko_submit of a million empty tasks, 1 producer,
 * 2 workers, median of 7 fresh pools. Built by compare_submit.sh against two
 * versions of the library to show what a change costs the hot path.
 * Argument: 0 = one weight, 1 = four alternating weights. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "taskorch.h"

static int empty(void *arg) {
  (void)arg;
  return 0;
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  int mixed = argc > 1 && atoi(argv[1]);
  const long n = 1000000;
  double v[7];
  for (int r = 0; r < 7; r++) {
    tko_options o = tko_basic_options(2);
    tko_pool *p;
    if (tko_pool_create(&p, &o)) return 1;
    tko_pool_wait_idle(p, -1);
    double t0 = now_s();
    for (long i = 0; i < n; i++) tko_submit(p, empty, NULL, mixed ? (int)(i & 3) : 0);
    tko_pool_wait_idle(p, -1);
    v[r] = (now_s() - t0) * 1e9 / (double)n;
    tko_pool_destroy(p);
  }
  qsort(v, 7, sizeof v[0], cmp);
  printf("%s weight%s: median %.1f ns/task (min %.1f)\n", mixed ? "4" : "1", mixed ? "s" : "",
         v[3], v[0]);
  return 0;
}
