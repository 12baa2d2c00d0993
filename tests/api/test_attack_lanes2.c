/* SPDX-License-Identifier: MIT */
/* Adversarial tests (attack1) of what lane tables, keyed tasks and the
 * coalescer promise where they meet the pool's shutdown, pause, resize and
 * allocation failures. Public headers only. Every wait is bounded: a hang
 * ends in SIGALRM (a failed test), never in a stuck suite.
 * - all_attached_*: user tables (one in batch mode), keyed tasks, plain
 *   tasks and a coalescer whose flush submits keyed and lane tasks, all on
 *   one pool, shut down in every mode: every accepted task runs or reaches
 *   one on_cancel exactly once, the pool's on_cancel never sees a runner or
 *   a sweep, the counts add up.
 * - caller_runs_*: TKO_FULL_CALLER_RUNS lane and keyed submitters racing
 *   appenders and shutdown: a call runs its own task at most.
 * - rings_*: bursts on many keys, pause/resume and a failing allocator:
 *   order, exclusion, exactly once, no leak.
 * - runner_alone_*: runners stay available across pause/resume/resize.
 * - on_cancel_reentry_*: lane and pool on_cancel calling back in.
 * - coalescer_sweep_cancelled: a queued sweep cancelled by TKO_CANCEL. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <taskorch.h>
#include <taskorch/coalescer.h>
#include <taskorch/lanes.h>

#include "tko_test.h"
#include "tko_test_fault.h"
#include "tko_test_sync.h"

#define AT_ALARM_S 120u /* a hang of a whole test: SIGALRM kills it */

/* AT_MULT=n multiplies the rounds of the stress tests (default 1), for
 * longer hunts by hand; alarms grow with it. */
static int at_mult(void) {
  const char *m = getenv("AT_MULT");
  int n = m ? atoi(m) : 1;
  return n > 0 ? n : 1;
}

/* ---- tokens ------------------------------------------------------------------ */

typedef struct tok {
  atomic_int runs, lane_cancels, pool_cancels;
  atomic_bool accepted;
  int kind; /* K_* */
} tok;

enum { K_PLAIN, K_KEYED, K_LANE1, K_LANE2, K_NKIND };

typedef struct tokpool {
  tok *t;
  size_t cap;
  atomic_size_t next;
} tokpool;

static tok *tok_get(tokpool *tp, int kind) {
  size_t i = atomic_fetch_add(&tp->next, 1);
  if (i >= tp->cap) return NULL;
  tp->t[i].kind = kind;
  return &tp->t[i];
}

static atomic_long tok_runs_total; /* every tok_run, for "some work ran" */

static int tok_run(void *arg) {
  atomic_fetch_add(&tok_runs_total, 1);
  atomic_fetch_add(&((tok *)arg)->runs, 1);
  return 0;
}

static void lane_cancel_tok(void *user, const tko_lane_task *t) {
  (void)user;
  atomic_fetch_add(&((tok *)t->arg)->lane_cancels, 1);
}

/* The lane batch mode: the callback runs each task itself. */
static void lane_batch_tok(void *user, const tko_lane_batch *b) {
  (void)user;
  for (size_t i = 0; i < b->count; i++) tok_run(b->tasks[i].arg);
}

static atomic_long foreign_cancels; /* pool on_cancel saw a task not ours */
static atomic_long bad_ids;         /* a keyed task's on_cancel id without top bit */

static void pool_cancel_tok(void *user, const tko_task_info *t) {
  (void)user;
  if (t->fn != tok_run) {
    atomic_fetch_add(&foreign_cancels, 1);
    return;
  }
  tok *k = t->arg;
  if (k->kind == K_KEYED && !(t->id >> 63)) atomic_fetch_add(&bad_ids, 1);
  atomic_fetch_add(&k->pool_cancels, 1);
}

/* Checks every token: accepted ones ran or were cancelled exactly once (in
 * the right place), refused ones never. Returns the index of the first bad
 * one, or -1. drain: nothing may have been cancelled. */
static long tok_first_bad(tokpool *tp, bool drain, long *accepted) {
  size_t n = atomic_load(&tp->next);
  if (n > tp->cap) n = tp->cap;
  *accepted = 0;
  for (size_t i = 0; i < n; i++) {
    tok *k = &tp->t[i];
    int r = atomic_load(&k->runs), lc = atomic_load(&k->lane_cancels),
        pc = atomic_load(&k->pool_cancels);
    bool acc = atomic_load(&k->accepted);
    *accepted += acc;
    if (!acc) {
      if (r + lc + pc) return (long)i;
      continue;
    }
    if (r + lc + pc != 1) return (long)i;
    if (drain && r != 1) return (long)i;
    bool lane = k->kind == K_LANE1 || k->kind == K_LANE2;
    if (lane && pc) return (long)i; /* lane tasks never reach the pool's hook */
    if (!lane && lc) return (long)i;
  }
  return -1;
}

static void tok_report(tokpool *tp, long i) {
  tok *k = &tp->t[i];
  fprintf(stderr, "token %ld kind %d accepted %d runs %d lane_cancels %d pool_cancels %d\n", i,
          k->kind, (int)atomic_load(&k->accepted), atomic_load(&k->runs),
          atomic_load(&k->lane_cancels), atomic_load(&k->pool_cancels));
}

/* ---- all attached: plain, keyed, two user tables and a coalescer ---------------- */

typedef struct world {
  tko_pool *p;
  tko_lanes *l1, *l2;
  tko_coalescer *c;
  tokpool tp;
  atomic_bool stop;
  atomic_long submits; /* calls made, all kinds */
  atomic_long flush_submits;
  /* the coalescer's latest-value check: marker thread 0 only */
  uint64_t last_marked[64];
  atomic_uint_fast64_t last_flushed[64];
  atomic_long flush_order_errors;
} world;

static world W;

static void submit_tok(world *w, int kind, uint64_t key) {
  tok *k = tok_get(&w->tp, kind);
  if (!k) return;
  int rc = -EINVAL;
  switch (kind) {
  case K_PLAIN: rc = tko_submit(w->p, tok_run, k, (int)(key % 7)); break;
  case K_KEYED: rc = tko_submit_keyed(w->p, key, tok_run, k, (int)(key % 5)); break;
  case K_LANE1: rc = tko_lanes_submit(w->l1, key, tok_run, k, (int)(key % 3)); break;
  case K_LANE2: rc = tko_lanes_submit(w->l2, key, tok_run, k, 1); break;
  }
  if (rc == 0) atomic_store(&k->accepted, true);
  else if (rc != -ESHUTDOWN && rc != -EAGAIN && rc != -ENOMEM)
    fprintf(stderr, "unexpected submit rc %d kind %d\n", rc, kind);
  atomic_fetch_add(&w->submits, 1);
}

/* The coalescer's flush submits a keyed task and a lane task per entry, so
 * that it does so during shutdown too (and in the final flush). */
static void world_flush(void *user, const tko_coalesce_entry *e, size_t n) {
  world *w = user;
  for (size_t i = 0; i < n; i++) {
    uint64_t key = e[i].key % 64;
    uint64_t prev = atomic_load(&w->last_flushed[key]);
    if (e[i].value < prev) atomic_fetch_add(&w->flush_order_errors, 1);
    atomic_store(&w->last_flushed[key], e[i].value);
    submit_tok(w, K_KEYED, e[i].key);
    submit_tok(w, i % 2 ? K_LANE1 : K_LANE2, e[i].key);
    atomic_fetch_add(&w->flush_submits, 1);
  }
}

typedef struct subarg {
  world *w;
  int id;
} subarg;

static void *world_submitter(void *arg) {
  subarg *sa = arg;
  world *w = sa->w;
  uint64_t seed = 0x9e3779b97f4a7c15ull * (uint64_t)(sa->id + 1);
  uint64_t val = 1;
  while (!atomic_load(&w->stop)) {
    uint64_t r = tt_rand(&seed);
    uint64_t key = (r >> 8) % 64;
    int what = (int)(r % 5);
    if (what < K_NKIND) submit_tok(w, what, key);
    else if (sa->id == 0) {
      /* marks by one thread only, so that the latest value is known */
      int rc = tko_coalescer_mark(w->c, key, val);
      if (rc == 0) w->last_marked[key] = val;
      val++;
    }
    if (atomic_load(&w->tp.next) >= w->tp.cap) break;
  }
  return NULL;
}

enum { SH_DRAIN, SH_CANCEL, SH_NOWAIT, SH_TIMED0_CANCEL, SH_TIMED0_DRAIN, SH_NMODES };

static void world_round(int round, int mode, int bounded, bool pause_first) {
  world *w = &W;
  memset(w, 0, sizeof *w);
  w->tp.cap = TT_SCALE(60000, 20000);
  w->tp.t = calloc(w->tp.cap, sizeof(tok));
  cr_assert_not_null(w->tp.t);
  tko_options o = tko_basic_options(2);
  o.hooks.on_cancel = pool_cancel_tok;
  if (bounded) {
    o.queue_capacity = 8;
    o.full_policy = (tko_full_policy)(bounded - 1);
  }
  cr_assert_eq(tko_pool_create(&w->p, &o), 0);
  tko_lane_options lo = tko_lane_default_options();
  lo.lanes = 16;
  lo.max_drain = 4;
  lo.on_cancel = lane_cancel_tok;
  cr_assert_eq(tko_lanes_create(&w->l1, w->p, &lo), 0);
  lo.batch = lane_batch_tok;
  lo.lanes = 8;
  cr_assert_eq(tko_lanes_create(&w->l2, w->p, &lo), 0);
  cr_assert_eq(tko_coalescer_create(&w->c, w->p, 1, world_flush, w, NULL), 0);

  enum { NSUB = 3 };
  pthread_t th[NSUB];
  subarg sa[NSUB];
  for (int i = 0; i < NSUB; i++) {
    sa[i] = (subarg){w, i};
    cr_assert_eq(pthread_create(&th[i], NULL, world_submitter, &sa[i]), 0);
  }
  /* Let some work accumulate: polling the submit count, with a bound. */
  long want = TT_SCALE(3000, 800) + round * 37 % 500;
  uint64_t end = tt_now_ns() + 20ull * 1000000000u;
  while (atomic_load(&w->submits) < want && tt_now_ns() < end) sched_yield();
  /* and, in odd rounds, some of it run, so that runners are mid-lane */
  long ran0 = atomic_load(&tok_runs_total);
  while (round % 2 && atomic_load(&tok_runs_total) < ran0 + want / 4 && tt_now_ns() < end)
    sched_yield();
  if (pause_first) cr_assert_eq(tko_pool_pause(w->p), 0);
  int rc;
  switch (mode) {
  case SH_DRAIN: rc = tko_pool_shutdown(w->p, TKO_DRAIN); break;
  case SH_CANCEL: rc = tko_pool_shutdown(w->p, TKO_CANCEL); break;
  case SH_NOWAIT: rc = tko_pool_shutdown_timed(w->p, TKO_CANCEL_NOWAIT, 0); break;
  case SH_TIMED0_CANCEL:
    rc = tko_pool_shutdown_timed(w->p, TKO_DRAIN, 0);
    cr_assert(rc == 0 || rc == -ETIMEDOUT, "timed drain rc %d", rc);
    rc = tko_pool_shutdown_timed(w->p, TKO_CANCEL, 30000);
    break;
  default:
    rc = tko_pool_shutdown_timed(w->p, TKO_DRAIN, 0);
    cr_assert(rc == 0 || rc == -ETIMEDOUT, "timed drain rc %d", rc);
    rc = tko_pool_shutdown_timed(w->p, TKO_DRAIN, 30000);
    break;
  }
  cr_assert_eq(rc, 0, "round %d mode %d: shutdown rc %d", round, mode, rc);
  atomic_store(&w->stop, true);
  for (int i = 0; i < NSUB; i++) cr_assert_eq(pthread_join(th[i], NULL), 0);

  if (mode != SH_NOWAIT) {
    /* The pool has stopped: nothing of any table may be queued or running. */
    tko_stats ps;
    tko_pool_stats(w->p, &ps);
    cr_assert_eq(ps.queued + ps.running, 0, "round %d mode %d: pool q %llu r %llu", round, mode,
                 (unsigned long long)ps.queued, (unsigned long long)ps.running);
    cr_assert_eq(ps.submitted, ps.completed + ps.cancelled, "round %d: pool stats", round);
    tko_lane_stats ls;
    tko_lanes *tabs[2] = {w->l1, w->l2};
    for (int i = 0; i < 2; i++) {
      tko_lanes_stats(tabs[i], &ls);
      cr_assert_eq(ls.queued, 0, "round %d mode %d table %d: %llu lane tasks still queued", round,
                   mode, i, (unsigned long long)ls.queued);
      cr_assert_eq(ls.submitted, ls.completed + ls.cancelled, "round %d table %d", round, i);
    }
  }
  /* The coalescer first: its final flush submits to the tables (refused). */
  cr_assert_eq(tko_coalescer_destroy(w->c), 0);
  cr_assert_eq(tko_lanes_destroy(w->l1), 0);
  cr_assert_eq(tko_lanes_destroy(w->l2), 0);
  tko_stats ps;
  tko_pool_stats(w->p, &ps);
  cr_assert_eq(ps.submitted, ps.completed + ps.cancelled + ps.queued + ps.running);
  cr_assert_eq(tko_pool_destroy(w->p), 0);

  long accepted;
  bool drain = mode == SH_DRAIN || mode == SH_TIMED0_DRAIN;
  long bad = tok_first_bad(&w->tp, drain, &accepted);
  if (getenv("AT_VERBOSE")) {
    long by[K_NKIND][3] = {{0}};
    size_t n = atomic_load(&w->tp.next);
    for (size_t i = 0; i < n && i < w->tp.cap; i++) {
      tok *k = &w->tp.t[i];
      by[k->kind][0] += atomic_load(&k->runs);
      by[k->kind][1] += atomic_load(&k->lane_cancels);
      by[k->kind][2] += atomic_load(&k->pool_cancels);
    }
    fprintf(stderr,
            "round %d mode %d bounded %d pause %d: accepted %ld; run/lane-cancel/pool-cancel "
            "plain %ld/%ld/%ld keyed %ld/%ld/%ld lane1 %ld/%ld/%ld lane2 %ld/%ld/%ld; flush "
            "submits %ld\n",
            round, mode, bounded, pause_first, accepted, by[0][0], by[0][1], by[0][2], by[1][0],
            by[1][1], by[1][2], by[2][0], by[2][1], by[2][2], by[3][0], by[3][1], by[3][2],
            atomic_load(&w->flush_submits));
  }
  if (bad >= 0) tok_report(&w->tp, bad);
  cr_assert_eq(bad, -1, "round %d mode %d bounded %d pause %d: token %ld", round, mode, bounded,
               pause_first, bad);
  cr_assert_eq(atomic_load(&foreign_cancels), 0, "round %d: the pool's on_cancel saw a runner",
               round);
  cr_assert_eq(atomic_load(&bad_ids), 0);
  cr_assert_eq(atomic_load(&w->flush_order_errors), 0);
  for (int k = 0; k < 64; k++)
    cr_assert_eq(atomic_load(&w->last_flushed[k]), w->last_marked[k], "round %d key %d", round,
                 k);
  free(w->tp.t);
}

