/* SPDX-License-Identifier: MIT */
/* Tests for tko_lanes_submit_wait, flat combining on keyed lanes: an idle
 * lane runs on the caller (counted as a caller run) and runs what others
 * appended meanwhile, at most max_drain tasks, batch mode included; a busy
 * lane makes the caller wait for another thread to run its task (also when
 * a task ahead of it ends its worker thread); order and
 * exclusion with submit and submit_wait mixed from several threads; a
 * cancel while waiting (-ECANCELED, on_cancel sees the user's fn and arg
 * once); a pool shutdown racing submit_wait (nothing lost, no hang), and
 * one that waits for a lane run on its caller;
 * -EDEADLK from the lanes' own task or batch, -EBUSY from a pool task on a
 * busy lane, -EINVAL and -ESHUTDOWN. Tasks never assert themselves: they
 * record, and the test thread checks. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <taskorch.h>
#include <taskorch/lanes.h>

#include "tko_test.h"
#include "tko_test_sync.h"

static tko_pool *make_pool(unsigned workers) {
  tko_pool *p = NULL;
  tko_options o = tko_basic_options(workers);
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  return p;
}

static void finish(tko_lanes *l, tko_pool *p) {
  cr_assert_eq(tko_lanes_destroy(l), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* Polls the table's submitted count (a bounded spin, no sleep): true once it
 * reached want. */
static bool wait_submitted(tko_lanes *l, uint64_t want) {
  uint64_t end = tt_now_ns() + (uint64_t)TT_LONG_MS * 1000000u;
  for (;;) {
    tko_lane_stats s;
    tko_lanes_stats(l, &s);
    if (s.submitted >= want) return true;
    if (tt_now_ns() > end) return false;
    sched_yield();
  }
}

/* ---- an idle lane runs on the caller ---------------------------------- */

typedef struct where {
  pthread_t thread;
  atomic_int runs;
} where;

static int where_fn(void *arg) {
  where *w = arg;
  w->thread = pthread_self();
  atomic_fetch_add(&w->runs, 1);
  return 0;
}

Test(lanes_wait, an_idle_lane_runs_on_the_caller_as_a_caller_run) {
  tko_pool *p = make_pool(2);
  tko_lanes *l = NULL;
  cr_assert_eq(tko_lanes_create(&l, p, NULL), 0);
  tko_stats before, after;
  tko_pool_stats(p, &before);
  where w = {.runs = 0};
  cr_assert_eq(tko_lanes_submit_wait(l, 7, where_fn, &w, 0), 0);
  cr_assert_eq(atomic_load(&w.runs), 1, "the task ran before the call returned");
  cr_assert(pthread_equal(w.thread, pthread_self()), "an idle lane runs on the caller");
  tko_pool_stats(p, &after);
  cr_assert_eq(after.caller_runs, before.caller_runs + 1);
  tko_lane_stats s;
  tko_lanes_stats(l, &s);
  cr_assert_eq(s.submitted, 1);
  cr_assert_eq(s.completed, 1);
  cr_assert_eq(s.visits, 1);
  cr_assert_eq(s.queued, 0);
  finish(l, p);
}

/* ---- the caller runs what others appended, at most max_drain ---------- */

enum { DRAIN = 4, APPENDED = 10 };

typedef struct combine {
  tko_lanes *l;
  pthread_t caller;
  atomic_int on_caller, ran, next, disorder;
  int rc[APPENDED];
  int seq[APPENDED + 1];
} combine;

static combine *cmb; /* one scene at a time */

static int appended_fn(void *arg) {
  int i = *(int *)arg;
  if (atomic_fetch_add(&cmb->next, 1) != i) atomic_fetch_add(&cmb->disorder, 1);
  if (pthread_equal(pthread_self(), cmb->caller)) atomic_fetch_add(&cmb->on_caller, 1);
  atomic_fetch_add(&cmb->ran, 1);
  return 0;
}

/* The caller's own task: appends APPENDED tasks to its own lane. */
static int own_fn(void *arg) {
  (void)arg;
  appended_fn(&cmb->seq[0]);
  for (int i = 1; i <= APPENDED; i++) cmb->rc[i - 1] = tko_lanes_submit(cmb->l, 3, appended_fn, &cmb->seq[i], 0);
  return 0;
}

