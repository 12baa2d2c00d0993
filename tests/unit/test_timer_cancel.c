/* SPDX-License-Identifier: MIT */
/* tko_timer_cancel against the pool's destroy (src/features/timer.c, the
 * essay's last paragraph). A cancel has no pool argument and may come at
 * any time (taskorch.h); one that found its timer armed takes the pool's
 * timer_mu. The scene parks such a cancel just before that lock (a test
 * seam, as a preemption would), then shuts the pool down and destroys it
 * on another thread: the shutdown disarms the timer, and the destroy must
 * wait for the parked cancel before the pool's memory goes, since the
 * cancel is about to take a mutex inside it. */
#include <errno.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>
#include <stdatomic.h>

#include "taskorch.h"
#include "tko_test.h"
#include "tko_test_feature.h"
#include "tko_test_sync.h"

extern void (*_Atomic tko__test_timer_cancel_window)(bool counted);
extern void (*_Atomic tko__test_timer_grace_window)(void);

static tt_gate cancel_gate = TT_GATE_INIT;
static tt_count cancel_parked = TT_COUNT_INIT;
/* What happened first once the cancel was parked: the destroy waited for
 * it (grace), or the destroy returned. */
static tt_count events = TT_COUNT_INIT;
static atomic_bool destroy_waited, destroy_returned;

/* Parks the cancel once counted and still armed, before timer_mu. */
static void park_cancel(bool counted) {
  if (!counted) return;
  tt_count_add(&cancel_parked, 1);
  (void)tt_gate_wait(&cancel_gate);
}

static void note_grace(void) {
  atomic_store(&destroy_waited, true);
  tt_count_add(&events, 1);
}

/* Each scene starts from a clean slate: the sanitizer flavours run every
 * test of a file in one process. */
static void reset(void) {
  cancel_gate.open = false;
  tt_count_init(&cancel_parked);
  tt_count_init(&events);
  atomic_store(&destroy_waited, false);
  atomic_store(&destroy_returned, false);
}

static int nothing(void *arg) {
  (void)arg;
  return 0;
}

static int cancel(void *timer) { return tko_timer_cancel(timer); }

/* A one-worker pool (with allocator a, NULL for the default) and a timer
 * armed on it for an hour: it stays armed for the whole scene. */
static tko_pool *pool_with_an_armed_timer(tko_timer *timer, const tko_allocator *a) {
  reset();
  tko_options o = tko_basic_options(1);
  o.allocator = a;
  tko_pool *pool;
  cr_assert_eq(tko_pool_create(&pool, &o), 0);
  tko_timer_init(timer);
  cr_assert_eq(tko_submit_after(pool, timer, 3600 * 1000, nothing, NULL, 0), 0);
  return pool;
}

static int shut_down_and_destroy(void *pool) {
  int rc = tko_pool_shutdown(pool, TKO_DRAIN);
  if (rc == 0) rc = tko_pool_destroy(pool);
  atomic_store(&destroy_returned, true);
  tt_count_add(&events, 1);
  return rc;
}

Test(timer_cancel, a_destroy_waits_for_a_cancel_that_found_its_timer_armed) {
  tko_timer timer;
  tko_pool *pool = pool_with_an_armed_timer(&timer, NULL);
  atomic_store(&tko__test_timer_cancel_window, park_cancel);
  atomic_store(&tko__test_timer_grace_window, note_grace);
  tf_thread canceller, destroyer;
  cr_assert_eq(tf_thread_start(&canceller, cancel, &timer), 0);
  cr_assert(tt_count_wait_geq(&cancel_parked, 1), "the cancel did not find its timer armed");
  cr_assert_eq(tf_thread_start(&destroyer, shut_down_and_destroy, pool), 0);
  cr_assert(tt_count_wait_geq(&events, 1), "the destroy neither waited nor returned");
  cr_assert_not(atomic_load(&destroy_returned),
                "the destroy returned while a cancel was about to lock the pool's timer_mu");
  cr_assert(atomic_load(&destroy_waited));
  tt_gate_open(&cancel_gate);
  int rc = 0;
  cr_assert(tf_thread_join(&canceller, &rc));
  cr_assert_eq(rc, -ENOENT, "the shutdown disarmed the timer first: %d", rc);
  cr_assert(tf_thread_join(&destroyer, &rc));
  cr_assert_eq(rc, 0);
  atomic_store(&tko__test_timer_cancel_window, NULL);
  atomic_store(&tko__test_timer_grace_window, NULL);
  /* After the destroy a cancel leaves the pool alone (taskorch.h). */
  cr_assert_eq(tko_timer_cancel(&timer), -ENOENT);
}

