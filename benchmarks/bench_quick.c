/* A quick look at the hot path: one producer, N workers, a million empty
 * tasks, end to end (first submit to wait_idle returning). Prints the
 * median ns/task of several runs. The full suite is bench_peers & co. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "taskorch.h"

static int empty_task(void *arg) {
  (void)arg;
  return 0;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  long tasks = 1000000, runs = 5, workers = 2;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--help")) {
      printf("usage: bench_quick [--smoke] [--tasks N] [--runs N] [--workers N]\n");
      return 0;
    } else if (!strcmp(argv[i], "--smoke")) {
      tasks = 10000;
      runs = 1;
    } else if (i + 1 < argc && !strcmp(argv[i], "--tasks")) {
      tasks = atol(argv[++i]);
    } else if (i + 1 < argc && !strcmp(argv[i], "--runs")) {
      runs = atol(argv[++i]);
    } else if (i + 1 < argc && !strcmp(argv[i], "--workers")) {
      workers = atol(argv[++i]);
    } else {
      fprintf(stderr, "bench_quick: unknown option '%s' (try --help)\n", argv[i]);
      return 2;
    }
  }
  if (tasks < 1 || runs < 1 || runs > 100 || workers < 1) {
    fprintf(stderr, "bench_quick: --tasks, --runs and --workers must be positive\n");
    return 2;
  }
  double ns[100];
  for (long r = 0; r < runs; r++) {
    tko_options o = tko_basic_options((unsigned)workers);
    tko_pool *pool;
    int rc = tko_pool_create(&pool, &o);
    if (rc) {
      fprintf(stderr, "bench_quick: %s\n", tko_strerror(rc));
      return 1;
    }
    tko_pool_wait_idle(pool, -1);
    double t0 = now_s();
    for (long i = 0; i < tasks; i++) tko_submit(pool, empty_task, NULL, (int)(i & 3));
    tko_pool_wait_idle(pool, -1);
    ns[r] = (now_s() - t0) * 1e9 / (double)tasks;
    tko_pool_destroy(pool);
  }
  qsort(ns, (size_t)runs, sizeof ns[0], cmp_double);
  printf("empty tasks: %ld, 1 producer, %ld workers: median %.1f ns/task (min %.1f, max %.1f)\n",
         tasks, workers, ns[runs / 2], ns[0], ns[runs - 1]);
  return 0;
}