static void all_attached(int mode) {
  alarm(AT_ALARM_S * 3 * (unsigned)at_mult());
  int rounds = TT_SCALE(24, 8) * at_mult();
  for (int r = 0; r < rounds; r++) world_round(r, mode, r % 4, r % 3 == 1);
  alarm(0);
}

Test(attack_lanes2, all_attached_drain) { all_attached(SH_DRAIN); }
Test(attack_lanes2, all_attached_cancel) { all_attached(SH_CANCEL); }
Test(attack_lanes2, all_attached_cancel_nowait) { all_attached(SH_NOWAIT); }
Test(attack_lanes2, all_attached_timed_then_cancel) { all_attached(SH_TIMED0_CANCEL); }
Test(attack_lanes2, all_attached_timed_then_drain) { all_attached(SH_TIMED0_DRAIN); }

/* ---- caller-runs submitters: each call runs its own task at most -------------- */

static _Thread_local int cr_in_call;   /* this thread is inside a submit */
static _Thread_local int cr_ran;       /* tasks run here during that call */
static _Thread_local void *cr_own;     /* the call's own task */
static _Thread_local int cr_ran_other; /* of those, not the call's own */

typedef struct crworld {
  tko_pool *p;
  tko_lanes *l;
  tokpool tp;
  atomic_bool closing, stop;
  atomic_long violations, calls, caller_ran;
} crworld;

static crworld CW;

static int cr_task(void *arg) {
  if (cr_in_call) {
    cr_ran++;
    if (arg != cr_own) cr_ran_other++;
  }
  tt_spin_ns(2000); /* short but not empty: queues fill up */
  return tok_run(arg);
}

static void *cr_submitter(void *arg) {
  crworld *w = &CW;
  uint64_t seed = (uintptr_t)arg * 0x2545F4914F6CDD1Dull + 1;
  while (!atomic_load(&w->stop)) {
    uint64_t r = tt_rand(&seed);
    uint64_t key = (r >> 4) % 3; /* few keys: appenders meet callers */
    bool keyed = r & 1;
    tok *k = tok_get(&w->tp, keyed ? K_KEYED : K_LANE1);
    if (!k) break;
    bool closing_before = atomic_load(&w->closing);
    cr_in_call = 1;
    cr_ran = cr_ran_other = 0;
    cr_own = k;
    int rc = keyed ? tko_submit_keyed(w->p, key, cr_task, k, 0)
                   : tko_lanes_submit(w->l, key, cr_task, k, 0);
    cr_in_call = 0;
    if (rc == 0) atomic_store(&k->accepted, true);
    atomic_fetch_add(&w->calls, 1);
    if (cr_ran) atomic_fetch_add(&w->caller_ran, 1);
    /* Before shutdown a call runs its own task at most. */
    if (!closing_before && !atomic_load(&w->closing) && (cr_ran > 1 || cr_ran_other))
      atomic_fetch_add(&w->violations, 1);
    if (rc == -ESHUTDOWN) break;
  }
  return NULL;
}

static void cr_pool_cancel(void *user, const tko_task_info *t) {
  (void)user;
  if (t->fn != cr_task) {
    atomic_fetch_add(&foreign_cancels, 1);
    return;
  }
  atomic_fetch_add(&((tok *)t->arg)->pool_cancels, 1);
}

Test(attack_lanes2, caller_runs_submitters_race_appenders_and_shutdown) {
  alarm(AT_ALARM_S * 2 * (unsigned)at_mult());
  int rounds = TT_SCALE(16, 6) * at_mult();
  for (int round = 0; round < rounds; round++) {
    crworld *w = &CW;
    memset(w, 0, sizeof *w);
    atomic_store(&foreign_cancels, 0);
    w->tp.cap = TT_SCALE(20000, 5000);
    w->tp.t = calloc(w->tp.cap, sizeof(tok));
    tko_options o = tko_basic_options(1);
    o.queue_capacity = 1 + round % 2;
    o.full_policy = TKO_FULL_CALLER_RUNS;
    o.hooks.on_cancel = cr_pool_cancel;
    cr_assert_eq(tko_pool_create(&w->p, &o), 0);
    tko_lane_options lo = tko_lane_default_options();
    lo.on_cancel = lane_cancel_tok;
    lo.max_drain = 1 + round % 3;
    cr_assert_eq(tko_lanes_create(&w->l, w->p, &lo), 0);
    enum { N = 4 };
    pthread_t th[N];
    for (int i = 0; i < N; i++)
      cr_assert_eq(pthread_create(&th[i], NULL, cr_submitter, (void *)(uintptr_t)(i + 1)), 0);
    long want = TT_SCALE(4000, 1000);
    uint64_t end = tt_now_ns() + 20ull * 1000000000u;
    while (atomic_load(&w->calls) < want && tt_now_ns() < end) sched_yield();
    atomic_store(&w->closing, true);
    tko_shutdown_mode mode = round % 3 == 0 ? TKO_DRAIN : round % 3 == 1 ? TKO_CANCEL
                                                                        : TKO_CANCEL_NOWAIT;
    cr_assert_eq(tko_pool_shutdown(w->p, mode), 0);
    atomic_store(&w->stop, true);
    for (int i = 0; i < N; i++) cr_assert_eq(pthread_join(th[i], NULL), 0);
    cr_assert_eq(tko_lanes_destroy(w->l), 0);
    tko_stats ps;
    tko_pool_stats(w->p, &ps);
    cr_assert_eq(ps.submitted, ps.completed + ps.cancelled + ps.queued + ps.running);
    cr_assert_eq(tko_pool_destroy(w->p), 0);
    long accepted;
    long bad = tok_first_bad(&w->tp, mode == TKO_DRAIN, &accepted);
    if (getenv("AT_VERBOSE"))
      fprintf(stderr, "caller-runs round %d: %ld calls, %ld ran a task on the caller, %ld accepted\n",
              round, atomic_load(&w->calls), atomic_load(&w->caller_ran), accepted);
    if (bad >= 0) tok_report(&w->tp, bad);
    cr_assert_eq(bad, -1, "round %d: token %ld", round, bad);
    cr_assert_eq(atomic_load(&foreign_cancels), 0);
    cr_assert_eq(atomic_load(&w->violations), 0,
                 "round %d: %ld calls ran more than their own task (of %ld caller runs)", round,
                 atomic_load(&w->violations), atomic_load(&w->caller_ran));
    free(w->tp.t);
  }
  alarm(0);
}

/* ---- rings: bursts, many keys, pause/resume, a failing allocator ------------- */

enum { RG_THREADS = 3, RG_KEYS = 128 };

/* A failing allocator that also counts live bytes and blocks. */
typedef struct fba {
  atomic_long calls, fail_every, live_bytes, live_blocks;
  tko_allocator al;
} fba;

typedef struct { size_t size; max_align_t align; } fba_head;

static void *fba_alloc(void *ctx, size_t size) {
  fba *f = ctx;
  long n = atomic_fetch_add(&f->calls, 1) + 1, every = atomic_load(&f->fail_every);
  if (every && n % every == 0) return NULL;
  fba_head *h = malloc(sizeof *h + size);
  if (!h) return NULL;
  h->size = size;
  atomic_fetch_add(&f->live_bytes, (long)size);
  atomic_fetch_add(&f->live_blocks, 1);
  return h + 1;
}

static void fba_free(void *ctx, void *p) {
  fba *f = ctx;
  if (!p) return;
  fba_head *h = (fba_head *)p - 1;
  atomic_fetch_sub(&f->live_bytes, (long)h->size);
  atomic_fetch_sub(&f->live_blocks, 1);
  free(h);
}

static void *fba_realloc(void *ctx, void *p, size_t size) {
  void *q = fba_alloc(ctx, size);
  if (q && p) {
    size_t old = ((fba_head *)p - 1)->size;
    memcpy(q, p, old < size ? old : size);
    fba_free(ctx, p);
  }
  return q;
}

typedef struct rgtok {
  atomic_int runs, cancels;
  atomic_bool accepted;
  int thread, seq;
  uint64_t key;
} rgtok;

typedef struct rgworld {
  tko_pool *p;
  tko_lanes *l;
  fba al;
  rgtok *t;
  size_t per_thread;
  atomic_int inflight[RG_KEYS];
  int last_seq[RG_THREADS][RG_KEYS]; /* guarded by the lane (per-key exclusion) */
  atomic_long order_errors, overlap_errors, enomem;
  atomic_bool stop_toggler;
} rgworld;

static rgworld RG;

static int rg_task(void *arg) {
  rgtok *t = arg;
  rgworld *w = &RG;
  if (atomic_fetch_add(&w->inflight[t->key], 1) != 0) atomic_fetch_add(&w->overlap_errors, 1);
  if (t->seq <= w->last_seq[t->thread][t->key]) atomic_fetch_add(&w->order_errors, 1);
  w->last_seq[t->thread][t->key] = t->seq;
  atomic_fetch_add(&t->runs, 1);
  atomic_fetch_sub(&w->inflight[t->key], 1);
  return 0;
}

