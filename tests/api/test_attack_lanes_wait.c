/* SPDX-License-Identifier: MIT */
/* Attack scenes for tko_lanes_submit_wait through the public API only:
 * pool hooks that call it (on a caller run, on a runner, on a replacement
 * worker's thread_start), the lanes' on_cancel and a task on another key
 * (-EDEADLK), wait_idle against a chain of tasks a submit_wait caller started,
 * many threads mixing submit and submit_wait on colliding keys with odd keys
 * and extreme weights, races with close and cancel (exactly once, by return
 * code), and destroy right after every call returned. Tasks record; the test
 * thread checks. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

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

static int count_fn(void *arg) {
  atomic_fetch_add((atomic_int *)arg, 1);
  return 0;
}

/* ---- pool hooks that call submit_wait ---------------------------------- */

typedef struct hooked {
  tko_lanes *l;
  uint64_t key;
  atomic_int armed;
  atomic_int rc, calls, ran;
  tt_count done;
} hooked;

static void hook_call(hooked *h) {
  if (!atomic_exchange(&h->armed, 0)) return;
  atomic_store(&h->rc, tko_lanes_submit_wait(h->l, h->key, count_fn, &h->ran, 0));
  atomic_fetch_add(&h->calls, 1);
  tt_count_add(&h->done, 1);
}

static void before_run_hook(void *user, const tko_task_info *t) {
  (void)t;
  hook_call(user);
}

static void thread_start_hook(void *user, unsigned index, tko_worker_kind kind) {
  (void)index;
  (void)kind;
  hook_call(user);
}

typedef struct outer {
  hooked *h;
  int rc;
  tt_count done;
} outer;

static void *outer_thread(void *arg) {
  outer *o = arg;
  o->rc = tko_lanes_submit_wait(o->h->l, o->h->key, count_fn, &o->h->ran, 0);
  tt_count_add(&o->done, 1);
  return NULL;
}

/* A before_run hook that runs for a lane task run on its submit_wait caller
 * calls submit_wait on that same, held lane: it must not wait for itself. */
