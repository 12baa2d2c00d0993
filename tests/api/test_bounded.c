/* SPDX-License-Identifier: MIT */
/* Tests for bounded queues (queue_capacity + full_policy) and
 * tko_submit_timed: the count of queued tasks never exceeds the capacity
 * (seen on a paused pool, where nothing leaves the queue); REJECT gives
 * -EAGAIN and the task never runs; CALLER_RUNS runs the task on the
 * submitting thread before the submit returns (hooks see id 0 and worker
 * UINT32_MAX); BLOCK waits until there is room; a timed submit gives
 * -ETIMEDOUT; a worker never blocks on its own full queue; cancelled tasks
 * give their room back; and shutdown wakes blocked submitters with
 * -ESHUTDOWN, in either mode, with nothing lost. No test sleeps to wait for
 * something. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "taskorch.h"
#include "taskorch/lanes.h"
#include "tko_test.h"
#include "tko_test_feature.h"
#include "tko_test_sync.h"

typedef struct qctx {
  tt_count runs, cancels, before, after, started;
  tt_gate gate;
  atomic_int bad;
  /* What the hooks saw for the last caller-run task (worker UINT32_MAX). */
  atomic_uint_fast64_t caller_id;
  atomic_int caller_before, caller_after;
  tko_pool *pool;
} qctx;

static void qctx_init(qctx *c) {
  memset(c, 0, sizeof *c);
  tt_count_init(&c->runs);
  tt_count_init(&c->cancels);
  tt_count_init(&c->before);
  tt_count_init(&c->after);
  tt_count_init(&c->started);
  pthread_mutex_init(&c->gate.mu, NULL);
  pthread_cond_init(&c->gate.cv, NULL);
  atomic_init(&c->bad, 0);
  atomic_init(&c->caller_id, UINT64_MAX);
  atomic_init(&c->caller_before, 0);
  atomic_init(&c->caller_after, 0);
}

/* A task: records the thread it ran on and returns status. */
typedef struct job {
  qctx *c;
  int status;
  pthread_t thread;
  atomic_int ran, cancelled;
} job;

static void job_init(job *j, qctx *c, int status) {
  memset(j, 0, sizeof *j);
  j->c = c;
  j->status = status;
}

static int job_fn(void *arg) {
  job *j = arg;
  j->thread = pthread_self();
  atomic_fetch_add(&j->ran, 1);
  tt_count_add(&j->c->runs, 1);
  return j->status;
}

__attribute__((unused)) static int blocker_fn(void *arg) {
  job *j = arg;
  tt_count_add(&j->c->started, 1);
  if (!tt_gate_wait(&j->c->gate)) atomic_fetch_add(&j->c->bad, 1);
  atomic_fetch_add(&j->ran, 1);
  tt_count_add(&j->c->runs, 1);
  return 0;
}

static void before_run(void *user, const tko_task_info *t) {
  qctx *c = user;
  tt_count_add(&c->before, 1);
  if (t->worker == UINT32_MAX) {
    atomic_store(&c->caller_id, t->id);
    atomic_fetch_add(&c->caller_before, 1);
  }
}

static void after_run(void *user, const tko_task_info *t) {
  qctx *c = user;
  tt_count_add(&c->after, 1);
  if (t->worker == UINT32_MAX) {
    if (t->id != 0) atomic_fetch_add(&c->bad, 1);
    atomic_fetch_add(&c->caller_after, 1);
  }
}

static void on_cancel(void *user, const tko_task_info *t) {
  qctx *c = user;
  atomic_fetch_add(&((job *)t->arg)->cancelled, 1);
  tt_count_add(&c->cancels, 1);
}

static tko_pool *make_pool(qctx *c, unsigned workers, size_t cap, tko_full_policy policy) {
  tko_options o = tko_basic_options(workers);
  o.queue_capacity = cap;
  o.full_policy = policy;
  o.hooks.user = c;
  o.hooks.before_run = before_run;
  o.hooks.after_run = after_run;
  o.hooks.on_cancel = on_cancel;
  tko_pool *p = NULL;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  c->pool = p;
  return p;
}

static void finish(qctx *c, tko_pool *pool) {
  cr_assert_eq(tko_pool_destroy(pool), 0);
  cr_assert_eq(atomic_load(&c->bad), 0);
}