static void rg_cancel(void *user, const tko_lane_task *t) {
  (void)user;
  atomic_fetch_add(&((rgtok *)t->arg)->cancels, 1);
}

static void *rg_submitter(void *arg) {
  rgworld *w = &RG;
  int id = (int)(uintptr_t)arg;
  uint64_t seed = 77 + (uint64_t)id;
  int seq[RG_KEYS] = {0};
  size_t i = 0;
  while (i < w->per_thread) {
    /* a burst on one key, then scattered submits */
    uint64_t r = tt_rand(&seed);
    uint64_t key = r % RG_KEYS;
    size_t burst = (r >> 20) % 4 == 0 ? 4000 : 1 + (r >> 24) % 8;
    for (size_t b = 0; b < burst && i < w->per_thread; b++, i++) {
      rgtok *t = &w->t[(size_t)id * w->per_thread + i];
      uint64_t k = b % 5 == 4 ? tt_rand(&seed) % RG_KEYS : key;
      t->thread = id;
      t->key = k;
      t->seq = ++seq[k];
      int rc = tko_lanes_submit(w->l, k, rg_task, t, (int)(k % 4));
      if (rc == 0) atomic_store(&t->accepted, true);
      else if (rc == -ENOMEM) atomic_fetch_add(&w->enomem, 1);
      else fprintf(stderr, "rings: submit rc %d\n", rc);
    }
  }
  return NULL;
}

static void *rg_toggler(void *arg) {
  (void)arg;
  rgworld *w = &RG;
  unsigned n = 0;
  while (!atomic_load(&w->stop_toggler)) {
    tko_pool_pause(w->p);
    for (int i = 0; i < 200; i++) sched_yield();
    tko_pool_resume(w->p);
    if (++n % 8 == 0) tko_pool_resize(w->p, 1 + n % 3, n % 2);
    for (int i = 0; i < 50; i++) sched_yield();
  }
  tko_pool_resume(w->p);
  return NULL;
}

static void rings_round(int round, long fail_every, bool cancel_at_end) {
  rgworld *w = &RG;
  memset(w, 0, sizeof *w);
  w->al.al = (tko_allocator){fba_alloc, fba_realloc, fba_free, &w->al};
  w->per_thread = TT_SCALE(30000, 6000);
  w->t = calloc(w->per_thread * RG_THREADS, sizeof(rgtok));
  tko_options o = tko_basic_options(2);
  o.max_threads = 8;
  cr_assert_eq(tko_pool_create(&w->p, &o), 0);
  tko_lane_options lo = tko_lane_default_options();
  lo.lanes = 64; /* 128 keys: collisions */
  lo.lane_capacity = 4;
  lo.max_drain = 1 + round % 5;
  lo.on_cancel = rg_cancel;
  lo.allocator = &w->al.al;
  cr_assert_eq(tko_lanes_create(&w->l, w->p, &lo), 0);
  /* Baseline: every key's lane used once, rings at lane_capacity. */
  for (uint64_t k = 0; k < RG_KEYS; k++)
    cr_assert_eq(tko_lanes_submit(w->l, k, tt_nop_fn, NULL, 0), 0);
  cr_assert_eq(tko_lanes_wait_idle(w->l, TT_LONG_MS), 0);
  cr_assert_eq(tko_pool_wait_idle(w->p, TT_LONG_MS), 0);
  long base = atomic_load(&w->al.live_bytes);
  if (fail_every) atomic_store(&w->al.fail_every, fail_every);
  pthread_t th[RG_THREADS], tg;
  cr_assert_eq(pthread_create(&tg, NULL, rg_toggler, NULL), 0);
  for (int i = 0; i < RG_THREADS; i++)
    cr_assert_eq(pthread_create(&th[i], NULL, rg_submitter, (void *)(uintptr_t)i), 0);
  for (int i = 0; i < RG_THREADS; i++) cr_assert_eq(pthread_join(th[i], NULL), 0);
  atomic_store(&w->stop_toggler, true);
  cr_assert_eq(pthread_join(tg, NULL), 0);
  if (cancel_at_end) {
    cr_assert_eq(tko_pool_pause(w->p), 0);
    cr_assert_eq(tko_lanes_cancel(w->l), 0);
    cr_assert_eq(tko_pool_resume(w->p), 0);
  }
  cr_assert_eq(tko_lanes_wait_idle(w->l, 60000), 0, "round %d: lanes never idle", round);
  atomic_store(&w->al.fail_every, 0);
  tko_lane_stats ls;
  tko_lanes_stats(w->l, &ls);
  cr_assert_eq(ls.queued, 0);
  cr_assert_eq(ls.submitted, ls.completed + ls.cancelled);
  cr_assert_eq(tko_pool_wait_idle(w->p, 60000), 0);
  long live_idle = atomic_load(&w->al.live_bytes);
  /* Rings a burst grew past 4 x lane_capacity went back (those that grew
   * less may stay: at most 4 x 4 slots for each of the 64 lanes). */
  if (!fail_every)
    cr_assert_leq(live_idle, base + (long)(64 * 16 * sizeof(tko_lane_task)),
                  "round %d (cancel %d): %ld bytes idle, baseline %ld", round, (int)cancel_at_end,
                  live_idle, base);
  cr_assert_eq(tko_lanes_destroy(w->l), 0);
  cr_assert_eq(atomic_load(&w->al.live_blocks), 0, "round %d: %ld blocks leaked", round,
               atomic_load(&w->al.live_blocks));
  cr_assert_eq(tko_pool_destroy(w->p), 0);
  long acc = 0, runs = 0;
  for (size_t i = 0; i < w->per_thread * RG_THREADS; i++) {
    rgtok *t = &w->t[i];
    int r = atomic_load(&t->runs), c = atomic_load(&t->cancels);
    bool a = atomic_load(&t->accepted);
    acc += a;
    runs += r;
    cr_assert_eq(r + c, a ? 1 : 0, "round %d: task %zu ran %d cancelled %d accepted %d", round,
                 i, r, c, (int)a);
    if (!cancel_at_end) cr_assert_eq(c, 0);
  }
  cr_assert_eq((uint64_t)acc + RG_KEYS, ls.submitted);
  cr_assert_eq(atomic_load(&w->order_errors), 0, "round %d: order", round);
  cr_assert_eq(atomic_load(&w->overlap_errors), 0, "round %d: exclusion", round);
  if (fail_every) cr_assert_gt(atomic_load(&w->enomem), 0);
  free(w->t);
}

Test(attack_lanes2, rings_shrink_while_bursts_race) {
  alarm(AT_ALARM_S * 2 * (unsigned)at_mult());
  for (int r = 0; r < TT_SCALE(6, 3) * at_mult(); r++) rings_round(r, 0, r % 2);
  alarm(0);
}

Test(attack_lanes2, rings_with_a_failing_allocator) {
  alarm(AT_ALARM_S * 2 * (unsigned)at_mult());
  long every[] = {3, 7, 2};
  for (int r = 0; r < TT_SCALE(6, 3) * at_mult(); r++) rings_round(r, every[r % 3], r % 2);
  alarm(0);
}

/* ---- runners taken alone across pause/resume and resize ------------------------ */

typedef struct meetn {
  tt_count started;
  int need;
  atomic_int missed;
} meetn;

static meetn MEET;

static int meetn_task(void *arg) {
  meetn *m = arg;
  tt_count_add(&m->started, 1);
  if (!tt_count_wait_geq_within(&m->started, m->need, 10000)) atomic_fetch_add(&m->missed, 1);
  return 0;
}

