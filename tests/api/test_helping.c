/* SPDX-License-Identifier: MIT */
/* Tests of the helping wait's rule: a pool task that waits on a group, of
 * any pool, runs its own pool's queued work meanwhile, the group's own
 * queued members first, newest first. So a fork-join tree nests its waits
 * only as deep as the tree (a depth-8, fan-out-4 tree completes on one
 * worker), and two pools whose tasks wait on each other's groups do not
 * deadlock. No test sleeps to wait for something; waits that a broken
 * rule would hang carry a long bound, and a timeout there is a failure. */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "taskorch.h"
#include "tko_test.h"
#include "tko_test_feature.h"
#include "tko_test_sync.h"

/* ---- a fork-join tree on one worker ---------------------------------------- */

#define TREE_DEPTH 8
#define TREE_FANOUT 4

typedef struct tree {
  tko_pool *pool;
  atomic_long ran;       /* nodes that ran */
  atomic_int nesting;    /* nodes running on the worker's stack now */
  atomic_int max_nesting;
  atomic_int bad;        /* a wait or a submit that failed */
} tree;

typedef struct node {
  tree *t;
  int depth;
} node;

static int node_fn(void *arg) {
  node *n = arg;
  tree *t = n->t;
  int now = atomic_fetch_add(&t->nesting, 1) + 1;
  for (int m = atomic_load(&t->max_nesting); now > m;)
    if (atomic_compare_exchange_weak(&t->max_nesting, &m, now)) break;
  atomic_fetch_add(&t->ran, 1);
  if (n->depth < TREE_DEPTH) {
    node kids[TREE_FANOUT];
    tko_group g;
    if (tko_group_init(&g)) atomic_store(&t->bad, 1);
    for (int i = 0; i < TREE_FANOUT; i++) {
      kids[i] = (node){t, n->depth + 1};
      if (tko_group_submit(t->pool, &g, node_fn, &kids[i], 0)) atomic_store(&t->bad, 1);
    }
    /* -1: a wait that cannot finish hangs here, and the test's bounded
     * wait_idle reports it. */
    int rc = tko_group_wait(&g, -1);
    if (rc) atomic_store(&t->bad, rc);
    if (rc == 0 && tko_group_destroy(&g)) atomic_store(&t->bad, 1);
  }
  atomic_fetch_sub(&t->nesting, 1);
  return 0;
}

/* Each wait runs its own children before anything else, so the stack
 * holds one node per level: the tree's depth + 1, far below
 * TKO_MAX_HELP_DEPTH, and every wait succeeds. */
