/* SPDX-License-Identifier: MIT */
/* The cost of moving a cache line between cores, the transfer time of the
 * bottleneck model (benchmarks/MODEL.md). No pool: bare atomics on one
 * line, every thread pinned to its own CPU.
 *   probe_pingpong pingpong CPU_A CPU_B ROUNDS RUNS
 *       two threads take turns writing the line (each waits to see the
 *       other's write): ns per one-way hand-off
 *   probe_pingpong cas THREADS ROUNDS RUNS
 *       THREADS threads (CPUs 0..THREADS-1) each do ROUNDS load + CAS
 *       increments of one word, as submitters do on a shared tail: ns per
 *       successful CAS, which is the line's service time under contention
 * Prints one line per run; read the median. Wants as many CPUs as threads,
 * else it measures the scheduler (the 2-core development machine: smoke
 * runs only). */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "probe_common.h"

static _Alignas(64) atomic_uint_fast64_t line;
static pthread_barrier_t go;

typedef struct runner {
  pthread_t thread;
  int cpu;
  long rounds;
  unsigned parity; /* pingpong: writes when the count has this parity */
} runner;

static void pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (pthread_setaffinity_np(pthread_self(), sizeof set, &set))
    fprintf(stderr, "probe_pingpong: cannot pin to CPU %d (unpinned)\n", cpu);
}

static void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

static void *pingpong(void *arg) {
  runner *r = arg;
  pin(r->cpu);
  pthread_barrier_wait(&go);
  for (uint64_t n = r->parity, end = 2 * (uint64_t)r->rounds; n < end; n += 2) {
    /* Acquire/release: the hand-off a submitter and a worker make. */
    while (atomic_load_explicit(&line, memory_order_acquire) != n)
      relax();
    atomic_store_explicit(&line, n + 1, memory_order_release);
  }
  return NULL;
}

static void *cas(void *arg) {
  runner *r = arg;
  pin(r->cpu);
  pthread_barrier_wait(&go);
  for (long i = 0; i < r->rounds; i++) {
    uint64_t v = atomic_load_explicit(&line, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(&line, &v, v + 1, memory_order_seq_cst,
                                                  memory_order_relaxed))
      ;
  }
  return NULL;
}

/* Wall time of one run in ns, or a negative value if a thread did not start. */
static double run(void *(*fn)(void *), runner *rs, int n) {
  atomic_store(&line, 0);
  pthread_barrier_init(&go, NULL, (unsigned)n + 1);
  for (int i = 0; i < n; i++)
    if (pthread_create(&rs[i].thread, NULL, fn, &rs[i])) return -1.0;
  uint64_t t0 = probe_now_ns();
  pthread_barrier_wait(&go);
  for (int i = 0; i < n; i++)
    pthread_join(rs[i].thread, NULL);
  uint64_t ns = probe_now_ns() - t0;
  pthread_barrier_destroy(&go);
  return (double)ns;
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "";
  if (!strcmp(mode, "pingpong")) {
    int a = (int)probe_arg(argc, argv, 2, 0), b = (int)probe_arg(argc, argv, 3, 1);
    long rounds = probe_arg(argc, argv, 4, 1000000), runs = probe_arg(argc, argv, 5, 5);
    for (long i = 0; i < runs; i++) {
      runner rs[2] = {{.cpu = a, .rounds = rounds, .parity = 0},
                      {.cpu = b, .rounds = rounds, .parity = 1}};
      double ns = run(pingpong, rs, 2);
      if (ns < 0) return 1;
      printf("pingpong cpus %d,%d: %.1f ns per hand-off\n", a, b, ns / (2.0 * (double)rounds));
    }
    return 0;
  }
  if (!strcmp(mode, "cas")) {
    int n = (int)probe_arg(argc, argv, 2, 2);
    long rounds = probe_arg(argc, argv, 3, 1000000), runs = probe_arg(argc, argv, 4, 5);
    if (n < 1 || n > 1024) return 2;
    static runner rs[1024];
    for (long i = 0; i < runs; i++) {
      for (int t = 0; t < n; t++)
        rs[t] = (runner){.cpu = t, .rounds = rounds};
      double ns = run(cas, rs, n);
      if (ns < 0) return 1;
      double ops = (double)rounds * n;
      printf("cas %d threads: %.1f ns per CAS (%.2f M CAS/s in all)\n", n, ns / ops,
             1000.0 * ops / ns);
    }
    return 0;
  }
  fprintf(stderr, "usage: probe_pingpong pingpong CPU_A CPU_B ROUNDS RUNS\n"
                  "       probe_pingpong cas THREADS ROUNDS RUNS\n");
  return 2;
}
