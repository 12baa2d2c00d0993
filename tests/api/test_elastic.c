/* SPDX-License-Identifier: MIT */
/* Tests for elastic workers: the count never passes max_elastic while eight
 * threads submit blocking tasks, elastic-only pools run their tasks (also
 * when a submit races a retirement), and idle elastic workers retire back to
 * zero and to the process's original thread count, with
 * elastic_spawned == elastic_retired + elastic_workers. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "taskorch.h"
#include "tko_test.h"
#include "tko_test_sync.h"

/* What the hooks and tasks observe. */
typedef struct watch {
  tko_pool *pool;
  unsigned max_elastic;
  tt_count alive;      /* elastic threads between thread_start and thread_stop; keeps max */
  tt_count starts;     /* elastic thread_start calls */
  tt_count stops;      /* elastic thread_stop calls */
  tt_count running;    /* tasks inside gate_fn, keeps max */
  atomic_uint stats_max; /* most stats.elastic_workers a task saw */
  atomic_int bad_index;
  tt_gate gate;
  atomic_int gate_timed_out;
  atomic_long ran;
} watch;

static void watch_init(watch *w, unsigned max_elastic) {
  memset(w, 0, sizeof *w);
  w->max_elastic = max_elastic;
  tt_count_init(&w->alive);
  tt_count_init(&w->starts);
  tt_count_init(&w->stops);
  tt_count_init(&w->running);
  pthread_mutex_init(&w->gate.mu, NULL);
  pthread_cond_init(&w->gate.cv, NULL);
}

static void on_start(void *user, unsigned index, tko_worker_kind kind) {
  watch *w = user;
  if (kind != TKO_WORKER_ELASTIC) return;
  if (index >= w->max_elastic) atomic_store(&w->bad_index, 1);
  tt_count_add(&w->alive, 1);
  tt_count_add(&w->starts, 1);
}

static void on_stop(void *user, unsigned index, tko_worker_kind kind) {
  watch *w = user;
  if (kind != TKO_WORKER_ELASTIC) return;
  tt_count_add(&w->alive, -1);
  tt_count_add(&w->stops, 1);
}

static void note_stats(watch *w) {
  tko_stats s;
  tko_pool_stats(w->pool, &s);
  unsigned seen = atomic_load(&w->stats_max);
  while (s.elastic_workers > seen && !atomic_compare_exchange_weak(&w->stats_max, &seen, s.elastic_workers)) {
  }
}

/* A blocking task: counts itself running, then waits for the gate. */
static int gate_fn(void *arg) {
  watch *w = arg;
  note_stats(w);
  tt_count_add(&w->running, 1);
  if (!tt_gate_wait(&w->gate)) atomic_store(&w->gate_timed_out, 1);
  note_stats(w);
  tt_count_add(&w->running, -1);
  atomic_fetch_add(&w->ran, 1);
  return 0;
}

static int count_fn(void *arg) {
  atomic_fetch_add((atomic_long *)arg, 1);
  return 0;
}

static tko_options watched_options(watch *w, unsigned workers, unsigned max_elastic, unsigned idle_ms) {
  tko_options o = tko_elastic_options(workers, max_elastic, idle_ms);
  o.hooks.user = w;
  o.hooks.thread_start = on_start;
  o.hooks.thread_stop = on_stop;
  return o;
}

/* wait_idle waits for tasks, not threads: a spawn can still be on its way
 * when it returns (a submit or a worker created a thread that has not yet
 * counted itself spawned, or a retiring worker whose stop hook saw work is
 * taking its slot back). Such a thread finds nothing to do and retires. So
 * wait for a thread_stop per spawn, then read again, until two snapshots
 * agree and no elastic worker is left: figures read while a thread starts
 * could otherwise be one apart (CI saw elastic_workers 1 after every
 * counted thread had stopped). A thread counts itself spawned before its
 * thread_start hook runs, so starts read between two equal snapshots is
 * that snapshot's. */
