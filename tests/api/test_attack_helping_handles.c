/* SPDX-License-Identifier: MIT */
/* Attacks on the helping group wait and on task handles, through the
 * public header only: waits that cross three pools, waits with timeouts
 * racing the members' ends, cancels, pauses and shutdowns in each mode
 * while tasks wait, handles waited on from tasks, hooks and many threads,
 * freed as soon as their wait returns. No test sleeps to wait for
 * something; every wait that a bug would hang carries a bound. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "taskorch.h"
#include "tko_test.h"
#include "tko_test_sync.h"

/* ---- shared hooks ------------------------------------------------------------ */

typedef struct hookc {
  tt_count cancels;
  tt_count runs;
} hookc;

static void hk_cancel(void *user, const tko_task_info *t) {
  (void)t;
  tt_count_add(&((hookc *)user)->cancels, 1);
}
static void hk_before(void *user, const tko_task_info *t) {
  (void)t;
  tt_count_add(&((hookc *)user)->runs, 1);
}

static tko_pool *mk_pool(unsigned workers, unsigned max_batch, hookc *h) {
  tko_options o = tko_basic_options(workers);
  o.max_batch = max_batch;
  if (h) {
    tt_count_init(&h->cancels);
    tt_count_init(&h->runs);
    o.hooks.user = h;
    o.hooks.on_cancel = hk_cancel;
    o.hooks.before_run = hk_before;
  }
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  return p;
}

static int inc_fn(void *arg) {
  atomic_fetch_add((atomic_int *)arg, 1);
  return 0;
}

static int count_fn7(void *arg) {
  atomic_fetch_add((atomic_int *)arg, 1);
  return 7;
}

/* ---- a wait cycle across three pools ---------------------------------------- */

/* Each hop submits the next hop into a group of the next pool (A -> B -> C
 * -> A ...) and waits on it. Every pool has one worker, and every worker is
 * inside a wait when the hop that comes back to its pool is submitted: it
 * must run it while helping. */
#define RING_POOLS 3
#define RING_HOPS 12

typedef struct ring {
  tko_pool *p[RING_POOLS];
  atomic_int bad, ran;
} ring;

typedef struct hop {
  ring *r;
  int n;
} hop;

static int hop_fn(void *arg) {
  hop *h = arg;
  atomic_fetch_add(&h->r->ran, 1);
  if (h->n == RING_HOPS) return 0;
  hop next = {h->r, h->n + 1};
  tko_group g;
  tko_group_init(&g);
  int rc = tko_group_submit(h->r->p[next.n % RING_POOLS], &g, hop_fn, &next, 0);
  if (rc == 0) rc = tko_group_wait(&g, -1);
  if (rc) atomic_store(&h->r->bad, rc);
  if (rc == 0 && tko_group_destroy(&g)) atomic_store(&h->r->bad, 1);
  return 0;
}

Test(attack_hh, a_wait_cycle_across_three_one_worker_pools_finishes) {
  for (int round = 0; round < TT_SCALE(50, 10); round++) {
    ring r;
    memset(&r, 0, sizeof r);
    for (int i = 0; i < RING_POOLS; i++)
      r.p[i] = mk_pool(1, 0, NULL);
    hop root = {&r, 0};
    cr_assert_eq(tko_submit(r.p[0], hop_fn, &root, 0), 0);
    for (int i = 0; i < RING_POOLS; i++)
      cr_assert_eq(tko_pool_wait_idle(r.p[i], TT_LONG_MS), 0, "pool %d hung", i);
    cr_assert_eq(atomic_load(&r.bad), 0, "rc %d", atomic_load(&r.bad));
    cr_assert_eq(atomic_load(&r.ran), RING_HOPS + 1);
    for (int i = 0; i < RING_POOLS; i++)
      cr_assert_eq(tko_pool_destroy(r.p[i]), 0);
  }
}

/* The same ring with fan-out: each hop submits two members into the next
 * pool's group, one of them also a member of the pool two steps on. */
typedef struct fan {
  ring *r;
  int n;
} fan;

static int fan_fn(void *arg) {
  fan *h = arg;
  atomic_fetch_add(&h->r->ran, 1);
  if (h->n == 6) return 0;
  fan kids[2] = {{h->r, h->n + 1}, {h->r, h->n + 1}};
  tko_group g1, g2;
  tko_group_init(&g1);
  tko_group_init(&g2);
  int rc = tko_group_submit(h->r->p[(h->n + 1) % RING_POOLS], &g1, fan_fn, &kids[0], h->n);
  if (rc == 0)
    rc = tko_group_submit(h->r->p[(h->n + 2) % RING_POOLS], &g2, fan_fn, &kids[1], -h->n);
  int w1 = tko_group_wait(&g1, -1), w2 = tko_group_wait(&g2, -1);
  if (rc || w1 || w2) atomic_store(&h->r->bad, rc ? rc : w1 ? w1 : w2);
  if (tko_group_destroy(&g1) || tko_group_destroy(&g2)) atomic_store(&h->r->bad, 1);
  return 0;
}

Test(attack_hh, a_fan_out_across_three_pools_with_mixed_weights_finishes) {
  for (int round = 0; round < TT_SCALE(20, 5); round++) {
    ring r;
    memset(&r, 0, sizeof r);
    for (int i = 0; i < RING_POOLS; i++)
      r.p[i] = mk_pool(1 + (unsigned)(i == 1), 0, NULL);
    fan root = {&r, 0};
    cr_assert_eq(tko_submit(r.p[0], fan_fn, &root, 0), 0);
    for (int pass = 0; pass < 2; pass++)
      for (int i = 0; i < RING_POOLS; i++)
        cr_assert_eq(tko_pool_wait_idle(r.p[i], TT_LONG_MS), 0, "pool %d hung", i);
    cr_assert_eq(atomic_load(&r.bad), 0, "rc %d", atomic_load(&r.bad));
    cr_assert_eq(atomic_load(&r.ran), 127); /* 2^7 - 1 nodes */
    for (int i = 0; i < RING_POOLS; i++)
      cr_assert_eq(tko_pool_destroy(r.p[i]), 0);
  }
}

/* ---- timeouts ---------------------------------------------------------------- */

typedef struct tmo {
  tko_pool *p;
  atomic_int ran, rc0, rc_small, rc_final, ran_at_0;
} tmo;

/* Timeout 0 starts no task at all: the queued member is still queued. */
static int tmo_fn(void *arg) {
  tmo *t = arg;
  tko_group g;
  tko_group_init(&g);
  tko_group_submit(t->p, &g, inc_fn, &t->ran, 0);
  atomic_store(&t->rc0, tko_group_wait(&g, 0));
  atomic_store(&t->ran_at_0, atomic_load(&t->ran));
  atomic_store(&t->rc_final, tko_group_wait(&g, -1));
  tko_group_destroy(&g);
  return 0;
}

