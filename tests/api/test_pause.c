/* SPDX-License-Identifier: MIT */
/* Tests for tko_pool_pause / tko_pool_resume: no queued task starts while
 * paused, submits are accepted, resume runs them in priority order, a running
 * task is not stopped, wait_idle times out on a paused pool with work,
 * shutdown drains or cancels a paused pool, pools pause independently, and
 * pause/resume race safely with submits. No test sleeps to wait for
 * something: every wait is on the pool's own wait or on a condition
 * variable, with a generous deadline that turns a hang into a failure. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "taskorch.h"
#include "tko_test.h"
#include "tko_test_sync.h"

/* How long a test lets a paused pool sit to show that nothing starts. */
#define PT_PAUSED_MS 50L

static int count_fn(void *arg) {
  atomic_fetch_add_explicit((atomic_long *)arg, 1, memory_order_relaxed);
  return 0;
}

static tko_pool *make_pool(unsigned workers, const tko_hooks *hooks) {
  tko_options o = tko_basic_options(workers);
  if (hooks) o.hooks = *hooks;
  tko_pool *p = NULL;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  return p;
}

Test(pause, null_pool_is_einval) {
  cr_assert_eq(tko_pool_pause(NULL), -EINVAL);
  cr_assert_eq(tko_pool_resume(NULL), -EINVAL);
}

Test(pause, no_queued_task_starts_while_paused) {
  tko_pool *p = make_pool(2, NULL);
  atomic_long n = 0;
  cr_assert_eq(tko_pool_pause(p), 0);
  for (int i = 0; i < 100; i++) cr_assert_eq(tko_submit(p, count_fn, &n, i % 3), 0);
  cr_assert_eq(tko_pool_wait_idle(p, PT_PAUSED_MS), -ETIMEDOUT);
  cr_assert_eq(tko_pool_wait_idle(p, 0), -ETIMEDOUT);
  cr_assert_eq(atomic_load(&n), 0);
  tko_stats s;
  tko_pool_stats(p, &s);
  cr_assert_eq(s.submitted, 100);
  cr_assert_eq(s.queued, 100);
  cr_assert_eq(s.running, 0);
  cr_assert_eq(s.completed, 0);

  cr_assert_eq(tko_pool_resume(p), 0);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&n), 100);
  tko_pool_stats(p, &s);
  cr_assert_eq(s.completed, 100);
  cr_assert_eq(s.queued, 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

Test(pause, pause_and_resume_are_idempotent) {
  tko_pool *p = make_pool(1, NULL);
  atomic_long n = 0;
  cr_assert_eq(tko_pool_resume(p), 0); /* not paused: nothing to do */
  cr_assert_eq(tko_pool_pause(p), 0);
  cr_assert_eq(tko_pool_pause(p), 0);
  cr_assert_eq(tko_submit(p, count_fn, &n, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(p, PT_PAUSED_MS), -ETIMEDOUT);
  cr_assert_eq(tko_pool_resume(p), 0); /* one resume undoes both pauses */
  cr_assert_eq(tko_pool_resume(p), 0);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&n), 1);
  /* Pause then resume again, with no work in between. */
  cr_assert_eq(tko_pool_pause(p), 0);
  cr_assert_eq(tko_pool_wait_idle(p, 0), 0); /* nothing queued: idle though paused */
  cr_assert_eq(tko_pool_resume(p), 0);
  cr_assert_eq(tko_submit(p, count_fn, &n, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&n), 2);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

Test(pause, wait_on_paused_pool_times_out_until_resume) {
  tko_pool *p = make_pool(2, NULL);
  atomic_long n = 0;
  cr_assert_eq(tko_pool_pause(p), 0);
  cr_assert_eq(tko_submit(p, count_fn, &n, 0), 0);
  for (int i = 0; i < 3; i++) cr_assert_eq(tko_pool_wait_idle(p, 10), -ETIMEDOUT);
  cr_assert_eq(tko_pool_wait_idle(p, 0), -ETIMEDOUT);
  cr_assert_eq(atomic_load(&n), 0);
  cr_assert_eq(tko_pool_resume(p), 0);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&n), 1);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* One worker, paused while the tasks go in: after resume they run exactly in
 * (weight desc, submit order), since nothing was taken before. */
typedef struct order_log {
  int order[64];
  atomic_int next;
} order_log;

typedef struct order_item {
  order_log *log;
  int tag;
} order_item;

static int log_fn(void *arg) {
  order_item *it = arg;
  int k = atomic_fetch_add(&it->log->next, 1);
  it->log->order[k] = it->tag;
  return 0;
}

