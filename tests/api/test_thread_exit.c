/* SPDX-License-Identifier: MIT */
/* A task that calls pthread_exit (issue 14, defect 17): it used to wedge
 * the pool (stats.running stuck at 1, wait_idle never returning, the
 * worker gone). Now the task counts as completed and failed, its group
 * hears -ECANCELED, the tasks its worker had taken run on, a basic worker
 * is replaced, and the pool keeps working and shuts down. Bounded waits
 * turn a wedge into a failed assertion. */
#define _GNU_SOURCE /* pthread_getattr_np */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "taskorch.h"
#include "taskorch/lanes.h"
#include "tko_test.h"
#include "tko_test_fault.h"
#include "tko_test_feature.h"
#include "tko_test_sync.h"

typedef struct ctx {
  tt_count runs, starts, stops;
} ctx;

static int exit_fn(void *arg) {
  (void)arg;
  pthread_exit(NULL);
  return 0;
}

static int count_fn(void *arg) {
  tt_count_add(&((ctx *)arg)->runs, 1);
  return 0;
}

static void on_start(void *user, unsigned index, tko_worker_kind kind) {
  (void)index;
  (void)kind;
  tt_count_add(&((ctx *)user)->starts, 1);
}

static void on_stop(void *user, unsigned index, tko_worker_kind kind) {
  (void)index;
  (void)kind;
  tt_count_add(&((ctx *)user)->stops, 1);
}

static tko_pool *make_pool(ctx *c, unsigned basic, unsigned elastic) {
  memset(c, 0, sizeof *c);
  tt_count_init(&c->runs);
  tt_count_init(&c->starts);
  tt_count_init(&c->stops);
  tko_options o = elastic ? tko_elastic_options(basic, elastic, 60000) : tko_basic_options(basic);
  o.hooks.user = c;
  o.hooks.thread_start = on_start;
  o.hooks.thread_stop = on_stop;
  tko_pool *p = NULL;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  return p;
}

/* One worker takes the exiting task and four more in one batch (queued
 * while paused), so the four must go back to the queue and still run. */
static void exit_case(unsigned basic, unsigned elastic) {
  enum { AFTER = 4 };
  ctx c;
  tko_pool *pool = make_pool(&c, basic, elastic);
  cr_assert_eq(tko_pool_pause(pool), 0);
  tko_group g;
  cr_assert_eq(tko_group_init(&g), 0);
  cr_assert_eq(tko_group_submit(pool, &g, exit_fn, NULL, 10), 0);
  for (int i = 0; i < AFTER; i++) cr_assert_eq(tko_submit(pool, count_fn, &c, 0), 0);
  cr_assert_eq(tko_pool_resume(pool), 0);
  cr_assert_eq(tko_group_wait(&g, TT_LONG_MS), 0, "the group never heard of its member");
  cr_assert_eq(tko_group_status(&g), -ECANCELED);
  cr_assert_eq(tko_pool_wait_idle(pool, TT_LONG_MS), 0, "the pool wedged");
  cr_assert_eq(tt_count_get(&c.runs), AFTER);
  tko_stats s = tf_stats(pool);
  cr_assert_eq(s.running, 0);
  cr_assert_eq(s.completed, 1 + AFTER);
  cr_assert_eq(s.failed, 1);
  cr_assert_eq(s.basic_workers, basic);
  /* And it works on. */
  for (int i = 0; i < 20; i++) cr_assert_eq(tko_submit(pool, count_fn, &c, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, TT_LONG_MS), 0);
  cr_assert_eq(tt_count_get(&c.runs), AFTER + 20);
  cr_assert_eq(tko_group_destroy(&g), 0);
  cr_assert_eq(tko_pool_shutdown_timed(pool, TKO_DRAIN, TT_LONG_MS), 0);
  cr_assert_eq(tt_count_get(&c.starts), tt_count_get(&c.stops), "thread hooks unpaired");
  cr_assert_eq(tko_pool_destroy(pool), 0);
}

Test(thread_exit, a_basic_worker_is_replaced) { exit_case(1, 0); }

