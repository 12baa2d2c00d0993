/* SPDX-License-Identifier: MIT */
/* Tests for the pool's lifecycle: wait_idle (idle, timeout, no limit),
 * shutdown with TKO_DRAIN and TKO_CANCEL (every queued task run, or handed
 * to on_cancel exactly once and never run), idempotence, -ESHUTDOWN after
 * shutdown, -EDEADLK from the pool's own tasks and hooks, destroy joining
 * every thread, and exactly-once under a cancel that races running tasks. */
#include <limits.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "taskorch.h"
#include "tko_test.h"
#include "tko_test_sync.h"

static int count_fn(void *arg) {
  atomic_fetch_add((atomic_long *)arg, 1);
  return 0;
}

typedef struct gate_task {
  tt_gate gate;
  tt_count started;
  atomic_int timed_out;
} gate_task;

static void gate_task_init(gate_task *g) {
  memset(g, 0, sizeof *g);
  pthread_mutex_init(&g->gate.mu, NULL);
  pthread_cond_init(&g->gate.cv, NULL);
  tt_count_init(&g->started);
}

static int gate_fn(void *arg) {
  gate_task *g = arg;
  tt_count_add(&g->started, 1);
  if (!tt_gate_wait(&g->gate)) atomic_store(&g->timed_out, 1);
  return 0;
}

/* Per-task bookkeeping: how often each task ran and was cancelled. */
typedef struct ledger {
  atomic_uchar *ran, *cancelled;
  long n;
  atomic_long ran_total, cancel_total;
  atomic_int bad_cancel_info;
  tt_count *progress; /* optional: counted once per 64 tasks run */
} ledger;

typedef struct entry {
  ledger *l;
  long idx;
} entry;

static void ledger_init(ledger *l, long n) {
  memset(l, 0, sizeof *l);
  l->n = n;
  l->ran = calloc((size_t)n, 1);
  l->cancelled = calloc((size_t)n, 1);
  cr_assert(l->ran && l->cancelled);
}

static void ledger_fini(ledger *l) {
  free(l->ran);
  free(l->cancelled);
}

static int entry_fn(void *arg) {
  entry *e = arg;
  atomic_fetch_add(&e->l->ran[e->idx], 1);
  atomic_fetch_add(&e->l->ran_total, 1);
  return 0;
}

static void on_cancel(void *user, const tko_task_info *t) {
  ledger *l = user;
  entry *e = t->arg;
  /* on_cancel is told the task it drops and that no worker ran it. */
  if (t->worker != UINT32_MAX || t->id == 0) atomic_store(&l->bad_cancel_info, 1);
  if (t->fn != entry_fn) { /* a probe (count_fn): not in the ledger */
    if (t->fn != count_fn) atomic_store(&l->bad_cancel_info, 1);
    return;
  }
  atomic_fetch_add(&l->cancelled[e->idx], 1);
  atomic_fetch_add(&l->cancel_total, 1);
}

/* ---- wait_idle ----------------------------------------------------------- */

