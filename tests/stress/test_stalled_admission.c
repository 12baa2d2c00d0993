/* SPDX-License-Identifier: MIT */
/* A submitter stopped inside a bounded queue's admission (preempted, or in
 * a debugger) holds up no worker, and no other submitter whose tasks have
 * room (src/engine/admit.c's essay lists what it holds at each point).
 * The seams tko__test_admit_window and tko__test_settle_window park one
 * chosen submit:
 *
 * - leased: between a lease's CAS and its credits;
 * - taking back: between taking another ring's credits and subtracting
 *   them (its gather, the queue full);
 * - settling: between marking a worker's give-backs settled and
 *   subtracting them (its gather, the queue full);
 * - asleep: counted as a waiter and done looking, before it sleeps.
 *
 * Meanwhile two other threads submit tasks through the bounded queue (full
 * policy BLOCK, room for them left or coming free as the workers run): all
 * of them must run while the submitter stays parked. The parked submitter
 * is then released (before anything is asserted, so nothing hangs), and
 * every task, its own included, runs exactly once. The asleep scene also
 * catches a lost wake-up: room came free while the submitter was between
 * its look and its sleep, and nothing frees room after its release, so a
 * sleep that missed the event count's bump never ends (the test then
 * reports it, and shuts the pool down to end the submit). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "internal.h"
#include "taskorch.h"
#include "tko_test.h"
#include "tko_test_sync.h"

enum { CAP = 256, OTHERS = 2 };
#define PER ((size_t)TT_SCALE(2000, 300))
#define LONG_MS TT_SCALE(20000, 60000)

/* Where the chosen submit parks: a point of tko__admit_point, or inside
 * a settle of its gather. */
enum { AT_SETTLING = -1 };

typedef struct scene {
  tko_pool *pool;
  int at;
  atomic_int *runs;     /* the others' tasks, OTHERS x PER */
  atomic_int own_runs;  /* the parked thread's tasks that ran */
  atomic_int fill_runs; /* the main thread's */
  tt_count reached;     /* 1 once the chosen submit parked, or its thread returned */
  tt_count returned;    /* 1 once the parked thread returned */
  tt_count ran;         /* the others' tasks that ran */
  tt_gate release;
  atomic_bool parked;
  size_t own; /* tasks the parked thread submitted */
  int rc;     /* its last submit's */
} scene;

static scene *cur; /* the test's, for the seams */
static _Thread_local bool park_me;

static void park(void) {
  park_me = false;
  atomic_store(&cur->parked, true);
  tt_count_add(&cur->reached, 1);
  (void)tt_gate_wait(&cur->release);
}

static void admit_window(enum tko__admit_point at) {
  if (park_me && (int)at == cur->at) park();
}

static void settle_window(void) {
  if (park_me && cur->at == AT_SETTLING) park();
}

static int other_fn(void *arg) {
  atomic_fetch_add((atomic_int *)arg, 1);
  tt_count_add(&cur->ran, 1);
  return 0;
}

static int count_fn(void *arg) {
  atomic_fetch_add((atomic_int *)arg, 1);
  return 0;
}

/* Submits until its submit parks (one that waits for room if asleep, else
 * ones that give up at once when the queue is full), or until a submit
 * fails without parking: then the scene's precondition did not hold. */
static void *parked_main(void *arg) {
  scene *s = arg;
  park_me = true;
  long timeout = s->at == TKO__ADMIT_ASLEEP ? -1 : 0;
  for (size_t i = 0; i <= CAP; i++) {
    s->rc = tko_submit_timed(s->pool, count_fn, &s->own_runs, 0, timeout);
    if (s->rc == 0) s->own++;
    if (s->rc || !park_me) break;
  }
  park_me = false;
  if (!atomic_load(&s->parked)) tt_count_add(&s->reached, 1);
  tt_count_add(&s->returned, 1);
  return NULL;
}

typedef struct other {
  scene *s;
  size_t first;
  int rc;
} other;

static void *other_main(void *arg) {
  other *o = arg;
  for (size_t i = 0; i < PER && o->rc == 0; i++)
    o->rc = tko_submit(o->s->pool, other_fn, &o->s->runs[o->first + i], 0);
  return NULL;
}

/* Readies the pool for the chosen point; returns the main thread's tasks. */
static size_t prepare(scene *s) {
  size_t filled = 0;
  switch (s->at) {
  case TKO__ADMIT_LEASED: /* a fresh pool: the first submit leases */
    break;
  case TKO__ADMIT_TAKING_BACK: /* this thread leases; the parked one fills up to it */
    cr_assert_eq(tko_pool_pause(s->pool), 0);
    cr_assert_eq(tko_submit(s->pool, count_fn, &s->fill_runs, 0), 0);
    filled = 1;
    cr_assert_gt(atomic_load(&s->pool->rings.ring[0]->credits), 0, "no lease to take back");
    break;
  case AT_SETTLING: { /* the worker gathers give-backs unsettled; the parked one fills up */
    cr_assert_eq(tko_submit(s->pool, count_fn, &s->fill_runs, 0), 0); /* straight back */
    cr_assert_eq(tko_pool_wait_idle(s->pool, LONG_MS), 0);
    for (int i = 0; i < 5; i++) cr_assert_eq(tko_submit(s->pool, count_fn, &s->fill_runs, 0), 0);
    cr_assert_eq(tko_pool_wait_idle(s->pool, LONG_MS), 0);
    filled = 6;
    tko__worker *w = &s->pool->slots[0];
    cr_assert_gt(atomic_load(&w->room_given), atomic_load(&w->room_settled), "nothing gathered");
    cr_assert_eq(tko_pool_pause(s->pool), 0);
    break;
  }
  case TKO__ADMIT_ASLEEP: /* full, paused: the parked submit must wait */
    cr_assert_eq(tko_pool_pause(s->pool), 0);
    while (tko_submit_timed(s->pool, count_fn, &s->fill_runs, 0, 0) == 0) filled++;
    cr_assert_eq(filled, CAP);
    break;
  }
  return filled;
}