Test(attack_lanes2, runner_alone_across_pause_resume_and_resize) {
  alarm(AT_ALARM_S * 2);
  tko_options o = tko_basic_options(1);
  o.max_threads = 8;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  tko_lanes *l;
  cr_assert_eq(tko_lanes_create(&l, p, NULL), 0);
  uint64_t keys[4];
  int nk = 0;
  for (uint64_t k = 1; nk < 4; k++) {
    bool clash = false;
    for (int j = 0; j < nk; j++) clash |= tko_lanes_index(l, k) == tko_lanes_index(l, keys[j]);
    if (!clash) keys[nk++] = k;
  }
  for (int round = 0; round < TT_SCALE(30, 10); round++) {
    int need = 2 + round % 3; /* 2..4 keys meet */
    cr_assert_eq(tko_pool_resize(p, 1, 0), 0);
    for (int i = 0; i < 3000; i++) cr_assert_eq(tko_submit(p, tt_nop_fn, NULL, 0), 0);
    cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
    meetn *m = &MEET;
    memset(m, 0, sizeof *m);
    tt_count_init(&m->started);
    m->need = need;
    cr_assert_eq(tko_pool_pause(p), 0);
    for (int i = 0; i < need; i++) {
      cr_assert_eq(tko_lanes_submit(l, keys[i], meetn_task, m, 3), 0);
      cr_assert_eq(tko_submit_keyed(p, 1000 + (uint64_t)round * 7 + i, tt_nop_fn, NULL, 3), 0);
      for (int j = 0; j < 3; j++) cr_assert_eq(tko_submit(p, tt_nop_fn, NULL, 3), 0);
    }
    /* resume and pause again before the resize: a runner taken in between
     * must stay alone */
    cr_assert_eq(tko_pool_resume(p), 0);
    cr_assert_eq(tko_pool_pause(p), 0);
    cr_assert_eq(tko_pool_resize(p, (unsigned)need, round % 2), 0);
    cr_assert_eq(tko_pool_resume(p), 0);
    cr_assert_eq(tko_lanes_wait_idle(l, TT_LONG_MS), 0);
    cr_assert_eq(atomic_load(&m->missed), 0, "round %d: %d keys did not all run at once", round,
                 need);
    cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
    tt_count_fini(&m->started);
  }
  /* A shrink while runners hold every worker: the runners queued behind
   * still run. */
  tt_pin pin = TT_PIN_INIT;
  cr_assert_eq(tko_pool_resize(p, 2, 0), 0);
  cr_assert_eq(tko_lanes_submit(l, keys[0], tt_pin_fn, &pin, 0), 0);
  cr_assert_eq(tko_lanes_submit(l, keys[1], tt_pin_fn, &pin, 0), 0);
  cr_assert(tt_count_wait_geq(&pin.started, 2));
  for (int i = 0; i < 100; i++) cr_assert_eq(tko_lanes_submit(l, keys[2 + i % 2], tt_nop_fn, NULL, 0), 0);
  cr_assert_eq(tko_pool_resize(p, 1, 0), 0);
  tt_gate_open(&pin.gate);
  cr_assert_eq(tko_lanes_wait_idle(l, TT_LONG_MS), 0);
  tko_lane_stats ls;
  tko_lanes_stats(l, &ls);
  cr_assert_eq(ls.submitted, ls.completed);
  cr_assert_eq(tko_lanes_destroy(l), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
  alarm(0);
}

/* ---- on_cancel callbacks that call back into the lanes and the pool -------------- */

typedef struct reent {
  tko_pool *p;
  tko_lanes *l;
  atomic_int lane_cancels, pool_cancels, runs, foreign;
  atomic_int submit_ok; /* a submit from on_cancel was accepted */
  atomic_int rc_destroy, rc_wait, rc_shutdown, rc_pool_shutdown, rc_lsubmit, rc_keyed, rc_cancel;
  tft_token *extra; /* tasks that on_cancel submitted and got accepted */
} reent;

static reent RE;

static int re_task(void *arg) {
  (void)arg;
  atomic_fetch_add(&RE.runs, 1);
  return 0;
}

static void re_lane_cancel(void *user, const tko_lane_task *t) {
  reent *r = user;
  (void)t;
  atomic_fetch_add(&r->lane_cancels, 1);
  tko_lane_stats ls;
  tko_lanes_stats(r->l, &ls);
  tko_stats ps;
  tko_pool_stats(r->p, &ps);
  atomic_store(&r->rc_wait, tko_lanes_wait_idle(r->l, -1)); /* -EDEADLK, not a hang */
  int rc = tko_lanes_submit(r->l, t->key, re_task, NULL, 0);
  atomic_store(&r->rc_lsubmit, rc);
  if (rc == 0) atomic_fetch_add(&r->submit_ok, 1);
  rc = tko_submit_keyed(r->p, t->key, re_task, NULL, 0);
  atomic_store(&r->rc_keyed, rc);
  if (rc == 0) atomic_fetch_add(&r->submit_ok, 1);
  atomic_store(&r->rc_cancel, tko_lanes_cancel(r->l));
  int d = tko_lanes_destroy(r->l); /* promised -EDEADLK, doing nothing */
  if (d != -EDEADLK) atomic_store(&r->rc_destroy, d == 0 ? 1 : d);
  atomic_store(&r->rc_shutdown, tko_pool_shutdown_timed(r->p, TKO_CANCEL, 2000));
}

static void re_pool_cancel(void *user, const tko_task_info *t) {
  reent *r = user;
  if (t->fn != re_task) {
    atomic_fetch_add(&r->foreign, 1);
    return;
  }
  atomic_fetch_add(&r->pool_cancels, 1);
  /* legacy hooks: harmless, and they say "not ours" */
  if (tko_lanes_pool_cancelled(t) || tko_coalescer_pool_cancelled(t))
    atomic_fetch_add(&r->foreign, 1);
  int rc = tko_submit_keyed(r->p, 5, re_task, NULL, 0);
  if (rc == 0) atomic_fetch_add(&r->submit_ok, 1);
  if (tko_lanes_submit(r->l, 5, re_task, NULL, 0) == 0) atomic_fetch_add(&r->submit_ok, 1);
  atomic_store(&r->rc_pool_shutdown, tko_pool_shutdown_timed(r->p, TKO_DRAIN, 2000));
}

Test(attack_lanes2, on_cancel_reentry_at_shutdown) {
  alarm(AT_ALARM_S);
  for (int round = 0; round < 6; round++) {
    reent *r = &RE;
    memset(r, 0, sizeof *r);
    tko_options o = tko_basic_options(1);
    o.hooks.on_cancel = re_pool_cancel;
    o.hooks.user = r;
    cr_assert_eq(tko_pool_create(&r->p, &o), 0);
    tko_lane_options lo = tko_lane_default_options();
    lo.on_cancel = re_lane_cancel;
    lo.user = r;
    lo.max_drain = 1;
    cr_assert_eq(tko_lanes_create(&r->l, r->p, &lo), 0);
    tt_pin pin = TT_PIN_INIT;
    cr_assert_eq(tko_submit(r->p, tt_pin_fn, &pin, 0), 0);
    cr_assert(tt_count_wait_geq(&pin.started, 1));
    enum { N = 50 };
    for (int i = 0; i < N; i++) {
      cr_assert_eq(tko_lanes_submit(r->l, (uint64_t)i % 7, re_task, NULL, 0), 0);
      cr_assert_eq(tko_submit_keyed(r->p, (uint64_t)i % 5, re_task, NULL, 0), 0);
      cr_assert_eq(tko_submit(r->p, re_task, NULL, 0), 0);
    }
    if (round % 2) cr_assert_eq(tko_pool_pause(r->p), 0);
    tt_gate_open(&pin.gate);
    int rc = round % 3 == 2 ? tko_pool_shutdown_timed(r->p, TKO_CANCEL_NOWAIT, 0)
                            : tko_pool_shutdown(r->p, TKO_CANCEL);
    cr_assert_eq(rc, 0);
    cr_assert_eq(tko_lanes_destroy(r->l), 0);
    cr_assert_eq(tko_pool_destroy(r->p), 0);
    int total = atomic_load(&r->runs) + atomic_load(&r->lane_cancels) +
                atomic_load(&r->pool_cancels);
    cr_assert_eq(total, 3 * N + atomic_load(&r->submit_ok),
                 "round %d: runs %d lane_cancels %d pool_cancels %d, accepted from on_cancel %d",
                 round, atomic_load(&r->runs), atomic_load(&r->lane_cancels),
                 atomic_load(&r->pool_cancels), atomic_load(&r->submit_ok));
    cr_assert_eq(atomic_load(&r->foreign), 0);
    cr_assert_eq(atomic_load(&r->rc_destroy), 0, "lanes destroy from on_cancel: %d",
                 atomic_load(&r->rc_destroy));
    if (atomic_load(&r->lane_cancels)) {
      cr_assert_eq(atomic_load(&r->rc_wait), -EDEADLK);
      cr_assert_eq(atomic_load(&r->rc_lsubmit), -ESHUTDOWN);
    }
    if (atomic_load(&r->pool_cancels))
      cr_assert_eq(atomic_load(&r->rc_pool_shutdown), -EDEADLK, "round %d: rc %d", round,
                   atomic_load(&r->rc_pool_shutdown));
    fprintf(stderr, "reentry round %d: lane on_cancel's shutdown_timed rc %d, cancel rc %d\n",
            round, atomic_load(&r->rc_shutdown), atomic_load(&r->rc_cancel));
  }
  alarm(0);
}

/* tko_lanes_cancel (no shutdown) with an on_cancel that re-enters. */
Test(attack_lanes2, on_cancel_reentry_from_lanes_cancel) {
  alarm(AT_ALARM_S);
  reent *r = &RE;
  memset(r, 0, sizeof *r);
  tko_options o = tko_basic_options(1);
  o.hooks.on_cancel = re_pool_cancel;
  o.hooks.user = r;
  cr_assert_eq(tko_pool_create(&r->p, &o), 0);
  tko_lane_options lo = tko_lane_default_options();
  lo.on_cancel = re_lane_cancel;
  lo.user = r;
  cr_assert_eq(tko_lanes_create(&r->l, r->p, &lo), 0);
  cr_assert_eq(tko_pool_pause(r->p), 0);
  for (int i = 0; i < 40; i++) cr_assert_eq(tko_lanes_submit(r->l, (uint64_t)i, re_task, NULL, 0), 0);
  /* on_cancel calls tko_pool_shutdown_timed(CANCEL, 2 s) here: from a
   * non-pool thread that is allowed; the pool is paused (shutdown resumes) */
  cr_assert_eq(tko_lanes_cancel(r->l), 0);
  cr_assert_eq(tko_lanes_destroy(r->l), 0);
  cr_assert_eq(tko_pool_destroy(r->p), 0);
  cr_assert_eq(atomic_load(&r->runs) + atomic_load(&r->lane_cancels) +
                   atomic_load(&r->pool_cancels),
               40 + atomic_load(&r->submit_ok), "runs %d lane_cancels %d pool_cancels %d ok %d",
               atomic_load(&r->runs), atomic_load(&r->lane_cancels),
               atomic_load(&r->pool_cancels), atomic_load(&r->submit_ok));
  cr_assert_eq(atomic_load(&r->foreign), 0);
  alarm(0);
}

/* ---- the coalescer's sweep when the pool is cancelled ----------------------------- */

typedef struct cz {
  atomic_uint_fast64_t flushed[32];
  atomic_long entries;
} cz;

static cz CZ;

static void cz_flush(void *user, const tko_coalesce_entry *e, size_t n) {
  cz *c = user;
  for (size_t i = 0; i < n; i++) {
    atomic_store(&c->flushed[e[i].key], e[i].value);
    atomic_fetch_add(&c->entries, 1);
  }
}

static void cz_pool_cancel(void *user, const tko_task_info *t) {
  (void)user;
  if (t->fn != tt_nop_fn) atomic_fetch_add(&foreign_cancels, 1);
}

Test(attack_lanes2, coalescer_sweep_cancelled) {
  alarm(AT_ALARM_S);
  for (int round = 0; round < TT_SCALE(10, 4); round++) {
    cz *c = &CZ;
    memset(c, 0, sizeof *c);
    atomic_store(&foreign_cancels, 0);
    tko_options o = tko_basic_options(1);
    o.hooks.on_cancel = cz_pool_cancel;
    tko_pool *p;
    cr_assert_eq(tko_pool_create(&p, &o), 0);
    tko_coalescer *co;
    cr_assert_eq(tko_coalescer_create(&co, p, 1, cz_flush, c, NULL), 0);
    tt_pin pin = TT_PIN_INIT;
    cr_assert_eq(tko_submit(p, tt_pin_fn, &pin, 0), 0);
    cr_assert(tt_count_wait_geq(&pin.started, 1));
    for (int k = 0; k < 32; k++) cr_assert_eq(tko_coalescer_mark(co, (uint64_t)k, 1), 0);
    /* Wait (bounded, by polling the coalescer's own counter) until a sweep
     * is queued behind the pin. */
    uint64_t end = tt_now_ns() + 10ull * 1000000000u;
    tko_coalesce_stats cs;
    do {
      tko_coalescer_stats(co, &cs);
      sched_yield();
    } while (cs.skipped_ticks == 0 && tt_now_ns() < end);
    cr_assert_gt(cs.skipped_ticks, 0);
    for (int i = 0; i < 10; i++) cr_assert_eq(tko_submit(p, tt_nop_fn, NULL, 0), 0);
    if (round % 2) cr_assert_eq(tko_pool_pause(p), 0);
    /* Cancel: the sweep is queued; the pin still runs. */
    cr_assert_eq(tko_pool_shutdown_timed(p, round % 3 == 2 ? TKO_CANCEL_NOWAIT : TKO_CANCEL, 0),
                 round % 3 == 2 ? 0 : -ETIMEDOUT);
    for (int k = 0; k < 32; k++) cr_assert_eq(tko_coalescer_mark(co, (uint64_t)k, 2), 0);
    /* Marks keep being flushed while the pool is closing: a flush on this
     * thread returns once they are. */
    cr_assert_eq(tko_coalescer_flush(co), 0);
    for (int k = 0; k < 32; k++) cr_assert_eq(atomic_load(&c->flushed[k]), 2, "round %d", round);
    for (int k = 0; k < 32; k++) cr_assert_eq(tko_coalescer_mark(co, (uint64_t)k, 3), 0);
    tt_gate_open(&pin.gate);
    cr_assert_eq(tko_pool_shutdown_timed(p, TKO_CANCEL, 30000), 0);
    cr_assert_eq(tko_coalescer_destroy(co), 0);
    for (int k = 0; k < 32; k++) cr_assert_eq(atomic_load(&c->flushed[k]), 3, "round %d", round);
    tko_stats ps;
    tko_pool_stats(p, &ps);
    cr_assert_eq(ps.submitted, ps.completed + ps.cancelled + ps.queued + ps.running);
    cr_assert_eq(atomic_load(&foreign_cancels), 0, "round %d: the pool's on_cancel saw a sweep",
                 round);
    cr_assert_eq(tko_pool_destroy(p), 0);
  }
  alarm(0);
}

/* ---- caller-runs from a pool worker: it never waits for room on its own pool ----- */

typedef struct wk {
  tko_pool *p;
  tko_lanes *l;
  bool keyed;
  atomic_int rc, appended_ok, runs;
  tt_count done;
} wk;

static wk WK;

static int wk_leaf(void *arg) {
  (void)arg;
  atomic_fetch_add(&WK.runs, 1);
  return 0;
}

/* Runs on the worker, inline (caller-runs): appends to its own key. */
static int wk_own(void *arg) {
  wk *w = arg;
  atomic_fetch_add(&w->runs, 1);
  for (int i = 0; i < 3; i++) {
    int rc = w->keyed ? tko_submit_keyed(w->p, 11, wk_leaf, NULL, 0)
                      : tko_lanes_submit(w->l, 11, wk_leaf, NULL, 0);
    if (rc == 0) atomic_fetch_add(&w->appended_ok, 1);
  }
  return 0;
}

/* The pool's only worker: fills the one queue slot, then submits to an idle
 * lane (caller-runs on this worker) whose task appends three more. */
static int wk_driver(void *arg) {
  wk *w = arg;
  if (tko_submit(w->p, tt_nop_fn, NULL, 0) != 0) atomic_store(&w->rc, -1000);
  int rc = w->keyed ? tko_submit_keyed(w->p, 11, wk_own, w, 0)
                    : tko_lanes_submit(w->l, 11, wk_own, w, 0);
  atomic_store(&w->rc, rc);
  tt_count_add(&w->done, 1);
  return 0;
}

static void worker_caller_runs(bool keyed) {
  alarm(60);
  wk *w = &WK;
  memset(w, 0, sizeof *w);
  tt_count_init(&w->done);
  w->keyed = keyed;
  tko_options o = tko_basic_options(1);
  o.queue_capacity = 1;
  o.full_policy = TKO_FULL_CALLER_RUNS;
  cr_assert_eq(tko_pool_create(&w->p, &o), 0);
  cr_assert_eq(tko_lanes_create(&w->l, w->p, NULL), 0);
  cr_assert_eq(tko_submit(w->p, wk_driver, w, 0), 0);
  cr_assert(tt_count_wait_geq_within(&w->done, 1, 20000), "the worker's submit never returned");
  int rc = atomic_load(&w->rc);
  cr_assert(rc == 0 || rc == -EAGAIN, "rc %d", rc);
  cr_assert_eq(tko_pool_wait_idle(w->p, 20000), 0);
  cr_assert_eq(tko_lanes_wait_idle(w->l, 20000), 0);
  cr_assert_eq(atomic_load(&w->runs), (rc == 0) + atomic_load(&w->appended_ok));
  cr_assert_eq(tko_lanes_destroy(w->l), 0);
  cr_assert_eq(tko_pool_destroy(w->p), 0);
  tt_count_fini(&w->done);
  alarm(0);
}

Test(attack_lanes2, caller_runs_lane_submit_from_a_worker) { worker_caller_runs(false); }
Test(attack_lanes2, caller_runs_keyed_submit_from_a_worker) { worker_caller_runs(true); }

/* ---- a caller-run visit whose appended tasks meet the pool's shutdown ------------ */

typedef struct crs {
  tko_pool *p;
  tko_lanes *l;
  bool keyed;
  tok t[8];
  tt_gate go_shutdown;
  tt_count shutdown_began;
  atomic_int shutdown_rc;
  tko_shutdown_mode mode;
} crs;

static crs CRS;

static void *crs_shutdowner(void *arg) {
  crs *c = arg;
  tt_gate_wait(&c->go_shutdown);
  atomic_store(&c->shutdown_rc, tko_pool_shutdown(c->p, c->mode));
  return NULL;
}

static void crs_pool_cancel(void *user, const tko_task_info *t) {
  (void)user;
  if (t->fn == tt_nop_fn) return; /* the slot filler */
  if (t->fn != tok_run) {
    atomic_fetch_add(&foreign_cancels, 1);
    return;
  }
  atomic_fetch_add(&((tok *)t->arg)->pool_cancels, 1);
}

/* The caller-run task: appends three (accepted, the pool still runs), then
 * starts the shutdown and waits until it has begun. */
static int crs_own(void *arg) {
  crs *c = &CRS;
  tok_run(arg);
  for (int i = 1; i <= 3; i++) {
    int rc = c->keyed ? tko_submit_keyed(c->p, 21, tok_run, &c->t[i], 0)
                      : tko_lanes_submit(c->l, 21, tok_run, &c->t[i], 0);
    if (rc == 0) atomic_store(&c->t[i].accepted, true);
  }
  tt_gate_open(&c->go_shutdown);
  uint64_t end = tt_now_ns() + 10ull * 1000000000u;
  while (tko_submit(c->p, tt_nop_fn, NULL, 0) != -ESHUTDOWN && tt_now_ns() < end) sched_yield();
  return 0;
}

static void caller_run_meets_shutdown(bool keyed, tko_shutdown_mode mode) {
  alarm(60);
  crs *c = &CRS;
  memset(c, 0, sizeof *c);
  atomic_store(&foreign_cancels, 0);
  c->go_shutdown = (tt_gate)TT_GATE_INIT;
  c->keyed = keyed;
  c->mode = mode;
  tko_options o = tko_basic_options(1);
  o.queue_capacity = 1;
  o.full_policy = TKO_FULL_CALLER_RUNS;
  o.hooks.on_cancel = crs_pool_cancel;
  cr_assert_eq(tko_pool_create(&c->p, &o), 0);
  tko_lane_options lo = tko_lane_default_options();
  lo.on_cancel = lane_cancel_tok;
  cr_assert_eq(tko_lanes_create(&c->l, c->p, &lo), 0);
  tt_pin pin = TT_PIN_INIT;
  cr_assert_eq(tko_submit(c->p, tt_pin_fn, &pin, 0), 0);
  cr_assert(tt_count_wait_geq(&pin.started, 1));
  cr_assert_eq(tko_submit(c->p, tt_nop_fn, NULL, 0), 0); /* the one slot */
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, crs_shutdowner, c), 0);
  int rc = keyed ? tko_submit_keyed(c->p, 21, crs_own, &c->t[0], 0)
                 : tko_lanes_submit(c->l, 21, crs_own, &c->t[0], 0);
  cr_assert_eq(rc, 0);
  atomic_store(&c->t[0].accepted, true);
  tt_gate_open(&pin.gate);
  cr_assert_eq(pthread_join(th, NULL), 0);
  cr_assert_eq(atomic_load(&c->shutdown_rc), 0);
  cr_assert_eq(tko_lanes_destroy(c->l), 0);
  tko_stats ps;
  tko_pool_stats(c->p, &ps);
  cr_assert_eq(ps.submitted, ps.completed + ps.cancelled + ps.queued + ps.running);
  cr_assert_eq(ps.queued + ps.running, 0);
  cr_assert_eq(tko_pool_destroy(c->p), 0);
  for (int i = 0; i < 4; i++) {
    tok *k = &c->t[i];
    int n = atomic_load(&k->runs) + atomic_load(&k->lane_cancels) + atomic_load(&k->pool_cancels);
    cr_assert_eq(n, atomic_load(&k->accepted) ? 1 : 0, "task %d: runs %d lane %d pool %d", i,
                 atomic_load(&k->runs), atomic_load(&k->lane_cancels),
                 atomic_load(&k->pool_cancels));
    if (mode == TKO_DRAIN && atomic_load(&k->accepted)) cr_assert_eq(atomic_load(&k->runs), 1);
  }
  cr_assert_eq(atomic_load(&foreign_cancels), 0);
  alarm(0);
}