Test(thread_exit, an_elastic_worker_retires) { exit_case(0, 2); }

Test(thread_exit, many_exits_in_a_row) {
  ctx c;
  tko_pool *pool = make_pool(&c, 2, 0);
  for (int i = 0; i < TT_SCALE(50, 10); i++) {
    cr_assert_eq(tko_submit(pool, exit_fn, NULL, 0), 0);
    cr_assert_eq(tko_submit(pool, count_fn, &c, 0), 0);
  }
  cr_assert_eq(tko_pool_wait_idle(pool, TT_LONG_MS), 0);
  cr_assert_eq(tt_count_get(&c.runs), TT_SCALE(50, 10));
  cr_assert_eq(tf_stats(pool).basic_workers, 2);
  cr_assert_eq(tko_pool_destroy(pool), 0);
}

static int blocking_exit_fn(void *arg) {
  (void)arg;
  cr_assert_eq(tko_blocking_begin(), 0);
  pthread_exit(NULL);
  return 0;
}

static bool none_blocking(const tko_stats *s) {
  return s->blocking == 0;
}

/* A task that ends its thread inside tko_blocking_begin: the pool stops
 * counting that worker as blocked (stats.blocking back to 0). The exiting
 * thread may publish its task as finished before the count shows that, so
 * wait_idle can return first: read until it does. */
Test(thread_exit, an_exit_inside_the_blocking_hint_ends_the_hint) {
  ctx c;
  tko_pool *pool = make_pool(&c, 1, 0);
  cr_assert_eq(tko_submit(pool, blocking_exit_fn, NULL, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, TT_LONG_MS), 0);
  tko_stats s;
  cr_assert(tf_stats_wait(pool, &s, none_blocking), "the exited worker still counts as blocked");
  cr_assert_eq(s.failed, 1);
  cr_assert_eq(s.basic_workers, 1);
  cr_assert_eq(tko_submit(pool, count_fn, &c, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, TT_LONG_MS), 0);
  cr_assert_eq(tt_count_get(&c.runs), 1);
  cr_assert_eq(tko_pool_destroy(pool), 0);
}

static tko_group inner_group;

/* Waits for a member that ends the thread: the one worker runs that member
 * itself, inside this wait (helping), so both tasks' frames are on the
 * stack that pthread_exit unwinds. */
static int helping_waiter_fn(void *arg) {
  cr_assert_eq(tko_group_submit(arg, &inner_group, exit_fn, NULL, 0), 0);
  tko_group_wait(&inner_group, TT_LONG_MS);
  return 0; /* not reached */
}

/* Both the exiting task and the task whose group wait ran it count as
 * finished and failed, each group hears -ECANCELED, and the worker is
 * replaced. */
Test(thread_exit, an_exit_inside_a_helping_wait_finishes_both_tasks) {
  ctx c;
  tko_pool *pool = make_pool(&c, 1, 0);
  tko_group outer;
  cr_assert_eq(tko_group_init(&outer), 0);
  cr_assert_eq(tko_group_init(&inner_group), 0);
  cr_assert_eq(tko_group_submit(pool, &outer, helping_waiter_fn, pool, 0), 0);
  cr_assert_eq(tko_group_wait(&outer, TT_LONG_MS), 0, "the waiting task was not finished");
  cr_assert_eq(tko_group_status(&outer), -ECANCELED);
  cr_assert_eq(tko_group_wait(&inner_group, TT_LONG_MS), 0);
  cr_assert_eq(tko_group_status(&inner_group), -ECANCELED);
  cr_assert_eq(tko_pool_wait_idle(pool, TT_LONG_MS), 0);
  tko_stats s = tf_stats(pool);
  cr_assert_eq(s.completed, 2);
  cr_assert_eq(s.failed, 2);
  cr_assert_eq(s.running, 0);
  cr_assert_eq(s.basic_workers, 1);
  cr_assert_eq(tko_submit(pool, count_fn, &c, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, TT_LONG_MS), 0);
  cr_assert_eq(tt_count_get(&c.runs), 1);
  cr_assert_eq(tko_group_destroy(&outer), 0);
  cr_assert_eq(tko_group_destroy(&inner_group), 0);
  cr_assert_eq(tko_pool_destroy(pool), 0);
}