Test(helping, a_fork_join_tree_of_depth_8_completes_on_one_worker) {
  tree t;
  memset(&t, 0, sizeof t);
  tko_options o = tko_basic_options(1);
  cr_assert_eq(tko_pool_create(&t.pool, &o), 0);
  node root = {&t, 0};
  cr_assert_eq(tko_submit(t.pool, node_fn, &root, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(t.pool, TT_LONG_MS), 0, "the tree did not finish");
  long nodes = 0;
  for (long level = 1, d = 0; d <= TREE_DEPTH; d++, level *= TREE_FANOUT) nodes += level;
  cr_assert_eq(atomic_load(&t.bad), 0, "a wait or submit failed: %d", atomic_load(&t.bad));
  cr_assert_eq(atomic_load(&t.ran), nodes);
  cr_assert_eq(atomic_load(&t.max_nesting), TREE_DEPTH + 1);
  cr_assert_eq(tko_pool_destroy(t.pool), 0);
}

/* ---- the group's own members first, newest first --------------------------- */

typedef struct order {
  tko_pool *pool;
  atomic_int next;
  int seen[8]; /* what ran, in order: 1..4 the members, 8 and 9 the others */
  atomic_int rc;
} order;

typedef struct tagged {
  order *o;
  int tag;
} tagged;

static int record_fn(void *arg) {
  tagged *t = arg;
  int i = atomic_fetch_add(&t->o->next, 1);
  if (i < 8) t->o->seen[i] = t->tag;
  return 0;
}

static int parent_fn(void *arg) {
  order *o = arg;
  static tagged heavy, peer, members[4];
  heavy = (tagged){o, 9};
  peer = (tagged){o, 8};
  tko_group g;
  tko_group_init(&g);
  /* Two tasks queued first, not in the group: the heavier one still runs
   * first (weight order holds), the one of the members' weight after them
   * (the wait runs its own members first, newest first). */
  if (tko_submit(o->pool, record_fn, &heavy, 100)) atomic_store(&o->rc, -1);
  if (tko_submit(o->pool, record_fn, &peer, 0)) atomic_store(&o->rc, -1);
  for (int i = 0; i < 4; i++) {
    members[i] = (tagged){o, i + 1};
    if (tko_group_submit(o->pool, &g, record_fn, &members[i], 0)) atomic_store(&o->rc, -1);
  }
  int rc = tko_group_wait(&g, -1);
  if (rc) atomic_store(&o->rc, rc);
  tko_group_destroy(&g);
  return 0;
}

Test(helping, a_wait_runs_its_groups_queued_members_first_newest_first) {
  order o;
  memset(&o, 0, sizeof o);
  tko_options opts = tko_basic_options(1);
  cr_assert_eq(tko_pool_create(&o.pool, &opts), 0);
  cr_assert_eq(tko_submit(o.pool, parent_fn, &o, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(o.pool, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&o.rc), 0);
  cr_assert_eq(atomic_load(&o.next), 6);
  int want[6] = {9, 4, 3, 2, 1, 8};
  for (int i = 0; i < 6; i++) cr_assert_eq(o.seen[i], want[i], "run %d was %d", i, o.seen[i]);
  cr_assert_eq(tko_pool_destroy(o.pool), 0);
}

/* ---- waits across pools ------------------------------------------------------ */

/* A task of pool A (one worker) waits on a group of pool B; B's member
 * (B has one worker) waits on a group of pool A whose member is queued in
 * A. A's worker, waiting, must run A's queued member. */
typedef struct cross {
  tko_pool *a, *b;
  tko_group ga, gb;
  atomic_int inner_ran, rc_a, rc_b;
} cross;

static int inner_fn(void *arg) {
  atomic_store(&((cross *)arg)->inner_ran, 1);
  return 0;
}

static int b_member_fn(void *arg) {
  cross *x = arg;
  int rc = tko_group_submit(x->a, &x->ga, inner_fn, x, 0);
  if (rc == 0) rc = tko_group_wait(&x->ga, -1);
  atomic_store(&x->rc_b, rc);
  return 0;
}

static int a_task_fn(void *arg) {
  cross *x = arg;
  int rc = tko_group_submit(x->b, &x->gb, b_member_fn, x, 0);
  if (rc == 0) rc = tko_group_wait(&x->gb, -1);
  atomic_store(&x->rc_a, rc);
  return 0;
}

Test(helping, tasks_of_two_pools_waiting_on_each_others_groups_finish) {
  cross x;
  memset(&x, 0, sizeof x);
  atomic_store(&x.rc_a, 1);
  atomic_store(&x.rc_b, 1);
  tko_options o = tko_basic_options(1);
  cr_assert_eq(tko_pool_create(&x.a, &o), 0);
  cr_assert_eq(tko_pool_create(&x.b, &o), 0);
  cr_assert_eq(tko_group_init(&x.ga), 0);
  cr_assert_eq(tko_group_init(&x.gb), 0);
  cr_assert_eq(tko_submit(x.a, a_task_fn, &x, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(x.a, TT_LONG_MS), 0, "pool A deadlocked");
  cr_assert_eq(tko_pool_wait_idle(x.b, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&x.inner_ran), 1);
  cr_assert_eq(atomic_load(&x.rc_a), 0);
  cr_assert_eq(atomic_load(&x.rc_b), 0);
  cr_assert_eq(tko_group_destroy(&x.ga), 0);
  cr_assert_eq(tko_group_destroy(&x.gb), 0);
  cr_assert_eq(tko_pool_destroy(x.a), 0);
  cr_assert_eq(tko_pool_destroy(x.b), 0);
}

/* A cross-pool wait with nothing to run in its own pool sleeps until the
 * other pool's member ends it: the group's end wakes a helper of another
 * pool. Pool B's member waits for the test's gate; A has nothing queued. */
typedef struct sleeper {
  tko_pool *a, *b;
  tko_group gb;
  tt_gate gate;
  tt_count waiting;
  atomic_int rc;
} sleeper;

static int gated_fn(void *arg) {
  sleeper *s = arg;
  tt_gate_wait(&s->gate);
  return 0;
}

static int cross_waiter_fn(void *arg) {
  sleeper *s = arg;
  int rc = tko_group_submit(s->b, &s->gb, gated_fn, s, 0);
  tt_count_add(&s->waiting, 1);
  if (rc == 0) rc = tko_group_wait(&s->gb, -1);
  atomic_store(&s->rc, rc);
  return 0;
}

Test(helping, the_end_of_another_pools_group_wakes_a_sleeping_helper) {
  sleeper s;
  memset(&s, 0, sizeof s);
  tt_count_init(&s.waiting);
  s.gate = (tt_gate)TT_GATE_INIT;
  atomic_store(&s.rc, 1);
  tko_options o = tko_basic_options(1);
  cr_assert_eq(tko_pool_create(&s.a, &o), 0);
  cr_assert_eq(tko_pool_create(&s.b, &o), 0);
  cr_assert_eq(tko_group_init(&s.gb), 0);
  cr_assert_eq(tko_submit(s.a, cross_waiter_fn, &s, 0), 0);
  cr_assert(tt_count_wait_geq(&s.waiting, 1));
  tt_gate_open(&s.gate);
  cr_assert_eq(tko_pool_wait_idle(s.a, TT_LONG_MS), 0, "the helper was never woken");
  cr_assert_eq(atomic_load(&s.rc), 0);
  cr_assert_eq(tko_pool_wait_idle(s.b, TT_LONG_MS), 0);
  cr_assert_eq(tko_group_destroy(&s.gb), 0);
  cr_assert_eq(tko_pool_destroy(s.a), 0);
  cr_assert_eq(tko_pool_destroy(s.b), 0);
  tt_count_fini(&s.waiting);
}

/* Two helpers of pool A sleep on one group of pool B at once (B's only
 * member is held by the test). The one that began to wait first has a deadline and
 * leaves at it, -ETIMEDOUT with the member still pending, from behind the
 * other in both lists (the group's and the pool's); the other, with no
 * deadline, returns 0 when the member ends. */
typedef struct two_helpers {
  tko_pool *a, *b;
  tko_group g;
  tt_pin member;
  tt_count started, returned;
  atomic_int timed_tid;
  int rc_timed, rc_open;
  uint64_t pending_at_timeout;
} two_helpers;

/* Whether thread tid of this process is asleep (state S in its stat). */
static bool asleep(int tid) { return tf_thread_state((pid_t)tid) == 'S'; }

static int timed_helper_fn(void *arg) {
  two_helpers *t = arg;
  atomic_store(&t->timed_tid, (int)syscall(SYS_gettid));
  tt_count_add(&t->started, 1);
  t->rc_timed = tko_group_wait(&t->g, 500);
  t->pending_at_timeout = tko_group_pending(&t->g);
  tt_count_add(&t->returned, 1);
  return 0;
}

/* Started first, so that the timed helper cannot run it as its help; it
 * waits after the timed helper has begun to, behind it. */
static int open_helper_fn(void *arg) {
  two_helpers *t = arg;
  tt_count_add(&t->started, 1);
  (void)tt_count_wait_geq(&t->started, 2);
  /* Behind the timed helper: it is asleep in its wait (or, on a slow
   * machine, the order is left to chance; the test asserts no order). */
  uint64_t end = tt_now_ns() + 200000000u;
  while (!asleep(atomic_load(&t->timed_tid)) && tt_now_ns() < end) sched_yield();
  t->rc_open = tko_group_wait(&t->g, -1);
  tt_count_add(&t->returned, 1);
  return 0;
}

Test(helping, of_two_sleeping_helpers_the_first_leaves_at_its_deadline_the_other_at_the_end) {
  static two_helpers t;
  memset(&t, 0, sizeof t);
  t.member = (tt_pin)TT_PIN_INIT;
  tt_count_init(&t.started);
  tt_count_init(&t.returned);
  t.rc_timed = t.rc_open = 1;
  tko_options o = tko_basic_options(2);
  cr_assert_eq(tko_pool_create(&t.a, &o), 0);
  o = tko_basic_options(1);
  cr_assert_eq(tko_pool_create(&t.b, &o), 0);
  cr_assert_eq(tko_group_init(&t.g), 0);
  cr_assert_eq(tko_group_submit(t.b, &t.g, tt_pin_fn, &t.member, 0), 0);
  cr_assert(tt_count_wait_geq(&t.member.started, 1));
  cr_assert_eq(tko_submit(t.a, open_helper_fn, &t, 0), 0);
  cr_assert(tt_count_wait_geq(&t.started, 1));
  cr_assert_eq(tko_submit(t.a, timed_helper_fn, &t, 0), 0);
  cr_assert(tt_count_wait_geq(&t.returned, 1), "the timed helper never returned");
  cr_assert_eq(t.rc_timed, -ETIMEDOUT);
  cr_assert_eq(t.pending_at_timeout, 1);
  cr_assert_eq(tt_count_get(&t.returned), 1, "the open helper returned before the end");
  tt_gate_open(&t.member.gate);
  cr_assert_eq(tko_pool_wait_idle(t.a, TT_LONG_MS), 0, "the open helper was never woken");
  cr_assert_eq(t.rc_open, 0);
  cr_assert_eq(tko_group_status(&t.g), 0);
  cr_assert_eq(tko_group_destroy(&t.g), 0);
  cr_assert_eq(tko_pool_destroy(t.a), 0);
  cr_assert_eq(tko_pool_destroy(t.b), 0);
  tt_count_fini(&t.started);
  tt_count_fini(&t.returned);
}

/* ---- with aging and hooks ------------------------------------------------------- */

/* Aging on and a before_run hook (the pool times its tasks): the wait still
 * takes its group's member from the head of its weight's queue, and the
 * peer queued behind it stays queued until the wait has returned; the
 * member's failure is the group's status and counts as failed without an
 * on_failure hook. */
typedef struct aged {
  tko_pool *pool;
  tko_group g;
  atomic_int next;
  int seen[4]; /* 1: the member ran, 2: the wait returned, 3: the peer ran */
  int wait_rc;
} aged;

static void aged_mark(aged *a, int what) {
  int i = atomic_fetch_add(&a->next, 1);
  if (i < 4) a->seen[i] = what;
}

static int aged_member_fn(void *arg) {
  aged_mark(arg, 1);
  return 5;
}

static int aged_peer_fn(void *arg) {
  aged_mark(arg, 3);
  return 0;
}

static int aged_parent_fn(void *arg) {
  aged *a = arg;
  if (tko_group_submit(a->pool, &a->g, aged_member_fn, a, 0) ||
      tko_submit(a->pool, aged_peer_fn, a, 0)) {
    a->wait_rc = -1;
    return 0;
  }
  a->wait_rc = tko_group_wait(&a->g, -1);
  aged_mark(a, 2);
  return 0;
}

static void count_start(void *user, const tko_task_info *t) {
  (void)t;
  atomic_fetch_add((atomic_int *)user, 1);
}

Test(helping, with_aging_and_timing_a_wait_runs_its_member_and_leaves_the_peer_queued) {
  static aged a;
  memset(&a, 0, sizeof a);
  a.wait_rc = 1;
  atomic_int starts = 0;
  tko_options o = tko_basic_options(1);
  o.aging_ms = 1000;
  o.hooks.user = &starts;
  o.hooks.before_run = count_start;
  cr_assert_eq(tko_pool_create(&a.pool, &o), 0);
  cr_assert_eq(tko_group_init(&a.g), 0);
  cr_assert_eq(tko_submit(a.pool, aged_parent_fn, &a, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(a.pool, TT_LONG_MS), 0);
  cr_assert_eq(a.wait_rc, 0);
  cr_assert_eq(atomic_load(&a.next), 3);
  int want[3] = {1, 2, 3};
  for (int i = 0; i < 3; i++) cr_assert_eq(a.seen[i], want[i], "step %d was %d", i, a.seen[i]);
  cr_assert_eq(tko_group_status(&a.g), 5);
  tko_stats st;
  tko_pool_stats(a.pool, &st);
  cr_assert_eq(st.failed, 1);
  cr_assert_eq(st.completed, 3);
  cr_assert_eq(atomic_load(&starts), 3);
  cr_assert_eq(tko_group_destroy(&a.g), 0);
  cr_assert_eq(tko_pool_destroy(a.pool), 0);
}