Test(lanes_wait, the_caller_runs_others_appends_up_to_max_drain_tasks) {
  tko_pool *p = make_pool(2);
  tko_lane_options o = tko_lane_default_options();
  o.max_drain = DRAIN;
  static combine c;
  memset(&c, 0, sizeof c);
  cmb = &c;
  cr_assert_eq(tko_lanes_create(&c.l, p, &o), 0);
  for (int i = 0; i <= APPENDED; i++) c.seq[i] = i;
  c.caller = pthread_self();
  cr_assert_eq(tko_lanes_submit_wait(c.l, 3, own_fn, NULL, 0), 0);
  for (int i = 0; i < APPENDED; i++) cr_assert_eq(c.rc[i], 0);
  cr_assert_eq(atomic_load(&c.on_caller), DRAIN, "the caller ran its own task and %d appended",
               DRAIN - 1);
  cr_assert_eq(tko_lanes_wait_idle(c.l, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&c.ran), APPENDED + 1);
  cr_assert_eq(atomic_load(&c.on_caller), DRAIN, "the rest ran on the pool");
  cr_assert_eq(atomic_load(&c.disorder), 0);
  finish(c.l, p);
}

/* Batch mode: the caller hands its own task, then one batch of what was
 * appended meanwhile (max_drain - 1 of it), to the batch callback. */
typedef struct batches {
  tko_lanes *l;
  pthread_t caller;
  atomic_int calls, on_caller_tasks, tasks, appends_failed;
  size_t first_count, second_count;
  int one;
} batches;

static batches *bt;

static void batch_fn(void *user, const tko_lane_batch *b) {
  (void)user;
  int call = atomic_fetch_add(&bt->calls, 1);
  if (call == 0) {
    bt->first_count = b->count;
    for (int i = 0; i < APPENDED; i++)
      if (tko_lanes_submit(bt->l, 5, NULL, &bt->one, 0)) atomic_fetch_add(&bt->appends_failed, 1);
  } else if (call == 1) {
    bt->second_count = b->count;
  }
  if (pthread_equal(pthread_self(), bt->caller))
    atomic_fetch_add(&bt->on_caller_tasks, (int)b->count);
  atomic_fetch_add(&bt->tasks, (int)b->count);
}

Test(lanes_wait, batch_mode_the_caller_hands_its_task_then_one_batch_of_appends) {
  tko_pool *p = make_pool(2);
  static batches b;
  memset(&b, 0, sizeof b);
  bt = &b;
  tko_lane_options o = tko_lane_default_options();
  o.max_drain = DRAIN;
  o.batch = batch_fn;
  cr_assert_eq(tko_lanes_create(&b.l, p, &o), 0);
  b.caller = pthread_self();
  cr_assert_eq(tko_lanes_submit_wait(b.l, 5, NULL, &b.one, 0), 0);
  cr_assert_eq(b.first_count, 1);
  cr_assert_eq(b.second_count, DRAIN - 1);
  cr_assert_eq(atomic_load(&b.on_caller_tasks), DRAIN);
  cr_assert_eq(tko_lanes_wait_idle(b.l, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&b.appends_failed), 0);
  cr_assert_eq(atomic_load(&b.tasks), APPENDED + 1);
  cr_assert_eq(atomic_load(&b.on_caller_tasks), DRAIN);
  finish(b.l, p);
}

/* ---- a busy lane: the caller waits for another thread to run it -------- */

typedef struct waiter_arg {
  tko_lanes *l;
  uint64_t key;
  where w;
  int rc;
  int runs_at_return;
} waiter_arg;

static void *waiter_main(void *arg) {
  waiter_arg *a = arg;
  a->rc = tko_lanes_submit_wait(a->l, a->key, where_fn, &a->w, 0);
  a->runs_at_return = atomic_load(&a->w.runs);
  return NULL;
}

static int gate_fn(void *arg) { return tt_gate_wait(arg) ? 0 : 1; }

Test(lanes_wait, a_busy_lane_makes_the_caller_wait_for_its_runner) {
  tko_pool *p = make_pool(1);
  tko_lanes *l = NULL;
  cr_assert_eq(tko_lanes_create(&l, p, NULL), 0);
  tt_gate gate = TT_GATE_INIT;
  cr_assert_eq(tko_lanes_submit(l, 9, gate_fn, &gate, 0), 0); /* holds the lane */
  waiter_arg a = {.l = l, .key = 9, .w = {.runs = 0}, .rc = 1};
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, waiter_main, &a), 0);
  cr_assert(wait_submitted(l, 2), "the waiter's task was accepted");
  cr_assert_eq(atomic_load(&a.w.runs), 0, "queued behind the held lane");
  tt_gate_open(&gate);
  pthread_join(t, NULL);
  cr_assert_eq(a.rc, 0);
  cr_assert_eq(a.runs_at_return, 1, "the call returned after its task ran");
  cr_assert(!pthread_equal(a.w.thread, t), "the lane's runner ran it, not the waiter");
  finish(l, p);
}

