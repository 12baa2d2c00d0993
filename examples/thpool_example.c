/* SPDX-License-Identifier: MIT */
/* A C-Thread-Pool program, unchanged but for the link line: it includes
 * "thpool.h" and links with `pkg-config --cflags --libs taskorch-thpool`.
 *
 * It makes a pool of 4 threads, queues 40 jobs that each square their
 * number into a slot of their own, waits for all of them, and checks the
 * sum. The part under THPOOL_TASKORCH uses the weighted extension, which the
 * original C-Thread-Pool does not have. Exits 0 when every result is right. */
#include <stdint.h>
#include <stdio.h>

#include "thpool.h"

#define JOBS 40

static long squares[JOBS];

static void square(void *arg) {
  uintptr_t i = (uintptr_t)arg;
  squares[i] = (long)(i * i);
}

int main(void) {
  puts("Making threadpool with 4 threads");
  threadpool pool = thpool_init(4);
  if (!pool) return 1;

  puts("Pausing it and adding 40 jobs");
  thpool_pause(pool); /* jobs are accepted while paused, none starts */
  for (uintptr_t i = 0; i < JOBS; i++) {
#ifdef THPOOL_TASKORCH
    /* Extension: higher weight first, so the last jobs added run first. */
    if (thpool_add_work_weighted(pool, square, (void *)i, (int)i) != 0) return 1;
#else
    if (thpool_add_work(pool, square, (void *)i) != 0) return 1;
#endif
  }
  puts("Resuming and waiting for all of them");
  thpool_resume(pool);
  thpool_wait(pool);

  long sum = 0;
  for (int i = 0; i < JOBS; i++) sum += squares[i];
  long want = (long)(JOBS - 1) * JOBS * (2 * JOBS - 1) / 6;
  printf("Sum of squares 0..%d: %ld (expected %ld), %d threads working\n", JOBS - 1, sum, want,
         thpool_num_threads_working(pool));

  puts("Killing threadpool");
  thpool_destroy(pool);
  return sum == want ? 0 : 1;
}
