/* SPDX-License-Identifier: MIT */
/* Tests for the hooks: before_run/after_run see each task's id, weight,
 * arg, worker and status in order around the task; on_failure gets the
 * non-zero status and plausible times; thread_start/thread_stop run once per
 * thread with its index and kind; hooks may submit; threads are named
 * "<prefix>-b<i>" / "<prefix>-e<i>". */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "taskorch.h"
#include "tko_test.h"
#include "tko_test_sync.h"

typedef struct gate_task {
  tt_gate gate;
  tt_count started;
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
  tt_gate_wait(&g->gate);
  return 0;
}

/* ---- before_run / after_run / on_failure --------------------------------- */

#define NTASKS 64

/* Per task: the phase it is in (0 queued, 1 before_run seen, 2 ran, 3
 * after_run seen) and what the hooks were told. */
typedef struct seen {
  atomic_int phase;
  atomic_int order_bad;
  uint64_t id_before, id_after;
  int weight_before, weight_after, status_after;
  int failure_calls, failure_status;
  uint64_t fail_run_ns, fail_wait_ns;
  unsigned worker;
  tko_worker_kind kind;
} seen;

typedef struct run_ctx {
  seen s[NTASKS];
  atomic_int stray; /* a hook was called with an arg it did not know */
} run_ctx;

static run_ctx *ctx_of_arg; /* tasks find their context here (one test at a time) */

static seen *seen_of(run_ctx *c, void *arg) {
  seen *s = arg;
  if (s < c->s || s >= c->s + NTASKS) {
    atomic_store(&c->stray, 1);
    return NULL;
  }
  return s;
}

/* Task i returns a status chosen so that some succeed and some fail with
 * assorted values, including negative ones. */
static int status_for(long i) { return i % 4 == 1 ? (int)i : i % 4 == 3 ? -(int)i : 0; }

static int hooked_fn(void *arg) {
  seen *s = arg;
  long i = s - ctx_of_arg->s;
  int expect = 1;
  if (!atomic_compare_exchange_strong(&s->phase, &expect, 2)) atomic_store(&s->order_bad, 1);
  if (i == 5 || i == 7) tt_spin_ns(100000); /* failing tasks that run ~100 us */
  return status_for(i);
}

static void h_before(void *user, const tko_task_info *t) {
  seen *s = seen_of(user, t->arg);
  if (!s) return;
  int expect = 0;
  if (!atomic_compare_exchange_strong(&s->phase, &expect, 1)) atomic_store(&s->order_bad, 1);
  s->id_before = t->id;
  s->weight_before = t->weight;
  s->worker = t->worker;
  s->kind = t->kind;
  if (t->fn != hooked_fn) atomic_store(&s->order_bad, 1);
}

static void h_after(void *user, const tko_task_info *t) {
  seen *s = seen_of(user, t->arg);
  if (!s) return;
  int expect = 2;
  if (!atomic_compare_exchange_strong(&s->phase, &expect, 3)) atomic_store(&s->order_bad, 1);
  s->id_after = t->id;
  s->weight_after = t->weight;
  s->status_after = t->status;
}

static void h_failure(void *user, const tko_task_info *t) {
  seen *s = seen_of(user, t->arg);
  if (!s) return;
  /* on_failure comes after after_run. */
  if (atomic_load(&s->phase) != 3) atomic_store(&s->order_bad, 1);
  s->failure_calls++;
  s->failure_status = t->status;
  s->fail_run_ns = t->run_ns;
  s->fail_wait_ns = t->wait_ns;
}

