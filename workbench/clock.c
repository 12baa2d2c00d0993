/* SPDX-License-Identifier: MIT */
/* The workbench's clock: the monotonic time every part of a run stamps
 * (the run, its timeline sampler), and a sleep that resumes
 * after a signal. */
#include <errno.h>
#include <stdint.h>
#include <time.h>

#include "wb.h"

uint64_t wb_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void wb_sleep_ns(uint64_t ns) {
  struct timespec ts = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)};
  while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
  }
}
