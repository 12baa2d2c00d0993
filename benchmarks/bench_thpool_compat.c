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
 * condition variable in both implementations. */
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

/* Each job adds its own number: a sum that shows every job ran once. */
static atomic_ullong sum;

static void job(void *arg) {
  /* Relaxed: only the total matters, read after thpool_wait. */
  atomic_fetch_add_explicit(&sum, (unsigned long long)(uintptr_t)arg, memory_order_relaxed);
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
    atomic_store(&sum, 0);
    double t0 = now_s();
    for (long j = 0; j < jobs; j++) {
      if (thpool_add_work(pool, job, (void *)(uintptr_t)(j + 1)) != 0) {
        fprintf(stderr, "thpool_add_work failed at job %ld\n", j);
        return 1;
      }
    }
    thpool_wait(pool);
    double t = now_s() - t0;
    thpool_destroy(pool);
    unsigned long long want = (unsigned long long)jobs * (unsigned long long)(jobs + 1) / 2;
    if (atomic_load(&sum) != want) {
      fprintf(stderr, "round %ld: job sum %llu, expected %llu\n", r, atomic_load(&sum), want);
      return 1;
    }
    rate[r] = (double)jobs / t;
    printf("round %ld: %.0f jobs/s (%.1f ns/job)\n", r + 1, rate[r], 1e9 / rate[r]);
  }
  qsort(rate, (size_t)rounds, sizeof *rate, cmp_double);
  double best = rate[rounds - 1], median = rate[rounds / 2];
  printf("%s: best %.0f jobs/s (%.1f ns/job), median %.0f jobs/s (%.1f ns/job)\n", IMPL_NAME,
         best, 1e9 / best, median, 1e9 / median);
  free(rate);
  return 0;
}