/* The tasks an exiting worker had taken go back where they were taken
 * from, not behind the later tasks of their weight: one worker takes the
 * exiting task and 15 more (a batch, queued while paused), 9 stay queued;
 * the 24 must still run in submit order. (They were appended, and ran
 * after the 9.) */
static atomic_int order_pos;
static int order_log[24];

static int ordered_fn(void *arg) {
  order_log[atomic_fetch_add(&order_pos, 1)] = (int)(intptr_t)arg;
  return 0;
}

Test(thread_exit, taken_tasks_go_back_in_their_order) {
  ctx c;
  tko_pool *pool = make_pool(&c, 1, 0);
  cr_assert_eq(tko_pool_pause(pool), 0);
  cr_assert_eq(tko_submit(pool, exit_fn, NULL, 10), 0);
  for (int i = 0; i < 24; i++)
    cr_assert_eq(tko_submit(pool, ordered_fn, (void *)(intptr_t)i, 0), 0);
  cr_assert_eq(tko_pool_resume(pool), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&order_pos), 24);
  for (int i = 0; i < 24; i++) cr_assert_eq(order_log[i], i, "position %d ran task %d", i, order_log[i]);
  cr_assert_eq(tko_pool_destroy(pool), 0);
}

/* ---- keyed tasks and lane tables (a keyed task's exit used to leave its
 * lane scheduled with the visit's other tasks gone, and destroy hung: found
 * by the attack on the recheck). The exit is the sixth task of one visit:
 * five ran before it, ten were taken with it and must run after it. */

enum { BEFORE = 5, AFTER = 10, LANE_KEY = 7 };

typedef int (*submit_to_lane)(void *to, tko_task_fn fn, void *arg);

static void exit_amid_a_visit(tko_pool *pool, submit_to_lane submit, void *to) {
  atomic_store(&order_pos, 0); /* the tests may share a process */
  cr_assert_eq(tko_pool_pause(pool), 0);
  for (int i = 0; i < BEFORE; i++)
    cr_assert_eq(submit(to, ordered_fn, (void *)(intptr_t)i), 0);
  cr_assert_eq(submit(to, exit_fn, NULL), 0);
  for (int i = BEFORE; i < BEFORE + AFTER; i++)
    cr_assert_eq(submit(to, ordered_fn, (void *)(intptr_t)i), 0);
  cr_assert_eq(tko_pool_resume(pool), 0);
}

static void assert_all_ran_in_order(void) {
  cr_assert_eq(atomic_load(&order_pos), BEFORE + AFTER);
  for (int i = 0; i < BEFORE + AFTER; i++)
    cr_assert_eq(order_log[i], i, "position %d ran task %d", i, order_log[i]);
}

/* The counts of the visit's tasks once idle (a pool's or a lane table's):
 * all accepted, all ran, the ended one failed, none left. */
static void assert_counted(uint64_t submitted, uint64_t completed, uint64_t failed, uint64_t left) {
  cr_assert_eq(submitted, BEFORE + AFTER + 1);
  cr_assert_eq(completed, BEFORE + AFTER + 1, "the ended task counts as completed");
  cr_assert_eq(failed, 1);
  cr_assert_eq(left, 0);
}

static int submit_keyed(void *pool, tko_task_fn fn, void *arg) {
  return tko_submit_keyed(pool, LANE_KEY, fn, arg, 0);
}

Test(thread_exit, a_keyed_task_hands_its_lane_on) {
  ctx c;
  tko_pool *pool = make_pool(&c, 1, 0);
  exit_amid_a_visit(pool, submit_keyed, pool);
  cr_assert_eq(tko_pool_wait_idle(pool, TT_LONG_MS), 0);
  assert_all_ran_in_order();
  tko_stats s;
  tko_pool_stats(pool, &s);
  assert_counted(s.submitted, s.completed, s.failed, s.queued + s.running);
  cr_assert_eq(s.basic_workers, 1, "the worker was replaced");
  /* The lane takes new tasks, and the pool shuts down. */
  cr_assert_eq(tko_submit_keyed(pool, LANE_KEY, count_fn, &c, 0), 0);
  cr_assert_eq(tko_pool_shutdown_timed(pool, TKO_DRAIN, TT_LONG_MS), 0);
  cr_assert_eq(tt_count_get(&c.runs), 1);
  cr_assert_eq(tko_pool_destroy(pool), 0);
}

