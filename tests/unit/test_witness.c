/* SPDX-License-Identifier: MIT */
/* The lock-order checker (src/platform/witness.h): the orders the ranks allow pass
 * silently; a lock taken out of order, under a leaf or beside one of its
 * own rank, a release of a lock not held and a condition wait that holds
 * another lock are each reported once, with both ranks. The library's
 * report aborts; these tests install the checker's seam, which records the
 * reports instead. Every other suite checks the library's own orders: a
 * build with the checker (Debug, TSan, ASan) aborts at a violation. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "lock.h"
#include "tko_test.h"
#include "tko_test_child.h"
#include "witness.h"

#ifdef TKO_LOCK_ORDER_CHECK
#define MAX_REPORTS 8
static struct {
  int what;
  tko__rank held, r;
} reports[MAX_REPORTS];
static unsigned nreports;

/* The seam: runs on the test's own thread (no pool here). */
static void record(int what, tko__rank held, tko__rank r) {
  if (nreports < MAX_REPORTS) {
    reports[nreports].what = what;
    reports[nreports].held = held;
    reports[nreports].r = r;
  }
  nreports++;
}

static void start(void) {
  nreports = 0;
  atomic_store(&tko__test_witness_hook, record);
}

static void assert_one_report(int what, tko__rank held, tko__rank r) {
  cr_assert_eq(nreports, 1, "%u reports", nreports);
  cr_assert_eq(reports[0].what, what);
  cr_assert_eq(reports[0].held, held, "held %d", (int)reports[0].held);
  cr_assert_eq(reports[0].r, r, "taken %d", (int)reports[0].r);
}
#define CHECKER_ON() start()
#else
#define CHECKER_ON() cr_skip_test("the lock-order checker is compiled out (TKO_LOCK_ORDER_CHECK)")
#endif

/* Each mutex is bound to the rank of the library's lock it stands for. */
static tko__mutex lane_a = TKO__MUTEX_INITIALIZER(TKO__RANK_LANE);
static tko__mutex lane_b = TKO__MUTEX_INITIALIZER(TKO__RANK_LANE);
static tko__mutex spawn_mu = TKO__MUTEX_INITIALIZER(TKO__RANK_SPAWN);
static tko__mutex help_mu = TKO__MUTEX_INITIALIZER(TKO__RANK_HELP);
static tko__mutex gate_mu = TKO__MUTEX_INITIALIZER(TKO__RANK_GATE);
static tko__mutex timer_mu = TKO__MUTEX_INITIALIZER(TKO__RANK_TIMER);
static pthread_cond_t gate_cv = PTHREAD_COND_INITIALIZER;
static tko__lock queue_lock; /* zero: unlocked */

/* Kills witness-order-flipped and witness-release-keeps-rank
 * (scripts/mutants.list). */
Test(witness, the_ranked_orders_pass) {
  CHECKER_ON();
  for (int round = 0; round < 3; round++) { /* what is released is forgotten */
    tko__mutex_lock(&lane_a);
    tko__mutex_lock(&spawn_mu);
    tko__lock_acquire(&queue_lock);
    tko__mutex_unlock(&spawn_mu); /* out of order: allowed */
    tko__mutex_lock(&help_mu);
    tko__mutex_lock(&gate_mu); /* one leaf, innermost */
    tko__mutex_unlock(&gate_mu);
    tko__mutex_unlock(&help_mu);
    tko__unlock(&queue_lock);
    tko__mutex_unlock(&lane_a);
  }
  /* A wait holding only its own mutex (the deadline has passed: returns). */
  struct timespec past = {0, 0};
  tko__mutex_lock(&gate_mu);
  cr_assert_eq(tko__cond_timedwait(&gate_cv, &gate_mu, &past), ETIMEDOUT);
  tko__mutex_unlock(&gate_mu);
#ifdef TKO_LOCK_ORDER_CHECK
  cr_assert_eq(nreports, 0, "%u reports, the first: held %d, taken %d", nreports,
               (int)reports[0].held, (int)reports[0].r);
#endif
}

/* Kills witness-queue-lock-unranked. */
Test(witness, a_lock_taken_under_a_later_rank_is_reported) {
  CHECKER_ON();
  tko__lock_acquire(&queue_lock);
  tko__mutex_lock(&spawn_mu); /* spawn_mu ranks before the queue lock */
  tko__mutex_unlock(&spawn_mu);
  tko__unlock(&queue_lock);
#ifdef TKO_LOCK_ORDER_CHECK
  assert_one_report(TKO__WITNESS_ORDER, TKO__RANK_QUEUE, TKO__RANK_SPAWN);
#endif
}

/* Kills witness-leaf-rule-dropped: the timer's rank follows the gate's,
 * so only the leaf rule refuses it. */
Test(witness, nothing_is_taken_under_a_leaf) {
  CHECKER_ON();
  tko__mutex_lock(&gate_mu);
  tko__mutex_lock(&timer_mu);
  tko__mutex_unlock(&timer_mu);
  tko__mutex_unlock(&gate_mu);
#ifdef TKO_LOCK_ORDER_CHECK
  assert_one_report(TKO__WITNESS_ORDER, TKO__RANK_GATE, TKO__RANK_TIMER);
#endif
}