/* A cancel that counted itself and won: its timer is disarmed, and a
 * destroy after it does not wait (nothing is in flight). */
Test(timer_cancel, a_cancel_of_an_armed_timer_disarms_it_and_leaves_no_count) {
  tko_timer timer;
  tko_pool *pool = pool_with_an_armed_timer(&timer, NULL);
  cr_assert_eq(tko_timer_cancel(&timer), 0);
  cr_assert_eq(tko_timer_cancel(&timer), -ENOENT);
  atomic_store(&tko__test_timer_grace_window, note_grace);
  cr_assert_eq(tko_pool_shutdown(pool, TKO_DRAIN), 0);
  cr_assert_eq(tko_pool_destroy(pool), 0);
  atomic_store(&tko__test_timer_grace_window, NULL);
  cr_assert_not(atomic_load(&destroy_waited), "a finished cancel was still counted in flight");
}

/* An allocator whose frees poison the block and keep it until the test
 * ends: a call that reaches into a destroyed pool reads the poison (its
 * fork check then fails: -ECHILD) instead of memory the C library may
 * have handed out again. */
enum { KEPT_MAX = 256 };
static void *kept[KEPT_MAX];
static atomic_int nkept;

static void *poison_alloc(void *ctx, size_t size) {
  (void)ctx;
  return malloc(size);
}

static void *poison_realloc(void *ctx, void *p, size_t size) {
  (void)ctx;
  return realloc(p, size);
}

static void poison_free(void *ctx, void *p) {
  (void)ctx;
  if (!p) return;
  int i = atomic_fetch_add(&nkept, 1);
  if (i >= KEPT_MAX) {
    free(p);
    return;
  }
  memset(p, 0xa5, malloc_usable_size(p));
  kept[i] = p;
}

static const tko_allocator poisoning = {poison_alloc, poison_realloc, poison_free, NULL};

/* Parks the cancel after it found its timer armed, before it counts
 * itself: a preemption there. */
static void park_before_count(bool counted) {
  if (counted) return;
  tt_count_add(&cancel_parked, 1);
  (void)tt_gate_wait(&cancel_gate);
}

/* A cancel that found its timer armed but was stopped before it counted
 * itself, while the pool was shut down and destroyed: counted at last, it
 * reads the state again, finds the timer disarmed, and leaves the pool's
 * memory alone. */
Test(timer_cancel, a_cancel_counted_after_the_destroy_leaves_the_pool_alone) {
  tko_timer timer;
  tko_pool *pool = pool_with_an_armed_timer(&timer, &poisoning);
  atomic_store(&tko__test_timer_cancel_window, park_before_count);
  tf_thread canceller;
  cr_assert_eq(tf_thread_start(&canceller, cancel, &timer), 0);
  cr_assert(tt_count_wait_geq(&cancel_parked, 1), "the cancel did not find its timer armed");
  cr_assert_eq(tko_pool_shutdown(pool, TKO_DRAIN), 0);
  cr_assert_eq(tko_pool_destroy(pool), 0); /* nothing counted: no wait */
  tt_gate_open(&cancel_gate);
  int rc = 0;
  cr_assert(tf_thread_join(&canceller, &rc));
  cr_assert_eq(rc, -ENOENT, "the cancel reached into the destroyed pool: %d", rc);
  atomic_store(&tko__test_timer_cancel_window, NULL);
  for (int i = 0; i < atomic_load(&nkept) && i < KEPT_MAX; i++) free(kept[i]);
}