static int submit_lane(void *lanes, tko_task_fn fn, void *arg) {
  return tko_lanes_submit(lanes, LANE_KEY, fn, arg, 0);
}

Test(thread_exit, a_lane_tables_task_hands_its_lane_on) {
  ctx c;
  tko_pool *pool = make_pool(&c, 1, 0);
  tko_lane_options lo = tko_lane_default_options();
  tko_lanes *lanes = NULL;
  cr_assert_eq(tko_lanes_create(&lanes, pool, &lo), 0);
  exit_amid_a_visit(pool, submit_lane, lanes);
  cr_assert_eq(tko_lanes_wait_idle(lanes, TT_LONG_MS), 0);
  assert_all_ran_in_order();
  tko_lane_stats ls;
  tko_lanes_stats(lanes, &ls);
  assert_counted(ls.submitted, ls.completed, ls.failed, ls.cancelled + ls.queued);
  cr_assert_eq(tko_lanes_destroy(lanes), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, TT_LONG_MS), 0);
  cr_assert_eq(tko_pool_destroy(pool), 0);
}

/* The ring cannot take the visit's other tasks back: the ending task
 * filled it (its capacity, 16, is the visit) and the allocator refuses
 * to grow it. Those tasks go to on_cancel, each once; the lane goes on. */
enum { RING = 16 };
static tko_lanes *oom_lanes;
static tfa oom_alloc;
static tt_count cancels, later_runs;

static int later_fn(void *arg) {
  (void)arg;
  tt_count_add(&later_runs, 1);
  return 0;
}

static int fill_then_exit_fn(void *arg) {
  (void)arg;
  for (int i = 0; i < RING; i++) cr_assert_eq(tko_lanes_submit(oom_lanes, LANE_KEY, later_fn, NULL, 0), 0);
  tfa_fail_from(&oom_alloc, 1);
  pthread_exit(NULL);
  return 0;
}

static void count_cancel(void *user, const tko_lane_task *t) {
  (void)user;
  cr_assert_eq(t->fn, count_fn, "only the visit's unstarted tasks are cancelled");
  tt_count_add(&cancels, 1);
}

Test(thread_exit, a_lane_that_cannot_take_its_tasks_back_cancels_them) {
  ctx c;
  tko_pool *pool = make_pool(&c, 1, 0);
  tfa_init(&oom_alloc);
  tt_count_init(&cancels);
  tt_count_init(&later_runs);
  tko_lane_options lo = tko_lane_default_options();
  lo.lane_capacity = RING;
  lo.max_drain = RING;
  lo.allocator = &oom_alloc.al;
  lo.on_cancel = count_cancel;
  cr_assert_eq(tko_lanes_create(&oom_lanes, pool, &lo), 0);
  cr_assert_eq(tko_pool_pause(pool), 0);
  cr_assert_eq(tko_lanes_submit(oom_lanes, LANE_KEY, fill_then_exit_fn, NULL, 0), 0);
  for (int i = 1; i < RING; i++)
    cr_assert_eq(tko_lanes_submit(oom_lanes, LANE_KEY, count_fn, &c, 0), 0);
  cr_assert_eq(tko_pool_resume(pool), 0);
  cr_assert_eq(tko_lanes_wait_idle(oom_lanes, TT_LONG_MS), 0);
  tfa_heal(&oom_alloc);
  cr_assert_gt(atomic_load(&oom_alloc.failures), 0, "the ring tried to grow");
  cr_assert_eq(tt_count_get(&cancels), RING - 1);
  cr_assert_eq(tt_count_get(&c.runs), 0);
  cr_assert_eq(tt_count_get(&later_runs), RING);
  tko_lane_stats ls;
  tko_lanes_stats(oom_lanes, &ls);
  cr_assert_eq(ls.cancelled, RING - 1);
  cr_assert_eq(ls.completed, RING + 1);
  cr_assert_eq(ls.queued, 0);
  cr_assert_eq(tko_lanes_destroy(oom_lanes), 0);
  cr_assert_eq(atomic_load(&oom_alloc.live), 0);
  cr_assert_eq(tko_pool_destroy(pool), 0);
}