static void wait_all_retired(watch *w, tko_stats *s) {
  cr_assert_eq(tko_pool_wait_idle(w->pool, TT_LONG_MS), 0);
  tko_stats again;
  long starts;
  for (int tries = 0;; tries++) {
    cr_assert_lt(tries, 1000, "elastic figures never settled");
    tko_pool_stats(w->pool, s);
    cr_assert(tt_count_wait_geq(&w->stops, (long)s->elastic_spawned), "elastic workers did not retire");
    starts = tt_count_get(&w->starts);
    tko_pool_stats(w->pool, &again);
    if (again.elastic_spawned == s->elastic_spawned && again.elastic_workers == 0 &&
        tt_count_get(&w->stops) == starts)
      break;
  }
  *s = again;
  cr_assert_eq(s->elastic_spawned, s->elastic_retired + s->elastic_workers);
  cr_assert_eq(starts, (long)s->elastic_spawned);
  cr_assert_eq(tt_count_get(&w->alive), 0);
}

typedef struct submitter {
  watch *w;
  int tasks;
  int rejected;
} submitter;

static void *submit_gated(void *arg) {
  submitter *s = arg;
  for (int i = 0; i < s->tasks; i++)
    if (tko_submit(s->w->pool, gate_fn, s->w, i % 3)) s->rejected++;
  return NULL;
}

Test(elastic, count_never_above_max_with_eight_submitters, .timeout = 120) {
  const unsigned max_elastic = 3, workers = 1;
  watch w;
  watch_init(&w, max_elastic);
  tko_options o = watched_options(&w, workers, max_elastic, 1);
  cr_assert_eq(tko_pool_create(&w.pool, &o), 0);
  const int rounds = TT_SCALE(20, 5), per_thread = 50;
  for (int r = 0; r < rounds; r++) {
    pthread_mutex_lock(&w.gate.mu);
    w.gate.open = false; /* every earlier task has returned (wait_all_retired) */
    pthread_mutex_unlock(&w.gate.mu);
    long ran_before = atomic_load(&w.ran);
    pthread_t th[8];
    submitter sub[8];
    for (int t = 0; t < 8; t++) {
      sub[t] = (submitter){&w, per_thread, 0};
      cr_assert_eq(pthread_create(&th[t], NULL, submit_gated, &sub[t]), 0);
    }
    for (int t = 0; t < 8; t++) {
      pthread_join(th[t], NULL);
      cr_assert_eq(sub[t].rejected, 0);
    }
    /* Blocked tasks pile up behind the busy basic worker, so at least one
     * elastic worker must have started and taken one. */
    cr_assert(tt_count_wait_geq(&w.running, workers + 1), "round %d: no elastic worker", r);
    /* With a backlog and every worker blocked, the pool grows to all its
     * threads (a dropped spawn request once stalled it below max_elastic:
     * see grows_to_max_under_backlog). */
    cr_assert(tt_count_wait_geq(&w.running, workers + max_elastic), "round %d: never reached max", r);
    tt_gate_open(&w.gate);
    tko_stats s;
    wait_all_retired(&w, &s);
    cr_assert_eq(atomic_load(&w.ran) - ran_before, 8 * per_thread);
    cr_assert_leq(tt_count_max(&w.running), workers + max_elastic);
  }
  cr_assert_eq(atomic_load(&w.gate_timed_out), 0);
  cr_assert_eq(atomic_load(&w.bad_index), 0);
  cr_assert_leq(tt_count_max(&w.alive), max_elastic, "more elastic threads alive than allowed");
  cr_assert_geq(tt_count_max(&w.alive), 1);
  cr_assert_leq(atomic_load(&w.stats_max), max_elastic, "stats.elastic_workers above the maximum");
  tko_stats s;
  tko_pool_stats(w.pool, &s);
  cr_assert_leq(s.elastic_peak, max_elastic);
  cr_assert_geq(s.elastic_peak, 1);
  cr_assert_geq(s.elastic_spawned, (uint64_t)rounds);
  cr_assert_eq(s.basic_workers, workers);
  cr_assert_eq(tko_pool_destroy(w.pool), 0);
}

