/* SPDX-License-Identifier: MIT */
/* tko_pool_stats under load: a snapshot may lag, but it never reports the
 * impossible (issue 17, defect 4): running never above the threads that
 * can run tasks, queued never above a bounded queue's capacity, and
 * completed + cancelled + queued + running never above submitted (a reader
 * that saw a task finish after it read the started counts used to count it
 * both as completed and as queued: found by test_lifecycle_stress). A reader takes snapshots as fast as it can while
 * a producer floods a 2-worker pool through a 64-slot queue. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#include "taskorch.h"
#include "tko_test.h"
#include "tko_test_feature.h"
#include "tko_test_sync.h"

enum { WORKERS = 2, CAPACITY = 64 };

typedef struct flood {
  tko_pool *pool;
  long n;
  atomic_bool done;
} flood;

static int produce(void *arg) {
  flood *f = arg;
  int bad = 0;
  for (long i = 0; i < f->n; i++)
    if (tko_submit(f->pool, tt_nop_fn, NULL, 0) != 0) bad++;
  atomic_store(&f->done, true);
  return bad;
}

Test(stats, a_snapshot_never_reports_the_impossible) {
  tko_options o = tko_basic_options(WORKERS);
  o.queue_capacity = CAPACITY;
  o.full_policy = TKO_FULL_BLOCK;
  flood f = {.n = TT_SCALE(400000, 40000)};
  cr_assert_eq(tko_pool_create(&f.pool, &o), 0);
  tf_thread producer;
  cr_assert_eq(tf_thread_start(&producer, produce, &f), 0);
  long snapshots = 0, bad_running = 0, bad_queued = 0, bad_completed = 0, bad_sum = 0;
  uint64_t max_running = 0, max_queued = 0;
  while (!atomic_load(&f.done)) {
    tko_stats s = tf_stats(f.pool);
    snapshots++;
    if (s.running > WORKERS) bad_running++;
    if (s.queued > CAPACITY) bad_queued++;
    if (s.completed + s.cancelled > s.submitted) bad_completed++;
    if (s.completed + s.cancelled + s.queued + s.running > s.submitted) bad_sum++;
    if (s.running > max_running) max_running = s.running;
    if (s.queued > max_queued) max_queued = s.queued;
  }
  int rc = -1;
  cr_assert(tf_thread_join(&producer, &rc));
  cr_assert_eq(rc, 0);
  cr_assert_eq(tko_pool_wait_idle(f.pool, -1), 0);
  tko_stats s = tf_stats(f.pool);
  cr_assert_eq(s.submitted, (uint64_t)f.n);
  cr_assert_eq(s.completed, (uint64_t)f.n);
  cr_assert_eq(s.running + s.queued, 0);
  cr_assert_eq(tko_pool_destroy(f.pool), 0);
  cr_assert_gt(snapshots, 0);
  cr_assert_eq(bad_running, 0, "running above %d in %ld of %ld snapshots (max %llu)", WORKERS,
               bad_running, snapshots, (unsigned long long)max_running);
  cr_assert_eq(bad_queued, 0, "queued above %d in %ld of %ld snapshots (max %llu)", CAPACITY,
               bad_queued, snapshots, (unsigned long long)max_queued);
  cr_assert_eq(bad_completed, 0);
  cr_assert_eq(bad_sum, 0, "the counts added up to more than submitted in %ld of %ld snapshots",
               bad_sum, snapshots);
}
