/* SPDX-License-Identifier: MIT */
/* Misuse from inside tasks and hooks: defined results, never a hang or a
 * crash. A task (or a hook on a pool thread) that waits on, shuts down or
 * destroys its own pool gets -EDEADLK and the pool goes on; a task or hook
 * that submits while the pool drains or cancels gets -ESHUTDOWN and what it
 * submitted never runs; hooks may submit (and what they submit runs when
 * accepted) or block (the pool waits for them, nothing else breaks); lane
 * and coalescer callbacks get -EDEADLK for calls that would wait on
 * themselves; caller errors (a group over two pools, destroying a busy
 * group, completing an async task twice, arming an armed timer, the
 * blocking hint outside a pool) are reported, not acted on.
 *
 * Waits that the library should refuse are made with timeout 0 where
 * possible, so that a regression shows as a wrong return value rather than
 * as a hang. Cases the core once got wrong (tasks run on the submitting
 * thread, hooks run on a thread the pool does not own, the timer thread
 * blocking shutdown) are regression tests now, their comments saying what
 * went wrong; what is still open sits behind a TKO_KNOWN_BUG_* guard. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "taskorch.h"
#include "taskorch/coalescer.h"
#include "taskorch/lanes.h"
#include "tko_test.h"
#include "tko_test_fault.h"
#include "tko_test_feature.h"
#include "tko_test_sync.h"

static int count_fn(void *arg) {
  tt_count_add(arg, 1);
  return 0;
}

/* An async task that hands its op to the test through a tt_count-guarded
 * slot and stays in flight. */
typedef struct held_op {
  tko_async *_Atomic op;
  tt_count started;
} held_op;

static int hold_async(tko_async *op, void *arg) {
  held_op *h = arg;
  atomic_store(&h->op, op);
  tt_count_add(&h->started, 1);
  return 0;
}

/* What a task saw when it turned on its own pool. */
typedef struct self_rc {
  tko_pool *_Atomic pool;
  atomic_int wait, wait0, shut_drain, shut_cancel, destroy, calls;
  tt_count done; /* calls, to wait on */
} self_rc;

static void self_rc_init(self_rc *s) {
  memset(s, 0, sizeof *s);
  tt_count_init(&s->done);
  atomic_store(&s->wait, 1);
  atomic_store(&s->wait0, 1);
  atomic_store(&s->shut_drain, 1);
  atomic_store(&s->shut_cancel, 1);
  atomic_store(&s->destroy, 1);
}

static void turn_on_own_pool(self_rc *s) {
  tko_pool *p = atomic_load(&s->pool);
  atomic_store(&s->wait, tko_pool_wait_idle(p, -1));
  atomic_store(&s->wait0, tko_pool_wait_idle(p, 0));
  atomic_store(&s->shut_drain, tko_pool_shutdown(p, TKO_DRAIN));
  atomic_store(&s->shut_cancel, tko_pool_shutdown(p, TKO_CANCEL));
  atomic_store(&s->destroy, tko_pool_destroy(p));
  atomic_fetch_add(&s->calls, 1);
  tt_count_add(&s->done, 1);
}

static void expect_all_edeadlk(self_rc *s, const char *where) {
  cr_assert_geq(atomic_load(&s->calls), 1, "%s: never called", where);
  cr_assert_eq(atomic_load(&s->wait), -EDEADLK, "%s: wait_idle(-1)", where);
  cr_assert_eq(atomic_load(&s->wait0), -EDEADLK, "%s: wait_idle(0)", where);
  cr_assert_eq(atomic_load(&s->shut_drain), -EDEADLK, "%s: shutdown(DRAIN)", where);
  cr_assert_eq(atomic_load(&s->shut_cancel), -EDEADLK, "%s: shutdown(CANCEL)", where);
  cr_assert_eq(atomic_load(&s->destroy), -EDEADLK, "%s: destroy", where);
}

static int self_task(void *arg) {
  turn_on_own_pool(arg);
  return 0;
}

static int self_async(tko_async *op, void *arg) {
  turn_on_own_pool(arg);
  return tko_async_complete(op, 0) == 0 ? 0 : 1; /* completing at once is allowed */
}

/* ---- a task turning on its own pool ------------------------------------------- */

