/* SPDX-License-Identifier: MIT */
/* Tests for task groups (tko_group_*): wait for every member or time out,
 * pending counts, the first failure as the group's status (a group of one
 * gives its task's status), cancelling only still-queued members, waiting
 * from inside a pool task on a one-worker pool (the worker helps), the
 * error codes, and shutdown: TKO_CANCEL hands queued members to on_cancel
 * and the group's wait returns with -ECANCELED; TKO_DRAIN runs them. Every
 * test checks that nothing is lost: runs + cancels == members accepted.
 * No test sleeps to wait for something. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "taskorch.h"
#include "tko_test.h"
#include "tko_test_feature.h"
#include "tko_test_sync.h"

/* Shared by the tasks and hooks of one test. */
typedef struct gctx {
  tt_count runs;    /* tasks that ran */
  tt_count cancels; /* on_cancel calls */
  tt_count started; /* blocker tasks that have started */
  tt_gate gate;     /* blocker tasks wait here */
  tko_pool *pool;
  atomic_int bad; /* checks that failed on a pool thread (asserts stay on
                     the test's thread) */
} gctx;

static void gctx_init(gctx *c) {
  memset(c, 0, sizeof *c);
  atomic_init(&c->bad, 0);
  tt_count_init(&c->runs);
  tt_count_init(&c->cancels);
  tt_count_init(&c->started);
  pthread_mutex_init(&c->gate.mu, NULL);
  pthread_cond_init(&c->gate.cv, NULL);
}

/* One member: returns status; member says whether on_cancel may see it. */
typedef struct item {
  gctx *c;
  int status;
  bool member;
  atomic_int ran, cancelled;
} item;

static int item_fn(void *arg) {
  item *it = arg;
  atomic_fetch_add(&it->ran, 1);
  tt_count_add(&it->c->runs, 1);
  return it->status;
}

/* Starts, reports, then waits on the gate. */
static int blocker_fn(void *arg) {
  item *it = arg;
  tt_count_add(&it->c->started, 1);
  if (!tt_gate_wait(&it->c->gate)) atomic_fetch_add(&it->c->bad, 1);
  atomic_fetch_add(&it->ran, 1);
  tt_count_add(&it->c->runs, 1);
  return it->status;
}

static void on_cancel(void *user, const tko_task_info *t) {
  gctx *c = user;
  if (t->worker != UINT32_MAX) atomic_fetch_add(&c->bad, 1);
  item *it = t->arg;
  atomic_fetch_add(&it->cancelled, 1);
  tt_count_add(&c->cancels, 1);
}

static tko_pool *make_pool(gctx *c, unsigned workers) {
  tko_options o = tko_basic_options(workers);
  o.hooks.user = c;
  o.hooks.on_cancel = on_cancel;
  tko_pool *p = NULL;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  c->pool = p;
  return p;
}

static void items_init(item *its, size_t n, gctx *c, int status, bool member) {
  for (size_t i = 0; i < n; i++) {
    its[i].c = c;
    its[i].status = status;
    its[i].member = member;
    atomic_init(&its[i].ran, 0);
    atomic_init(&its[i].cancelled, 0);
  }
}

Test(group, empty_group_is_done) {
  tko_group g;
  cr_assert_eq(tko_group_init(&g), 0);
  cr_assert_eq(tko_group_pending(&g), 0);
  cr_assert_eq(tko_group_wait(&g, 0), 0);
  cr_assert_eq(tko_group_wait(&g, -1), 0);
  cr_assert_eq(tko_group_wait(&g, 10), 0);
  cr_assert_eq(tko_group_status(&g), 0);
  cr_assert_eq(tko_group_cancel(&g), 0);
  cr_assert_eq(tko_group_destroy(&g), 0);
}

Test(group, invalid_arguments) {
  gctx c;
  gctx_init(&c);
  tko_pool *pool = make_pool(&c, 1);
  item it;
  items_init(&it, 1, &c, 0, true);

  cr_assert_eq(tko_group_init(NULL), -EINVAL);
  cr_assert_eq(tko_group_destroy(NULL), -EINVAL);
  cr_assert_eq(tko_group_wait(NULL, -1), -EINVAL);
  cr_assert_eq(tko_group_status(NULL), -EINVAL);
  cr_assert_eq(tko_group_cancel(NULL), -EINVAL);
  cr_assert_eq(tko_group_pending(NULL), 0);

  /* A zero-filled group was never initialised. */
  tko_group z;
  memset(&z, 0, sizeof z);
  cr_assert_eq(tko_group_wait(&z, 0), -EINVAL);
  cr_assert_eq(tko_group_destroy(&z), -EINVAL);
  cr_assert_eq(tko_group_status(&z), -EINVAL);
  cr_assert_eq(tko_group_cancel(&z), -EINVAL);
  cr_assert_eq(tko_group_submit(pool, &z, item_fn, &it, 0), -EINVAL);

  tko_group g;
  cr_assert_eq(tko_group_init(&g), 0);
  cr_assert_eq(tko_group_submit(NULL, &g, item_fn, &it, 0), -EINVAL);
  cr_assert_eq(tko_group_submit(pool, NULL, item_fn, &it, 0), -EINVAL);
  cr_assert_eq(tko_group_submit(pool, &g, NULL, &it, 0), -EINVAL);
  cr_assert_eq(tko_group_pending(&g), 0);
  cr_assert_eq(tko_group_wait(&g, 0), 0);

  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  cr_assert_eq(atomic_load(&it.ran), 0, "a refused submit must not run its task");
  tko_stats s;
  tko_pool_stats(pool, &s);
  cr_assert_eq(s.submitted, 0);
  cr_assert_eq(tko_group_destroy(&g), 0);
  cr_assert_eq(tko_pool_destroy(pool), 0);
  cr_assert_eq(atomic_load(&c.bad), 0);
}

Test(group, members_in_two_pools_are_refused) {
  gctx c;
  gctx_init(&c);
  tko_pool *a = make_pool(&c, 1), *b = make_pool(&c, 1);
  item its[2];
  items_init(its, 2, &c, 0, true);
  tko_group g;
  cr_assert_eq(tko_group_init(&g), 0);
  cr_assert_eq(tko_pool_pause(a), 0); /* keep the first member pending */
  cr_assert_eq(tko_group_submit(a, &g, item_fn, &its[0], 0), 0);
  cr_assert_eq(tko_group_submit(b, &g, item_fn, &its[1], 0), -EINVAL);
  cr_assert_eq(tko_group_pending(&g), 1);
  cr_assert_eq(tko_pool_resume(a), 0);
  cr_assert_eq(tko_group_wait(&g, -1), 0);
  cr_assert_eq(tko_pool_wait_idle(b, -1), 0);
  cr_assert_eq(atomic_load(&its[0].ran), 1);
  cr_assert_eq(atomic_load(&its[1].ran), 0);
  cr_assert_eq(tko_group_destroy(&g), 0);
  cr_assert_eq(tko_pool_destroy(a), 0);
  cr_assert_eq(tko_pool_destroy(b), 0);
}