/* While the caller runs its own task the table is not idle, the lane is
 * busy (a second submit_wait on it waits instead of running it too), and
 * once the call returned, destroy finds the caller's runner back. */
typedef struct held_own {
  tko_lanes *l;
  tt_pin pin;
  int rc;
} held_own;

static void *own_held_main(void *arg) {
  held_own *h = arg;
  h->rc = tko_lanes_submit_wait(h->l, 4, tt_pin_fn, &h->pin, 0);
  return NULL;
}

Test(lanes_wait, the_callers_own_task_is_pending_and_holds_its_lane_while_it_runs) {
  tko_pool *p = make_pool(2);
  held_own h = {.pin = TT_PIN_INIT, .rc = 1};
  cr_assert_eq(tko_lanes_create(&h.l, p, NULL), 0);
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, own_held_main, &h), 0);
  cr_assert(tt_count_wait_geq(&h.pin.started, 1), "the caller runs its task");
  cr_assert_eq(tko_lanes_wait_idle(h.l, 0), -ETIMEDOUT, "a task runs: the table is not idle");
  tko_lane_stats s;
  tko_lanes_stats(h.l, &s);
  cr_assert_eq(s.submitted, 1);
  cr_assert_eq(s.completed, 0);
  cr_assert_eq(s.lanes_used, 1);
  waiter_arg a = {.l = h.l, .key = 4, .w = {.runs = 0}, .rc = 1};
  pthread_t t2;
  cr_assert_eq(pthread_create(&t2, NULL, waiter_main, &a), 0);
  cr_assert(wait_submitted(h.l, 2), "the second task was accepted");
  cr_assert_eq(atomic_load(&a.w.runs), 0, "queued behind the caller's task");
  tt_gate_open(&h.pin.gate);
  pthread_join(t, NULL);
  pthread_join(t2, NULL);
  cr_assert_eq(h.rc, 0);
  cr_assert_eq(a.rc, 0);
  cr_assert_eq(a.runs_at_return, 1, "the second call returned after its task ran");
  cr_assert_eq(tko_lanes_wait_idle(h.l, TT_LONG_MS), 0);
  tko_lanes_stats(h.l, &s);
  cr_assert_eq(s.completed, 2);
  finish(h.l, p); /* hangs if a runner count was never given back */
}

/* A task that ends its worker thread (taskorch.h: supported on a worker)
 * ahead of a waiter's task in one visit: the waiter's task goes back to
 * the lane, runs on the next runner, and only then does the call return. */
static int exit_fn(void *arg) {
  (void)arg;
  pthread_exit(NULL);
}

Test(lanes_wait, a_task_that_ends_its_worker_ahead_of_a_waiters_task_leaves_it_to_run) {
  tko_pool *p = make_pool(1);
  tko_lanes *l = NULL;
  cr_assert_eq(tko_lanes_create(&l, p, NULL), 0);
  tt_gate gate = TT_GATE_INIT;
  cr_assert_eq(tko_lanes_submit(l, 9, gate_fn, &gate, 0), 0); /* a visit of its own */
  cr_assert_eq(tko_lanes_submit(l, 9, exit_fn, NULL, 0), 0);
  waiter_arg a = {.l = l, .key = 9, .w = {.runs = 0}, .rc = 1};
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, waiter_main, &a), 0);
  cr_assert(wait_submitted(l, 3), "the waiter's task was accepted");
  tt_gate_open(&gate); /* the next visit takes the exiting task and the waiter's */
  pthread_join(t, NULL);
  cr_assert_eq(a.rc, 0);
  cr_assert_eq(a.runs_at_return, 1, "the call returned after its task ran");
  cr_assert_eq(tko_lanes_wait_idle(l, TT_LONG_MS), 0);
  tko_lane_stats s;
  tko_lanes_stats(l, &s);
  cr_assert_eq(s.completed, 3);
  cr_assert_eq(s.cancelled, 0);
  finish(l, p);
}

/* ---- order and exclusion, submit and submit_wait mixed ---------------- */

enum { MIX_THREADS = 4, MIX_KEYS = 3 };
#define MIX_OPS TT_SCALE(2000, 300)

