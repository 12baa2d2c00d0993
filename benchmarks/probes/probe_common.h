/* SPDX-License-Identifier: MIT */
/* Shared bits of the probes: a clock and argument reading. The probes are
 * small single-purpose programs behind figures in the README that
 * bench_* does not print (page-fault cost, one flood shape at a time, a
 * timeline of worker starts); each prints raw numbers, one run a line. */
#ifndef PROBE_COMMON_H
#define PROBE_COMMON_H

#include <stdint.h>
#include <stdlib.h>
#include <time.h>

static inline uint64_t probe_now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* argv[i] as a number, or def when absent. */
static inline long probe_arg(int argc, char **argv, int i, long def) {
  return argc > i ? strtol(argv[i], NULL, 10) : def;
}

#endif