static bool stalled_scene(void *arg) {
  int at = *(int *)arg;
  scene s = {.at = at, .release = TT_GATE_INIT};
  s.runs = calloc(OTHERS * PER, sizeof *s.runs);
  tt_count_init(&s.reached);
  tt_count_init(&s.ran);
  tt_count_init(&s.returned);
  /* One worker where a settle is parked: its give-backs are the ones. */
  tko_options o = tko_basic_options(at == AT_SETTLING ? 1 : 2);
  o.queue_capacity = CAP;
  o.full_policy = TKO_FULL_BLOCK;
  cr_assert_eq(tko_pool_create(&s.pool, &o), 0);
  cur = &s;
  atomic_store(&tko__test_admit_window, admit_window);
  atomic_store(&tko__test_settle_window, settle_window);
  size_t filled = prepare(&s);
  pthread_t pt, th[OTHERS];
  cr_assert_eq(pthread_create(&pt, NULL, parked_main, &s), 0);
  cr_assert(tt_count_wait_geq(&s.reached, 1));
  bool parked = atomic_load(&s.parked), all_ran = false;
  other oa[OTHERS];
  if (parked) {
    if (at != TKO__ADMIT_LEASED) cr_assert_eq(tko_pool_resume(s.pool), 0);
    for (int i = 0; i < OTHERS; i++) {
      oa[i] = (other){&s, (size_t)i * PER, 0};
      cr_assert_eq(pthread_create(&th[i], NULL, other_main, &oa[i]), 0);
    }
    /* Every other task runs while the submitter stays parked. */
    all_ran = tt_count_wait_geq_within(&s.ran, (long)(OTHERS * PER), LONG_MS);
  }
  tt_gate_open(&s.release);
  /* Released, it gets its room at once: what came free while it was
   * parked bumped the event count it is about to sleep on. If it sleeps
   * on, the close wakes it (-ESHUTDOWN), so that the test ends. */
  bool woke = tt_count_wait_geq_within(&s.returned, 1, LONG_MS);
  if (!woke) (void)tko_pool_shutdown_timed(s.pool, TKO_CANCEL, LONG_MS);
  pthread_join(pt, NULL);
  if (parked)
    for (int i = 0; i < OTHERS; i++) pthread_join(th[i], NULL);
  else if (at != TKO__ADMIT_LEASED)
    cr_assert_eq(tko_pool_resume(s.pool), 0);
  atomic_store(&tko__test_admit_window, NULL);
  atomic_store(&tko__test_settle_window, NULL);
  if (parked) {
    cr_assert(all_ran, "the others' tasks waited for a submitter parked in admission (point %d)", at);
    cr_assert(woke, "the released submitter slept through the room that came free");
    for (int i = 0; i < OTHERS; i++) cr_assert_eq(oa[i].rc, 0);
    cr_assert_eq(s.rc, 0, "the parked submit failed once released (%d)", s.rc);
    cr_assert_eq(tko_pool_wait_idle(s.pool, LONG_MS), 0);
    for (size_t i = 0; i < OTHERS * PER; i++)
      cr_assert_eq(atomic_load(&s.runs[i]), 1, "task %zu ran %d times", i, atomic_load(&s.runs[i]));
    cr_assert_eq((size_t)atomic_load(&s.own_runs), s.own);
    cr_assert_eq((size_t)atomic_load(&s.fill_runs), filled);
    tko_stats st;
    tko_pool_stats(s.pool, &st);
    size_t total = OTHERS * PER + s.own + filled;
    cr_assert_eq(st.submitted, total);
    cr_assert_eq(st.completed, total);
    cr_assert_eq(st.queued, 0);
    cr_assert_leq(atomic_load(&s.pool->room_taken), CAP);
  }
  cr_assert_eq(tko_pool_destroy(s.pool), 0);
  cur = NULL;
  tt_count_fini(&s.reached);
  tt_count_fini(&s.ran);
  tt_count_fini(&s.returned);
  free(s.runs);
  return parked;
}

static void run_scene(int at) {
  cr_assert(tt_rerun(stalled_scene, &at), "the submit never reached point %d", at);
}

Test(stalled_admission, a_submitter_parked_inside_its_lease_holds_up_nobody) {
  run_scene(TKO__ADMIT_LEASED);
}

Test(stalled_admission, a_submitter_parked_taking_credits_back_holds_up_nobody) {
  run_scene(TKO__ADMIT_TAKING_BACK);
}

Test(stalled_admission, a_submitter_parked_inside_a_settle_holds_up_nobody) {
  run_scene(AT_SETTLING);
}

/* Kills admit-waiter-sleeps-on-a-count-read-after-its-look. */
Test(stalled_admission, a_submitter_parked_before_its_sleep_holds_up_nobody_and_wakes) {
  run_scene(TKO__ADMIT_ASLEEP);
}