Test(attack_lanes2, caller_run_lane_appends_meet_drain) { caller_run_meets_shutdown(false, TKO_DRAIN); }
Test(attack_lanes2, caller_run_lane_appends_meet_cancel) { caller_run_meets_shutdown(false, TKO_CANCEL); }
Test(attack_lanes2, caller_run_keyed_appends_meet_drain) { caller_run_meets_shutdown(true, TKO_DRAIN); }
Test(attack_lanes2, caller_run_keyed_appends_meet_cancel) { caller_run_meets_shutdown(true, TKO_CANCEL); }

/* ---- destroy of a paused pool with keyed and lane tasks queued ------------------- */

Test(attack_lanes2, destroy_paused_pool_with_tables_attached) {
  alarm(60);
  tokpool tp = {.cap = 400};
  tp.t = calloc(tp.cap, sizeof(tok));
  atomic_store(&foreign_cancels, 0);
  tko_options o = tko_basic_options(2);
  o.hooks.on_cancel = pool_cancel_tok;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  tko_lane_options lo = tko_lane_default_options();
  lo.on_cancel = lane_cancel_tok;
  tko_lanes *l;
  cr_assert_eq(tko_lanes_create(&l, p, &lo), 0);
  cr_assert_eq(tko_pool_pause(p), 0);
  for (int i = 0; i < 100; i++) {
    tok *a = tok_get(&tp, K_KEYED), *b = tok_get(&tp, K_LANE1), *c = tok_get(&tp, K_PLAIN);
    cr_assert_eq(tko_submit_keyed(p, (uint64_t)i % 9, tok_run, a, 0), 0);
    atomic_store(&a->accepted, true);
    cr_assert_eq(tko_lanes_submit(l, (uint64_t)i % 9, tok_run, b, 0), 0);
    atomic_store(&b->accepted, true);
    cr_assert_eq(tko_submit(p, tok_run, c, 0), 0);
    atomic_store(&c->accepted, true);
  }
  cr_assert_eq(tko_pool_destroy(p), -EBUSY); /* shuts down (DRAIN), frees nothing */
  tok *late = tok_get(&tp, K_LANE1);
  cr_assert_eq(tko_lanes_submit(l, 1, tok_run, late, 0), -ESHUTDOWN);
  cr_assert_eq(tko_lanes_destroy(l), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
  long acc;
  long bad = tok_first_bad(&tp, true, &acc);
  if (bad >= 0) tok_report(&tp, bad);
  cr_assert_eq(bad, -1);
  cr_assert_eq(acc, 300);
  free(tp.t);
  alarm(0);
}

/* ---- caller-runs and collisions: a key idle on a busy lane is not idle ----------- */

typedef struct coll {
  tko_pool *p;
  tko_lanes *l;
  atomic_int b_running, overlap, a_ran;
  tt_gate b_gate;
  tt_count b_started, a_done;
} coll;

static coll COLL;

static int coll_b(void *arg) {
  coll *c = arg;
  atomic_store(&c->b_running, 1);
  tt_count_add(&c->b_started, 1);
  tt_gate_wait(&c->b_gate);
  atomic_store(&c->b_running, 0);
  return 0;
}

static int coll_a(void *arg) {
  coll *c = arg;
  if (atomic_load(&c->b_running)) atomic_fetch_add(&c->overlap, 1);
  atomic_store(&c->a_ran, 1);
  tt_count_add(&c->a_done, 1);
  return 0;
}

/* Opens B's gate once A ran (a violation, seen at once) or 300 ms passed
 * without A running (right: A waits for B's lane). */
static void *coll_releaser(void *arg) {
  coll *c = arg;
  tt_count_wait_geq_within(&c->a_done, 1, 300);
  tt_gate_open(&c->b_gate);
  return NULL;
}

static void caller_runs_collision(bool keyed) {
  alarm(60);
  coll *c = &COLL;
  memset(c, 0, sizeof *c);
  c->b_gate = (tt_gate)TT_GATE_INIT;
  tt_count_init(&c->b_started);
  tt_count_init(&c->a_done);
  tko_options o = tko_basic_options(1);
  o.queue_capacity = 1;
  o.full_policy = TKO_FULL_CALLER_RUNS;
  cr_assert_eq(tko_pool_create(&c->p, &o), 0);
  cr_assert_eq(tko_lanes_create(&c->l, c->p, NULL), 0); /* default options, like keyed */
  uint64_t ka = 1, kb = 2;
  while (tko_lanes_index(c->l, kb) != tko_lanes_index(c->l, ka)) kb++;
  /* B runs on the only worker, holding the shared lane; a nop fills the slot. */
  int rc = keyed ? tko_submit_keyed(c->p, kb, coll_b, c, 0) : tko_lanes_submit(c->l, kb, coll_b, c, 0);
  cr_assert_eq(rc, 0);
  cr_assert(tt_count_wait_geq(&c->b_started, 1));
  cr_assert_eq(tko_submit(c->p, tt_nop_fn, NULL, 0), 0);
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, coll_releaser, c), 0);
  rc = keyed ? tko_submit_keyed(c->p, ka, coll_a, c, 0) : tko_lanes_submit(c->l, ka, coll_a, c, 0);
  cr_assert_eq(rc, 0);
  cr_assert_eq(pthread_join(th, NULL), 0);
  cr_assert_eq(tko_pool_wait_idle(c->p, 20000), 0);
  cr_assert_eq(tko_lanes_wait_idle(c->l, 20000), 0);
  cr_assert_eq(atomic_load(&c->a_ran), 1);
  cr_assert_eq(atomic_load(&c->overlap), 0,
               "key %llu ran on the caller while key %llu of the same lane ran",
               (unsigned long long)ka, (unsigned long long)kb);
  cr_assert_eq(tko_lanes_destroy(c->l), 0);
  cr_assert_eq(tko_pool_destroy(c->p), 0);
  alarm(0);
}

Test(attack_lanes2, caller_runs_keyed_collision_keeps_exclusion) { caller_runs_collision(true); }
Test(attack_lanes2, caller_runs_lane_collision_keeps_exclusion) { caller_runs_collision(false); }