typedef struct mix_key {
  atomic_int inside, overlaps, count;
  int last[MIX_THREADS]; /* the lane's own (serial): each thread's last seq */
  int disorder;
} mix_key;

typedef struct mix_task {
  mix_key *k;
  int thread, seq;
} mix_task;

static int mix_fn(void *arg) {
  mix_task *m = arg;
  mix_key *k = m->k;
  if (atomic_fetch_add(&k->inside, 1) != 0) atomic_fetch_add(&k->overlaps, 1);
  if (m->seq != k->last[m->thread] + 1) k->disorder++;
  k->last[m->thread] = m->seq;
  atomic_fetch_add(&k->count, 1);
  atomic_fetch_sub(&k->inside, 1);
  return 0;
}

typedef struct mix_thread {
  tko_lanes *l;
  mix_key *keys;
  int thread, failures;
  mix_task *tasks; /* MIX_OPS per key */
} mix_thread;

static void *mix_main(void *arg) {
  mix_thread *m = arg;
  int seq[MIX_KEYS] = {0};
  for (int i = 0; i < MIX_OPS; i++) {
    int k = (i + m->thread) % MIX_KEYS;
    mix_task *t = &m->tasks[k * MIX_OPS + seq[k]];
    *t = (mix_task){&m->keys[k], m->thread, ++seq[k]};
    int rc = (i / 3 + m->thread) % 2 ? tko_lanes_submit_wait(m->l, (uint64_t)k, mix_fn, t, 0)
                                     : tko_lanes_submit(m->l, (uint64_t)k, mix_fn, t, 0);
    if (rc) m->failures++;
  }
  return NULL;
}

Test(lanes_wait, mixed_submit_and_submit_wait_keep_order_and_exclusion) {
  tko_pool *p = make_pool(2);
  tko_lane_options o = tko_lane_default_options();
  o.lanes = 2; /* three keys on two lanes: collisions share a lane's order */
  o.max_drain = 3;
  tko_lanes *l = NULL;
  cr_assert_eq(tko_lanes_create(&l, p, &o), 0);
  static mix_key keys[MIX_KEYS];
  memset(keys, 0, sizeof keys);
  mix_thread th[MIX_THREADS];
  pthread_t t[MIX_THREADS];
  for (int i = 0; i < MIX_THREADS; i++) {
    th[i] = (mix_thread){l, keys, i, 0, calloc((size_t)MIX_KEYS * MIX_OPS, sizeof(mix_task))};
    cr_assert_not_null(th[i].tasks);
    cr_assert_eq(pthread_create(&t[i], NULL, mix_main, &th[i]), 0);
  }
  for (int i = 0; i < MIX_THREADS; i++) pthread_join(t[i], NULL);
  cr_assert_eq(tko_lanes_wait_idle(l, TT_LONG_MS), 0);
  long total = 0;
  for (int k = 0; k < MIX_KEYS; k++) {
    cr_assert_eq(atomic_load(&keys[k].overlaps), 0, "key %d ran two tasks at once", k);
    cr_assert_eq(keys[k].disorder, 0, "key %d ran a thread's tasks out of order", k);
    total += atomic_load(&keys[k].count);
  }
  for (int i = 0; i < MIX_THREADS; i++) cr_assert_eq(th[i].failures, 0);
  cr_assert_eq(total, (long)MIX_THREADS * MIX_OPS);
  tko_lane_stats s;
  tko_lanes_stats(l, &s);
  cr_assert_eq(s.completed, (uint64_t)MIX_THREADS * MIX_OPS);
  finish(l, p);
  for (int i = 0; i < MIX_THREADS; i++) free(th[i].tasks);
}

/* ---- a cancel while waiting ------------------------------------------- */

typedef struct cancels {
  atomic_int seen_user, seen_other, seen_total;
} cancels;

static int never_fn(void *arg) {
  (void)arg;
  return 0;
}

static void count_cancel(void *user, const tko_lane_task *t) {
  cancels *c = user;
  atomic_fetch_add(&c->seen_total, 1);
  if (t->fn == where_fn) atomic_fetch_add(&c->seen_user, 1);
  else atomic_fetch_add(&c->seen_other, 1);
}