Test(lifecycle, wait_idle_returns_zero_when_idle) {
  tko_pool *p;
  tko_options o = tko_basic_options(2);
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  cr_assert_eq(tko_pool_wait_idle(p, 0), 0, "a fresh pool is idle");
  cr_assert_eq(tko_pool_wait_idle(p, -1), 0);
  cr_assert_eq(tko_pool_wait_idle(p, 10), 0);
  atomic_long n = 0;
  for (int i = 0; i < 100; i++) cr_assert_eq(tko_submit(p, count_fn, &n, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(p, -1), 0);
  cr_assert_eq(atomic_load(&n), 100);
  cr_assert_eq(tko_pool_wait_idle(p, 0), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

Test(lifecycle, wait_idle_times_out_while_a_task_is_blocked) {
  tko_pool *p;
  tko_options o = tko_basic_options(1);
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  gate_task g;
  gate_task_init(&g);
  cr_assert_eq(tko_submit(p, gate_fn, &g, 0), 0);
  cr_assert(tt_count_wait_geq(&g.started, 1));
  cr_assert_eq(tko_pool_wait_idle(p, 0), -ETIMEDOUT);
  cr_assert_eq(tko_pool_wait_idle(p, 20), -ETIMEDOUT);
  atomic_long n = 0;
  cr_assert_eq(tko_submit(p, count_fn, &n, 0), 0); /* queued behind the gate */
  cr_assert_eq(tko_pool_wait_idle(p, 1), -ETIMEDOUT);
  tt_gate_open(&g.gate);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&n), 1);
  cr_assert_eq(atomic_load(&g.timed_out), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

typedef struct waiter {
  tko_pool *p;
  tt_count *ready;
  int rc;
} waiter;

static void *wait_thread(void *arg) {
  waiter *w = arg;
  tt_count_add(w->ready, 1);
  w->rc = tko_pool_wait_idle(w->p, TT_LONG_MS);
  return NULL;
}

Test(lifecycle, many_waiters_all_return) {
  tko_pool *p;
  tko_options o = tko_basic_options(2);
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  gate_task g;
  gate_task_init(&g);
  cr_assert_eq(tko_submit(p, gate_fn, &g, 0), 0);
  cr_assert(tt_count_wait_geq(&g.started, 1));
  tt_count ready = TT_COUNT_INIT;
  waiter w[4];
  pthread_t th[4];
  for (int i = 0; i < 4; i++) {
    w[i] = (waiter){p, &ready, -1};
    cr_assert_eq(pthread_create(&th[i], NULL, wait_thread, &w[i]), 0);
  }
  cr_assert(tt_count_wait_geq(&ready, 4));
  tt_gate_open(&g.gate);
  for (int i = 0; i < 4; i++) {
    pthread_join(th[i], NULL);
    cr_assert_eq(w[i].rc, 0);
  }
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* ---- shutdown ------------------------------------------------------------ */

typedef struct shutter {
  tko_pool *p;
  tko_shutdown_mode mode;
  int rc;
} shutter;

static void *shutdown_thread(void *arg) {
  shutter *s = arg;
  s->rc = tko_pool_shutdown(s->p, s->mode);
  return NULL;
}

/* Starts shutdown on another thread while the only worker is held by the
 * gate, and returns once shutdown has begun. Submit's -ESHUTDOWN is the only
 * public sign of that, so probe with it; accepted probes (the shutdown
 * thread has not run yet) are counted in *probes and are queued like the
 * rest. */
static void begin_shutdown(shutter *s, pthread_t *th, atomic_long *probe_count, long *probes) {
  cr_assert_eq(pthread_create(th, NULL, shutdown_thread, s), 0);
  *probes = 0;
  for (;;) {
    int rc = tko_submit(s->p, count_fn, probe_count, 0);
    if (rc == -ESHUTDOWN) break;
    cr_assert_eq(rc, 0);
    ++*probes;
    sched_yield(); /* let the shutdown thread get to the lock */
  }
}

Test(lifecycle, drain_runs_everything_queued) {
  ledger l;
  const long n = 2000;
  ledger_init(&l, n);
  entry *e = calloc((size_t)n, sizeof *e);
  tko_options o = tko_basic_options(1);
  o.hooks.user = &l;
  o.hooks.on_cancel = on_cancel;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  gate_task g;
  gate_task_init(&g);
  cr_assert_eq(tko_submit(p, gate_fn, &g, 0), 0);
  cr_assert(tt_count_wait_geq(&g.started, 1));
  for (long i = 0; i < n; i++) {
    e[i] = (entry){&l, i};
    cr_assert_eq(tko_submit(p, entry_fn, &e[i], (int)(i % 7)), 0);
  }
  shutter s = {p, TKO_DRAIN, -1};
  pthread_t th;
  atomic_long probe_runs = 0;
  long probes;
  begin_shutdown(&s, &th, &probe_runs, &probes);
  /* Shutdown has begun with everything still queued behind the gate. */
  cr_assert_eq(atomic_load(&l.ran_total), 0);
  tt_gate_open(&g.gate);
  pthread_join(th, NULL);
  cr_assert_eq(s.rc, 0);
  for (long i = 0; i < n; i++) cr_assert_eq(atomic_load(&l.ran[i]), 1, "task %ld", i);
  cr_assert_eq(atomic_load(&l.cancel_total), 0);
  cr_assert_eq(atomic_load(&probe_runs), probes);
  tko_stats st;
  tko_pool_stats(p, &st);
  cr_assert_eq(st.submitted, (uint64_t)(n + 1 + probes));
  cr_assert_eq(st.completed, st.submitted);
  cr_assert_eq(st.cancelled, 0);
  cr_assert_eq(st.queued, 0);
  cr_assert_eq(st.running, 0);
  cr_assert_eq(st.basic_workers, 0, "shutdown joined the workers");
  cr_assert_eq(tko_pool_destroy(p), 0);
  free(e);
  ledger_fini(&l);
}

Test(lifecycle, cancel_hands_each_queued_task_to_on_cancel_once) {
  ledger l;
  const long n = 2000;
  ledger_init(&l, n);
  entry *e = calloc((size_t)n, sizeof *e);
  tko_options o = tko_basic_options(1);
  o.hooks.user = &l;
  o.hooks.on_cancel = on_cancel;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  gate_task g;
  gate_task_init(&g);
  cr_assert_eq(tko_submit(p, gate_fn, &g, 0), 0);
  cr_assert(tt_count_wait_geq(&g.started, 1));
  for (long i = 0; i < n; i++) {
    e[i] = (entry){&l, i};
    cr_assert_eq(tko_submit(p, entry_fn, &e[i], (int)(i % 7) - 3), 0);
  }
  shutter s = {p, TKO_CANCEL, -1};
  pthread_t th;
  atomic_long probe_runs = 0;
  long probes;
  begin_shutdown(&s, &th, &probe_runs, &probes);
  /* The gate opens only after cancelling began, so no queued task may run,
   * even one the worker might grab right after the gate. */
  tt_gate_open(&g.gate);
  pthread_join(th, NULL);
  cr_assert_eq(s.rc, 0);
  for (long i = 0; i < n; i++) {
    cr_assert_eq(atomic_load(&l.ran[i]), 0, "task %ld ran after TKO_CANCEL", i);
    cr_assert_eq(atomic_load(&l.cancelled[i]), 1, "task %ld", i);
  }
  cr_assert_eq(atomic_load(&l.bad_cancel_info), 0);
  cr_assert_eq(atomic_load(&probe_runs), 0);
  tko_stats st;
  tko_pool_stats(p, &st);
  cr_assert_eq(st.submitted, (uint64_t)(n + 1 + probes));
  cr_assert_eq(st.completed, 1, "only the gate ran");
  cr_assert_eq(st.cancelled, (uint64_t)(n + probes));
  cr_assert_eq(st.submitted, st.completed + st.cancelled);
  cr_assert_eq(st.queued, 0);
  cr_assert_eq(st.running, 0);
  /* Nothing runs after shutdown returned: the ledger is still the same. */
  cr_assert_eq(tko_pool_wait_idle(p, 0), 0);
  cr_assert_eq(atomic_load(&l.ran_total), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
  cr_assert_eq(atomic_load(&l.ran_total), 0, "destroy ran nothing after the cancel");
  cr_assert_eq(atomic_load(&l.cancel_total), n);
  free(e);
  ledger_fini(&l);
}

Test(lifecycle, cancel_drops_tasks_a_worker_had_taken) {
  /* A worker takes up to max_batch queued tasks at once. Tasks it has taken but
   * not started are still queued (stats count them so): once TKO_CANCEL
   * begins they go to on_cancel, not to the task. Pausing while submitting
   * lets the single worker take the gate and the rest in one batch. */
  ledger l;
  const long n = 15;
  ledger_init(&l, n);
  entry e[15];
  tko_options o = tko_basic_options(1);
  o.hooks.user = &l;
  o.hooks.on_cancel = on_cancel;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  cr_assert_eq(tko_pool_pause(p), 0);
  gate_task g;
  gate_task_init(&g);
  cr_assert_eq(tko_submit(p, gate_fn, &g, INT_MAX), 0);
  for (long i = 0; i < n; i++) {
    e[i] = (entry){&l, i};
    cr_assert_eq(tko_submit(p, entry_fn, &e[i], 0), 0);
  }
  cr_assert_eq(tko_pool_resume(p), 0);
  cr_assert(tt_count_wait_geq(&g.started, 1));
  shutter s = {p, TKO_CANCEL, -1};
  pthread_t th;
  atomic_long probe_runs = 0;
  long probes;
  begin_shutdown(&s, &th, &probe_runs, &probes);
  tt_gate_open(&g.gate);
  pthread_join(th, NULL);
  cr_assert_eq(s.rc, 0);
  for (long i = 0; i < n; i++) {
    cr_assert_eq(atomic_load(&l.ran[i]), 0, "task %ld ran after TKO_CANCEL began", i);
    cr_assert_eq(atomic_load(&l.cancelled[i]), 1, "task %ld", i);
  }
  cr_assert_eq(atomic_load(&probe_runs), 0);
  tko_stats st;
  tko_pool_stats(p, &st);
  cr_assert_eq(st.completed, 1);
  cr_assert_eq(st.cancelled, (uint64_t)(n + probes));
  cr_assert_eq(tko_pool_destroy(p), 0);
  ledger_fini(&l);
}

Test(lifecycle, cancel_without_hook_still_drops_tasks) {
  tko_options o = tko_basic_options(1);
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  gate_task g;
  gate_task_init(&g);
  cr_assert_eq(tko_submit(p, gate_fn, &g, 0), 0);
  cr_assert(tt_count_wait_geq(&g.started, 1));
  atomic_long n = 0;
  for (int i = 0; i < 100; i++) cr_assert_eq(tko_submit(p, count_fn, &n, 0), 0);
  shutter s = {p, TKO_CANCEL, -1};
  pthread_t th;
  atomic_long probe_runs = 0;
  long probes;
  begin_shutdown(&s, &th, &probe_runs, &probes);
  tt_gate_open(&g.gate);
  pthread_join(th, NULL);
  cr_assert_eq(s.rc, 0);
  cr_assert_eq(atomic_load(&n), 0);
  cr_assert_eq(atomic_load(&probe_runs), 0);
  tko_stats st;
  tko_pool_stats(p, &st);
  cr_assert_eq(st.cancelled, (uint64_t)(100 + probes));
  cr_assert_eq(tko_pool_destroy(p), 0);
}

Test(lifecycle, shutdown_is_idempotent_and_submit_after_is_rejected) {
  tko_pool *p;
  tko_options o = tko_basic_options(2);
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  atomic_long n = 0;
  for (int i = 0; i < 50; i++) cr_assert_eq(tko_submit(p, count_fn, &n, 0), 0);
  cr_assert_eq(tko_pool_shutdown(p, TKO_DRAIN), 0);
  cr_assert_eq(atomic_load(&n), 50);
  cr_assert_eq(tko_pool_shutdown(p, TKO_DRAIN), 0);
  cr_assert_eq(tko_pool_shutdown(p, TKO_CANCEL), 0);
  cr_assert_eq(tko_submit(p, count_fn, &n, 0), -ESHUTDOWN);
  cr_assert_eq(tko_submit(p, count_fn, &n, 100), -ESHUTDOWN);
  cr_assert_eq(tko_pool_wait_idle(p, 0), 0, "a shut-down pool is idle");
  tko_stats st;
  tko_pool_stats(p, &st);
  cr_assert_eq(st.submitted, 50, "rejected submits are not counted");
  cr_assert_eq(st.completed, 50);
  cr_assert_eq(st.cancelled, 0);
  cr_assert_eq(st.basic_workers, 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
  cr_assert_eq(atomic_load(&n), 50, "a rejected task never runs");
}

Test(lifecycle, concurrent_shutdowns_all_return_after_the_first_finishes) {
  tko_pool *p;
  tko_options o = tko_basic_options(1);
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  gate_task g;
  gate_task_init(&g);
  cr_assert_eq(tko_submit(p, gate_fn, &g, 0), 0);
  cr_assert(tt_count_wait_geq(&g.started, 1));
  atomic_long n = 0;
  for (int i = 0; i < 20; i++) cr_assert_eq(tko_submit(p, count_fn, &n, 0), 0);
  shutter s[3] = {{p, TKO_DRAIN, -1}, {p, TKO_CANCEL, -1}, {p, TKO_DRAIN, -1}};
  pthread_t th[3];
  for (int i = 0; i < 3; i++) cr_assert_eq(pthread_create(&th[i], NULL, shutdown_thread, &s[i]), 0);
  tt_gate_open(&g.gate);
  for (int i = 0; i < 3; i++) {
    pthread_join(th[i], NULL);
    cr_assert_eq(s[i].rc, 0);
  }
  /* Whichever mode won, every task was run or cancelled, exactly once. */
  tko_stats st;
  tko_pool_stats(p, &st);
  cr_assert_eq(st.submitted, 21);
  cr_assert_eq(st.completed + st.cancelled, 21);
  cr_assert_eq((uint64_t)atomic_load(&n) + st.cancelled, 20);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* ---- -EDEADLK from the pool's own threads -------------------------------- */

typedef struct self_calls {
  tko_pool *p;
  atomic_int wait_rc, wait0_rc, drain_rc, cancel_rc, destroy_rc;
  atomic_int cancel_hook_rc[3]; /* wait_idle, shutdown, destroy from on_cancel */
  atomic_int start_hook_rc[2];  /* wait_idle, shutdown from thread_start */
  atomic_int start_hook_calls;
  atomic_long ran;
} self_calls;

static int self_call_fn(void *arg) {
  self_calls *c = arg;
  atomic_store(&c->wait_rc, tko_pool_wait_idle(c->p, -1));
  atomic_store(&c->wait0_rc, tko_pool_wait_idle(c->p, 0));
  atomic_store(&c->drain_rc, tko_pool_shutdown(c->p, TKO_DRAIN));
  atomic_store(&c->cancel_rc, tko_pool_shutdown(c->p, TKO_CANCEL));
  atomic_store(&c->destroy_rc, tko_pool_destroy(c->p));
  return 0;
}

static int self_count_fn(void *arg) {
  atomic_fetch_add(&((self_calls *)arg)->ran, 1);
  return 0;
}

static void self_cancel_hook(void *user, const tko_task_info *t) {
  self_calls *c = user;
  (void)t;
  atomic_store(&c->cancel_hook_rc[0], tko_pool_wait_idle(c->p, -1));
  atomic_store(&c->cancel_hook_rc[1], tko_pool_shutdown(c->p, TKO_DRAIN));
  atomic_store(&c->cancel_hook_rc[2], tko_pool_destroy(c->p));
}

static void self_start_hook(void *user, unsigned index, tko_worker_kind kind) {
  self_calls *c = user;
  (void)index;
  (void)kind;
  /* The pool pointer is published before the workers start only through
   * this struct, which the creating thread filled in after create: the
   * first worker may run before that, so it checks. */
  tko_pool *p = __atomic_load_n(&c->p, __ATOMIC_ACQUIRE);
  if (!p) return;
  atomic_store(&c->start_hook_rc[0], tko_pool_wait_idle(p, -1));
  atomic_store(&c->start_hook_rc[1], tko_pool_shutdown(p, TKO_DRAIN));
  atomic_fetch_add(&c->start_hook_calls, 1);
}

Test(lifecycle, wait_shutdown_destroy_from_a_task_return_edeadlk) {
  self_calls c;
  memset(&c, 0, sizeof c);
  tko_options o = tko_basic_options(2);
  cr_assert_eq(tko_pool_create(&c.p, &o), 0);
  cr_assert_eq(tko_submit(c.p, self_call_fn, &c, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(c.p, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&c.wait_rc), -EDEADLK);
  cr_assert_eq(atomic_load(&c.wait0_rc), -EDEADLK);
  cr_assert_eq(atomic_load(&c.drain_rc), -EDEADLK);
  cr_assert_eq(atomic_load(&c.cancel_rc), -EDEADLK);
  cr_assert_eq(atomic_load(&c.destroy_rc), -EDEADLK);
  /* They did nothing: the pool still takes and runs work. */
  cr_assert_eq(tko_submit(c.p, self_count_fn, &c, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(c.p, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&c.ran), 1);
  cr_assert_eq(tko_pool_destroy(c.p), 0);
}

Test(lifecycle, wait_shutdown_destroy_from_hooks_return_edeadlk) {
  self_calls c;
  memset(&c, 0, sizeof c);
  for (int i = 0; i < 3; i++) atomic_store(&c.cancel_hook_rc[i], 1);
  tko_options o = tko_basic_options(1);
  o.hooks.user = &c;
  o.hooks.on_cancel = self_cancel_hook;
  o.hooks.thread_start = self_start_hook;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  __atomic_store_n(&c.p, p, __ATOMIC_RELEASE);
  gate_task g;
  gate_task_init(&g);
  cr_assert_eq(tko_submit(p, gate_fn, &g, 0), 0);
  cr_assert(tt_count_wait_geq(&g.started, 1));
  cr_assert_eq(tko_submit(p, self_count_fn, &c, 0), 0);
  shutter s = {p, TKO_CANCEL, -1};
  pthread_t th;
  atomic_long probe_runs = 0;
  long probes;
  begin_shutdown(&s, &th, &probe_runs, &probes);
  tt_gate_open(&g.gate);
  pthread_join(th, NULL);
  cr_assert_eq(s.rc, 0);
  /* on_cancel runs on the thread that is shutting down. */
  cr_assert_eq(atomic_load(&c.cancel_hook_rc[0]), -EDEADLK);
  cr_assert_eq(atomic_load(&c.cancel_hook_rc[1]), -EDEADLK);
  cr_assert_eq(atomic_load(&c.cancel_hook_rc[2]), -EDEADLK);
  cr_assert_eq(atomic_load(&c.ran), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);

  /* thread_start of an elastic worker, spawned after c.p is published. */
  self_calls c2;
  memset(&c2, 0, sizeof c2);
  o = tko_elastic_options(0, 1, 1000);
  o.hooks.user = &c2;
  o.hooks.thread_start = self_start_hook;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  __atomic_store_n(&c2.p, p, __ATOMIC_RELEASE);
  cr_assert_eq(tko_submit(p, self_count_fn, &c2, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&c2.start_hook_calls), 1);
  cr_assert_eq(atomic_load(&c2.start_hook_rc[0]), -EDEADLK);
  cr_assert_eq(atomic_load(&c2.start_hook_rc[1]), -EDEADLK);
  cr_assert_eq(atomic_load(&c2.ran), 1);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* ---- destroy -------------------------------------------------------------- */

typedef struct thread_watch {
  tt_count starts, stops;
} thread_watch;

static void tw_start(void *user, unsigned index, tko_worker_kind kind) {
  (void)index;
  (void)kind;
  tt_count_add(&((thread_watch *)user)->starts, 1);
}

static void tw_stop(void *user, unsigned index, tko_worker_kind kind) {
  (void)index;
  (void)kind;
  tt_count_add(&((thread_watch *)user)->stops, 1);
}

Test(lifecycle, destroy_drains_and_joins_every_thread) {
  int baseline = tt_thread_count();
  cr_assert_gt(baseline, 0);
  thread_watch tw = {TT_COUNT_INIT, TT_COUNT_INIT};
  tko_options o = tko_elastic_options(3, 3, 60000); /* elastic ones never idle out */
  o.hooks.user = &tw;
  o.hooks.thread_start = tw_start;
  o.hooks.thread_stop = tw_stop;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  /* Block all three basic workers, then one more task at a time so each
   * submit starts an elastic worker. */
  gate_task g;
  gate_task_init(&g);
  for (long k = 1; k <= 6; k++) {
    cr_assert_eq(tko_submit(p, gate_fn, &g, 0), 0);
    cr_assert(tt_count_wait_geq(&g.started, k));
  }
  cr_assert_geq(tt_thread_count(), baseline + 6);
  atomic_long n = 0;
  for (int i = 0; i < 500; i++) cr_assert_eq(tko_submit(p, count_fn, &n, i % 3), 0);
  tt_gate_open(&g.gate);
  cr_assert_eq(tko_pool_destroy(p), 0);
  cr_assert_eq(atomic_load(&n), 500, "destroy drains the queue");
  /* Joined: every thread's last act, thread_stop, has happened. */
  cr_assert_eq(tt_count_get(&tw.stops), tt_count_get(&tw.starts));
  cr_assert_geq(tt_count_get(&tw.starts), 6);
  int now = tt_wait_thread_count_leq(baseline);
  cr_assert_leq(now, baseline, "threads left after destroy: %d, baseline %d", now, baseline);
}

Test(lifecycle, create_destroy_many_times_leaves_no_thread) {
  int baseline = tt_thread_count();
  const int rounds = TT_SCALE(200, 30);
  for (int r = 0; r < rounds; r++) {
    tko_pool *p;
    tko_options o = tko_elastic_options(2, 2, 1);
    cr_assert_eq(tko_pool_create(&p, &o), 0);
    atomic_long n = 0;
    for (int i = 0; i < 20; i++) cr_assert_eq(tko_submit(p, count_fn, &n, 0), 0);
    if (r % 2) cr_assert_eq(tko_pool_shutdown(p, (r % 4 == 1) ? TKO_DRAIN : TKO_CANCEL), 0);
    cr_assert_eq(tko_pool_destroy(p), 0);
    cr_assert_eq(atomic_load(&n) <= 20, 1);
  }
  int now = tt_wait_thread_count_leq(baseline);
  cr_assert_leq(now, baseline);
}

/* ---- cancel racing running tasks ----------------------------------------- */

typedef struct race {
  tko_pool *pool;
  ledger l;
  entry *e;
  long per_thread;
  atomic_uchar *accepted;
  tt_count progress; /* tasks run so far */
} race;

typedef struct race_thread {
  race *r;
  int t;
} race_thread;

static int race_fn(void *arg) {
  entry *e = arg;
  atomic_fetch_add(&e->l->ran[e->idx], 1);
  if (((atomic_fetch_add(&e->l->ran_total, 1) + 1) & 63) == 0) tt_count_add(e->l->progress, 1);
  return 0;
}

static void race_cancel(void *user, const tko_task_info *t) {
  race *r = user;
  entry *e = t->arg;
  if (t->fn != race_fn || e->l != &r->l) {
    atomic_store(&r->l.bad_cancel_info, 1);
    return;
  }
  atomic_fetch_add(&r->l.cancelled[e->idx], 1);
  atomic_fetch_add(&r->l.cancel_total, 1);
}

static void *race_submitter(void *arg) {
  race_thread *rt = arg;
  race *r = rt->r;
  for (long i = 0; i < r->per_thread; i++) {
    long idx = rt->t * r->per_thread + i;
    r->e[idx] = (entry){&r->l, idx};
    int rc = tko_submit(r->pool, race_fn, &r->e[idx], (int)(idx % 5));
    if (rc == 0) atomic_store(&r->accepted[idx], 1);
    else if (rc == -ESHUTDOWN) break;
    else atomic_store(&r->accepted[idx], 2); /* unexpected error */
  }
  return NULL;
}

Test(lifecycle, cancel_racing_running_tasks_is_exactly_once, .timeout = 120) {
  const int rounds = TT_SCALE(20, 4), threads = 4;
  for (int round = 0; round < rounds; round++) {
    race r;
    memset(&r, 0, sizeof r);
    r.per_thread = TT_SCALE(20000, 3000);
    long total = r.per_thread * threads;
    ledger_init(&r.l, total);
    r.e = calloc((size_t)total, sizeof *r.e);
    r.accepted = calloc((size_t)total, 1);
    tt_count_init(&r.progress);
    r.l.progress = &r.progress;
    tko_options o = tko_elastic_options(3, 2, 1);
    o.hooks.user = &r;
    o.hooks.on_cancel = race_cancel;
    cr_assert_eq(tko_pool_create(&r.pool, &o), 0);
    pthread_t th[4];
    race_thread rt[4];
    for (int t = 0; t < threads; t++) {
      rt[t] = (race_thread){&r, t};
      cr_assert_eq(pthread_create(&th[t], NULL, race_submitter, &rt[t]), 0);
    }
    /* Cancel once some tasks have run, while submitters are still going. */
    cr_assert(tt_count_wait_geq(&r.progress, 1 + round % 8));
    cr_assert_eq(tko_pool_shutdown(r.pool, round % 2 ? TKO_CANCEL : TKO_DRAIN), 0);
    long ran_at_return = atomic_load(&r.l.ran_total);
    for (int t = 0; t < threads; t++) pthread_join(th[t], NULL);
    long accepted = 0;
    for (long i = 0; i < total; i++) {
      int a = atomic_load(&r.accepted[i]);
      cr_assert_neq(a, 2, "submit failed with something other than -ESHUTDOWN");
      int ran = atomic_load(&r.l.ran[i]), can = atomic_load(&r.l.cancelled[i]);
      if (a) {
        accepted++;
        cr_assert_eq(ran + can, 1, "round %d task %ld: ran %d, cancelled %d", round, i, ran, can);
      } else {
        cr_assert_eq(ran + can, 0, "a rejected task was run or cancelled");
      }
    }
    cr_assert_eq(atomic_load(&r.l.bad_cancel_info), 0);
    cr_assert_eq(atomic_load(&r.l.ran_total), ran_at_return, "a task ran after shutdown returned");
    tko_stats st;
    tko_pool_stats(r.pool, &st);
    cr_assert_eq(st.submitted, (uint64_t)accepted);
    cr_assert_eq(st.submitted, st.completed + st.cancelled);
    cr_assert_eq(st.completed, (uint64_t)atomic_load(&r.l.ran_total));
    cr_assert_eq(st.cancelled, (uint64_t)atomic_load(&r.l.cancel_total));
    if (round % 2 == 0) cr_assert_eq(st.cancelled, 0, "TKO_DRAIN cancels nothing");
    cr_assert_eq(tko_pool_destroy(r.pool), 0);
    tt_count_fini(&r.progress);
    ledger_fini(&r.l);
    free(r.e);
    free(r.accepted);
  }
}
