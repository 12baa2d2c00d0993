/* SPDX-License-Identifier: MIT */
/* Keyed tasks' own cost: one producer submits empty keyed tasks
 * (tko_submit_keyed) spread over KEYS keys to a pool of WORKERS, then waits
 * for the pool to go idle; one line a run, "NN.N ns/task" over the submits
 * and the wait. A lane's visit and a keyed task each push a cleanup for a
 * task that ends its thread (lanes.c, keyed.c): this is where its cost
 * would show (benchmarks/ab_probe.sh A B ROUNDS probe_keyed).
 *   probe_keyed [KEYS] [TASKS] [WORKERS]   (default 64 1000000 2) */
#include <stdio.h>

#include "probe_common.h"
#include "taskorch.h"

static int nop(void *arg) {
  (void)arg;
  return 0;
}

int main(int argc, char **argv) {
  long keys = probe_arg(argc, argv, 1, 64), tasks = probe_arg(argc, argv, 2, 1000000);
  long workers = probe_arg(argc, argv, 3, 2);
  if (keys < 1 || tasks < 1 || workers < 1) {
    fprintf(stderr, "usage: probe_keyed [KEYS] [TASKS] [WORKERS]\n");
    return 2;
  }
  tko_options o = tko_basic_options((unsigned)workers);
  tko_pool *pool;
  if (tko_pool_create(&pool, &o)) return 1;
  /* Warm-up: every lane's ring and scratch, the queue's slab. */
  for (long i = 0; i < tasks / 10; i++)
    if (tko_submit_keyed(pool, (uint64_t)(i % keys), nop, NULL, 0)) return 1;
  tko_pool_wait_idle(pool, -1);
  uint64_t t0 = probe_now_ns();
  for (long i = 0; i < tasks; i++)
    if (tko_submit_keyed(pool, (uint64_t)(i % keys), nop, NULL, 0)) return 1;
  tko_pool_wait_idle(pool, -1);
  printf("%.1f ns/task\n", (double)(probe_now_ns() - t0) / (double)tasks);
  return tko_pool_destroy(pool) ? 1 : 0;
}