Test(lanes_wait, a_cancel_while_waiting_is_ecanceled_after_on_cancel_saw_fn_and_arg) {
  tko_pool *p = make_pool(1);
  tt_pin pin = TT_PIN_INIT;
  cr_assert_eq(tko_submit(p, tt_pin_fn, &pin, 0), 0);
  cr_assert(tt_count_wait_geq(&pin.started, 1)); /* the one worker is held */
  static cancels c;
  memset(&c, 0, sizeof c);
  tko_lane_options o = tko_lane_default_options();
  o.on_cancel = count_cancel;
  o.user = &c;
  tko_lanes *l = NULL;
  cr_assert_eq(tko_lanes_create(&l, p, &o), 0);
  cr_assert_eq(tko_lanes_submit(l, 4, never_fn, NULL, 0), 0); /* its runner stays queued */
  waiter_arg a = {.l = l, .key = 4, .w = {.runs = 0}, .rc = 1};
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, waiter_main, &a), 0);
  cr_assert(wait_submitted(l, 2));
  cr_assert_eq(tko_lanes_cancel(l), 0);
  pthread_join(t, NULL);
  cr_assert_eq(a.rc, -ECANCELED);
  cr_assert_eq(atomic_load(&a.w.runs), 0);
  cr_assert_eq(atomic_load(&c.seen_user), 1, "on_cancel saw the user's fn once");
  cr_assert_eq(atomic_load(&c.seen_other), 1);
  tt_gate_open(&pin.gate);
  finish(l, p);
  tt_count_fini(&pin.started);
}

/* The user's arg reaches on_cancel too (a pool CANCEL shutdown). */
typedef struct arg_seen {
  void *want;
  atomic_int hits, others;
} arg_seen;

static void arg_cancel(void *user, const tko_lane_task *t) {
  arg_seen *s = user;
  if (t->arg == s->want && t->fn == where_fn) atomic_fetch_add(&s->hits, 1);
  else atomic_fetch_add(&s->others, 1);
}

Test(lanes_wait, a_cancel_shutdown_while_waiting_hands_the_users_task_to_on_cancel_once) {
  tko_pool *p = make_pool(1);
  tt_pin pin = TT_PIN_INIT;
  cr_assert_eq(tko_submit(p, tt_pin_fn, &pin, 0), 0);
  cr_assert(tt_count_wait_geq(&pin.started, 1));
  static arg_seen s;
  memset(&s, 0, sizeof s);
  tko_lane_options o = tko_lane_default_options();
  o.on_cancel = arg_cancel;
  o.user = &s;
  tko_lanes *l = NULL;
  cr_assert_eq(tko_lanes_create(&l, p, &o), 0);
  cr_assert_eq(tko_lanes_submit(l, 4, never_fn, NULL, 0), 0);
  waiter_arg a = {.l = l, .key = 4, .w = {.runs = 0}, .rc = 1};
  s.want = &a.w;
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, waiter_main, &a), 0);
  cr_assert(wait_submitted(l, 2));
  /* Cancels the queued runner at once; the running pin makes it time out. */
  int rc = tko_pool_shutdown_timed(p, TKO_CANCEL, 0);
  cr_assert(rc == -ETIMEDOUT || rc == 0, "shutdown: %d", rc);
  pthread_join(t, NULL);
  cr_assert_eq(a.rc, -ECANCELED);
  cr_assert_eq(atomic_load(&a.w.runs), 0);
  cr_assert_eq(atomic_load(&s.hits), 1, "on_cancel saw the user's fn and arg once");
  cr_assert_eq(atomic_load(&s.others), 1);
  tt_gate_open(&pin.gate);
  cr_assert_eq(tko_pool_shutdown(p, TKO_CANCEL), 0);
  cr_assert_eq(tko_lanes_submit_wait(l, 4, where_fn, &a.w, 0), -ESHUTDOWN);
  finish(l, p);
  tt_count_fini(&pin.started);
}

/* ---- a pool shutdown racing submit_wait -------------------------------- */

enum { RACE_THREADS = 3 };

typedef struct race {
  tko_lanes *l;
  atomic_int ran, cancelled;
} race;

typedef struct race_thread {
  race *r;
  int id, ok, ecanceled, other;
} race_thread;

static int race_fn(void *arg) {
  atomic_fetch_add(&((race *)arg)->ran, 1);
  return 0;
}

static void race_cancel(void *user, const tko_lane_task *t) {
  (void)t;
  atomic_fetch_add(&((race *)user)->cancelled, 1);
}

