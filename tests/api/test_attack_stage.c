/* SPDX-License-Identifier: MIT */
/* Attack scenes for pools of several queues, whose workers copy submitted
 * tasks before they lock a queue (docs/DESIGN.md: the stage), through the
 * public API only: floods of single and batch submits from many threads,
 * with tko_pool_trim called in a loop beside them (a trim frees the
 * submitters' spare buffers); waves of short-lived submitting threads,
 * whose buffers later threads take over, with trims between the waves;
 * and group cancels racing with the workers' takes. Every task has a slot
 * of its own: each accepted task must run, or reach on_cancel, exactly
 * once, with its own argument. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include <taskorch.h>

#include "tko_test.h"
#include "tko_test_sync.h"

enum { WORKERS = 4, PRODUCERS = 8 };

typedef struct slot {
  atomic_int ran, cancelled;
} slot;

static slot *slots;
static atomic_int wrong;

static int run_slot(void *arg) {
  slot *s = arg;
  if (s < slots) atomic_store(&wrong, 1);
  atomic_fetch_add(&s->ran, 1);
  return 0;
}

static void cancel_slot(void *user, const tko_task_info *task) {
  (void)user;
  atomic_fetch_add(&((slot *)task->arg)->cancelled, 1);
}

static tko_pool *staging_pool(void) {
  tko_options o = tko_basic_options(WORKERS);
  o.queues = WORKERS; /* a queue per worker, as a build may default to one */
  o.hooks.on_cancel = cancel_slot;
  tko_pool *pool;
  cr_assert_eq(tko_pool_create(&pool, &o), 0);
  return pool;
}

/* Each slot ran or was cancelled exactly once. */
static void expect_each_once(long n) {
  cr_assert_eq(atomic_load(&wrong), 0, "a task ran with an argument not its own");
  for (long i = 0; i < n; i++) {
    int ran = atomic_load(&slots[i].ran), cancelled = atomic_load(&slots[i].cancelled);
    cr_assert_eq(ran + cancelled, 1, "task %ld ran %d times and was cancelled %d times", i, ran,
                 cancelled);
  }
}

typedef struct producer {
  tko_pool *pool;
  long first, n;
  tko_group *group; /* NULL: plain submits */
  int bad;
} producer;

/* Submits slots [first, first + n): singles and batches of up to 300,
 * weights 0-3 interleaved. */
static void *produce(void *arg) {
  producer *p = arg;
  tko_task batch[300];
  for (long i = p->first; i < p->first + p->n;) {
    long k = (i / 7) % 3 == 0 ? (i % 300) + 1 : 1;
    if (k > p->first + p->n - i) k = p->first + p->n - i;
    if (p->group) {
      if (tko_group_submit(p->pool, p->group, run_slot, &slots[i], (int)(i & 3))) p->bad++;
      i++;
      continue;
    }
    if (k == 1) {
      if (tko_submit(p->pool, run_slot, &slots[i], (int)(i & 3))) p->bad++;
      i++;
      continue;
    }
    for (long j = 0; j < k; j++) batch[j] = (tko_task){run_slot, &slots[i + j], (int)((i + j) & 3)};
    if (tko_submit_batch(p->pool, batch, (size_t)k)) p->bad++;
    i += k;
  }
  return NULL;
}

static atomic_bool stop_trims;

static void *trim_in_a_loop(void *arg) {
  while (!atomic_load(&stop_trims)) cr_assert_eq(tko_pool_trim(arg), 0);
  return NULL;
}

static void run_producers(tko_pool *pool, long per, long base, tko_group *group) {
  pthread_t t[PRODUCERS];
  producer p[PRODUCERS];
  for (int i = 0; i < PRODUCERS; i++) {
    p[i] = (producer){pool, base + i * per, per, group, 0};
    cr_assert_eq(pthread_create(&t[i], NULL, produce, &p[i]), 0);
  }
  for (int i = 0; i < PRODUCERS; i++) {
    cr_assert_eq(pthread_join(t[i], NULL), 0);
    cr_assert_eq(p[i].bad, 0, "a submit was refused");
  }
}

