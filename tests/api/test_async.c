/* SPDX-License-Identifier: MIT */
/* Tests for async (completion-based) tasks: tko_submit_async,
 * tko_async_complete, tko_async_arg, tko_group_submit_async and
 * max_async_inflight. An async task stays running until another thread (or
 * a pool task, or fn itself) completes it; fn returning non-zero completes
 * it at once with that status; a double complete gives -EALREADY; the
 * in-flight limit is never exceeded and the rest wait queued by weight
 * while plain tasks keep running; in-flight tasks keep wait_idle waiting and
 * count as running in stats; hooks see after_run / on_failure with the
 * completion status; groups wait for async members; and shutdown, in either
 * mode, waits for in-flight tasks (completed here from another thread),
 * while CANCEL hands queued async tasks to on_cancel. Nothing is lost:
 * completions + cancels == tasks accepted. No test sleeps to wait for
 * something. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "taskorch.h"
#include "tko_test.h"
#include "tko_test_feature.h"
#include "tko_test_sync.h"

/* Started operations wait here for the test (or a completer) to complete
 * them. The in-flight count is raised in fn and lowered just before the
 * complete, so it never exceeds the pool's own count: if it passes the
 * limit, the pool did. */
typedef struct actx {
  pthread_mutex_t mu; /* protects everything below up to the hooks part */
  pthread_cond_t cv;  /* broadcast when an op is added or a count changes */
  tko_async **ops;    /* started, not yet completed (a stack) */
  size_t nops, cap;
  long started, completed, inflight, max_inflight;
  int order[64]; /* weights in start order */
  /* Hooks. */
  tt_count before, after, failures, cancels;
  atomic_int last_status, last_fail_status;
  atomic_uint_fast64_t before_id, after_id;
  atomic_int bad;
  tko_pool *pool;
} actx;

static actx *actx_new(size_t cap) {
  actx *c = calloc(1, sizeof *c);
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, NULL);
  c->ops = calloc(cap, sizeof *c->ops);
  c->cap = cap;
  tt_count_init(&c->before);
  tt_count_init(&c->after);
  tt_count_init(&c->failures);
  tt_count_init(&c->cancels);
  atomic_init(&c->last_status, -12345);
  atomic_init(&c->last_fail_status, -12345);
  atomic_init(&c->before_id, 0);
  atomic_init(&c->after_id, 0);
  atomic_init(&c->bad, 0);
  return c;
}

static void actx_free(actx *c) {
  free(c->ops);
  free(c);
}

/* An async task's argument. */
typedef struct aop {
  actx *c;
  int weight;
  int ret;   /* what fn returns (non-zero: completes at once) */
  bool self; /* fn completes op itself, then returns 0 */
} aop;

static int async_fn(tko_async *op, void *arg) {
  aop *a = arg;
  actx *c = a->c;
  if (tko_async_arg(op) != arg) atomic_fetch_add(&c->bad, 1);
  if (a->ret) return a->ret;
  if (a->self) return tko_async_complete(op, 0);
  pthread_mutex_lock(&c->mu);
  if (c->started < 64) c->order[c->started] = a->weight;
  c->started++;
  if (++c->inflight > c->max_inflight) c->max_inflight = c->inflight;
  if (c->nops < c->cap)
    c->ops[c->nops++] = op;
  else
    atomic_fetch_add(&c->bad, 1);
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
  return 0;
}

/* Waits until at least n ops have started; false on the hang deadline. */
static bool wait_started(actx *c, long n) {
  struct timespec dl;
  tt_deadline(&dl, TT_LONG_MS);
  bool ok = true;
  pthread_mutex_lock(&c->mu);
  while (c->started < n && ok)
    ok = pthread_cond_timedwait(&c->cv, &c->mu, &dl) != ETIMEDOUT;
  ok = c->started >= n;
  pthread_mutex_unlock(&c->mu);
  return ok;
}

/* Takes the most recently started op (NULL if none). */
static tko_async *take_op(actx *c) {
  pthread_mutex_lock(&c->mu);
  tko_async *op = c->nops ? c->ops[--c->nops] : NULL;
  if (op) c->inflight--;
  pthread_mutex_unlock(&c->mu);
  return op;
}

static int complete_one(actx *c, int status) {
  tko_async *op = take_op(c);
  if (!op) return -ENOENT;
  int rc = tko_async_complete(op, status);
  pthread_mutex_lock(&c->mu);
  c->completed++;
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
  return rc;
}