Test(group, destroy_is_busy_while_members_pend) {
  gctx c;
  gctx_init(&c);
  tko_pool *pool = make_pool(&c, 1);
  item it;
  items_init(&it, 1, &c, 0, true);
  tko_group g;
  cr_assert_eq(tko_group_init(&g), 0);
  cr_assert_eq(tko_group_submit(pool, &g, blocker_fn, &it, 0), 0);
  cr_assert(tt_count_wait_geq(&c.started, 1));
  cr_assert_eq(tko_group_pending(&g), 1);
  cr_assert_eq(tko_group_destroy(&g), -EBUSY);
  cr_assert_eq(tko_group_wait(&g, 0), -ETIMEDOUT);
  tt_gate_open(&c.gate);
  cr_assert_eq(tko_group_wait(&g, -1), 0);
  cr_assert_eq(tko_group_destroy(&g), 0);
  cr_assert_eq(tko_pool_destroy(pool), 0);
  cr_assert_eq(atomic_load(&c.bad), 0);
}

Test(group, wait_returns_when_every_member_is_done) {
  gctx c;
  gctx_init(&c);
  tko_pool *pool = make_pool(&c, 2);
  enum { N = TT_SCALE(4000, 400) };
  static item its[N];
  items_init(its, N, &c, 0, true);
  tko_group g;
  cr_assert_eq(tko_group_init(&g), 0);
  for (int i = 0; i < N; i++)
    cr_assert_eq(tko_group_submit(pool, &g, item_fn, &its[i], i % 5), 0);
  cr_assert_eq(tko_group_wait(&g, -1), 0);
  cr_assert_eq(tko_group_pending(&g), 0);
  cr_assert_eq(tt_count_get(&c.runs), N, "wait returned before every member ran");
  for (int i = 0; i < N; i++)
    cr_assert_eq(atomic_load(&its[i].ran), 1);
  cr_assert_eq(tko_group_status(&g), 0);
  cr_assert_eq(tko_group_destroy(&g), 0);
  cr_assert_eq(tko_pool_destroy(pool), 0);
  cr_assert_eq(atomic_load(&c.bad), 0);
}

Test(group, wait_times_out_while_paused) {
  gctx c;
  gctx_init(&c);
  tko_pool *pool = make_pool(&c, 1);
  item it;
  items_init(&it, 1, &c, 0, true);
  tko_group g;
  cr_assert_eq(tko_group_init(&g), 0);
  cr_assert_eq(tko_pool_pause(pool), 0);
  cr_assert_eq(tko_group_submit(pool, &g, item_fn, &it, 0), 0);
  cr_assert_eq(tko_group_pending(&g), 1);
  cr_assert_eq(tko_group_wait(&g, 0), -ETIMEDOUT);
  cr_assert_eq(tko_group_wait(&g, 20), -ETIMEDOUT);
  cr_assert_eq(atomic_load(&it.ran), 0);
  cr_assert_eq(tko_pool_resume(pool), 0);
  cr_assert_eq(tko_group_wait(&g, -1), 0);
  cr_assert_eq(atomic_load(&it.ran), 1);
  cr_assert_eq(tko_group_pending(&g), 0);
  cr_assert_eq(tko_group_destroy(&g), 0);
  cr_assert_eq(tko_pool_destroy(pool), 0);
  cr_assert_eq(atomic_load(&c.bad), 0);
}

Test(group, group_of_one_gives_the_task_status) {
  gctx c;
  gctx_init(&c);
  tko_pool *pool = make_pool(&c, 2);
  item bad, good;
  items_init(&bad, 1, &c, 7, true);
  items_init(&good, 1, &c, 0, true);
  tko_group g1, g2;
  cr_assert_eq(tko_group_init(&g1), 0);
  cr_assert_eq(tko_group_init(&g2), 0);
  cr_assert_eq(tko_group_submit(pool, &g1, item_fn, &bad, 0), 0);
  cr_assert_eq(tko_group_submit(pool, &g2, item_fn, &good, 0), 0);
  cr_assert_eq(tko_group_wait(&g1, -1), 0);
  cr_assert_eq(tko_group_wait(&g2, -1), 0);
  cr_assert_eq(tko_group_status(&g1), 7);
  cr_assert_eq(tko_group_status(&g2), 0);
  /* The status stays final after the wait. */
  cr_assert_eq(tko_group_status(&g1), 7);
  cr_assert_eq(tko_group_destroy(&g1), 0);
  cr_assert_eq(tko_group_destroy(&g2), 0);
  tko_stats s;
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  tko_pool_stats(pool, &s);
  cr_assert_eq(s.failed, 1);
  cr_assert_eq(tko_pool_destroy(pool), 0);
  cr_assert_eq(atomic_load(&c.bad), 0);
}

/* A member's end reaches its group before the pool counts the member
 * finished: once the pool is idle, the group is done without a wait, its
 * status the member's failure. */
