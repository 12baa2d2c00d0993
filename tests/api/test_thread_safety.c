/* SPDX-License-Identifier: MIT */
/* The thread-safety the headers state, for the calls whose statement was
 * missing: several threads waiting on one group at once, and tko_pool_stats
 * read from other threads (and from tasks) while producers submit.
 * (Pause and resume racing with submits: test_pause.) Nothing sleeps to
 * wait for something; every wait has a deadline that turns a hang into a
 * failure. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <taskorch.h>

#include "tko_test.h"
#include "tko_test_sync.h"

#define WAITERS 4

typedef struct group_waiter {
  tko_group *group;
  tt_count *ready; /* waiters about to wait */
  int rc;
} group_waiter;

static void *wait_on_group(void *arg) {
  group_waiter *w = arg;
  tt_count_add(w->ready, 1);
  w->rc = tko_group_wait(w->group, TT_LONG_MS);
  return NULL;
}

Test(thread_safety, several_threads_wait_on_one_group) {
  tko_options o = tko_basic_options(2);
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  tt_pin pin = TT_PIN_INIT;
  tko_group g;
  cr_assert_eq(tko_group_init(&g), 0);
  for (int i = 0; i < 2; i++) cr_assert_eq(tko_group_submit(p, &g, tt_pin_fn, &pin, 0), 0);
  cr_assert(tt_count_wait_geq(&pin.started, 2), "both members started");

  tt_count ready = TT_COUNT_INIT;
  group_waiter w[WAITERS];
  pthread_t t[WAITERS];
  for (int i = 0; i < WAITERS; i++) {
    w[i] = (group_waiter){.group = &g, .ready = &ready, .rc = 1};
    cr_assert_eq(pthread_create(&t[i], NULL, wait_on_group, &w[i]), 0);
  }
  cr_assert(tt_count_wait_geq(&ready, WAITERS));
  cr_assert_eq(tko_group_wait(&g, 0), -ETIMEDOUT, "members still running");
  cr_assert_eq(tko_group_pending(&g), 2);
  tt_gate_open(&pin.gate);
  for (int i = 0; i < WAITERS; i++) {
    cr_assert_eq(pthread_join(t[i], NULL), 0);
    cr_assert_eq(w[i].rc, 0, "waiter %d", i);
  }
  cr_assert_eq(tko_group_pending(&g), 0);
  cr_assert_eq(tko_group_status(&g), 0);
  cr_assert_eq(tko_group_destroy(&g), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

#define PRODUCERS 2
#define READERS 2
#define PER_PRODUCER TT_SCALE(20000, 2000)

typedef struct stats_run {
  tko_pool *pool;
  atomic_bool done;     /* producers finished */
  atomic_int bad;       /* a counter that went backwards */
  atomic_long in_tasks; /* stats reads made by tasks */
} stats_run;

/* A reader: counters only grow, whatever the submits and runs meanwhile. */
static void *read_stats(void *arg) {
  stats_run *r = arg;
  tko_stats last = {0};
  while (!atomic_load(&r->done)) {
    tko_stats s;
    tko_pool_stats(r->pool, &s);
    if (s.submitted < last.submitted || s.completed < last.completed) atomic_fetch_add(&r->bad, 1);
    last = s;
  }
  return NULL;
}

static int task_reads_stats(void *arg) {
  stats_run *r = arg;
  tko_stats s;
  tko_pool_stats(r->pool, &s);
  if (s.submitted == 0) atomic_fetch_add(&r->bad, 1); /* this task was submitted */
  atomic_fetch_add(&r->in_tasks, 1);
  return 0;
}

static void *produce(void *arg) {
  stats_run *r = arg;
  for (int i = 0; i < PER_PRODUCER; i++)
    if (tko_submit(r->pool, i % 64 ? tt_nop_fn : task_reads_stats, r, i % 4) != 0)
      atomic_fetch_add(&r->bad, 1);
  return NULL;
}

Test(thread_safety, stats_from_other_threads_and_tasks_while_submitting) {
  tko_options o = tko_basic_options(2);
  stats_run r = {.bad = 0, .in_tasks = 0};
  atomic_init(&r.done, false);
  cr_assert_eq(tko_pool_create(&r.pool, &o), 0);
  pthread_t prod[PRODUCERS], rd[READERS];
  for (int i = 0; i < READERS; i++) cr_assert_eq(pthread_create(&rd[i], NULL, read_stats, &r), 0);
  for (int i = 0; i < PRODUCERS; i++) cr_assert_eq(pthread_create(&prod[i], NULL, produce, &r), 0);
  for (int i = 0; i < PRODUCERS; i++) cr_assert_eq(pthread_join(prod[i], NULL), 0);
  cr_assert_eq(tko_pool_wait_idle(r.pool, TT_LONG_MS), 0);
  atomic_store(&r.done, true);
  for (int i = 0; i < READERS; i++) cr_assert_eq(pthread_join(rd[i], NULL), 0);
  cr_assert_eq(atomic_load(&r.bad), 0);
  tko_stats s;
  tko_pool_stats(r.pool, &s);
  cr_assert_eq(s.submitted, (uint64_t)PRODUCERS * PER_PRODUCER);
  cr_assert_eq(s.completed, s.submitted);
  cr_assert_eq(atomic_load(&r.in_tasks), (long)PRODUCERS * ((PER_PRODUCER + 63) / 64));
  cr_assert_eq(tko_pool_destroy(r.pool), 0);
}