Test(attack_stage, floods_beside_trims_in_a_loop_run_every_task_once) {
  const long per = TT_SCALE(20000, 3000), n = per * PRODUCERS;
  slots = calloc((size_t)n, sizeof *slots);
  cr_assert_not_null(slots);
  tko_pool *pool = staging_pool();
  atomic_store(&stop_trims, false);
  pthread_t trimmers[2];
  for (int i = 0; i < 2; i++) cr_assert_eq(pthread_create(&trimmers[i], NULL, trim_in_a_loop, pool), 0);
  run_producers(pool, per, 0, NULL);
  cr_assert_eq(tko_pool_wait_idle(pool, TT_LONG_MS), 0);
  atomic_store(&stop_trims, true);
  for (int i = 0; i < 2; i++) cr_assert_eq(pthread_join(trimmers[i], NULL), 0);
  expect_each_once(n);
  tko_stats st;
  tko_pool_stats(pool, &st);
  cr_assert_eq(st.completed, (uint64_t)n);
  cr_assert_eq(tko_pool_destroy(pool), 0);
  free(slots);
}

Test(attack_stage, waves_of_short_lived_submitters_with_trims_between_run_every_task_once) {
  const long per = TT_SCALE(2000, 400), waves = TT_SCALE(20, 6), n = per * PRODUCERS * waves;
  slots = calloc((size_t)n, sizeof *slots);
  cr_assert_not_null(slots);
  tko_pool *pool = staging_pool();
  for (long w = 0; w < waves; w++) {
    /* Every other wave is left to run while the next one submits. */
    run_producers(pool, per, w * per * PRODUCERS, NULL);
    if (w % 2) {
      cr_assert_eq(tko_pool_wait_idle(pool, TT_LONG_MS), 0);
      cr_assert_eq(tko_pool_trim(pool), 0);
    }
  }
  cr_assert_eq(tko_pool_wait_idle(pool, TT_LONG_MS), 0);
  expect_each_once(n);
  cr_assert_eq(tko_pool_destroy(pool), 0);
  free(slots);
}

Test(attack_stage, group_cancels_racing_the_takes_run_or_cancel_each_task_once) {
  const long per = TT_SCALE(5000, 800), rounds = TT_SCALE(10, 3), n = per * PRODUCERS;
  slots = calloc((size_t)n, sizeof *slots);
  cr_assert_not_null(slots);
  for (long r = 0; r < rounds; r++) {
    for (long i = 0; i < n; i++) {
      atomic_store(&slots[i].ran, 0);
      atomic_store(&slots[i].cancelled, 0);
    }
    tko_pool *pool = staging_pool();
    tko_group g;
    cr_assert_eq(tko_group_init(&g), 0);
    pthread_t t[PRODUCERS];
    producer p[PRODUCERS];
    for (int i = 0; i < PRODUCERS; i++) {
      p[i] = (producer){pool, i * per, per, &g, 0};
      cr_assert_eq(pthread_create(&t[i], NULL, produce, &p[i]), 0);
    }
    /* Cancels while the members are submitted and taken. */
    for (int c = 0; c < 20; c++) cr_assert_geq(tko_group_cancel(&g), 0);
    for (int i = 0; i < PRODUCERS; i++) {
      cr_assert_eq(pthread_join(t[i], NULL), 0);
      cr_assert_eq(p[i].bad, 0);
    }
    cr_assert_geq(tko_group_cancel(&g), 0);
    cr_assert_eq(tko_group_wait(&g, TT_LONG_MS), 0);
    cr_assert_eq(tko_pool_wait_idle(pool, TT_LONG_MS), 0);
    expect_each_once(n);
    cr_assert_eq(tko_group_destroy(&g), 0);
    cr_assert_eq(tko_pool_destroy(pool), 0);
  }
  free(slots);
}