/* Completes ops as they start until `total` have been completed. */
typedef struct completer {
  actx *c;
  long total;
  int errors;
} completer;

static int completer_fn(void *arg) {
  completer *k = arg;
  actx *c = k->c;
  for (;;) {
    struct timespec dl;
    tt_deadline(&dl, TT_LONG_MS);
    pthread_mutex_lock(&c->mu);
    while (c->completed < k->total && c->nops == 0)
      if (pthread_cond_timedwait(&c->cv, &c->mu, &dl) == ETIMEDOUT) break;
    bool done = c->completed >= k->total, have = c->nops > 0;
    pthread_mutex_unlock(&c->mu);
    if (done) return 0;
    if (!have) return -ETIMEDOUT;
    int rc = complete_one(c, 0);
    if (rc && rc != -ENOENT) k->errors++; /* -ENOENT: another completer took it */
  }
}

static void before_run(void *user, const tko_task_info *t) {
  actx *c = user;
  atomic_store(&c->before_id, t->id);
  tt_count_add(&c->before, 1);
}

static void after_run(void *user, const tko_task_info *t) {
  actx *c = user;
  atomic_store(&c->after_id, t->id);
  atomic_store(&c->last_status, t->status);
  tt_count_add(&c->after, 1);
}

static void on_failure(void *user, const tko_task_info *t) {
  actx *c = user;
  atomic_store(&c->last_fail_status, t->status);
  tt_count_add(&c->failures, 1);
}

static void on_cancel(void *user, const tko_task_info *t) {
  tt_count_add(&((actx *)user)->cancels, 1);
}

static tt_count worker_stops; /* reset by make_pool; one pool per test */

static void thread_stop(void *user, unsigned index, tko_worker_kind kind) {
  tt_count_add(&worker_stops, 1);
}

static tko_pool *make_pool(actx *c, unsigned workers, unsigned max_inflight) {
  tko_options o = tko_basic_options(workers);
  o.max_async_inflight = max_inflight;
  o.hooks.user = c;
  o.hooks.before_run = before_run;
  o.hooks.after_run = after_run;
  o.hooks.on_failure = on_failure;
  o.hooks.on_cancel = on_cancel;
  o.hooks.thread_stop = thread_stop;
  tt_count_init(&worker_stops);
  tko_pool *p = NULL;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  c->pool = p;
  return p;
}

static void finish(actx *c, tko_pool *pool) {
  cr_assert_eq(tko_pool_destroy(pool), 0);
  cr_assert_eq(atomic_load(&c->bad), 0);
  actx_free(c);
}

static int complete_one_fn(void *arg) {
  return complete_one(arg, 0);
}

