/* SPDX-License-Identifier: MIT */
/* The elastic retirement window, through the library's test seam
 * (tko__test_retire_window in src/platform/prim.h): a submit that lands after a
 * retiring worker's last look at the queue and before it releases its
 * count finds nobody idle and no count free to spawn with, so only the
 * worker's re-check after the release can pick the task up (elastic.c's
 * essay). The window is a few instructions wide, so a test that races
 * submits against retirements from outside almost never lands in it; the
 * seam lets the retiring worker itself submit there, every time.
 *
 * No thread_stop hook: with one, the stopping worker's resurrect re-check
 * would pick the task up too and hide a missing retirement re-check. */
#include <errno.h>
#include <stdatomic.h>
#include <string.h>

#include "prim.h"
#include "taskorch.h"
#include "tko_test.h"
#include "tko_test_sync.h"

static tko_pool *seam_pool;
static tt_count seam_calls = TT_COUNT_INIT, seam_ran = TT_COUNT_INIT;
static atomic_int seam_submit_rc;

static int seam_task(void *arg) {
  (void)arg;
  tt_count_add(&seam_ran, 1);
  return 0;
}

/* Runs on the retiring worker, inside the window: submits one task, once. */
static void submit_in_window(struct tko_pool *pool) {
  atomic_store(&tko__test_retire_window, NULL);
  atomic_store(&seam_submit_rc, tko_submit(pool, seam_task, NULL, 0));
  tt_count_add(&seam_calls, 1);
}

/* Kills elastic-retire-recheck-dropped (scripts/mutants.list). */
Test(retire, a_submit_in_the_retirement_window_is_not_stranded) {
  tko_options o = tko_elastic_options(0, 1, 1); /* elastic only, 1 ms idle */
  cr_assert_eq(tko_pool_create(&seam_pool, &o), 0);
  atomic_store(&seam_submit_rc, 1);
  /* The seam goes in first: with a 1 ms idle timeout the worker may try to
   * retire before this thread gets further (installed after the first
   * task, the test once waited for a window that had already passed). */
  atomic_store(&tko__test_retire_window, submit_in_window);
  /* A first task starts the only worker; idle, it then tries to retire. */
  cr_assert_eq(tko_submit(seam_pool, seam_task, NULL, 0), 0);
  cr_assert(tt_count_wait_geq(&seam_calls, 1), "the worker never tried to retire");
  cr_assert_eq(atomic_load(&seam_submit_rc), 0);
  /* The task submitted in the window runs: wait_idle does not time out. */
  cr_assert_eq(tko_pool_wait_idle(seam_pool, 10000), 0, "the task was stranded");
  cr_assert_eq(tt_count_get(&seam_ran), 2);
  tko_stats s;
  tko_pool_stats(seam_pool, &s);
  cr_assert_eq(s.completed, 2);
  cr_assert_leq(s.elastic_peak, 1);
  cr_assert_eq(tko_pool_destroy(seam_pool), 0);
}

/* Elastic counts in a snapshot (found by the attack on stats: a snapshot
 * read more elastic workers retired than spawned, and more alive than
 * ever spawned). The spawn window seam holds the spawner: before the
 * thread exists its reservation is counted, and after, the new thread
 * can run, idle and retire before the spawner goes on. */
static tt_count stops = TT_COUNT_INIT;
static tko_stats before_create, after_retire;
static bool retire_seen;

static void count_stop(void *user, unsigned index, tko_worker_kind kind) {
  (void)user, (void)index, (void)kind;
  tt_count_add(&stops, 1);
}

static void hold_spawner(struct tko_pool *pool, bool created) {
  if (!created) {
    tko_pool_stats(pool, &before_create);
    return;
  }
  atomic_store(&tko__test_spawn_window, NULL);
  /* The worker runs the task, idles 1 ms, retires and runs its stop hook,
   * while this spawner has not finished spawning it. */
  retire_seen = tt_count_wait_geq(&stops, 1);
  tko_pool_stats(pool, &after_retire);
}

static void assert_elastic_consistent(const tko_stats *s) {
  cr_assert_leq(s->elastic_retired, s->elastic_spawned, "retired %llu > spawned %llu",
                (unsigned long long)s->elastic_retired, (unsigned long long)s->elastic_spawned);
  cr_assert_leq(s->elastic_workers, s->elastic_spawned - s->elastic_retired,
                "%u alive, %llu spawned, %llu retired", s->elastic_workers,
                (unsigned long long)s->elastic_spawned, (unsigned long long)s->elastic_retired);
  cr_assert_leq(s->elastic_workers, s->elastic_peak);
}

/* Kills elastic-spawned-counted-by-the-spawner and
 * stats-elastic-workers-count-reservations (scripts/mutants.list). */
Test(retire, elastic_counts_stay_consistent_around_a_spawn) {
  tko_options o = tko_elastic_options(0, 1, 1); /* elastic only, 1 ms idle */
  o.hooks.thread_stop = count_stop;
  cr_assert_eq(tko_pool_create(&seam_pool, &o), 0);
  tt_count_init(&stops);
  retire_seen = false;
  atomic_store(&tko__test_spawn_window, hold_spawner);
  cr_assert_eq(tko_submit(seam_pool, tt_nop_fn, NULL, 0), 0); /* spawns, held in the seam */
  cr_assert(retire_seen, "the elastic worker never retired");
  assert_elastic_consistent(&before_create);
  cr_assert_eq(before_create.elastic_workers, 0, "a reservation counted as a worker");
  assert_elastic_consistent(&after_retire);
  cr_assert_eq(after_retire.elastic_retired, 1);
  cr_assert_eq(tko_pool_wait_idle(seam_pool, TT_LONG_MS), 0);
  tko_stats s;
  tko_pool_stats(seam_pool, &s);
  cr_assert_eq(s.completed, 1);
  assert_elastic_consistent(&s);
  cr_assert_eq(s.elastic_spawned, 1);
  cr_assert_eq(tko_pool_destroy(seam_pool), 0);
}
