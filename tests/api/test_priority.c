/* SPDX-License-Identifier: MIT */
/* The priority contract with more than one worker and one queue (README,
 * semantics: tko_submit; several queues have the time bound instead,
 * test_queues.c): once a submit of weight w has returned, a lower-weight task
 * that starts while it is still queued was already taken by its worker
 * before that - part of a batch the worker holds. So the worker that
 * runs the heavier task starts at most max_batch lighter ones (the rest of
 * its batch), plus one whose start raced the return, between the submit's
 * return and the heavier task's start, however many are queued. (Another
 * worker may start more once the heavier task is taken, while its worker
 * is preempted: the task is then no longer queued.) Counted in starts,
 * not time: each task takes a ticket from one counter as it starts and
 * notes its thread. And, held step by step on one worker: a heavier task
 * submitted behind lighter ones already queued starts next. Public API
 * only. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "taskorch.h"
#include "tko_test.h"
#include "tko_test_sync.h"

enum { QUEUED = 4000 };

static atomic_long tickets;
static pthread_t ran_on[QUEUED + 1]; /* by ticket: the thread that started it */

typedef struct heavy {
  atomic_long ticket;
} heavy;

static long take_ticket(void) {
  long t = atomic_fetch_add(&tickets, 1);
  ran_on[t] = pthread_self();
  return t;
}

/* A light task: a ticket, then about a microsecond of work, so that the
 * queue stays long while the test submits the heavy one. */
static int light_fn(void *arg) {
  (void)arg;
  (void)take_ticket();
  for (volatile int i = 0; i < 200; i++) {
  }
  return 0;
}

static int heavy_fn(void *arg) {
  heavy *h = arg;
  atomic_store(&h->ticket, take_ticket());
  return 0;
}

static void overtakes(unsigned workers, unsigned max_batch, int light_weight, int heavy_weight) {
  tko_options o = tko_basic_options(workers);
  o.max_batch = max_batch;
  o.queues = 1; /* each take moves every submitted task into the queue */
  tko_pool *pool;
  cr_assert_eq(tko_pool_create(&pool, &o), 0);
  for (int round = 0; round < TT_SCALE(20, 4); round++) {
    atomic_store(&tickets, 0);
    for (int i = 0; i < QUEUED; i++) cr_assert_eq(tko_submit(pool, light_fn, NULL, light_weight), 0);
    heavy h;
    atomic_init(&h.ticket, -1);
    cr_assert_eq(tko_submit(pool, heavy_fn, &h, heavy_weight), 0);
    long at_return = atomic_load(&tickets);
    cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
    long heavy_at = atomic_load(&h.ticket);
    pthread_t heavy_on = ran_on[heavy_at];
    long between = 0; /* lighter starts on the heavy's worker after the return */
    for (long t = at_return; t < heavy_at; t++) between += pthread_equal(ran_on[t], heavy_on) != 0;
    cr_assert_leq(between, (long)max_batch + 1,
                  "round %d: the heavier task's worker started %ld lighter tasks after its "
                  "submit returned (at most %u already taken, and one racing the return)",
                  round, between, max_batch);
  }
  cr_assert_eq(tko_pool_destroy(pool), 0);
}

Test(priority, a_heavier_task_overtakes_all_but_the_batches_already_taken) {
  overtakes(2, 4, 0, 1);
}

Test(priority, the_bound_holds_with_full_batches_and_four_workers) {
  overtakes(4, 64, -5, 7);
}

/* One worker taking one task at a time, its queue holding lighter tasks: a
 * heavier task submitted meanwhile is the next it starts. Each take moves
 * what was submitted into the queue first, not only once the queue is
 * empty (else the heavier task would wait behind every lighter one queued
 * before it). Deterministic: the worker is held in a task at each step. */

Test(priority, a_heavier_task_submitted_behind_queued_lighter_ones_starts_next) {
  tko_options o = tko_basic_options(1);
  o.max_batch = 1;
  o.queues = 1;
  tko_pool *pool;
  cr_assert_eq(tko_pool_create(&pool, &o), 0);
  tt_pin first = TT_PIN_INIT, second = TT_PIN_INIT;
  atomic_store(&tickets, 0);
  cr_assert_eq(tko_submit(pool, tt_pin_fn, &first, 0), 0);
  cr_assert(tt_count_wait_geq(&first.started, 1), "the worker holds the first task");
  cr_assert_eq(tko_submit(pool, tt_pin_fn, &second, 0), 0);
  enum { LIGHT = 4 };
  for (int i = 0; i < LIGHT; i++) cr_assert_eq(tko_submit(pool, light_fn, NULL, 0), 0);
  tt_gate_open(&first.gate); /* its next take queues the second and the lights */
  cr_assert(tt_count_wait_geq(&second.started, 1), "the worker holds the second task");
  heavy h;
  atomic_init(&h.ticket, -1);
  cr_assert_eq(tko_submit(pool, heavy_fn, &h, 1), 0);
  tt_gate_open(&second.gate);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  cr_assert_eq(atomic_load(&tickets), LIGHT + 1);
  cr_assert_eq(atomic_load(&h.ticket), 0, "the heavier task started after %ld lighter ones",
               atomic_load(&h.ticket));
  cr_assert_eq(tko_pool_destroy(pool), 0);
}