/* ---- a ring that grows and shrinks on every burst, racing its runner ------------- */

typedef struct flip {
  atomic_int inflight;
  atomic_long order_errors, overlap, runs, cancels;
  long last;
} flip;

static flip FLIP;

static int flip_task(void *arg) {
  flip *f = &FLIP;
  long seq = (long)(intptr_t)arg;
  if (atomic_fetch_add(&f->inflight, 1)) atomic_fetch_add(&f->overlap, 1);
  if (seq <= f->last) atomic_fetch_add(&f->order_errors, 1);
  f->last = seq;
  atomic_fetch_add(&f->runs, 1);
  atomic_fetch_sub(&f->inflight, 1);
  return 0;
}

static void flip_cancel(void *user, const tko_lane_task *t) {
  (void)user;
  (void)t;
  atomic_fetch_add(&FLIP.cancels, 1);
}

static void ring_flip(long fail_every) {
  alarm(AT_ALARM_S * (unsigned)at_mult());
  flip *f = &FLIP;
  memset(f, 0, sizeof *f);
  fba al = {0};
  al.al = (tko_allocator){fba_alloc, fba_realloc, fba_free, &al};
  tko_options o = tko_basic_options(2);
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  tko_lane_options lo = tko_lane_default_options();
  lo.lane_capacity = 1; /* grows past 4 with a burst of 5 */
  lo.max_drain = 1;
  lo.on_cancel = flip_cancel;
  lo.allocator = &al.al;
  tko_lanes *l;
  cr_assert_eq(tko_lanes_create(&l, p, &lo), 0);
  atomic_store(&al.fail_every, fail_every);
  long seq = 0, accepted = 0, refused = 0;
  uint64_t s = 5;
  for (int burst = 0; burst < TT_SCALE(20000, 3000) * at_mult(); burst++) {
    int n = 3 + (int)(tt_rand(&s) % 12);
    for (int i = 0; i < n; i++) {
      int rc = tko_lanes_submit(l, 42, flip_task, (void *)(intptr_t)++seq, 0);
      if (rc == 0) accepted++;
      else if (rc == -ENOMEM) refused++;
      else cr_assert(0, "rc %d", rc);
    }
    /* sometimes let it drain empty, sometimes race the next burst in */
    if (burst % 3 == 0) cr_assert_eq(tko_lanes_wait_idle(l, 20000), 0);
  }
  cr_assert_eq(tko_lanes_wait_idle(l, 20000), 0);
  atomic_store(&al.fail_every, 0);
  cr_assert_eq(tko_pool_wait_idle(p, 20000), 0);
  cr_assert_eq(atomic_load(&f->runs), accepted);
  cr_assert_eq(atomic_load(&f->cancels), 0);
  cr_assert_eq(atomic_load(&f->order_errors), 0);
  cr_assert_eq(atomic_load(&f->overlap), 0);
  if (fail_every) cr_assert_gt(refused, 0);
  cr_assert_eq(tko_lanes_destroy(l), 0);
  cr_assert_eq(atomic_load(&al.live_blocks), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
  alarm(0);
}

Test(attack_lanes2, ring_flips_between_sizes) { ring_flip(0); }
Test(attack_lanes2, ring_flips_with_failing_allocations) { ring_flip(3); }

/* ---- lane_capacity so large that slots x size wraps ------------------------------ */

Test(attack_lanes2, huge_lane_capacity_is_refused_not_wrapped) {
  alarm(60);
  tko_options o = tko_basic_options(1);
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  /* slots x (8, 16, 24, 32, 40, 48, 64 bytes) wraps to a small size */
  size_t caps[] = {((size_t)1 << 61) + 1, ((size_t)1 << 60) + 1, ((size_t)1 << 59) + 1,
                   ((size_t)1 << 58) + 1, SIZE_MAX / 24 + 1, SIZE_MAX / 40 + 1,
                   SIZE_MAX / 48 + 1, SIZE_MAX / 4 + 2, SIZE_MAX};
  for (size_t i = 0; i < sizeof caps / sizeof caps[0]; i++) {
    tko_lane_options lo = tko_lane_default_options();
    lo.lane_capacity = caps[i];
    lo.lanes = 1;
    tko_lanes *l;
    int rc = tko_lanes_create(&l, p, &lo);
    if (rc != 0) {
      cr_assert(rc == -EINVAL || rc == -ENOMEM, "create rc %d", rc);
      continue;
    }
    /* accepted: the first submit must then fail cleanly or work */
    int n = 0;
    for (int j = 0; j < 64; j++) {
      rc = tko_lanes_submit(l, 1, tt_nop_fn, NULL, 0);
      if (rc == 0) n++;
      else cr_assert_eq(rc, -ENOMEM, "cap %zu: submit rc %d", caps[i], rc);
    }
    fprintf(stderr, "lane_capacity %zu: create 0, %d of 64 submits accepted\n", caps[i], n);
    cr_assert_eq(tko_lanes_wait_idle(l, 20000), 0);
    cr_assert_eq(tko_lanes_destroy(l), 0);
  }
  cr_assert_eq(tko_pool_destroy(p), 0);
  alarm(0);
}

/* ---- a flush on the coalescer's own thread that shuts the pool down -------------- */

typedef struct cfs {
  tko_pool *p;
  atomic_int armed, rc, calls;
  tko_shutdown_mode mode;
  tt_count done;
} cfs;

static cfs CFS;

static void cfs_flush(void *user, const tko_coalesce_entry *e, size_t n) {
  cfs *c = user;
  (void)e;
  (void)n;
  if (atomic_exchange(&c->armed, 0)) {
    atomic_store(&c->rc, tko_pool_shutdown_timed(c->p, c->mode, 0));
    tt_count_add(&c->done, 1);
  }
  atomic_fetch_add(&c->calls, 1);
}

static void flush_shuts_down(tko_shutdown_mode mode) {
  alarm(60);
  cfs *c = &CFS;
  memset(c, 0, sizeof *c);
  tt_count_init(&c->done);
  c->mode = mode;
  tko_options o = tko_basic_options(1);
  o.queue_capacity = 1;
  o.full_policy = TKO_FULL_REJECT;
  cr_assert_eq(tko_pool_create(&c->p, &o), 0);
  tko_coalescer *co;
  cr_assert_eq(tko_coalescer_create(&co, c->p, 1, cfs_flush, c, NULL), 0);
  tt_pin pin = TT_PIN_INIT;
  cr_assert_eq(tko_submit(c->p, tt_pin_fn, &pin, 0), 0);
  cr_assert(tt_count_wait_geq(&pin.started, 1));
  cr_assert_eq(tko_submit(c->p, tt_nop_fn, NULL, 0), 0); /* full: the timer thread sweeps */
  atomic_store(&c->armed, 1);
  cr_assert_eq(tko_coalescer_mark(co, 1, 1), 0);
  cr_assert(tt_count_wait_geq_within(&c->done, 1, 20000), "the inline sweep never ran");
  int rc = atomic_load(&c->rc);
  cr_assert(rc == 0 || rc == -ETIMEDOUT || rc == -EDEADLK, "rc %d", rc);
  /* the coalescer still works: marks are flushed (or refused once closed) */
  rc = tko_coalescer_mark(co, 2, 2);
  cr_assert(rc == 0 || rc == -ESHUTDOWN);
  cr_assert_eq(tko_coalescer_flush(co), 0);
  tt_gate_open(&pin.gate);
  cr_assert_eq(tko_pool_shutdown_timed(c->p, TKO_CANCEL, 20000), 0);
  cr_assert_eq(tko_coalescer_destroy(co), 0);
  cr_assert_eq(tko_pool_destroy(c->p), 0);
  tt_count_fini(&c->done);
  alarm(0);
}

Test(attack_lanes2, inline_sweep_flush_shuts_down_nowait) { flush_shuts_down(TKO_CANCEL_NOWAIT); }
Test(attack_lanes2, inline_sweep_flush_shuts_down_timed_drain) { flush_shuts_down(TKO_DRAIN); }

/* ---- destroy of a table / coalescer racing the pool's shutdown ------------------- */

typedef struct dr {
  tko_lanes *l;
  tko_coalescer *c;
  atomic_int lrc, crc;
  tt_count started;
} dr;

static void *dr_destroy_lanes(void *arg) {
  dr *d = arg;
  tt_count_add(&d->started, 1);
  atomic_store(&d->lrc, tko_lanes_destroy(d->l));
  return NULL;
}

static void *dr_destroy_coalescer(void *arg) {
  dr *d = arg;
  tt_count_add(&d->started, 1);
  atomic_store(&d->crc, tko_coalescer_destroy(d->c));
  return NULL;
}

static void dr_flush(void *user, const tko_coalesce_entry *e, size_t n) {
  (void)user;
  (void)e;
  (void)n;
}

Test(attack_lanes2, destroy_races_shutdown_of_a_paused_pool) {
  alarm(AT_ALARM_S * 2 * (unsigned)at_mult());
  for (int round = 0; round < TT_SCALE(40, 12) * at_mult(); round++) {
    tokpool tp = {.cap = 300};
    tp.t = calloc(tp.cap, sizeof(tok));
    atomic_store(&foreign_cancels, 0);
    tko_options o = tko_basic_options(2);
    o.hooks.on_cancel = pool_cancel_tok;
    tko_pool *p;
    cr_assert_eq(tko_pool_create(&p, &o), 0);
    tko_lane_options lo = tko_lane_default_options();
    lo.on_cancel = lane_cancel_tok;
    dr d = {0};
    tt_count_init(&d.started);
    cr_assert_eq(tko_lanes_create(&d.l, p, &lo), 0);
    cr_assert_eq(tko_coalescer_create(&d.c, p, round % 2 ? 1 : 0, dr_flush, NULL, NULL), 0);
    for (int k = 0; k < 20; k++) cr_assert_eq(tko_coalescer_mark(d.c, (uint64_t)k, 1), 0);
    cr_assert_eq(tko_pool_pause(p), 0);
    cr_assert_eq(tko_coalescer_flush(d.c), 0);
    for (int i = 0; i < 100; i++) {
      tok *a = tok_get(&tp, K_LANE1), *b = tok_get(&tp, K_KEYED);
      cr_assert_eq(tko_lanes_submit(d.l, (uint64_t)i % 13, tok_run, a, 0), 0);
      atomic_store(&a->accepted, true);
      cr_assert_eq(tko_submit_keyed(p, (uint64_t)i % 13, tok_run, b, 0), 0);
      atomic_store(&b->accepted, true);
    }
    pthread_t tl, tc;
    cr_assert_eq(pthread_create(&tl, NULL, dr_destroy_lanes, &d), 0);
    cr_assert_eq(pthread_create(&tc, NULL, dr_destroy_coalescer, &d), 0);
    /* The destroys are called before the shutdown begins (lanes.h: on a
     * paused pool destroy waits until the pool is resumed or shut down by
     * another thread); the yields only let them reach their wait. */
    cr_assert(tt_count_wait_geq(&d.started, 2));
    for (int y = 0; y < (round % 4) * 50; y++) sched_yield();
    tko_shutdown_mode mode = round % 4 < 2 ? TKO_CANCEL : TKO_DRAIN;
    cr_assert_eq(tko_pool_shutdown(p, mode), 0);
    cr_assert_eq(pthread_join(tl, NULL), 0);
    cr_assert_eq(pthread_join(tc, NULL), 0);
    cr_assert_eq(atomic_load(&d.lrc), 0);
    cr_assert_eq(atomic_load(&d.crc), 0);
    cr_assert_eq(tko_pool_destroy(p), 0);
    long acc;
    long bad = tok_first_bad(&tp, mode == TKO_DRAIN, &acc);
    if (bad >= 0) tok_report(&tp, bad);
    cr_assert_eq(bad, -1, "round %d", round);
    cr_assert_eq(atomic_load(&foreign_cancels), 0);
    tt_count_fini(&d.started);
    free(tp.t);
  }
  alarm(0);
}

/* ---- keyed and plain only: the pool's stats are exactly the host's tasks --------- */

static atomic_long kid_count;
static uint64_t kid[4096];
static pthread_mutex_t kid_mu = PTHREAD_MUTEX_INITIALIZER;

static void kid_cancel(void *user, const tko_task_info *t) {
  pool_cancel_tok(user, t);
  if (t->fn != tok_run || ((tok *)t->arg)->kind != K_KEYED) return;
  pthread_mutex_lock(&kid_mu);
  long n = atomic_load(&kid_count);
  if (n < 4096) kid[n] = t->id;
  atomic_store(&kid_count, n + 1);
  pthread_mutex_unlock(&kid_mu);
}

static int u64cmp(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

Test(attack_lanes2, keyed_cancel_stats_and_ids_exact) {
  alarm(60);
  uint64_t distinct[200];
  {
    tko_options o1 = tko_basic_options(1);
    tko_pool *p1;
    tko_lanes *l1;
    cr_assert_eq(tko_pool_create(&p1, &o1), 0);
    cr_assert_eq(tko_lanes_create(&l1, p1, NULL), 0);
    bool used[256] = {false};
    int n = 0;
    for (uint64_t k = 1; n < 200; k++) {
      unsigned ix = tko_lanes_index(l1, k);
      if (ix < 256 && !used[ix]) {
        used[ix] = true;
        distinct[n++] = k;
      }
    }
    cr_assert_eq(tko_lanes_destroy(l1), 0);
    cr_assert_eq(tko_pool_destroy(p1), 0);
  }
  for (int round = 0; round < 8; round++) {
    atomic_store(&kid_count, 0);
    atomic_store(&foreign_cancels, 0);
    tokpool tp = {.cap = 3000};
    tp.t = calloc(tp.cap, sizeof(tok));
    tko_options o = tko_basic_options(1);
    o.hooks.on_cancel = kid_cancel;
    if (round % 2) {
      o.queue_capacity = 64;
      o.full_policy = round % 4 == 1 ? TKO_FULL_CALLER_RUNS : TKO_FULL_REJECT;
    }
    tko_pool *p;
    cr_assert_eq(tko_pool_create(&p, &o), 0);
    tt_pin pin = TT_PIN_INIT;
    cr_assert_eq(tko_submit(p, tt_pin_fn, &pin, 0), 0);
    cr_assert(tt_count_wait_geq(&pin.started, 1));
    long acc = 1; /* the pin */
    for (int i = 0; i < 1000; i++) {
      tok *a = tok_get(&tp, K_KEYED), *b = tok_get(&tp, K_PLAIN);
      /* caller-runs: a key whose lane has tasks queued waits for room (the
       * pin holds the worker), so there each keyed task takes a lane of its
       * own (of the 256 of the keyed table, made with the default options) */
      bool cr = o.full_policy == TKO_FULL_CALLER_RUNS;
      uint64_t key = cr ? distinct[i % 200] : (uint64_t)i % 17;
      if ((!cr || i < 200) && tko_submit_keyed(p, key, tok_run, a, 0) == 0) {
        atomic_store(&a->accepted, true);
        acc++;
      }
      if (tko_submit(p, tok_run, b, 0) == 0) {
        atomic_store(&b->accepted, true);
        acc++;
      }
    }
    tt_gate_open(&pin.gate);
    cr_assert_eq(tko_pool_shutdown(p, TKO_CANCEL), 0);
    tko_stats s;
    tko_pool_stats(p, &s);
    long acc2, runs = 0, cancels = 0;
    long bad = tok_first_bad(&tp, false, &acc2);
    cr_assert_eq(bad, -1);
    for (size_t i = 0; i < atomic_load(&tp.next); i++) {
      runs += atomic_load(&tp.t[i].runs);
      cancels += atomic_load(&tp.t[i].pool_cancels);
    }
    cr_assert_eq(s.submitted, (uint64_t)acc, "round %d: submitted %llu, accepted %ld", round,
                 (unsigned long long)s.submitted, acc);
    cr_assert_eq(s.completed, (uint64_t)runs + 1, "round %d", round);
    cr_assert_eq(s.cancelled, (uint64_t)cancels, "round %d", round);
    long n = atomic_load(&kid_count);
    if (n > 4096) n = 4096;
    qsort(kid, (size_t)n, sizeof kid[0], u64cmp);
    for (long i = 0; i < n; i++) {
      cr_assert(kid[i] >> 63, "id without its top bit");
      if (i) cr_assert_neq(kid[i], kid[i - 1], "round %d: a keyed id handed twice", round);
    }
    cr_assert_eq(atomic_load(&foreign_cancels), 0);
    cr_assert_eq(tko_pool_destroy(p), 0);
    free(tp.t);
  }
  alarm(0);
}

/* ---- batch callbacks and lane tasks that call back into their own lane ------------ */

typedef struct own {
  tko_lanes *l;
  tko_pool *p;
  atomic_long runs, cancels, accepted, batches_on_caller, caller_batch_tasks;
  atomic_int rc_wait, rc_destroy;
  pthread_t caller;
  atomic_int depth; /* appends left */
} own;

static own OWN;

static int own_task(void *arg) {
  own *o = &OWN;
  (void)arg;
  atomic_fetch_add(&o->runs, 1);
  tko_lane_stats ls;
  tko_lanes_stats(o->l, &ls);
  if (atomic_fetch_sub(&o->depth, 1) > 0) {
    /* append to its own lane and to another, from inside the lane */
    if (tko_lanes_submit(o->l, 1, own_task, NULL, 0) == 0) atomic_fetch_add(&o->accepted, 1);
    if (tko_lanes_submit(o->l, 2, own_task, NULL, 0) == 0) atomic_fetch_add(&o->accepted, 1);
  }
  atomic_store(&o->rc_wait, tko_lanes_wait_idle(o->l, -1));
  atomic_store(&o->rc_destroy, tko_lanes_destroy(o->l));
  return 0;
}

static void own_batch(void *user, const tko_lane_batch *b) {
  (void)user;
  own *o = &OWN;
  if (pthread_equal(pthread_self(), o->caller)) {
    /* each caller-run visit (nested ones included: a submit from this
     * batch to an idle lane is a call of its own) is its own task only */
    atomic_fetch_add(&o->batches_on_caller, 1);
    if ((long)b->count > atomic_load(&o->caller_batch_tasks))
      atomic_store(&o->caller_batch_tasks, (long)b->count);
  }
  for (size_t i = 0; i < b->count; i++) own_task(b->tasks[i].arg);
}

static void own_cancel(void *user, const tko_lane_task *t) {
  (void)user;
  (void)t;
  atomic_fetch_add(&OWN.cancels, 1);
}

static void own_lane(bool batch, bool caller_runs, bool cancel_midway) {
  alarm(60);
  own *o = &OWN;
  memset(o, 0, sizeof *o);
  o->caller = pthread_self();
  atomic_store(&o->depth, 2000);
  tko_options po = tko_basic_options(1);
  if (caller_runs) {
    po.queue_capacity = 1;
    po.full_policy = TKO_FULL_CALLER_RUNS;
  }
  cr_assert_eq(tko_pool_create(&o->p, &po), 0);
  tko_lane_options lo = tko_lane_default_options();
  lo.max_drain = 3;
  lo.on_cancel = own_cancel;
  if (batch) lo.batch = own_batch;
  cr_assert_eq(tko_lanes_create(&o->l, o->p, &lo), 0);
  tt_pin pin = TT_PIN_INIT;
  if (caller_runs) {
    cr_assert_eq(tko_submit(o->p, tt_pin_fn, &pin, 0), 0);
    cr_assert(tt_count_wait_geq(&pin.started, 1));
    cr_assert_eq(tko_submit(o->p, tt_nop_fn, NULL, 0), 0);
    tt_gate_open(&pin.gate); /* room appears once the pin returns */
  }
  cr_assert_eq(tko_lanes_submit(o->l, 1, own_task, NULL, 0), 0);
  atomic_fetch_add(&o->accepted, 1);
  if (caller_runs)
    cr_assert_leq(atomic_load(&o->caller_batch_tasks), 1, "a caller-run batch had %ld tasks",
                  atomic_load(&o->caller_batch_tasks));
  if (getenv("AT_VERBOSE"))
    fprintf(stderr, "own_lane batch %d caller_runs %d: %ld batches on the caller\n", batch,
            caller_runs, atomic_load(&o->batches_on_caller));
  if (cancel_midway) cr_assert_eq(tko_lanes_cancel(o->l), 0);
  cr_assert_eq(tko_lanes_wait_idle(o->l, 30000), 0);
  cr_assert_eq(tko_pool_wait_idle(o->p, 30000), 0);
  if (atomic_load(&o->runs)) {
    cr_assert_eq(atomic_load(&o->rc_wait), -EDEADLK, "wait_idle from a lane task: %d",
                 atomic_load(&o->rc_wait));
    cr_assert_eq(atomic_load(&o->rc_destroy), -EDEADLK, "destroy from a lane task: %d",
                 atomic_load(&o->rc_destroy));
  }
  tko_lane_stats ls;
  tko_lanes_stats(o->l, &ls);
  cr_assert_eq(ls.submitted, (uint64_t)atomic_load(&o->accepted));
  cr_assert_eq(ls.completed + ls.cancelled, ls.submitted);
  cr_assert_eq(atomic_load(&o->runs) + atomic_load(&o->cancels), atomic_load(&o->accepted));
  cr_assert_eq(tko_lanes_destroy(o->l), 0);
  cr_assert_eq(tko_pool_destroy(o->p), 0);
  alarm(0);
}

Test(attack_lanes2, lane_task_reenters_its_lane) { own_lane(false, false, false); }
Test(attack_lanes2, batch_reenters_its_lane) { own_lane(true, false, false); }
Test(attack_lanes2, caller_run_batch_reenters_its_lane) { own_lane(true, true, false); }
Test(attack_lanes2, caller_run_task_reenters_its_lane) { own_lane(false, true, false); }
Test(attack_lanes2, reentering_lane_cancelled_midway) { own_lane(false, false, true); }

/* ---- attaching racing the shutdown: first keyed submit, lanes/coalescer create ---- */

typedef struct race {
  tko_pool *p;
  tt_gate go;
  tokpool tp;
  int what;
  atomic_int create_rc;
} race;

static void race_flush(void *user, const tko_coalesce_entry *e, size_t n) {
  race *r = user;
  for (size_t i = 0; i < n; i++) {
    tok *k = tok_get(&r->tp, K_KEYED);
    if (k && tko_submit_keyed(r->p, e[i].key, tok_run, k, 0) == 0) atomic_store(&k->accepted, true);
  }
}

static void *race_attacher(void *arg) {
  race *r = arg;
  tt_gate_wait(&r->go);
  if (r->what == 0) {
    /* the pool's first keyed submits: its keyed table is made now */
    for (int i = 0; i < 20; i++) {
      tok *k = tok_get(&r->tp, K_KEYED);
      if (tko_submit_keyed(r->p, (uint64_t)i, tok_run, k, 0) == 0) atomic_store(&k->accepted, true);
    }
  } else if (r->what == 1) {
    tko_lanes *l;
    tko_lane_options lo = tko_lane_default_options();
    lo.on_cancel = lane_cancel_tok;
    int rc = tko_lanes_create(&l, r->p, &lo);
    atomic_store(&r->create_rc, rc);
    if (rc == 0) {
      for (int i = 0; i < 20; i++) {
        tok *k = tok_get(&r->tp, K_LANE1);
        if (tko_lanes_submit(l, (uint64_t)i, tok_run, k, 0) == 0) atomic_store(&k->accepted, true);
      }
      /* destroy waits for the shutdown's end or drains while it runs */
      int d = tko_lanes_destroy(l);
      if (d != 0) atomic_store(&r->create_rc, 1000 + d);
    }
  } else {
    tko_coalescer *c;
    int rc = tko_coalescer_create(&c, r->p, 1, race_flush, r, NULL);
    atomic_store(&r->create_rc, rc);
    if (rc == 0) {
      for (int i = 0; i < 20; i++) tko_coalescer_mark(c, (uint64_t)i, 1);
      int d = tko_coalescer_destroy(c);
      if (d != 0) atomic_store(&r->create_rc, 1000 + d);
    }
  }
  return NULL;
}

Test(attack_lanes2, attaching_races_shutdown) {
  alarm(AT_ALARM_S * (unsigned)at_mult());
  for (int round = 0; round < 90 * at_mult(); round++) {
    race r = {0};
    r.go = (tt_gate)TT_GATE_INIT;
    r.what = round % 3;
    r.tp.cap = 200;
    r.tp.t = calloc(r.tp.cap, sizeof(tok));
    atomic_store(&foreign_cancels, 0);
    tko_options o = tko_basic_options(1);
    o.hooks.on_cancel = pool_cancel_tok;
    cr_assert_eq(tko_pool_create(&r.p, &o), 0);
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, race_attacher, &r), 0);
    tt_gate_open(&r.go);
    tko_shutdown_mode mode = (tko_shutdown_mode)((round / 3) % 3);
    int rc = mode == TKO_CANCEL_NOWAIT ? tko_pool_shutdown_timed(r.p, mode, 0)
                                       : tko_pool_shutdown(r.p, mode);
    cr_assert_eq(rc, 0);
    cr_assert_eq(pthread_join(th, NULL), 0);
    int crc = atomic_load(&r.create_rc);
    cr_assert(crc == 0 || crc == -ESHUTDOWN, "round %d what %d: create/destroy rc %d", round,
              r.what, crc);
    cr_assert_eq(tko_pool_destroy(r.p), 0, "round %d", round);
    long acc;
    long bad = tok_first_bad(&r.tp, mode == TKO_DRAIN, &acc);
    if (bad >= 0) tok_report(&r.tp, bad);
    cr_assert_eq(bad, -1, "round %d what %d mode %d", round, r.what, (int)mode);
    cr_assert_eq(atomic_load(&foreign_cancels), 0);
    free(r.tp.t);
  }
  alarm(0);
}