Test(pause, resume_runs_in_priority_order) {
  tko_pool *p = make_pool(1, NULL);
  order_log log = {.next = 0};
  order_item items[40];
  const int weights[4] = {0, 5, -3, 5};
  cr_assert_eq(tko_pool_pause(p), 0);
  for (int i = 0; i < 40; i++) {
    items[i] = (order_item){&log, i};
    cr_assert_eq(tko_submit(p, log_fn, &items[i], weights[i % 4]), 0);
  }
  cr_assert_eq(tko_pool_resume(p), 0);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&log.next), 40);
  /* Expected: weight 5 (i%4 in {1,3}) in submit order, then 0, then -3. */
  int k = 0;
  for (int i = 0; i < 40; i++)
    if (i % 4 == 1 || i % 4 == 3) cr_assert_eq(log.order[k++], i);
  for (int i = 0; i < 40; i += 4) cr_assert_eq(log.order[k++], i);
  for (int i = 2; i < 40; i += 4) cr_assert_eq(log.order[k++], i);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* A task that says it started, then blocks until the test opens the gate. */
typedef struct gate {
  tt_count started;
  tt_count open; /* the gate is open once this is 1 */
  tt_count done;
} gate;

static int gate_fn(void *arg) {
  gate *g = arg;
  tt_count_add(&g->started, 1);
  tt_count_wait_geq(&g->open, 1);
  tt_count_add(&g->done, 1);
  return 0;
}

static void gate_init(gate *g) {
  tt_count_init(&g->started);
  tt_count_init(&g->open);
  tt_count_init(&g->done);
}

static void gate_fini(gate *g) {
  tt_count_fini(&g->started);
  tt_count_fini(&g->open);
  tt_count_fini(&g->done);
}

Test(pause, running_task_finishes_and_queued_one_waits) {
  tko_pool *p = make_pool(2, NULL);
  gate g;
  gate_init(&g);
  atomic_long n = 0;
  cr_assert_eq(tko_submit(p, gate_fn, &g, 0), 0);
  cr_assert(tt_count_wait_geq(&g.started, 1));
  cr_assert_eq(tko_pool_pause(p), 0);
  cr_assert_eq(tko_submit(p, count_fn, &n, 0), 0);
  tt_count_add(&g.open, 1);          /* the running task may now finish... */
  cr_assert(tt_count_wait_geq(&g.done, 1)); /* ...and does, though paused */
  cr_assert_eq(tko_pool_wait_idle(p, PT_PAUSED_MS), -ETIMEDOUT);
  cr_assert_eq(atomic_load(&n), 0); /* the queued one did not start */
  tko_stats s;
  tko_pool_stats(p, &s);
  cr_assert_eq(s.queued, 1);
  cr_assert_eq(tko_pool_resume(p), 0);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&n), 1);
  cr_assert_eq(tko_pool_destroy(p), 0);
  gate_fini(&g);
}

