/* SPDX-License-Identifier: MIT */
/* A submitting thread's ring (ring.h) publishes a task by moving its tail
 * only after the task's slot is written: a drain reads every slot up to
 * the tail. The library's seam tko__test_publish_window (src/structures/inbox.h)
 * parks a ring submit just after its publish; meanwhile another submit
 * wakes a worker, whose take drains the ring, and the parked task must
 * run, once, as it was submitted (a slot read before it was written holds
 * nothing, or an older task). The parked submitter is released before
 * anything is asserted, so everything finishes either way. */
#include <pthread.h>
#include <stdatomic.h>

#include "internal.h"
#include "taskorch.h"
#include "tko_test.h"
#include "tko_test_sync.h"

static tt_count parked, parked_ran, nudged;
static tt_gate release = TT_GATE_INIT;
static _Thread_local bool park_me;
static atomic_int wrong_arg;
static int marker;

/* The seam: parks the thread that asked for it, once, after its publish. */
static void park_after_publish(uint64_t pos, bool published) {
  (void)pos;
  if (!park_me || !published) return;
  park_me = false;
  tt_count_add(&parked, 1);
  tt_gate_wait(&release);
}

static int parked_fn(void *arg) {
  if (arg != &marker) atomic_store(&wrong_arg, 1);
  tt_count_add(&parked_ran, 1);
  return 0;
}

static int nudge_fn(void *arg) {
  (void)arg;
  tt_count_add(&nudged, 1);
  return 0;
}

static void *submitter(void *arg) {
  tko_pool *p = arg;
  park_me = true;
  return (void *)(intptr_t)tko_submit(p, parked_fn, &marker, 0);
}

Test(ring_publish, a_published_slot_is_already_written) {
  tt_count_init(&parked);
  tt_count_init(&parked_ran);
  tt_count_init(&nudged);
  tko_options o = tko_basic_options(2); /* two workers: submits use rings */
  o.queues = 1;                         /* every ring drains into the one queue */
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  cr_assert(!p->rings.off, "the pool's submits do not use rings");
  atomic_store(&tko__test_publish_window, park_after_publish);
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, submitter, p), 0);
  cr_assert(tt_count_wait_eq(&parked, 1));
  /* Published, not yet signalled: a worker woken by another submit takes,
   * and its take drains the parked thread's ring too. */
  cr_assert_eq(tko_submit(p, nudge_fn, NULL, 0), 0);
  bool ran = tt_count_wait_geq_within(&parked_ran, 1, 20000);
  tt_gate_open(&release);
  void *rc;
  cr_assert_eq(pthread_join(t, &rc), 0);
  atomic_store(&tko__test_publish_window, NULL);
  cr_assert_eq((intptr_t)rc, 0);
  cr_assert(ran, "the parked submit's published task never ran");
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  cr_assert_eq(tt_count_get(&parked_ran), 1);
  cr_assert_eq(tt_count_get(&nudged), 1);
  cr_assert_eq(atomic_load(&wrong_arg), 0, "the parked task ran with another task's argument");
  cr_assert_eq(tko_pool_destroy(p), 0);
  tt_count_fini(&parked);
  tt_count_fini(&parked_ran);
  tt_count_fini(&nudged);
}