Test(hooks, before_after_failure_see_the_task) {
  run_ctx *c = calloc(1, sizeof *c);
  cr_assert_not_null(c);
  ctx_of_arg = c;
  tko_options o = tko_basic_options(2);
  o.hooks.user = c;
  o.hooks.before_run = h_before;
  o.hooks.after_run = h_after;
  o.hooks.on_failure = h_failure;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  /* Submit from one thread, so ids increase in submit order. */
  for (long i = 0; i < NTASKS; i++) cr_assert_eq(tko_submit(p, hooked_fn, &c->s[i], (int)(i * 37 % 11) - 5), 0);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  long failures = 0;
  for (long i = 0; i < NTASKS; i++) {
    seen *s = &c->s[i];
    int w = (int)(i * 37 % 11) - 5, st = status_for(i);
    cr_assert_eq(atomic_load(&s->order_bad), 0, "task %ld: hooks out of order", i);
    cr_assert_eq(atomic_load(&s->phase), 3);
    cr_assert_eq(s->id_after, s->id_before);
    if (i) cr_assert_gt(s->id_before, c->s[i - 1].id_before, "one thread's ids increase");
    else cr_assert_gt(s->id_before, 0);
    cr_assert_eq(s->weight_before, w);
    cr_assert_eq(s->weight_after, w);
    cr_assert_eq(s->status_after, st, "after_run sees every status");
    cr_assert_lt(s->worker, 2);
    cr_assert_eq(s->kind, TKO_WORKER_BASIC);
    if (st) {
      failures++;
      cr_assert_eq(s->failure_calls, 1, "task %ld", i);
      cr_assert_eq(s->failure_status, st);
      cr_assert_neq(s->failure_status, 0);
    } else {
      cr_assert_eq(s->failure_calls, 0, "a succeeding task reached on_failure");
    }
  }
  /* The two ~100 us failing tasks: their run time was measured. */
  cr_assert_gt(c->s[5].fail_run_ns, 0);
  cr_assert_gt(c->s[7].fail_run_ns, 0);
  cr_assert_eq(atomic_load(&c->stray), 0);
  tko_stats st;
  tko_pool_stats(p, &st);
  cr_assert_eq(st.failed, (uint64_t)failures);
  cr_assert_eq(st.completed, NTASKS);
  cr_assert_eq(tko_pool_destroy(p), 0);
  free(c);
}

typedef struct timing {
  uint64_t wait_ns, run_ns;
  int status;
  int calls;
} timing;

static void t_failure(void *user, const tko_task_info *t) {
  timing *tm = user;
  tm->wait_ns = t->wait_ns;
  tm->run_ns = t->run_ns;
  tm->status = t->status;
  tm->calls++;
}

static int spin_fail_fn(void *arg) {
  (void)arg;
  tt_spin_ns(100000);
  return 7;
}