Test(group, a_members_end_reaches_the_group_before_the_pool_counts_it) {
  gctx c;
  gctx_init(&c);
  tko_pool *pool = make_pool(&c, 2);
  enum { N = 8 };
  item its[N];
  items_init(its, N, &c, 0, true);
  its[N / 2].status = 5;
  tko_group g;
  cr_assert_eq(tko_group_init(&g), 0);
  for (int i = 0; i < N; i++) cr_assert_eq(tko_group_submit(pool, &g, item_fn, &its[i], 0), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  cr_assert_eq(tt_count_get(&c.runs), N);
  cr_assert_eq(tko_group_pending(&g), 0, "a member ran and its group still counts it");
  cr_assert_eq(tko_group_wait(&g, 0), 0);
  cr_assert_eq(tko_group_status(&g), 5);
  cr_assert_eq(tko_group_destroy(&g), 0);
  cr_assert_eq(tko_pool_destroy(pool), 0);
  cr_assert_eq(atomic_load(&c.bad), 0);
}

Test(group, status_is_the_first_failure) {
  gctx c;
  gctx_init(&c);
  tko_pool *pool = make_pool(&c, 1);
  item its[4];
  items_init(its, 4, &c, 0, true);
  its[1].status = 3;
  its[3].status = 5;
  tko_group g;
  cr_assert_eq(tko_group_init(&g), 0);
  /* One worker, equal weights: they run in submit order. */
  cr_assert_eq(tko_pool_pause(pool), 0);
  for (int i = 0; i < 4; i++)
    cr_assert_eq(tko_group_submit(pool, &g, item_fn, &its[i], 0), 0);
  cr_assert_eq(tko_pool_resume(pool), 0);
  cr_assert_eq(tko_group_wait(&g, -1), 0);
  cr_assert_eq(tko_group_status(&g), 3);
  cr_assert_eq(tko_group_destroy(&g), 0);
  cr_assert_eq(tko_pool_destroy(pool), 0);
  cr_assert_eq(atomic_load(&c.bad), 0);
}

Test(group, reuse_after_wait) {
  gctx c;
  gctx_init(&c);
  tko_pool *pool = make_pool(&c, 2);
  item its[20];
  items_init(its, 20, &c, 0, true);
  tko_group g;
  cr_assert_eq(tko_group_init(&g), 0);
  for (int round = 0; round < 2; round++) {
    for (int i = 0; i < 10; i++)
      cr_assert_eq(tko_group_submit(pool, &g, item_fn, &its[round * 10 + i], 0), 0);
    cr_assert_eq(tko_group_wait(&g, -1), 0);
    cr_assert_eq(tt_count_get(&c.runs), 10 * (round + 1));
  }
  cr_assert_eq(tko_group_destroy(&g), 0);
  cr_assert_eq(tko_pool_destroy(pool), 0);
  cr_assert_eq(atomic_load(&c.bad), 0);
}

/* ---- waiting from inside the pool ---------------------------------------- */

typedef struct nest {
  gctx *c;
  int depth; /* children submit grandchildren down to depth 0 */
  int fanout;
  atomic_int *ran;
  atomic_int *bad; /* a wait that did not return 0, or returned early */
} nest;

static int nest_fn(void *arg) {
  nest *n = arg;
  atomic_fetch_add(n->ran, 1);
  if (n->depth == 0) return 0;
  nest kids[8];
  tko_group g;
  if (tko_group_init(&g)) {
    atomic_fetch_add(n->bad, 1);
    return 1;
  }
  for (int i = 0; i < n->fanout; i++) {
    kids[i] = (nest){n->c, n->depth - 1, n->fanout, n->ran, n->bad};
    if (tko_group_submit(n->c->pool, &g, nest_fn, &kids[i], 0)) atomic_fetch_add(n->bad, 1);
  }
  /* kids[] lives on this stack: the wait must not return before they ran. */
  if (tko_group_wait(&g, -1) != 0 || tko_group_pending(&g) != 0) atomic_fetch_add(n->bad, 1);
  if (tko_group_status(&g) != 0) atomic_fetch_add(n->bad, 1);
  if (tko_group_destroy(&g)) atomic_fetch_add(n->bad, 1);
  return 0;
}

Test(group, wait_inside_a_task_on_one_worker_helps) {
  gctx c;
  gctx_init(&c);
  tko_pool *pool = make_pool(&c, 1);
  atomic_int ran = 0, bad = 0;
  /* 1 + 4 + 16 + 64 tasks, each waiting for its children on the one worker. */
  nest root = {&c, 3, 4, &ran, &bad};
  cr_assert_eq(tko_submit(pool, nest_fn, &root, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  cr_assert_eq(atomic_load(&ran), 1 + 4 + 16 + 64);
  cr_assert_eq(atomic_load(&bad), 0);
  cr_assert_eq(tko_pool_destroy(pool), 0);
  cr_assert_eq(atomic_load(&c.bad), 0);
}

/* A task waits for a group whose members another thread submitted while the
 * task was already running (so they are queued, not taken). */
typedef struct outside {
  gctx *c;
  tko_group *g;
  int rc;
  uint64_t pending_after;
} outside;

static int outside_waiter(void *arg) {
  outside *o = arg;
  tt_count_add(&o->c->started, 1);
  if (!tt_gate_wait(&o->c->gate)) atomic_fetch_add(&o->c->bad, 1);
  o->rc = tko_group_wait(o->g, -1);
  o->pending_after = tko_group_pending(o->g);
  return 0;
}

Test(group, wait_inside_a_task_for_members_from_outside) {
  gctx c;
  gctx_init(&c);
  tko_pool *pool = make_pool(&c, 1);
  tko_group g;
  cr_assert_eq(tko_group_init(&g), 0);
  outside o = {&c, &g, -1, 99};
  cr_assert_eq(tko_submit(pool, outside_waiter, &o, 100), 0);
  cr_assert(tt_count_wait_geq(&c.started, 1)); /* the only worker is inside it */
  item its[5];
  items_init(its, 5, &c, 0, true);
  for (int i = 0; i < 5; i++)
    cr_assert_eq(tko_group_submit(pool, &g, item_fn, &its[i], 0), 0);
  tt_gate_open(&c.gate);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  cr_assert_eq(o.rc, 0);
  cr_assert_eq(o.pending_after, 0);
  cr_assert_eq(tt_count_get(&c.runs), 5);
  cr_assert_eq(tko_group_destroy(&g), 0);
  cr_assert_eq(tko_pool_destroy(pool), 0);
  cr_assert_eq(atomic_load(&c.bad), 0);
}

/* With max_batch = 1 a worker never holds a member it took behind the task
 * that waits for it: the waiter and a member queued before it, taken by the
 * one worker in turn, do not deadlock. (With the default batch they do:
 * see regression_wait_on_member_taken_in_same_batch.) */
typedef struct one_waiter {
  tko_group *g;
  int rc;
} one_waiter;

static int one_waiter_fn(void *arg) {
  one_waiter *w = arg;
  w->rc = tko_group_wait(w->g, TT_LONG_MS);
  return 0;
}

Test(group, wait_inside_a_task_with_max_batch_one) {
  gctx c;
  gctx_init(&c);
  tko_options o = tko_basic_options(1);
  o.max_batch = 1;
  tko_pool *pool = NULL;
  cr_assert_eq(tko_pool_create(&pool, &o), 0);
  c.pool = pool;
  item m[3];
  items_init(m, 3, &c, 0, true);
  tko_group g;
  cr_assert_eq(tko_group_init(&g), 0);
  one_waiter w = {&g, 1};
  cr_assert_eq(tko_pool_pause(pool), 0);
  for (int i = 0; i < 3; i++)
    cr_assert_eq(tko_group_submit(pool, &g, item_fn, &m[i], 0), 0);
  cr_assert_eq(tko_submit(pool, one_waiter_fn, &w, 10), 0); /* runs first */
  cr_assert_eq(tko_pool_resume(pool), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  cr_assert_eq(w.rc, 0);
  cr_assert_eq(tt_count_get(&c.runs), 3);
  cr_assert_eq(tko_group_destroy(&g), 0);
  cr_assert_eq(tko_pool_destroy(pool), 0);
  cr_assert_eq(atomic_load(&c.bad), 0);
}

/* ---- cancel -------------------------------------------------------------- */

Test(group, cancel_hands_queued_members_to_on_cancel) {
  gctx c;
  gctx_init(&c);
  tko_pool *pool = make_pool(&c, 1);
  item members[5], others[3];
  items_init(members, 5, &c, 0, true);
  items_init(others, 3, &c, 0, false);
  tko_group g;
  cr_assert_eq(tko_group_init(&g), 0);
  cr_assert_eq(tko_pool_pause(pool), 0);
  for (int i = 0; i < 5; i++) {
    cr_assert_eq(tko_group_submit(pool, &g, item_fn, &members[i], i), 0);
    if (i < 3) cr_assert_eq(tko_submit(pool, item_fn, &others[i], i), 0);
  }
  cr_assert_eq(tko_group_cancel(&g), 5);
  cr_assert_eq(tko_group_pending(&g), 0);
  cr_assert_eq(tko_group_wait(&g, 0), 0);
  cr_assert_eq(tko_group_status(&g), -ECANCELED);
  cr_assert_eq(tt_count_get(&c.cancels), 5);
  for (int i = 0; i < 5; i++)
    cr_assert_eq(atomic_load(&members[i].cancelled), 1);
  for (int i = 0; i < 3; i++)
    cr_assert_eq(atomic_load(&others[i].cancelled), 0);
  cr_assert_eq(tko_group_cancel(&g), 0, "nothing left to cancel");

  tko_stats s;
  tko_pool_stats(pool, &s);
  cr_assert_eq(s.cancelled, 5);
  cr_assert_eq(s.queued, 3);
  cr_assert_eq(tko_pool_resume(pool), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  cr_assert_eq(tt_count_get(&c.runs), 3, "only the non-members run");
  for (int i = 0; i < 5; i++)
    cr_assert_eq(atomic_load(&members[i].ran), 0);
  tko_pool_stats(pool, &s);
  cr_assert_eq(s.submitted, 8);
  cr_assert_eq(s.completed + s.cancelled, 8);
  cr_assert_eq(tko_group_destroy(&g), 0);
  cr_assert_eq(tko_pool_destroy(pool), 0);
  cr_assert_eq(atomic_load(&c.bad), 0);
}

Test(group, cancel_leaves_started_members_alone) {
  gctx c;
  gctx_init(&c);
  tko_pool *pool = make_pool(&c, 1);
  item a, rest[2];
  items_init(&a, 1, &c, 0, true);
  items_init(rest, 2, &c, 0, true);
  tko_group g;
  cr_assert_eq(tko_group_init(&g), 0);
  cr_assert_eq(tko_group_submit(pool, &g, blocker_fn, &a, 0), 0);
  cr_assert(tt_count_wait_geq(&c.started, 1)); /* a runs: the worker is busy */
  for (int i = 0; i < 2; i++)
    cr_assert_eq(tko_group_submit(pool, &g, item_fn, &rest[i], 0), 0);
  cr_assert_eq(tko_group_cancel(&g), 2);
  cr_assert_eq(tko_group_pending(&g), 1, "the running member is still pending");
  cr_assert_eq(tko_group_wait(&g, 0), -ETIMEDOUT);
  tt_gate_open(&c.gate);
  cr_assert_eq(tko_group_wait(&g, -1), 0);
  cr_assert_eq(tko_group_status(&g), -ECANCELED);
  cr_assert_eq(atomic_load(&a.ran), 1);
  cr_assert_eq(tt_count_get(&c.runs) + tt_count_get(&c.cancels), 3);
  cr_assert_eq(tko_group_destroy(&g), 0);
  cr_assert_eq(tko_pool_destroy(pool), 0);
  cr_assert_eq(atomic_load(&c.bad), 0);
}

/* ---- shutdown ------------------------------------------------------------ */

static int shutdown_cancel_fn(void *arg) {
  return tko_pool_shutdown(arg, TKO_CANCEL);
}

Test(group, shutdown_cancel_finishes_the_group_with_ecanceled) {
  gctx c;
  gctx_init(&c);
  tko_pool *pool = make_pool(&c, 1);
  item a, rest[5];
  items_init(&a, 1, &c, 0, true);
  items_init(rest, 5, &c, 0, true);
  tko_group g;
  cr_assert_eq(tko_group_init(&g), 0);
  cr_assert_eq(tko_group_submit(pool, &g, blocker_fn, &a, 0), 0);
  cr_assert(tt_count_wait_geq(&c.started, 1));
  for (int i = 0; i < 5; i++)
    cr_assert_eq(tko_group_submit(pool, &g, item_fn, &rest[i], 0), 0);
  /* Shutdown cancels the queued members, then waits for the running one. */
  tf_thread t;
  cr_assert_eq(tf_thread_start(&t, shutdown_cancel_fn, pool), 0);
  cr_assert(tt_count_wait_eq(&c.cancels, 5));
  cr_assert_geq(tko_group_pending(&g), 1); /* the running member at least */
  tt_gate_open(&c.gate);
  int rc = -1;
  cr_assert(tf_thread_join(&t, &rc));
  cr_assert_eq(rc, 0);
  cr_assert_eq(tko_group_wait(&g, 0), 0);
  cr_assert_eq(tko_group_status(&g), -ECANCELED);
  cr_assert_eq(tt_count_get(&c.runs) + tt_count_get(&c.cancels), 6, "a member was lost");
  tko_stats s;
  tko_pool_stats(pool, &s);
  cr_assert_eq(s.completed, 1);
  cr_assert_eq(s.cancelled, 5);
  cr_assert_eq(s.submitted, 6);
  cr_assert_eq(tko_group_submit(pool, &g, item_fn, &rest[0], 0), -ESHUTDOWN);
  cr_assert_eq(tko_group_pending(&g), 0);
  cr_assert_eq(tko_group_destroy(&g), 0);
  cr_assert_eq(tko_pool_destroy(pool), 0);
  cr_assert_eq(atomic_load(&c.bad), 0);
}

Test(group, shutdown_cancel_on_a_paused_pool) {
  gctx c;
  gctx_init(&c);
  tko_pool *pool = make_pool(&c, 2);
  enum { N = 40 };
  item its[N];
  items_init(its, N, &c, 0, true);
  tko_group g;
  cr_assert_eq(tko_group_init(&g), 0);
  cr_assert_eq(tko_pool_pause(pool), 0);
  for (int i = 0; i < N; i++)
    cr_assert_eq(tko_group_submit(pool, &g, item_fn, &its[i], i), 0);
  cr_assert_eq(tko_pool_shutdown(pool, TKO_CANCEL), 0);
  cr_assert_eq(tko_group_wait(&g, -1), 0);
  cr_assert_eq(tko_group_status(&g), -ECANCELED);
  cr_assert_eq(tt_count_get(&c.cancels), N);
  cr_assert_eq(tt_count_get(&c.runs), 0);
  cr_assert_eq(tko_group_destroy(&g), 0);
  cr_assert_eq(tko_pool_destroy(pool), 0);
  cr_assert_eq(atomic_load(&c.bad), 0);
}

Test(group, shutdown_drain_runs_queued_members) {
  gctx c;
  gctx_init(&c);
  tko_pool *pool = make_pool(&c, 1);
  enum { N = 30 };
  item its[N];
  items_init(its, N, &c, 0, true);
  tko_group g;
  cr_assert_eq(tko_group_init(&g), 0);
  cr_assert_eq(tko_pool_pause(pool), 0);
  for (int i = 0; i < N; i++)
    cr_assert_eq(tko_group_submit(pool, &g, item_fn, &its[i], 0), 0);
  cr_assert_eq(tko_pool_shutdown(pool, TKO_DRAIN), 0);
  cr_assert_eq(tko_group_wait(&g, 0), 0);
  cr_assert_eq(tko_group_status(&g), 0);
  cr_assert_eq(tt_count_get(&c.runs), N);
  cr_assert_eq(tt_count_get(&c.cancels), 0);
  cr_assert_eq(tko_group_submit(pool, &g, item_fn, &its[0], 0), -ESHUTDOWN);
  cr_assert_eq(tko_group_destroy(&g), 0);
  cr_assert_eq(tko_pool_destroy(pool), 0);
  cr_assert_eq(atomic_load(&c.bad), 0);
}

/* ---- concurrency --------------------------------------------------------- */

typedef struct gthread {
  tko_pool *pool;
  atomic_int ran;
  int bad;
} gthread;

static int gthread_task(void *arg) {
  atomic_fetch_add(&((gthread *)arg)->ran, 1);
  return 0;
}

static void *gthread_main(void *arg) {
  gthread *t = arg;
  enum { ROUNDS = TT_SCALE(50, 10), PER = 40 };
  for (int r = 0; r < ROUNDS; r++) {
    tko_group g;
    if (tko_group_init(&g)) t->bad++;
    for (int i = 0; i < PER; i++)
      if (tko_group_submit(t->pool, &g, gthread_task, t, i & 3)) t->bad++;
    if (tko_group_wait(&g, -1)) t->bad++;
    if (atomic_load(&t->ran) != (r + 1) * PER) t->bad++;
    if (tko_group_destroy(&g)) t->bad++;
  }
  return NULL;
}

Test(group, threads_wait_on_their_own_groups) {
  gctx c;
  gctx_init(&c);
  tko_pool *pool = make_pool(&c, 2);
  enum { T = 4 };
  gthread ts[T];
  pthread_t th[T];
  for (int i = 0; i < T; i++) {
    ts[i].pool = pool;
    atomic_init(&ts[i].ran, 0);
    ts[i].bad = 0;
    cr_assert_eq(pthread_create(&th[i], NULL, gthread_main, &ts[i]), 0);
  }
  for (int i = 0; i < T; i++) {
    pthread_join(th[i], NULL);
    cr_assert_eq(ts[i].bad, 0);
  }
  cr_assert_eq(tko_pool_destroy(pool), 0);
  cr_assert_eq(atomic_load(&c.bad), 0);
}

/* ---- regressions: core bugs these tests found, now fixed ------------- */

/* A worker takes several queued tasks at once (max_batch, default 64). If
 * the task that waits is in the same take as a member of its group, the
 * member sits in the waiting worker's private batch: nobody else can run it,
 * and the helping wait only looks at the queue, so the wait never returns
 * (here: it times out). The header promises that a wait from inside the
 * pool cannot deadlock; max_batch = 1 avoids it. */
typedef struct waiter {
  tko_group *g;
  int rc;
} waiter;

static int group_waiter(void *arg) {
  waiter *w = arg;
  w->rc = tko_group_wait(w->g, 5000); /* -1 in real code: a deadlock */
  return 0;
}

Test(group, regression_wait_on_member_taken_in_same_batch) {
  gctx c;
  gctx_init(&c);
  tko_pool *pool = make_pool(&c, 1);
  item m;
  items_init(&m, 1, &c, 0, true);
  tko_group g;
  cr_assert_eq(tko_group_init(&g), 0);
  waiter w = {&g, 1};
  cr_assert_eq(tko_pool_pause(pool), 0);
  cr_assert_eq(tko_group_submit(pool, &g, item_fn, &m, 0), 0);
  cr_assert_eq(tko_submit(pool, group_waiter, &w, 10), 0); /* runs first */
  cr_assert_eq(tko_pool_resume(pool), 0);                  /* the worker takes both at once */
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  cr_assert_eq(w.rc, 0, "group wait inside the pool did not return (deadlock)");
  cr_assert_eq(tko_group_destroy(&g), 0);
  cr_assert_eq(tko_pool_destroy(pool), 0);
  cr_assert_eq(atomic_load(&c.bad), 0);
}

typedef struct helper_wait {
  gctx *c;
  tko_group g;
  item m;
  pid_t tid;
  int rc;
  bool pause_first, async_member;
} helper_wait;

static int self_completing(tko_async *op, void *arg) {
  return tko_async_complete(op, 0);
}

/* Submits one member, tells the test it is about to wait, then waits. */
static int helper_wait_fn(void *arg) {
  helper_wait *h = arg;
  if (h->pause_first) tko_pool_pause(h->c->pool);
  if (h->async_member)
    tko_group_submit_async(h->c->pool, &h->g, self_completing, &h->m, 0);
  else
    tko_group_submit(h->c->pool, &h->g, item_fn, &h->m, 0);
  pthread_mutex_lock(&h->c->started.mu);
  h->tid = tf_gettid();
  pthread_mutex_unlock(&h->c->started.mu);
  tt_count_add(&h->c->started, 1);
  h->rc = tko_group_wait(&h->g, 5000); /* -1 in real code: a deadlock */
  return 0;
}

/* One worker, paused by its own task, which then waits on a group: the
 * helping wait blocks on the group's condition variable because nothing is
 * runnable. tko_pool_resume wakes only sleeping workers, not helpers, so the
 * member is never run and the wait never returns. */
Test(group, regression_helping_wait_misses_resume) {
  gctx c;
  gctx_init(&c);
  tko_pool *pool = make_pool(&c, 1);
  helper_wait h = {.c = &c, .rc = 1, .pause_first = true};
  items_init(&h.m, 1, &c, 0, true);
  cr_assert_eq(tko_group_init(&h.g), 0);
  cr_assert_eq(tko_submit(pool, helper_wait_fn, &h, 0), 0);
  cr_assert(tt_count_wait_geq(&c.started, 1));
  pthread_mutex_lock(&c.started.mu);
  pid_t tid = h.tid;
  pthread_mutex_unlock(&c.started.mu);
  cr_assert(tf_wait_thread_sleeping(tid)); /* blocked inside tko_group_wait */
  cr_assert_eq(tko_pool_resume(pool), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  cr_assert_eq(h.rc, 0, "the helping wait slept through tko_pool_resume");
  cr_assert_eq(tko_group_destroy(&h.g), 0);
  cr_assert_eq(tko_pool_destroy(pool), 0);
  cr_assert_eq(atomic_load(&c.bad), 0);
}

/* Same shape with max_async_inflight = 1: the group's async member waits
 * for an in-flight slot; when another async task completes, the completion
 * wakes sleeping workers only, so the helping worker never starts it. */
typedef struct held {
  tko_async *op;
  tt_count seen;
} held;

static int hold_op(tko_async *op, void *arg) {
  held *h = arg;
  pthread_mutex_lock(&h->seen.mu);
  h->op = op;
  pthread_mutex_unlock(&h->seen.mu);
  tt_count_add(&h->seen, 1);
  return 0;
}

Test(group, regression_helping_wait_misses_freed_async_slot) {
  gctx c;
  gctx_init(&c);
  tko_options o = tko_basic_options(1);
  o.max_async_inflight = 1;
  o.hooks.user = &c;
  o.hooks.on_cancel = on_cancel;
  tko_pool *pool = NULL;
  cr_assert_eq(tko_pool_create(&pool, &o), 0);
  c.pool = pool;
  held a = {0};
  tt_count_init(&a.seen);
  cr_assert_eq(tko_submit_async(pool, hold_op, &a, 0), 0);
  cr_assert(tt_count_wait_geq(&a.seen, 1)); /* the only slot is taken */
  helper_wait h = {.c = &c, .rc = 1, .async_member = true};
  items_init(&h.m, 1, &c, 0, true);
  cr_assert_eq(tko_group_init(&h.g), 0);
  cr_assert_eq(tko_submit(pool, helper_wait_fn, &h, 0), 0);
  cr_assert(tt_count_wait_geq(&c.started, 1));
  pthread_mutex_lock(&c.started.mu);
  pid_t tid = h.tid;
  pthread_mutex_unlock(&c.started.mu);
  cr_assert(tf_wait_thread_sleeping(tid));
  pthread_mutex_lock(&a.seen.mu);
  tko_async *op = a.op;
  pthread_mutex_unlock(&a.seen.mu);
  cr_assert_eq(tko_async_complete(op, 0), 0); /* frees the slot */
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  cr_assert_eq(h.rc, 0, "the helping wait slept through a freed async slot");
  cr_assert_eq(tko_group_destroy(&h.g), 0);
  cr_assert_eq(tko_pool_destroy(pool), 0);
  cr_assert_eq(atomic_load(&c.bad), 0);
}

/* ---- regressions: issue 14 ------------------------------------------------ */

/* Defect 7: the helping path ignored the timeout. A task on a one-worker
 * pool waits on a group whose member is queued behind fillers: with 0 the
 * wait ran every filler and the member (it returned 0 after running them
 * all); now it starts nothing and returns -ETIMEDOUT. With a 30 ms timeout
 * and 20 ms fillers, it starts no filler after the deadline, so it returns
 * -ETIMEDOUT before it could have run them all. */
enum { FILLERS = 10 };

typedef struct deadline_waiter {
  tko_group *g;
  long timeout_ms;
  int rc;
  atomic_int *fillers_ran;
  int fillers_at_return;
} deadline_waiter;

static int slow_filler_fn(void *arg) {
  atomic_int *ran = arg;
  struct timespec ts = {0, 20 * 1000000L}; /* long-running, not a wait for anything */
  nanosleep(&ts, NULL);
  atomic_fetch_add(ran, 1);
  return 0;
}

static int deadline_waiter_fn(void *arg) {
  deadline_waiter *w = arg;
  w->rc = tko_group_wait(w->g, w->timeout_ms);
  w->fillers_at_return = atomic_load(w->fillers_ran);
  return 0;
}

static void helping_wait_keeps_its_deadline(long timeout_ms) {
  gctx c;
  gctx_init(&c);
  tko_pool *pool = make_pool(&c, 1);
  item member;
  items_init(&member, 1, &c, 0, true);
  tko_group g;
  cr_assert_eq(tko_group_init(&g), 0);
  atomic_int fillers_ran = 0;
  deadline_waiter w = {&g, timeout_ms, 1, &fillers_ran, -1};
  cr_assert_eq(tko_pool_pause(pool), 0);
  cr_assert_eq(tko_submit(pool, deadline_waiter_fn, &w, 10), 0); /* runs first */
  for (int i = 0; i < FILLERS; i++)
    cr_assert_eq(tko_submit(pool, slow_filler_fn, &fillers_ran, 5), 0);
  cr_assert_eq(tko_group_submit(pool, &g, item_fn, &member, 0), 0); /* runs last */
  cr_assert_eq(tko_pool_resume(pool), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  cr_assert_eq(w.rc, -ETIMEDOUT, "the helping wait ran past its timeout");
  if (timeout_ms == 0) cr_assert_eq(w.fillers_at_return, 0, "wait(0) ran tasks");
  cr_assert_lt(w.fillers_at_return, FILLERS);
  cr_assert_eq(atomic_load(&fillers_ran), FILLERS);
  cr_assert_eq(atomic_load(&member.ran), 1);
  cr_assert_eq(tko_group_destroy(&g), 0);
  cr_assert_eq(tko_pool_destroy(pool), 0);
  cr_assert_eq(atomic_load(&c.bad), 0);
}

Test(group, regression_helping_wait_zero_runs_nothing) {
  helping_wait_keeps_its_deadline(0);
}

Test(group, regression_helping_wait_starts_nothing_past_its_deadline) {
  helping_wait_keeps_its_deadline(30);
}

/* Defect 8: nested helping waits overflowed the stack. Each task of a chain
 * submits the next into its own group and waits for it, on a one-worker
 * pool: 20,000 deep ended in SIGSEGV (100,000 here, so it crashes
 * whatever the frame sizes). Now a wait nested more than
 * TKO_MAX_HELP_DEPTH deep returns -EDEADLK at once (its member is still
 * queued and runs later, starting a new nest), so every task runs once and
 * every wait returns 0 or -EDEADLK. */
enum { CHAIN = TT_SCALE(100000, 5000) };

typedef struct chain_link {
  tko_pool *pool;
  tko_group g;
  struct chain_link *next; /* NULL at the end of the chain */
  atomic_int ran;
  int rc;
} chain_link;

static int link_fn(void *arg) {
  chain_link *l = arg;
  atomic_fetch_add(&l->ran, 1);
  l->rc = 0;
  if (!l->next) return 0;
  l->rc = tko_group_submit(l->pool, &l->g, link_fn, l->next, 0);
  if (l->rc == 0) l->rc = tko_group_wait(&l->g, -1);
  return 0;
}

Test(group, regression_deeply_nested_helping_waits_do_not_overflow_the_stack) {
  gctx c;
  gctx_init(&c);
  tko_pool *pool = make_pool(&c, 1);
  chain_link *chain = calloc(CHAIN, sizeof *chain);
  cr_assert_not_null(chain);
  for (int i = 0; i < CHAIN; i++) {
    chain[i].pool = pool;
    chain[i].next = i + 1 < CHAIN ? &chain[i + 1] : NULL;
    cr_assert_eq(tko_group_init(&chain[i].g), 0);
  }
  cr_assert_eq(tko_submit(pool, link_fn, &chain[0], 0), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  int deadlk = 0;
  for (int i = 0; i < CHAIN; i++) {
    cr_assert_eq(atomic_load(&chain[i].ran), 1, "link %d", i);
    cr_assert(chain[i].rc == 0 || chain[i].rc == -EDEADLK, "link %d: %d", i, chain[i].rc);
    deadlk += chain[i].rc == -EDEADLK;
    cr_assert_eq(tko_group_destroy(&chain[i].g), 0);
  }
  /* One in every TKO_MAX_HELP_DEPTH + 1 links is past the bound. */
  cr_assert_eq(deadlk, (CHAIN - 1) / (TKO_MAX_HELP_DEPTH + 1));
  cr_assert_eq(tko_pool_destroy(pool), 0);
  free(chain);
  cr_assert_eq(atomic_load(&c.bad), 0);
}

/* ---- a helping wait with nothing to help ---------------------------------- */

/* A task waits on a group whose one member runs on the other worker and
 * nothing is queued: the helping wait has nothing to run, so it sleeps.
 * With a timeout it gives up at the deadline (-ETIMEDOUT, the member still
 * running); without one it returns once the member finishes. */
typedef struct lone_wait {
  tko_group *g;
  item *member;
  tt_count timed_out; /* the timed wait returned -ETIMEDOUT */
  atomic_int timed_rc, rc, member_ran_before_return, tid;
} lone_wait;

static int lone_waiter_fn(void *arg) {
  lone_wait *w = arg;
  atomic_store(&w->tid, (int)tf_gettid());
  atomic_store(&w->timed_rc, tko_group_wait(w->g, 20));
  tt_count_add(&w->timed_out, 1);
  atomic_store(&w->rc, tko_group_wait(w->g, -1));
  atomic_store(&w->member_ran_before_return, atomic_load(&w->member->ran));
  return 0;
}

Test(group, helping_wait_with_nothing_to_run_sleeps_until_the_member_or_the_deadline) {
  gctx c;
  gctx_init(&c);
  tko_pool *pool = make_pool(&c, 2);
  item member;
  items_init(&member, 1, &c, 0, true);
  tko_group g;
  cr_assert_eq(tko_group_init(&g), 0);
  cr_assert_eq(tko_group_submit(pool, &g, blocker_fn, &member, 0), 0);
  cr_assert(tt_count_wait_geq(&c.started, 1)); /* on one worker, held */
  lone_wait w = {.g = &g, .member = &member};
  tt_count_init(&w.timed_out);
  cr_assert_eq(tko_submit(pool, lone_waiter_fn, &w, 0), 0); /* on the other */
  cr_assert(tt_count_wait_geq(&w.timed_out, 1));
  cr_assert_eq(atomic_load(&w.timed_rc), -ETIMEDOUT);
  cr_assert_eq(atomic_load(&member.ran), 0);
  /* Best effort: the waiter is asleep in its untimed wait (if not yet,
   * it finds the member done, and the checks below hold all the same). */
  tf_wait_thread_sleeping(atomic_load(&w.tid));
  tt_gate_open(&c.gate);
  cr_assert_eq(tko_pool_wait_idle(pool, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&w.rc), 0);
  cr_assert_eq(atomic_load(&w.member_ran_before_return), 1, "the wait returned early");
  cr_assert_eq(tko_group_destroy(&g), 0);
  cr_assert_eq(tko_pool_destroy(pool), 0);
  cr_assert_eq(atomic_load(&c.bad), 0);
}

/* ---- cancelling more members than one grab -------------------------------- */

static int async_item_fn(tko_async *op, void *arg) {
  item_fn(arg);
  return tko_async_complete(op, 0);
}

/* Cancel takes queued members in grabs of a bounded size: several hundred
 * plain members, mixed with non-members, and async members behind them,
 * are all cancelled exactly once and the non-members all run. With aging
 * on, a bucket whose head was cancelled is re-sorted by its new head. */
Test(group, cancel_takes_more_members_than_one_grab) {
  enum { N = 300, ASYNC = 5 };
  gctx c;
  gctx_init(&c);
  tko_options o = tko_basic_options(1);
  o.aging_ms = 1000;
  o.hooks.user = &c;
  o.hooks.on_cancel = on_cancel;
  tko_pool *pool = NULL;
  cr_assert_eq(tko_pool_create(&pool, &o), 0);
  c.pool = pool;
  static item members[N + ASYNC], others[N];
  items_init(members, N + ASYNC, &c, 0, true);
  items_init(others, N, &c, 0, false);
  tko_group g;
  cr_assert_eq(tko_group_init(&g), 0);
  cr_assert_eq(tko_pool_pause(pool), 0);
  for (int i = 0; i < N; i++) {
    cr_assert_eq(tko_group_submit(pool, &g, item_fn, &members[i], i % 3), 0);
    cr_assert_eq(tko_submit(pool, item_fn, &others[i], i % 3), 0);
  }
  for (int i = N; i < N + ASYNC; i++)
    cr_assert_eq(tko_group_submit_async(pool, &g, async_item_fn, &members[i], 0), 0);
  cr_assert_eq(tko_group_cancel(&g), N + ASYNC);
  cr_assert_eq(tko_group_pending(&g), 0);
  cr_assert_eq(tko_group_status(&g), -ECANCELED);
  cr_assert_eq(tko_pool_resume(pool), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, TT_LONG_MS), 0);
  for (int i = 0; i < N + ASYNC; i++) {
    cr_assert_eq(atomic_load(&members[i].cancelled), 1, "member %d", i);
    cr_assert_eq(atomic_load(&members[i].ran), 0, "member %d", i);
  }
  for (int i = 0; i < N; i++) cr_assert_eq(atomic_load(&others[i].ran), 1, "other %d", i);
  tko_stats s;
  tko_pool_stats(pool, &s);
  cr_assert_eq(s.cancelled, N + ASYNC);
  cr_assert_eq(s.completed, N);
  cr_assert_eq(tko_group_destroy(&g), 0);
  cr_assert_eq(tko_pool_destroy(pool), 0);
  cr_assert_eq(atomic_load(&c.bad), 0);
}

/* A task's helping wait on a group while other threads keep submitting
 * members to it, some of which wait on groups of their own: every member
 * runs, every wait returns. The wait reads the group's pool under the
 * group's lock only: each submit rewrites it there. The shape is the
 * attack program's that made TSan report that race (6 runs of 6): rounds
 * of a fresh group, four submitters pausing now and then so that the group
 * empties and fills again, and a waiting task that starts its wait over
 * each time. */
enum { RACING_SUBMITTERS = 4 };

typedef struct racing_members racing_members;
struct racing_members {
  tko_pool *pool;
  tko_group g;
  atomic_int submitters_done, waiter_done, bad;
  long per_submitter;
};

static int racing_leaf(void *arg) {
  (void)arg;
  return 0;
}

/* Every fifth member waits for three children of its own (a nested helping
 * wait), nesting at most 24 deep (TKO_MAX_HELP_DEPTH is 64). */
static int racing_member(void *arg) {
  racing_members *r = arg;
  static _Thread_local int depth;
  static _Thread_local unsigned seq;
  if (seq++ % 5 || depth >= 24) return 0;
  depth++;
  tko_group g2;
  if (tko_group_init(&g2)) atomic_store(&r->bad, 1);
  for (int i = 0; i < 3; i++)
    if (tko_group_submit(r->pool, &g2, i ? racing_leaf : racing_member, r, 0))
      atomic_store(&r->bad, 1);
  if (tko_group_wait(&g2, -1) || tko_group_destroy(&g2)) atomic_store(&r->bad, 1);
  depth--;
  return 0;
}

static void pause_us(uint64_t us) {
  struct timespec ts = {0, (long)us * 1000};
  nanosleep(&ts, NULL);
}

/* The waiting task: waits, and starts over, until every submitter is done
 * and the group is empty. */
static int wait_while_members_come(void *arg) {
  racing_members *r = arg;
  for (;;) {
    int rc = tko_group_wait(&r->g, TT_LONG_MS);
    if (rc) {
      atomic_store(&r->bad, 1);
      break;
    }
    if (atomic_load(&r->submitters_done) == RACING_SUBMITTERS && tko_group_pending(&r->g) == 0)
      break;
    pause_us(20);
  }
  atomic_store(&r->waiter_done, 1);
  return 0;
}

static void *submit_members(void *arg) {
  racing_members *r = arg;
  uint64_t seed = (uint64_t)(uintptr_t)&seed;
  for (long i = 0; i < r->per_submitter; i++) {
    if (tko_group_submit(r->pool, &r->g, racing_member, r, 0)) atomic_store(&r->bad, 1);
    if (tt_rand(&seed) % 8 == 0) pause_us(tt_rand(&seed) % 200);
  }
  atomic_fetch_add(&r->submitters_done, 1);
  return NULL;
}

Test(group, a_helping_wait_races_member_submits) {
  racing_members *r = calloc(1, sizeof *r);
  cr_assert_not_null(r);
  r->per_submitter = 300;
  tko_options o = tko_basic_options(1);
  cr_assert_eq(tko_pool_create(&r->pool, &o), 0);
  for (int round = 0; round < TT_SCALE(10, 6); round++) {
    cr_assert_eq(tko_group_init(&r->g), 0);
    atomic_store(&r->submitters_done, 0);
    atomic_store(&r->waiter_done, 0);
    cr_assert_eq(tko_submit(r->pool, wait_while_members_come, r, 10), 0);
    pthread_t th[RACING_SUBMITTERS];
    for (int i = 0; i < RACING_SUBMITTERS; i++)
      cr_assert_eq(pthread_create(&th[i], NULL, submit_members, r), 0);
    for (int i = 0; i < RACING_SUBMITTERS; i++) cr_assert_eq(pthread_join(th[i], NULL), 0);
    cr_assert_eq(tko_pool_wait_idle(r->pool, TT_LONG_MS), 0);
    cr_assert_eq(atomic_load(&r->waiter_done), 1, "round %d: the wait never ended", round);
    cr_assert_eq(atomic_load(&r->bad), 0, "round %d", round);
    cr_assert_eq(tko_group_destroy(&r->g), 0);
  }
  cr_assert_eq(tko_pool_destroy(r->pool), 0);
  free(r);
}

/* The attack on hooks: an on_cancel hook that waited on the group of the
 * member being cancelled hung (the member counts as pending until its hook
 * returns), where every other self-wait from a hook is -EDEADLK. So is a
 * member's own wait on its group, from the task or a hook of it. */
static tko_group self_group;
static atomic_int self_wait_rc = 1;

static void wait_own_group_on_cancel(void *user, const tko_task_info *t) {
  (void)user, (void)t;
  atomic_store(&self_wait_rc, tko_group_wait(&self_group, 2000));
}

/* Kills group-wait-on-itself-allowed (scripts/mutants.list): a 2 s wait
 * returned -ETIMEDOUT there. */
Test(group, an_on_cancel_waiting_on_its_own_group_gets_edeadlk) {
  tko_options o = tko_basic_options(1);
  o.hooks.on_cancel = wait_own_group_on_cancel;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  cr_assert_eq(tko_pool_pause(p), 0);
  cr_assert_eq(tko_group_init(&self_group), 0);
  cr_assert_eq(tko_group_submit(p, &self_group, tt_nop_fn, NULL, 0), 0);
  atomic_store(&self_wait_rc, 1);
  cr_assert_eq(tko_group_cancel(&self_group), 1);
  cr_assert_eq(atomic_load(&self_wait_rc), -EDEADLK);
  cr_assert_eq(tko_group_wait(&self_group, TT_LONG_MS), 0);
  cr_assert_eq(tko_group_status(&self_group), -ECANCELED);
  cr_assert_eq(tko_group_destroy(&self_group), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

static int wait_own_group_task(void *arg) {
  (void)arg;
  atomic_store(&self_wait_rc, tko_group_wait(&self_group, 2000));
  return 0;
}

Test(group, a_member_waiting_on_its_own_group_gets_edeadlk) {
  tko_options o = tko_basic_options(2);
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  cr_assert_eq(tko_group_init(&self_group), 0);
  atomic_store(&self_wait_rc, 1);
  cr_assert_eq(tko_group_submit(p, &self_group, wait_own_group_task, NULL, 0), 0);
  cr_assert_eq(tko_group_wait(&self_group, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&self_wait_rc), -EDEADLK);
  cr_assert_eq(tko_group_destroy(&self_group), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}