Test(elastic, elastic_only_pool_runs_its_tasks) {
  watch w;
  watch_init(&w, 2);
  tko_options o = watched_options(&w, 0, 2, 1000);
  cr_assert_eq(tko_pool_create(&w.pool, &o), 0);
  tko_stats s;
  tko_pool_stats(w.pool, &s);
  cr_assert_eq(s.basic_workers, 0);
  atomic_long n = 0;
  for (int i = 0; i < 1000; i++) cr_assert_eq(tko_submit(w.pool, count_fn, &n, i % 4), 0);
  cr_assert_eq(tko_pool_wait_idle(w.pool, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&n), 1000);
  tko_pool_stats(w.pool, &s);
  cr_assert_eq(s.completed, 1000);
  cr_assert_geq(s.elastic_peak, 1);
  cr_assert_leq(s.elastic_peak, 2);
  cr_assert_eq(s.basic_workers, 0);
  cr_assert_eq(tko_pool_destroy(w.pool), 0);
  cr_assert_eq(tt_count_get(&w.alive), 0, "destroy stopped every elastic thread");
  cr_assert_eq(tt_count_get(&w.stops), tt_count_get(&w.starts));
}

Test(elastic, retire_to_zero_and_to_original_thread_count, .timeout = 120) {
  const unsigned max_elastic = 4;
  int baseline = tt_thread_count();
  cr_assert_gt(baseline, 0, "/proc/self/task is readable");
  watch w;
  watch_init(&w, max_elastic);
  tko_options o = watched_options(&w, 0, max_elastic, 5);
  cr_assert_eq(tko_pool_create(&w.pool, &o), 0);
  /* One blocking task at a time: each submit finds every worker blocked and
   * nobody searching, so each must start one more elastic worker. */
  for (unsigned k = 1; k <= max_elastic; k++) {
    cr_assert_eq(tko_submit(w.pool, gate_fn, &w, (int)k), 0);
    cr_assert(tt_count_wait_geq(&w.running, (long)k), "elastic worker %u never started", k);
  }
  for (int i = 0; i < 36; i++) cr_assert_eq(tko_submit(w.pool, gate_fn, &w, i), 0);
  cr_assert_geq(tt_thread_count(), baseline + (int)max_elastic);
  tko_stats s;
  tko_pool_stats(w.pool, &s);
  cr_assert_eq(s.elastic_workers, max_elastic);
  tt_gate_open(&w.gate);
  wait_all_retired(&w, &s);
  cr_assert_eq(s.elastic_retired, s.elastic_spawned);
  cr_assert_geq(s.elastic_spawned, max_elastic);
  cr_assert_eq(atomic_load(&w.ran), 40);
  /* Retired threads have exited; the kernel drops them from /proc soon. */
  int now = tt_wait_thread_count_leq(baseline);
  cr_assert_leq(now, baseline, "threads left after retirement: %d, baseline %d", now, baseline);
  /* A pool with no thread left still takes and runs work. */
  atomic_long n = 0;
  cr_assert_eq(tko_submit(w.pool, count_fn, &n, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(w.pool, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&n), 1);
  wait_all_retired(&w, &s);
  cr_assert_eq(tko_pool_destroy(w.pool), 0);
  now = tt_wait_thread_count_leq(baseline);
  cr_assert_leq(now, baseline);
  cr_assert_eq(atomic_load(&w.gate_timed_out), 0);
}

Test(elastic, elastic_only_submit_after_full_retirement, .timeout = 120) {
  watch w;
  watch_init(&w, 2);
  tko_options o = watched_options(&w, 0, 2, 1);
  cr_assert_eq(tko_pool_create(&w.pool, &o), 0);
  atomic_long n = 0;
  const int rounds = TT_SCALE(200, 40);
  for (int r = 0; r < rounds; r++) {
    cr_assert_eq(tko_submit(w.pool, count_fn, &n, r), 0);
    cr_assert_eq(tko_pool_wait_idle(w.pool, TT_LONG_MS), 0, "round %d: task lost", r);
    cr_assert_eq(atomic_load(&n), r + 1);
    tko_stats s;
    /* The next submit finds no thread at all (the retired one may not be
     * joined yet): it must start one. */
    wait_all_retired(&w, &s);
  }
  cr_assert_eq(tko_pool_destroy(w.pool), 0);
}

Test(elastic, elastic_only_submit_racing_retirement, .timeout = 120) {
  /* Submits land at random points around the 1 ms idle timeout, so some
   * arrive while the only elastic worker is deciding to retire. A task lost
   * in that window hangs wait_idle, which fails the test. The busy-wait is
   * jitter to hit the window, not a wait for anything. */
  watch w;
  watch_init(&w, 1);
  tko_options o = watched_options(&w, 0, 1, 1);
  cr_assert_eq(tko_pool_create(&w.pool, &o), 0);
  atomic_long n = 0;
  uint64_t seed = 99;
  const int cycles = TT_SCALE(600, 150);
  for (int i = 0; i < cycles; i++) {
    tt_spin_ns(tt_rand(&seed) % 1500000u);
    cr_assert_eq(tko_submit(w.pool, count_fn, &n, 0), 0);
    cr_assert_eq(tko_pool_wait_idle(w.pool, TT_LONG_MS), 0, "cycle %d: task lost", i);
  }
  cr_assert_eq(atomic_load(&n), cycles);
  tko_stats s;
  wait_all_retired(&w, &s);
  cr_assert_leq(s.elastic_peak, 1);
  cr_assert_eq(tko_pool_destroy(w.pool), 0);
}

typedef struct burst {
  watch *w;
  atomic_long *n;
  int count, rejected;
} burst;

/* Submits in bursts of 64 and waits for idle between them (several
 * submitters wait at once), so workers keep going idle and coming back. */
static void *submit_bursts(void *arg) {
  burst *b = arg;
  for (int i = 0; i < b->count; i++) {
    if (tko_submit(b->w->pool, count_fn, b->n, i % 5)) b->rejected++;
    if (i % 64 == 63 && tko_pool_wait_idle(b->w->pool, TT_LONG_MS)) b->rejected++;
    if (i % 256 == 0) note_stats(b->w);
  }
  return NULL;
}

Test(elastic, counts_balance_under_concurrent_load, .timeout = 120) {
  watch w;
  watch_init(&w, 2);
  tko_options o = watched_options(&w, 1, 2, 1);
  cr_assert_eq(tko_pool_create(&w.pool, &o), 0);
  atomic_long n = 0;
  const int per_thread = TT_SCALE(20000, 2000);
  burst b[8];
  pthread_t th[8];
  for (int t = 0; t < 8; t++) {
    b[t] = (burst){&w, &n, per_thread, 0};
    cr_assert_eq(pthread_create(&th[t], NULL, submit_bursts, &b[t]), 0);
  }
  for (int t = 0; t < 8; t++) {
    pthread_join(th[t], NULL);
    cr_assert_eq(b[t].rejected, 0);
  }
  tko_stats s;
  wait_all_retired(&w, &s);
  cr_assert_eq(atomic_load(&n), 8L * per_thread);
  cr_assert_eq(s.completed, 8ull * per_thread);
  cr_assert_leq(s.elastic_peak, 2);
  cr_assert_leq(tt_count_max(&w.alive), 2);
  cr_assert_leq(atomic_load(&w.stats_max), 2);
  cr_assert_eq(atomic_load(&w.bad_index), 0);
  cr_assert_eq(tko_pool_destroy(w.pool), 0);
}

/* Regression: tko__elastic_spawn once only trylocked spawn_mu, so a worker
 * that was just spawned, found work and asked for one more worker while its
 * spawner still held spawn_mu had its request dropped; the pool then stayed
 * below max_elastic with a backlog while every worker blocked. Every round's
 * blocked tasks must end up on 1 + max_elastic threads. */
Test(elastic, grows_to_max_under_backlog, .timeout = 300) {
  const unsigned max_elastic = 3, workers = 1;
  watch w;
  watch_init(&w, max_elastic);
  tko_options o = watched_options(&w, workers, max_elastic, 1);
  cr_assert_eq(tko_pool_create(&w.pool, &o), 0);
  const int rounds = TT_SCALE(300, 30);
  for (int r = 0; r < rounds; r++) {
    pthread_mutex_lock(&w.gate.mu);
    w.gate.open = false;
    pthread_mutex_unlock(&w.gate.mu);
    pthread_t th[8];
    submitter sub[8];
    for (int t = 0; t < 8; t++) {
      sub[t] = (submitter){&w, 50, 0};
      cr_assert_eq(pthread_create(&th[t], NULL, submit_gated, &sub[t]), 0);
    }
    for (int t = 0; t < 8; t++) pthread_join(th[t], NULL);
    bool full = tt_count_wait_geq(&w.running, workers + max_elastic);
    tt_gate_open(&w.gate);
    cr_assert(full, "round %d: stalled below max_elastic with a backlog", r);
    tko_stats s;
    wait_all_retired(&w, &s);
  }
  cr_assert_eq(tko_pool_destroy(w.pool), 0);
}

/* A submit never waits for a thread_stop hook: a hook may wait for
 * anything, here a lock that the submitting task holds. The scene: the one
 * basic worker runs a task that holds the host's lock M; the elastic worker
 * retires and its stop hook blocks on M; then the task submits, and with
 * the basic worker busy that submit spawns into the retired worker's slot.
 * A spawner that joined the old thread there would wait for the hook,
 * which waits for the task: a deadlock. */
typedef struct stop_hold {
  pthread_mutex_t m;
  tt_gate submit_now;
  tt_count holding, in_hook, ran;
} stop_hold;

static void stop_takes_m(void *user, unsigned index, tko_worker_kind kind) {
  (void)index;
  stop_hold *s = user;
  if (kind != TKO_WORKER_ELASTIC) return;
  tt_count_add(&s->in_hook, 1);
  pthread_mutex_lock(&s->m);
  pthread_mutex_unlock(&s->m);
}

static int count_run(void *arg) {
  tt_count_add(&((stop_hold *)arg)->ran, 1);
  return 0;
}

static tko_pool *hold_pool;

static int submit_holding_m(void *arg) {
  stop_hold *s = arg;
  pthread_mutex_lock(&s->m);
  tt_count_add(&s->holding, 1);
  tt_gate_wait(&s->submit_now);
  int rc = tko_submit(hold_pool, count_run, s, 0); /* spawns: the basic worker is here */
  pthread_mutex_unlock(&s->m);
  return rc;
}

Test(elastic, a_submit_never_waits_for_a_stop_hook) {
  stop_hold s = {.m = PTHREAD_MUTEX_INITIALIZER, .submit_now = TT_GATE_INIT,
                 .holding = TT_COUNT_INIT, .in_hook = TT_COUNT_INIT, .ran = TT_COUNT_INIT};
  tko_options o = tko_elastic_options(1, 1, 1);
  o.hooks.user = &s;
  o.hooks.thread_stop = stop_takes_m;
  cr_assert_eq(tko_pool_create(&hold_pool, &o), 0);
  cr_assert_eq(tko_submit(hold_pool, submit_holding_m, &s, 0), 0);
  cr_assert(tt_count_wait_geq(&s.holding, 1)); /* the basic worker is taken, M held */
  /* The elastic worker: started for this task, then idle for 1 ms, it
   * retires, and its stop hook waits for M. */
  cr_assert_eq(tko_submit(hold_pool, count_run, &s, 0), 0);
  cr_assert(tt_count_wait_geq(&s.in_hook, 1));
  tt_gate_open(&s.submit_now);
  /* The task's submit returns, M is released, the hook ends, and the task
   * submitted runs on the slot's new thread. */
  cr_assert(tt_count_wait_geq(&s.ran, 2), "the submit waited for the stop hook");
  cr_assert_eq(tko_pool_wait_idle(hold_pool, TT_LONG_MS), 0);
  cr_assert_eq(tko_pool_destroy(hold_pool), 0);
}
