/* SPDX-License-Identifier: MIT */
/* A failed elastic spawn must not lose a wake-up (issue 14, defect 15).
 * The spawner counts the worker it is starting as searching before the
 * thread exists; a submit that sees that searcher skips its wake. If the
 * thread then cannot start, the phantom searcher never looks, and a task
 * submitted meanwhile, while the only other worker went to sleep, used to
 * wait for the next submit.
 *
 * The test holds the spawner inside thread creation (the library's test
 * seams in src/platform/prim.h: a hook called first, then the failure), lets the
 * basic worker finish and fall asleep, submits, then lets the spawn fail:
 * the task must run without another submit. Nothing sleeps to wait. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "prim.h"
#include "taskorch.h"
#include "taskorch/coalescer.h"
#include "tko_test.h"
#include "tko_test_fault.h"
#include "tko_test_feature.h"
#include "tko_test_sync.h"

static tt_count in_hook = TT_COUNT_INIT;
static tt_gate hook_gate = TT_GATE_INIT;
static atomic_int worker_tid;

static void hold_spawner(void) {
  tt_count_add(&in_hook, 1);
  tt_gate_wait(&hook_gate);
}

static void record_tid(void *user, unsigned index, tko_worker_kind kind) {
  (void)user;
  (void)index;
  if (kind == TKO_WORKER_BASIC) atomic_store(&worker_tid, (int)tf_gettid());
}

typedef struct submitter {
  tko_pool *pool;
  tt_count *runs;
} submitter;

static int count_fn(void *arg) {
  tt_count_add(arg, 1);
  return 0;
}

static int submit_one(void *arg) {
  submitter *s = arg;
  return tko_submit(s->pool, count_fn, s->runs, 0);
}

Test(spawn_failure, a_failed_spawn_wakes_a_sleeper_in_its_place) {
  tt_count runs = TT_COUNT_INIT;
  tt_pin pin = TT_PIN_INIT;
  tko_options o = tko_elastic_options(1, 1, 60000);
  o.hooks.thread_start = record_tid;
  tko_pool *pool = NULL;
  cr_assert_eq(tko_pool_create(&pool, &o), 0);
  /* The basic worker is busy: the next submit spawns. */
  cr_assert_eq(tko_submit(pool, tt_pin_fn, &pin, 0), 0);
  cr_assert(tt_count_wait_geq(&pin.started, 1));
  atomic_store(&tko__test_thread_create_errno, EAGAIN);
  atomic_store(&tko__test_thread_create_hook, hold_spawner);
  submitter s = {pool, &runs};
  tf_thread spawner;
  cr_assert_eq(tf_thread_start(&spawner, submit_one, &s), 0);
  cr_assert(tt_count_wait_geq(&in_hook, 1)); /* the phantom searcher is counted */
  /* The basic worker runs what is queued and falls asleep. */
  tt_gate_open(&pin.gate);
  cr_assert(tt_count_wait_geq(&runs, 1));
  cr_assert(tf_wait_thread_sleeping(atomic_load(&worker_tid)));
  /* This submit sees a searcher and wakes nobody. */
  cr_assert_eq(tko_submit(pool, count_fn, &runs, 0), 0);
  tt_gate_open(&hook_gate); /* the spawn fails */
  int rc = -1;
  cr_assert(tf_thread_join(&spawner, &rc));
  cr_assert_eq(rc, 0);
  atomic_store(&tko__test_thread_create_hook, NULL);
  atomic_store(&tko__test_thread_create_errno, 0);
  /* Without a wake in the spawner's place, this task waited for good. */
  cr_assert(tt_count_wait_geq(&runs, 2), "the task submitted during the failed spawn never ran");
  cr_assert_eq(tko_pool_destroy(pool), 0);
}

static int exit_fn(void *arg) {
  (void)arg;
  pthread_exit(NULL);
  return 0;
}

static bool one_basic_worker(const tko_stats *s) {
  return s->basic_workers == 1;
}

/* A basic worker whose task ends its thread is replaced; if no thread can
 * start, the pool has one worker fewer and says so in stats.basic_workers,
 * and the other worker runs on (taskorch.h). The exiting task counts as
 * finished before its thread tries to start a replacement, so wait_idle can
 * return first: the seam stays set until the pool counts the worker gone. */
Test(spawn_failure, a_basic_worker_that_cannot_be_replaced_is_counted_gone) {
  tt_count runs = TT_COUNT_INIT;
  tko_options o = tko_basic_options(2);
  tko_pool *pool = NULL;
  cr_assert_eq(tko_pool_create(&pool, &o), 0);
  atomic_store(&tko__test_thread_create_errno, EAGAIN);
  cr_assert_eq(tko_submit(pool, exit_fn, NULL, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, TT_LONG_MS), 0);
  tko_stats s;
  bool gone = tf_stats_wait(pool, &s, one_basic_worker);
  atomic_store(&tko__test_thread_create_errno, 0);
  cr_assert(gone, "the pool counts %u basic workers", s.basic_workers);
  cr_assert_eq(s.failed, 1);
  for (int i = 0; i < 10; i++) cr_assert_eq(tko_submit(pool, count_fn, &runs, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, TT_LONG_MS), 0);
  cr_assert_eq(runs.v, 10);
  cr_assert_eq(tko_pool_shutdown(pool, TKO_DRAIN), 0);
  cr_assert_eq(tko_pool_destroy(pool), 0);
}

static void flush_count(void *user, const tko_coalesce_entry *e, size_t n) {
  (void)e;
  tt_count_add(user, (long)n);
}

/* A coalescer whose timer thread cannot start is not created (-EAGAIN) and
 * leaves nothing behind: not attached to the pool (its shutdown would call
 * the freed coalescer back), no memory held. */
Test(spawn_failure, a_coalescer_whose_timer_thread_cannot_start_is_not_created) {
  tt_count flushed = TT_COUNT_INIT;
  tfa f;
  tfa_init(&f);
  tko_options o = tko_basic_options(1);
  tko_pool *pool = NULL;
  cr_assert_eq(tko_pool_create(&pool, &o), 0);
  tko_coalesce_options co;
  memset(&co, 0, sizeof co);
  co.allocator = &f.al;
  atomic_store(&tko__test_thread_create_errno, EAGAIN);
  tko_coalescer *c = (tko_coalescer *)&f;
  int rc = tko_coalescer_create(&c, pool, 10, flush_count, &flushed, &co);
  atomic_store(&tko__test_thread_create_errno, 0);
  cr_assert_eq(rc, -EAGAIN);
  cr_assert_null(c);
  cr_assert_eq(atomic_load(&f.live), 0, "a block leaked");
  /* Without a timer thread (interval 0) the same seam does not matter. */
  atomic_store(&tko__test_thread_create_errno, EAGAIN);
  rc = tko_coalescer_create(&c, pool, 0, flush_count, &flushed, &co);
  atomic_store(&tko__test_thread_create_errno, 0);
  cr_assert_eq(rc, 0);
  cr_assert_eq(tko_coalescer_mark(c, 1, 1), 0);
  /* Shutdown calls back only the one attached, which is still usable. */
  cr_assert_eq(tko_pool_shutdown(pool, TKO_DRAIN), 0);
  cr_assert_eq(tko_coalescer_destroy(c), 0); /* its final flush */
  cr_assert_eq(flushed.v, 1);
  cr_assert_eq(atomic_load(&f.live), 0);
  cr_assert_eq(tko_pool_destroy(pool), 0);
}