static void *race_main(void *arg) {
  race_thread *rt = arg;
  for (int i = 0;; i++) {
    int rc = tko_lanes_submit_wait(rt->r->l, (uint64_t)(i % 2), race_fn, rt->r, 0);
    if (rc == 0) rt->ok++;
    else if (rc == -ECANCELED) rt->ecanceled++;
    else if (rc == -ESHUTDOWN) return NULL;
    else rt->other++;
  }
}

Test(lanes_wait, a_pool_shutdown_racing_submit_wait_loses_nothing) {
  for (int round = 0; round < TT_SCALE(40, 10); round++) {
    tko_pool *p = make_pool(2);
    race r = {.ran = 0, .cancelled = 0};
    tko_lane_options o = tko_lane_default_options();
    o.on_cancel = race_cancel;
    o.user = &r;
    cr_assert_eq(tko_lanes_create(&r.l, p, &o), 0);
    race_thread rt[RACE_THREADS];
    pthread_t t[RACE_THREADS];
    for (int i = 0; i < RACE_THREADS; i++) {
      rt[i] = (race_thread){&r, i, 0, 0, 0};
      cr_assert_eq(pthread_create(&t[i], NULL, race_main, &rt[i]), 0);
    }
    cr_assert(wait_submitted(r.l, (uint64_t)(round % 5) * 20));
    cr_assert_eq(tko_pool_shutdown(p, round % 2 ? TKO_CANCEL : TKO_DRAIN), 0);
    int ok = 0, ecanceled = 0;
    for (int i = 0; i < RACE_THREADS; i++) {
      pthread_join(t[i], NULL);
      cr_assert_eq(rt[i].other, 0);
      ok += rt[i].ok;
      ecanceled += rt[i].ecanceled;
    }
    cr_assert_eq(atomic_load(&r.ran), ok, "every 0 is a task that ran, once");
    cr_assert_eq(atomic_load(&r.cancelled), ecanceled, "every -ECANCELED reached on_cancel once");
    tko_lane_stats s;
    tko_lanes_stats(r.l, &s);
    cr_assert_eq(s.submitted, (uint64_t)(ok + ecanceled));
    cr_assert_eq(s.queued, 0);
    finish(r.l, p);
  }
}

/* A shutdown that begins while a submit_wait runs its lane on its caller
 * returns only after that run ended. The task lasts a while after the
 * shutdown began (as lane_tables' late_task does), so that a shutdown that
 * did not wait for it would return first. */
typedef struct held_run {
  tko_pool *p;
  tko_lanes *l;
  tt_count started;
  atomic_int finished, saw_closed;
  int rc;
} held_run;

static int held_fn(void *arg) {
  held_run *h = arg;
  tt_count_add(&h->started, 1);
  uint64_t end = tt_now_ns() + (uint64_t)TT_LONG_MS * 1000000u;
  while (tko_lanes_submit(h->l, 2, never_fn, NULL, 0) != -ESHUTDOWN && tt_now_ns() < end)
    sched_yield(); /* until the shutdown closed the table (a bounded spin) */
  atomic_store(&h->saw_closed, tt_now_ns() < end);
  struct timespec ts = {0, 100 * 1000 * 1000}; /* then a long task: 100 ms */
  nanosleep(&ts, NULL);
  atomic_store(&h->finished, 1);
  return 0;
}

static void *held_caller(void *arg) {
  held_run *h = arg;
  h->rc = tko_lanes_submit_wait(h->l, 1, held_fn, h, 0);
  return NULL;
}

Test(lanes_wait, a_shutdown_waits_for_a_lane_run_on_its_caller) {
  held_run *h = &(held_run){0};
  h->p = make_pool(1);
  tt_count_init(&h->started);
  cr_assert_eq(tko_lanes_create(&h->l, h->p, NULL), 0);
  pthread_t c;
  cr_assert_eq(pthread_create(&c, NULL, held_caller, h), 0);
  cr_assert(tt_count_wait_geq(&h->started, 1)); /* the caller runs its lane */
  cr_assert_eq(tko_pool_shutdown(h->p, TKO_DRAIN), 0);
  cr_assert_eq(atomic_load(&h->finished), 1, "the shutdown returned while the run went on");
  pthread_join(c, NULL);
  cr_assert_eq(h->rc, 0);
  cr_assert_eq(atomic_load(&h->saw_closed), 1);
  finish(h->l, h->p);
  tt_count_fini(&h->started);
}

/* ---- -EDEADLK, -EBUSY, -EINVAL, -ESHUTDOWN ----------------------------- */

typedef struct nested {
  tko_lanes *l;
  atomic_int rc, calls;
} nested;

