/* SPDX-License-Identifier: MIT */
/* One C-Thread-Pool program, built twice: bench_thpool_compat links
 * taskorch's thpool compatibility layer (compat/thpool.h), bench_thpool_real
 * compiles in C-Thread-Pool's own thpool.c (-DBENCH_THPOOL_REAL). The
 * program is what a C-Thread-Pool user writes: make a pool, add N small jobs,
 * thpool_wait, destroy; it prints jobs per second for the add-and-wait part.
 * Run both with the same arguments, back to back, to compare; the machine's
 * noise is the same for both only within one sitting.
 *
 * The measuring thread does not poll: it blocks in thpool_wait, which is a
 * condition variable in both implementations.
 *
 * Checks, every round: each job ran exactly once (count, sum and sum of
 * squares of the job numbers), and after thpool_wait no job is still
 * working (thpool_num_threads_working is 0). A failed check is printed and
 * makes the exit status 1. */
#define _POSIX_C_SOURCE 200809L
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "thpool.h"

#ifdef BENCH_THPOOL_REAL
#define IMPL_NAME "C-Thread-Pool (thpool.c)"
#else
#define IMPL_NAME "taskorch-thpool"
#endif

#ifdef TKO_HAVE_JEMALLOC
#define ALLOC_NAME "jemalloc"
#else
#define ALLOC_NAME "default"
#endif

/* Each job adds one, its own number and its square: together they show
 * that every job ran once (a lost job and a doubled one cannot cancel out
 * in all three). */
static atomic_ullong count, sum, squares;

static void job(void *arg) {
  /* Relaxed: only the totals matter, read after thpool_wait. */
  unsigned long long n = (unsigned long long)(uintptr_t)arg;
  atomic_fetch_add_explicit(&count, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&sum, n, memory_order_relaxed);
  atomic_fetch_add_explicit(&squares, n * n, memory_order_relaxed);
}

static int checks_passed, checks_failed;

static void check(int ok, long round, const char *what) {
  if (ok) {
    checks_passed++;
    return;
  }
  checks_failed++;
  fprintf(stderr, "round %ld: check failed: %s\n", round, what);
  printf("round %ld: check failed: %s\n", round, what);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void usage(FILE *out) {
  fprintf(out,
          "usage: bench_thpool_{compat,real} [--jobs N] [--threads T] [--rounds R] [--smoke]\n"
          "  Adds N jobs to a pool of T threads and waits for them, R times;\n"
          "  prints each round's jobs/s and the best and median.\n"
          "  --jobs N     jobs per round (default 1000000)\n"
          "  --threads T  pool threads (default 2)\n"
          "  --rounds R   rounds (default 5)\n"
          "  --smoke      tiny sizes (2000 jobs, 1 round): checks it runs, measures nothing\n"
          "  --help       this text\n");
}

static int parse_long(const char *s, long *out) {
  char *end;
  long v = strtol(s, &end, 10);
  if (!*s || *end || v < 1) return -1;
  *out = v;
  return 0;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  long jobs = 1000000, threads = 2, rounds = 5;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    long *target = NULL;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      return 0;
    } else if (!strcmp(a, "--smoke")) {
      jobs = 2000;
      rounds = 1;
      continue;
    } else if (!strcmp(a, "--jobs")) {
      target = &jobs;
    } else if (!strcmp(a, "--threads")) {
      target = &threads;
    } else if (!strcmp(a, "--rounds")) {
      target = &rounds;
    }
    if (!target || i + 1 >= argc || parse_long(argv[++i], target) != 0) {
      usage(stderr);
      return 2;
    }
  }
  if (threads > 1024 || rounds > 1000) {
    usage(stderr);
    return 2;
  }

  double *rate = calloc((size_t)rounds, sizeof *rate);
  if (!rate) return 1;
  printf("%s, allocator %s: %ld jobs, %ld threads, %ld rounds\n", IMPL_NAME, ALLOC_NAME, jobs,
         threads, rounds);
  for (long r = 0; r < rounds; r++) {
    threadpool pool = thpool_init((int)threads);
    if (!pool) {
      fprintf(stderr, "thpool_init(%ld) failed\n", threads);
      return 1;
    }
    atomic_store(&count, 0);
    atomic_store(&sum, 0);
    atomic_store(&squares, 0);
    double t0 = now_s();
    for (long j = 0; j < jobs; j++) {
      if (thpool_add_work(pool, job, (void *)(uintptr_t)(j + 1)) != 0) {
        fprintf(stderr, "thpool_add_work failed at job %ld\n", j);
        return 1;
      }
    }
    thpool_wait(pool);
    double t = now_s() - t0;
    check(thpool_num_threads_working(pool) == 0, r + 1, "a job still working after thpool_wait");
    thpool_destroy(pool);
    /* Sums of 1..N and of their squares, modulo 2^64 like the atomics. */
    unsigned long long n = (unsigned long long)jobs, want_sum = 0, want_sq = 0;
    for (unsigned long long j = 1; j <= n; j++) {
      want_sum += j;
      want_sq += j * j;
    }
    check(atomic_load(&count) == n && atomic_load(&sum) == want_sum &&
              atomic_load(&squares) == want_sq,
          r + 1, "the jobs did not each run exactly once (count, sum or sum of squares)");
    rate[r] = (double)jobs / t;
    printf("round %ld: %.0f jobs/s (%.1f ns/job)\n", r + 1, rate[r], 1e9 / rate[r]);
  }
  qsort(rate, (size_t)rounds, sizeof *rate, cmp_double);
  double best = rate[rounds - 1], median = rate[rounds / 2];
  printf("%s: best %.0f jobs/s (%.1f ns/job), median %.0f jobs/s (%.1f ns/job)\n", IMPL_NAME,
         best, 1e9 / best, median, 1e9 / median);
  printf("checks: %d passed, %d failed\n", checks_passed, checks_failed);
  free(rate);
  return checks_failed ? 1 : 0;
}