Test(attack_lanes_wait, a_before_run_hook_on_a_caller_run_does_not_wait_for_its_own_lane) {
  static hooked h;
  memset(&h, 0, sizeof h);
  tt_count_init(&h.done);
  h.key = 5;
  tko_options po = tko_basic_options(2);
  po.hooks.before_run = before_run_hook;
  po.hooks.user = &h;
  tko_pool *p = NULL;
  cr_assert_eq(tko_pool_create(&p, &po), 0);
  cr_assert_eq(tko_lanes_create(&h.l, p, NULL), 0);
  atomic_store(&h.armed, 1);
  static outer o;
  memset(&o, 0, sizeof o);
  o.h = &h;
  o.rc = 1;
  tt_count_init(&o.done);
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, outer_thread, &o), 0);
  cr_assert(tt_count_wait_geq_within(&o.done, 1, 20000), "the outer submit_wait hangs");
  pthread_join(t, NULL);
  cr_assert_eq(o.rc, 0);
  if (atomic_load(&h.calls) == 1) {
    int rc = atomic_load(&h.rc);
    cr_assert(rc == -EDEADLK || rc == -EBUSY || rc == 0, "hook call rc %d", rc);
  }
  cr_assert_eq(tko_lanes_wait_idle(h.l, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&h.ran), 1 + (atomic_load(&h.rc) == 0 && atomic_load(&h.calls) == 1));
  cr_assert_eq(tko_lanes_destroy(h.l), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* A before_run hook on the only worker, for the runner of key K, calls
 * submit_wait on K: the lane is busy with the runner about to start there. */
Test(attack_lanes_wait, a_before_run_hook_of_a_runner_gets_ebusy_on_its_lane) {
  static hooked h;
  memset(&h, 0, sizeof h);
  tt_count_init(&h.done);
  h.key = 9;
  tko_options po = tko_basic_options(1);
  po.hooks.before_run = before_run_hook;
  po.hooks.user = &h;
  tko_pool *p = NULL;
  cr_assert_eq(tko_pool_create(&p, &po), 0);
  cr_assert_eq(tko_lanes_create(&h.l, p, NULL), 0);
  atomic_int first = 0;
  atomic_store(&h.armed, 1);
  cr_assert_eq(tko_lanes_submit(h.l, h.key, count_fn, &first, 0), 0);
  cr_assert(tt_count_wait_geq_within(&h.done, 1, 20000), "the hook's submit_wait hangs");
  cr_assert_eq(atomic_load(&h.rc), -EBUSY);
  cr_assert_eq(tko_lanes_wait_idle(h.l, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&first), 1);
  cr_assert_eq(atomic_load(&h.ran), 0, "nothing was queued");
  tko_lane_stats s;
  tko_lanes_stats(h.l, &s);
  cr_assert_eq(s.submitted, 1);
  cr_assert_eq(s.completed, 1);
  cr_assert_eq(tko_lanes_destroy(h.l), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* The only worker ends its thread in a pool task after queuing a lane task
 * (its runner waits in the queue); the replacement worker's thread_start
 * calls submit_wait on that busy lane. Nobody else can run the runner. */
typedef struct exiter {
  hooked *h;
  atomic_int first;
} exiter;

static int exit_fn(void *arg) {
  exiter *e = arg;
  atomic_store(&e->h->armed, 1);
  if (tko_lanes_submit(e->h->l, e->h->key, count_fn, &e->first, 0) != 0) return 1;
  pthread_exit(NULL);
}

Test(attack_lanes_wait, a_thread_start_hook_of_a_replacement_worker_does_not_wait_on_a_busy_lane) {
  static hooked h;
  memset(&h, 0, sizeof h);
  tt_count_init(&h.done);
  h.key = 11;
  tko_options po = tko_basic_options(1);
  po.hooks.thread_start = thread_start_hook;
  po.hooks.user = &h;
  tko_pool *p = NULL;
  cr_assert_eq(tko_pool_create(&p, &po), 0);
  cr_assert_eq(tko_lanes_create(&h.l, p, NULL), 0);
  static exiter e;
  memset(&e, 0, sizeof e);
  e.h = &h;
  cr_assert_eq(tko_submit(p, exit_fn, &e, 0), 0);
  cr_assert(tt_count_wait_geq_within(&h.done, 1, 20000),
            "the replacement worker waits in thread_start for a runner only it can run");
  int rc = atomic_load(&h.rc);
  cr_assert(rc == -EBUSY || rc == 0, "rc %d", rc);
  cr_assert_eq(tko_lanes_wait_idle(h.l, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&e.first), 1);
  cr_assert_eq(atomic_load(&h.ran), rc == 0 ? 1 : 0);
  cr_assert_eq(tko_lanes_destroy(h.l), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* ---- -EDEADLK from on_cancel and from a task on another key ------------- */

typedef struct reenter {
  tko_lanes *l;
  atomic_int cancels, rc_first, rcs_bad, ran;
} reenter;


static void reenter_cancel(void *user, const tko_lane_task *t) {
  (void)t;
  reenter *r = user;
  int rc = tko_lanes_submit_wait(r->l, 1000 + (uint64_t)atomic_load(&r->cancels), count_fn, &r->ran, 0);
  if (atomic_fetch_add(&r->cancels, 1) == 0) atomic_store(&r->rc_first, rc);
  if (rc != -EDEADLK) atomic_fetch_add(&r->rcs_bad, 1);
}

static void on_cancel_scene(bool by_shutdown) {
  tko_pool *p = make_pool(1);
  static reenter r;
  memset(&r, 0, sizeof r);
  tko_lane_options o = tko_lane_default_options();
  o.user = &r;
  o.on_cancel = reenter_cancel;
  cr_assert_eq(tko_lanes_create(&r.l, p, &o), 0);
  cr_assert_eq(tko_pool_pause(p), 0);
  atomic_int ran = 0;
  for (int i = 0; i < 3; i++) cr_assert_eq(tko_lanes_submit(r.l, 7, count_fn, &ran, 0), 0);
  if (by_shutdown)
    cr_assert_eq(tko_pool_shutdown(p, TKO_CANCEL), 0);
  else
    cr_assert_eq(tko_lanes_cancel(r.l), 0);
  cr_assert_eq(atomic_load(&r.cancels), 3);
  cr_assert_eq(atomic_load(&r.rcs_bad), 0, "first rc %d", atomic_load(&r.rc_first));
  cr_assert_eq(atomic_load(&ran), 0);
  cr_assert_eq(atomic_load(&r.ran), 0);
  tko_lane_stats s;
  tko_lanes_stats(r.l, &s);
  cr_assert_eq(s.submitted, 3);
  cr_assert_eq(s.cancelled, 3);
  cr_assert_eq(s.queued, 0);
  cr_assert_eq(tko_lanes_destroy(r.l), 0);
  if (!by_shutdown) cr_assert_eq(tko_pool_resume(p), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

Test(attack_lanes_wait, on_cancel_from_lanes_cancel_gets_edeadlk) { on_cancel_scene(false); }
Test(attack_lanes_wait, on_cancel_from_a_cancel_shutdown_gets_edeadlk) { on_cancel_scene(true); }

static int other_key_fn(void *arg) {
  reenter *r = arg;
  int rc = tko_lanes_submit_wait(r->l, 424242, count_fn, &r->ran, 0);
  if (rc != -EDEADLK) atomic_fetch_add(&r->rcs_bad, 1);
  atomic_fetch_add(&r->cancels, 1);
  return 0;
}

static void other_key_batch(void *user, const tko_lane_batch *b) {
  (void)b;
  other_key_fn(user);
}

/* From a task (on a worker and on a submit_wait caller) and from a batch
 * callback, submit_wait on another key of the same table is -EDEADLK, also
 * with one lane (the other key shares it) and max_drain 1. */
Test(attack_lanes_wait, a_task_or_batch_calling_submit_wait_on_another_key_gets_edeadlk) {
  tko_pool *p = make_pool(2);
  for (int mode = 0; mode < 4; mode++) {
    static reenter r;
    memset(&r, 0, sizeof r);
    tko_lane_options o = tko_lane_default_options();
    o.lanes = mode & 1 ? 1 : 64;
    o.max_drain = 1;
    if (mode & 2) {
      o.batch = other_key_batch;
      o.user = &r;
    }
    cr_assert_eq(tko_lanes_create(&r.l, p, &o), 0);
    cr_assert_eq(tko_lanes_submit(r.l, 1, other_key_fn, &r, 0), 0);
    cr_assert_eq(tko_lanes_wait_idle(r.l, TT_LONG_MS), 0);
    cr_assert_eq(tko_lanes_submit_wait(r.l, 2, other_key_fn, &r, 0), 0);
    cr_assert_eq(atomic_load(&r.cancels), 2);
    cr_assert_eq(atomic_load(&r.rcs_bad), 0);
    cr_assert_eq(atomic_load(&r.ran), 0);
    tko_lane_stats s;
    tko_lanes_stats(r.l, &s);
    cr_assert_eq(s.submitted, 2);
    cr_assert_eq(s.completed, 2);
    cr_assert_eq(tko_lanes_destroy(r.l), 0);
  }
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* ---- wait_idle never sees idle in a chain a caller started --------------- */

enum { CHAIN = 200 };

typedef struct chain {
  tko_lanes *l;
  unsigned spread; /* keys the chain walks over */
  atomic_int started, done, fails;
  atomic_int runs[CHAIN];
  int idx[CHAIN];
} chain;

static chain *chn;

static int chain_fn(void *arg) {
  int n = *(int *)arg;
  chain *c = chn;
  atomic_store(&c->started, 1);
  atomic_fetch_add(&c->runs[n], 1);
  if (n + 1 < CHAIN &&
      tko_lanes_submit(c->l, (uint64_t)(n + 1) % c->spread * 0x9e3779b97f4a7c15ull, chain_fn,
                       &c->idx[n + 1], n) != 0)
    atomic_fetch_add(&c->fails, 1);
  atomic_fetch_add(&c->done, 1);
  return 0;
}

static void chain_batch(void *user, const tko_lane_batch *b) {
  (void)user;
  for (size_t i = 0; i < b->count; i++) chain_fn(b->tasks[i].arg);
}

static void *chain_thread(void *arg) {
  chain *c = arg;
  if (tko_lanes_submit_wait(c->l, 0, chain_fn, &c->idx[0], 0) != 0) atomic_fetch_add(&c->fails, 1);
  return NULL;
}

/* Each task queues the next before it returns, so no moment between the
 * first task's start and the last one's end is idle: a wait_idle begun after
 * the first started returns only when all have run. */
Test(attack_lanes_wait, wait_idle_waits_for_a_chain_a_submit_wait_caller_started) {
  tko_pool *p = make_pool(2);
  int rounds = TT_SCALE(40, 8);
  for (int i = 0; i < rounds; i++) {
    static chain c;
    memset(&c, 0, sizeof c);
    chn = &c;
    for (int k = 0; k < CHAIN; k++) c.idx[k] = k;
    c.spread = (unsigned)(i % 3 == 0 ? 1 : i % 3 == 1 ? 2 : 7);
    tko_lane_options o = tko_lane_default_options();
    o.max_drain = (unsigned)(i % 4 == 0 ? 1 : i % 4 == 1 ? 2 : 32);
    o.lanes = i % 5 == 0 ? 1 : 16;
    if (i % 6 == 5) {
      o.batch = chain_batch;
      o.user = &c;
    }
    cr_assert_eq(tko_lanes_create(&c.l, p, &o), 0);
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, chain_thread, &c), 0);
    while (!atomic_load(&c.started)) sched_yield();
    int rc = tko_lanes_wait_idle(c.l, TT_LONG_MS);
    int done = atomic_load(&c.done);
    tko_lane_stats s;
    tko_lanes_stats(c.l, &s);
    pthread_join(t, NULL);
    cr_assert_eq(rc, 0);
    cr_assert_eq(done, CHAIN, "round %d: wait_idle returned with %d of %d run", i, done, CHAIN);
    for (int k = 0; k < CHAIN; k++) cr_assert_eq(atomic_load(&c.runs[k]), 1);
    cr_assert_eq(s.submitted, CHAIN);
    cr_assert_eq(s.completed, CHAIN);
    cr_assert_eq(s.queued, 0);
    cr_assert_eq(atomic_load(&c.fails), 0);
    cr_assert_eq(tko_lanes_destroy(c.l), 0);
  }
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* ---- mixed submitters: order, exclusion, exactly once, stats ------------ */

enum { MT = 6, MKEYS = 5, MPER = 300 };

static const uint64_t mkeys[MKEYS] = {0, 1, UINT64_MAX, 0x8000000000000000ull, 0xdeadbeefcafef00dull};
static const int mweights[4] = {INT_MIN, -1, 0, INT_MAX};

typedef struct mixed {
  tko_lanes *l;
  unsigned nlanes;
  atomic_int in_lane[64];
  atomic_int overlap, disorder, ran, bad_rc;
  int last[MT][MKEYS];
  atomic_int runs[MT][MPER];
  uint64_t accepted[MT];
} mixed;

static mixed *mx;

typedef struct mtask {
  unsigned thread, key, seq;
} mtask;

static mtask mtasks[MT][MPER];

static int mixed_fn(void *arg) {
  mtask *t = arg;
  unsigned lane = tko_lanes_index(mx->l, mkeys[t->key]);
  if (atomic_fetch_add(&mx->in_lane[lane % 64], 1) != 0) atomic_fetch_add(&mx->overlap, 1);
  if ((int)t->seq <= mx->last[t->thread][t->key]) atomic_fetch_add(&mx->disorder, 1);
  mx->last[t->thread][t->key] = (int)t->seq;
  atomic_fetch_add(&mx->runs[t->thread][t->seq], 1);
  atomic_fetch_add(&mx->ran, 1);
  atomic_fetch_sub(&mx->in_lane[lane % 64], 1);
  return 0;
}

static void *mixed_thread(void *arg) {
  unsigned me = (unsigned)(uintptr_t)arg;
  uint64_t seed = me * 7919u + 1;
  for (unsigned i = 0; i < MPER; i++) {
    mtask *t = &mtasks[me][i];
    t->thread = me;
    t->seq = i;
    t->key = (unsigned)(tt_rand(&seed) % MKEYS);
    int w = mweights[tt_rand(&seed) % 4];
    int rc = tt_rand(&seed) % 2 ? tko_lanes_submit_wait(mx->l, mkeys[t->key], mixed_fn, t, w)
                                : tko_lanes_submit(mx->l, mkeys[t->key], mixed_fn, t, w);
    if (rc != 0) atomic_fetch_add(&mx->bad_rc, 1);
    else mx->accepted[me]++;
  }
  return NULL;
}

Test(attack_lanes_wait, mixed_submitters_on_colliding_odd_keys_keep_order_exclusion_and_stats) {
  tko_pool *p = make_pool(3);
  for (int mode = 0; mode < 3; mode++) {
    static mixed m;
    memset(&m, 0, sizeof m);
    mx = &m;
    for (int t = 0; t < MT; t++)
      for (int k = 0; k < MKEYS; k++) m.last[t][k] = -1;
    tko_lane_options o = tko_lane_default_options();
    o.lanes = mode == 0 ? 1 : mode == 1 ? 2 : 64;
    o.max_drain = mode == 2 ? 3 : 1;
    cr_assert_eq(tko_lanes_create(&m.l, p, &o), 0);
    pthread_t th[MT];
    for (uintptr_t t = 0; t < MT; t++)
      cr_assert_eq(pthread_create(&th[t], NULL, mixed_thread, (void *)t), 0);
    for (int t = 0; t < MT; t++) pthread_join(th[t], NULL);
    cr_assert_eq(tko_lanes_wait_idle(m.l, TT_LONG_MS), 0);
    cr_assert_eq(atomic_load(&m.bad_rc), 0);
    cr_assert_eq(atomic_load(&m.overlap), 0, "two tasks of one lane ran at once");
    cr_assert_eq(atomic_load(&m.disorder), 0, "one thread's tasks of a key ran out of order");
    cr_assert_eq(atomic_load(&m.ran), MT * MPER);
    for (int t = 0; t < MT; t++)
      for (int i = 0; i < MPER; i++) cr_assert_eq(atomic_load(&m.runs[t][i]), 1);
    tko_lane_stats s;
    tko_lanes_stats(m.l, &s);
    cr_assert_eq(s.submitted, (uint64_t)MT * MPER);
    cr_assert_eq(s.completed, s.submitted);
    cr_assert_eq(s.cancelled, 0);
    cr_assert_eq(s.queued, 0);
    cr_assert_eq(s.failed, 0);
    cr_assert_leq(s.visits, s.completed);
    cr_assert_geq(s.visits * o.max_drain, s.completed);
    cr_assert_leq(s.max_batch, o.max_drain);
    cr_assert_geq(s.max_batch, 1);
    cr_assert_leq(s.lanes_used, o.lanes);
    cr_assert_geq(s.lanes_used, 1);
    cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
    tko_stats ps;
    tko_pool_stats(p, &ps);
    cr_assert_eq(ps.running, 0);
    cr_assert_eq(ps.queued, 0);
    cr_assert_eq(ps.submitted, ps.completed + ps.cancelled);
    cr_assert_eq(tko_lanes_destroy(m.l), 0);
  }
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* ---- close and cancel racing submit_wait: accounted by return code ------ */

enum { RT = 4, RPER = 200 };

typedef struct racer {
  tko_lanes *l;
  atomic_int runs[RT][RPER];
  atomic_int cancels[RT][RPER];
  int rc[RT][RPER];
  int ran_at_return[RT][RPER], cancelled_at_return[RT][RPER];
  atomic_int go;
} racer;

static racer *rc_;

static int racer_fn(void *arg) {
  atomic_fetch_add((atomic_int *)arg, 1);
  return 0;
}

static void racer_cancel(void *user, const tko_lane_task *t) {
  racer *r = user;
  ptrdiff_t at = (atomic_int *)t->arg - &r->runs[0][0];
  atomic_fetch_add(&r->cancels[at / RPER][at % RPER], 1);
}

static void *racer_thread(void *arg) {
  unsigned me = (unsigned)(uintptr_t)arg;
  while (!atomic_load(&rc_->go)) sched_yield();
  for (unsigned i = 0; i < RPER; i++) {
    uint64_t key = (i + me) % 3;
    rc_->rc[me][i] = (i + me) % 2 ? tko_lanes_submit_wait(rc_->l, key, racer_fn, &rc_->runs[me][i], 0)
                                  : tko_lanes_submit(rc_->l, key, racer_fn, &rc_->runs[me][i], 0);
    rc_->ran_at_return[me][i] = atomic_load(&rc_->runs[me][i]);
    rc_->cancelled_at_return[me][i] = atomic_load(&rc_->cancels[me][i]);
  }
  return NULL;
}

static void race_scene(int how) {
  tko_pool *p = make_pool(2);
  static racer r;
  memset(&r, 0, sizeof r);
  rc_ = &r;
  tko_lane_options o = tko_lane_default_options();
  o.on_cancel = racer_cancel;
  o.user = &r;
  o.max_drain = 2;
  cr_assert_eq(tko_lanes_create(&r.l, p, &o), 0);
  pthread_t th[RT];
  for (uintptr_t t = 0; t < RT; t++) cr_assert_eq(pthread_create(&th[t], NULL, racer_thread, (void *)t), 0);
  atomic_store(&r.go, 1);
  /* let some calls in first, then race */
  tko_lane_stats s;
  do {
    sched_yield();
    tko_lanes_stats(r.l, &s);
  } while (s.submitted < RT * RPER / 4);
  if (how == 0)
    cr_assert_eq(tko_lanes_close(r.l), 0);
  else if (how == 1)
    cr_assert_eq(tko_lanes_cancel(r.l), 0);
  else if (how == 2)
    cr_assert_eq(tko_pool_shutdown(p, TKO_CANCEL), 0);
  else if (how == 3)
    cr_assert_eq(tko_pool_shutdown(p, TKO_CANCEL_NOWAIT), 0);
  else {
    int rc = tko_pool_shutdown_timed(p, TKO_DRAIN, 0);
    cr_assert(rc == 0 || rc == -ETIMEDOUT, "rc %d", rc);
    cr_assert_eq(tko_pool_shutdown(p, TKO_CANCEL), 0);
  }
  for (int t = 0; t < RT; t++) pthread_join(th[t], NULL);
  if (how < 2) cr_assert_eq(tko_lanes_wait_idle(r.l, TT_LONG_MS), 0);
  /* a NOWAIT shutdown returns while runners still finish their lanes:
   * destroy waits for them */
  cr_assert_eq(tko_lanes_destroy(r.l), 0);
  uint64_t accepted = 0, ran = 0, cancelled = 0;
  for (int t = 0; t < RT; t++)
    for (int i = 0; i < RPER; i++) {
      int rc = r.rc[t][i], runs = atomic_load(&r.runs[t][i]), cancels = atomic_load(&r.cancels[t][i]);
      bool waited = (i + t) % 2;
      cr_assert(rc == 0 || rc == -ESHUTDOWN || (waited && rc == -ECANCELED), "rc %d", rc);
      if (rc == -ESHUTDOWN) cr_assert(runs == 0 && cancels == 0);
      if (rc == 0 && waited) cr_assert(runs == 1 && cancels == 0 && r.ran_at_return[t][i] == 1);
      if (rc == -ECANCELED) cr_assert(runs == 0 && cancels == 1 && r.cancelled_at_return[t][i] == 1);
      if (rc == 0 && !waited) cr_assert_eq(runs + cancels, 1);
      if (rc != -ESHUTDOWN) accepted++;
      ran += (uint64_t)runs;
      cancelled += (uint64_t)cancels;
    }
  cr_assert_eq(accepted, ran + cancelled);
  if (how == 0) cr_assert_eq(cancelled, 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

Test(attack_lanes_wait, close_racing_submit_and_submit_wait_runs_every_accepted_task_once) {
  for (int i = 0; i < TT_SCALE(10, 3); i++) race_scene(0);
}
Test(attack_lanes_wait, cancel_racing_submit_and_submit_wait_accounts_every_task_once) {
  for (int i = 0; i < TT_SCALE(10, 3); i++) race_scene(1);
}
Test(attack_lanes_wait, cancel_shutdown_racing_submit_and_submit_wait_accounts_every_task_once) {
  for (int i = 0; i < TT_SCALE(10, 3); i++) race_scene(2);
}
Test(attack_lanes_wait, nowait_shutdown_racing_submit_and_submit_wait_accounts_every_task_once) {
  for (int i = 0; i < TT_SCALE(10, 3); i++) race_scene(3);
}
Test(attack_lanes_wait, timed_drain_then_cancel_racing_submit_and_submit_wait_accounts_every_task_once) {
  for (int i = 0; i < TT_SCALE(10, 3); i++) race_scene(4);
}

/* ---- destroy right after every submit_wait returned --------------------- */

enum { DT = 4, DPER = 50 };

typedef struct dscene {
  tko_lanes *l;
  atomic_int ran, bad;
} dscene;

static void *dthread(void *arg) {
  dscene *d = arg;
  for (int i = 0; i < DPER; i++)
    if (tko_lanes_submit_wait(d->l, (uint64_t)(i % 2), count_fn, &d->ran, 0) != 0) atomic_fetch_add(&d->bad, 1);
  return NULL;
}

/* Busy-lane waiters are woken by a runner, or ran others' tasks on their own
 * thread and handed the rest on: destroy (and the pool's destroy) right after
 * the last call returned must neither hang nor touch freed memory. */
Test(attack_lanes_wait, destroy_right_after_every_submit_wait_returned) {
  for (int round = 0; round < TT_SCALE(60, 15); round++) {
    tko_pool *p = make_pool(round % 2 ? 1 : 2);
    dscene d = {.ran = 0, .bad = 0};
    tko_lane_options o = tko_lane_default_options();
    o.max_drain = round % 3 == 0 ? 1 : 4;
    o.lanes = 1;
    cr_assert_eq(tko_lanes_create(&d.l, p, &o), 0);
    pthread_t th[DT];
    for (int t = 0; t < DT; t++) cr_assert_eq(pthread_create(&th[t], NULL, dthread, &d), 0);
    for (int t = 0; t < DT; t++) pthread_join(th[t], NULL);
    cr_assert_eq(atomic_load(&d.ran), DT * DPER, "each call returned after its task ran");
    cr_assert_eq(tko_lanes_destroy(d.l), 0);
    cr_assert_eq(tko_pool_destroy(p), 0);
    cr_assert_eq(atomic_load(&d.bad), 0);
  }
}

/* ---- a paused pool and bounded pools ----------------------------------- */

typedef struct appender {
  tko_lanes *l;
  atomic_int ran, fails;
  int rc;
} appender;

static int append_fn(void *arg) {
  appender *a = arg;
  for (int i = 0; i < 3; i++)
    if (tko_lanes_submit(a->l, 1, count_fn, &a->ran, 0) != 0) atomic_fetch_add(&a->fails, 1);
  atomic_fetch_add(&a->ran, 1);
  return 0;
}

/* On a paused pool an idle lane runs on its caller (own task plus max_drain
 * - 1 appended), the rest waits for a runner in the paused pool: wait_idle
 * times out, not idle; resume runs the rest. */
Test(attack_lanes_wait, a_paused_pool_runs_the_callers_visit_and_holds_the_rest) {
  tko_pool *p = make_pool(1);
  appender a = {.ran = 0, .fails = 0};
  tko_lane_options o = tko_lane_default_options();
  o.max_drain = 2;
  cr_assert_eq(tko_lanes_create(&a.l, p, &o), 0);
  cr_assert_eq(tko_pool_pause(p), 0);
  cr_assert_eq(tko_lanes_submit_wait(a.l, 1, append_fn, &a, 0), 0);
  cr_assert_eq(atomic_load(&a.ran), 2, "own task and one appended");
  cr_assert_eq(tko_lanes_wait_idle(a.l, 0), -ETIMEDOUT);
  tko_lane_stats s;
  tko_lanes_stats(a.l, &s);
  cr_assert_eq(s.submitted, 4);
  cr_assert_eq(s.completed, 2);
  cr_assert_eq(s.queued, 2);
  cr_assert_eq(tko_pool_resume(p), 0);
  cr_assert_eq(tko_lanes_wait_idle(a.l, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&a.ran), 4);
  cr_assert_eq(atomic_load(&a.fails), 0);
  cr_assert_eq(tko_lanes_destroy(a.l), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

static void *wait_append_thread(void *arg) {
  appender *a = arg;
  a->rc = tko_lanes_submit_wait(a->l, 1, append_fn, a, 0);
  return NULL;
}

/* A bounded pool whose only worker is pinned and whose queue is full: the
 * caller runs its idle lane's visit, then must queue a runner for the rest. */
static void bounded_scene(tko_full_policy policy) {
  tko_options po = tko_basic_options(1);
  po.queue_capacity = 1;
  po.full_policy = policy;
  tko_pool *p = NULL;
  cr_assert_eq(tko_pool_create(&p, &po), 0);
  static tt_pin pin;
  pin = (tt_pin)TT_PIN_INIT;
  cr_assert_eq(tko_submit(p, tt_pin_fn, &pin, 0), 0);
  cr_assert(tt_count_wait_geq(&pin.started, 1));
  atomic_int filler = 0;
  cr_assert_eq(tko_submit(p, count_fn, &filler, 0), 0);
  static appender a;
  memset(&a, 0, sizeof a);
  tko_lane_options o = tko_lane_default_options();
  o.max_drain = 1;
  cr_assert_eq(tko_lanes_create(&a.l, p, &o), 0);
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, wait_append_thread, &a), 0);
  /* the caller may wait for room for its runner: free the worker once the
   * caller's own task ran */
  while (atomic_load(&a.ran) < 1) sched_yield();
  tt_gate_open(&pin.gate);
  pthread_join(t, NULL);
  cr_assert_eq(a.rc, 0);
  cr_assert_eq(tko_lanes_wait_idle(a.l, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&a.ran), 4);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&filler), 1);
  cr_assert_eq(atomic_load(&a.fails), 0);
  tko_lane_stats s;
  tko_lanes_stats(a.l, &s);
  cr_assert_eq(s.completed, s.submitted);
  cr_assert_eq(s.queued, 0);
  cr_assert_eq(tko_lanes_destroy(a.l), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

Test(attack_lanes_wait, a_full_caller_runs_pool_runs_the_visit_and_queues_the_rest) {
  bounded_scene(TKO_FULL_CALLER_RUNS);
}
Test(attack_lanes_wait, a_full_blocking_pool_runs_the_visit_and_queues_the_rest) {
  bounded_scene(TKO_FULL_BLOCK);
}

/* ---- what the caller's own task does to its table and pool ------------- */

typedef struct selfish {
  tko_lanes *l;
  tko_pool *p;
  int what;
  atomic_int ran, cancels, fails, own;
  int rc_act;
  tt_count started;
  tt_gate release;
} selfish;

enum { ACT_CLOSE, ACT_CANCEL, ACT_MAXQ, ACT_WAIT_SHUTDOWN };

static void selfish_cancel(void *user, const tko_lane_task *t) {
  (void)t;
  atomic_fetch_add(&((selfish *)user)->cancels, 1);
}

static int selfish_fn(void *arg) {
  selfish *s = arg;
  atomic_fetch_add(&s->own, 1);
  for (int i = 0; i < 3; i++)
    if (tko_lanes_submit(s->l, 1, count_fn, &s->ran, 0) != 0) atomic_fetch_add(&s->fails, 1);
  if (s->what == ACT_CLOSE) s->rc_act = tko_lanes_close(s->l);
  if (s->what == ACT_CANCEL) s->rc_act = tko_lanes_cancel(s->l);
  if (s->what == ACT_WAIT_SHUTDOWN) {
    tt_count_add(&s->started, 1);
    tt_gate_wait(&s->release);
  }
  return 0;
}

/* The caller's own task appends three to its lane (max_drain 1, so they
 * must go to a runner) and closes the table: queued tasks still run. */
Test(attack_lanes_wait, a_close_from_the_callers_own_task_still_runs_what_it_appended) {
  tko_pool *p = make_pool(1);
  static selfish s;
  memset(&s, 0, sizeof s);
  s.what = ACT_CLOSE;
  tko_lane_options o = tko_lane_default_options();
  o.max_drain = 1;
  cr_assert_eq(tko_lanes_create(&s.l, p, &o), 0);
  cr_assert_eq(tko_lanes_submit_wait(s.l, 1, selfish_fn, &s, 0), 0);
  cr_assert_eq(s.rc_act, 0);
  cr_assert_eq(tko_lanes_wait_idle(s.l, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&s.ran), 3);
  cr_assert_eq(atomic_load(&s.fails), 0);
  tko_lane_stats st;
  tko_lanes_stats(s.l, &st);
  cr_assert_eq(st.submitted, 4);
  cr_assert_eq(st.completed, 4);
  cr_assert_eq(st.queued, 0);
  cr_assert_eq(tko_lanes_submit_wait(s.l, 1, count_fn, &s.ran, 0), -ESHUTDOWN);
  cr_assert_eq(tko_lanes_destroy(s.l), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* Same, cancelling: what it appended goes to on_cancel, once each. */
Test(attack_lanes_wait, a_cancel_from_the_callers_own_task_cancels_what_it_appended) {
  tko_pool *p = make_pool(1);
  static selfish s;
  memset(&s, 0, sizeof s);
  s.what = ACT_CANCEL;
  tko_lane_options o = tko_lane_default_options();
  o.max_drain = 4;
  o.on_cancel = selfish_cancel;
  o.user = &s;
  cr_assert_eq(tko_lanes_create(&s.l, p, &o), 0);
  cr_assert_eq(tko_lanes_submit_wait(s.l, 1, selfish_fn, &s, 0), 0);
  cr_assert_eq(s.rc_act, 0);
  cr_assert_eq(tko_lanes_wait_idle(s.l, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&s.ran) + atomic_load(&s.cancels), 3);
  cr_assert_eq(atomic_load(&s.cancels), 3, "the three were queued at the cancel");
  tko_lane_stats st;
  tko_lanes_stats(s.l, &st);
  cr_assert_eq(st.submitted, 4);
  cr_assert_eq(st.completed, 1);
  cr_assert_eq(st.cancelled, 3);
  cr_assert_eq(st.queued, 0);
  cr_assert_eq(tko_lanes_destroy(s.l), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* max_queued counts queued tasks: the caller's own task runs, it is not
 * queued, so a lane of max_queued 3 takes its three appends. */
Test(attack_lanes_wait, the_callers_running_task_does_not_count_against_max_queued) {
  tko_pool *p = make_pool(1);
  static selfish s;
  memset(&s, 0, sizeof s);
  s.what = ACT_MAXQ;
  tko_lane_options o = tko_lane_default_options();
  o.max_drain = 1;
  o.max_queued = 3;
  cr_assert_eq(tko_lanes_create(&s.l, p, &o), 0);
  cr_assert_eq(tko_lanes_submit_wait(s.l, 1, selfish_fn, &s, 0), 0);
  cr_assert_eq(atomic_load(&s.fails), 0);
  cr_assert_eq(tko_lanes_wait_idle(s.l, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&s.ran), 3);
  cr_assert_eq(tko_lanes_destroy(s.l), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

static void *selfish_thread(void *arg) {
  selfish *s = arg;
  s->rc_act = tko_lanes_submit_wait(s->l, 1, selfish_fn, s, 0);
  return NULL;
}

/* A pool shutdown begun while the caller's own task runs (its appends wait
 * for it, max_drain 1): the shutdown waits for the caller; every append runs
 * (DRAIN) or reaches on_cancel (CANCEL), once. */
static void shutdown_during_own(tko_shutdown_mode mode, bool timed_first) {
  static selfish s;
  memset(&s, 0, sizeof s);
  s.what = ACT_WAIT_SHUTDOWN;
  tt_count_init(&s.started);
  s.release = (tt_gate)TT_GATE_INIT;
  s.p = make_pool(1);
  tko_lane_options o = tko_lane_default_options();
  o.max_drain = 1;
  o.on_cancel = selfish_cancel;
  o.user = &s;
  cr_assert_eq(tko_lanes_create(&s.l, s.p, &o), 0);
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, selfish_thread, &s), 0);
  cr_assert(tt_count_wait_geq(&s.started, 1));
  if (timed_first) cr_assert_eq(tko_pool_shutdown_timed(s.p, mode, 0), -ETIMEDOUT);
  tt_gate_open(&s.release);
  cr_assert_eq(tko_pool_shutdown(s.p, mode), 0);
  pthread_join(t, NULL);
  cr_assert_eq(s.rc_act, 0);
  cr_assert_eq(atomic_load(&s.own), 1);
  cr_assert_eq(atomic_load(&s.fails), 0);
  cr_assert_eq(atomic_load(&s.ran) + atomic_load(&s.cancels), 3);
  if (mode == TKO_DRAIN) cr_assert_eq(atomic_load(&s.ran), 3);
  tko_lane_stats st;
  tko_lanes_stats(s.l, &st);
  cr_assert_eq(st.submitted, 4);
  cr_assert_eq(st.completed + st.cancelled, 4);
  cr_assert_eq(st.queued, 0);
  cr_assert_eq(tko_lanes_wait_idle(s.l, TT_LONG_MS), 0);
  cr_assert_eq(tko_lanes_destroy(s.l), 0);
  cr_assert_eq(tko_pool_destroy(s.p), 0);
}

Test(attack_lanes_wait, a_drain_shutdown_during_the_callers_task_runs_its_appends) {
  shutdown_during_own(TKO_DRAIN, false);
}
Test(attack_lanes_wait, a_cancel_shutdown_during_the_callers_task_accounts_its_appends) {
  shutdown_during_own(TKO_CANCEL, false);
}
Test(attack_lanes_wait, a_timed_out_drain_then_drain_during_the_callers_task_runs_its_appends) {
  shutdown_during_own(TKO_DRAIN, true);
}
Test(attack_lanes_wait, a_timed_out_cancel_then_cancel_during_the_callers_task_accounts_its_appends) {
  shutdown_during_own(TKO_CANCEL, true);
}

/* ---- a pool task on a full bounded pool --------------------------------- */

typedef struct fullpool {
  tko_pool *p;
  appender a;
  atomic_int filler;
  int rc_filler;
  tt_gate done;
} fullpool;

static int full_task(void *arg) {
  fullpool *f = arg;
  f->rc_filler = tko_submit(f->p, count_fn, &f->filler, 0); /* the queue is full now */
  f->a.rc = tko_lanes_submit_wait(f->a.l, 1, append_fn, &f->a, 0);
  tt_gate_open(&f->done);
  return 0;
}

/* The only worker of a full bounded pool calls submit_wait on an idle lane
 * whose task appends more than max_drain: it may not wait for room (nobody
 * else would make any), so the appends must still run, and nothing hangs. */
static void full_pool_task(tko_full_policy policy) {
  static fullpool f;
  memset(&f, 0, sizeof f);
  f.done = (tt_gate)TT_GATE_INIT;
  tko_options po = tko_basic_options(1);
  po.queue_capacity = 1;
  po.full_policy = policy;
  cr_assert_eq(tko_pool_create(&f.p, &po), 0);
  tko_lane_options o = tko_lane_default_options();
  o.max_drain = 1;
  cr_assert_eq(tko_lanes_create(&f.a.l, f.p, &o), 0);
  cr_assert_eq(tko_submit(f.p, full_task, &f, 0), 0);
  cr_assert(tt_gate_wait(&f.done));
  cr_assert_eq(f.rc_filler, 0);
  cr_assert_eq(f.a.rc, 0);
  cr_assert_eq(tko_lanes_wait_idle(f.a.l, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&f.a.ran), 4);
  cr_assert_eq(atomic_load(&f.a.fails), 0);
  cr_assert_eq(tko_pool_wait_idle(f.p, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&f.filler), 1);
  cr_assert_eq(tko_lanes_destroy(f.a.l), 0);
  cr_assert_eq(tko_pool_destroy(f.p), 0);
}

Test(attack_lanes_wait, a_pool_task_on_a_full_blocking_pool_runs_its_lane_without_waiting) {
  full_pool_task(TKO_FULL_BLOCK);
}
Test(attack_lanes_wait, a_pool_task_on_a_full_caller_runs_pool_runs_its_lane_without_waiting) {
  full_pool_task(TKO_FULL_CALLER_RUNS);
}
Test(attack_lanes_wait, a_pool_task_on_a_full_rejecting_pool_runs_its_lane_without_waiting) {
  full_pool_task(TKO_FULL_REJECT);
}

/* A paused pool holds the rest of a caller's visit; destroy runs it. */
Test(attack_lanes_wait, destroy_on_a_paused_pool_runs_the_rest_of_a_callers_visit) {
  tko_pool *p = make_pool(1);
  static appender a;
  memset(&a, 0, sizeof a);
  tko_lane_options o = tko_lane_default_options();
  o.max_drain = 1;
  cr_assert_eq(tko_lanes_create(&a.l, p, &o), 0);
  cr_assert_eq(tko_pool_pause(p), 0);
  cr_assert_eq(tko_lanes_submit_wait(a.l, 1, append_fn, &a, 0), 0);
  cr_assert_eq(atomic_load(&a.ran), 1);
  cr_assert_eq(tko_lanes_destroy(a.l), 0);
  cr_assert_eq(atomic_load(&a.ran), 4);
  cr_assert_eq(tko_pool_resume(p), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* ---- wait_idle across the caller's hand-off, many rounds ---------------- */

typedef struct handoff {
  tko_lanes *l;
  atomic_int started, own_done, appended_ran, fails;
  int spin;
} handoff;

static int handoff_appended(void *arg) {
  handoff *h = arg;
  atomic_fetch_add(&h->appended_ran, 1);
  return 0;
}

static int handoff_own(void *arg) {
  handoff *h = arg;
  if (tko_lanes_submit(h->l, 3, handoff_appended, h, 0) != 0) atomic_fetch_add(&h->fails, 1);
  atomic_store(&h->started, 1);
  for (volatile int i = 0; i < h->spin; i++) {
  }
  atomic_store(&h->own_done, 1);
  return 0;
}

static void *handoff_thread(void *arg) {
  handoff *h = arg;
  if (tko_lanes_submit_wait(h->l, 3, handoff_own, h, 0) != 0) atomic_fetch_add(&h->fails, 1);
  return NULL;
}

/* The caller runs its own task (which appends one), hands the append to a
 * runner (max_drain 1) and gives its lane back; a wait_idle begun while the
 * own task ran must return only after the append ran, and must be woken
 * (a lost wake-up shows as -ETIMEDOUT here). */
Test(attack_lanes_wait, wait_idle_spans_the_callers_hand_off_to_a_runner) {
  tko_pool *p = make_pool(1);
  tko_lane_options o = tko_lane_default_options();
  o.max_drain = 1;
  o.lanes = 1;
  static handoff h;
  memset(&h, 0, sizeof h);
  cr_assert_eq(tko_lanes_create(&h.l, p, &o), 0);
  int rounds = TT_SCALE(1500, 200);
  for (int i = 0; i < rounds; i++) {
    atomic_store(&h.started, 0);
    atomic_store(&h.own_done, 0);
    atomic_store(&h.appended_ran, 0);
    h.spin = (i * 37) % 2000;
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, handoff_thread, &h), 0);
    while (!atomic_load(&h.started)) sched_yield();
    int rc = tko_lanes_wait_idle(h.l, 20000);
    int ran = atomic_load(&h.appended_ran), own = atomic_load(&h.own_done);
    pthread_join(t, NULL);
    cr_assert_eq(rc, 0, "round %d: wait_idle %d", i, rc);
    cr_assert_eq(own, 1, "round %d: idle while the caller's task ran", i);
    cr_assert_eq(ran, 1, "round %d: idle before the handed-off task ran", i);
  }
  cr_assert_eq(atomic_load(&h.fails), 0);
  tko_lane_stats s;
  tko_lanes_stats(h.l, &s);
  cr_assert_eq(s.submitted, (uint64_t)rounds * 2);
  cr_assert_eq(s.completed, s.submitted);
  cr_assert_eq(s.visits, s.submitted, "max_drain 1: one task a visit");
  cr_assert_eq(s.max_batch, 1);
  cr_assert_eq(s.lanes_used, 1);
  cr_assert_eq(tko_lanes_destroy(h.l), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* ---- two tables on one pool: nested caller runs ------------------------- */

typedef struct nest2 {
  tko_lanes *a, *b;
  int rc_b, rc_back_in_b, rc_a_after, rc_idle_after, rc_outer;
  atomic_int ran_b, ran_inner;
  tt_count done;
} nest2;

static int nest_inner(void *arg) {
  atomic_fetch_add(&((nest2 *)arg)->ran_inner, 1);
  return 0;
}

static int nest_b(void *arg) {
  nest2 *n = arg;
  atomic_fetch_add(&n->ran_b, 1);
  /* back into table a, whose lane 1 this thread holds */
  n->rc_back_in_b = tko_lanes_submit_wait(n->a, 1, nest_inner, n, 0);
  return 0;
}

static int nest_a(void *arg) {
  nest2 *n = arg;
  n->rc_b = tko_lanes_submit_wait(n->b, 1, nest_b, n, 0);
  /* back in a's task after b's caller run ended: still a task of a */
  n->rc_a_after = tko_lanes_submit_wait(n->a, 2, nest_inner, n, 0);
  n->rc_idle_after = tko_lanes_wait_idle(n->a, 0);
  return 0;
}

static void *nest_thread(void *arg) {
  nest2 *n = arg;
  n->rc_outer = tko_lanes_submit_wait(n->a, 1, nest_a, n, 0);
  tt_count_add(&n->done, 1);
  return NULL;
}

/* A task run on its submit_wait caller for table a calls submit_wait on an
 * idle lane of table b (same pool), whose task calls back into a: the
 * nested call must not wait for the lane its own thread holds, and once b's
 * run ends the thread is still in a's task (-EDEADLK for a again). */
Test(attack_lanes_wait, nested_caller_runs_of_two_tables_never_wait_for_themselves) {
  tko_pool *p = make_pool(2);
  static nest2 n;
  memset(&n, 0, sizeof n);
  tt_count_init(&n.done);
  n.rc_b = n.rc_back_in_b = n.rc_a_after = n.rc_idle_after = n.rc_outer = 1;
  cr_assert_eq(tko_lanes_create(&n.a, p, NULL), 0);
  cr_assert_eq(tko_lanes_create(&n.b, p, NULL), 0);
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, nest_thread, &n), 0);
  cr_assert(tt_count_wait_geq_within(&n.done, 1, 20000), "a nested submit_wait waits for its own thread");
  pthread_join(t, NULL);
  cr_assert_eq(n.rc_outer, 0);
  cr_assert_eq(n.rc_b, 0, "b's lane was idle: it ran on this thread");
  cr_assert_eq(atomic_load(&n.ran_b), 1);
  cr_assert(n.rc_back_in_b == -EDEADLK || n.rc_back_in_b == -EBUSY, "back into a: %d", n.rc_back_in_b);
  cr_assert_eq(n.rc_a_after, -EDEADLK, "a task of a calling a after b's run: %d", n.rc_a_after);
  cr_assert_eq(n.rc_idle_after, -EDEADLK, "wait_idle from a's task: %d", n.rc_idle_after);
  cr_assert_eq(atomic_load(&n.ran_inner), 0);
  cr_assert_eq(tko_lanes_wait_idle(n.a, TT_LONG_MS), 0);
  cr_assert_eq(tko_lanes_wait_idle(n.b, TT_LONG_MS), 0);
  cr_assert_eq(tko_lanes_destroy(n.b), 0);
  cr_assert_eq(tko_lanes_destroy(n.a), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* ---- a task the caller drains for another thread is a task of the table -- */

typedef struct drained {
  tko_lanes *l;
  int rc_wait, rc_idle, rc_destroy;
  atomic_int ran, x_on_caller;
  pthread_t caller;
} drained;

static int drained_x(void *arg) {
  drained *d = arg;
  if (pthread_equal(pthread_self(), d->caller)) atomic_fetch_add(&d->x_on_caller, 1);
  d->rc_wait = tko_lanes_submit_wait(d->l, 77, count_fn, &d->ran, 0);
  d->rc_idle = tko_lanes_wait_idle(d->l, 0);
  d->rc_destroy = tko_lanes_destroy(d->l);
  return 0;
}

static int drained_own(void *arg) {
  drained *d = arg;
  return tko_lanes_submit(d->l, 1, drained_x, d, 0);
}

/* The caller's own task appends X; the caller runs X too (max_drain 2). X is
 * a task of these lanes wherever it runs: submit_wait, wait_idle and destroy
 * from it are -EDEADLK. */
Test(attack_lanes_wait, a_task_the_caller_drains_gets_edeadlk_from_its_lanes) {
  tko_pool *p = make_pool(1);
  static drained d;
  memset(&d, 0, sizeof d);
  d.rc_wait = d.rc_idle = d.rc_destroy = 1;
  d.caller = pthread_self();
  tko_lane_options o = tko_lane_default_options();
  o.max_drain = 2;
  cr_assert_eq(tko_lanes_create(&d.l, p, &o), 0);
  cr_assert_eq(tko_pool_pause(p), 0); /* no runner may take X */
  cr_assert_eq(tko_lanes_submit_wait(d.l, 1, drained_own, &d, 0), 0);
  cr_assert_eq(atomic_load(&d.x_on_caller), 1, "the caller ran X");
  cr_assert_eq(d.rc_wait, -EDEADLK);
  cr_assert_eq(d.rc_idle, -EDEADLK);
  cr_assert_eq(d.rc_destroy, -EDEADLK);
  cr_assert_eq(atomic_load(&d.ran), 0);
  cr_assert_eq(tko_pool_resume(p), 0);
  cr_assert_eq(tko_lanes_wait_idle(d.l, TT_LONG_MS), 0);
  cr_assert_eq(tko_lanes_destroy(d.l), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* ---- a busy-lane waiter returns after its batch / on_cancel returned ---- */

typedef struct bwait {
  tko_lanes *l;
  tt_gate hold;
  atomic_int in_batch, finished_batches, cancels_done;
  int rc, finished_at_return, cancels_at_return;
  tt_count entered;
} bwait;

static bwait *bw;

static void bwait_batch(void *user, const tko_lane_batch *b) {
  bwait *w = user;
  for (size_t i = 0; i < b->count; i++)
    if (b->tasks[i].arg == &w->hold) {
      tt_count_add(&w->entered, 1);
      tt_gate_wait(&w->hold);
    }
  tt_spin_ns(200000);
  atomic_fetch_add(&w->finished_batches, 1);
}

static void bwait_cancel(void *user, const tko_lane_task *t) {
  (void)t;
  bwait *w = user;
  tt_spin_ns(200000);
  atomic_fetch_add(&w->cancels_done, 1);
}

static void *bwait_thread(void *arg) {
  bwait *w = arg;
  w->rc = tko_lanes_submit_wait(w->l, 1, NULL, w, 0);
  w->finished_at_return = atomic_load(&w->finished_batches);
  w->cancels_at_return = atomic_load(&w->cancels_done);
  return NULL;
}

static void batch_waiter(bool cancel) {
  tko_pool *p = make_pool(2);
  static bwait w;
  memset(&w, 0, sizeof w);
  w.hold = (tt_gate)TT_GATE_INIT;
  tt_count_init(&w.entered);
  bw = &w;
  tko_lane_options o = tko_lane_default_options();
  o.batch = bwait_batch;
  o.on_cancel = bwait_cancel;
  o.user = &w;
  cr_assert_eq(tko_lanes_create(&w.l, p, &o), 0);
  cr_assert_eq(tko_lanes_submit(w.l, 1, NULL, &w.hold, 0), 0);
  cr_assert(tt_count_wait_geq(&w.entered, 1)); /* the lane is busy */
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, bwait_thread, &w), 0);
  tko_lane_stats s;
  do {
    sched_yield();
    tko_lanes_stats(w.l, &s);
  } while (s.submitted < 2);
  if (cancel) cr_assert_eq(tko_lanes_cancel(w.l), 0);
  tt_gate_open(&w.hold);
  pthread_join(t, NULL);
  if (cancel) {
    cr_assert_eq(w.rc, -ECANCELED);
    cr_assert_eq(w.cancels_at_return, 1, "returned before on_cancel returned");
  } else {
    cr_assert_eq(w.rc, 0);
    cr_assert_eq(w.finished_at_return, 2, "returned before its batch returned");
  }
  cr_assert_eq(tko_lanes_wait_idle(w.l, TT_LONG_MS), 0);
  cr_assert_eq(tko_lanes_destroy(w.l), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

Test(attack_lanes_wait, a_busy_lane_waiter_returns_after_its_batch_returned) { batch_waiter(false); }
Test(attack_lanes_wait, a_cancelled_waiter_returns_after_on_cancel_returned) { batch_waiter(true); }

/* ---- the pool sees the caller's run as one of its tasks ----------------- */

typedef struct poolview {
  tko_pool *p;
  tko_lanes *l;
  int rc_pool_idle, rc_shutdown, rc_destroy;
  tt_count started;
  tt_gate release;
  int rc;
} poolview;

static int poolview_own(void *arg) {
  poolview *v = arg;
  v->rc_pool_idle = tko_pool_wait_idle(v->p, 0);
  v->rc_shutdown = tko_pool_shutdown(v->p, TKO_DRAIN);
  v->rc_destroy = tko_pool_destroy(v->p);
  tt_count_add(&v->started, 1);
  tt_gate_wait(&v->release);
  return 0;
}

static void *poolview_thread(void *arg) {
  poolview *v = arg;
  v->rc = tko_lanes_submit_wait(v->l, 1, poolview_own, v, 0);
  return NULL;
}

Test(attack_lanes_wait, the_pool_counts_the_callers_run_as_its_running_task) {
  static poolview v;
  memset(&v, 0, sizeof v);
  tt_count_init(&v.started);
  v.release = (tt_gate)TT_GATE_INIT;
  v.rc = 1;
  v.p = make_pool(2);
  cr_assert_eq(tko_lanes_create(&v.l, v.p, NULL), 0);
  tko_stats before;
  tko_pool_stats(v.p, &before);
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, poolview_thread, &v), 0);
  cr_assert(tt_count_wait_geq(&v.started, 1));
  cr_assert_eq(v.rc_pool_idle, -EDEADLK, "pool wait_idle from the caller's task: %d", v.rc_pool_idle);
  cr_assert_eq(v.rc_shutdown, -EDEADLK);
  cr_assert_eq(v.rc_destroy, -EDEADLK);
  cr_assert_eq(tko_pool_wait_idle(v.p, 0), -ETIMEDOUT, "the caller's task runs");
  tko_stats mid;
  tko_pool_stats(v.p, &mid);
  cr_assert_geq(mid.running, 1);
  cr_assert_leq(mid.completed + mid.cancelled + mid.queued + mid.running, mid.submitted);
  tt_gate_open(&v.release);
  pthread_join(t, NULL);
  cr_assert_eq(v.rc, 0);
  cr_assert_eq(tko_pool_wait_idle(v.p, TT_LONG_MS), 0);
  tko_stats after;
  tko_pool_stats(v.p, &after);
  cr_assert_eq(after.caller_runs, before.caller_runs + 1);
  cr_assert_eq(after.running, 0);
  cr_assert_eq(after.submitted, after.completed + after.cancelled + after.queued + after.running);
  cr_assert_eq(tko_lanes_destroy(v.l), 0);
  cr_assert_eq(tko_pool_destroy(v.p), 0);
}

/* ---- rings: first use by a caller, bursts, shrink, failing memory ------- */

typedef struct ringy {
  tko_lanes *l;
  atomic_int ran, fails, enomem, attempts;
  atomic_long allocs_left;
  atomic_int live;
  int burst;
} ringy;

static void *ring_alloc(void *ctx, size_t n) {
  ringy *r = ctx;
  if (atomic_fetch_sub(&r->allocs_left, 1) <= 0) return NULL;
  void *p = malloc(n);
  if (p) atomic_fetch_add(&r->live, 1);
  return p;
}
static void *ring_realloc(void *ctx, void *p, size_t n) {
  ringy *r = ctx;
  if (atomic_fetch_sub(&r->allocs_left, 1) <= 0) return NULL;
  void *q = realloc(p, n);
  if (q && !p) atomic_fetch_add(&r->live, 1);
  return q;
}
static void ring_free(void *ctx, void *p) {
  ringy *r = ctx;
  if (p) atomic_fetch_sub(&r->live, 1);
  free(p);
}

static int ring_burst(void *arg) {
  ringy *r = arg;
  for (int i = 0; i < r->burst; i++) {
    atomic_fetch_add(&r->attempts, 1);
    int rc = tko_lanes_submit(r->l, 1, count_fn, &r->ran, 0);
    if (rc == -ENOMEM)
      atomic_fetch_add(&r->enomem, 1);
    else if (rc != 0)
      atomic_fetch_add(&r->fails, 1);
  }
  atomic_fetch_add(&r->ran, 1);
  return 0;
}

static void *ring_thread(void *arg) {
  ringy *r = arg;
  for (int i = 0; i < 20; i++) {
    atomic_fetch_add(&r->attempts, 1);
    int rc = tko_lanes_submit_wait(r->l, (uint64_t)i % 2, ring_burst, r, 0);
    if (rc == -ENOMEM)
      atomic_fetch_add(&r->enomem, 1);
    else if (rc != 0)
      atomic_fetch_add(&r->fails, 1);
  }
  return NULL;
}

/* Callers whose own tasks burst far past lane_capacity (the ring grows, then
 * shrinks when the lane drains) on two keys of one lane, with memory that
 * runs out midway in some rounds: every accepted task runs once, the
 * allocator sees every block it gave back, nothing hangs. */
Test(attack_lanes_wait, callers_bursting_past_lane_capacity_with_memory_running_out) {
  for (int round = 0; round < TT_SCALE(12, 4); round++) {
    tko_pool *p = make_pool(2);
    static ringy r;
    memset(&r, 0, sizeof r);
    r.burst = 40;
    atomic_store(&r.allocs_left, round % 3 == 2 ? 3 + round / 3 : 1L << 30);
    tko_allocator a = {.alloc = ring_alloc, .realloc = ring_realloc, .free = ring_free, .ctx = &r};
    tko_lane_options o = tko_lane_default_options();
    o.lanes = 1;
    o.lane_capacity = 1;
    o.max_drain = round % 2 ? 3 : 1;
    o.allocator = &a;
    int crc = tko_lanes_create(&r.l, p, &o);
    if (crc == -ENOMEM) {
      cr_assert_eq(tko_pool_destroy(p), 0);
      continue;
    }
    cr_assert_eq(crc, 0);
    pthread_t th[3];
    for (int t = 0; t < 3; t++) cr_assert_eq(pthread_create(&th[t], NULL, ring_thread, &r), 0);
    for (int t = 0; t < 3; t++) pthread_join(th[t], NULL);
    cr_assert_eq(tko_lanes_wait_idle(r.l, TT_LONG_MS), 0);
    tko_lane_stats s;
    tko_lanes_stats(r.l, &s);
    cr_assert_eq(atomic_load(&r.fails), 0);
    cr_assert_eq(s.completed, s.submitted);
    cr_assert_eq(s.queued, 0);
    cr_assert_eq((uint64_t)atomic_load(&r.ran), s.submitted, "every accepted task ran once");
    cr_assert_eq(s.submitted + (uint64_t)atomic_load(&r.enomem), (uint64_t)atomic_load(&r.attempts));
    cr_assert_eq(tko_lanes_destroy(r.l), 0);
    cr_assert_eq(atomic_load(&r.live), 0, "the table gave back every block");
    cr_assert_eq(tko_pool_destroy(p), 0);
  }
}

Test(attack_lanes_wait, a_full_rejecting_pool_runs_the_visit_and_keeps_the_rest) {
  bounded_scene(TKO_FULL_REJECT);
}

/* ---- waiters asleep on a paused pool meet a cancel shutdown ------------- */

typedef struct sleeper {
  tko_lanes *l;
  atomic_int runs[8], cancels[8];
  int rc[8];
  int idx[8];
} sleeper;

static sleeper *slp;

static int sleeper_fn(void *arg) {
  atomic_fetch_add(&slp->runs[*(int *)arg], 1);
  return 0;
}

static void sleeper_cancel(void *user, const tko_lane_task *t) {
  (void)user;
  atomic_fetch_add(&slp->cancels[*(int *)t->arg], 1);
}

static void *sleeper_thread(void *arg) {
  int i = *(int *)arg;
  slp->rc[i] = tko_lanes_submit_wait(slp->l, (uint64_t)i % 2, sleeper_fn, arg, i);
  return NULL;
}

/* Two lanes made busy by a runner queued in a paused pool; six callers
 * asleep behind them; a timed-out then a full cancel shutdown, and destroy
 * at once after the callers returned: each caller got -ECANCELED after
 * on_cancel saw its task, once. */
Test(attack_lanes_wait, callers_asleep_on_a_paused_pool_are_cancelled_by_its_shutdown) {
  tko_pool *p = make_pool(2);
  static sleeper s;
  memset(&s, 0, sizeof s);
  slp = &s;
  for (int i = 0; i < 8; i++) s.idx[i] = i;
  tko_lane_options o = tko_lane_default_options();
  o.on_cancel = sleeper_cancel;
  cr_assert_eq(tko_lanes_create(&s.l, p, &o), 0);
  cr_assert_eq(tko_pool_pause(p), 0);
  cr_assert_eq(tko_lanes_submit(s.l, 0, sleeper_fn, &s.idx[6], 0), 0);
  cr_assert_eq(tko_lanes_submit(s.l, 1, sleeper_fn, &s.idx[7], 0), 0);
  pthread_t th[6];
  for (int i = 0; i < 6; i++) cr_assert_eq(pthread_create(&th[i], NULL, sleeper_thread, &s.idx[i]), 0);
  tko_lane_stats st;
  do {
    sched_yield();
    tko_lanes_stats(s.l, &st);
  } while (st.submitted < 8);
  int rc = tko_pool_shutdown_timed(p, TKO_CANCEL, 0);
  cr_assert(rc == 0 || rc == -ETIMEDOUT, "rc %d", rc);
  cr_assert_eq(tko_pool_shutdown(p, TKO_CANCEL), 0);
  for (int i = 0; i < 6; i++) pthread_join(th[i], NULL);
  cr_assert_eq(tko_lanes_destroy(s.l), 0);
  for (int i = 0; i < 8; i++) {
    cr_assert_eq(atomic_load(&s.runs[i]), 0);
    cr_assert_eq(atomic_load(&s.cancels[i]), 1);
    if (i < 6) cr_assert_eq(s.rc[i], -ECANCELED);
  }
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* ---- a forked child: -ECHILD, idle lane or busy ------------------------- */

#if defined(__SANITIZE_THREAD__)
#define AW_FORK_SKIP 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define AW_FORK_SKIP 1
#endif
#endif

static int fork_flag_fn(void *arg) {
  *(int *)arg = 1;
  return 0;
}

/* In a child forked after create, every call is -ECHILD: submit_wait on an
 * idle lane must not run the task on the child's thread, nor wait on a busy
 * one for a runner that only the parent has. */
Test(attack_lanes_wait, submit_wait_in_a_forked_child_is_echild_on_idle_and_busy_lanes) {
#ifdef AW_FORK_SKIP
  return; /* fork with pool threads is unsupported under TSan */
#endif
  tko_pool *p = make_pool(1);
  tko_lanes *l = NULL;
  cr_assert_eq(tko_lanes_create(&l, p, NULL), 0);
  static tt_pin pin;
  pin = (tt_pin)TT_PIN_INIT;
  cr_assert_eq(tko_lanes_submit(l, 1, tt_pin_fn, &pin, 0), 0);
  cr_assert(tt_count_wait_geq(&pin.started, 1)); /* lane of key 1 busy */
  uint64_t idle_key = 2;
  while (tko_lanes_index(l, idle_key) == tko_lanes_index(l, 1)) idle_key++;
  int pipefd[2];
  cr_assert_eq(pipe(pipefd), 0);
  fflush(NULL);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    close(pipefd[0]);
    alarm(20); /* a hang kills the child: a failure, not a stuck suite */
    int ran = 0, bad = 0;
    if (tko_lanes_submit_wait(l, idle_key, fork_flag_fn, &ran, 0) != -ECHILD) bad |= 1;
    if (ran) bad |= 2;
    if (tko_lanes_submit_wait(l, 1, fork_flag_fn, &ran, 0) != -ECHILD) bad |= 4;
    if (ran) bad |= 8;
    ssize_t w = write(pipefd[1], &bad, sizeof bad);
    (void)w;
    tt_child_exit(0);
  }
  close(pipefd[1]);
  int bad = -1;
  ssize_t got = read(pipefd[0], &bad, sizeof bad);
  close(pipefd[0]);
  int status = 0;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  cr_assert(!WIFSIGNALED(status), "the child died of signal %d (hung?)", WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  cr_assert_eq(got, (ssize_t)sizeof bad);
  cr_assert_eq(bad, 0, "child result 0x%x", bad);
  tt_gate_open(&pin.gate);
  cr_assert_eq(tko_lanes_wait_idle(l, TT_LONG_MS), 0);
  cr_assert_eq(tko_lanes_destroy(l), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* ---- cross-thread order: a submit that returned is ahead of a later call -- */

typedef struct xorder {
  tko_lanes *l;
  atomic_int x_done, x_running, bad, go, round;
  int rounds;
} xorder;

static int xorder_x(void *arg) {
  xorder *o = arg;
  atomic_store(&o->x_running, 1);
  for (volatile int i = 0; i < 200; i++) {
  }
  atomic_store(&o->x_running, 0);
  atomic_fetch_add(&o->x_done, 1);
  return 0;
}

static int xorder_y(void *arg) {
  xorder *o = arg;
  /* x of this round was accepted before y's call began */
  if (atomic_load(&o->x_running) || atomic_load(&o->x_done) != atomic_load(&o->round) + 1)
    atomic_fetch_add(&o->bad, 1);
  return 0;
}

static void *xorder_thread(void *arg) {
  xorder *o = arg;
  for (int r = 0; r < o->rounds; r++) {
    while (atomic_load(&o->go) != 2 * r + 1) sched_yield();
    if (tko_lanes_submit_wait(o->l, 42, xorder_y, o, 0) != 0) atomic_fetch_add(&o->bad, 1);
    atomic_store(&o->go, 2 * r + 2);
  }
  return NULL;
}

/* Thread A's tko_lanes_submit(x) returned before thread B called
 * submit_wait(y) on the same key: y runs after x returned, whether B finds
 * the lane busy or just given back (max_drain 1, two workers). */
Test(attack_lanes_wait, a_submit_that_returned_runs_before_a_later_threads_submit_wait) {
  tko_pool *p = make_pool(2);
  static xorder o;
  memset(&o, 0, sizeof o);
  o.rounds = TT_SCALE(3000, 400);
  tko_lane_options lo = tko_lane_default_options();
  lo.max_drain = 1;
  cr_assert_eq(tko_lanes_create(&o.l, p, &lo), 0);
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, xorder_thread, &o), 0);
  for (int r = 0; r < o.rounds; r++) {
    atomic_store(&o.round, r);
    cr_assert_eq(tko_lanes_submit(o.l, 42, xorder_x, &o, 0), 0);
    atomic_store(&o.go, 2 * r + 1);
    while (atomic_load(&o.go) != 2 * r + 2) sched_yield();
  }
  pthread_join(t, NULL);
  cr_assert_eq(atomic_load(&o.bad), 0);
  cr_assert_eq(atomic_load(&o.x_done), o.rounds);
  cr_assert_eq(tko_lanes_wait_idle(o.l, TT_LONG_MS), 0);
  cr_assert_eq(tko_lanes_destroy(o.l), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* Option limits reach submit_wait's tables too. */
Test(attack_lanes_wait, option_limits_and_the_largest_max_drain) {
  tko_pool *p = make_pool(1);
  tko_lanes *l = NULL;
  tko_lane_options o = tko_lane_default_options();
  o.max_drain = TKO_MAX_LANE_DRAIN + 1;
  cr_assert_eq(tko_lanes_create(&l, p, &o), -EINVAL);
  o = tko_lane_default_options();
  o.lanes = TKO_MAX_LANES + 1;
  cr_assert_eq(tko_lanes_create(&l, p, &o), -EINVAL);
  o = tko_lane_default_options();
  o.max_drain = TKO_MAX_LANE_DRAIN;
  o.lanes = 1;
  static appender a;
  memset(&a, 0, sizeof a);
  cr_assert_eq(tko_lanes_create(&a.l, p, &o), 0);
  cr_assert_eq(tko_pool_pause(p), 0);
  cr_assert_eq(tko_lanes_submit_wait(a.l, UINT64_MAX, append_fn, &a, INT_MIN), 0);
  cr_assert_eq(atomic_load(&a.ran), 4, "all appends ran on the caller");
  tko_lane_stats s;
  tko_lanes_stats(a.l, &s);
  /* the caller's take of its own task and its take of the appends count as
   * a visit each */
  cr_assert_leq(s.visits, 2);
  cr_assert_leq(s.max_batch, 4);
  cr_assert_geq(s.max_batch * s.visits, 4);
  cr_assert_eq(s.completed, 4);
  cr_assert_eq(tko_pool_resume(p), 0);
  cr_assert_eq(tko_lanes_destroy(a.l), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}
