/* SPDX-License-Identifier: MIT */
/* The priority contract with more than one worker (README, semantics:
 * tko_submit): once a submit of weight w has returned, a lower-weight task
 * that starts while it is still queued was already taken by its worker
 * before that - part of a batch the worker holds - so at most
 * workers x max_batch lower-weight tasks start between the submit's return
 * and the heavier task's start, however many are queued. Counted in
 * starts, not time: each task takes a ticket from one counter as it
 * starts. Public API only. */
#include <stdatomic.h>
#include <stdint.h>

#include "taskorch.h"
#include "tko_test.h"
#include "tko_test_sync.h"

static atomic_long tickets;

typedef struct heavy {
  atomic_long ticket;
} heavy;

/* A light task: a ticket, then about a microsecond of work, so that the
 * queue stays long while the test submits the heavy one. */
static int light_fn(void *arg) {
  (void)arg;
  atomic_fetch_add(&tickets, 1);
  for (volatile int i = 0; i < 200; i++) {
  }
  return 0;
}

static int heavy_fn(void *arg) {
  heavy *h = arg;
  atomic_store(&h->ticket, atomic_fetch_add(&tickets, 1));
  return 0;
}

static void overtakes(unsigned workers, unsigned max_batch, int light_weight, int heavy_weight) {
  enum { QUEUED = 4000 };
  tko_options o = tko_basic_options(workers);
  o.max_batch = max_batch;
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
    long started_between = atomic_load(&h.ticket) - at_return;
    cr_assert_leq(started_between, (long)(workers * max_batch),
                  "round %d: %ld lighter tasks started after the heavier submit returned "
                  "(at most %u were already taken)",
                  round, started_between, workers * max_batch);
  }
  cr_assert_eq(tko_pool_destroy(pool), 0);
}

Test(priority, a_heavier_task_overtakes_all_but_the_batches_already_taken) {
  overtakes(2, 4, 0, 1);
}

Test(priority, the_bound_holds_with_full_batches_and_four_workers) {
  overtakes(4, 64, -5, 7);
}