Test(hooks, on_failure_times_are_plausible) {
  timing tm = {0};
  tko_options o = tko_basic_options(1);
  o.hooks.user = &tm;
  o.hooks.on_failure = t_failure;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  /* Queue the failing task behind a gate, so it surely waits a while. */
  gate_task g;
  gate_task_init(&g);
  cr_assert_eq(tko_submit(p, gate_fn, &g, 0), 0);
  cr_assert(tt_count_wait_geq(&g.started, 1));
  cr_assert_eq(tko_submit(p, spin_fail_fn, NULL, 0), 0);
  tt_gate_open(&g.gate);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  cr_assert_eq(tm.calls, 1);
  cr_assert_eq(tm.status, 7);
  /* Both clocks are monotonic and the task spun 100 us between its start
   * and its return; it was queued before the gate opened and could start
   * only after, so its wait is not zero either. */
  cr_assert_gt(tm.run_ns, 0);
  cr_assert_geq(tm.run_ns, 100000);
  cr_assert_gt(tm.wait_ns, 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* ---- thread_start / thread_stop ------------------------------------------ */

typedef struct thread_log {
  pthread_mutex_t mu; /* protects everything below */
  int basic_start[8], basic_stop[8], elastic_start[8], elastic_stop[8];
  int bad;
  pthread_t threads[64]; /* threads that ran thread_start */
  int nthreads;
  tt_count started;
} thread_log;

static void log_start(void *user, unsigned index, tko_worker_kind kind) {
  thread_log *l = user;
  pthread_mutex_lock(&l->mu);
  if (index >= 8) l->bad = 1;
  else if (kind == TKO_WORKER_BASIC) l->basic_start[index]++;
  else if (kind == TKO_WORKER_ELASTIC) l->elastic_start[index]++;
  else l->bad = 1;
  if (l->nthreads < 64) l->threads[l->nthreads++] = pthread_self();
  pthread_mutex_unlock(&l->mu);
  tt_count_add(&l->started, 1);
}

static void log_stop(void *user, unsigned index, tko_worker_kind kind) {
  thread_log *l = user;
  pthread_mutex_lock(&l->mu);
  if (index >= 8) l->bad = 1;
  else if (kind == TKO_WORKER_BASIC) l->basic_stop[index]++;
  else l->elastic_stop[index]++;
  /* The thread that stops is one that started. */
  int known = 0;
  for (int i = 0; i < l->nthreads; i++) known |= pthread_equal(l->threads[i], pthread_self());
  if (!known) l->bad = 1;
  pthread_mutex_unlock(&l->mu);
}

typedef struct where {
  thread_log *log;
  atomic_int unknown_thread;
} where;

static int where_fn(void *arg) {
  where *w = arg;
  thread_log *l = w->log;
  /* thread_start is the first thing a worker does, so the thread that runs
   * a task has been logged. */
  pthread_mutex_lock(&l->mu);
  int known = 0;
  for (int i = 0; i < l->nthreads; i++) known |= pthread_equal(l->threads[i], pthread_self());
  pthread_mutex_unlock(&l->mu);
  if (!known) atomic_store(&w->unknown_thread, 1);
  return 0;
}

Test(hooks, thread_start_and_stop_once_per_thread) {
  thread_log *l = calloc(1, sizeof *l);
  pthread_mutex_init(&l->mu, NULL);
  tt_count_init(&l->started);
  tko_options o = tko_elastic_options(3, 2, 60000);
  o.hooks.user = l;
  o.hooks.thread_start = log_start;
  o.hooks.thread_stop = log_stop;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  cr_assert(tt_count_wait_geq(&l->started, 3), "each basic worker calls thread_start");
  /* Pin the basic workers, then add blocked tasks one at a time so that
   * each starts an elastic worker. */
  gate_task g;
  gate_task_init(&g);
  for (long k = 1; k <= 5; k++) {
    cr_assert_eq(tko_submit(p, gate_fn, &g, 0), 0);
    cr_assert(tt_count_wait_geq(&g.started, k));
  }
  where w = {l, 0};
  for (int i = 0; i < 50; i++) cr_assert_eq(tko_submit(p, where_fn, &w, 0), 0);
  tt_gate_open(&g.gate);
  cr_assert_eq(tko_pool_destroy(p), 0);
  cr_assert_eq(atomic_load(&w.unknown_thread), 0);
  cr_assert_eq(l->bad, 0);
  for (int i = 0; i < 3; i++) {
    cr_assert_eq(l->basic_start[i], 1, "basic %d", i);
    cr_assert_eq(l->basic_stop[i], 1, "basic %d", i);
  }
  for (int i = 3; i < 8; i++) cr_assert_eq(l->basic_start[i], 0);
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(l->elastic_start[i], 1, "elastic %d", i);
    cr_assert_eq(l->elastic_stop[i], 1, "elastic %d", i);
  }
  for (int i = 2; i < 8; i++) cr_assert_eq(l->elastic_start[i], 0);
  cr_assert_eq(l->nthreads, 5);
  for (int i = 0; i < l->nthreads; i++)
    for (int j = i + 1; j < l->nthreads; j++) cr_assert_not(pthread_equal(l->threads[i], l->threads[j]));
  free(l);
}

/* ---- hooks may submit ------------------------------------------------------ */

typedef struct resubmit {
  tko_pool *_Atomic pool;
  atomic_long follow_ups;  /* tasks submitted by hooks that ran */
  atomic_long start_submits;                 /* of those, submitted by thread_start */
  atomic_long basic_started, elastic_started; /* thread_start hooks that returned */
  atomic_int submit_bad;   /* a hook's submit failed unexpectedly */
  atomic_int cancel_submit_rc;
  atomic_int stop_submit_rc;
} resubmit;

static int follow_up_fn(void *arg) {
  atomic_fetch_add(&((resubmit *)arg)->follow_ups, 1);
  return 0;
}

static int plain_fn(void *arg) {
  (void)arg;
  return 0;
}

static int failing_fn(void *arg) {
  (void)arg;
  return 1;
}

/* True if it submitted (the pool was published and took the task). */
static bool r_submit(resubmit *r) {
  tko_pool *p = atomic_load(&r->pool);
  if (!p) return false;
  if (tko_submit(p, follow_up_fn, r, 0) == 0) return true;
  atomic_store(&r->submit_bad, 1);
  return false;
}

/* Only the plain/failing tasks spawn follow-ups, so the chain ends. */
static void r_before(void *user, const tko_task_info *t) {
  if (t->fn == plain_fn) r_submit(user);
}

static void r_after(void *user, const tko_task_info *t) {
  if (t->fn == plain_fn) r_submit(user);
}

static void r_failure(void *user, const tko_task_info *t) {
  if (t->fn == failing_fn) r_submit(user);
}

static void r_start(void *user, unsigned index, tko_worker_kind kind) {
  resubmit *r = user;
  (void)index;
  if (r_submit(r)) atomic_fetch_add(&r->start_submits, 1);
  atomic_fetch_add(kind == TKO_WORKER_BASIC ? &r->basic_started : &r->elastic_started, 1);
}

static void r_cancel(void *user, const tko_task_info *t) {
  resubmit *r = user;
  (void)t;
  /* Shutdown has begun: the hook's submit must be refused, not deadlock. */
  atomic_store(&r->cancel_submit_rc, tko_submit(atomic_load(&r->pool), follow_up_fn, r, 0));
}

static void r_stop(void *user, unsigned index, tko_worker_kind kind) {
  resubmit *r = user;
  (void)index;
  (void)kind;
  atomic_store(&r->stop_submit_rc, tko_submit(atomic_load(&r->pool), follow_up_fn, r, 0));
}

Test(hooks, hooks_may_submit) {
  resubmit r;
  memset(&r, 0, sizeof r);
  tko_options o = tko_elastic_options(2, 1, 60000);
  o.hooks.user = &r;
  o.hooks.before_run = r_before;
  o.hooks.after_run = r_after;
  o.hooks.on_failure = r_failure;
  o.hooks.thread_start = r_start;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  atomic_store(&r.pool, p);
  for (int i = 0; i < 100; i++) cr_assert_eq(tko_submit(p, plain_fn, NULL, 0), 0);
  for (int i = 0; i < 50; i++) cr_assert_eq(tko_submit(p, failing_fn, NULL, 0), 0);
  /* 2 per plain task, 1 per failing task, plus one per thread_start that saw
   * the pool pointer (basic workers may start before it is published).
   * wait_idle waits for tasks, not threads: a worker can still be on its
   * way to its thread_start (a basic one the others left behind, an elastic
   * one a hook's submit spawned), and its follow-up comes after. So read
   * until every thread the pool counts has started, and two snapshots
   * around the hooks' counts agree; a lost follow-up never settles. */
  long expected = 100 * 2 + 50;
  uint64_t end = tt_now_ns() + (uint64_t)TT_LONG_MS * 1000000u;
  tko_stats st, again;
  long starts, follow_ups;
  for (;;) {
    cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
    tko_pool_stats(p, &st);
    starts = atomic_load(&r.start_submits);
    follow_ups = atomic_load(&r.follow_ups);
    bool started = atomic_load(&r.basic_started) == 2 &&
                   atomic_load(&r.elastic_started) == (long)st.elastic_workers;
    tko_pool_stats(p, &again);
    if (started && again.submitted == st.submitted && again.completed == st.submitted &&
        again.elastic_workers == st.elastic_workers && follow_ups == expected + starts &&
        (long)st.submitted == 150 + follow_ups)
      break;
    cr_assert_lt(tt_now_ns(), end, "never settled: %ld follow-ups, %ld from thread starts, %lu submitted",
                 follow_ups, starts, (unsigned long)again.submitted);
    sched_yield();
  }
  cr_assert_eq(atomic_load(&r.submit_bad), 0);
  cr_assert_leq(starts, 2 + (long)again.elastic_spawned);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

Test(hooks, on_cancel_and_thread_stop_submits_are_refused_during_shutdown) {
  resubmit r;
  memset(&r, 0, sizeof r);
  atomic_store(&r.cancel_submit_rc, 1);
  atomic_store(&r.stop_submit_rc, 1);
  tko_options o = tko_basic_options(1);
  o.hooks.user = &r;
  o.hooks.on_cancel = r_cancel;
  o.hooks.thread_stop = r_stop;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  atomic_store(&r.pool, p);
  gate_task g;
  gate_task_init(&g);
  cr_assert_eq(tko_submit(p, gate_fn, &g, 0), 0);
  cr_assert(tt_count_wait_geq(&g.started, 1));
  for (int i = 0; i < 10; i++) cr_assert_eq(tko_submit(p, plain_fn, NULL, 0), 0);
  /* Open the gate first: shutdown waits for the worker, and the queued
   * tasks may be run or cancelled; at least the ones still queued when
   * shutdown begins reach on_cancel. */
  tt_gate_open(&g.gate);
  cr_assert_eq(tko_pool_shutdown(p, TKO_CANCEL), 0);
  tko_stats st;
  tko_pool_stats(p, &st);
  cr_assert_eq(st.completed + st.cancelled, 11);
  if (st.cancelled) cr_assert_eq(atomic_load(&r.cancel_submit_rc), -ESHUTDOWN);
  cr_assert_eq(atomic_load(&r.stop_submit_rc), -ESHUTDOWN);
  cr_assert_eq(atomic_load(&r.follow_ups), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* ---- thread names ---------------------------------------------------------- */

static _Thread_local unsigned tl_worker;
static _Thread_local tko_worker_kind tl_kind;
static _Thread_local int tl_known;

typedef struct names {
  const char *prefix; /* the expected prefix */
  atomic_int bad, checked;
  char last_bad[32];
  pthread_mutex_t mu; /* protects last_bad */
} names;

static void n_before(void *user, const tko_task_info *t) {
  (void)user;
  tl_worker = t->worker;
  tl_kind = t->kind;
  tl_known = 1;
}

static void check_name(names *n, unsigned index, tko_worker_kind kind) {
  char got[32] = {0}, want[32];
  pthread_getname_np(pthread_self(), got, sizeof got);
  snprintf(want, sizeof want, "%s-%c%u", n->prefix, kind == TKO_WORKER_BASIC ? 'b' : 'e', index);
  if (strcmp(got, want) != 0) {
    atomic_store(&n->bad, 1);
    pthread_mutex_lock(&n->mu);
    snprintf(n->last_bad, sizeof n->last_bad, "%s", got);
    pthread_mutex_unlock(&n->mu);
  }
  atomic_fetch_add(&n->checked, 1);
}

static void n_start(void *user, unsigned index, tko_worker_kind kind) { check_name(user, index, kind); }

static int name_fn(void *arg) {
  names *n = arg;
  if (!tl_known) atomic_store(&n->bad, 1);
  else check_name(n, tl_worker, tl_kind);
  return 0;
}

static void check_pool_names(const char *opt_name, const char *expect_prefix) {
  names n;
  memset(&n, 0, sizeof n);
  pthread_mutex_init(&n.mu, NULL);
  n.prefix = expect_prefix;
  tko_options o = tko_elastic_options(2, 2, 60000);
  o.name = opt_name;
  o.hooks.user = &n;
  o.hooks.before_run = n_before;
  o.hooks.thread_start = n_start;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  /* Pin both basic workers, then start both elastic ones, each running a
   * name check once the gate opens. */
  gate_task g;
  gate_task_init(&g);
  for (long k = 1; k <= 4; k++) {
    cr_assert_eq(tko_submit(p, gate_fn, &g, 0), 0);
    cr_assert(tt_count_wait_geq(&g.started, k));
  }
  for (int i = 0; i < 40; i++) cr_assert_eq(tko_submit(p, name_fn, &n, 0), 0);
  tt_gate_open(&g.gate);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
  cr_assert_eq(atomic_load(&n.bad), 0, "prefix %s: got thread name \"%s\"", expect_prefix, n.last_bad);
  cr_assert_eq(atomic_load(&n.checked), 4 + 40);
}

Test(hooks, thread_names_follow_the_prefix) {
  check_pool_names("tkt", "tkt");
  check_pool_names(NULL, "tko"); /* the default prefix */
  check_pool_names("nine-char", "nine-char");
}

/* taskorch.h: longer prefixes are cut to 9 characters, so that
 * "<name>-e1023" fits Linux's 15-character thread names. */
Test(hooks, long_prefix_is_cut_to_nine) { check_pool_names("ten-chars!", "ten-chars"); }
