/* SPDX-License-Identifier: MIT */
/* When each worker starts on a burst: N tasks of ~2 us of spinning on a
 * fresh 2-worker pool whose workers have slept 20 ms, eight runs. Prints
 * the run's wall time, when the submitting ended, and per worker thread
 * its first task's start, its CPU then and how many tasks it ran. With
 * "pin", a thread_start hook pins worker i to CPU i % 2.
 *   probe_timeline [TASKS [pin]]      (default 1000) */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "probe_common.h"
#include "taskorch.h"

enum { MAX_THREADS = 8 };

static _Thread_local int my_index = -1;
static atomic_int threads_seen;
static uint64_t first_ns[MAX_THREADS];
static int first_cpu[MAX_THREADS];
static atomic_long ran[MAX_THREADS];

static int spin_task(void *arg) {
  (void)arg;
  if (my_index < 0) {
    my_index = atomic_fetch_add(&threads_seen, 1);
    if (my_index >= MAX_THREADS) return 0;
    first_ns[my_index] = probe_now_ns();
    first_cpu[my_index] = sched_getcpu();
  }
  if (my_index < MAX_THREADS) atomic_fetch_add_explicit(&ran[my_index], 1, memory_order_relaxed);
  uint64_t end = probe_now_ns() + 2000;
  while (probe_now_ns() < end) {
  }
  return 0;
}

static void pin(void *user, unsigned index, tko_worker_kind kind) {
  (void)user;
  (void)kind;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(index % 2, &set);
  pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

int main(int argc, char **argv) {
  long tasks = probe_arg(argc, argv, 1, 1000);
  int pinned = argc > 2 && strcmp(argv[2], "pin") == 0;
  for (int r = 0; r < 8; r++) {
    tko_options o = tko_basic_options(2);
    if (pinned) o.hooks.thread_start = pin;
    tko_pool *p;
    if (tko_pool_create(&p, &o)) return 1;
    usleep(20000); /* the workers go to sleep, as in bench_cpu */
    atomic_store(&threads_seen, 0);
    memset(first_ns, 0, sizeof first_ns);
    for (int i = 0; i < MAX_THREADS; i++) atomic_store(&ran[i], 0);
    int cpu = sched_getcpu();
    uint64_t t0 = probe_now_ns();
    for (long i = 0; i < tasks; i++)
      if (tko_submit(p, spin_task, NULL, (int)(i % 7) - 3)) return 1;
    uint64_t t1 = probe_now_ns();
    tko_pool_wait_idle(p, -1);
    uint64_t t2 = probe_now_ns();
    printf("total %5.0f us, submitting ended at %4.0f us, submitter on cpu%d |",
           (double)(t2 - t0) / 1e3, (double)(t1 - t0) / 1e3, cpu);
    int seen = atomic_load(&threads_seen);
    for (int i = 0; i < seen && i < MAX_THREADS; i++)
      printf(" worker %d: first task at %5.0f us on cpu%d, %ld tasks |", i,
             (double)(first_ns[i] - t0) / 1e3, first_cpu[i], atomic_load(&ran[i]));
    printf("\n");
    tko_pool_destroy(p);
  }
  return 0;
}