Test(pause, drain_shutdown_runs_everything_queued_while_paused) {
  tko_pool *p = make_pool(2, NULL);
  atomic_long n = 0;
  cr_assert_eq(tko_pool_pause(p), 0);
  for (int i = 0; i < 500; i++) cr_assert_eq(tko_submit(p, count_fn, &n, i % 7), 0);
  cr_assert_eq(tko_pool_wait_idle(p, PT_PAUSED_MS), -ETIMEDOUT);
  cr_assert_eq(tko_pool_shutdown(p, TKO_DRAIN), 0);
  cr_assert_eq(atomic_load(&n), 500);
  tko_stats s;
  tko_pool_stats(p, &s);
  cr_assert_eq(s.completed, 500);
  cr_assert_eq(s.cancelled, 0);
  cr_assert_eq(s.queued, 0);
  cr_assert_eq(tko_submit(p, count_fn, &n, 0), -ESHUTDOWN);
  cr_assert_eq(tko_pool_wait_idle(p, 0), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

Test(pause, destroy_drains_a_paused_pool) {
  tko_pool *p = make_pool(1, NULL);
  atomic_long n = 0;
  cr_assert_eq(tko_pool_pause(p), 0);
  for (int i = 0; i < 50; i++) cr_assert_eq(tko_submit(p, count_fn, &n, 0), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
  cr_assert_eq(atomic_load(&n), 50);
}

static void count_cancel(void *user, const tko_task_info *t) {
  (void)t;
  atomic_fetch_add((atomic_long *)user, 1);
}

Test(pause, cancel_shutdown_cancels_everything_queued_while_paused) {
  atomic_long cancelled = 0, n = 0;
  tko_hooks h = {.user = &cancelled, .on_cancel = count_cancel};
  tko_pool *p = make_pool(2, &h);
  cr_assert_eq(tko_pool_pause(p), 0);
  for (int i = 0; i < 500; i++) cr_assert_eq(tko_submit(p, count_fn, &n, i % 7), 0);
  cr_assert_eq(tko_pool_shutdown(p, TKO_CANCEL), 0);
  cr_assert_eq(atomic_load(&n), 0);
  cr_assert_eq(atomic_load(&cancelled), 500);
  tko_stats s;
  tko_pool_stats(p, &s);
  cr_assert_eq(s.cancelled, 500);
  cr_assert_eq(s.completed, 0);
  cr_assert_eq(s.queued, 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

Test(pause, pools_pause_independently) {
  tko_pool *a = make_pool(1, NULL), *b = make_pool(1, NULL);
  atomic_long na = 0, nb = 0;
  cr_assert_eq(tko_pool_pause(a), 0);
  for (int i = 0; i < 20; i++) {
    cr_assert_eq(tko_submit(a, count_fn, &na, 0), 0);
    cr_assert_eq(tko_submit(b, count_fn, &nb, 0), 0);
  }
  cr_assert_eq(tko_pool_wait_idle(b, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&nb), 20);
  cr_assert_eq(tko_pool_wait_idle(a, PT_PAUSED_MS), -ETIMEDOUT);
  cr_assert_eq(atomic_load(&na), 0);
  cr_assert_eq(tko_pool_resume(b), 0); /* resuming the other pool changes nothing */
  cr_assert_eq(tko_pool_wait_idle(a, PT_PAUSED_MS), -ETIMEDOUT);
  cr_assert_eq(tko_pool_resume(a), 0);
  cr_assert_eq(tko_pool_wait_idle(a, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&na), 20);
  cr_assert_eq(tko_pool_destroy(a), 0);
  cr_assert_eq(tko_pool_destroy(b), 0);
}

/* A task pauses its own pool, then queues a follow-up: the follow-up waits
 * for the test's resume. */
typedef struct self_pause {
  tko_pool *pool;
  atomic_long n;
  atomic_int rc;
} self_pause;

static int pausing_fn(void *arg) {
  self_pause *s = arg;
  int rc = tko_pool_pause(s->pool);
  if (rc == 0) rc = tko_submit(s->pool, count_fn, &s->n, 0);
  atomic_store(&s->rc, rc);
  return 0;
}

Test(pause, task_can_pause_its_own_pool) {
  self_pause s = {.n = 0, .rc = 1};
  s.pool = make_pool(2, NULL);
  cr_assert_eq(tko_submit(s.pool, pausing_fn, &s, 0), 0);
  /* Times out: the follow-up is queued behind the pause. */
  cr_assert_eq(tko_pool_wait_idle(s.pool, PT_PAUSED_MS), -ETIMEDOUT);
  cr_assert_eq(atomic_load(&s.rc), 0);
  cr_assert_eq(atomic_load(&s.n), 0);
  cr_assert_eq(tko_pool_resume(s.pool), 0);
  cr_assert_eq(tko_pool_wait_idle(s.pool, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&s.n), 1);
  cr_assert_eq(tko_pool_destroy(s.pool), 0);
}

/* Pause and resume race with submitters; after a final resume every task
 * has run exactly once. */
typedef struct storm {
  tko_pool *pool;
  atomic_long n;
  atomic_int failed_submits; /* asserted on the test's thread */
  long per_thread;
} storm;

static void *submitter(void *arg) {
  storm *s = arg;
  for (long i = 0; i < s->per_thread; i++)
    if (tko_submit(s->pool, count_fn, &s->n, (int)(i % 5)) != 0)
      atomic_fetch_add(&s->failed_submits, 1);
  return NULL;
}

Test(pause, pause_resume_race_with_submits) {
  storm s = {.n = 0, .failed_submits = 0, .per_thread = TT_SCALE(20000, 2000)};
  s.pool = make_pool(2, NULL);
  pthread_t t[2];
  for (int i = 0; i < 2; i++) cr_assert_eq(pthread_create(&t[i], NULL, submitter, &s), 0);
  for (int i = 0; i < TT_SCALE(2000, 200); i++) {
    cr_assert_eq(tko_pool_pause(s.pool), 0);
    cr_assert_eq(tko_pool_resume(s.pool), 0);
  }
  cr_assert_eq(tko_pool_pause(s.pool), 0);
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
  cr_assert_eq(atomic_load(&s.failed_submits), 0);
  cr_assert_eq(tko_pool_resume(s.pool), 0);
  cr_assert_eq(tko_pool_wait_idle(s.pool, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&s.n), 2 * s.per_thread);
  cr_assert_eq(tko_pool_destroy(s.pool), 0);
}