Test(bounded, options_are_checked) {
  tko_options o = tko_basic_options(1);
  o.queue_capacity = 4;
  o.full_policy = (tko_full_policy)3;
  tko_pool *p = NULL;
  cr_assert_eq(tko_pool_create(&p, &o), -EINVAL);
  cr_assert_null(p);
  /* The capacities' limits, as the header names them (found by the
   * attack on leased room: the limit was not documented). */
  o.full_policy = TKO_FULL_BLOCK;
  o.queue_capacity = TKO_MAX_QUEUE_CAPACITY + 1;
  cr_assert_eq(tko_pool_create(&p, &o), -EINVAL);
  o.queue_capacity = 4;
  o.initial_capacity = TKO_MAX_INITIAL_CAPACITY + 1;
  cr_assert_eq(tko_pool_create(&p, &o), -EINVAL);
  o.initial_capacity = 0;
  o.queue_capacity = TKO_MAX_QUEUE_CAPACITY;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

Test(bounded, reject_never_exceeds_capacity) {
  enum { CAP = 16, TRIES = 100 };
  qctx c;
  qctx_init(&c);
  tko_pool *pool = make_pool(&c, 2, CAP, TKO_FULL_REJECT);
  static job jobs[TRIES];
  cr_assert_eq(tko_pool_pause(pool), 0);
  int accepted = 0;
  for (int i = 0; i < TRIES; i++) {
    job_init(&jobs[i], &c, 0);
    int rc = tko_submit(pool, job_fn, &jobs[i], i % 3);
    cr_assert(rc == 0 || rc == -EAGAIN);
    if (rc == 0) accepted++;
    cr_assert_eq(rc == 0, i < CAP, "the first CAP fit, the rest do not");
    cr_assert_leq(tf_stats(pool).queued, CAP);
  }
  cr_assert_eq(accepted, CAP);
  tko_stats s = tf_stats(pool);
  cr_assert_eq(s.submitted, CAP);
  cr_assert_eq(s.queued, CAP);
  cr_assert_eq(tko_pool_resume(pool), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  cr_assert_eq(tt_count_get(&c.runs), CAP);
  cr_assert_eq(tt_count_get(&c.before), CAP, "a hook saw a refused task");
  for (int i = CAP; i < TRIES; i++)
    cr_assert_eq(atomic_load(&jobs[i].ran), 0);
  /* Room again once the queue drained. */
  cr_assert_eq(tko_submit(pool, job_fn, &jobs[0], 0), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  finish(&c, pool);
}

Test(bounded, block_never_exceeds_capacity) {
  enum { CAP = 8 };
  qctx c;
  qctx_init(&c);
  tko_pool *pool = make_pool(&c, 1, CAP, TKO_FULL_BLOCK);
  job jobs[CAP + 2];
  for (int i = 0; i < CAP + 2; i++)
    job_init(&jobs[i], &c, 0);
  cr_assert_eq(tko_pool_pause(pool), 0);
  for (int i = 0; i < CAP; i++) {
    cr_assert_eq(tko_submit_timed(pool, job_fn, &jobs[i], 0, 0), 0);
    cr_assert_eq(tf_stats(pool).queued, (uint64_t)i + 1);
  }
  cr_assert_eq(tko_submit_timed(pool, job_fn, &jobs[CAP], 0, 0), -ETIMEDOUT);
  cr_assert_eq(tko_submit_timed(pool, job_fn, &jobs[CAP + 1], 0, 20), -ETIMEDOUT);
  cr_assert_eq(tf_stats(pool).queued, CAP);
  cr_assert_eq(tf_stats(pool).submitted, CAP);
  cr_assert_eq(tko_pool_resume(pool), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  cr_assert_eq(atomic_load(&jobs[CAP].ran), 0);
  cr_assert_eq(atomic_load(&jobs[CAP + 1].ran), 0);
  cr_assert_eq(tt_count_get(&c.runs), CAP);
  finish(&c, pool);
}

Test(bounded, timed_submit_arguments) {
  qctx c;
  qctx_init(&c);
  tko_pool *pool = make_pool(&c, 1, 1, TKO_FULL_BLOCK);
  job j;
  job_init(&j, &c, 0);
  cr_assert_eq(tko_submit_timed(NULL, job_fn, &j, 0, 0), -EINVAL);
  cr_assert_eq(tko_submit_timed(pool, NULL, &j, 0, 0), -EINVAL);
  cr_assert_eq(tko_submit_timed(pool, job_fn, &j, 0, -2), -EINVAL);
  cr_assert_eq(tko_submit_timed(pool, job_fn, &j, 0, -1), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  cr_assert_eq(tko_submit_timed(pool, job_fn, &j, 0, 0), 0, "room: no wait needed");
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  cr_assert_eq(atomic_load(&j.ran), 2);
  finish(&c, pool);
}

Test(bounded, timed_submit_on_an_unbounded_pool_is_submit) {
  qctx c;
  qctx_init(&c);
  tko_pool *pool = make_pool(&c, 1, 0, TKO_FULL_BLOCK);
  job j;
  job_init(&j, &c, 0);
  cr_assert_eq(tko_pool_pause(pool), 0);
  for (int i = 0; i < 2000; i++)
    cr_assert_eq(tko_submit_timed(pool, job_fn, &j, 0, 0), 0);
  cr_assert_eq(tko_pool_resume(pool), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  cr_assert_eq(tt_count_get(&c.runs), 2000);
  finish(&c, pool);
}

Test(bounded, timed_submit_on_a_reject_pool_rejects) {
  qctx c;
  qctx_init(&c);
  tko_pool *pool = make_pool(&c, 1, 1, TKO_FULL_REJECT);
  job a, b;
  job_init(&a, &c, 0);
  job_init(&b, &c, 0);
  cr_assert_eq(tko_pool_pause(pool), 0);
  cr_assert_eq(tko_submit_timed(pool, job_fn, &a, 0, -1), 0);
  cr_assert_eq(tko_submit_timed(pool, job_fn, &b, 0, -1), -EAGAIN);
  cr_assert_eq(tko_pool_resume(pool), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  cr_assert_eq(atomic_load(&b.ran), 0);
  finish(&c, pool);
}

/* ---- caller runs --------------------------------------------------------- */

typedef struct submit_job {
  tko_pool *pool;
  job *j;
  long timeout_ms;
  pthread_t self;
} submit_job;

static int submit_from_thread(void *arg) {
  submit_job *s = arg;
  s->self = pthread_self();
  return tko_submit_timed(s->pool, job_fn, s->j, 0, s->timeout_ms);
}

Test(bounded, caller_runs_on_the_submitting_thread) {
  enum { CAP = 2 };
  qctx c;
  qctx_init(&c);
  tko_pool *pool = make_pool(&c, 1, CAP, TKO_FULL_CALLER_RUNS);
  job fill[CAP], mine, theirs, failing;
  for (int i = 0; i < CAP; i++)
    job_init(&fill[i], &c, 0);
  job_init(&mine, &c, 0);
  job_init(&theirs, &c, 0);
  job_init(&failing, &c, 4);
  cr_assert_eq(tko_pool_pause(pool), 0);
  for (int i = 0; i < CAP; i++)
    cr_assert_eq(tko_submit(pool, job_fn, &fill[i], 0), 0);

  cr_assert_eq(tko_submit(pool, job_fn, &mine, 0), 0);
  cr_assert_eq(atomic_load(&mine.ran), 1, "ran before the submit returned");
  cr_assert(pthread_equal(mine.thread, pthread_self()));
  cr_assert_eq(atomic_load(&c.caller_before), 1);
  cr_assert_eq(atomic_load(&c.caller_after), 1);
  cr_assert_eq(atomic_load(&c.caller_id), 0, "caller-run tasks have id 0");

  /* From another thread: runs there. */
  submit_job sj = {pool, &theirs, -1, 0};
  tf_thread t;
  cr_assert_eq(tf_thread_start(&t, submit_from_thread, &sj), 0);
  int rc = -1;
  cr_assert(tf_thread_join(&t, &rc));
  cr_assert_eq(rc, 0);
  cr_assert_eq(atomic_load(&theirs.ran), 1);
  cr_assert(pthread_equal(theirs.thread, sj.self));
  cr_assert_not(pthread_equal(theirs.thread, pthread_self()));

  /* A failing caller-run task: the submit still returns 0. */
  cr_assert_eq(tko_submit(pool, job_fn, &failing, 0), 0);
  cr_assert_eq(atomic_load(&failing.ran), 1);

  tko_stats s = tf_stats(pool);
  cr_assert_eq(s.caller_runs, 3);
  cr_assert_eq(s.submitted, CAP + 3);
  cr_assert_eq(s.queued, CAP);
  cr_assert_eq(s.failed, 1);
  cr_assert_eq(tko_pool_resume(pool), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  s = tf_stats(pool);
  cr_assert_eq(s.completed, CAP + 3);
  for (int i = 0; i < CAP; i++)
    cr_assert_not(pthread_equal(fill[i].thread, pthread_self()));
  finish(&c, pool);
}

/* ---- block --------------------------------------------------------------- */

Test(bounded, block_waits_until_there_is_room) {
  enum { CAP = 2 };
  qctx c;
  qctx_init(&c);
  tko_pool *pool = make_pool(&c, 1, CAP, TKO_FULL_BLOCK);
  job fill[CAP], late;
  for (int i = 0; i < CAP; i++)
    job_init(&fill[i], &c, 0);
  job_init(&late, &c, 0);
  cr_assert_eq(tko_pool_pause(pool), 0);
  for (int i = 0; i < CAP; i++)
    cr_assert_eq(tko_submit(pool, job_fn, &fill[i], 0), 0);
  submit_job sj = {pool, &late, -1, 0};
  tf_thread t;
  cr_assert_eq(tf_thread_start(&t, submit_from_thread, &sj), 0);
  cr_assert(tf_wait_thread_sleeping(t.tid)); /* waiting for room */
  cr_assert_not(tf_thread_is_done(&t), "a submit to a full, paused pool returned");
  cr_assert_eq(tf_stats(pool).submitted, CAP);
  cr_assert_eq(tko_pool_resume(pool), 0);
  int rc = -1;
  cr_assert(tf_thread_join(&t, &rc));
  cr_assert_eq(rc, 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  cr_assert_eq(atomic_load(&late.ran), 1);
  cr_assert_eq(tt_count_get(&c.runs), CAP + 1);
  finish(&c, pool);
}

Test(bounded, many_blocked_submitters_all_get_in) {
  enum { T = 4 };
  qctx c;
  qctx_init(&c);
  tko_pool *pool = make_pool(&c, 1, 1, TKO_FULL_BLOCK);
  job fill, js[T];
  job_init(&fill, &c, 0);
  cr_assert_eq(tko_pool_pause(pool), 0);
  cr_assert_eq(tko_submit(pool, job_fn, &fill, 0), 0);
  submit_job sj[T];
  tf_thread t[T];
  for (int i = 0; i < T; i++) {
    job_init(&js[i], &c, 0);
    sj[i] = (submit_job){pool, &js[i], -1, 0};
    cr_assert_eq(tf_thread_start(&t[i], submit_from_thread, &sj[i]), 0);
  }
  for (int i = 0; i < T; i++)
    cr_assert(tf_wait_thread_sleeping(t[i].tid));
  cr_assert_eq(tko_pool_resume(pool), 0);
  for (int i = 0; i < T; i++) {
    int rc = -1;
    cr_assert(tf_thread_join(&t[i], &rc));
    cr_assert_eq(rc, 0);
  }
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  cr_assert_eq(tt_count_get(&c.runs), T + 1);
  finish(&c, pool);
}

Test(bounded, timed_submit_times_out_then_succeeds_with_room) {
  qctx c;
  qctx_init(&c);
  tko_pool *pool = make_pool(&c, 1, 1, TKO_FULL_BLOCK);
  job fill, late;
  job_init(&fill, &c, 0);
  job_init(&late, &c, 0);
  cr_assert_eq(tko_pool_pause(pool), 0);
  cr_assert_eq(tko_submit(pool, job_fn, &fill, 0), 0);
  cr_assert_eq(tko_submit_timed(pool, job_fn, &late, 0, 0), -ETIMEDOUT);
  cr_assert_eq(tko_submit_timed(pool, job_fn, &late, 0, 30), -ETIMEDOUT);
  cr_assert_eq(tf_stats(pool).submitted, 1);
  /* A timed submit blocked in another thread gets in once room appears. */
  submit_job sj = {pool, &late, TT_LONG_MS, 0};
  tf_thread t;
  cr_assert_eq(tf_thread_start(&t, submit_from_thread, &sj), 0);
  cr_assert(tf_wait_thread_sleeping(t.tid));
  cr_assert_eq(tko_pool_resume(pool), 0);
  int rc = -1;
  cr_assert(tf_thread_join(&t, &rc));
  cr_assert_eq(rc, 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  cr_assert_eq(atomic_load(&late.ran), 1);
  finish(&c, pool);
}

/* A worker submitting to its own full pool gets -EAGAIN instead of waiting
 * for itself. */
typedef struct self_submit {
  qctx *c;
  job x, y;
  int rc_x, rc_y;
} self_submit;

static void self_submit_init(self_submit *s, qctx *c) {
  memset(s, 0, sizeof *s);
  s->c = c;
  job_init(&s->x, c, 0);
  job_init(&s->y, c, 0);
  s->rc_x = s->rc_y = 1;
}

static int self_submit_fn(void *arg) {
  self_submit *s = arg;
  s->rc_x = tko_submit(s->c->pool, job_fn, &s->x, 0);
  s->rc_y = tko_submit(s->c->pool, job_fn, &s->y, 0);
  return 0;
}

Test(bounded, a_worker_never_blocks_on_its_own_queue) {
  qctx c;
  qctx_init(&c);
  tko_pool *pool = make_pool(&c, 1, 1, TKO_FULL_BLOCK);
  self_submit s;
  self_submit_init(&s, &c);
  cr_assert_eq(tko_submit(pool, self_submit_fn, &s, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  cr_assert_eq(s.rc_x, 0);
  cr_assert_eq(s.rc_y, -EAGAIN);
  cr_assert_eq(atomic_load(&s.x.ran), 1);
  cr_assert_eq(atomic_load(&s.y.ran), 0);
  finish(&c, pool);
}

/* The same holds for a task of the pool run on the thread that submitted
 * it: an idle lane's task that tko_lanes_submit_wait runs on the caller
 * gets -EAGAIN from a full TKO_FULL_BLOCK queue, rather than waiting for
 * room that, with the pool paused, never comes. */
Test(bounded, a_task_run_on_its_submitter_never_blocks_on_its_own_queue) {
  qctx c;
  qctx_init(&c);
  tko_pool *pool = make_pool(&c, 1, 1, TKO_FULL_BLOCK);
  cr_assert_eq(tko_pool_pause(pool), 0);
  tko_lanes *lanes;
  tko_lane_options lo = tko_lane_default_options();
  cr_assert_eq(tko_lanes_create(&lanes, pool, &lo), 0);
  self_submit s;
  self_submit_init(&s, &c);
  cr_assert_eq(tko_lanes_submit_wait(lanes, 7, self_submit_fn, &s, 0), 0);
  cr_assert_eq(s.rc_x, 0, "the first submit takes the one place");
  cr_assert_eq(s.rc_y, -EAGAIN, "the second waited for room or was accepted: %d", s.rc_y);
  cr_assert_eq(tko_pool_resume(pool), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&s.x.ran), 1);
  cr_assert_eq(atomic_load(&s.y.ran), 0);
  cr_assert_eq(tko_lanes_destroy(lanes), 0);
  finish(&c, pool);
}

Test(bounded, cancelled_tasks_give_their_room_back) {
  qctx c;
  qctx_init(&c);
  tko_pool *pool = make_pool(&c, 1, 2, TKO_FULL_REJECT);
  job a, b, d;
  job_init(&a, &c, 0);
  job_init(&b, &c, 0);
  job_init(&d, &c, 0);
  tko_group g;
  cr_assert_eq(tko_group_init(&g), 0);
  cr_assert_eq(tko_pool_pause(pool), 0);
  cr_assert_eq(tko_group_submit(pool, &g, job_fn, &a, 0), 0);
  cr_assert_eq(tko_group_submit(pool, &g, job_fn, &b, 0), 0);
  cr_assert_eq(tko_submit(pool, job_fn, &d, 0), -EAGAIN);
  cr_assert_eq(tko_group_cancel(&g), 2);
  cr_assert_eq(tko_submit(pool, job_fn, &d, 0), 0, "cancelled members still hold room");
  cr_assert_eq(tko_pool_resume(pool), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  cr_assert_eq(atomic_load(&d.ran), 1);
  cr_assert_eq(tt_count_get(&c.cancels), 2);
  cr_assert_eq(tko_group_destroy(&g), 0);
  finish(&c, pool);
}

typedef struct producer {
  tko_pool *pool;
  job *j;
  int n;
  int errors;
} producer;

/* Counts runs only: one job is shared by many concurrent runs here. */
static int count_fn(void *arg) {
  tt_count_add(&((job *)arg)->c->runs, 1);
  return 0;
}

static int producer_fn(void *arg) {
  producer *p = arg;
  for (int i = 0; i < p->n; i++)
    if (tko_submit(p->pool, count_fn, p->j, i & 3)) p->errors++;
  return 0;
}

Test(bounded, producers_through_a_small_queue) {
  enum { T = 3, PER = TT_SCALE(20000, 2000), CAP = 8 };
  qctx c;
  qctx_init(&c);
  tko_pool *pool = make_pool(&c, 2, CAP, TKO_FULL_BLOCK);
  job js[T];
  producer ps[T];
  tf_thread t[T];
  for (int i = 0; i < T; i++) {
    job_init(&js[i], &c, 0);
    ps[i] = (producer){pool, &js[i], PER, 0};
    cr_assert_eq(tf_thread_start(&t[i], producer_fn, &ps[i]), 0);
  }
  for (int i = 0; i < T; i++) {
    cr_assert(tf_thread_join(&t[i], NULL));
    cr_assert_eq(ps[i].errors, 0);
  }
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  cr_assert_eq(tt_count_get(&c.runs), T * PER);
  tko_stats s = tf_stats(pool);
  cr_assert_eq(s.submitted, (uint64_t)T * PER);
  cr_assert_eq(s.completed, (uint64_t)T * PER);
  finish(&c, pool);
}

/* ---- shutdown ------------------------------------------------------------ */

static void shutdown_wakes_blocked(tko_shutdown_mode mode) {
  enum { T = 3 };
  qctx c;
  qctx_init(&c);
  tko_pool *pool = make_pool(&c, 1, 1, TKO_FULL_BLOCK);
  job fill, js[T];
  job_init(&fill, &c, 0);
  cr_assert_eq(tko_pool_pause(pool), 0);
  cr_assert_eq(tko_submit(pool, job_fn, &fill, 0), 0);
  submit_job sj[T];
  tf_thread t[T];
  for (int i = 0; i < T; i++) {
    job_init(&js[i], &c, 0);
    /* One timed submitter among the blocked ones. */
    sj[i] = (submit_job){pool, &js[i], i == 0 ? TT_LONG_MS : -1, 0};
    cr_assert_eq(tf_thread_start(&t[i], submit_from_thread, &sj[i]), 0);
  }
  for (int i = 0; i < T; i++)
    cr_assert(tf_wait_thread_sleeping(t[i].tid));
  cr_assert_eq(tko_pool_shutdown(pool, mode), 0);
  for (int i = 0; i < T; i++) {
    int rc = 0;
    cr_assert(tf_thread_join(&t[i], &rc), "a blocked submitter was not woken");
    cr_assert_eq(rc, -ESHUTDOWN);
    cr_assert_eq(atomic_load(&js[i].ran) + atomic_load(&js[i].cancelled), 0);
  }
  /* The queued task: run by DRAIN, cancelled by CANCEL; nothing lost. */
  if (mode == TKO_DRAIN) {
    cr_assert_eq(atomic_load(&fill.ran), 1);
  } else {
    cr_assert_eq(atomic_load(&fill.cancelled), 1);
  }
  tko_stats s = tf_stats(pool);
  cr_assert_eq(s.submitted, 1);
  cr_assert_eq(s.completed + s.cancelled, 1);
  cr_assert_eq(tko_submit(pool, job_fn, &fill, 0), -ESHUTDOWN);
  finish(&c, pool);
}

Test(bounded, shutdown_cancel_wakes_blocked_submitters) {
  shutdown_wakes_blocked(TKO_CANCEL);
}
Test(bounded, shutdown_drain_wakes_blocked_submitters) {
  shutdown_wakes_blocked(TKO_DRAIN);
}

static int drain_from_thread(void *arg) { return tko_pool_shutdown((tko_pool *)arg, TKO_DRAIN); }

/* The close alone wakes a blocked submitter: no room comes back meanwhile
 * (the one worker runs a task that waits for the test, and the queue holds
 * a task it cannot take before then), so only the shutdown's wake can end
 * the wait. The test opens its task once the submitter returned, or after
 * a bound, so that the drain ends either way. */
Test(bounded, shutdown_wakes_a_blocked_submitter_while_no_room_comes_back) {
  qctx c;
  qctx_init(&c);
  tko_pool *pool = make_pool(&c, 1, 1, TKO_FULL_BLOCK);
  job pin, queued, blocked;
  job_init(&pin, &c, 0);
  job_init(&queued, &c, 0);
  job_init(&blocked, &c, 0);
  cr_assert_eq(tko_submit(pool, blocker_fn, &pin, 0), 0);
  cr_assert(tt_count_wait_geq(&c.started, 1));
  cr_assert_eq(tko_submit(pool, job_fn, &queued, 0), 0);
  submit_job sj = {pool, &blocked, -1, 0};
  tf_thread t, sh;
  cr_assert_eq(tf_thread_start(&t, submit_from_thread, &sj), 0);
  cr_assert(tf_wait_thread_sleeping(t.tid));
  cr_assert_eq(tf_thread_start(&sh, drain_from_thread, pool), 0);
  int rc = 0, src = -1;
  bool woke = tf_thread_join_within(&t, TT_SCALE(20000, 60000), &rc);
  tt_gate_open(&c.gate);
  if (!woke) cr_assert(tf_thread_join(&t, &rc));
  cr_assert(tf_thread_join(&sh, &src));
  cr_assert(woke, "the shutdown left a blocked submitter asleep");
  cr_assert_eq(rc, -ESHUTDOWN);
  cr_assert_eq(src, 0);
  cr_assert_eq(atomic_load(&pin.ran), 1);
  cr_assert_eq(atomic_load(&queued.ran), 1, "the drain ran the queued task");
  cr_assert_eq(atomic_load(&blocked.ran) + atomic_load(&blocked.cancelled), 0);
  finish(&c, pool);
}

Test(bounded, refused_after_shutdown_whatever_the_policy) {
  tko_full_policy policies[] = {TKO_FULL_BLOCK, TKO_FULL_REJECT, TKO_FULL_CALLER_RUNS};
  for (int p = 0; p < 3; p++) {
    qctx c;
    qctx_init(&c);
    tko_pool *pool = make_pool(&c, 1, 1, policies[p]);
    job fill, late;
    job_init(&fill, &c, 0);
    job_init(&late, &c, 0);
    cr_assert_eq(tko_pool_pause(pool), 0);
    cr_assert_eq(tko_submit(pool, job_fn, &fill, 0), 0);
    cr_assert_eq(tko_pool_shutdown(pool, TKO_CANCEL), 0);
    cr_assert_eq(tko_submit(pool, job_fn, &late, 0), -ESHUTDOWN);
    cr_assert_eq(tko_submit_timed(pool, job_fn, &late, 0, 0), -ESHUTDOWN);
    cr_assert_eq(atomic_load(&late.ran), 0, "caller-runs ran a task after shutdown");
    cr_assert_eq(atomic_load(&fill.cancelled), 1);
    finish(&c, pool);
  }
}

/* ---- regressions: core bugs these tests found, now fixed ------------- */

/* queue_capacity is documented as "most tasks queued (not started) at
 * once", and stats.queued counts tasks accepted and not yet started. But
 * room is given back when a worker takes tasks (up to max_batch at a time), not
 * when it starts them: tasks taken and waiting behind a long task in the
 * worker's hand no longer count, so queued (not started) tasks can exceed
 * the capacity by up to max_batch per worker. */
Test(bounded, regression_queued_exceeds_capacity_after_a_take) {
  enum { CAP = 4 };
  qctx c;
  qctx_init(&c);
  tko_pool *pool = make_pool(&c, 1, CAP, TKO_FULL_REJECT);
  job blocker, fill[CAP - 1], more[CAP];
  job_init(&blocker, &c, 0);
  cr_assert_eq(tko_pool_pause(pool), 0);
  cr_assert_eq(tko_submit(pool, blocker_fn, &blocker, 10), 0);
  for (int i = 0; i < CAP - 1; i++) {
    job_init(&fill[i], &c, 0);
    cr_assert_eq(tko_submit(pool, job_fn, &fill[i], 0), 0);
  }
  cr_assert_eq(tko_pool_resume(pool), 0); /* the one worker takes all four */
  cr_assert(tt_count_wait_geq(&c.started, 1));
  int accepted = 0;
  for (int i = 0; i < CAP; i++) {
    job_init(&more[i], &c, 0);
    if (tko_submit(pool, job_fn, &more[i], 0) == 0) accepted++;
  }
  tko_stats s = tf_stats(pool);
  tt_gate_open(&c.gate);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  cr_assert_leq(s.queued, CAP, "queued (not started) %llu > capacity %d (accepted %d more)",
                (unsigned long long)s.queued, CAP, accepted);
  finish(&c, pool);
}