/* A mutex made at run time keeps the rank it was initialised with: the
 * wrappers report it by that rank, named nowhere else. */
Test(witness, a_mutex_keeps_the_rank_it_was_initialised_with) {
  CHECKER_ON();
  tko__mutex mu;
  cr_assert_eq(tko__mutex_init(&mu, TKO__RANK_TIMER), 0);
  cr_assert_eq(tko__mutex_rank(&mu), TKO__RANK_TIMER);
  tko__mutex_lock(&gate_mu);
  tko__mutex_lock(&mu); /* a leaf under a leaf */
  tko__mutex_unlock(&mu);
  tko__mutex_unlock(&gate_mu);
  tko__mutex_destroy(&mu);
#ifdef TKO_LOCK_ORDER_CHECK
  assert_one_report(TKO__WITNESS_ORDER, TKO__RANK_GATE, TKO__RANK_TIMER);
#endif
}

/* Host code (a task, a hook, on_cancel, a flush) runs with no library lock
 * held: the checker reports a call made under one, naming the lock, and
 * stays quiet once it is released. Kills witness-host-call-unchecked. */
Test(witness, host_code_under_a_lock_is_reported) {
  CHECKER_ON();
  tko__witness_assert_none_held();
  tko__mutex_lock(&help_mu);
  tko__witness_assert_none_held();
  tko__mutex_unlock(&help_mu);
  tko__witness_assert_none_held();
#ifdef TKO_LOCK_ORDER_CHECK
  assert_one_report(TKO__WITNESS_HOST_UNDER_LOCK, TKO__RANK_HELP, TKO__RANK_NONE);
#endif
}

/* Kills witness-equal-rank-allowed. */
Test(witness, two_locks_of_one_rank_are_reported) {
  CHECKER_ON();
  tko__mutex_lock(&lane_a);
  tko__mutex_lock(&lane_b);
  tko__mutex_unlock(&lane_b);
  tko__mutex_unlock(&lane_a);
#ifdef TKO_LOCK_ORDER_CHECK
  assert_one_report(TKO__WITNESS_ORDER, TKO__RANK_LANE, TKO__RANK_LANE);
#endif
}

/* Kills witness-release-drops-another: releasing the outer lock first
 * must leave the inner one counted. */
Test(witness, a_lock_released_out_of_order_leaves_the_other_held) {
  CHECKER_ON();
  tko__mutex_lock(&spawn_mu);
  tko__lock_acquire(&queue_lock);
  tko__mutex_unlock(&spawn_mu);
  tko__mutex_lock(&spawn_mu); /* the queue lock is still held */
  tko__mutex_unlock(&spawn_mu);
  tko__unlock(&queue_lock);
#ifdef TKO_LOCK_ORDER_CHECK
  assert_one_report(TKO__WITNESS_ORDER, TKO__RANK_QUEUE, TKO__RANK_SPAWN);
#endif
}

/* Kills witness-release-unchecked. Only the checker's half: unlocking a
 * mutex not held is undefined. */
Test(witness, releasing_a_lock_not_held_is_reported) {
  CHECKER_ON();
  tko__witness_release(TKO__RANK_TIMER);
#ifdef TKO_LOCK_ORDER_CHECK
  assert_one_report(TKO__WITNESS_NOT_HELD, TKO__RANK_NONE, TKO__RANK_TIMER);
#endif
}

/* Kills witness-wait-unchecked. */
Test(witness, a_wait_holding_another_lock_is_reported) {
  CHECKER_ON();
  struct timespec past = {0, 0};
  tko__mutex_lock(&spawn_mu);
  tko__mutex_lock(&gate_mu);
  tko__cond_timedwait(&gate_cv, &gate_mu, &past);
  tko__mutex_unlock(&gate_mu);
  tko__mutex_unlock(&spawn_mu);
#ifdef TKO_LOCK_ORDER_CHECK
  assert_one_report(TKO__WITNESS_WAIT_HOLDING, TKO__RANK_SPAWN, TKO__RANK_GATE);
#endif
}

/* Without the seam: a child process takes the queue lock, then spawn_mu;
 * the checker names both on stderr and aborts before the lock is taken. */
static void take_spawn_mu_under_the_queue_lock(void) {
  tko__lock_acquire(&queue_lock);
  tko__mutex_lock(&spawn_mu);
}

Test(witness, a_violation_prints_both_ranks_and_aborts) {
  CHECKER_ON();
#ifdef TKO_LOCK_ORDER_CHECK
  atomic_store(&tko__test_witness_hook, NULL);
#endif
  char out[1024];
  int status = tt_run_child(take_spawn_mu_under_the_queue_lock, out, sizeof out);
  cr_assert(status != -1 && WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT,
            "the child was not aborted");
  char want[128];
  snprintf(want, sizeof want, "takes spawn_mu (rank %d) while holding the queue lock (rank %d)",
           (int)TKO__RANK_SPAWN, (int)TKO__RANK_QUEUE);
  cr_assert_not_null(strstr(out, want), "the report: %s", out);
}