/* A closed table: a visit's end would drive the lane on, here, on the
 * ending thread, which must run nothing more (an exit or a helping wait
 * there would unwind into a half-gone worker: found by the attack on this
 * change). The lane's queued tasks go to on_cancel instead. */
static void cancel_counted(void *user, const tko_lane_task *t) {
  (void)user;
  (void)t;
  tt_count_add(&cancels, 1);
}

Test(thread_exit, a_closed_tables_lane_cancels_the_rest) {
  ctx c;
  tko_pool *pool = make_pool(&c, 1, 0);
  tt_count_init(&cancels);
  tko_lane_options lo = tko_lane_default_options();
  lo.on_cancel = cancel_counted;
  tko_lanes *lanes = NULL;
  cr_assert_eq(tko_lanes_create(&lanes, pool, &lo), 0);
  cr_assert_eq(tko_pool_pause(pool), 0);
  cr_assert_eq(tko_lanes_submit(lanes, LANE_KEY, exit_fn, NULL, 0), 0);
  for (int i = 0; i < 3; i++) cr_assert_eq(tko_lanes_submit(lanes, LANE_KEY, count_fn, &c, 0), 0);
  cr_assert_eq(tko_lanes_close(lanes), 0);
  cr_assert_eq(tko_pool_resume(pool), 0);
  cr_assert_eq(tko_lanes_wait_idle(lanes, TT_LONG_MS), 0);
  cr_assert_eq(tt_count_get(&cancels), 3);
  cr_assert_eq(tt_count_get(&c.runs), 0, "the ending thread ran none of them");
  tko_lane_stats ls;
  tko_lanes_stats(lanes, &ls);
  cr_assert_eq(ls.completed, 1);
  cr_assert_eq(ls.cancelled, 3);
  cr_assert_eq(tko_lanes_destroy(lanes), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, TT_LONG_MS), 0);
  cr_assert_eq(tko_pool_destroy(pool), 0);
}

/* Kept from the attack (its t16): a task waiting on a group in a closed
 * table's lane helps, and the help runs another lane's task that ends the
 * thread, twice. The wait's lane then cannot go on (its table is closed):
 * its other task goes to on_cancel, not to the unwinding thread (there the
 * second wait read the first's stale worker state: running stuck at 1 and
 * wait_idle timing out, or a crash). Everything ends, and the counts add
 * up. */
static tko_pool *helping_pool;
static tko_group helping_groups[2];
static tt_count helping_starts, member_runs;

static int member_fn(void *arg) {
  (void)arg;
  tt_count_add(&member_runs, 1);
  return 0;
}

static int helping_wait_fn(void *arg) {
  (void)arg;
  tko_group *g = &helping_groups[tt_count_add(&helping_starts, 1) - 1];
  cr_assert_eq(tko_group_init(g), 0);
  cr_assert_eq(tko_group_submit(helping_pool, g, member_fn, NULL, 0), 0);
  cr_assert_eq(tko_group_wait(g, TT_LONG_MS), 0);
  return 0;
}

