/* SPDX-License-Identifier: MIT */
/* White-box checks of admission's chunks (src/engine/admit.c): a lease never
 * takes room_taken past the capacity (chunks shrink near the bound, to
 * nothing at it); a full queue has taken every lease back; and once the
 * pool is idle, room_taken holds exactly the give-backs workers have
 * gathered and not settled - no room is lost or counted twice. */
#include <pthread.h>
#include <stdatomic.h>

#include "internal.h"
#include "taskorch.h"
#include "tko_test.h"
#include "tko_test_feature.h"
#include "tko_test_sync.h"

enum { CAP = 256, THREADS = 8, PER = 20 };

static int nothing(void *arg) {
  (void)arg;
  return 0;
}

static size_t taken(tko_pool *pool) { return atomic_load(&pool->room_taken); }

static size_t credits(tko_pool *pool) {
  size_t sum = 0;
  for (unsigned i = 0; i < atomic_load(&pool->rings.count); i++)
    sum += atomic_load(&pool->rings.ring[i]->credits);
  return sum;
}

static size_t unsettled(tko_pool *pool) {
  size_t sum = 0;
  for (unsigned i = 0; i < pool->nslots; i++)
    sum += atomic_load(&pool->slots[i].room_given) - atomic_load(&pool->slots[i].room_settled);
  return sum;
}

typedef struct submitter {
  tko_pool *pool;
  int bad;
} submitter;

static void *submit_some(void *arg) {
  submitter *s = arg;
  for (int i = 0; i < PER; i++) {
    if (tko_submit(s->pool, nothing, NULL, 0)) s->bad++;
    if (taken(s->pool) > CAP) s->bad++;
  }
  return NULL;
}

Test(admit, leases_stay_within_the_bound_and_all_room_comes_back) {
  tko_options o = tko_basic_options(4);
  o.queue_capacity = CAP;
  o.full_policy = TKO_FULL_REJECT;
  tko_pool *pool;
  cr_assert_eq(tko_pool_create(&pool, &o), 0);
  cr_assert_eq(tko_pool_pause(pool), 0);
  /* One thread after another: each leases beside its submits. */
  for (int t = 0; t < THREADS; t++) {
    submitter s = {pool, 0};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, submit_some, &s), 0);
    cr_assert_eq(pthread_join(th, NULL), 0);
    cr_assert_eq(s.bad, 0, "a lease took room_taken past the capacity (thread %d)", t);
  }
  cr_assert_gt(credits(pool), 0, "the threads leased room ahead");
  int n = THREADS * PER, rc;
  while ((rc = tko_submit(pool, nothing, NULL, 0)) == 0) {
    n++;
    cr_assert_leq(taken(pool), CAP);
  }
  cr_assert_eq(rc, -EAGAIN);
  cr_assert_eq(n, CAP, "the queue took %d of %d", n, CAP);
  cr_assert_eq(taken(pool), CAP);
  cr_assert_eq(credits(pool), 0, "a full queue has taken every lease back");
  cr_assert_eq(tko_pool_resume(pool), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  /* Idle: nothing queued, no lease out; what room_taken still holds is
   * exactly what workers gathered and have not settled. */
  cr_assert_eq(credits(pool), 0);
  cr_assert_eq(taken(pool), unsettled(pool));
  cr_assert_eq(tko_pool_destroy(pool), 0);
}

/* A settle parked between its two steps (the seam): its room is in
 * neither place - marked settled, not yet subtracted. A REJECT submit
 * that comes then must wait for it rather than refuse (room_moving), and
 * gets in once the settle finishes. Found by review: without that wait
 * the submit was refused with the queue empty. */
static tt_gate settle_gate;
static tt_count settle_parked;

static void park_settle(void) {
  tt_count_add(&settle_parked, 1);
  (void)tt_gate_wait(&settle_gate);
}

static int nothing_fn(void *arg) {
  (void)arg;
  return 0;
}

static int submit_reject(void *arg) { return tko_submit((tko_pool *)arg, nothing_fn, NULL, 0); }

enum { SETTLE_CAP = 64 };

/* A one-worker pool of capacity SETTLE_CAP and the given policy, its queue
 * filled with SETTLE_CAP tasks of fn while paused, then resumed until the
 * worker parks inside the settle of its first chunk: the room of that
 * chunk is on its way back (room_moving), the queue still counted full. */