static int nested_fn(void *arg) {
  nested *n = arg;
  atomic_store(&n->rc, tko_lanes_submit_wait(n->l, 1, where_fn, NULL, 0));
  atomic_fetch_add(&n->calls, 1);
  return 0;
}

static nested *nested_batch;

static void nested_batch_fn(void *user, const tko_lane_batch *b) {
  (void)user;
  (void)b;
  atomic_store(&nested_batch->rc, tko_lanes_submit_wait(nested_batch->l, 1, NULL, NULL, 0));
  atomic_fetch_add(&nested_batch->calls, 1);
}

Test(lanes_wait, a_lane_task_or_batch_on_its_own_lanes_gets_edeadlk) {
  tko_pool *p = make_pool(2);
  nested n = {.rc = 1, .calls = 0};
  cr_assert_eq(tko_lanes_create(&n.l, p, NULL), 0);
  /* From a task a runner runs on a worker, and from one run on its caller. */
  cr_assert_eq(tko_lanes_submit(n.l, 1, nested_fn, &n, 0), 0);
  cr_assert_eq(tko_lanes_wait_idle(n.l, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&n.rc), -EDEADLK);
  atomic_store(&n.rc, 1);
  cr_assert_eq(tko_lanes_submit_wait(n.l, 1, nested_fn, &n, 0), 0);
  cr_assert_eq(atomic_load(&n.rc), -EDEADLK);
  cr_assert_eq(atomic_load(&n.calls), 2);
  cr_assert_eq(tko_lanes_destroy(n.l), 0);
  /* From a batch callback. */
  static nested b;
  b.rc = 1;
  b.calls = 0;
  nested_batch = &b;
  tko_lane_options o = tko_lane_default_options();
  o.batch = nested_batch_fn;
  cr_assert_eq(tko_lanes_create(&b.l, p, &o), 0);
  cr_assert_eq(tko_lanes_submit_wait(b.l, 1, NULL, NULL, 0), 0);
  cr_assert_eq(atomic_load(&b.calls), 1);
  cr_assert_eq(atomic_load(&b.rc), -EDEADLK);
  finish(b.l, p);
}

/* A task of table a calls submit_wait on table b's idle lane, so b's task
 * runs nested on the same thread; from there, a call on a is still a call
 * from a's task. */
typedef struct two_tables {
  tko_lanes *a, *b;
  where w; /* the inner task on a, when it runs */
  atomic_int inner_rc, inner_calls;
} two_tables;

static int inner_on_a(void *arg) {
  two_tables *t = arg;
  atomic_store(&t->inner_rc, tko_lanes_submit_wait(t->a, 2, where_fn, &t->w, 0));
  atomic_fetch_add(&t->inner_calls, 1);
  return 0;
}

static int outer_on_a(void *arg) {
  two_tables *t = arg;
  cr_assert_eq(tko_lanes_submit_wait(t->b, 7, inner_on_a, t, 0), 0);
  return 0;
}

Test(lanes_wait, a_task_of_another_table_nested_in_a_task_of_these_lanes_gets_edeadlk) {
  tko_pool *p = make_pool(2);
  two_tables t = {.inner_rc = 1, .inner_calls = 0};
  cr_assert_eq(tko_lanes_create(&t.a, p, NULL), 0);
  cr_assert_eq(tko_lanes_create(&t.b, p, NULL), 0);
  /* a's task on its caller (an idle lane), then on a worker (a runner). */
  cr_assert_eq(tko_lanes_submit_wait(t.a, 1, outer_on_a, &t, 0), 0);
  cr_assert_eq(atomic_load(&t.inner_calls), 1);
  cr_assert_eq(atomic_load(&t.inner_rc), -EDEADLK, "rc %d", atomic_load(&t.inner_rc));
  atomic_store(&t.inner_rc, 1);
  cr_assert_eq(tko_lanes_submit(t.a, 1, outer_on_a, &t, 0), 0);
  cr_assert_eq(tko_lanes_wait_idle(t.a, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&t.inner_calls), 2);
  cr_assert_eq(atomic_load(&t.inner_rc), -EDEADLK, "rc %d", atomic_load(&t.inner_rc));
  /* b alone, outside a: its task's call on a is no call from a's task. */
  cr_assert_eq(tko_lanes_submit_wait(t.b, 7, inner_on_a, &t, 0), 0);
  cr_assert_eq(atomic_load(&t.inner_rc), 0);
  cr_assert_eq(atomic_load(&t.w.runs), 1); /* only this last call ran it */
  cr_assert_eq(tko_lanes_destroy(t.b), 0);
  finish(t.a, p);
}