Test(async, completed_from_another_thread) {
  actx *c = actx_new(4);
  tko_pool *pool = make_pool(c, 2, 0);
  aop a = {c, 0, 0, false};
  cr_assert_eq(tko_submit_async(pool, async_fn, &a, 0), 0);
  cr_assert(wait_started(c, 1));
  /* In flight: running for stats and wait_idle. */
  tko_stats s = tf_stats(pool);
  cr_assert_eq(s.running, 1);
  cr_assert_eq(s.async_inflight, 1);
  cr_assert_eq(s.completed, 0);
  cr_assert_eq(tko_pool_wait_idle(pool, 0), -ETIMEDOUT);
  cr_assert_eq(tko_pool_wait_idle(pool, 10), -ETIMEDOUT);
  cr_assert_eq(tt_count_get(&c->after), 0, "after_run came before the completion");
  pthread_mutex_lock(&c->mu);
  cr_assert_eq(tko_async_arg(c->ops[0]), &a);
  pthread_mutex_unlock(&c->mu);
  tf_thread t;
  cr_assert_eq(tf_thread_start(&t, complete_one_fn, c), 0);
  int rc = -1;
  cr_assert(tf_thread_join(&t, &rc));
  cr_assert_eq(rc, 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  s = tf_stats(pool);
  cr_assert_eq(s.submitted, 1);
  cr_assert_eq(s.completed, 1);
  cr_assert_eq(s.failed, 0);
  cr_assert_eq(s.running, 0);
  cr_assert_eq(s.async_inflight, 0);
  cr_assert_eq(tt_count_get(&c->after), 1);
  finish(c, pool);
}

Test(async, nonzero_return_completes_at_once_with_that_status) {
  actx *c = actx_new(4);
  tko_pool *pool = make_pool(c, 1, 0);
  aop a = {c, 0, 5, false};
  cr_assert_eq(tko_submit_async(pool, async_fn, &a, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0); /* nobody completes it */
  tko_stats s = tf_stats(pool);
  cr_assert_eq(s.completed, 1);
  cr_assert_eq(s.failed, 1);
  cr_assert_eq(s.async_inflight, 0);
  cr_assert_eq(atomic_load(&c->last_status), 5);
  cr_assert_eq(atomic_load(&c->last_fail_status), 5);
  finish(c, pool);
}

Test(async, completed_by_fn_itself) {
  actx *c = actx_new(4);
  tko_pool *pool = make_pool(c, 1, 1);
  aop a = {c, 0, 0, true};
  for (int i = 0; i < 10; i++)
    cr_assert_eq(tko_submit_async(pool, async_fn, &a, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  tko_stats s = tf_stats(pool);
  cr_assert_eq(s.completed, 10);
  cr_assert_eq(s.failed, 0);
  finish(c, pool);
}

Test(async, errors) {
  actx *c = actx_new(4);
  tko_pool *pool = make_pool(c, 1, 0);
  aop a = {c, 0, 0, false};
  cr_assert_eq(tko_submit_async(NULL, async_fn, &a, 0), -EINVAL);
  cr_assert_eq(tko_submit_async(pool, NULL, &a, 0), -EINVAL);
  tko_group g;
  cr_assert_eq(tko_group_init(&g), 0);
  cr_assert_eq(tko_group_submit_async(pool, &g, NULL, &a, 0), -EINVAL);
  cr_assert_eq(tko_group_submit_async(pool, NULL, async_fn, &a, 0), -EINVAL);
  cr_assert_eq(tko_group_submit_async(NULL, &g, async_fn, &a, 0), -EINVAL);
  cr_assert_eq(tko_group_pending(&g), 0);
  cr_assert_eq(tko_async_complete(NULL, 0), -EINVAL);
  cr_assert_null(tko_async_arg(NULL));
  cr_assert_eq(tf_stats(pool).submitted, 0);

  cr_assert_eq(tko_submit_async(pool, async_fn, &a, 0), 0);
  cr_assert(wait_started(c, 1));
  pthread_mutex_lock(&c->mu);
  tko_async *op = c->ops[0];
  pthread_mutex_unlock(&c->mu);
  cr_assert_eq(complete_one(c, 0), 0);
  cr_assert_eq(tko_async_complete(op, 0), -EALREADY, "completed twice");
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  tko_stats s = tf_stats(pool);
  cr_assert_eq(s.completed, 1, "a double complete counted twice");
  cr_assert_eq(tt_count_get(&c->after), 1);

  cr_assert_eq(tko_pool_shutdown(pool, TKO_DRAIN), 0);
  cr_assert_eq(tko_submit_async(pool, async_fn, &a, 0), -ESHUTDOWN);
  cr_assert_eq(tko_group_submit_async(pool, &g, async_fn, &a, 0), -ESHUTDOWN);
  cr_assert_eq(tko_group_pending(&g), 0);
  cr_assert_eq(tko_group_destroy(&g), 0);
  finish(c, pool);
}

Test(async, hooks_see_the_completion_status) {
  actx *c = actx_new(4);
  tko_pool *pool = make_pool(c, 1, 0);
  aop a = {c, 0, 0, false};
  cr_assert_eq(tko_submit_async(pool, async_fn, &a, 3), 0);
  cr_assert(wait_started(c, 1));
  cr_assert_eq(tt_count_get(&c->before), 1);
  cr_assert_eq(tt_count_get(&c->after), 0);
  cr_assert_eq(complete_one(c, 9), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  cr_assert_eq(tt_count_get(&c->after), 1);
  cr_assert_eq(tt_count_get(&c->failures), 1);
  cr_assert_eq(atomic_load(&c->last_status), 9);
  cr_assert_eq(atomic_load(&c->last_fail_status), 9);
  cr_assert_eq(atomic_load(&c->before_id), 1);
  cr_assert_eq(atomic_load(&c->after_id), 1);
  tko_stats s = tf_stats(pool);
  cr_assert_eq(s.failed, 1);
  finish(c, pool);
}

Test(async, inflight_limit_is_never_exceeded) {
  enum { MAX = 2, N = TT_SCALE(200, 40) };
  actx *c = actx_new(N);
  tko_pool *pool = make_pool(c, 4, MAX);
  static aop as[N];
  for (int i = 0; i < N; i++) {
    as[i] = (aop){c, i % 5, 0, false};
    cr_assert_eq(tko_submit_async(pool, async_fn, &as[i], i % 5), 0);
  }
  /* Complete one op whenever the limit is reached (or nothing else can
   * start), so the pool is pushed against its limit all along. */
  for (long done = 0; done < N; done++) {
    struct timespec dl;
    tt_deadline(&dl, TT_LONG_MS);
    bool ok = true;
    pthread_mutex_lock(&c->mu);
    while (ok && !(c->nops > 0 && (c->inflight >= MAX || c->started == N)))
      ok = pthread_cond_timedwait(&c->cv, &c->mu, &dl) != ETIMEDOUT;
    pthread_mutex_unlock(&c->mu);
    cr_assert(ok, "async tasks stopped starting");
    cr_assert_leq(tf_stats(pool).async_inflight, MAX);
    cr_assert_eq(complete_one(c, 0), 0);
  }
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  cr_assert_eq(c->started, N);
  cr_assert_eq(c->max_inflight, MAX, "in flight at once: %ld", c->max_inflight);
  tko_stats s = tf_stats(pool);
  cr_assert_eq(s.completed, N);
  cr_assert_eq(s.async_inflight, 0);
  finish(c, pool);
}

Test(async, waiting_async_tasks_start_by_weight) {
  actx *c = actx_new(8);
  tko_pool *pool = make_pool(c, 1, 1);
  static const int weights[] = {1, 5, 3, 2, 4};
  aop as[5];
  cr_assert_eq(tko_pool_pause(pool), 0);
  for (int i = 0; i < 5; i++) {
    as[i] = (aop){c, weights[i], 0, false};
    cr_assert_eq(tko_submit_async(pool, async_fn, &as[i], weights[i]), 0);
  }
  cr_assert_eq(tko_pool_resume(pool), 0);
  for (int i = 0; i < 5; i++) {
    cr_assert(wait_started(c, i + 1));
    pthread_mutex_lock(&c->mu);
    cr_assert_eq(c->started, i + 1, "the limit of 1 was exceeded");
    pthread_mutex_unlock(&c->mu);
    cr_assert_eq(complete_one(c, 0), 0);
  }
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  for (int i = 0; i < 5; i++)
    cr_assert_eq(c->order[i], 5 - i);
  finish(c, pool);
}

static int plain_fn(void *arg) {
  tt_count_add(arg, 1);
  return 0;
}

Test(async, plain_tasks_run_while_the_limit_is_reached) {
  actx *c = actx_new(4);
  tko_pool *pool = make_pool(c, 2, 1);
  aop a = {c, 0, 0, false}, b = {c, 0, 0, false};
  cr_assert_eq(tko_submit_async(pool, async_fn, &a, 0), 0);
  cr_assert(wait_started(c, 1));
  cr_assert_eq(tko_submit_async(pool, async_fn, &b, 100), 0); /* waits for the slot */
  tt_count plain;
  tt_count_init(&plain);
  for (int i = 0; i < 10; i++)
    cr_assert_eq(tko_submit(pool, plain_fn, &plain, 0), 0);
  cr_assert(tt_count_wait_eq(&plain, 10));
  pthread_mutex_lock(&c->mu);
  cr_assert_eq(c->started, 1);
  pthread_mutex_unlock(&c->mu);
  tko_stats s = tf_stats(pool);
  cr_assert_eq(s.queued, 1);
  cr_assert_eq(s.async_inflight, 1);
  cr_assert_eq(complete_one(c, 0), 0);
  cr_assert(wait_started(c, 2));
  cr_assert_eq(complete_one(c, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  cr_assert_eq(tf_stats(pool).completed, 12);
  finish(c, pool);
}

/* A plain task of the same pool completes an async one. */
static int complete_from_task(void *arg) {
  return complete_one(arg, 0);
}

Test(async, completed_by_a_pool_task) {
  actx *c = actx_new(4);
  tko_pool *pool = make_pool(c, 1, 0);
  aop a = {c, 0, 0, false};
  cr_assert_eq(tko_submit_async(pool, async_fn, &a, 0), 0);
  cr_assert(wait_started(c, 1));
  cr_assert_eq(tko_submit(pool, complete_from_task, c, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  tko_stats s = tf_stats(pool);
  cr_assert_eq(s.completed, 2);
  cr_assert_eq(s.failed, 0);
  finish(c, pool);
}

/* ---- groups -------------------------------------------------------------- */

Test(async, group_waits_for_async_members) {
  actx *c = actx_new(8);
  tko_pool *pool = make_pool(c, 2, 0);
  aop as[3];
  tko_group g;
  cr_assert_eq(tko_group_init(&g), 0);
  for (int i = 0; i < 3; i++) {
    as[i] = (aop){c, 0, 0, false};
    cr_assert_eq(tko_group_submit_async(pool, &g, async_fn, &as[i], 0), 0);
  }
  tt_count plain;
  tt_count_init(&plain);
  cr_assert_eq(tko_group_submit(pool, &g, plain_fn, &plain, 0), 0);
  cr_assert(wait_started(c, 3));
  cr_assert(tt_count_wait_eq(&plain, 1));
  /* The plain member may still be between its return and its group
   * update; the three async members are certainly pending. */
  uint64_t pending = tko_group_pending(&g);
  cr_assert(pending == 3 || pending == 4);
  cr_assert_eq(tko_group_wait(&g, 0), -ETIMEDOUT);
  cr_assert_eq(complete_one(c, 0), 0);
  cr_assert_eq(complete_one(c, 4), 0);
  cr_assert_eq(tko_group_wait(&g, 0), -ETIMEDOUT);
  cr_assert_eq(complete_one(c, 0), 0);
  cr_assert_eq(tko_group_wait(&g, -1), 0);
  cr_assert_eq(tko_group_status(&g), 4);
  cr_assert_eq(tko_group_destroy(&g), 0);
  finish(c, pool);
}

Test(async, group_cancel_cancels_queued_async_members) {
  actx *c = actx_new(8);
  tko_pool *pool = make_pool(c, 1, 0);
  aop as[3];
  tko_group g;
  cr_assert_eq(tko_group_init(&g), 0);
  cr_assert_eq(tko_pool_pause(pool), 0);
  for (int i = 0; i < 3; i++) {
    as[i] = (aop){c, 0, 0, false};
    cr_assert_eq(tko_group_submit_async(pool, &g, async_fn, &as[i], 0), 0);
  }
  cr_assert_eq(tko_group_cancel(&g), 3);
  cr_assert_eq(tko_group_wait(&g, 0), 0);
  cr_assert_eq(tko_group_status(&g), -ECANCELED);
  cr_assert_eq(tt_count_get(&c->cancels), 3);
  cr_assert_eq(tko_pool_resume(pool), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  cr_assert_eq(c->started, 0);
  tko_stats s = tf_stats(pool);
  cr_assert_eq(s.cancelled, 3);
  cr_assert_eq(s.async_inflight, 0);
  cr_assert_eq(tko_group_destroy(&g), 0);
  finish(c, pool);
}

/* ---- shutdown ------------------------------------------------------------ */

static int shutdown_drain(void *pool) {
  return tko_pool_shutdown(pool, TKO_DRAIN);
}
static int shutdown_cancel(void *pool) {
  return tko_pool_shutdown(pool, TKO_CANCEL);
}

/* Shutdown, in either mode, waits for an in-flight task: the workers are
 * joined (their thread_stop hooks ran), and shutdown is still waiting until
 * the test completes the task from this thread. */
static void shutdown_waits_for_inflight(tko_shutdown_mode mode) {
  enum { WORKERS = 2 };
  actx *c = actx_new(4);
  tko_pool *pool = make_pool(c, WORKERS, 0);
  aop a = {c, 0, 0, false};
  cr_assert_eq(tko_submit_async(pool, async_fn, &a, 0), 0);
  cr_assert(wait_started(c, 1));
  tf_thread t;
  cr_assert_eq(tf_thread_start(&t, mode == TKO_DRAIN ? shutdown_drain : shutdown_cancel, pool), 0);
  cr_assert(tt_count_wait_eq(&worker_stops, WORKERS));
  tf_wait_thread_sleeping(t.tid); /* best effort: it waits for the completion */
  cr_assert_not(tf_thread_is_done(&t), "shutdown returned with a task in flight");
  cr_assert_eq(tko_submit_async(pool, async_fn, &a, 0), -ESHUTDOWN);
  cr_assert_eq(tf_stats(pool).async_inflight, 1);
  cr_assert_eq(complete_one(c, 0), 0);
  int rc = -1;
  cr_assert(tf_thread_join(&t, &rc));
  cr_assert_eq(rc, 0);
  tko_stats s = tf_stats(pool);
  cr_assert_eq(s.completed, 1);
  cr_assert_eq(s.cancelled, 0);
  cr_assert_eq(s.async_inflight, 0);
  cr_assert_eq(tt_count_get(&c->after), 1);
  finish(c, pool);
}

Test(async, shutdown_drain_waits_for_inflight_tasks) {
  shutdown_waits_for_inflight(TKO_DRAIN);
}
Test(async, shutdown_cancel_waits_for_inflight_tasks) {
  shutdown_waits_for_inflight(TKO_CANCEL);
}

Test(async, shutdown_cancel_cancels_queued_async_tasks) {
  enum { N = 20 };
  actx *c = actx_new(N);
  tko_pool *pool = make_pool(c, 2, 2);
  aop as[N];
  cr_assert_eq(tko_pool_pause(pool), 0);
  for (int i = 0; i < N; i++) {
    as[i] = (aop){c, i, 0, false};
    cr_assert_eq(tko_submit_async(pool, async_fn, &as[i], i), 0);
  }
  tf_thread t;
  cr_assert_eq(tf_thread_start(&t, shutdown_cancel, pool), 0);
  int rc = -1;
  cr_assert(tf_thread_join(&t, &rc), "shutdown hung on cancelled async tasks");
  cr_assert_eq(rc, 0);
  cr_assert_eq(c->started, 0);
  cr_assert_eq(tt_count_get(&c->cancels), N);
  tko_stats s = tf_stats(pool);
  cr_assert_eq(s.cancelled, N);
  cr_assert_eq(s.async_inflight, 0);
  cr_assert_eq(s.completed + s.cancelled, s.submitted);
  finish(c, pool);
}

/* One in flight and more waiting for the slot when CANCEL starts: the
 * waiting ones are cancelled, the in-flight one is waited for. */
Test(async, shutdown_cancel_with_tasks_waiting_for_the_slot) {
  enum { N = 6 };
  actx *c = actx_new(N);
  tko_pool *pool = make_pool(c, 2, 1);
  aop as[N];
  for (int i = 0; i < N; i++) {
    as[i] = (aop){c, 0, 0, false};
    cr_assert_eq(tko_submit_async(pool, async_fn, &as[i], 0), 0);
    if (i == 0) cr_assert(wait_started(c, 1));
  }
  tf_thread t;
  cr_assert_eq(tf_thread_start(&t, shutdown_cancel, pool), 0);
  cr_assert(tt_count_wait_eq(&c->cancels, N - 1));
  cr_assert_eq(complete_one(c, 0), 0);
  int rc = -1;
  cr_assert(tf_thread_join(&t, &rc));
  cr_assert_eq(rc, 0);
  cr_assert_eq(c->started, 1);
  tko_stats s = tf_stats(pool);
  cr_assert_eq(s.completed, 1);
  cr_assert_eq(s.cancelled, N - 1);
  cr_assert_eq(s.submitted, N);
  finish(c, pool);
}

Test(async, shutdown_drain_starts_and_waits_for_queued_async_tasks) {
  enum { N = 5 };
  actx *c = actx_new(N);
  tko_pool *pool = make_pool(c, 2, 1);
  aop as[N];
  cr_assert_eq(tko_pool_pause(pool), 0);
  for (int i = 0; i < N; i++) {
    as[i] = (aop){c, 0, 0, false};
    cr_assert_eq(tko_submit_async(pool, async_fn, &as[i], 0), 0);
  }
  completer k = {c, N, 0};
  tf_thread t;
  cr_assert_eq(tf_thread_start(&t, completer_fn, &k), 0);
  cr_assert_eq(tko_pool_shutdown(pool, TKO_DRAIN), 0);
  int rc = -1;
  cr_assert(tf_thread_join(&t, &rc));
  cr_assert_eq(rc, 0);
  cr_assert_eq(k.errors, 0);
  cr_assert_eq(c->started, N);
  cr_assert_leq(c->max_inflight, 1);
  tko_stats s = tf_stats(pool);
  cr_assert_eq(s.completed, N);
  cr_assert_eq(s.cancelled, 0);
  finish(c, pool);
}

/* ---- concurrency --------------------------------------------------------- */

Test(async, many_tasks_two_completers) {
  enum { MAX = 8, N = TT_SCALE(3000, 300) };
  actx *c = actx_new(N);
  tko_pool *pool = make_pool(c, 2, MAX);
  aop *as = calloc(N, sizeof *as);
  completer k[2] = {{c, N, 0}, {c, N, 0}};
  tf_thread t[2];
  for (int i = 0; i < 2; i++)
    cr_assert_eq(tf_thread_start(&t[i], completer_fn, &k[i]), 0);
  for (int i = 0; i < N; i++) {
    as[i] = (aop){c, i & 7, 0, false};
    cr_assert_eq(tko_submit_async(pool, async_fn, &as[i], i & 7), 0);
  }
  for (int i = 0; i < 2; i++) {
    int rc = -1;
    cr_assert(tf_thread_join(&t[i], &rc));
    cr_assert_eq(rc, 0);
    cr_assert_eq(k[i].errors, 0);
  }
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  cr_assert_leq(c->max_inflight, MAX);
  tko_stats s = tf_stats(pool);
  cr_assert_eq(s.completed, N);
  cr_assert_eq(s.async_inflight, 0);
  finish(c, pool);
  free(as);
}

/* A timed shutdown gives up on an in-flight task at its deadline with
 * -ETIMEDOUT, leaving the task in flight (its completion still counts, and
 * a shutdown after it returns 0). The second call is made once both
 * workers have stopped, so its time is spent waiting for the task. */
Test(async, timed_shutdown_times_out_on_an_inflight_task) {
  actx *c = actx_new(4);
  tko_pool *pool = make_pool(c, 2, 0);
  aop a = {c, 0, 0, false};
  cr_assert_eq(tko_submit_async(pool, async_fn, &a, 0), 0);
  cr_assert(wait_started(c, 1));
  cr_assert_eq(tko_pool_shutdown_timed(pool, TKO_DRAIN, 0), -ETIMEDOUT);
  cr_assert(tt_count_wait_eq(&worker_stops, 2));
  cr_assert_eq(tko_pool_shutdown_timed(pool, TKO_DRAIN, 50), -ETIMEDOUT);
  cr_assert_eq(tf_stats(pool).async_inflight, 1);
  cr_assert_eq(tt_count_get(&c->after), 0, "the task was finished for it");
  cr_assert_eq(complete_one(c, 0), 0);
  cr_assert_eq(tko_pool_shutdown_timed(pool, TKO_DRAIN, TT_LONG_MS), 0);
  tko_stats s = tf_stats(pool);
  cr_assert_eq(s.completed, 1);
  cr_assert_eq(s.async_inflight, 0);
  cr_assert_eq(tt_count_get(&c->after), 1);
  finish(c, pool);
}

/* Each hook is optional: with only before_run set (so the pool times its
 * tasks), an async task that fails is counted failed and finished, and a
 * pool without hooks runs it the same. */
Test(async, hooks_are_optional_each) {
  for (int with_before = 0; with_before < 2; with_before++) {
    actx *c = actx_new(4);
    tko_options o = tko_basic_options(1);
    o.hooks.user = c;
    if (with_before) o.hooks.before_run = before_run;
    tko_pool *pool = NULL;
    cr_assert_eq(tko_pool_create(&pool, &o), 0);
    c->pool = pool;
    aop a = {c, 0, 0, false};
    cr_assert_eq(tko_submit_async(pool, async_fn, &a, 0), 0);
    cr_assert(wait_started(c, 1));
    cr_assert_eq(complete_one(c, 5), 0);
    cr_assert_eq(tko_pool_wait_idle(pool, TT_LONG_MS), 0);
    tko_stats s = tf_stats(pool);
    cr_assert_eq(s.completed, 1);
    cr_assert_eq(s.failed, 1);
    cr_assert_eq(tt_count_get(&c->before), with_before);
    finish(c, pool);
  }
}
