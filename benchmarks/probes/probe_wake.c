/* SPDX-License-Identifier: MIT */
/* How long a thread takes to run after it is woken here, with no pool in
 * the way: a thread parked on a futex for 20 ms is woken, and the waker then
 * stays busy for 50 us (as a submitter would) before it joins. Eight runs a
 * mode; each line gives the time the wake call itself took, when the woken
 * thread ran and on which CPU.
 *   kernel   neither thread pinned: Linux places the woken thread
 *   create   no sleeper: a thread created at the first instant instead
 *   other    the waker pinned to CPU 1, the sleeper to CPU 0: the wake must
 *            reach a CPU that has been idle for 20 ms
 *   probe_wake [BUSY_US]      (default 50) */
#define _GNU_SOURCE
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "probe_common.h"

enum { KERNEL, CREATE, OTHER, MODES }; /* OTHER last: it pins the main thread */
static const char *mode_name[MODES] = {"kernel", "create", "other"};

static atomic_uint word;
static int pin_to = -1; /* the woken thread's CPU, or -1 */
static uint64_t ran_ns;
static int ran_cpu;

static void pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

static void *woken(void *arg) {
  (void)arg;
  if (pin_to >= 0) pin(pin_to);
  while (!atomic_load(&word))
    syscall(SYS_futex, &word, FUTEX_WAIT_PRIVATE, 0, NULL, NULL, 0);
  ran_ns = probe_now_ns();
  ran_cpu = sched_getcpu();
  return NULL;
}

int main(int argc, char **argv) {
  long busy_us = probe_arg(argc, argv, 1, 50);
  if (sysconf(_SC_NPROCESSORS_ONLN) < 2) {
    printf("probe_wake needs two CPUs\n");
    return 1;
  }
  for (int mode = 0; mode < MODES; mode++) {
    if (mode == OTHER) pin(1);
    pin_to = mode == OTHER ? 0 : -1;
    for (int r = 0; r < 8; r++) {
      pthread_t t;
      atomic_store(&word, mode == CREATE); /* a created thread need not wait */
      if (mode != CREATE && pthread_create(&t, NULL, woken, NULL)) return 1;
      usleep(20000); /* the sleeper parks; its CPU goes idle */
      int cpu = sched_getcpu();
      uint64_t t0 = probe_now_ns();
      if (mode == CREATE) {
        if (pthread_create(&t, NULL, woken, NULL)) return 1;
      } else {
        atomic_store(&word, 1);
        syscall(SYS_futex, &word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
      }
      uint64_t t1 = probe_now_ns();
      while (probe_now_ns() < t1 + (uint64_t)busy_us * 1000u) {
      }
      pthread_join(t, NULL);
      printf("%-6s waker on cpu%d, wake call %6.1f us, woken thread ran at %7.1f us on cpu%d\n",
             mode_name[mode], cpu, (double)(t1 - t0) / 1e3, (double)(ran_ns - t0) / 1e3, ran_cpu);
    }
  }
  return 0;
}