typedef struct from_pool {
  tko_lanes *l;
  where w;
  int rc;
  tt_gate done;
} from_pool;

static int from_pool_fn(void *arg) {
  from_pool *f = arg;
  f->rc = tko_lanes_submit_wait(f->l, 2, where_fn, &f->w, 0);
  f->w.thread = f->rc == 0 ? f->w.thread : pthread_self();
  tt_gate_open(&f->done);
  return 0;
}

Test(lanes_wait, a_pool_task_runs_an_idle_lane_and_gets_ebusy_on_a_busy_one) {
  tko_pool *p = make_pool(2);
  tko_lanes *l = NULL;
  cr_assert_eq(tko_lanes_create(&l, p, NULL), 0);
  /* Idle: the pool task runs the lane itself. */
  from_pool f = {.l = l, .w = {.runs = 0}, .rc = 1, .done = TT_GATE_INIT};
  cr_assert_eq(tko_submit(p, from_pool_fn, &f, 0), 0);
  cr_assert(tt_gate_wait(&f.done));
  cr_assert_eq(f.rc, 0);
  cr_assert_eq(atomic_load(&f.w.runs), 1);
  /* Busy: -EBUSY, nothing queued. */
  tt_gate hold = TT_GATE_INIT;
  cr_assert_eq(tko_lanes_submit(l, 2, gate_fn, &hold, 0), 0);
  from_pool g = {.l = l, .w = {.runs = 0}, .rc = 1, .done = TT_GATE_INIT};
  cr_assert_eq(tko_submit(p, from_pool_fn, &g, 0), 0);
  cr_assert(tt_gate_wait(&g.done));
  cr_assert_eq(g.rc, -EBUSY);
  tko_lane_stats s;
  tko_lanes_stats(l, &s);
  cr_assert_eq(s.submitted, 2, "the busy call queued nothing");
  tt_gate_open(&hold);
  cr_assert_eq(tko_lanes_wait_idle(l, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&g.w.runs), 0);
  finish(l, p);
}

Test(lanes_wait, bad_arguments_and_a_closed_table) {
  tko_pool *p = make_pool(1);
  tko_lanes *l = NULL;
  cr_assert_eq(tko_lanes_create(&l, p, NULL), 0);
  where w = {.runs = 0};
  cr_assert_eq(tko_lanes_submit_wait(NULL, 1, where_fn, &w, 0), -EINVAL);
  cr_assert_eq(tko_lanes_submit_wait(l, 1, NULL, &w, 0), -EINVAL, "NULL fn without a batch");
  cr_assert_eq(tko_lanes_close(l), 0);
  cr_assert_eq(tko_lanes_submit_wait(l, 1, where_fn, &w, 0), -ESHUTDOWN);
  cr_assert_eq(atomic_load(&w.runs), 0);
  tko_lane_stats s;
  tko_lanes_stats(l, &s);
  cr_assert_eq(s.submitted, 0);
  finish(l, p);
}

/* One task appended past max_drain: the caller, having run its own, hands
 * the lane on, and the pool runs it (a lane given back with a task queued
 * would leave it there until the key's next submit). */
typedef struct one_more {
  tko_lanes *l;
  atomic_int ran, append_rc;
} one_more;

static int counted_fn(void *arg) {
  atomic_fetch_add(&((one_more *)arg)->ran, 1);
  return 0;
}

static int appends_one_fn(void *arg) {
  one_more *m = arg;
  atomic_store(&m->append_rc, tko_lanes_submit(m->l, 9, counted_fn, m, 0));
  return counted_fn(m);
}

Test(lanes_wait, a_task_appended_past_max_drain_runs_on_the_pool) {
  tko_pool *p = make_pool(1);
  tko_lane_options o = tko_lane_default_options();
  o.max_drain = 1;
  one_more m;
  memset(&m, 0, sizeof m);
  cr_assert_eq(tko_lanes_create(&m.l, p, &o), 0);
  cr_assert_eq(tko_lanes_submit_wait(m.l, 9, appends_one_fn, &m, 0), 0);
  cr_assert_eq(atomic_load(&m.append_rc), 0);
  cr_assert_eq(tko_lanes_wait_idle(m.l, TT_LONG_MS / 4), 0, "the appended task was left queued");
  cr_assert_eq(atomic_load(&m.ran), 2);
  finish(m.l, p);
}