/* ---- resize and elastic workers churning under lanes, then TKO_CANCEL ----------- */

typedef struct churn {
  tko_pool *p;
  tko_lanes *l;
  tokpool tp;
  atomic_bool stop;
  atomic_int inflight[32]; /* lane keys 0..15, keyed keys 16..31 */
  atomic_long overlap;
} churn;

static churn CH;

static int churn_task(void *arg) {
  tok *k = arg;
  int key = (k->kind >> 8) + ((k->kind & 0xff) == K_KEYED ? 16 : 0);
  if (atomic_fetch_add(&CH.inflight[key], 1)) atomic_fetch_add(&CH.overlap, 1);
  for (volatile int i = 0; i < 200; i++) {
  }
  atomic_fetch_sub(&CH.inflight[key], 1);
  atomic_fetch_add(&tok_runs_total, 1);
  atomic_fetch_add(&k->runs, 1);
  return 0;
}

static void churn_lane_cancel(void *user, const tko_lane_task *t) {
  (void)user;
  atomic_fetch_add(&((tok *)t->arg)->lane_cancels, 1);
}

static void churn_pool_cancel(void *user, const tko_task_info *t) {
  (void)user;
  if (t->fn != churn_task) {
    if (t->fn != tt_nop_fn) atomic_fetch_add(&foreign_cancels, 1);
    return;
  }
  atomic_fetch_add(&((tok *)t->arg)->pool_cancels, 1);
}