Test(misuse, tasks_of_every_kind_get_edeadlk_from_their_own_pool) {
  /* Basic worker, elastic worker, async start, timer task, and a task run
   * by a worker helping in tko_group_wait. */
  tko_options o = tko_elastic_options(1, 1, 60000);
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);

  self_rc basic;
  self_rc_init(&basic);
  atomic_store(&basic.pool, p);
  cr_assert_eq(tko_submit(p, self_task, &basic, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  expect_all_edeadlk(&basic, "basic worker");

  /* Pin the basic worker: the next task needs the elastic one. */
  tt_pin pn = TT_PIN_INIT;
  cr_assert_eq(tko_submit(p, tt_pin_fn, &pn, 0), 0);
  cr_assert(tt_count_wait_geq(&pn.started, 1));
  self_rc elastic;
  self_rc_init(&elastic);
  atomic_store(&elastic.pool, p);
  tko_group g;
  cr_assert_eq(tko_group_init(&g), 0);
  cr_assert_eq(tko_group_submit(p, &g, self_task, &elastic, 0), 0);
  cr_assert_eq(tko_group_wait(&g, TT_LONG_MS), 0);
  expect_all_edeadlk(&elastic, "elastic worker");
  tko_stats s;
  tko_pool_stats(p, &s);
  cr_assert_geq(s.elastic_spawned, 1);
  tt_gate_open(&pn.gate);

  self_rc async;
  self_rc_init(&async);
  atomic_store(&async.pool, p);
  cr_assert_eq(tko_submit_async(p, self_async, &async, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  expect_all_edeadlk(&async, "async start");

  self_rc timed;
  self_rc_init(&timed);
  atomic_store(&timed.pool, p);
  tko_timer t;
  tko_timer_init(&t);
  cr_assert_eq(tko_submit_after(p, &t, 0, self_task, &timed, 0), 0);
  cr_assert(tt_count_wait_geq(&timed.done, 1));
  expect_all_edeadlk(&timed, "timer task");

  /* The pool is unharmed: it still runs work, then shuts down normally. */
  cr_assert_eq(tko_group_destroy(&g), 0);
  static tft_token tok;
  memset(&tok, 0, sizeof tok);
  cr_assert_eq(tko_submit(p, tft_run, &tok, 0), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
  cr_assert_eq(atomic_load(&tok.runs), 1);
}

/* A task that waits on a group of its own pool helps instead of blocking;
 * a task it runs while helping is still the pool's task. */
typedef struct helper {
  tko_pool *pool;
  tko_group group;
  self_rc inner;
  atomic_int wait_rc;
} helper;

static int helping_task(void *arg) {
  helper *h = arg;
  cr_assert_eq(tko_group_submit(h->pool, &h->group, self_task, &h->inner, 0), 0);
  atomic_store(&h->wait_rc, tko_group_wait(&h->group, -1));
  return 0;
}

Test(misuse, a_task_run_while_helping_gets_edeadlk_too) {
  tko_options o = tko_basic_options(1);
  helper h;
  memset(&h, 0, sizeof h);
  cr_assert_eq(tko_pool_create(&h.pool, &o), 0);
  cr_assert_eq(tko_group_init(&h.group), 0);
  self_rc_init(&h.inner);
  atomic_store(&h.inner.pool, h.pool);
  atomic_store(&h.wait_rc, 1);
  cr_assert_eq(tko_submit(h.pool, helping_task, &h, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(h.pool, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&h.wait_rc), 0);
  expect_all_edeadlk(&h.inner, "task run by a helping waiter");
  cr_assert_eq(tko_group_destroy(&h.group), 0);
  cr_assert_eq(tko_pool_destroy(h.pool), 0);
}

/* A task may shut down or destroy another pool, and wait on it. */
typedef struct other {
  tko_pool *other;
  atomic_int wait_rc, destroy_rc;
  tft_token tok;
} other;

static int destroy_other(void *arg) {
  other *o = arg;
  cr_assert_eq(tko_submit(o->other, tft_run, &o->tok, 0), 0);
  o->tok.accepted = true;
  atomic_store(&o->wait_rc, tko_pool_wait_idle(o->other, -1));
  atomic_store(&o->destroy_rc, tko_pool_destroy(o->other));
  return 0;
}

Test(misuse, a_task_may_wait_on_and_destroy_another_pool) {
  tko_options o = tko_basic_options(1);
  tko_pool *a;
  other ot;
  memset(&ot, 0, sizeof ot);
  atomic_store(&ot.wait_rc, 1);
  atomic_store(&ot.destroy_rc, 1);
  cr_assert_eq(tko_pool_create(&a, &o), 0);
  cr_assert_eq(tko_pool_create(&ot.other, &o), 0);
  cr_assert_eq(tko_submit(a, destroy_other, &ot, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(a, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&ot.wait_rc), 0);
  cr_assert_eq(atomic_load(&ot.destroy_rc), 0);
  cr_assert_eq(atomic_load(&ot.tok.runs), 1);
  cr_assert_eq(tko_pool_destroy(a), 0);
}

/* ---- submitting while the pool drains or cancels ---------------------------------- */

typedef struct chain {
  tko_pool *pool;
  tft_token tok[64];
  tft_token next[64];
  atomic_int submit_rc[64];
  atomic_int index;
  atomic_int cancelled; /* chain tasks handed to on_cancel */
} chain;

static void chain_on_cancel(void *user, const tko_task_info *t) {
  chain *c = user;
  if (t->arg == c)
    atomic_fetch_add(&c->cancelled, 1);
  else
    tft_on_cancel(NULL, t);
}

/* Each chain task tries to submit a follow-up. */
static int chain_fn(void *arg) {
  chain *c = arg;
  int i = atomic_fetch_add(&c->index, 1);
  if (i >= 64) return 0;
  atomic_fetch_add(&c->tok[i].runs, 1);
  int rc = tko_submit(c->pool, tft_run, &c->next[i], 0);
  if (rc == 0) c->next[i].accepted = true;
  atomic_store(&c->submit_rc[i], rc);
  return 0;
}

static int run_shutdown(void *arg) {
  void **a = arg;
  return tko_pool_shutdown(a[0], (tko_shutdown_mode)(intptr_t)a[1]);
}

/* The chain tasks (queued before shutdown) run under DRAIN; each one's
 * submit is refused, and nothing refused ever runs. Under CANCEL they are
 * cancelled instead (a worker that had taken some may still start them,
 * with the same result for their submits). */
static void chain_case(tko_shutdown_mode mode) {
  static chain c;
  memset(&c, 0, sizeof c);
  tko_options o = tko_basic_options(1);
  o.hooks.user = &c;
  o.hooks.on_cancel = chain_on_cancel;
  cr_assert_eq(tko_pool_create(&c.pool, &o), 0);
  tt_pin pn = TT_PIN_INIT;
  cr_assert_eq(tko_submit(c.pool, tt_pin_fn, &pn, 0), 0);
  cr_assert(tt_count_wait_geq(&pn.started, 1));
  for (int i = 0; i < 64; i++)
    atomic_store(&c.submit_rc[i], 1);
  for (int i = 0; i < 64; i++)
    cr_assert_eq(tko_submit(c.pool, chain_fn, &c, 0), 0);
  tf_thread t;
  void *args[2] = {c.pool, (void *)(intptr_t)mode};
  cr_assert_eq(tf_thread_start(&t, run_shutdown, args), 0);
  cr_assert(tf_wait_thread_sleeping(t.tid), "shutdown should block on the pinned worker");
  /* Shutdown has begun: the test thread's own submit is refused too. */
  static tft_token late;
  memset(&late, 0, sizeof late);
  cr_assert_eq(tko_submit(c.pool, tft_run, &late, 0), -ESHUTDOWN);
  tt_gate_open(&pn.gate);
  int rc = 1;
  cr_assert(tf_thread_join(&t, &rc));
  cr_assert_eq(rc, 0);
  tko_stats s;
  tko_pool_stats(c.pool, &s);
  int ran = atomic_load(&c.index);
  if (ran > 64) ran = 64;
  cr_assert_eq(s.completed, 1 + (uint64_t)ran);
  cr_assert_eq(s.completed + s.cancelled, s.submitted);
  cr_assert_eq(ran + atomic_load(&c.cancelled), 64, "each chain task ran or was cancelled");
  if (mode == TKO_DRAIN) cr_assert_eq(ran, 64, "DRAIN runs every queued task");
  for (int i = 0; i < ran; i++) {
    cr_assert_eq(atomic_load(&c.submit_rc[i]), -ESHUTDOWN, "chain task %d", i);
    cr_assert_eq(atomic_load(&c.next[i].runs), 0);
  }
  cr_assert_eq(tko_pool_destroy(c.pool), 0);
  cr_assert_eq(atomic_load(&late.runs), 0);
}

Test(misuse, tasks_submitting_while_the_pool_drains_get_eshutdown) {
  chain_case(TKO_DRAIN);
}

Test(misuse, tasks_submitting_while_the_pool_cancels_get_eshutdown) {
  chain_case(TKO_CANCEL);
}

/* ---- hooks that submit --------------------------------------------------------------- */

typedef struct hook_submit {
  tko_pool *_Atomic pool;
  tft_token tok[64];
  atomic_int n;       /* tokens handed out */
  atomic_int limit;   /* hand out at most this many */
  atomic_int refused; /* submits refused with -ESHUTDOWN */
  atomic_int bad;     /* any other failure */
  tt_count submitted;
} hook_submit;

static void hs_submit(hook_submit *h) {
  tko_pool *p = atomic_load(&h->pool);
  if (!p) return;
  int i = atomic_fetch_add(&h->n, 1);
  if (i >= atomic_load(&h->limit) || i >= 64) return;
  int rc = tko_submit(p, tft_run, &h->tok[i], 0);
  if (rc == 0)
    h->tok[i].accepted = true;
  else if (rc == -ESHUTDOWN)
    atomic_fetch_add(&h->refused, 1);
  else
    atomic_store(&h->bad, rc);
  tt_count_add(&h->submitted, 1);
}

/* A pool of options o whose thread_stop hook is stop, with user. */
static tko_pool *stop_hook_pool(tko_options o, void *user, tko_thread_hook stop) {
  o.hooks.user = user;
  o.hooks.thread_stop = stop;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  return p;
}

static void hs_thread_stop(void *user, unsigned index, tko_worker_kind kind) {
  (void)index;
  (void)kind;
  hs_submit(user);
}

static void hs_on_cancel(void *user, const tko_task_info *t) {
  hook_submit *h = user;
  /* The tokens this hook submitted are counted like any other. */
  if (t->arg >= (void *)h->tok && t->arg < (void *)(h->tok + 64)) {
    tft_on_cancel(NULL, t);
    return;
  }
  hs_submit(h);
}

/* Regression, fixed in 8f0737a. It was: an elastic worker that retires calls thread_stop after
 * giving back its slot (RETIRING) and count. If the hook submits and no worker is idle,
 * tko__elastic_spawn runs on that retiring thread, claims a free slot - its own, with max_elastic 1
 * - and, finding has_thread set, joins the slot's old thread: itself. pthread_join returns EDEADLK,
 * which is ignored; has_thread is cleared and the handle is overwritten by the new thread's, so the
 * retiring thread is never joined (its stack and descriptor leak; ThreadSanitizer: "thread leak ...
 * created by tko__elastic_spawn"). Fix: never claim (or join) the calling thread's own slot -
 * compare w == tko__current_worker - or hand the join to the next spawner by leaving has_thread
 * set. */
Test(misuse, a_retiring_workers_thread_stop_hook_may_submit_and_its_task_runs) {
  /* Elastic-only: every task needs a spawn, and every retirement's hook
   * submits a task that needs the next spawn, 20 times over. */
  static hook_submit h;
  memset(&h, 0, sizeof h);
  tt_count_init(&h.submitted);
  atomic_store(&h.limit, 20);
  tko_pool *p = stop_hook_pool(tko_elastic_options(0, 1, 1), &h, hs_thread_stop);
  atomic_store(&h.pool, p);
  static tft_token first;
  memset(&first, 0, sizeof first);
  cr_assert_eq(tko_submit(p, tft_run, &first, 0), 0);
  cr_assert(tt_count_wait_geq(&h.submitted, 20), "retirements stopped submitting");
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&h.bad), 0);
  cr_assert_eq(atomic_load(&h.refused), 0);
  /* The last worker's hook runs during destroy: refused. */
  atomic_store(&h.limit, 21);
  cr_assert_eq(tko_pool_destroy(p), 0);
  cr_assert_eq(atomic_load(&h.bad), 0);
  cr_assert_eq(tft_first_bad(h.tok, 64), -1);
  long acc, runs, cancels;
  tft_counts(h.tok, 64, &acc, &runs, &cancels);
  cr_assert_geq(acc, 20);
  cr_assert_eq(runs, acc);
  tt_count_fini(&h.submitted);
}

/* Two retiring workers whose stop hooks submit at the same time. Each
 * submit spawns; each spawn used to claim the other retiring worker's slot
 * and join its thread, so the two joined each other: glibc fails the
 * second join with EDEADLK, and that thread was never joined
 * (ThreadSanitizer: thread leak). The first two hook calls meet before
 * submitting, so the two really overlap (a bounded rendezvous that arranges
 * the race, not a wait for the pool); later ones only submit. */
typedef struct pair_stop {
  tko_pool *_Atomic pool;
  atomic_int in_hook; /* hook calls so far */
  atomic_int bad;     /* a submit that failed */
  atomic_long ran;    /* the hooks' tasks that ran */
  tt_count both;      /* the two first tasks are running */
  tt_count submitted; /* hook submits made (or failed) */
} pair_stop;

static int ps_task(void *arg) {
  atomic_fetch_add((atomic_long *)arg, 1);
  return 0;
}

static int ps_hold(void *arg) {
  pair_stop *ps = arg;
  tt_count_add(&ps->both, 1);
  tt_count_wait_geq(&ps->both, 2); /* two tasks at once: two elastic workers */
  return 0;
}

static void ps_thread_stop(void *user, unsigned index, tko_worker_kind kind) {
  (void)index;
  (void)kind;
  pair_stop *ps = user;
  tko_pool *p = atomic_load(&ps->pool);
  int call = atomic_fetch_add(&ps->in_hook, 1);
  if (!p || call >= 2) return;
  uint64_t end = tt_now_ns() + 2000000000u;
  while (atomic_load(&ps->in_hook) < 2 && tt_now_ns() < end)
    sched_yield();
  if (tko_submit(p, ps_task, &ps->ran, 0) != 0) atomic_fetch_add(&ps->bad, 1);
  tt_count_add(&ps->submitted, 1);
}

Test(misuse, two_stop_hooks_submitting_at_once_do_not_join_each_other) {
  static pair_stop ps;
  memset(&ps, 0, sizeof ps);
  tt_count_init(&ps.both);
  tt_count_init(&ps.submitted);
  tko_pool *p = stop_hook_pool(tko_elastic_options(0, 2, 1), &ps, ps_thread_stop);
  atomic_store(&ps.pool, p);
  cr_assert_eq(tko_submit(p, ps_hold, &ps, 0), 0);
  cr_assert_eq(tko_submit(p, ps_hold, &ps, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  /* Both retire about 1 ms later; their hooks submit one task each. */
  cr_assert(tt_count_wait_geq(&ps.submitted, 2), "the two workers did not retire");
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&ps.bad), 0);
  cr_assert_eq(atomic_load(&ps.ran), 2, "each hook's task ran");
  atomic_store(&ps.pool, NULL);
  cr_assert_eq(tko_pool_destroy(p), 0);
  tt_count_fini(&ps.both);
  tt_count_fini(&ps.submitted);
}

Test(misuse, thread_stop_hooks_submitting_at_shutdown_are_refused) {
  static hook_submit h;
  memset(&h, 0, sizeof h);
  tt_count_init(&h.submitted);
  atomic_store(&h.limit, 64);
  tko_pool *p = stop_hook_pool(tko_basic_options(4), &h, hs_thread_stop);
  atomic_store(&h.pool, p);
  cr_assert_eq(tko_pool_shutdown(p, TKO_DRAIN), 0);
  cr_assert_eq(tt_count_get(&h.submitted), 4);
  cr_assert_eq(atomic_load(&h.refused), 4);
  cr_assert_eq(atomic_load(&h.bad), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
  cr_assert_eq(tft_first_bad(h.tok, 64), -1);
  tt_count_fini(&h.submitted);
}

Test(misuse, on_cancel_hooks_submit_refused_at_shutdown_accepted_at_group_cancel) {
  static hook_submit h;
  memset(&h, 0, sizeof h);
  tt_count_init(&h.submitted);
  atomic_store(&h.limit, 64);
  tko_options o = tko_basic_options(1);
  o.hooks.user = &h;
  o.hooks.on_cancel = hs_on_cancel;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  atomic_store(&h.pool, p);
  tt_pin pn = TT_PIN_INIT;
  cr_assert_eq(tko_submit(p, tt_pin_fn, &pn, 0), 0);
  cr_assert(tt_count_wait_geq(&pn.started, 1));
  /* Group cancel while the pool runs: the hook's submits are accepted. */
  tko_group g;
  cr_assert_eq(tko_group_init(&g), 0);
  for (int i = 0; i < 5; i++)
    cr_assert_eq(tko_group_submit(p, &g, tt_nop_fn, NULL, 0), 0);
  cr_assert_eq(tko_group_cancel(&g), 5);
  cr_assert_eq(tko_group_wait(&g, 0), 0);
  cr_assert_eq(tko_group_status(&g), -ECANCELED);
  cr_assert_eq(tt_count_get(&h.submitted), 5);
  cr_assert_eq(atomic_load(&h.refused), 0);
  /* Shutdown with CANCEL: the five accepted ones are cancelled (their
   * tokens count it) and each plain task's hook submit is refused. */
  for (int i = 0; i < 3; i++)
    cr_assert_eq(tko_submit(p, tt_nop_fn, NULL, 0), 0);
  tf_thread t;
  void *args[2] = {p, (void *)(intptr_t)TKO_CANCEL};
  cr_assert_eq(tf_thread_start(&t, run_shutdown, args), 0);
  cr_assert(tf_wait_thread_sleeping(t.tid));
  tt_gate_open(&pn.gate);
  int rc = 1;
  cr_assert(tf_thread_join(&t, &rc));
  cr_assert_eq(rc, 0);
  cr_assert_eq(atomic_load(&h.refused), 3);
  cr_assert_eq(atomic_load(&h.bad), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
  cr_assert_eq(tko_group_destroy(&g), 0);
  cr_assert_eq(tft_first_bad(h.tok, 64), -1);
  tt_count_fini(&h.submitted);
}

/* ---- hooks that turn on the pool or block -------------------------------------------- */

typedef struct hook_self {
  self_rc before, after, failure, stop;
} hook_self;

static void hk_before(void *user, const tko_task_info *t) {
  (void)t;
  hook_self *h = user;
  if (atomic_load(&h->before.calls) == 0) turn_on_own_pool(&h->before);
}

static void hk_after(void *user, const tko_task_info *t) {
  (void)t;
  hook_self *h = user;
  if (atomic_load(&h->after.calls) == 0) turn_on_own_pool(&h->after);
}

static void hk_failure(void *user, const tko_task_info *t) {
  (void)t;
  hook_self *h = user;
  if (atomic_load(&h->failure.calls) == 0) turn_on_own_pool(&h->failure);
}

static void hk_stop(void *user, unsigned index, tko_worker_kind kind) {
  (void)index;
  (void)kind;
  hook_self *h = user;
  if (atomic_load(&h->stop.calls) == 0) turn_on_own_pool(&h->stop);
}

static int fail_fn(void *arg) {
  (void)arg;
  return 42;
}

Test(misuse, hooks_on_pool_threads_get_edeadlk_from_their_own_pool) {
  static hook_self h;
  self_rc_init(&h.before);
  self_rc_init(&h.after);
  self_rc_init(&h.failure);
  self_rc_init(&h.stop);
  tko_options o = tko_basic_options(1);
  o.hooks.user = &h;
  o.hooks.before_run = hk_before;
  o.hooks.after_run = hk_after;
  o.hooks.on_failure = hk_failure;
  o.hooks.thread_stop = hk_stop;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  atomic_store(&h.before.pool, p);
  atomic_store(&h.after.pool, p);
  atomic_store(&h.failure.pool, p);
  atomic_store(&h.stop.pool, p);
  cr_assert_eq(tko_submit(p, fail_fn, NULL, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  expect_all_edeadlk(&h.before, "before_run");
  expect_all_edeadlk(&h.after, "after_run");
  expect_all_edeadlk(&h.failure, "on_failure");
  cr_assert_eq(tko_pool_destroy(p), 0);
  expect_all_edeadlk(&h.stop, "thread_stop");
}

/* A thread_start hook that blocks: create does not wait for it, the work
 * waits (wait_idle times out instead of hanging), and everything resumes
 * when the hook returns. */
static void blocking_start(void *user, unsigned index, tko_worker_kind kind) {
  (void)index;
  (void)kind;
  tt_gate_wait(user);
}

Test(misuse, a_blocking_thread_start_hook_delays_work_but_breaks_nothing) {
  tt_gate gate = TT_GATE_INIT;
  tko_options o = tko_basic_options(1);
  o.hooks.user = &gate;
  o.hooks.thread_start = blocking_start;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  static tft_token tok;
  memset(&tok, 0, sizeof tok);
  cr_assert_eq(tko_submit(p, tft_run, &tok, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(p, 0), -ETIMEDOUT);
  cr_assert_eq(atomic_load(&tok.runs), 0);
  tt_gate_open(&gate);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&tok.runs), 1);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* A before_run hook that blocks holds one worker; wait_idle and the other
 * workers are unaffected. */
typedef struct blocker {
  tt_gate gate;
  tt_count blocked;
} blocker;

static void blocking_before(void *user, const tko_task_info *t) {
  blocker *b = user;
  if (t->arg != user) return;
  tt_count_add(&b->blocked, 1);
  tt_gate_wait(&b->gate);
}

Test(misuse, a_blocking_before_run_hook_holds_only_its_worker) {
  blocker b = {TT_GATE_INIT, TT_COUNT_INIT};
  tko_options o = tko_basic_options(2);
  o.hooks.user = &b;
  o.hooks.before_run = blocking_before;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  cr_assert_eq(tko_submit(p, tt_nop_fn, &b, 0), 0); /* its hook blocks */
  cr_assert(tt_count_wait_geq(&b.blocked, 1));
  tt_count done = TT_COUNT_INIT;
  for (int i = 0; i < 20; i++)
    cr_assert_eq(tko_submit(p, count_fn, &done, 0), 0);
  /* The other worker runs all twenty; only the blocked task is pending. */
  cr_assert(tt_count_wait_geq(&done, 20));
  cr_assert_eq(tko_pool_wait_idle(p, 0), -ETIMEDOUT);
  tt_gate_open(&b.gate);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* ---- lanes and coalescer callbacks ------------------------------------------------------ */

typedef struct lane_self {
  tko_lanes *_Atomic lanes;
  atomic_int wait_rc, destroy_rc, pool_wait_rc, calls;
} lane_self;

static int lane_self_fn(void *arg) {
  lane_self *s = arg;
  tko_lanes *l = atomic_load(&s->lanes);
  atomic_store(&s->wait_rc, tko_lanes_wait_idle(l, -1));
  atomic_store(&s->destroy_rc, tko_lanes_destroy(l));
  atomic_fetch_add(&s->calls, 1);
  return 0;
}

static void lane_self_batch(void *user, const tko_lane_batch *b) {
  (void)b;
  lane_self_fn(user);
}

Test(misuse, lane_tasks_and_batches_get_edeadlk_from_their_lanes) {
  tko_options o = tko_basic_options(2);
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  for (int batch = 0; batch < 2; batch++) {
    lane_self s;
    memset(&s, 0, sizeof s);
    tko_lane_options lo = tko_lane_default_options();
    if (batch) {
      lo.batch = lane_self_batch;
      lo.user = &s;
    }
    tko_lanes *l;
    cr_assert_eq(tko_lanes_create(&l, p, &lo), 0);
    atomic_store(&s.lanes, l);
    cr_assert_eq(tko_lanes_submit(l, 7, batch ? NULL : lane_self_fn, &s, 0), 0);
    cr_assert_eq(tko_lanes_wait_idle(l, TT_LONG_MS), 0);
    cr_assert_eq(atomic_load(&s.calls), 1);
    cr_assert_eq(atomic_load(&s.wait_rc), -EDEADLK);
    cr_assert_eq(atomic_load(&s.destroy_rc), -EDEADLK);
    cr_assert_eq(tko_lanes_destroy(l), 0);
  }
  cr_assert_eq(tko_pool_destroy(p), 0);
}

typedef struct co_self {
  tko_coalescer *_Atomic c;
  atomic_int flush_rc, close_rc, destroy_rc, mark_rc, calls;
} co_self;

static void co_self_flush(void *user, const tko_coalesce_entry *e, size_t n) {
  (void)e;
  (void)n;
  co_self *s = user;
  if (atomic_fetch_add(&s->calls, 1) != 0) return;
  tko_coalescer *c = atomic_load(&s->c);
  atomic_store(&s->flush_rc, tko_coalescer_flush(c));
  atomic_store(&s->close_rc, tko_coalescer_close(c));
  atomic_store(&s->destroy_rc, tko_coalescer_destroy(c));
  atomic_store(&s->mark_rc, tko_coalescer_mark(c, 99, 1)); /* allowed: next sweep */
}

static int co_destroy_task(void *arg) {
  co_self *s = arg;
  atomic_store(&s->destroy_rc, tko_coalescer_destroy(atomic_load(&s->c)));
  return 0;
}

Test(misuse, coalescer_flush_fn_and_pool_tasks_get_edeadlk) {
  tko_options o = tko_basic_options(1);
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  co_self s;
  memset(&s, 0, sizeof s);
  tko_coalescer *c;
  cr_assert_eq(tko_coalescer_create(&c, p, 0, co_self_flush, &s, NULL), 0);
  atomic_store(&s.c, c);
  cr_assert_eq(tko_coalescer_mark(c, 1, 1), 0);
  cr_assert_eq(tko_coalescer_flush(c), 0);
  cr_assert_eq(atomic_load(&s.flush_rc), -EDEADLK);
  cr_assert_eq(atomic_load(&s.close_rc), -EDEADLK);
  cr_assert_eq(atomic_load(&s.destroy_rc), -EDEADLK);
  cr_assert_eq(atomic_load(&s.mark_rc), 0);
  /* From a task of the coalescer's pool, destroy would wait on itself. */
  atomic_store(&s.destroy_rc, 1);
  cr_assert_eq(tko_submit(p, co_destroy_task, &s, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&s.destroy_rc), -EDEADLK);
  cr_assert_eq(tko_coalescer_destroy(c), 0); /* final flush: key 99 */
  cr_assert_eq(atomic_load(&s.calls), 2);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* A lane table's on_cancel, called by the pool's shutdown on the shutdown
 * thread, is inside that shutdown: a wait on the pool or its destroy from
 * there would wait on itself, so both are -EDEADLK; the shutdown finishes. */
typedef struct shut_cancel {
  tko_pool *pool;
  atomic_int calls, wait_rc, destroy_rc;
} shut_cancel;

static void shut_cancel_hook(void *user, const tko_lane_task *t) {
  (void)t;
  shut_cancel *s = user;
  if (atomic_fetch_add(&s->calls, 1) != 0) return;
  atomic_store(&s->wait_rc, tko_pool_wait_idle(s->pool, -1));
  atomic_store(&s->destroy_rc, tko_pool_destroy(s->pool));
}

Test(misuse, a_lanes_on_cancel_run_by_shutdown_gets_edeadlk_from_the_pool) {
  tko_options o = tko_basic_options(1);
  shut_cancel s;
  memset(&s, 0, sizeof s);
  cr_assert_eq(tko_pool_create(&s.pool, &o), 0);
  tko_lane_options lo = tko_lane_default_options();
  lo.on_cancel = shut_cancel_hook;
  lo.user = &s;
  tko_lanes *l;
  cr_assert_eq(tko_lanes_create(&l, s.pool, &lo), 0);
  cr_assert_eq(tko_pool_pause(s.pool), 0); /* the lane tasks stay queued */
  static tft_token tok[3];
  memset(tok, 0, sizeof tok);
  for (int i = 0; i < 3; i++)
    cr_assert_eq(tko_lanes_submit(l, 5, tft_run, &tok[i], 0), 0);
  cr_assert_eq(tko_pool_shutdown(s.pool, TKO_CANCEL), 0);
  cr_assert_eq(atomic_load(&s.calls), 3);
  cr_assert_eq(atomic_load(&s.wait_rc), -EDEADLK);
  cr_assert_eq(atomic_load(&s.destroy_rc), -EDEADLK);
  for (int i = 0; i < 3; i++)
    cr_assert_eq(atomic_load(&tok[i].runs), 0);
  cr_assert_eq(tko_lanes_destroy(l), 0);
  cr_assert_eq(tko_pool_destroy(s.pool), 0);
}

/* ---- caller errors ------------------------------------------------------------------------ */

Test(misuse, caller_errors_are_reported_and_change_nothing) {
  tko_options o = tko_basic_options(1);
  tko_pool *a, *b;
  cr_assert_eq(tko_pool_create(&a, &o), 0);
  cr_assert_eq(tko_pool_create(&b, &o), 0);
  static tft_token tok[4];
  memset(tok, 0, sizeof tok);

  /* A group spans one pool. */
  tko_group g;
  cr_assert_eq(tko_group_init(&g), 0);
  tt_pin pn = TT_PIN_INIT;
  cr_assert_eq(tko_group_submit(a, &g, tt_pin_fn, &pn, 0), 0);
  cr_assert(tt_count_wait_geq(&pn.started, 1));
  cr_assert_eq(tko_group_submit(b, &g, tft_run, &tok[0], 0), -EINVAL);
  /* A busy group is not destroyed. */
  cr_assert_eq(tko_group_destroy(&g), -EBUSY);
  cr_assert_eq(tko_group_pending(&g), 1);
  tt_gate_open(&pn.gate);
  cr_assert_eq(tko_group_wait(&g, TT_LONG_MS), 0);
  cr_assert_eq(tko_group_destroy(&g), 0);

  /* An armed timer is not re-armed; an unarmed one is not cancelled. */
  tko_timer t;
  tko_timer_init(&t);
  cr_assert_eq(tko_timer_cancel(&t), -ENOENT);
  cr_assert_eq(tko_submit_after(a, &t, 3600000, tft_run, &tok[1], 0), 0);
  cr_assert_eq(tko_submit_after(a, &t, 0, tft_run, &tok[2], 0), -EBUSY);
  cr_assert_eq(tko_submit_every(b, &t, 1, tft_run, &tok[2], 0), -EBUSY);
  cr_assert_eq(tko_timer_cancel(&t), 0);
  cr_assert_eq(tko_timer_cancel(&t), -ENOENT);
  cr_assert_eq(tko_submit_after(a, &t, -1, tft_run, &tok[2], 0), -EINVAL);
  cr_assert_eq(tko_submit_every(a, &t, 0, tft_run, &tok[2], 0), -EINVAL);

  /* An async task completed twice: the second is -EALREADY. */
  held_op h = {NULL, TT_COUNT_INIT};
  cr_assert_eq(tko_submit_async(a, hold_async, &h, 0), 0);
  cr_assert(tt_count_wait_geq(&h.started, 1));
  cr_assert_eq(tko_pool_wait_idle(a, 0), -ETIMEDOUT, "an async task in flight is running");
  cr_assert_eq(tko_async_complete(atomic_load(&h.op), 0), 0);
  cr_assert_eq(tko_async_complete(atomic_load(&h.op), 0), -EALREADY);
  cr_assert_eq(tko_async_complete(NULL, 0), -EINVAL);
  cr_assert_eq(tko_pool_wait_idle(a, TT_LONG_MS), 0);

  /* The blocking hint outside a pool's worker. */
  cr_assert_eq(tko_blocking_begin(), -EPERM);
  cr_assert_eq(tko_blocking_end(), -EPERM);

  /* Bad shutdown modes and timeouts. */
  cr_assert_eq(tko_pool_shutdown(a, (tko_shutdown_mode)7), -EINVAL);
  cr_assert_eq(tko_pool_wait_idle(a, -2), -EINVAL);
  cr_assert_eq(tko_submit_timed(a, tft_run, &tok[3], 0, -2), -EINVAL);

  tko_stats s;
  tko_pool_stats(a, &s);
  cr_assert_eq(s.completed, s.submitted);
  cr_assert_eq(tko_pool_destroy(a), 0);
  cr_assert_eq(tko_pool_destroy(b), 0);
  for (int i = 0; i < 4; i++)
    cr_assert_eq(atomic_load(&tok[i].runs), 0, "token %d", i);
}

/* ---- pool calls from threads the pool does not own ----------------------------------------- */

/* Regression, fixed in 8f0737a. It was: the -EDEADLK checks look only at tko__current_pool (set on
 * the pool's workers) and at the thread running shutdown. Three places run a pool's task or hook on
 * some other thread, and there a call that waits on the pool waits on itself: - a
 * TKO_FULL_CALLER_RUNS task runs on the submitting thread (run_here in submit.c), counted as
 * submitted but not finished: tko_pool_wait_idle(p, -1) from it never returns (timeout 0 gives
 * -ETIMEDOUT, not -EDEADLK); - on_cancel, when tko_group_cancel is called from a thread outside the
 * pool: the task counts as cancelled only after the hook returns, so the hook's wait_idle(p, -1)
 * never returns; - after_run / on_failure of an async task run on whatever thread calls
 * tko_async_complete; the task is still in flight there, so wait_idle never returns and destroy
 * (its wait for async tasks in flight) never returns either. Worse, tko_pool_destroy from the
 * first two frees the
 * pool under the code that called the task or hook (use after free; see the destroy test below).
 * Fix: mark the thread (a thread-local "running a task/hook of pool p" set by run_here,
 * tko__cancel_item and finish) and refuse with -EDEADLK there too. */
typedef struct foreign {
  tko_pool *_Atomic pool;
  atomic_int wait0_rc, calls;
} foreign;

static int foreign_wait_task(void *arg) {
  foreign *f = arg;
  atomic_store(&f->wait0_rc, tko_pool_wait_idle(atomic_load(&f->pool), 0));
  atomic_fetch_add(&f->calls, 1);
  return 0;
}

static void foreign_wait_hook(void *user, const tko_task_info *t) {
  (void)t;
  foreign_wait_task(user);
}

Test(misuse, pool_calls_from_foreign_threads_running_its_tasks_get_edeadlk) {
  /* Caller-runs. */
  foreign f = {0};
  atomic_store(&f.wait0_rc, 1);
  tko_options o = tko_basic_options(1);
  o.queue_capacity = 1;
  o.full_policy = TKO_FULL_CALLER_RUNS;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  atomic_store(&f.pool, p);
  tt_pin pn = TT_PIN_INIT;
  cr_assert_eq(tko_submit(p, tt_pin_fn, &pn, 0), 0);
  cr_assert(tt_count_wait_geq(&pn.started, 1));
  cr_assert_eq(tko_submit(p, tt_nop_fn, NULL, 0), 0);       /* fills the queue */
  cr_assert_eq(tko_submit(p, foreign_wait_task, &f, 0), 0); /* runs right here */
  cr_assert_eq(atomic_load(&f.calls), 1);
  cr_assert_eq(atomic_load(&f.wait0_rc), -EDEADLK, "caller-runs task: wait_idle said %d",
               atomic_load(&f.wait0_rc));
  tt_gate_open(&pn.gate);
  cr_assert_eq(tko_pool_destroy(p), 0);

  /* on_cancel from tko_group_cancel on the test's thread. */
  foreign c = {0};
  atomic_store(&c.wait0_rc, 1);
  o = tko_basic_options(1);
  o.hooks.user = &c;
  o.hooks.on_cancel = foreign_wait_hook;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  atomic_store(&c.pool, p);
  tt_pin pn2 = TT_PIN_INIT;
  cr_assert_eq(tko_submit(p, tt_pin_fn, &pn2, 0), 0);
  cr_assert(tt_count_wait_geq(&pn2.started, 1));
  tko_group g;
  cr_assert_eq(tko_group_init(&g), 0);
  cr_assert_eq(tko_group_submit(p, &g, tt_nop_fn, NULL, 0), 0);
  cr_assert_eq(tko_group_cancel(&g), 1);
  cr_assert_eq(atomic_load(&c.wait0_rc), -EDEADLK, "on_cancel: wait_idle said %d",
               atomic_load(&c.wait0_rc));
  tt_gate_open(&pn2.gate);
  cr_assert_eq(tko_pool_destroy(p), 0);
  cr_assert_eq(tko_group_destroy(&g), 0);

  /* after_run of an async task completed on the test's thread. */
  foreign a = {0};
  atomic_store(&a.wait0_rc, 1);
  o = tko_basic_options(1);
  o.hooks.user = &a;
  o.hooks.after_run = foreign_wait_hook;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  atomic_store(&a.pool, p);
  held_op h = {NULL, TT_COUNT_INIT};
  cr_assert_eq(tko_submit_async(p, hold_async, &h, 0), 0);
  cr_assert(tt_count_wait_geq(&h.started, 1));
  cr_assert_eq(tko_async_complete(atomic_load(&h.op), 0), 0);
  cr_assert_eq(atomic_load(&a.wait0_rc), -EDEADLK, "async after_run: wait_idle said %d",
               atomic_load(&a.wait0_rc));
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* The destroy side of the bug above (fixed in 8f0737a too). It was: from a
 * caller-runs task, destroy returned 0 and freed the pool; run_here then
 * counted the task's end in the freed pool (ASan: heap-use-after-free in
 * tko__count / tko__run_item). The same from on_cancel under
 * tko_group_cancel (use after free in tko__cancel_item's count, then
 * group_cancel's next lock). */
typedef struct foreign_destroy {
  tko_pool *_Atomic pool;
  atomic_int rc;
} foreign_destroy;

static int destroy_own_task(void *arg) {
  foreign_destroy *d = arg;
  atomic_store(&d->rc, tko_pool_destroy(atomic_load(&d->pool)));
  return 0;
}

static void destroy_own_hook(void *user, const tko_task_info *t) {
  (void)t;
  destroy_own_task(user);
}

Test(misuse, destroy_from_a_caller_runs_task_is_edeadlk) {
  foreign_destroy d = {0};
  tko_options o = tko_basic_options(1);
  o.queue_capacity = 1;
  o.full_policy = TKO_FULL_CALLER_RUNS;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  atomic_store(&d.pool, p);
  tt_pin pn = TT_PIN_INIT;
  cr_assert_eq(tko_submit(p, tt_pin_fn, &pn, 0), 0);
  cr_assert(tt_count_wait_geq(&pn.started, 1));
  cr_assert_eq(tko_submit(p, tt_nop_fn, NULL, 0), 0);
  /* The queue is full while the worker is pinned: this one runs here. */
  cr_assert_eq(tko_submit(p, destroy_own_task, &d, 0), 0);
  cr_assert_eq(atomic_load(&d.rc), -EDEADLK);
  tt_gate_open(&pn.gate); /* else destroy would wait for the pinned task */
  cr_assert_eq(tko_pool_destroy(p), 0);
}

Test(misuse, destroy_from_on_cancel_under_group_cancel_is_edeadlk) {
  foreign_destroy d = {0};
  tko_options o = tko_basic_options(1);
  o.hooks.user = &d;
  o.hooks.on_cancel = destroy_own_hook;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  atomic_store(&d.pool, p);
  tt_pin pn = TT_PIN_INIT;
  cr_assert_eq(tko_submit(p, tt_pin_fn, &pn, 0), 0);
  cr_assert(tt_count_wait_geq(&pn.started, 1));
  tko_group g;
  cr_assert_eq(tko_group_init(&g), 0);
  cr_assert_eq(tko_group_submit(p, &g, tt_nop_fn, NULL, 0), 0);
  cr_assert_eq(tko_group_cancel(&g), 1); /* the member is still queued */
  cr_assert_eq(atomic_load(&d.rc), -EDEADLK);
  tt_gate_open(&pn.gate);
  cr_assert_eq(tko_pool_destroy(p), 0);
  cr_assert_eq(tko_group_destroy(&g), 0);
}

/* Regression, fixed in 8f0737a. It was: tko_pool_shutdown closes the timers first
 * (the timers' close joins the timer thread) and only then sets `closing`, resumes a paused pool
 * and wakes submitters blocked on a full bounded queue. A timer that fell due while the pool's
 * TKO_FULL_BLOCK queue was full and the pool was paused leaves the timer thread blocked in its
 * submit (wait_for_room), waiting for room or `closing` - neither of which comes before the join:
 * shutdown (and destroy) never return. Fix: set closing / wake the waiters (or let timer submits never
 * block: a timed or reject-style submit) before joining the timer thread. */
static pid_t thread_named(const char *name) {
  DIR *d = opendir("/proc/self/task");
  if (!d) return 0;
  pid_t found = 0;
  struct dirent *e;
  while (!found && (e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    char path[300], comm[64] = {0};
    snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    if (fgets(comm, sizeof comm, f)) comm[strcspn(comm, "\n")] = '\0';
    fclose(f);
    if (!strcmp(comm, name)) found = (pid_t)atoi(e->d_name);
  }
  closedir(d);
  return found;
}

static int shutdown_drain(void *arg) {
  return tko_pool_shutdown(arg, TKO_DRAIN);
}

Test(misuse, shutdown_returns_while_the_timer_thread_waits_for_room) {
  tko_options o = tko_basic_options(1);
  o.queue_capacity = 1;
  o.full_policy = TKO_FULL_BLOCK;
  o.name = "tkoblk";
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  cr_assert_eq(tko_pool_pause(p), 0);
  cr_assert_eq(tko_submit(p, tt_nop_fn, NULL, 0), 0); /* the queue is full */
  tko_timer t;
  tko_timer_init(&t);
  cr_assert_eq(tko_submit_after(p, &t, 0, tt_nop_fn, NULL, 0), 0);
  /* The timer thread names itself when it starts; once it sleeps, it is
   * blocked in the due timer's submit (its task is no longer armed). */
  pid_t tid = 0;
  uint64_t until = tt_now_ns() + 10ull * 1000000000u;
  while (!(tid = thread_named("tkoblk-t")) && tt_now_ns() < until)
    sched_yield();
  cr_assert_neq(tid, 0);
  cr_assert(tf_wait_thread_sleeping(tid));
  cr_assert_eq(tko_timer_cancel(&t), -ENOENT, "the timer has fired");
  tf_thread th;
  cr_assert_eq(tf_thread_start(&th, shutdown_drain, p), 0);
  int rc = 1;
  cr_assert(tf_thread_join_within(&th, 5000, &rc), "shutdown hangs joining the timer thread");
  cr_assert_eq(rc, 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* API gap: a caller-owned timer keeps a pointer to its pool after it stops
 * being armed (fired, cancelled, or disarmed by shutdown), and
 * tko_timer_cancel locks that pool's timer_mu. Cancelling a timer after its
 * pool was destroyed - a host tearing down in the "wrong" order - is a use
 * after free (ASan: heap-use-after-free in tko_timer_cancel). The header
 * does not say it is forbidden. Fix: clear the timer's pool pointer when
 * the pool disarms it at shutdown (and when it fires), so cancel answers
 * -ENOENT without touching the pool; or document that timers may not be
 * touched once their pool is destroyed. */
Test(misuse, cancelling_a_timer_after_its_pool_is_gone_is_harmless) {
  tko_options o = tko_basic_options(1);
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  tko_timer t;
  tko_timer_init(&t);
  cr_assert_eq(tko_submit_after(p, &t, 3600000, tt_nop_fn, NULL, 0), 0);
  cr_assert_eq(tko_pool_destroy(p), 0); /* disarms it */
  cr_assert_eq(tko_timer_cancel(&t), -ENOENT);
}
