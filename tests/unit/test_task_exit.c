/* SPDX-License-Identifier: MIT */
/* A task that ends its worker's thread (pthread_exit) unwinds through its
 * own cleanup before the worker's (worker.c: tko__task_exited). The task's
 * own cleanup may let its owner go: a coalescer's sweep ends there, and
 * the coalescer's destroy may then free it. So the worker's cleanup must
 * not read the owner's record, which holds the task's kind; it uses the
 * kind its frame read when the task started. Here the worker is parked
 * between the two cleanups until the coalescer is destroyed, by an
 * allocator that scribbles over what it frees: a read of the freed record
 * then finds a wild kind pointer and crashes, in a plain build as under
 * ASan. */
#define _GNU_SOURCE
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "taskorch.h"
#include "taskorch/coalescer.h"
#include "tko_test.h"
#include "tko_test_sync.h"

static void *plain_alloc(void *ctx, size_t size) {
  (void)ctx;
  return malloc(size);
}

static void *plain_realloc(void *ctx, void *p, size_t size) {
  (void)ctx;
  return realloc(p, size);
}

static void scribbling_free(void *ctx, void *p) {
  (void)ctx;
  if (p) memset(p, 0xa5, malloc_usable_size(p));
  /* The compiler may drop stores to memory about to be freed: keep them. */
  __asm__ volatile("" : : "r"(p) : "memory");
  free(p);
}

static tt_count parked, flushes;
static tt_gate destroyed = TT_GATE_INIT;

static void park_between_the_cleanups(void) {
  tt_count_add(&parked, 1);
  tt_gate_wait(&destroyed);
}

static void exit_flush(void *user, const tko_coalesce_entry *e, size_t n) {
  (void)user;
  (void)e;
  (void)n;
  tt_count_add(&flushes, 1);
  pthread_exit(NULL);
}

Test(task_exit, a_worker_whose_task_ended_its_thread_reads_nothing_of_the_tasks_owner) {
  tt_count_init(&parked);
  tt_count_init(&flushes);
  tko_options o = tko_basic_options(2);
  tko_pool *pool;
  cr_assert_eq(tko_pool_create(&pool, &o), 0);
  tko_allocator scribbling = {plain_alloc, plain_realloc, scribbling_free, NULL};
  tko_coalesce_options co = {.allocator = &scribbling};
  tko_coalescer *c;
  /* A 1 ms tick: the sweep is a task of the pool, on a worker. */
  cr_assert_eq(tko_coalescer_create(&c, pool, 1, exit_flush, NULL, &co), 0);
  atomic_store(&tko__test_task_exited_window, park_between_the_cleanups);
  cr_assert_eq(tko_coalescer_mark(c, 1, 1), 0);
  /* The sweep's flush ended its worker's thread; the sweep's own cleanup
   * gave the token back, and the worker's waits in the seam. */
  cr_assert(tt_count_wait_geq(&parked, 1));
  atomic_store(&tko__test_task_exited_window, NULL);
  cr_assert_eq(tko_coalescer_destroy(c), 0); /* frees (and scribbles over) the sweep's owner */
  tt_gate_open(&destroyed);
  cr_assert_eq(tko_pool_wait_idle(pool, TT_LONG_MS), 0);
  tko_stats s;
  tko_pool_stats(pool, &s);
  cr_assert_eq(s.failed, 1, "the sweep that ended its thread counts as failed");
  cr_assert_eq(tko_pool_destroy(pool), 0);
  cr_assert_eq(tt_count_get(&flushes), 1);
  tt_count_fini(&flushes);
  tt_count_fini(&parked);
}