Test(attack_hh, a_zero_timeout_group_wait_in_a_task_runs_nothing) {
  tmo t;
  memset(&t, 0, sizeof t);
  t.p = mk_pool(1, 0, NULL);
  cr_assert_eq(tko_submit(t.p, tmo_fn, &t, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(t.p, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&t.rc0), -ETIMEDOUT);
  cr_assert_eq(atomic_load(&t.ran_at_0), 0, "a zero-timeout wait ran a member");
  cr_assert_eq(atomic_load(&t.rc_final), 0);
  cr_assert_eq(atomic_load(&t.ran), 1);
  cr_assert_eq(tko_pool_destroy(t.p), 0);
}

/* Small timeouts racing members that end on other workers: each wait
 * returns 0 or -ETIMEDOUT, and 0 only when nothing is pending. */
typedef struct race {
  tko_pool *p;
  atomic_int bad;
} race;

static int spin_fn(void *arg) {
  (void)arg;
  tt_spin_ns(20000);
  return 0;
}

static int race_fn(void *arg) {
  race *r = arg;
  for (int i = 0; i < 50; i++) {
    tko_group g;
    tko_group_init(&g);
    for (int k = 0; k < 3; k++)
      tko_group_submit(r->p, &g, spin_fn, NULL, k);
    long to = i % 3; /* 0, 1, 2 ms */
    int rc = tko_group_wait(&g, to);
    if (rc == 0 && tko_group_pending(&g) != 0) atomic_store(&r->bad, 1);
    if (rc != 0 && rc != -ETIMEDOUT) atomic_store(&r->bad, rc);
    if (tko_group_wait(&g, -1) != 0) atomic_store(&r->bad, 2);
    if (tko_group_pending(&g) != 0 || tko_group_destroy(&g) != 0) atomic_store(&r->bad, 3);
  }
  return 0;
}

Test(attack_hh, small_timeouts_race_member_ends_cleanly) {
  race r;
  memset(&r, 0, sizeof r);
  r.p = mk_pool(3, 0, NULL);
  for (int i = 0; i < 3; i++)
    cr_assert_eq(tko_submit(r.p, race_fn, &r, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(r.p, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&r.bad), 0, "bad %d", atomic_load(&r.bad));
  cr_assert_eq(tko_pool_destroy(r.p), 0);
}

/* ---- cancel, pause, shutdown while a helper waits ------------------------------ */

/* A task of pool A waits on a group of pool B whose members are queued
 * behind a pinned B worker. */
typedef struct xw {
  tko_pool *a, *b;
  tko_group gb;
  tt_pin pin;
  tt_count waiting, done;
  atomic_int rc, status, ran;
  int members;
} xw;

static int xw_fn(void *arg) {
  xw *x = arg;
  int rc = 0;
  for (int i = 0; i < x->members && rc == 0; i++)
    rc = tko_group_submit(x->b, &x->gb, inc_fn, &x->ran, i);
  tt_count_add(&x->waiting, 1);
  if (rc == 0) rc = tko_group_wait(&x->gb, TT_LONG_MS);
  atomic_store(&x->rc, rc);
  atomic_store(&x->status, tko_group_status(&x->gb));
  tt_count_add(&x->done, 1);
  return 0;
}

static void xw_setup(xw *x, hookc *hb, int members) {
  memset(x, 0, sizeof *x);
  x->pin = (tt_pin)TT_PIN_INIT;
  tt_count_init(&x->waiting);
  tt_count_init(&x->done);
  x->members = members;
  atomic_store(&x->rc, 1);
  x->a = mk_pool(1, 0, NULL);
  x->b = mk_pool(1, 1, hb);
  cr_assert_eq(tko_group_init(&x->gb), 0);
  cr_assert_eq(tko_submit(x->b, tt_pin_fn, &x->pin, 1000), 0);
  cr_assert(tt_count_wait_geq(&x->pin.started, 1));
  cr_assert_eq(tko_submit(x->a, xw_fn, x, 0), 0);
  cr_assert(tt_count_wait_geq(&x->waiting, 1));
}

Test(attack_hh, a_group_cancel_ends_a_cross_pool_helpers_wait) {
  xw x;
  hookc hb;
  xw_setup(&x, &hb, 4);
  cr_assert_eq(tko_group_cancel(&x.gb), 4);
  cr_assert(tt_count_wait_geq(&x.done, 1), "the helper was not woken by the cancel");
  cr_assert_eq(atomic_load(&x.rc), 0);
  cr_assert_eq(atomic_load(&x.status), -ECANCELED);
  cr_assert_eq(tt_count_get(&hb.cancels), 4);
  tt_gate_open(&x.pin.gate);
  cr_assert_eq(tko_pool_wait_idle(x.b, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&x.ran), 0);
  cr_assert_eq(tko_group_destroy(&x.gb), 0);
  cr_assert_eq(tko_pool_destroy(x.a), 0);
  cr_assert_eq(tko_pool_destroy(x.b), 0);
}

static void xw_shutdown_other(tko_shutdown_mode mode) {
  xw x;
  hookc hb;
  xw_setup(&x, &hb, 3);
  int rc = tko_pool_shutdown_timed(x.b, mode, 0);
  if (mode == TKO_CANCEL_NOWAIT)
    cr_assert_eq(rc, 0);
  else
    cr_assert_eq(rc, -ETIMEDOUT, "mode %d: %d", mode, rc);
  if (mode != TKO_DRAIN) {
    /* The queued members were cancelled: the helper must wake now, while
     * B's pinned worker still runs. */
    cr_assert(tt_count_wait_geq(&x.done, 1), "mode %d: helper not woken", mode);
    cr_assert_eq(atomic_load(&x.status), -ECANCELED);
    cr_assert_eq(tt_count_get(&hb.cancels), 3);
  }
  tt_gate_open(&x.pin.gate);
  cr_assert(tt_count_wait_geq(&x.done, 1));
  cr_assert_eq(atomic_load(&x.rc), 0, "mode %d: wait %d", mode, atomic_load(&x.rc));
  cr_assert_eq(atomic_load(&x.ran), mode == TKO_DRAIN ? 3 : 0);
  cr_assert_eq(tko_pool_destroy(x.b), 0); /* B goes first, A's task is done */
  cr_assert_eq(tko_pool_wait_idle(x.a, TT_LONG_MS), 0);
  cr_assert_eq(tko_group_destroy(&x.gb), 0);
  cr_assert_eq(tko_pool_destroy(x.a), 0);
}

Test(attack_hh, shutdown_of_the_other_pool_in_each_mode_ends_a_helpers_wait) {
  for (int i = 0; i < TT_SCALE(10, 3); i++) {
    xw_shutdown_other(TKO_DRAIN);
    xw_shutdown_other(TKO_CANCEL);
    xw_shutdown_other(TKO_CANCEL_NOWAIT);
  }
}

/* The waiter's own pool shuts down while it helps: a one-worker pool whose
 * task T waits on its own group; T's helper runs the newest member M1
 * (gated), M2 stays queued. */
typedef struct own {
  tko_pool *a;
  tko_group g;
  tt_pin pin; /* M1 */
  atomic_int m2_ran, rc, status, submit_rc;
  tt_count done;
} own;

static int own_fn(void *arg) {
  own *o = arg;
  int rc = tko_group_submit(o->a, &o->g, inc_fn, &o->m2_ran, 0);
  if (rc == 0) rc = tko_group_submit(o->a, &o->g, tt_pin_fn, &o->pin, 0);
  atomic_store(&o->submit_rc, rc);
  atomic_store(&o->rc, tko_group_wait(&o->g, TT_LONG_MS));
  atomic_store(&o->status, tko_group_status(&o->g));
  tt_count_add(&o->done, 1);
  return 0;
}

static void own_shutdown(tko_shutdown_mode mode) {
  own o;
  hookc h;
  memset(&o, 0, sizeof o);
  o.pin = (tt_pin)TT_PIN_INIT;
  tt_count_init(&o.done);
  o.a = mk_pool(1, 1, &h);
  cr_assert_eq(tko_group_init(&o.g), 0);
  cr_assert_eq(tko_submit(o.a, own_fn, &o, 0), 0);
  cr_assert(tt_count_wait_geq(&o.pin.started, 1), "the helper did not run the newest member");
  int rc = tko_pool_shutdown_timed(o.a, mode, 0);
  cr_assert_eq(rc, mode == TKO_CANCEL_NOWAIT ? 0 : -ETIMEDOUT, "mode %d: %d", mode, rc);
  if (mode != TKO_DRAIN) cr_assert_eq(tt_count_get(&h.cancels), 1, "M2 not cancelled");
  tt_gate_open(&o.pin.gate);
  if (mode == TKO_CANCEL_NOWAIT)
    cr_assert_eq(tko_pool_destroy(o.a), 0);
  else
    cr_assert_eq(tko_pool_shutdown(o.a, mode), 0);
  cr_assert_eq(tt_count_get(&o.done), 1);
  cr_assert_eq(atomic_load(&o.submit_rc), 0);
  cr_assert_eq(atomic_load(&o.rc), 0, "mode %d: wait %d", mode, atomic_load(&o.rc));
  cr_assert_eq(atomic_load(&o.m2_ran), mode == TKO_DRAIN ? 1 : 0);
  cr_assert_eq(atomic_load(&o.status), mode == TKO_DRAIN ? 0 : -ECANCELED);
  cr_assert_eq(tko_group_destroy(&o.g), 0);
  if (mode != TKO_CANCEL_NOWAIT) cr_assert_eq(tko_pool_destroy(o.a), 0);
}

Test(attack_hh, shutdown_of_the_waiters_own_pool_in_each_mode) {
  for (int i = 0; i < TT_SCALE(10, 3); i++) {
    own_shutdown(TKO_DRAIN);
    own_shutdown(TKO_CANCEL);
    own_shutdown(TKO_CANCEL_NOWAIT);
  }
}

/* A paused pool starts no queued task, helping waits included. */
typedef struct pz {
  tko_pool *a;
  atomic_int ran, rc_paused, ran_paused, rc_final;
  tt_count waiting;
} pz;

static int pz_fn(void *arg) {
  pz *p = arg;
  tko_group g;
  tko_group_init(&g);
  tko_pool_pause(p->a);
  for (int i = 0; i < 3; i++)
    tko_group_submit(p->a, &g, inc_fn, &p->ran, i);
  atomic_store(&p->rc_paused, tko_group_wait(&g, 20));
  atomic_store(&p->ran_paused, atomic_load(&p->ran));
  tt_count_add(&p->waiting, 1);
  atomic_store(&p->rc_final, tko_group_wait(&g, TT_LONG_MS));
  tko_group_destroy(&g);
  return 0;
}

Test(attack_hh, a_helper_on_a_paused_pool_runs_nothing_until_resume) {
  pz p;
  memset(&p, 0, sizeof p);
  tt_count_init(&p.waiting);
  p.a = mk_pool(1, 0, NULL);
  cr_assert_eq(tko_submit(p.a, pz_fn, &p, 0), 0);
  cr_assert(tt_count_wait_geq(&p.waiting, 1));
  cr_assert_eq(atomic_load(&p.rc_paused), -ETIMEDOUT);
  cr_assert_eq(atomic_load(&p.ran_paused), 0, "a helper started a task on a paused pool");
  cr_assert_eq(tko_pool_resume(p.a), 0);
  cr_assert_eq(tko_pool_wait_idle(p.a, TT_LONG_MS), 0, "the helper slept through the resume");
  cr_assert_eq(atomic_load(&p.rc_final), 0);
  cr_assert_eq(atomic_load(&p.ran), 3);
  cr_assert_eq(tko_pool_destroy(p.a), 0);
}

/* ---- weights, depth, elastic ---------------------------------------------------- */

typedef struct wo {
  tko_pool *p;
  atomic_int next;
  int seen[16];
} wo;

typedef struct wt {
  wo *o;
  int tag;
} wt;

static int wrec_fn(void *arg) {
  wt *t = arg;
  int i = atomic_fetch_add(&t->o->next, 1);
  if (i < 16) t->o->seen[i] = t->tag;
  return 0;
}

static int wparent_fn(void *arg) {
  wo *o = arg;
  static wt others[3], members[3];
  tko_group g;
  tko_group_init(&g);
  /* others: 10 (tag 20), 5 (tag 21), -5 (tag 22); members: 5 (tags 1,2),
   * INT_MIN (tag 3). */
  others[0] = (wt){o, 20};
  others[1] = (wt){o, 21};
  others[2] = (wt){o, 22};
  tko_submit(o->p, wrec_fn, &others[0], 10);
  tko_submit(o->p, wrec_fn, &others[1], 5);
  tko_submit(o->p, wrec_fn, &others[2], -5);
  members[0] = (wt){o, 1};
  members[1] = (wt){o, 2};
  members[2] = (wt){o, 3};
  tko_group_submit(o->p, &g, wrec_fn, &members[0], 5);
  tko_group_submit(o->p, &g, wrec_fn, &members[1], 5);
  tko_group_submit(o->p, &g, wrec_fn, &members[2], INT_MIN);
  tko_group_wait(&g, -1);
  tko_group_destroy(&g);
  return 0;
}

/* By weight: 10 first; then weight 5, the members before the other (newest
 * first); then -5, then the INT_MIN member; the wait ends there. */
Test(attack_hh, a_helper_keeps_weight_order_across_members_and_others) {
  wo o;
  memset(&o, 0, sizeof o);
  o.p = mk_pool(1, 0, NULL);
  cr_assert_eq(tko_submit(o.p, wparent_fn, &o, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(o.p, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&o.next), 6);
  int want[6] = {20, 2, 1, 21, 22, 3};
  for (int i = 0; i < 6; i++)
    cr_assert_eq(o.seen[i], want[i], "run %d was %d", i, o.seen[i]);
  cr_assert_eq(tko_pool_destroy(o.p), 0);
}

/* A chain deeper than TKO_MAX_HELP_DEPTH on one worker: the wait past the
 * limit returns -EDEADLK at once, and the chain unwinds cleanly. */
typedef struct deep {
  tko_pool *p;
  atomic_int deadlk_level, deepest, other_rc, ran;
} deep;

typedef struct dlink {
  deep *d;
  int level;
} dlink;

static int deep_fn(void *arg) {
  dlink *l = arg;
  deep *d = l->d;
  atomic_fetch_add(&d->ran, 1);
  int m = atomic_load(&d->deepest);
  while (l->level > m && !atomic_compare_exchange_weak(&d->deepest, &m, l->level)) {
  }
  if (l->level >= 100) return 0;
  dlink next = {d, l->level + 1};
  tko_group g;
  tko_group_init(&g);
  tko_group_submit(d->p, &g, deep_fn, &next, 0);
  int rc = tko_group_wait(&g, TT_LONG_MS);
  if (rc == -EDEADLK) {
    atomic_store(&d->deadlk_level, l->level);
    if (tko_group_cancel(&g) != 1) atomic_store(&d->other_rc, 99);
    rc = tko_group_wait(&g, TT_LONG_MS);
  }
  if (rc) atomic_store(&d->other_rc, rc);
  if (tko_group_destroy(&g)) atomic_store(&d->other_rc, 98);
  return 0;
}

Test(attack_hh, a_chain_past_the_help_depth_gets_edeadlk_and_unwinds) {
  deep d;
  memset(&d, 0, sizeof d);
  atomic_store(&d.deadlk_level, -1);
  d.p = mk_pool(1, 0, NULL);
  dlink root = {&d, 0};
  cr_assert_eq(tko_submit(d.p, deep_fn, &root, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(d.p, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&d.other_rc), 0, "rc %d", atomic_load(&d.other_rc));
  /* Level k makes the (k+1)-th nested wait: the 65th is refused. */
  cr_assert_eq(atomic_load(&d.deadlk_level), (int)TKO_MAX_HELP_DEPTH, "refused at level %d",
               atomic_load(&d.deadlk_level));
  cr_assert_eq(atomic_load(&d.deepest), (int)TKO_MAX_HELP_DEPTH);
  cr_assert_eq(atomic_load(&d.ran), (int)TKO_MAX_HELP_DEPTH + 1);
  cr_assert_eq(tko_pool_destroy(d.p), 0);
}

/* A fork-join tree on an elastic-only pool (no basic worker). */
typedef struct etree {
  tko_pool *p;
  atomic_int ran, bad;
} etree;
typedef struct enode {
  etree *t;
  int depth;
} enode;

static int enode_fn(void *arg) {
  enode *n = arg;
  atomic_fetch_add(&n->t->ran, 1);
  if (n->depth == 5) return 0;
  enode kids[3];
  tko_group g;
  tko_group_init(&g);
  for (int i = 0; i < 3; i++) {
    kids[i] = (enode){n->t, n->depth + 1};
    if (tko_group_submit(n->t->p, &g, enode_fn, &kids[i], i - 1)) atomic_store(&n->t->bad, 1);
  }
  if (tko_group_wait(&g, -1)) atomic_store(&n->t->bad, 2);
  tko_group_destroy(&g);
  return 0;
}

Test(attack_hh, a_fork_join_tree_completes_on_an_elastic_only_pool) {
  for (int round = 0; round < TT_SCALE(10, 3); round++) {
    etree t;
    memset(&t, 0, sizeof t);
    tko_options o = tko_elastic_options(0, 2, 5);
    cr_assert_eq(tko_pool_create(&t.p, &o), 0);
    enode root = {&t, 0};
    cr_assert_eq(tko_submit(t.p, enode_fn, &root, 0), 0);
    cr_assert_eq(tko_pool_wait_idle(t.p, TT_LONG_MS), 0);
    cr_assert_eq(atomic_load(&t.bad), 0);
    cr_assert_eq(atomic_load(&t.ran), 364); /* (3^6 - 1) / 2 */
    cr_assert_eq(tko_pool_destroy(t.p), 0);
  }
}

/* ---- handles ----------------------------------------------------------------------- */

/* Cancel racing the start from another thread, many times: exactly one of
 * "ran" and "on_cancel" per task, matching the cancel's result and the
 * status. */
typedef struct hrace {
  tko_handle h[64];
  atomic_int ran[64];
  atomic_int go;
} hrace;

typedef struct hslot {
  hrace *r;
  int i;
} hslot;

static int hslot_fn(void *arg) {
  hslot *s = arg;
  atomic_fetch_add(&s->r->ran[s->i], 1);
  return 3;
}

static void *hcanceller(void *arg) {
  hrace *r = arg;
  while (!atomic_load(&r->go)) {
  }
  long *res = calloc(64, sizeof *res);
  for (int i = 63; i >= 0; i--)
    res[i] = tko_handle_cancel(&r->h[i]);
  return res;
}

typedef struct cancel_seen {
  atomic_int n[64];
  hrace *r;
  hslot *slots;
} cancel_seen;

static void hr_cancel(void *user, const tko_task_info *t) {
  hslot *s = t->arg;
  atomic_fetch_add(&((cancel_seen *)user)->n[s->i], 1);
}

Test(attack_hh, handle_cancel_racing_starts_from_another_thread) {
  static hrace r;
  static cancel_seen cs;
  static hslot slots[64];
  for (int round = 0; round < TT_SCALE(100, 20); round++) {
    memset(&r, 0, sizeof r);
    memset(&cs, 0, sizeof cs);
    tko_options o = tko_basic_options(2);
    o.hooks.user = &cs;
    o.hooks.on_cancel = hr_cancel;
    tko_pool *p;
    cr_assert_eq(tko_pool_create(&p, &o), 0);
    pthread_t th;
    pthread_create(&th, NULL, hcanceller, &r);
    /* The workers start from the front while the canceller works from the
     * back: they meet somewhere in the middle. (A cancel may only follow
     * the submit's return, so every submit comes first.) */
    for (int i = 0; i < 64; i++) {
      slots[i] = (hslot){&r, i};
      cr_assert_eq(tko_submit_handle(p, &r.h[i], hslot_fn, &slots[i], 0), 0);
    }
    atomic_store(&r.go, 1);
    long *res;
    pthread_join(th, (void **)&res);
    for (int i = 0; i < 64; i++)
      cr_assert_eq(tko_handle_wait(&r.h[i], TT_LONG_MS), 0);
    for (int i = 0; i < 64; i++) {
      int ran = atomic_load(&r.ran[i]), canc = atomic_load(&cs.n[i]);
      int st = tko_handle_status(&r.h[i]);
      cr_assert_eq(ran + canc, 1, "task %d: ran %d cancelled %d", i, ran, canc);
      if (res[i] == 0) {
        cr_assert_eq(canc, 1);
        cr_assert_eq(st, -ECANCELED);
        cr_assert_eq(tko_handle_cancel(&r.h[i]), -EALREADY);
      } else {
        cr_assert_eq(res[i], -EBUSY, "cancel %d gave %ld", i, res[i]);
        cr_assert_eq(ran, 1);
        cr_assert_eq(st, 3);
        cr_assert_eq(tko_handle_cancel(&r.h[i]), -EBUSY);
      }
    }
    free(res);
    cr_assert_eq(tko_pool_destroy(p), 0);
  }
}

/* A chain of handle waits from tasks on a one-worker pool: each task
 * submits the next and waits on it; then the same chain across two pools,
 * where each waits on a handle of the other pool. */
typedef struct hchain {
  tko_pool *p[2];
  int npools;
  atomic_int bad, ran;
} hchain;
typedef struct hlink {
  hchain *c;
  int n;
} hlink;

static int hlink_fn(void *arg) {
  hlink *l = arg;
  atomic_fetch_add(&l->c->ran, 1);
  if (l->n == 10) return l->n;
  hlink next = {l->c, l->n + 1};
  tko_handle h;
  int rc = tko_submit_handle(l->c->p[next.n % l->c->npools], &h, hlink_fn, &next, 0);
  if (rc == 0) rc = tko_handle_wait(&h, TT_LONG_MS);
  if (rc)
    atomic_store(&l->c->bad, rc);
  else if (tko_handle_status(&h) != l->n + 1)
    atomic_store(&l->c->bad, 1000 + l->n);
  return l->n;
}

Test(attack_hh, a_chain_of_handle_waits_on_one_worker_pool) {
  hchain c;
  memset(&c, 0, sizeof c);
  c.npools = 1;
  c.p[0] = mk_pool(1, 0, NULL);
  hlink root = {&c, 0};
  cr_assert_eq(tko_submit(c.p[0], hlink_fn, &root, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(c.p[0], TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&c.bad), 0, "bad %d", atomic_load(&c.bad));
  cr_assert_eq(atomic_load(&c.ran), 11);
  cr_assert_eq(tko_pool_destroy(c.p[0]), 0);
}

/* A task of pool A waits on a handle of pool B (B's worker pinned, so the
 * task is queued): it must wake when B runs it. */
typedef struct hx {
  tko_pool *a, *b;
  tko_handle h;
  atomic_int ran, rc;
  tt_count waiting;
} hx;

static int hx_fn(void *arg) {
  hx *x = arg;
  tt_count_add(&x->waiting, 1);
  atomic_store(&x->rc, tko_handle_wait(&x->h, TT_LONG_MS));
  return 0;
}

Test(attack_hh, a_task_waits_on_a_handle_of_another_pool) {
  hx x;
  memset(&x, 0, sizeof x);
  tt_count_init(&x.waiting);
  atomic_store(&x.rc, 1);
  tt_pin pin = TT_PIN_INIT;
  x.a = mk_pool(1, 0, NULL);
  x.b = mk_pool(1, 0, NULL);
  cr_assert_eq(tko_submit(x.b, tt_pin_fn, &pin, 0), 0);
  cr_assert(tt_count_wait_geq(&pin.started, 1));
  cr_assert_eq(tko_submit_handle(x.b, &x.h, inc_fn, &x.ran, 0), 0);
  cr_assert_eq(tko_submit(x.a, hx_fn, &x, 0), 0);
  cr_assert(tt_count_wait_geq(&x.waiting, 1));
  tt_gate_open(&pin.gate);
  cr_assert_eq(tko_pool_wait_idle(x.a, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&x.rc), 0);
  cr_assert_eq(atomic_load(&x.ran), 1);
  cr_assert_eq(tko_pool_destroy(x.a), 0);
  cr_assert_eq(tko_pool_destroy(x.b), 0);
}

/* Hooks that wait on handles: on_cancel on its own handle gets -EDEADLK at
 * once; before_run of a task waiting on its own handle must not hang. */
typedef struct hh {
  tko_handle h;
  atomic_int rc_cancel, rc_before, rc_after, ran;
  atomic_int in_hook;
} hh;

static void hh_on_cancel(void *user, const tko_task_info *t) {
  (void)user;
  hh *x = t->arg;
  atomic_store(&x->rc_cancel, tko_handle_wait(&x->h, 5000));
}
static void hh_before(void *user, const tko_task_info *t) {
  (void)user;
  hh *x = t->arg;
  if (!x) return;
  atomic_store(&x->rc_before, tko_handle_wait(&x->h, 2000));
}
static void hh_after(void *user, const tko_task_info *t) {
  (void)user;
  hh *x = t->arg;
  if (!x) return;
  atomic_store(&x->rc_after, tko_handle_wait(&x->h, 2000));
}

static int hh_fn(void *arg) {
  atomic_fetch_add(&((hh *)arg)->ran, 1);
  return 0;
}

Test(attack_hh, on_cancel_waiting_on_its_own_handle_gets_edeadlk) {
  tko_options o = tko_basic_options(1);
  o.hooks.on_cancel = hh_on_cancel;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  tt_pin pin = TT_PIN_INIT;
  cr_assert_eq(tko_submit(p, tt_pin_fn, &pin, 0), 0);
  cr_assert(tt_count_wait_geq(&pin.started, 1));
  hh x;
  memset(&x, 0, sizeof x);
  atomic_store(&x.rc_cancel, 1);
  cr_assert_eq(tko_submit_handle(p, &x.h, hh_fn, &x, 0), 0);
  cr_assert_eq(tko_handle_cancel(&x.h), 0);
  cr_assert_eq(atomic_load(&x.rc_cancel), -EDEADLK);
  cr_assert_eq(tko_handle_status(&x.h), -ECANCELED);
  tt_gate_open(&pin.gate);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

Test(attack_hh, before_and_after_run_waiting_on_their_tasks_handle_do_not_hang) {
  tko_options o = tko_basic_options(1);
  o.hooks.before_run = hh_before;
  o.hooks.after_run = hh_after;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  hh x;
  memset(&x, 0, sizeof x);
  atomic_store(&x.rc_before, 1);
  atomic_store(&x.rc_after, 1);
  cr_assert_eq(tko_submit_handle(p, &x.h, hh_fn, &x, 0), 0);
  cr_assert_eq(tko_handle_wait(&x.h, TT_LONG_MS), 0);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&x.ran), 1);
  /* before_run: the task cannot end while its hook waits - the wait can
   * only be refused (-EDEADLK) or time out; after_run: the task returned. */
  int rb = atomic_load(&x.rc_before), ra = atomic_load(&x.rc_after);
  fprintf(stderr, "before_run wait: %d, after_run wait: %d\n", rb, ra);
  cr_assert(rb == -EDEADLK || rb == -ETIMEDOUT, "before_run wait %d", rb);
  cr_assert(ra == -EDEADLK || ra == 0 || ra == -ETIMEDOUT, "after_run wait %d", ra);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* Many waiters, threads and tasks of another pool, on one handle; the
 * handle's memory is freed as soon as the last wait returns. */
typedef struct many {
  tko_handle *h;
  tt_count waiting, done;
  atomic_int bad;
} many;

static void *many_thread(void *arg) {
  many *m = arg;
  tt_count_add(&m->waiting, 1);
  if (tko_handle_wait(m->h, TT_LONG_MS) != 0) atomic_store(&m->bad, 1);
  tt_count_add(&m->done, 1);
  return NULL;
}
static int many_task(void *arg) {
  many_thread(arg);
  return 0;
}

Test(attack_hh, many_waiters_on_one_handle_then_free) {
  for (int round = 0; round < TT_SCALE(20, 5); round++) {
    many m;
    memset(&m, 0, sizeof m);
    tt_count_init(&m.waiting);
    tt_count_init(&m.done);
    tt_pin pin = TT_PIN_INIT;
    tko_pool *p = mk_pool(1, 0, NULL), *q = mk_pool(4, 0, NULL);
    m.h = malloc(sizeof *m.h);
    cr_assert_eq(tko_submit_handle(p, m.h, tt_pin_fn, &pin, 0), 0);
    pthread_t th[6];
    for (int i = 0; i < 6; i++)
      pthread_create(&th[i], NULL, many_thread, &m);
    for (int i = 0; i < 4; i++)
      cr_assert_eq(tko_submit(q, many_task, &m, 0), 0);
    cr_assert(tt_count_wait_geq(&m.waiting, 10));
    cr_assert(tt_count_wait_geq(&pin.started, 1));
    tt_gate_open(&pin.gate);
    for (int i = 0; i < 6; i++)
      pthread_join(th[i], NULL);
    cr_assert_eq(tko_pool_wait_idle(q, TT_LONG_MS), 0);
    cr_assert_eq(atomic_load(&m.bad), 0);
    cr_assert_eq(tko_handle_status(m.h), 0);
    free(m.h);
    cr_assert_eq(tko_pool_destroy(p), 0);
    cr_assert_eq(tko_pool_destroy(q), 0);
  }
}

/* Free (or resubmit) the handle the moment a wait or a status read says it
 * ended, while the task's end races that read. ASan catches a late touch. */
Test(attack_hh, a_handle_freed_right_after_its_end_is_seen) {
  tko_pool *p = mk_pool(2, 0, NULL);
  atomic_int ran = 0;
  for (int i = 0; i < TT_SCALE(5000, 1000); i++) {
    tko_handle *h = malloc(sizeof *h);
    memset(h, 0xA5, sizeof *h); /* no set-up needed */
    cr_assert_eq(tko_submit_handle(p, h, inc_fn, &ran, 0), 0);
    if (i % 3 == 0) {
      cr_assert_eq(tko_handle_wait(h, TT_LONG_MS), 0);
    } else if (i % 3 == 1) {
      uint64_t end = tt_now_ns() + (uint64_t)TT_LONG_MS * 1000000u;
      while (tko_handle_status(h) == -EINPROGRESS)
        cr_assert_lt(tt_now_ns(), end);
    } else {
      int rc = tko_handle_cancel(h);
      cr_assert(rc == 0 || rc == -EBUSY);
      /* A cancelled task a worker had taken reaches on_cancel when that
       * worker gets to it: its status is -EINPROGRESS until then. */
      cr_assert_eq(tko_handle_wait(h, TT_LONG_MS), 0);
      if (rc == 0) cr_assert_eq(tko_handle_status(h), -ECANCELED);
    }
    /* reuse once, then free */
    if (i % 7 == 0) {
      cr_assert_eq(tko_submit_handle(p, h, inc_fn, &ran, 0), 0);
      cr_assert_eq(tko_handle_wait(h, TT_LONG_MS), 0);
    }
    memset(h, 0x5A, sizeof *h);
    free(h);
  }
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* Handles through shutdown in each mode: queued ones run (DRAIN) or are
 * cancelled (CANCEL, CANCEL_NOWAIT); a running one ends normally; submits
 * afterwards fail and leave the handle unarmed. */
static void handles_shutdown(tko_shutdown_mode mode) {
  hookc h;
  tko_pool *p = mk_pool(1, 1, &h);
  tt_pin pin = TT_PIN_INIT;
  tko_handle hp, hq[4];
  atomic_int ran = 0;
  cr_assert_eq(tko_submit_handle(p, &hp, tt_pin_fn, &pin, 0), 0);
  cr_assert(tt_count_wait_geq(&pin.started, 1));
  for (int i = 0; i < 4; i++)
    cr_assert_eq(tko_submit_handle(p, &hq[i], inc_fn, &ran, i), 0);
  int rc = tko_pool_shutdown_timed(p, mode, 0);
  cr_assert_eq(rc, mode == TKO_CANCEL_NOWAIT ? 0 : -ETIMEDOUT);
  tko_handle late;
  memset(&late, 0, sizeof late);
  cr_assert_eq(tko_submit_handle(p, &late, inc_fn, &ran, 0), -ESHUTDOWN);
  cr_assert_eq(tko_handle_id(&late), 0);
  cr_assert_eq(tko_handle_status(&late), -EINVAL);
  cr_assert_eq(tko_handle_wait(&late, 0), -EINVAL);
  cr_assert_eq(tko_handle_cancel(&late), -EINVAL);
  if (mode != TKO_DRAIN)
    for (int i = 0; i < 4; i++) {
      cr_assert_eq(tko_handle_wait(&hq[i], TT_LONG_MS), 0, "mode %d: queued handle %d", mode, i);
      cr_assert_eq(tko_handle_status(&hq[i]), -ECANCELED);
      cr_assert_eq(tko_handle_cancel(&hq[i]), -EALREADY);
    }
  cr_assert_eq(tko_handle_wait(&hp, 0), -ETIMEDOUT);
  cr_assert_eq(tko_handle_cancel(&hp), -EBUSY);
  tt_gate_open(&pin.gate);
  cr_assert_eq(tko_handle_wait(&hp, TT_LONG_MS), 0);
  cr_assert_eq(tko_handle_status(&hp), 0);
  for (int i = 0; i < 4; i++)
    cr_assert_eq(tko_handle_wait(&hq[i], TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&ran), mode == TKO_DRAIN ? 4 : 0);
  cr_assert_eq(tt_count_get(&h.cancels), mode == TKO_DRAIN ? 0 : 4);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

Test(attack_hh, handles_through_shutdown_in_each_mode) {
  handles_shutdown(TKO_DRAIN);
  handles_shutdown(TKO_CANCEL);
  handles_shutdown(TKO_CANCEL_NOWAIT);
}

/* A task waiting on a queued handle of its own paused pool runs nothing;
 * after resume it runs it. Cancel works on the paused pool. */
typedef struct hp {
  tko_pool *p;
  tko_handle h, h2;
  atomic_int ran, rc_paused, ran_paused, rc_final, rc_cancel, ran2;
  tt_count waited;
} hp;

static int hp_fn(void *arg) {
  hp *x = arg;
  tko_pool_pause(x->p);
  tko_submit_handle(x->p, &x->h, inc_fn, &x->ran, 0);
  tko_submit_handle(x->p, &x->h2, inc_fn, &x->ran2, 0);
  atomic_store(&x->rc_paused, tko_handle_wait(&x->h, 20));
  atomic_store(&x->ran_paused, atomic_load(&x->ran));
  atomic_store(&x->rc_cancel, tko_handle_cancel(&x->h2));
  tt_count_add(&x->waited, 1);
  atomic_store(&x->rc_final, tko_handle_wait(&x->h, TT_LONG_MS));
  return 0;
}

Test(attack_hh, a_handle_wait_on_a_paused_pool_runs_nothing_until_resume) {
  hp x;
  hookc h;
  memset(&x, 0, sizeof x);
  tt_count_init(&x.waited);
  x.p = mk_pool(1, 0, &h);
  cr_assert_eq(tko_submit(x.p, hp_fn, &x, 0), 0);
  cr_assert(tt_count_wait_geq(&x.waited, 1));
  cr_assert_eq(atomic_load(&x.rc_paused), -ETIMEDOUT);
  cr_assert_eq(atomic_load(&x.ran_paused), 0);
  cr_assert_eq(atomic_load(&x.rc_cancel), 0);
  cr_assert_eq(tko_pool_resume(x.p), 0);
  cr_assert_eq(tko_pool_wait_idle(x.p, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&x.rc_final), 0);
  cr_assert_eq(atomic_load(&x.ran), 1);
  cr_assert_eq(atomic_load(&x.ran2), 0);
  cr_assert_eq(tko_handle_status(&x.h2), -ECANCELED);
  cr_assert_eq(tt_count_get(&h.cancels), 1);
  cr_assert_eq(tko_pool_destroy(x.p), 0);
}

/* Caller-runs on a full bounded queue: the task has ended when the submit
 * returns, its id is 0, cancel is -EBUSY, waits return 0 at once. */
Test(attack_hh, a_caller_runs_handle_has_ended_at_return) {
  tko_options o = tko_basic_options(1);
  o.queue_capacity = 1;
  o.full_policy = TKO_FULL_CALLER_RUNS;
  o.max_batch = 1;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  tt_pin pin = TT_PIN_INIT;
  atomic_int ran = 0;
  cr_assert_eq(tko_submit(p, tt_pin_fn, &pin, 0), 0);
  cr_assert(tt_count_wait_geq(&pin.started, 1));
  tko_handle hq, hc;
  cr_assert_eq(tko_submit_handle(p, &hq, inc_fn, &ran, 0), 0); /* fills the queue */
  cr_assert_eq(tko_submit_handle(p, &hc, count_fn7, &ran, 0), 0);
  cr_assert_eq(atomic_load(&ran), 1);
  cr_assert_eq(tko_handle_id(&hc), 0);
  cr_assert_eq(tko_handle_status(&hc), 7);
  cr_assert_eq(tko_handle_wait(&hc, 0), 0);
  cr_assert_eq(tko_handle_cancel(&hc), -EBUSY);
  cr_assert_neq(tko_handle_id(&hq), 0);
  cr_assert_eq(tko_handle_status(&hq), -EINPROGRESS);
  tt_gate_open(&pin.gate);
  cr_assert_eq(tko_handle_wait(&hq, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&ran), 2);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* Huge timeouts must not overflow into "already past": a wait of LONG_MAX
 * on a task still held ends with 0 once it ends, never -ETIMEDOUT. The
 * waiter runs on a thread of its own (which_wait 0: group and wait_idle,
 * 1: handle) or in a task of another pool (2: group, 3: handle). */
typedef struct big {
  tko_handle *h;
  tko_group *g;
  tko_pool *p;
  tt_count started;
  int which;
  atomic_int rc_h, rc_g, rc_idle;
} big;

static void *big_waiter(void *arg) {
  big *b = arg;
  tt_count_add(&b->started, 1);
  if (b->which == 1 || b->which == 3) atomic_store(&b->rc_h, tko_handle_wait(b->h, LONG_MAX));
  if (b->which == 0 || b->which == 2) atomic_store(&b->rc_g, tko_group_wait(b->g, LONG_MAX));
  if (b->which == 0) atomic_store(&b->rc_idle, tko_pool_wait_idle(b->p, LONG_MAX));
  return NULL;
}
static int big_task(void *arg) {
  big_waiter(arg);
  return 0;
}

static void huge_timeout_scene(int which) {
  tko_pool *p = mk_pool(1, 0, NULL), *other = mk_pool(1, 0, NULL);
  tt_pin pin = TT_PIN_INIT;
  tko_handle h;
  tko_group g;
  cr_assert_eq(tko_group_init(&g), 0);
  if (which == 1 || which == 3)
    cr_assert_eq(tko_submit_handle(p, &h, tt_pin_fn, &pin, 0), 0);
  else
    cr_assert_eq(tko_group_submit(p, &g, tt_pin_fn, &pin, 0), 0);
  big b = {&h, &g, p, TT_COUNT_INIT, which, 0, 0, 0};
  pthread_t th;
  if (which < 2)
    pthread_create(&th, NULL, big_waiter, &b);
  else
    cr_assert_eq(tko_submit(other, big_task, &b, 0), 0);
  cr_assert(tt_count_wait_geq(&b.started, 1));
  cr_assert(tt_count_wait_geq(&pin.started, 1));
  tt_spin_ns(20000000); /* lets the waiter block: a wait that returns early fails anyway */
  tt_gate_open(&pin.gate);
  if (which < 2)
    pthread_join(th, NULL);
  else
    cr_assert_eq(tko_pool_wait_idle(other, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&b.rc_h), 0, "scene %d: handle wait %d", which, atomic_load(&b.rc_h));
  cr_assert_eq(atomic_load(&b.rc_g), 0, "scene %d: group wait %d", which, atomic_load(&b.rc_g));
  cr_assert_eq(atomic_load(&b.rc_idle), 0, "wait_idle %d", atomic_load(&b.rc_idle));
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  cr_assert_eq(tko_group_destroy(&g), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
  cr_assert_eq(tko_pool_destroy(other), 0);
}

Test(attack_hh, huge_group_and_idle_timeouts_wait_instead_of_timing_out) {
  huge_timeout_scene(0);
  huge_timeout_scene(2);
}

/* tko_handle_wait with a timeout above about INT64_MAX / 1e6 ms (LONG_MAX
 * included, which the header accepts: only values below -1 are -EINVAL)
 * waits without a limit, as tko_group_wait and tko_pool_wait_idle do: its
 * deadline in nanoseconds would overflow. */
Test(attack_hh, huge_handle_timeouts_wait_instead_of_timing_out) {
  huge_timeout_scene(1);
  huge_timeout_scene(3);
}

Test(attack_hh, handle_calls_refuse_bad_arguments) {
  tko_pool *p = mk_pool(1, 0, NULL);
  atomic_int ran = 0;
  tko_handle h, z;
  memset(&z, 0, sizeof z);
  cr_assert_eq(tko_submit_handle(NULL, &h, inc_fn, &ran, 0), -EINVAL);
  cr_assert_eq(tko_submit_handle(p, NULL, inc_fn, &ran, 0), -EINVAL);
  cr_assert_eq(tko_submit_handle(p, &z, NULL, &ran, 0), -EINVAL);
  cr_assert_eq(tko_handle_id(&z), 0);
  cr_assert_eq(tko_handle_status(&z), -EINVAL);
  cr_assert_eq(tko_handle_wait(&z, -1), -EINVAL);
  cr_assert_eq(tko_handle_cancel(&z), -EINVAL);
  cr_assert_eq(tko_handle_wait(NULL, 0), -EINVAL);
  cr_assert_eq(tko_handle_cancel(NULL), -EINVAL);
  cr_assert_eq(tko_handle_status(NULL), -EINVAL);
  cr_assert_eq(tko_handle_id(NULL), 0);
  cr_assert_eq(tko_submit_handle(p, &h, inc_fn, &ran, 0), 0);
  cr_assert_eq(tko_handle_wait(&h, -2), -EINVAL);
  cr_assert_eq(tko_handle_wait(&h, LONG_MIN), -EINVAL);
  cr_assert_eq(tko_handle_wait(&h, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&ran), 1);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* The task itself, and a task nested in a helping wait inside it, waiting
 * on its own handle: -EDEADLK at once; cancel from the task: -EBUSY. */
typedef struct selfw {
  tko_pool *p;
  tko_handle h;
  atomic_int rc_self, rc_nested, rc_cancel;
} selfw;

static int selfw_inner(void *arg) {
  selfw *s = arg;
  atomic_store(&s->rc_nested, tko_handle_wait(&s->h, 2000));
  return 0;
}

static int selfw_fn(void *arg) {
  selfw *s = arg;
  atomic_store(&s->rc_self, tko_handle_wait(&s->h, 2000));
  atomic_store(&s->rc_cancel, tko_handle_cancel(&s->h));
  tko_group g;
  tko_group_init(&g);
  tko_group_submit(s->p, &g, selfw_inner, s, 0);
  tko_group_wait(&g, TT_LONG_MS);
  tko_group_destroy(&g);
  return 0;
}

Test(attack_hh, a_task_waiting_on_its_own_handle_gets_edeadlk) {
  selfw s;
  memset(&s, 0, sizeof s);
  s.p = mk_pool(1, 0, NULL);
  atomic_store(&s.rc_self, 1);
  atomic_store(&s.rc_nested, 1);
  cr_assert_eq(tko_submit_handle(s.p, &s.h, selfw_fn, &s, 0), 0);
  cr_assert_eq(tko_handle_wait(&s.h, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&s.rc_self), -EDEADLK);
  cr_assert_eq(atomic_load(&s.rc_cancel), -EBUSY);
  cr_assert_eq(atomic_load(&s.rc_nested), -EDEADLK);
  cr_assert_eq(tko_pool_destroy(s.p), 0);
}

/* fork(): in the child, the parent's pending handle refuses with -ECHILD. */
Test(attack_hh, a_forked_child_gets_echild_on_a_pending_handle) {
#ifdef TT_SANITIZED
  cr_skip_test("fork with pool threads under a sanitizer");
#else
  tko_pool *p = mk_pool(1, 0, NULL);
  tt_pin pin = TT_PIN_INIT;
  tko_handle hp, hq, done;
  atomic_int ran = 0;
  cr_assert_eq(tko_submit_handle(p, &done, count_fn7, &ran, 0), 0);
  cr_assert_eq(tko_handle_wait(&done, TT_LONG_MS), 0);
  cr_assert_eq(tko_submit_handle(p, &hp, tt_pin_fn, &pin, 0), 0);
  cr_assert(tt_count_wait_geq(&pin.started, 1));
  cr_assert_eq(tko_submit_handle(p, &hq, inc_fn, &ran, 0), 0);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    alarm(30);
    int code = 0;
    tko_handle x;
    if (tko_handle_wait(&hp, 1000) != -ECHILD) code |= 1;
    if (tko_handle_wait(&hq, -1) != -ECHILD) code |= 2;
    if (tko_handle_cancel(&hq) != -ECHILD) code |= 4;
    if (tko_submit_handle(p, &x, inc_fn, &ran, 0) != -ECHILD) code |= 8;
    if (tko_handle_status(&hq) != -EINPROGRESS) code |= 16;
    if (tko_handle_status(&done) != 7) code |= 32;
    if (tko_handle_wait(&done, -1) != 0) code |= 64;
    if (tko_pool_destroy(p) != 0) code |= 128;
    _exit(code);
  }
  int st;
  cr_assert_eq(waitpid(pid, &st, 0), pid);
  cr_assert(WIFEXITED(st), "child died: 0x%x", st);
  cr_assert_eq(WEXITSTATUS(st), 0, "child code 0x%x", WEXITSTATUS(st));
  tt_gate_open(&pin.gate);
  cr_assert_eq(tko_handle_wait(&hq, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&ran), 2);
  cr_assert_eq(tko_pool_destroy(p), 0);
#endif
}

/* The other pool is destroyed while a task waits on its group: destroy
 * drains the members, the wait returns 0, nothing hangs. */
Test(attack_hh, destroy_of_the_other_pool_while_a_task_waits_on_its_group) {
  for (int i = 0; i < TT_SCALE(10, 3); i++) {
    xw x;
    hookc hb;
    xw_setup(&x, &hb, 3);
    cr_assert_eq(tko_pool_shutdown_timed(x.b, TKO_CANCEL_NOWAIT, 0), 0);
    tt_gate_open(&x.pin.gate);
    cr_assert_eq(tko_pool_destroy(x.b), 0);
    cr_assert(tt_count_wait_geq(&x.done, 1));
    cr_assert_eq(atomic_load(&x.rc), 0);
    cr_assert_eq(atomic_load(&x.status), -ECANCELED);
    /* B is gone: a submit into the group's old pool is a host bug, but a
     * wait on the (now empty) group is fine. */
    cr_assert_eq(tko_group_wait(&x.gb, 0), 0);
    cr_assert_eq(tko_pool_wait_idle(x.a, TT_LONG_MS), 0);
    cr_assert_eq(tko_group_destroy(&x.gb), 0);
    cr_assert_eq(tko_pool_destroy(x.a), 0);
  }
}

/* ---- pause and resume while a helper sleeps ------------------------------------ */

/* A's one worker sleeps in a wait on a group of B (B pinned). A is paused
 * and a task queued in A: the sleeping helper must not start it, not even
 * when B's end wakes it; after resume it runs. */
typedef struct ps {
  xw x;
  atomic_int a_ran;
} ps;

Test(attack_hh, a_sleeping_helper_of_a_paused_pool_starts_nothing) {
  static ps s;
  hookc hb;
  xw_setup(&s.x, &hb, 2);
  atomic_store(&s.a_ran, 0);
  cr_assert_eq(tko_pool_pause(s.x.a), 0);
  cr_assert_eq(tko_submit(s.x.a, inc_fn, &s.a_ran, 100), 0);
  tt_gate_open(&s.x.pin.gate);
  cr_assert(tt_count_wait_geq(&s.x.done, 1), "the helper was not woken by the group's end");
  cr_assert_eq(atomic_load(&s.x.rc), 0);
  cr_assert_eq(atomic_load(&s.a_ran), 0, "a helper started a task on a paused pool");
  cr_assert_eq(tko_pool_wait_idle(s.x.a, 0), -ETIMEDOUT);
  cr_assert_eq(tko_pool_resume(s.x.a), 0);
  cr_assert_eq(tko_pool_wait_idle(s.x.a, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&s.a_ran), 1);
  cr_assert_eq(tko_pool_wait_idle(s.x.b, TT_LONG_MS), 0);
  cr_assert_eq(tko_group_destroy(&s.x.gb), 0);
  cr_assert_eq(tko_pool_destroy(s.x.a), 0);
  cr_assert_eq(tko_pool_destroy(s.x.b), 0);
}

/* The resume must wake a sleeping helper that has work to do: A (paused,
 * one worker, inside T's wait on B's group) holds the member of a group
 * that B's task waits on. Only A's worker can run it, and only after the
 * resume. */
typedef struct pw {
  tko_pool *a, *b;
  tko_group ga, gb;
  atomic_int inner_ran, rc_a, rc_b;
  tt_count b_waiting;
} pw;

static int pw_inner(void *arg) {
  atomic_fetch_add(&((pw *)arg)->inner_ran, 1);
  return 0;
}
static int pw_b(void *arg) {
  pw *x = arg;
  int rc = tko_group_submit(x->a, &x->ga, pw_inner, x, 0);
  tt_count_add(&x->b_waiting, 1);
  if (rc == 0) rc = tko_group_wait(&x->ga, TT_LONG_MS);
  atomic_store(&x->rc_b, rc);
  return 0;
}
static int pw_a(void *arg) {
  pw *x = arg;
  tko_pool_pause(x->a);
  int rc = tko_group_submit(x->b, &x->gb, pw_b, x, 0);
  if (rc == 0) rc = tko_group_wait(&x->gb, TT_LONG_MS);
  atomic_store(&x->rc_a, rc);
  return 0;
}

Test(attack_hh, a_resume_wakes_a_sleeping_helper_to_run_what_it_holds) {
  pw x;
  memset(&x, 0, sizeof x);
  tt_count_init(&x.b_waiting);
  atomic_store(&x.rc_a, 1);
  atomic_store(&x.rc_b, 1);
  x.a = mk_pool(1, 0, NULL);
  x.b = mk_pool(1, 0, NULL);
  cr_assert_eq(tko_group_init(&x.ga), 0);
  cr_assert_eq(tko_group_init(&x.gb), 0);
  cr_assert_eq(tko_submit(x.a, pw_a, &x, 0), 0);
  cr_assert(tt_count_wait_geq(&x.b_waiting, 1));
  cr_assert_eq(tko_group_wait(&x.ga, 20), -ETIMEDOUT);
  cr_assert_eq(atomic_load(&x.inner_ran), 0, "ran on a paused pool");
  cr_assert_eq(tko_pool_resume(x.a), 0);
  cr_assert_eq(tko_pool_wait_idle(x.a, TT_LONG_MS), 0, "the helper slept through the resume");
  cr_assert_eq(tko_pool_wait_idle(x.b, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&x.inner_ran), 1);
  cr_assert_eq(atomic_load(&x.rc_a), 0);
  cr_assert_eq(atomic_load(&x.rc_b), 0);
  cr_assert_eq(tko_group_destroy(&x.ga), 0);
  cr_assert_eq(tko_group_destroy(&x.gb), 0);
  cr_assert_eq(tko_pool_destroy(x.a), 0);
  cr_assert_eq(tko_pool_destroy(x.b), 0);
}

/* ---- trees across pools, shut down concurrently in the three modes -------------- */

#define ST_POOLS 3

typedef struct st {
  tko_pool *p[ST_POOLS];
  atomic_long accepted, ran, cancelled, edeadlk;
  atomic_int bad;
  tt_count started;
} st;

typedef struct stn {
  st *s;
  int depth, pool;
} stn;

static void st_cancel(void *user, const tko_task_info *t) {
  (void)t;
  atomic_fetch_add(&((st *)user)->cancelled, 1);
}

static int stn_fn(void *arg) {
  stn *n = arg;
  st *s = n->s;
  atomic_fetch_add(&s->ran, 1);
  tt_count_add(&s->started, 1);
  if (n->depth == 5) {
    tt_spin_ns(2000);
    return 0;
  }
  /* One group per pool: a group's pending members share one pool. */
  stn kids[3];
  tko_group g[3];
  for (int i = 0; i < 3; i++) {
    tko_group_init(&g[i]);
    kids[i] = (stn){s, n->depth + 1, (n->pool + i) % ST_POOLS};
    int rc = tko_group_submit(s->p[kids[i].pool], &g[i], stn_fn, &kids[i], n->depth - i);
    if (rc == 0)
      atomic_fetch_add(&s->accepted, 1);
    else if (rc != -ESHUTDOWN)
      atomic_store(&s->bad, rc);
  }
  for (int i = 0; i < 3; i++) {
    /* Helpers here run any queued node of their pool, not only their own
     * subtree, so a worker's nesting can pass TKO_MAX_HELP_DEPTH: that wait
     * returns -EDEADLK at once (documented), and the node waits again
     * until its member ends elsewhere. */
    int rc = tko_group_wait(&g[i], -1);
    uint64_t end = tt_now_ns() + (uint64_t)TT_LONG_MS * 1000000u;
    while (rc == -EDEADLK && tt_now_ns() < end) {
      atomic_fetch_add(&s->edeadlk, 1);
      sched_yield();
      rc = tko_group_wait(&g[i], -1);
    }
    if (rc) {
      fprintf(stderr, "tree node depth %d pool %d: wait %d, pending %lu\n", n->depth, n->pool, rc,
              (unsigned long)tko_group_pending(&g[i]));
      atomic_store(&s->bad, rc);
      abort(); /* the kids on this stack are still pending */
    }
    if (tko_group_destroy(&g[i])) atomic_store(&s->bad, 77);
  }
  return 0;
}

typedef struct st_sd {
  tko_pool *p;
  tko_shutdown_mode mode;
  int rc;
} st_sd;

static void *st_shutdown(void *arg) {
  st_sd *d = arg;
  d->rc = tko_pool_shutdown_timed(d->p, d->mode, TT_LONG_MS);
  return NULL;
}

Test(attack_hh, trees_across_pools_survive_concurrent_shutdowns_in_every_mode) {
  long edeadlk_total = 0;
  for (int round = 0; round < TT_SCALE(20, 5); round++) {
    static st s;
    memset(&s, 0, sizeof s);
    tt_count_init(&s.started);
    for (int i = 0; i < ST_POOLS; i++) {
      tko_options o = i == 2 ? tko_elastic_options(1, 2, 5) : tko_basic_options(2);
      o.hooks.user = &s;
      o.hooks.on_cancel = st_cancel;
      cr_assert_eq(tko_pool_create(&s.p[i], &o), 0);
    }
    stn roots[ST_POOLS];
    for (int i = 0; i < ST_POOLS; i++) {
      roots[i] = (stn){&s, 0, i};
      cr_assert_eq(tko_submit(s.p[i], stn_fn, &roots[i], 0), 0);
      atomic_fetch_add(&s.accepted, 1);
    }
    if (!tt_count_wait_geq_within(&s.started, 20 + 10 * (round % 8), 10000)) {
      for (int i = 0; i < ST_POOLS; i++) {
        tko_stats x;
        tko_pool_stats(s.p[i], &x);
        fprintf(stderr,
                "pool %d: submitted %lu completed %lu queued %lu running %lu basic %u elastic %u\n",
                i, (unsigned long)x.submitted, (unsigned long)x.completed, (unsigned long)x.queued,
                (unsigned long)x.running, x.basic_workers, x.elastic_workers);
      }
      cr_assert(0, "round %d: started %ld", round, tt_count_get(&s.started));
    }
    st_sd sd[ST_POOLS];
    pthread_t th[ST_POOLS];
    for (int i = 0; i < ST_POOLS; i++) {
      sd[i] = (st_sd){s.p[i], (tko_shutdown_mode)((i + round) % 3), 1};
      pthread_create(&th[i], NULL, st_shutdown, &sd[i]);
    }
    for (int i = 0; i < ST_POOLS; i++) {
      pthread_join(th[i], NULL);
      cr_assert_eq(sd[i].rc, 0, "round %d pool %d mode %d: shutdown %d", round, i, sd[i].mode,
                   sd[i].rc);
    }
    /* A TKO_CANCEL_NOWAIT shutdown returned with its workers still running,
     * and their tasks submit to the other pools: every shutdown completes
     * (each joins its threads) before any pool is freed. */
    for (int i = 0; i < ST_POOLS; i++)
      cr_assert_eq(tko_pool_shutdown(s.p[i], TKO_CANCEL), 0);
    for (int i = 0; i < ST_POOLS; i++)
      cr_assert_eq(tko_pool_destroy(s.p[i]), 0);
    cr_assert_eq(atomic_load(&s.bad), 0, "round %d: bad %d", round, atomic_load(&s.bad));
    cr_assert_eq(atomic_load(&s.ran) + atomic_load(&s.cancelled), atomic_load(&s.accepted),
                 "round %d: ran %ld + cancelled %ld != accepted %ld", round, atomic_load(&s.ran),
                 atomic_load(&s.cancelled), atomic_load(&s.accepted));
    tt_count_fini(&s.started);
    edeadlk_total += atomic_load(&s.edeadlk);
  }
  fprintf(stderr, "trees across pools: %ld waits refused with -EDEADLK (help depth)\n",
          edeadlk_total);
}

/* ---- handles: cancel racing a batch-mate's wait; a cross-pool handle cycle ---- */

/* A worker that took T1 and T2 in one batch, running T1, which waits on
 * T2's handle while another thread cancels T2 (0: taken, not started, so
 * status stays -EINPROGRESS until the worker reaches it): the wait runs the
 * batch on to T2 (the header: a batch-mate "is reached by running that
 * batch on to it"), which the worker then hands to on_cancel, and ends.
 * With a before_run hook set the pool times its tasks and takes batches
 * of 2; the race is met in about 1 round in 10-200. */
/* One worker takes T1 and T2 together (max_batch 2; the pool is paused
 * while they are queued). T1 waits on T2's handle while the test thread
 * cancels T2: exactly one of "ran" and "on_cancel", and T1's wait ends. */
typedef struct bm {
  tko_handle h2;
  atomic_int ran2, rc1, in1;
  tt_count t1_started;
} bm;

static int bm_t1(void *arg) {
  bm *b = arg;
  tt_count_add(&b->t1_started, 1);
  atomic_store(&b->rc1, tko_handle_wait(&b->h2, TT_LONG_MS));
  return 0;
}
static int bm_t2(void *arg) {
  atomic_fetch_add(&((bm *)arg)->ran2, 1);
  return 0;
}

Test(attack_hh, cancel_races_a_batch_mates_wait_for_the_handle) {
  for (int round = 0; round < TT_SCALE(300, 50); round++) {
    hookc h;
    tko_pool *p = mk_pool(1, 2, &h);
    bm b;
    memset(&b, 0, sizeof b);
    tt_count_init(&b.t1_started);
    atomic_store(&b.rc1, 1);
    cr_assert_eq(tko_pool_pause(p), 0);
    cr_assert_eq(tko_submit(p, bm_t1, &b, 0), 0);
    cr_assert_eq(tko_submit_handle(p, &b.h2, bm_t2, &b, 0), 0);
    cr_assert_eq(tko_pool_resume(p), 0);
    if (round % 2) cr_assert(tt_count_wait_geq(&b.t1_started, 1));
    int rc = tko_handle_cancel(&b.h2);
    cr_assert(rc == 0 || rc == -EBUSY, "cancel %d", rc);
    cr_assert_eq(tko_handle_wait(&b.h2, TT_LONG_MS), 0);
    cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
    cr_assert_eq(atomic_load(&b.rc1), 0);
    int ran = atomic_load(&b.ran2);
    long canc = tt_count_get(&h.cancels);
    cr_assert_eq(ran + canc, 1, "round %d: ran %d cancelled %ld", round, ran, canc);
    cr_assert_eq(rc == 0, canc == 1);
    cr_assert_eq(tko_handle_status(&b.h2), rc == 0 ? -ECANCELED : 0);
    cr_assert_eq(tko_pool_destroy(p), 0);
  }
}


/* A handle wait helps only the handle's own pool: a task of A waiting on a
 * handle of B, whose task waits on a handle queued in A, has nobody to run
 * it (both pools have one worker). The header promises no progress here:
 * the test asks only that the bounded waits return (0 or -ETIMEDOUT) and
 * that everything ends once they do. */
typedef struct hcy {
  tko_pool *a, *b;
  tko_handle ha, hb;
  atomic_int rc_a, rc_b, inner;
} hcy;

static int hcy_inner(void *arg) {
  atomic_fetch_add(&((hcy *)arg)->inner, 1);
  return 0;
}
static int hcy_b(void *arg) {
  hcy *x = arg;
  int rc = tko_submit_handle(x->a, &x->ha, hcy_inner, x, 0);
  if (rc == 0) rc = tko_handle_wait(&x->ha, 300);
  atomic_store(&x->rc_b, rc);
  return 0;
}
static int hcy_a(void *arg) {
  hcy *x = arg;
  int rc = tko_submit_handle(x->b, &x->hb, hcy_b, x, 0);
  if (rc == 0) rc = tko_handle_wait(&x->hb, TT_LONG_MS);
  atomic_store(&x->rc_a, rc);
  return 0;
}

Test(attack_hh, a_cross_pool_handle_cycle_ends_with_bounded_waits) {
  hcy x;
  memset(&x, 0, sizeof x);
  atomic_store(&x.rc_a, 1);
  atomic_store(&x.rc_b, 1);
  x.a = mk_pool(1, 0, NULL);
  x.b = mk_pool(1, 0, NULL);
  cr_assert_eq(tko_submit(x.a, hcy_a, &x, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(x.a, TT_LONG_MS), 0);
  cr_assert_eq(tko_pool_wait_idle(x.b, TT_LONG_MS), 0);
  fprintf(stderr, "cross-pool handle cycle: B's wait on A's handle %d, A's wait %d\n",
          atomic_load(&x.rc_b), atomic_load(&x.rc_a));
  cr_assert(atomic_load(&x.rc_b) == 0 || atomic_load(&x.rc_b) == -ETIMEDOUT);
  cr_assert_eq(atomic_load(&x.rc_a), 0);
  cr_assert_eq(atomic_load(&x.inner), 1);
  cr_assert_eq(tko_handle_wait(&x.ha, 0), 0);
  cr_assert_eq(tko_pool_destroy(x.a), 0);
  cr_assert_eq(tko_pool_destroy(x.b), 0);
}

/* ---- group cancel racing the waiter's own helping -------------------------------- */

typedef struct gc {
  tko_pool *p;
  tko_group g;
  atomic_int ran, rc, go;
  tt_count waiting;
} gc;

static int gc_member(void *arg) {
  atomic_fetch_add(&((gc *)arg)->ran, 1);
  tt_spin_ns(5000);
  return 0;
}
static int gc_waiter(void *arg) {
  gc *x = arg;
  for (int i = 0; i < 40; i++)
    tko_group_submit(x->p, &x->g, gc_member, x, i % 3);
  tt_count_add(&x->waiting, 1);
  atomic_store(&x->rc, tko_group_wait(&x->g, TT_LONG_MS));
  return 0;
}

Test(attack_hh, a_group_cancel_racing_the_waiters_own_helping_counts_right) {
  for (int round = 0; round < TT_SCALE(200, 40); round++) {
    hookc h;
    gc x;
    memset(&x, 0, sizeof x);
    tt_count_init(&x.waiting);
    atomic_store(&x.rc, 1);
    x.p = mk_pool(1 + (unsigned)(round % 2), 0, &h);
    cr_assert_eq(tko_group_init(&x.g), 0);
    cr_assert_eq(tko_submit(x.p, gc_waiter, &x, 0), 0);
    cr_assert(tt_count_wait_geq(&x.waiting, 1));
    long k = tko_group_cancel(&x.g);
    cr_assert_geq(k, 0);
    cr_assert_eq(tko_pool_wait_idle(x.p, TT_LONG_MS), 0);
    cr_assert_eq(atomic_load(&x.rc), 0);
    cr_assert_eq(tt_count_get(&h.cancels), k);
    cr_assert_eq(atomic_load(&x.ran) + k, 40, "round %d: ran %d cancelled %ld", round,
                 atomic_load(&x.ran), k);
    cr_assert_eq(tko_group_status(&x.g), k ? -ECANCELED : 0);
    cr_assert_eq(tko_group_pending(&x.g), 0);
    cr_assert_eq(tko_group_destroy(&x.g), 0);
    cr_assert_eq(tko_pool_destroy(x.p), 0);
  }
}

/* ---- group waits from a member's hooks ---------------------------------------------- */

typedef struct gh {
  tko_group g;
  atomic_int rc_before, rc_cancel;
} gh;

static void gh_before(void *user, const tko_task_info *t) {
  (void)user;
  if (t->fn != inc_fn) return;
  gh *x = *(gh **)((char *)t->arg + sizeof(atomic_int) * 2);
  atomic_store(&x->rc_before, tko_group_wait(&x->g, 2000));
}
static void gh_cancel(void *user, const tko_task_info *t) {
  (void)user;
  if (t->fn != inc_fn) return;
  gh *x = *(gh **)((char *)t->arg + sizeof(atomic_int) * 2);
  atomic_store(&x->rc_cancel, tko_group_wait(&x->g, 2000));
}

typedef struct ghc {
  atomic_int ran, pad;
  gh *x; /* read by the hooks through the arg */
} ghc;

Test(attack_hh, a_members_hooks_waiting_on_its_group_get_edeadlk) {
  tko_options o = tko_basic_options(1);
  o.hooks.before_run = gh_before;
  o.hooks.on_cancel = gh_cancel;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  gh x;
  memset(&x, 0, sizeof x);
  atomic_store(&x.rc_before, 1);
  atomic_store(&x.rc_cancel, 1);
  ghc c = {0, 0, &x};
  cr_assert_eq(tko_group_init(&x.g), 0);
  cr_assert_eq(tko_group_submit(p, &x.g, inc_fn, &c, 0), 0);
  cr_assert_eq(tko_group_wait(&x.g, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&x.rc_before), -EDEADLK);
  /* cancel: pin the worker, queue a member, cancel the group */
  tt_pin pin = TT_PIN_INIT;
  cr_assert_eq(tko_submit(p, tt_pin_fn, &pin, 0), 0);
  cr_assert(tt_count_wait_geq(&pin.started, 1));
  cr_assert_eq(tko_group_submit(p, &x.g, inc_fn, &c, 0), 0);
  cr_assert_eq(tko_group_cancel(&x.g), 1);
  cr_assert_eq(atomic_load(&x.rc_cancel), -EDEADLK);
  tt_gate_open(&pin.gate);
  cr_assert_eq(tko_group_wait(&x.g, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&c.ran), 1);
  cr_assert_eq(tko_group_destroy(&x.g), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* A plain destroy (drain) of the other pool while a task waits on its
 * group: the members run, the wait returns 0. */
Test(attack_hh, a_draining_destroy_of_the_other_pool_ends_a_helpers_wait) {
  xw x;
  hookc hb;
  xw_setup(&x, &hb, 3);
  tt_gate_open(&x.pin.gate);
  cr_assert_eq(tko_pool_destroy(x.b), 0);
  cr_assert(tt_count_wait_geq(&x.done, 1));
  cr_assert_eq(atomic_load(&x.rc), 0);
  cr_assert_eq(atomic_load(&x.status), 0);
  cr_assert_eq(atomic_load(&x.ran), 3);
  cr_assert_eq(tko_pool_wait_idle(x.a, TT_LONG_MS), 0);
  cr_assert_eq(tko_group_destroy(&x.gb), 0);
  cr_assert_eq(tko_pool_destroy(x.a), 0);
}

/* ---- batch-mates: groups hold, handles hang ------------------------------------------- */

/* Timing hooks make the worker size its takes, so with max_batch 2 and the
 * pool paused while both are queued, one take holds T1 and T2. */
static void noop_hook(void *user, const tko_task_info *t) {
  (void)user;
  (void)t;
}

typedef struct gbm {
  tko_group g;
  atomic_int ran2, rc1;
} gbm;

static int gbm_t1(void *arg) {
  gbm *b = arg;
  atomic_store(&b->rc1, tko_group_wait(&b->g, TT_LONG_MS));
  return 0;
}
static int gbm_t2(void *arg) {
  atomic_fetch_add(&((gbm *)arg)->ran2, 1);
  return 0;
}

/* T1 waits on a group whose member T2 its own worker took with it: the
 * wait must reach T2 (run it or, after a cancel, end it). */
Test(attack_hh, a_group_wait_on_a_member_taken_in_the_same_batch_ends) {
  for (int round = 0; round < TT_SCALE(200, 40); round++) {
    tko_options o = tko_basic_options(1);
    o.max_batch = 2;
    o.hooks.before_run = noop_hook;
    tko_pool *p;
    cr_assert_eq(tko_pool_create(&p, &o), 0);
    gbm b;
    memset(&b, 0, sizeof b);
    atomic_store(&b.rc1, 1);
    cr_assert_eq(tko_group_init(&b.g), 0);
    cr_assert_eq(tko_pool_pause(p), 0);
    cr_assert_eq(tko_submit(p, gbm_t1, &b, 0), 0);
    cr_assert_eq(tko_group_submit(p, &b.g, gbm_t2, &b, 0), 0);
    cr_assert_eq(tko_pool_resume(p), 0);
    long k = round % 2 ? tko_group_cancel(&b.g) : 0;
    cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
    cr_assert_eq(atomic_load(&b.rc1), 0, "round %d: T1's wait %d", round, atomic_load(&b.rc1));
    cr_assert_eq(atomic_load(&b.ran2) + k, 1);
    cr_assert_eq(tko_group_destroy(&b.g), 0);
    cr_assert_eq(tko_pool_destroy(p), 0);
  }
}

/* The deterministic form of cancel_races_a_batch_mates_wait_for_the_handle:
 * T1 cancels the handle of T2, which its worker took in the same batch
 * (cancel returns 0; T2 reaches on_cancel when the worker gets to it), then
 * waits on that handle: the wait runs the batch on to T2 and ends. */
typedef struct hbm {
  tko_handle h2;
  atomic_int ran2, rc_cancel, rc_wait;
} hbm;

static int hbm_t1(void *arg) {
  hbm *b = arg;
  atomic_store(&b->rc_cancel, tko_handle_cancel(&b->h2));
  atomic_store(&b->rc_wait, tko_handle_wait(&b->h2, 3000));
  return 0;
}
static int hbm_t2(void *arg) {
  atomic_fetch_add(&((hbm *)arg)->ran2, 1);
  return 0;
}

Test(attack_hh, a_task_cancelling_then_waiting_on_its_batch_mates_handle) {
  for (int round = 0; round < 20; round++) {
    tko_options o = tko_basic_options(1);
    o.max_batch = 2;
    o.hooks.before_run = noop_hook;
    tko_pool *p;
    cr_assert_eq(tko_pool_create(&p, &o), 0);
    hbm b;
    memset(&b, 0, sizeof b);
    atomic_store(&b.rc_wait, 1);
    cr_assert_eq(tko_pool_pause(p), 0);
    cr_assert_eq(tko_submit(p, hbm_t1, &b, 0), 0);
    cr_assert_eq(tko_submit_handle(p, &b.h2, hbm_t2, &b, 0), 0);
    cr_assert_eq(tko_pool_resume(p), 0);
    cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
    cr_assert_eq(atomic_load(&b.rc_cancel), 0);
    cr_assert_eq(atomic_load(&b.ran2), 0);
    cr_assert_eq(atomic_load(&b.rc_wait), 0, "round %d: T1's wait %d", round,
                 atomic_load(&b.rc_wait));
    cr_assert_eq(tko_handle_status(&b.h2), -ECANCELED);
    cr_assert_eq(tko_pool_destroy(p), 0);
  }
}

/* A zero-timeout handle wait from a worker on a queued handle of its pool:
 * 0 (it ran the task) or -ETIMEDOUT (it only looked), consistent with the
 * status; the header says "0 = just check". */
typedef struct hz {
  tko_pool *p;
  tko_handle h;
  atomic_int ran, rc0, st0;
} hz;

static int hz_fn(void *arg) {
  hz *x = arg;
  tko_submit_handle(x->p, &x->h, inc_fn, &x->ran, 0);
  atomic_store(&x->rc0, tko_handle_wait(&x->h, 0));
  atomic_store(&x->st0, tko_handle_status(&x->h));
  return 0;
}

Test(attack_hh, a_zero_timeout_handle_wait_in_a_task_only_checks) {
  hz x;
  memset(&x, 0, sizeof x);
  x.p = mk_pool(1, 0, NULL);
  cr_assert_eq(tko_submit(x.p, hz_fn, &x, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(x.p, TT_LONG_MS), 0);
  fprintf(stderr, "zero-timeout handle wait in a task: %d (status %d)\n", atomic_load(&x.rc0),
          atomic_load(&x.st0));
  if (atomic_load(&x.rc0) == 0)
    cr_assert_eq(atomic_load(&x.st0), 0);
  else
    cr_assert_eq(atomic_load(&x.rc0), -ETIMEDOUT);
  cr_assert_eq(atomic_load(&x.ran), 1);
  cr_assert_eq(tko_handle_wait(&x.h, 0), 0);
  cr_assert_eq(tko_pool_destroy(x.p), 0);
}

/* ---- pthread_exit from a member run inside a helping wait --------------------------- */

/* The member runs on the waiting task's stack, so its pthread_exit ends the
 * waiting task too: both count as completed and failed, the worker is
 * replaced, and the pool stays consistent (waits, stats, destroy). */
typedef struct pe {
  tko_pool *p;
  tko_group g;
  atomic_int resumed;
} pe;

static int pe_member(void *arg) {
  (void)arg;
  pthread_exit(NULL);
  return 0;
}
static int pe_waiter(void *arg) {
  pe *x = arg;
  tko_group_submit(x->p, &x->g, pe_member, NULL, 0);
  tko_group_wait(&x->g, TT_LONG_MS);
  atomic_store(&x->resumed, 1);
  return 0;
}

Test(attack_hh, pthread_exit_from_a_member_inside_a_helping_wait_keeps_the_pool_consistent) {
  static pe x;
  memset(&x, 0, sizeof x);
  x.p = mk_pool(1, 0, NULL);
  cr_assert_eq(tko_group_init(&x.g), 0);
  cr_assert_eq(tko_submit(x.p, pe_waiter, &x, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(x.p, TT_LONG_MS), 0);
  cr_assert_eq(tko_group_pending(&x.g), 0);
  cr_assert_eq(tko_group_status(&x.g), -ECANCELED);
  tko_stats s;
  tko_pool_stats(x.p, &s);
  cr_assert_eq(s.submitted, 2);
  cr_assert_eq(s.completed, 2);
  cr_assert_eq(s.running, 0);
  cr_assert_eq(atomic_load(&x.resumed), 0); /* the waiter's frames went with the thread */
  atomic_int ran = 0;
  tko_handle h;
  cr_assert_eq(tko_submit_handle(x.p, &h, inc_fn, &ran, 0), 0);
  cr_assert_eq(tko_handle_wait(&h, TT_LONG_MS), 0); /* the replacement worker runs it */
  cr_assert_eq(atomic_load(&ran), 1);
  cr_assert_eq(tko_group_destroy(&x.g), 0);
  cr_assert_eq(tko_pool_destroy(x.p), 0);
}

/* ---- many waiters on one group: threads and tasks of three pools ------------------------- */

typedef struct mg {
  tko_group g;
  tt_count waiting, done;
  atomic_int bad;
} mg;

static void *mg_thread(void *arg) {
  mg *m = arg;
  tt_count_add(&m->waiting, 1);
  if (tko_group_wait(&m->g, TT_LONG_MS) != 0) atomic_store(&m->bad, 1);
  tt_count_add(&m->done, 1);
  return NULL;
}
static int mg_task(void *arg) {
  mg_thread(arg);
  return 0;
}

Test(attack_hh, many_waiters_on_one_group_from_threads_and_pools) {
  for (int round = 0; round < TT_SCALE(20, 5); round++) {
    mg m;
    memset(&m, 0, sizeof m);
    tt_count_init(&m.waiting);
    tt_count_init(&m.done);
    tt_pin pin = TT_PIN_INIT;
    tko_pool *owner = mk_pool(1, 0, NULL);
    tko_pool *q[3] = {mk_pool(2, 0, NULL), mk_pool(1, 0, NULL), NULL};
    tko_options eo = tko_elastic_options(0, 2, 5);
    cr_assert_eq(tko_pool_create(&q[2], &eo), 0);
    cr_assert_eq(tko_group_init(&m.g), 0);
    cr_assert_eq(tko_group_submit(owner, &m.g, tt_pin_fn, &pin, 0), 0);
    cr_assert(tt_count_wait_geq(&pin.started, 1));
    atomic_int ran = 0;
    for (int i = 0; i < 5; i++)
      cr_assert_eq(tko_group_submit(owner, &m.g, inc_fn, &ran, i), 0);
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
      pthread_create(&th[i], NULL, mg_thread, &m);
    for (int i = 0; i < 3; i++)
      for (int k = 0; k < 2; k++)
        cr_assert_eq(tko_submit(q[i], mg_task, &m, k), 0);
    cr_assert(tt_count_wait_geq(&m.waiting, 10));
    tt_gate_open(&pin.gate);
    for (int i = 0; i < 4; i++)
      pthread_join(th[i], NULL);
    cr_assert(tt_count_wait_geq(&m.done, 10));
    cr_assert_eq(atomic_load(&m.bad), 0);
    cr_assert_eq(atomic_load(&ran), 5);
    for (int i = 0; i < 3; i++)
      cr_assert_eq(tko_pool_destroy(q[i]), 0);
    cr_assert_eq(tko_group_destroy(&m.g), 0);
    cr_assert_eq(tko_pool_destroy(owner), 0);
  }
}

/* ---- resize while helpers nest; async members ------------------------------------------ */

typedef struct rz {
  tko_pool *p;
  atomic_int ran, bad;
} rz;
typedef struct rzn {
  rz *r;
  int depth;
} rzn;

static int rzn_fn(void *arg) {
  rzn *n = arg;
  atomic_fetch_add(&n->r->ran, 1);
  if (n->depth == 6) return 0;
  rzn kids[3];
  tko_group g;
  tko_group_init(&g);
  for (int i = 0; i < 3; i++) {
    kids[i] = (rzn){n->r, n->depth + 1};
    if (tko_group_submit(n->r->p, &g, rzn_fn, &kids[i], 0)) atomic_store(&n->r->bad, 1);
  }
  int rc = tko_group_wait(&g, -1);
  if (rc) {
    atomic_store(&n->r->bad, rc);
    abort(); /* the kids on this stack are still pending */
  }
  tko_group_destroy(&g);
  return 0;
}

/* Shrinks and grows the pool while its workers are deep in helping waits:
 * a worker above the new size retires only after its outer task ends. */
Test(attack_hh, resizes_while_helpers_nest_lose_nothing) {
  for (int round = 0; round < TT_SCALE(10, 3); round++) {
    rz r;
    memset(&r, 0, sizeof r);
    r.p = mk_pool(3, 0, NULL);
    rzn roots[2] = {{&r, 0}, {&r, 0}};
    cr_assert_eq(tko_submit(r.p, rzn_fn, &roots[0], 0), 0);
    cr_assert_eq(tko_submit(r.p, rzn_fn, &roots[1], 0), 0);
    for (int i = 0; i < 20; i++)
      cr_assert_eq(tko_pool_resize(r.p, 1 + (unsigned)(i % 3), i % 2), 0);
    cr_assert_eq(tko_pool_wait_idle(r.p, TT_LONG_MS), 0);
    cr_assert_eq(atomic_load(&r.bad), 0);
    cr_assert_eq(atomic_load(&r.ran), 2 * 1093); /* (3^7 - 1) / 2 per tree */
    cr_assert_eq(tko_pool_destroy(r.p), 0);
  }
}

/* A helper waits on a group of async members that its own worker starts
 * while helping; another thread completes them. */
typedef struct as {
  tko_pool *p;
  tko_group g;
  tko_async *ops[4];
  tt_count started, waiting;
  atomic_int rc, next;
} as;

static int as_start(tko_async *op, void *arg) {
  as *a = arg;
  a->ops[atomic_fetch_add(&a->next, 1)] = op;
  tt_count_add(&a->started, 1); /* after the store: the test reads ops then */
  return 0;
}
static int as_waiter(void *arg) {
  as *a = arg;
  for (int i = 0; i < 4; i++)
    tko_group_submit_async(a->p, &a->g, as_start, a, i);
  tt_count_add(&a->waiting, 1);
  atomic_store(&a->rc, tko_group_wait(&a->g, TT_LONG_MS));
  return 0;
}

Test(attack_hh, a_helper_waiting_on_async_members_wakes_on_their_completion) {
  as a;
  memset(&a, 0, sizeof a);
  tt_count_init(&a.started);
  tt_count_init(&a.waiting);
  atomic_store(&a.rc, 1);
  a.p = mk_pool(1, 0, NULL);
  cr_assert_eq(tko_group_init(&a.g), 0);
  cr_assert_eq(tko_submit(a.p, as_waiter, &a, 0), 0);
  cr_assert(tt_count_wait_geq(&a.started, 4), "the helper did not start the async members");
  cr_assert_eq(tko_group_pending(&a.g), 4);
  for (int i = 0; i < 4; i++)
    cr_assert_eq(tko_async_complete(a.ops[i], i == 2 ? 9 : 0), 0);
  cr_assert_eq(tko_pool_wait_idle(a.p, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&a.rc), 0);
  cr_assert_eq(tko_group_status(&a.g), 9);
  cr_assert_eq(tko_group_destroy(&a.g), 0);
  cr_assert_eq(tko_pool_destroy(a.p), 0);
}

/* ---- a resume must wake a waiter whose batch-mate it alone can run ------------------------ */

/* T1 and T2 are taken in one batch; T1 pauses the pool and waits on T2
 * (through a group, or through T2's handle). Nothing may run while paused;
 * the test's resume must wake T1's wait so that it runs T2. */
typedef struct rb {
  tko_pool *p;
  tko_group g;
  tko_handle h2;
  int use_handle;
  atomic_int ran2, rc1, ran2_paused;
  tt_count waiting;
} rb;

static int rb_t2(void *arg) {
  atomic_fetch_add(&((rb *)arg)->ran2, 1);
  return 0;
}
static int rb_t1(void *arg) {
  rb *b = arg;
  tko_pool_pause(b->p);
  int rc = b->use_handle ? tko_handle_wait(&b->h2, 20) : tko_group_wait(&b->g, 20);
  atomic_store(&b->ran2_paused, atomic_load(&b->ran2) + (rc == -ETIMEDOUT ? 0 : 100));
  tt_count_add(&b->waiting, 1);
  rc = b->use_handle ? tko_handle_wait(&b->h2, TT_LONG_MS) : tko_group_wait(&b->g, TT_LONG_MS);
  atomic_store(&b->rc1, rc);
  return 0;
}

static atomic_int ran_while_paused[2];

static void resume_scene(int use_handle) {
  tko_options o = tko_basic_options(1);
  o.max_batch = 2;
  o.hooks.before_run = noop_hook;
  rb b;
  memset(&b, 0, sizeof b);
  b.use_handle = use_handle;
  tt_count_init(&b.waiting);
  atomic_store(&b.rc1, 1);
  cr_assert_eq(tko_pool_create(&b.p, &o), 0);
  cr_assert_eq(tko_group_init(&b.g), 0);
  cr_assert_eq(tko_pool_pause(b.p), 0);
  cr_assert_eq(tko_submit(b.p, rb_t1, &b, 0), 0);
  if (use_handle)
    cr_assert_eq(tko_submit_handle(b.p, &b.h2, rb_t2, &b, 0), 0);
  else
    cr_assert_eq(tko_group_submit(b.p, &b.g, rb_t2, &b, 0), 0);
  cr_assert_eq(tko_pool_resume(b.p), 0);
  cr_assert(tt_count_wait_geq(&b.waiting, 1));
  /* T2 was taken before the pause: tko_pool_pause lets a worker still
   * start what it had taken, so T2 may or may not have run by now. */
  int paused = atomic_load(&b.ran2_paused);
  cr_assert(paused == 0 || paused == 1 || paused == 101, "handle %d: %d", use_handle, paused);
  if (paused) atomic_fetch_add(use_handle ? &ran_while_paused[1] : &ran_while_paused[0], 1);
  cr_assert_eq(tko_pool_resume(b.p), 0);
  cr_assert_eq(tko_pool_wait_idle(b.p, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&b.rc1), 0, "handle %d: T1's wait %d", use_handle, atomic_load(&b.rc1));
  cr_assert_eq(atomic_load(&b.ran2), 1);
  cr_assert_eq(tko_group_destroy(&b.g), 0);
  cr_assert_eq(tko_pool_destroy(b.p), 0);
}

Test(attack_hh, a_resume_wakes_a_waiter_on_a_paused_batch_mate) {
  for (int round = 0; round < TT_SCALE(30, 10); round++) {
    resume_scene(0);
    resume_scene(1);
  }
  fprintf(stderr, "batch-mates started while paused: group waits %d, handle waits %d\n",
          atomic_load(&ran_while_paused[0]), atomic_load(&ran_while_paused[1]));
}