static tko_pool *pool_with_a_parked_settle(tko_full_policy policy, tko_task_fn fn) {
  tko_options o = tko_basic_options(1);
  o.queue_capacity = SETTLE_CAP;
  o.full_policy = policy;
  tko_pool *pool;
  cr_assert_eq(tko_pool_create(&pool, &o), 0);
  /* One task: its room goes straight back, and the worker's chunk is now
   * SETTLE_CAP / 4 = 16 give-backs. */
  cr_assert_eq(tko_submit(pool, nothing_fn, NULL, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  cr_assert_eq(tko_pool_pause(pool), 0);
  for (int i = 0; i < SETTLE_CAP; i++) cr_assert_eq(tko_submit(pool, fn, NULL, 0), 0);
  cr_assert_eq(taken(pool), SETTLE_CAP, "the queue is full");
  pthread_mutex_init(&settle_gate.mu, NULL);
  pthread_cond_init(&settle_gate.cv, NULL);
  settle_gate.open = false;
  tt_count_init(&settle_parked);
  atomic_store(&tko__test_settle_window, park_settle);
  cr_assert_eq(tko_pool_resume(pool), 0);
  cr_assert(tt_count_wait_geq(&settle_parked, 1), "the worker never settled a chunk");
  atomic_store(&tko__test_settle_window, NULL);
  return pool;
}

Test(admit, a_submit_waits_for_room_a_settle_is_moving_rather_than_refuse) {
  tko_pool *pool = pool_with_a_parked_settle(TKO_FULL_REJECT, nothing_fn);
  tf_thread t;
  cr_assert_eq(tf_thread_start(&t, submit_reject, pool), 0);
  int rc = -1;
  /* Refused at once, the submit would be back within this bound. */
  bool back = tf_thread_join_within(&t, 200, &rc);
  cr_assert_not(back && rc == -EAGAIN, "refused while room was on its way back");
  tt_gate_open(&settle_gate);
  if (!back) cr_assert(tf_thread_join(&t, &rc));
  cr_assert_eq(rc, 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  cr_assert_eq(tko_pool_destroy(pool), 0);
}

/* A caller-runs submit that found the bounded queue full while a settle
 * was moving room waits for that move inside the pool's gate. If the move
 * brought back room that another submit took first, the queue is still
 * full and the task runs on the caller, which enters the gate again for
 * it: the wait's entry must be left by then, or shutdown waits for it for
 * ever.
 * The scene: the worker parks inside a settle (room_moving); the
 * caller-runs submit parks just before it sleeps; the settle ends and the
 * worker is held in its next task; the test fills the room the settle
 * brought back; the submit wakes to a full queue with nothing moving. */
static tt_gate asleep_gate = TT_GATE_INIT;
static tt_count asleep_parked = TT_COUNT_INIT;
static tt_pin held = TT_PIN_INIT;
static atomic_bool hold;

static void park_asleep(enum tko__admit_point at) {
  if (at != TKO__ADMIT_ASLEEP) return;
  tt_count_add(&asleep_parked, 1);
  (void)tt_gate_wait(&asleep_gate);
}

/* The queued tasks: once hold is set, the one that starts holds the worker. */
static int maybe_hold(void *arg) {
  (void)arg;
  return atomic_load(&hold) ? tt_pin_fn(&held) : 0;
}

static int submit_caller_runs(void *arg) { return tko_submit((tko_pool *)arg, nothing_fn, NULL, 0); }

/* Submits from this thread until one runs here: the queue is then full
 * and this thread holds no credits (a submit spends its own first). */
static void fill_until_a_caller_run(tko_pool *pool) {
  tko_stats s;
  tko_pool_stats(pool, &s);
  uint64_t before = s.caller_runs;
  for (int i = 0; s.caller_runs == before; i++) {
    cr_assert_lt(i, 1000, "the bounded queue never filled");
    cr_assert_eq(tko_submit(pool, nothing_fn, NULL, 0), 0);
    tko_pool_stats(pool, &s);
  }
}

Test(admit, a_caller_runs_submit_that_waited_for_a_move_leaves_the_gate_before_running_here) {
  tko_pool *pool = pool_with_a_parked_settle(TKO_FULL_CALLER_RUNS, maybe_hold);
  atomic_store(&hold, true); /* the task the worker starts next holds it */
  /* The queue is full and the settle's room is on its way: the submit
   * enters the gate to wait for it, and parks before it sleeps. */
  atomic_store(&tko__test_admit_window, park_asleep);
  tf_thread t;
  cr_assert_eq(tf_thread_start(&t, submit_caller_runs, pool), 0);
  cr_assert(tt_count_wait_geq(&asleep_parked, 1), "the submit did not wait for the move");
  atomic_store(&tko__test_admit_window, NULL);
  tt_gate_open(&settle_gate);
  cr_assert(tt_count_wait_geq(&held.started, 1), "the worker started no task after the settle");
  fill_until_a_caller_run(pool); /* takes the room the settle brought back */
  tt_gate_open(&asleep_gate);
  int rc = -1;
  cr_assert(tf_thread_join(&t, &rc));
  cr_assert_eq(rc, 0);
  tko_stats s;
  tko_pool_stats(pool, &s);
  cr_assert_eq(s.caller_runs, 2, "the waiting submit's task ran on its caller");
  cr_assert_eq(atomic_load(&pool->gate), 0, "a caller-run left its wait's gate entry behind");
  atomic_store(&hold, false);
  tt_gate_open(&held.gate);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  cr_assert_eq(tko_pool_destroy(pool), 0);
}