Test(thread_exit, exits_inside_a_closed_lanes_helping_wait_end_everything) {
  ctx c;
  helping_pool = make_pool(&c, 1, 0);
  tt_count_init(&helping_starts);
  tt_count_init(&member_runs);
  tko_lanes *closed = NULL, *open = NULL;
  cr_assert_eq(tko_lanes_create(&closed, helping_pool, NULL), 0);
  cr_assert_eq(tko_lanes_create(&open, helping_pool, NULL), 0);
  cr_assert_eq(tko_pool_pause(helping_pool), 0);
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(tko_lanes_submit(closed, 0, helping_wait_fn, NULL, 0), 0);
    cr_assert_eq(tko_lanes_submit(open, 0, exit_fn, NULL, 0), 0);
  }
  cr_assert_eq(tko_lanes_close(closed), 0);
  cr_assert_eq(tko_pool_resume(helping_pool), 0);
  cr_assert_eq(tko_lanes_wait_idle(closed, TT_LONG_MS), 0);
  cr_assert_eq(tko_lanes_wait_idle(open, TT_LONG_MS), 0);
  cr_assert_eq(tko_pool_wait_idle(helping_pool, TT_LONG_MS), 0);
  tko_lane_stats a, b;
  tko_lanes_stats(closed, &a);
  tko_lanes_stats(open, &b);
  cr_assert_eq(a.completed + a.cancelled, 2);
  cr_assert_eq(a.completed, (uint64_t)tt_count_get(&helping_starts));
  cr_assert_eq(tt_count_get(&member_runs), tt_count_get(&helping_starts),
               "every started wait's member ran");
  cr_assert_eq(b.completed, 2, "both exits ran");
  cr_assert_eq(b.failed, 2);
  tko_stats s;
  tko_pool_stats(helping_pool, &s);
  cr_assert_eq(s.running, 0);
  cr_assert_eq(s.submitted, s.completed + s.cancelled + s.queued);
  cr_assert_eq(tko_lanes_destroy(closed), 0);
  cr_assert_eq(tko_lanes_destroy(open), 0);
  cr_assert_eq(tko_pool_shutdown_timed(helping_pool, TKO_DRAIN, TT_LONG_MS), 0);
  cr_assert_eq(tko_pool_destroy(helping_pool), 0);
  cr_assert_eq(tt_count_get(&c.starts), tt_count_get(&c.stops), "every thread's hooks paired");
}

/* The replacement of a basic worker whose task called pthread_exit is
 * placed as every worker is: it gets the stack asked for (rounded up to
 * whole pages; pthread_getattr_np reads it inside a task on it), not the
 * platform's default. One worker, so the second task runs on the
 * replacement. */
static size_t stack_seen;

static int read_stack(void *arg) {
  (void)arg;
  pthread_attr_t a;
  if (pthread_getattr_np(pthread_self(), &a)) return -1;
  int rc = pthread_attr_getstacksize(&a, &stack_seen);
  pthread_attr_destroy(&a);
  return rc;
}

Test(thread_exit, the_replacement_gets_the_stack_asked_for) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  /* Far below the default (8 MiB), above the smallest stack the
   * sanitizers' runtimes let a thread have (they raise smaller ones). */
  size_t want = ((size_t)1 << 20) + 1;
  size_t rounded = (want + page - 1) / page * page;
  ctx c;
  memset(&c, 0, sizeof c);
  tt_count_init(&c.runs);
  tt_count_init(&c.starts);
  tt_count_init(&c.stops);
  tko_options o = tko_basic_options(1);
  o.stack_size = want;
  o.hooks.user = &c;
  o.hooks.thread_start = on_start;
  o.hooks.thread_stop = on_stop;
  tko_pool *pool = NULL;
  cr_assert_eq(tko_pool_create(&pool, &o), 0);
  cr_assert_eq(tko_submit(pool, exit_fn, NULL, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, TT_LONG_MS), 0, "the pool wedged");
  stack_seen = 0;
  cr_assert_eq(tko_submit(pool, read_stack, NULL, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, TT_LONG_MS), 0);
  tko_stats s = tf_stats(pool);
  cr_assert_eq(s.failed, 1, "the stack could not be read"); /* the exit only */
  cr_assert_eq(tt_count_get(&c.starts), 2, "no replacement started");
  cr_assert_geq(stack_seen, rounded, "the replacement got a %zu-byte stack for %zu asked",
                stack_seen, want);
  cr_assert_lt(stack_seen, rounded + ((size_t)64 << 10), "the replacement got a %zu-byte stack "
               "for %zu asked", stack_seen, want);
  cr_assert_eq(tko_pool_destroy(pool), 0);
}