static void *churn_submitter(void *arg) {
  churn *c = &CH;
  uint64_t s = (uintptr_t)arg;
  while (!atomic_load(&c->stop)) {
    uint64_t r = tt_rand(&s);
    int key = (int)(r % 16);
    bool keyed = (r >> 8) & 1;
    tok *k = tok_get(&c->tp, keyed ? K_KEYED : K_LANE1);
    if (!k) break;
    /* keyed keys 100+key, lane keys key: the overlap check is per kind */
    k->kind = (keyed ? K_KEYED : K_LANE1) | (key << 8);
    int rc = keyed ? tko_submit_keyed(c->p, 100 + (uint64_t)key, churn_task, k, key)
                   : tko_lanes_submit(c->l, (uint64_t)key, churn_task, k, key);
    if (rc == 0) atomic_store(&k->accepted, true);
    if ((r >> 16) % 64 == 0) tko_submit(c->p, tt_nop_fn, NULL, 0);
    /* backpressure: a backlog of a few hundred, so that the tokens last
     * through the resize loop (bounded: the pool may be paused) */
    for (int y = 0; y < 1000 && !atomic_load(&c->stop) &&
                    (long)atomic_load(&c->tp.next) - atomic_load(&tok_runs_total) > 300;
         y++)
      sched_yield();
  }
  return NULL;
}

Test(attack_lanes2, resize_and_elastic_churn_then_cancel) {
  alarm(AT_ALARM_S * (unsigned)at_mult());
  for (int round = 0; round < TT_SCALE(6, 2) * at_mult(); round++) {
    churn *c = &CH;
    memset(c, 0, sizeof *c);
    atomic_store(&tok_runs_total, 0);
    atomic_store(&foreign_cancels, 0);
    c->tp.cap = TT_SCALE(40000, 8000);
    c->tp.t = calloc(c->tp.cap, sizeof(tok));
    tko_options o = tko_elastic_options(1, 3, 1);
    o.max_threads = 8;
    o.max_batch = 64;
    o.hooks.on_cancel = churn_pool_cancel;
    cr_assert_eq(tko_pool_create(&c->p, &o), 0);
    tko_lane_options lo = tko_lane_default_options();
    lo.lanes = 16;
    lo.max_drain = 1 + round % 4;
    lo.on_cancel = churn_lane_cancel;
    cr_assert_eq(tko_lanes_create(&c->l, c->p, &lo), 0);
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
      cr_assert_eq(pthread_create(&th[i], NULL, churn_submitter, (void *)(uintptr_t)(i + 9)), 0);
    for (int i = 0; i < TT_SCALE(300, 60); i++) {
      cr_assert_eq(tko_pool_resize(c->p, 1 + (unsigned)i % 3, (unsigned)(i / 3) % 3), 0);
      if (i % 7 == 0) tko_pool_pause(c->p);
      if (i % 7 == 3) tko_pool_resume(c->p);
      long r0 = atomic_load(&tok_runs_total);
      uint64_t end = tt_now_ns() + 2000000000ull;
      while (atomic_load(&tok_runs_total) < r0 + 20 && tt_now_ns() < end && i % 7 >= 3 &&
             atomic_load(&c->tp.next) < c->tp.cap) /* submitters still going */
        sched_yield();
    }
    tko_pool_resume(c->p);
    cr_assert_eq(tko_pool_resize(c->p, 1, 0), 0); /* one worker left: retirements under way */
    cr_assert_eq(tko_pool_shutdown(c->p, round % 2 ? TKO_CANCEL : TKO_DRAIN), 0);
    atomic_store(&c->stop, true);
    for (int i = 0; i < 2; i++) cr_assert_eq(pthread_join(th[i], NULL), 0);
    tko_lane_stats ls;
    tko_lanes_stats(c->l, &ls);
    cr_assert_eq(ls.queued, 0);
    cr_assert_eq(ls.submitted, ls.completed + ls.cancelled);
    cr_assert_eq(tko_lanes_destroy(c->l), 0);
    tko_stats ps;
    tko_pool_stats(c->p, &ps);
    cr_assert_eq(ps.submitted, ps.completed + ps.cancelled);
    cr_assert_eq(tko_pool_destroy(c->p), 0);
    size_t n = atomic_load(&c->tp.next);
    for (size_t i = 0; i < n && i < c->tp.cap; i++) {
      tok *k = &c->tp.t[i];
      int r = atomic_load(&k->runs), lc = atomic_load(&k->lane_cancels),
          pc = atomic_load(&k->pool_cancels);
      cr_assert_eq(r + lc + pc, atomic_load(&k->accepted) ? 1 : 0,
                   "round %d task %zu: runs %d lane %d pool %d", round, i, r, lc, pc);
      if (round % 2 == 0) cr_assert_eq(lc + pc, 0);
    }
    cr_assert_eq(atomic_load(&c->overlap), 0, "round %d: two tasks of one key at once", round);
    cr_assert_eq(atomic_load(&foreign_cancels), 0);
    free(c->tp.t);
  }
  alarm(0);
}

/* ---- focused: tko_lanes_destroy waiting on a paused pool, then TKO_CANCEL -------- */

Test(attack_lanes2, lanes_destroy_waiting_then_cancel_shutdown) {
  alarm(AT_ALARM_S * (unsigned)at_mult());
  for (int round = 0; round < TT_SCALE(1000, 300) * at_mult(); round++) {
    tokpool tp = {.cap = 64};
    tp.t = calloc(tp.cap, sizeof(tok));
    tko_options o = tko_basic_options(1);
    tko_pool *p;
    cr_assert_eq(tko_pool_create(&p, &o), 0);
    tko_lane_options lo = tko_lane_default_options();
    lo.on_cancel = lane_cancel_tok;
    dr d = {0};
    tt_count_init(&d.started);
    cr_assert_eq(tko_lanes_create(&d.l, p, &lo), 0);
    cr_assert_eq(tko_pool_pause(p), 0);
    for (int i = 0; i < 8; i++) {
      tok *a = tok_get(&tp, K_LANE1);
      cr_assert_eq(tko_lanes_submit(d.l, (uint64_t)i, tok_run, a, 0), 0);
      atomic_store(&a->accepted, true);
    }
    pthread_t tl;
    cr_assert_eq(pthread_create(&tl, NULL, dr_destroy_lanes, &d), 0);
    cr_assert(tt_count_wait_geq(&d.started, 1));
    for (int y = 0; y < (round % 4) * 50; y++) sched_yield();
    cr_assert_eq(tko_pool_shutdown(p, TKO_CANCEL), 0);
    cr_assert_eq(pthread_join(tl, NULL), 0);
    cr_assert_eq(atomic_load(&d.lrc), 0);
    cr_assert_eq(tko_pool_destroy(p), 0);
    long acc;
    long bad = tok_first_bad(&tp, false, &acc);
    cr_assert_eq(bad, -1, "round %d", round);
    tt_count_fini(&d.started);
    free(tp.t);
  }
  alarm(0);
}

/* ---- the same for a coalescer whose sweep is queued on the paused pool ------------ */

Test(attack_lanes2, coalescer_destroy_waiting_then_cancel_shutdown) {
  alarm(AT_ALARM_S * (unsigned)at_mult());
  for (int round = 0; round < TT_SCALE(300, 100) * at_mult(); round++) {
    tko_options o = tko_basic_options(1);
    tko_pool *p;
    cr_assert_eq(tko_pool_create(&p, &o), 0);
    dr d = {0};
    tt_count_init(&d.started);
    cr_assert_eq(tko_coalescer_create(&d.c, p, 1, dr_flush, NULL, NULL), 0);
    cr_assert_eq(tko_pool_pause(p), 0);
    cr_assert_eq(tko_coalescer_mark(d.c, 1, 1), 0);
    /* a sweep queued on the paused pool: the next tick finds it queued */
    uint64_t end = tt_now_ns() + 10ull * 1000000000u;
    tko_coalesce_stats cs;
    do {
      tko_coalescer_stats(d.c, &cs);
      if (cs.skipped_ticks == 0) {
        tko_coalescer_mark(d.c, 1, 1);
        sched_yield();
      }
    } while (cs.skipped_ticks == 0 && tt_now_ns() < end);
    cr_assert_gt(cs.skipped_ticks, 0);
    pthread_t tc;
    cr_assert_eq(pthread_create(&tc, NULL, dr_destroy_coalescer, &d), 0);
    cr_assert(tt_count_wait_geq(&d.started, 1));
    for (int y = 0; y < (round % 4) * 50; y++) sched_yield();
    cr_assert_eq(tko_pool_shutdown(p, TKO_CANCEL), 0);
    cr_assert_eq(pthread_join(tc, NULL), 0);
    cr_assert_eq(atomic_load(&d.crc), 0);
    cr_assert_eq(tko_pool_destroy(p), 0);
    tt_count_fini(&d.started);
  }
  alarm(0);
}
