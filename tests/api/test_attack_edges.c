/* SPDX-License-Identifier: MIT */
/* Adversarial tests (attack2) of the contracts in taskorch.h, lanes.h,
 * coalescer.h and completion.h, through the public headers only. Every wait
 * is bounded: a hang ends in SIGALRM (a failed test), never a stuck suite.
 * - hooks_reenter_*: pool hooks, lane on_cancel and tasks of a one-worker,
 *   capacity-1, CALLER_RUNS pool call back into lanes, keyed submits, stats
 *   and cancel; nothing may hang, every accepted task runs or is cancelled
 *   exactly once.
 * - prefix_*: once a cancel begins (tko_lanes_cancel, shutdown CANCEL or
 *   CANCEL_NOWAIT), each key's tasks split into a run prefix and a
 *   cancelled rest, in order, with exclusion, each exactly once.
 * - cq_*: the completion queue's drain snapshot, capacity, concurrent
 *   drains, readability and posts from tasks, hooks and on_cancel.
 * - caller_runs_*: a CALLER_RUNS lane or keyed submit on a full pool runs
 *   its own task only; the appended ones wait for room.
 * - everything_*: shutdown in every mode racing plain, group, timer, async,
 *   keyed, lane, coalescer and handle work at once; shutdown_timed_* and
 *   coalescer_marks_racing_close: the shutdown steps and close races.
 * Tests that show a break of a header's promise stay compiled out under
 * #if 0 at the end of the file, each with the promise it breaks. */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
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
#include <taskorch/completion.h>
#include <taskorch/lanes.h>

#include "tko_test.h"
#include "tko_test_sync.h"

#define AE_ALARM_S 90u   /* a hang of a whole test: SIGALRM kills it */
#define AE_WAIT_MS 30000L /* any single bounded wait */

/* ---- tokens: one per accepted task, run or cancelled exactly once ------------ */

#define TOK_MAGIC 0x746f6b656e5f5f31ull

enum { K_PLAIN, K_GROUP, K_TIMER, K_PERIODIC, K_ASYNC, K_KEYED, K_LANE, K_HANDLE };

typedef struct tok {
  uint64_t magic;
  atomic_int runs, cancels;
  atomic_int run_after_cancel;
  atomic_bool accepted;
  atomic_int user_cancelled; /* tko_timer_cancel / tko_handle_cancel returned 0 */
  int kind;
  uint64_t key;
  uint32_t seq;
  pthread_t by;   /* submitting thread (hooks_reenter) */
  int by_depth;   /* hook depth there */
  int by_in_task; /* submitted from inside a task body */
  struct tok *parent; /* the task running on the submitting thread then */
} tok;

typedef struct tokpool {
  tok *t;
  size_t cap;
  atomic_size_t next;
} tokpool;

static void tp_init(tokpool *p, size_t cap) {
  p->t = calloc(cap, sizeof *p->t);
  cr_assert_not_null(p->t);
  p->cap = cap;
  atomic_init(&p->next, 0);
}

static tok *tp_get(tokpool *p, int kind) {
  size_t i = atomic_fetch_add(&p->next, 1);
  if (i >= p->cap) return NULL;
  tok *t = &p->t[i];
  t->magic = TOK_MAGIC;
  t->kind = kind;
  return t;
}

static size_t tp_used(tokpool *p) {
  size_t n = atomic_load(&p->next);
  return n < p->cap ? n : p->cap;
}

static void tok_run(tok *t) {
  if (atomic_load(&t->cancels)) atomic_fetch_add(&t->run_after_cancel, 1);
  atomic_fetch_add(&t->runs, 1);
}

static void tok_cancel(tok *t) { atomic_fetch_add(&t->cancels, 1); }

static bool is_tok(const void *p) { return p && ((const tok *)p)->magic == TOK_MAGIC; }

/* Every accepted token ran or was cancelled exactly once (periodic timers:
 * any number of runs, one cancel, nothing after it); others were untouched. */
static void tp_check(tokpool *p, const char *what) {
  size_t n = tp_used(p);
  long bad = 0;
  for (size_t i = 0; i < n; i++) {
    tok *t = &p->t[i];
    int r = atomic_load(&t->runs), c = atomic_load(&t->cancels);
    bool ok;
    if (!atomic_load(&t->accepted)) ok = r == 0 && c == 0;
    else if (t->kind == K_PERIODIC && atomic_load(&t->user_cancelled))
      ok = c <= 1 && atomic_load(&t->run_after_cancel) == 0; /* tko_timer_cancel'd */
    else if (t->kind == K_PERIODIC) ok = c == 1 && atomic_load(&t->run_after_cancel) == 0;
    else ok = r + c == 1;
    if (!ok) {
      if (bad < 8)
        fprintf(stderr, "%s: token %zu kind %d accepted %d runs %d cancels %d\n", what, i,
                t->kind, (int)atomic_load(&t->accepted), r, c);
      bad++;
    }
  }
  cr_assert_eq(bad, 0, "%s: %ld tokens broke exactly-once", what, bad);
}

/* AE_VERBOSE=1 prints what each scene did, to see that it was not vacuous. */
static void tp_summary(tokpool *p, const char *what, const tko_stats *s) {
  if (!getenv("AE_VERBOSE")) return;
  long acc = 0, runs = 0, cancels = 0;
  for (size_t i = 0; i < tp_used(p); i++) {
    acc += atomic_load(&p->t[i].accepted);
    runs += atomic_load(&p->t[i].runs);
    cancels += atomic_load(&p->t[i].cancels);
  }
  fprintf(stderr, "%s: accepted %ld runs %ld cancels %ld; pool submitted %llu cancelled %llu caller_runs %llu\n",
          what, acc, runs, cancels, (unsigned long long)s->submitted,
          (unsigned long long)s->cancelled, (unsigned long long)s->caller_runs);
}

/* ============================================================================
 * 1a. hooks and callbacks that re-enter the library on a tiny bounded pool
 * ========================================================================== */

typedef struct reenter {
  tko_pool *pool;
  tko_lanes *lanes;
  tokpool toks;
  atomic_int budget;       /* re-entrant submits left */
  atomic_int hook_calls;   /* after_run calls, to trigger the cancel */
  atomic_bool cancelled;   /* tko_lanes_cancel done from a hook */
  atomic_int bad_rc;       /* a call returned something its header rules out */
  atomic_int accepted_while_closed; /* lane submit accepted from lane on_cancel */
  atomic_bool shutdown_begun, shutdown_returned, hook_cancelled;
  tt_count done;           /* tokens run or cancelled */
} reenter;

static reenter *g_re;

static int re_task(void *arg);
static _Thread_local int re_hook_depth;
static _Thread_local const char *re_role;
static _Thread_local tok *re_own; /* the task of the innermost submit call on this thread */
static atomic_int re_foreign_runs;
static _Thread_local int re_task_depth;
static _Thread_local tok *re_cur;
static const char *re_thread_name(reenter *re) {
  (void)re;
  return re_role ? re_role : "pool-owned";
}

static void re_check_rc(reenter *re, int rc, const char *what) {
  if (rc != 0 && rc != -ESHUTDOWN && rc != -EAGAIN) {
    fprintf(stderr, "%s: unexpected %d\n", what, rc);
    atomic_fetch_add(&re->bad_rc, 1);
  }
}

static void re_submit_some(reenter *re, uint64_t key) {
  if (atomic_fetch_sub(&re->budget, 1) <= 0) return;
  tok *t = tp_get(&re->toks, K_LANE);
  if (!t) return;
  t->key = key;
  atomic_store(&t->accepted, true); /* before the submit: it may run at once */
  tok *saved = re_own;
  re_own = t;
  t->by = pthread_self();
  t->by_depth = re_hook_depth;
  t->by_in_task = re_task_depth;
  t->parent = re_cur;
  int rc = tko_lanes_submit(re->lanes, key, re_task, t, (int)(key & 3));
  re_own = saved;
  re_check_rc(re, rc, "lanes_submit");
  if (rc) atomic_store(&t->accepted, false);
  tok *k = tp_get(&re->toks, K_KEYED);
  if (!k) return;
  atomic_store(&k->accepted, true);
  re_own = k;
  k->by = pthread_self();
  k->by_depth = re_hook_depth;
  k->by_in_task = re_task_depth;
  rc = tko_submit_keyed(re->pool, key + 1, re_task, k, 1);
  re_own = saved;
  re_check_rc(re, rc, "submit_keyed");
  if (rc) atomic_store(&k->accepted, false);
}

static int re_task(void *arg) {
  tok *t = arg;
  reenter *re = g_re;
  if (re_role && t != re_own && !atomic_load(&re->shutdown_begun)) {
    /* a thread the pool does not own runs only its own submit's task */
    if (atomic_load(&re_foreign_runs) < 6 && getenv("AE_VERBOSE"))
    fprintf(stderr, "[lanes cancelled %d] %s thread ran a %s task it was not submitting (own %s%s; task submitted by %s thread, hook depth %d, in task %d; here hook depth %d task depth %d; lanes: task %u own %u; own is its parent %d, running now %p, own kind %d)\n", (int)atomic_load(&re->hook_cancelled), re_role,
            t->kind == K_LANE ? "lane" : "keyed", re_own ? (re_own->kind == K_LANE ? "lane" : "keyed") : "none",
            re_own && atomic_load(&re_own->runs) ? " (ran)" : "",
            pthread_equal(t->by, pthread_self()) ? "this" : "another", t->by_depth, t->by_in_task,
            re_hook_depth, re_task_depth, tko_lanes_index(re->lanes, t->key),
            re_own ? tko_lanes_index(re->lanes, re_own->key) : 99u, t->parent == re_own, (void *)re_cur, re_own ? re_own->kind : -1);
    atomic_fetch_add(&re_foreign_runs, 1);
  }
  tok_run(t);
  re_task_depth++;
  tok *prev_cur = re_cur;
  re_cur = t;
  tt_count_add(&re->done, 1);
  /* same key and another key, from inside a task (maybe a caller-run one) */
  re_submit_some(re, t->key);
  re_submit_some(re, t->key + 7);
  /* a task of the pool (on a worker, or run by CALLER_RUNS on a submitter
   * or inside a hook) waiting for the pool or its lanes would wait for
   * itself: -EDEADLK, not a timeout */
  static atomic_int checks;
  if ((atomic_fetch_add(&checks, 1) & 3) == 0) {
    int rc = tko_pool_wait_idle(re->pool, 300);
    /* A lane task that a submitter runs itself (CALLER_RUNS, or a runner
     * the shutdown refused) is left out of the pool's running count, so
     * the pool may look idle from it (0) or busy with others (-ETIMEDOUT):
     * see caller_runs_lane_visit_counts_as_running (disabled) for the
     * first; lanes.h promises -EDEADLK there for shutdown and destroy only. */
    bool lane_on_submitter = t->kind == K_LANE && re_role;
    if (rc != -EDEADLK && !(lane_on_submitter && (rc == 0 || rc == -ETIMEDOUT))) {
      tko_stats st;
      tko_pool_stats(re->pool, &st);
      fprintf(stderr, "[own %d, lanes cancelled %d, task depth %d] pool_wait_idle from a %s task: %d (thread %s, hook depth %d, shutdown begun %d returned %d; stats queued %llu running %llu submitted %llu completed %llu)\n",
              t == re_own, (int)atomic_load(&re->hook_cancelled), re_task_depth, t->kind == K_LANE ? "lane" : "keyed", rc, re_thread_name(re), re_hook_depth,
              (int)atomic_load(&re->shutdown_begun), (int)atomic_load(&re->shutdown_returned), (unsigned long long)st.queued,
              (unsigned long long)st.running, (unsigned long long)st.submitted, (unsigned long long)st.completed);
      atomic_fetch_add(&re->bad_rc, 1);
    }
    rc = tko_lanes_wait_idle(re->lanes, 300);
    if (rc != -EDEADLK) {
      fprintf(stderr, "lanes_wait_idle from a %s task: %d\n", t->kind == K_LANE ? "lane" : "keyed", rc);
      atomic_fetch_add(&re->bad_rc, 1);
    }
    rc = tko_lanes_destroy(re->lanes);
    if (rc != -EDEADLK) {
      fprintf(stderr, "lanes_destroy from a task: %d\n", rc);
      atomic_fetch_add(&re->bad_rc, 1);
    }
    rc = tko_pool_shutdown(re->pool, TKO_DRAIN);
    if (rc != -EDEADLK) {
      fprintf(stderr, "pool_shutdown from a %s task: %d\n", t->kind == K_LANE ? "lane" : "keyed", rc);
      atomic_fetch_add(&re->bad_rc, 1);
    }
  }
  re_task_depth--;
  re_cur = prev_cur;
  return 0;
}

static void re_before(void *user, const tko_task_info *ti) {
  reenter *re = user;
  re_hook_depth++;
  tko_stats s;
  tko_pool_stats(re->pool, &s);
  tko_lane_stats ls;
  tko_lanes_stats(re->lanes, &ls);
  re_submit_some(re, ti->id & 15);
  re_hook_depth--;
}

static void re_after(void *user, const tko_task_info *ti) {
  reenter *re = user;
  re_hook_depth++;
  tko_stats s;
  tko_pool_stats(re->pool, &s);
  re_submit_some(re, (ti->id >> 1) & 15);
  if (atomic_fetch_add(&re->hook_calls, 1) == 60 && !atomic_exchange(&re->cancelled, true))
  {
    atomic_store(&re->hook_cancelled, true);
    cr_assert_eq(tko_lanes_cancel(re->lanes), 0);
  }
  re_hook_depth--;
}

static void re_pool_cancel(void *user, const tko_task_info *ti) {
  reenter *re = user;
  cr_assert_eq(tko_lanes_pool_cancelled(ti), 0, "pool on_cancel saw a lane runner");
  cr_assert_eq(tko_coalescer_pool_cancelled(ti), 0);
  cr_assert(is_tok(ti->arg), "pool on_cancel saw a foreign task");
  tok_cancel(ti->arg);
  tt_count_add(&re->done, 1);
  tko_stats s;
  tko_pool_stats(re->pool, &s);
  re_submit_some(re, 3);
}

static void re_lane_cancel(void *user, const tko_lane_task *lt) {
  reenter *re = user;
  cr_assert(is_tok(lt->arg));
  tok_cancel(lt->arg);
  tt_count_add(&re->done, 1);
  /* the table is closed: a submit must be refused */
  tok *t = tp_get(&re->toks, K_LANE);
  if (t) {
    atomic_store(&t->accepted, true);
    int rc = tko_lanes_submit(re->lanes, lt->key, re_task, t, 0);
    if (rc == 0) atomic_fetch_add(&re->accepted_while_closed, 1);
    else atomic_store(&t->accepted, false);
  }
  cr_assert_eq(tko_lanes_cancel(re->lanes), 0); /* idempotent, nested */
  cr_assert_eq(tko_lanes_wait_idle(re->lanes, 0), -EDEADLK);
  cr_assert_eq(tko_lanes_destroy(re->lanes), -EDEADLK);
  re_submit_some(re, lt->key + 2); /* keyed: pool may still be running */
  tko_stats s;
  tko_pool_stats(re->pool, &s);
}

typedef struct re_sub_arg {
  reenter *re;
  uint64_t base;
} re_sub_arg;

static void *re_submitter(void *arg) {
  re_sub_arg *a = arg;
  reenter *re = a->re;
  re_role = "submitter";
  for (int i = 0; i < 150; i++) {
    tok *t = tp_get(&re->toks, (i & 1) ? K_KEYED : K_LANE);
    if (!t) break;
    t->key = a->base + (uint64_t)(i % 5);
    atomic_store(&t->accepted, true);
    re_own = t;
    t->by = pthread_self();
    int rc = (i & 1) ? tko_submit_keyed(re->pool, t->key, re_task, t, i % 4)
                     : tko_lanes_submit(re->lanes, t->key, re_task, t, i % 4);
    re_own = NULL;
    re_check_rc(re, rc, "submitter");
    if (rc) atomic_store(&t->accepted, false);
  }
  return NULL;
}

static void re_batch(void *user, const tko_lane_batch *b) {
  reenter *re = user;
  cr_assert_eq(tko_lanes_wait_idle(re->lanes, 0), -EDEADLK);
  for (size_t i = 0; i < b->count; i++) b->tasks[i].fn(b->tasks[i].arg);
}

static bool g_re_batch;

static void hooks_reenter_scene(tko_shutdown_mode mode, bool cancel_lanes) {
  static reenter re;
  memset(&re, 0, sizeof re);
  g_re = &re;
  tp_init(&re.toks, 8192);
  tt_count_init(&re.done);
  atomic_init(&re.budget, 400);
  if (!cancel_lanes) atomic_store(&re.cancelled, true); /* never from a hook */
  tko_options o = tko_basic_options(1);
  o.queue_capacity = 1;
  o.full_policy = TKO_FULL_CALLER_RUNS;
  o.max_batch = 1;
  o.hooks.user = &re;
  o.hooks.before_run = re_before;
  o.hooks.after_run = re_after;
  o.hooks.on_cancel = re_pool_cancel;
  cr_assert_eq(tko_pool_create(&re.pool, &o), 0);
  tko_lane_options lo = tko_lane_default_options();
  lo.lanes = 8;
  lo.max_drain = 2;
  lo.user = &re;
  lo.on_cancel = re_lane_cancel;
  if (g_re_batch) lo.batch = re_batch;
  cr_assert_eq(tko_lanes_create(&re.lanes, re.pool, &lo), 0);

  pthread_t th[2];
  re_sub_arg args[2] = {{&re, 100}, {&re, 200}};
  for (int i = 0; i < 2; i++) cr_assert_eq(pthread_create(&th[i], NULL, re_submitter, &args[i]), 0);
  int rc;
  if (mode == TKO_DRAIN) {
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    rc = tko_lanes_wait_idle(re.lanes, AE_WAIT_MS);
    cr_assert_eq(rc, 0, "lanes_wait_idle: %d", rc);
    rc = tko_pool_shutdown(re.pool, mode);
  } else {
    /* shut down while the submitters and the hooks still submit */
    cr_assert(tt_count_wait_geq(&re.done, 40));
    re_role = "main";
    atomic_store(&re.shutdown_begun, true);
    rc = tko_pool_shutdown(re.pool, mode);
    atomic_store(&re.shutdown_returned, true);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  }
  cr_assert_eq(rc, 0);
  if (mode == TKO_CANCEL_NOWAIT) cr_assert_eq(tko_pool_shutdown(re.pool, TKO_DRAIN), 0);
  tko_stats s;
  tko_pool_stats(re.pool, &s);
  cr_assert_eq(s.queued + s.running, 0);
  cr_assert_eq(s.submitted, s.completed + s.cancelled, "submitted %llu completed %llu cancelled %llu",
               (unsigned long long)s.submitted, (unsigned long long)s.completed,
               (unsigned long long)s.cancelled);
  cr_assert_eq(tko_lanes_destroy(re.lanes), 0);
  cr_assert_eq(tko_pool_destroy(re.pool), 0);
  cr_assert_eq(atomic_load(&re.bad_rc), 0);
  cr_assert_eq(atomic_load(&re.accepted_while_closed), 0,
               "a lane submit from on_cancel was accepted on a closed table");
  tp_summary(&re.toks, "hooks_reenter", &s);
  tp_check(&re.toks, "hooks_reenter");
  tko_lane_stats ls;
  (void)ls;
  free(re.toks.t);
}

Test(attack_edges, hooks_reenter_lanes_cancel_from_hook) {
  alarm(AE_ALARM_S);
  for (int i = 0; i < 3; i++) hooks_reenter_scene(TKO_DRAIN, true);
  alarm(0);
}

Test(attack_edges, hooks_reenter_shutdown_cancel) {
  alarm(AE_ALARM_S);
  for (int i = 0; i < 3; i++) hooks_reenter_scene(TKO_CANCEL, false);
  alarm(0);
}

Test(attack_edges, hooks_reenter_batch_mode) {
  alarm(AE_ALARM_S);
  g_re_batch = true;
  hooks_reenter_scene(TKO_DRAIN, true);
  hooks_reenter_scene(TKO_CANCEL, false);
  hooks_reenter_scene(TKO_CANCEL_NOWAIT, true);
  alarm(0);
}

Test(attack_edges, hooks_reenter_shutdown_nowait) {
  alarm(AE_ALARM_S);
  for (int i = 0; i < 3; i++) hooks_reenter_scene(TKO_CANCEL_NOWAIT, true);
  alarm(0);
}

/* Shutdown and destroy from a hook, wait_idle from a task: -EDEADLK. */
static tko_pool *g_dl_pool;
static atomic_int g_dl_bad;
static void dl_before(void *user, const tko_task_info *ti) {
  (void)user;
  (void)ti;
  if (tko_pool_shutdown(g_dl_pool, TKO_DRAIN) != -EDEADLK) atomic_fetch_add(&g_dl_bad, 1);
  if (tko_pool_shutdown_timed(g_dl_pool, TKO_CANCEL_NOWAIT, 0) != -EDEADLK)
    atomic_fetch_add(&g_dl_bad, 1);
  if (tko_pool_destroy(g_dl_pool) != -EDEADLK) atomic_fetch_add(&g_dl_bad, 1);
}
static int dl_task(void *arg) {
  tt_count *c = arg;
  if (tko_pool_wait_idle(g_dl_pool, 1000) != -EDEADLK) atomic_fetch_add(&g_dl_bad, 1);
  if (tko_pool_shutdown(g_dl_pool, TKO_CANCEL) != -EDEADLK) atomic_fetch_add(&g_dl_bad, 1);
  tt_count_add(c, 1);
  return 0;
}

Test(attack_edges, deadlk_from_hooks_and_tasks) {
  alarm(AE_ALARM_S);
  static tt_count c = TT_COUNT_INIT;
  tko_options o = tko_basic_options(2);
  o.hooks.before_run = dl_before;
  cr_assert_eq(tko_pool_create(&g_dl_pool, &o), 0);
  for (int i = 0; i < 20; i++) cr_assert_eq(tko_submit(g_dl_pool, dl_task, &c, 0), 0);
  for (int i = 0; i < 20; i++) cr_assert_eq(tko_submit_keyed(g_dl_pool, (uint64_t)i % 3, dl_task, &c, 0), 0);
  cr_assert(tt_count_wait_geq(&c, 40));
  cr_assert_eq(tko_pool_destroy(g_dl_pool), 0);
  cr_assert_eq(atomic_load(&g_dl_bad), 0);
  alarm(0);
}

/* ============================================================================
 * 1b. per-key prefix: run a prefix, cancel the rest, never out of order
 * ========================================================================== */

#define PX_KEYS 24
#define PX_PER_KEY 400

typedef struct pkey {
  atomic_int running;   /* exclusion */
  atomic_uint next_run; /* order */
  tok t[PX_PER_KEY];
  atomic_uint accepted; /* submits that returned 0, in order */
} pkey;

typedef struct prefix {
  pkey k[PX_KEYS];
  tko_pool *pool;
  tko_lanes *lanes;
  int use; /* 0: user lanes, 1: keyed tasks, 2: both (odd keys keyed) */
  atomic_int violations;
  atomic_long runs;
  atomic_bool stop;
  bool slow_cancel;
} prefix;

static prefix *g_px;

static void px_ran(prefix *px, tok *t) {
  pkey *k = &px->k[t->key];
  if (atomic_fetch_add(&k->running, 1) != 0) {
    fprintf(stderr, "key %llu: two tasks at once\n", (unsigned long long)t->key);
    atomic_fetch_add(&px->violations, 1);
  }
  unsigned exp = atomic_fetch_add(&k->next_run, 1);
  if (exp != t->seq) {
    fprintf(stderr, "key %llu: ran seq %u, expected %u\n", (unsigned long long)t->key, t->seq, exp);
    atomic_fetch_add(&px->violations, 1);
  }
  tok_run(t);
  atomic_fetch_add(&px->runs, 1);
  atomic_fetch_sub(&k->running, 1);
}

static int px_task(void *arg) {
  px_ran(g_px, arg);
  return 0;
}

static void px_batch(void *user, const tko_lane_batch *b) {
  prefix *px = user;
  for (size_t i = 0; i < b->count; i++) px_ran(px, b->tasks[i].arg);
}

static void px_cancel_tok(prefix *px, tok *t) {
  tok_cancel(t);
  if (px->slow_cancel && (t->seq % 16) == 0) tt_spin_ns(200000);
}

static void px_lane_cancel(void *user, const tko_lane_task *lt) { px_cancel_tok(user, lt->arg); }

static void px_pool_cancel(void *user, const tko_task_info *ti) {
  prefix *px = user;
  if (!is_tok(ti->arg)) {
    fprintf(stderr, "pool on_cancel saw a foreign task (fn %p)\n", (void *)ti->fn);
    atomic_fetch_add(&px->violations, 1);
    return;
  }
  px_cancel_tok(px, ti->arg);
}

typedef struct px_sub {
  prefix *px;
  int first, step;
} px_sub;

static void *px_submitter(void *arg) {
  px_sub *s = arg;
  prefix *px = s->px;
  for (unsigned seq = 0; seq < PX_PER_KEY && !atomic_load(&px->stop); seq++) {
    for (int key = s->first; key < PX_KEYS; key += s->step) {
      pkey *k = &px->k[key];
      tok *t = &k->t[seq];
      t->magic = TOK_MAGIC;
      t->kind = K_LANE;
      t->key = (uint64_t)key;
      t->seq = seq;
      atomic_store(&t->accepted, true);
      bool keyed = px->use == 1 || (px->use == 2 && (key & 1));
      int rc = keyed ? tko_submit_keyed(px->pool, (uint64_t)key, px_task, t, key % 3)
                     : tko_lanes_submit(px->lanes, (uint64_t)key, px_task, t, key % 3);
      if (rc != 0) {
        atomic_store(&t->accepted, false);
        if (rc != -ESHUTDOWN) {
          fprintf(stderr, "submit: %d\n", rc);
          atomic_fetch_add(&px->violations, 1);
        }
        return NULL; /* closed: every later submit of these keys would fail too */
      }
      atomic_fetch_add(&k->accepted, 1);
    }
  }
  return NULL;
}

/* Each key: seqs 0..r-1 ran once, r..accepted-1 were cancelled once. */
static void px_check(prefix *px) {
  cr_assert_eq(atomic_load(&px->violations), 0);
  for (int key = 0; key < PX_KEYS; key++) {
    pkey *k = &px->k[key];
    unsigned acc = atomic_load(&k->accepted), r = atomic_load(&k->next_run);
    cr_assert_leq(r, acc);
    for (unsigned s = 0; s < PX_PER_KEY; s++) {
      tok *t = &k->t[s];
      int runs = atomic_load(&t->runs), cancels = atomic_load(&t->cancels);
      if (s < r) cr_assert(runs == 1 && cancels == 0, "key %d seq %u: runs %d cancels %d (prefix %u)", key, s, runs, cancels, r);
      else if (s < acc) cr_assert(runs == 0 && cancels == 1, "key %d seq %u: runs %d cancels %d (prefix %u, accepted %u)", key, s, runs, cancels, r, acc);
      else cr_assert(runs == 0 && cancels == 0);
    }
  }
}

typedef enum { PX_LANES_CANCEL, PX_SHUT_CANCEL, PX_SHUT_NOWAIT, PX_SHUT_DRAIN, PX_BOTH } px_how;

static void *px_lanes_canceller(void *arg) {
  cr_assert_eq(tko_lanes_cancel(arg), 0);
  return NULL;
}

/* Returns whether the cancel came while work was still queued (else the
 * scene proved nothing and is rerun). */
static bool px_scene(int use, bool batch, px_how how, unsigned lanes, int workers) {
  static prefix px;
  memset(&px, 0, sizeof px);
  g_px = &px;
  px.use = use;
  px.slow_cancel = true;
  tko_options o = tko_basic_options((unsigned)workers);
  o.hooks.user = &px;
  o.hooks.on_cancel = px_pool_cancel;
  cr_assert_eq(tko_pool_create(&px.pool, &o), 0);
  tko_lane_options lo = tko_lane_default_options();
  lo.lanes = lanes;
  lo.max_drain = 4;
  lo.user = &px;
  lo.on_cancel = px_lane_cancel;
  if (batch) lo.batch = px_batch;
  cr_assert_eq(tko_lanes_create(&px.lanes, px.pool, &lo), 0);
  pthread_t th[3];
  px_sub subs[3] = {{&px, 0, 3}, {&px, 1, 3}, {&px, 2, 3}};
  for (int i = 0; i < 3; i++) cr_assert_eq(pthread_create(&th[i], NULL, px_submitter, &subs[i]), 0);
  /* let some run, then cancel while submitters still go */
  while (atomic_load(&px.runs) < PX_KEYS * 20) sched_yield();
  tko_lane_stats ls;
  tko_lanes_stats(px.lanes, &ls);
  tko_stats ps;
  tko_pool_stats(px.pool, &ps);
  bool queued = ls.queued > 0 || ps.queued > 0;
  switch (how) {
  case PX_LANES_CANCEL: cr_assert_eq(tko_lanes_cancel(px.lanes), 0); break;
  case PX_SHUT_CANCEL: cr_assert_eq(tko_pool_shutdown(px.pool, TKO_CANCEL), 0); break;
  case PX_SHUT_NOWAIT: cr_assert_eq(tko_pool_shutdown(px.pool, TKO_CANCEL_NOWAIT), 0); break;
  case PX_SHUT_DRAIN: cr_assert_eq(tko_pool_shutdown(px.pool, TKO_DRAIN), 0); break;
  case PX_BOTH: {
    pthread_t c;
    cr_assert_eq(pthread_create(&c, NULL, px_lanes_canceller, px.lanes), 0);
    cr_assert_eq(tko_pool_shutdown(px.pool, TKO_CANCEL), 0);
    pthread_join(c, NULL);
    break;
  }
  }
  atomic_store(&px.stop, true);
  for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
  if (how == PX_LANES_CANCEL) {
    /* keyed tasks of the pool still run: let them finish */
    cr_assert_eq(tko_pool_wait_idle(px.pool, AE_WAIT_MS), 0);
    cr_assert_eq(tko_lanes_wait_idle(px.lanes, AE_WAIT_MS), 0);
  }
  cr_assert_eq(tko_lanes_destroy(px.lanes), 0);
  cr_assert_eq(tko_pool_destroy(px.pool), 0);
  px_check(&px);
  if (getenv("AE_VERBOSE")) {
    long acc = 0, r = 0;
    for (int key = 0; key < PX_KEYS; key++) {
      acc += atomic_load(&px.k[key].accepted);
      r += atomic_load(&px.k[key].next_run);
    }
    fprintf(stderr, "prefix how %d: accepted %ld ran %ld cancelled %ld queued-at-cancel %d\n", (int)how,
            acc, r, acc - r, (int)queued);
  }
  if (how == PX_SHUT_DRAIN) {
    for (int key = 0; key < PX_KEYS; key++)
      cr_assert_eq(atomic_load(&px.k[key].next_run), atomic_load(&px.k[key].accepted));
  }
  return queued;
}

static void px_run(int use, bool batch, px_how how, unsigned lanes, int workers) {
  alarm(AE_ALARM_S * 2);
  int real = 0;
  for (int i = 0; i < TT_SCALE(12, 4); i++) real += px_scene(use, batch, how, lanes, workers);
  cr_assert_gt(real, 0, "no round cancelled with work queued");
  alarm(0);
}

Test(attack_edges, prefix_lanes_cancel) { px_run(0, false, PX_LANES_CANCEL, 64, 2); }
Test(attack_edges, prefix_lanes_cancel_batch_collide) { px_run(0, true, PX_LANES_CANCEL, 4, 2); }
Test(attack_edges, prefix_shutdown_cancel_lanes) { px_run(0, false, PX_SHUT_CANCEL, 16, 2); }
Test(attack_edges, prefix_shutdown_cancel_keyed) { px_run(1, false, PX_SHUT_CANCEL, 16, 2); }
Test(attack_edges, prefix_shutdown_nowait_mixed) { px_run(2, false, PX_SHUT_NOWAIT, 8, 2); }
Test(attack_edges, prefix_shutdown_nowait_batch) { px_run(0, true, PX_SHUT_NOWAIT, 8, 3); }
Test(attack_edges, prefix_shutdown_drain_mixed) { px_run(2, true, PX_SHUT_DRAIN, 4, 2); }
Test(attack_edges, prefix_lanes_cancel_mixed_one_worker) { px_run(2, false, PX_LANES_CANCEL, 8, 1); }
Test(attack_edges, prefix_lanes_cancel_racing_shutdown_cancel) { px_run(2, true, PX_BOTH, 8, 2); }

/* ============================================================================
 * 2. completion queue
 * ========================================================================== */

static void snap_nop(void *user, const tko_completion *c) {
  (void)user;
  (void)c;
}

static bool cq_readable(tko_cq *cq, int ms) {
  struct pollfd p = {.fd = tko_cq_fd(cq), .events = POLLIN};
  return poll(&p, 1, ms) == 1;
}

Test(attack_edges, cq_capacity_rounds_up) {
  size_t caps[][2] = {{3, 4}, {5, 8}, {0, 1024}, {1024, 1024}, {1025, 2048}};
  for (size_t c = 0; c < sizeof caps / sizeof caps[0]; c++) {
    tko_cq *cq;
    cr_assert_eq(tko_cq_create(&cq, caps[c][0], NULL), 0);
    for (size_t i = 0; i < caps[c][1]; i++) cr_assert_eq(tko_cq_post(cq, i, 0, NULL), 0);
    cr_assert_eq(tko_cq_post(cq, 0, 0, NULL), -EAGAIN, "capacity %zu held more than %zu",
                 caps[c][0], caps[c][1]);
    cr_assert_eq(tko_cq_drain(cq, snap_nop, NULL, 0), (long)caps[c][1]);
    cr_assert_eq(tko_cq_destroy(cq), 0);
  }
  cr_assert_eq(tko_lanes_pool_cancelled(NULL), 0);
  cr_assert_eq(tko_coalescer_pool_cancelled(NULL), 0);
}

Test(attack_edges, cq_capacity_one_holds_one) {
  tko_cq *cq;
  cr_assert_eq(tko_cq_create(&cq, 1, NULL), 0);
  for (int round = 0; round < 100; round++) {
    cr_assert_eq(tko_cq_post(cq, (uint64_t)round, round, NULL), 0);
    cr_assert_eq(tko_cq_post(cq, 999, 0, NULL), -EAGAIN);
    cr_assert(cq_readable(cq, 0));
    tko_completion c[2];
    cr_assert_eq(tko_cq_destroy(cq), -EBUSY);
    cr_assert_eq(tko_cq_take(cq, c, 2), 1);
    cr_assert_eq(c[0].id, (uint64_t)round);
    cr_assert_eq(c[0].status, round);
    cr_assert_eq(tko_cq_take(cq, c, 2), 0);
  }
  cr_assert_eq(tko_cq_destroy(cq), 0);
}

typedef struct cq_snap {
  tko_cq *cq;
  long delivered, reposted, refused;
  uint64_t limit; /* ids >= limit were posted during the drain */
  long late;      /* such ids delivered by the same drain */
} cq_snap;

static void snap_fn(void *user, const tko_completion *c) {
  cq_snap *s = user;
  s->delivered++;
  if (c->id >= s->limit) s->late++;
  int rc = tko_cq_post(s->cq, s->limit + c->id, 0, NULL);
  if (rc == 0) s->reposted++;
  else if (rc == -EAGAIN) s->refused++;
  else cr_assert(0, "post from drain: %d", rc);
}

Test(attack_edges, cq_drain_snapshot_full_ring) {
  alarm(AE_ALARM_S);
  for (size_t cap = 1; cap <= 64; cap *= 4) {
    tko_cq *cq;
    cr_assert_eq(tko_cq_create(&cq, cap, NULL), 0);
    for (size_t i = 0; i < cap; i++) cr_assert_eq(tko_cq_post(cq, i, 0, NULL), 0);
    cr_assert_eq(tko_cq_post(cq, 12345, 0, NULL), -EAGAIN);
    cq_snap s = {.cq = cq, .limit = 1000000};
    long n = tko_cq_drain(cq, snap_fn, &s, 0);
    cr_assert_eq(n, (long)cap);
    cr_assert_eq(s.late, 0, "drain delivered a completion posted from its own callback");
    if (s.reposted) cr_assert(cq_readable(cq, 0), "reposts queued, descriptor quiet");
    /* next drain gets exactly the reposts */
    cq_snap s2 = {.cq = cq, .limit = 1u << 30};
    n = tko_cq_drain(cq, snap_fn, &s2, 0);
    cr_assert_eq(n, s.reposted);
    tko_completion c[128];
    while (tko_cq_take(cq, c, 128) > 0) {
    }
    cr_assert_eq(tko_cq_destroy(cq), 0);
  }
  alarm(0);
}

Test(attack_edges, cq_drain_max_rearms) {
  tko_cq *cq;
  cr_assert_eq(tko_cq_create(&cq, 8, NULL), 0);
  for (int i = 0; i < 5; i++) cr_assert_eq(tko_cq_post(cq, (uint64_t)i, 0, NULL), 0);
  cq_snap s = {.cq = cq, .limit = 1000};
  tko_completion c[8];
  cr_assert_eq(tko_cq_take(cq, c, 2), 2);
  cr_assert(cq_readable(cq, 0), "take stopped at max with completions left, descriptor quiet");
  cr_assert_eq(c[0].id, 0);
  cr_assert_eq(c[1].id, 1);
  (void)s;
  cr_assert_eq(tko_cq_take(cq, c, 8), 3);
  cr_assert_eq(c[0].id, 2);
  cr_assert_eq(tko_cq_destroy(cq), 0);
}

/* Posters and drainers at once: every completion delivered exactly once, and
 * a loop that only drains when the descriptor is readable never strands one. */
#define CQ_POSTERS 3
#define CQ_PER 20000

typedef struct cq_mt {
  tko_cq *cq;
  atomic_uchar seen[CQ_POSTERS * CQ_PER];
  atomic_long delivered, dup;
  atomic_bool posting_done;
  uint64_t last_per_drain_poster[8]; /* unused: concurrent drains order nothing */
} cq_mt;

static void mt_fn(void *user, const tko_completion *c) {
  cq_mt *m = user;
  if (atomic_fetch_add(&m->seen[c->id], 1) != 0) atomic_fetch_add(&m->dup, 1);
  atomic_fetch_add(&m->delivered, 1);
}

typedef struct mt_poster {
  cq_mt *m;
  int idx;
} mt_poster;

static void *mt_post(void *arg) {
  mt_poster *p = arg;
  for (int i = 0; i < CQ_PER; i++) {
    uint64_t id = (uint64_t)p->idx * CQ_PER + (uint64_t)i;
    int rc;
    while ((rc = tko_cq_post(p->m->cq, id, 0, NULL)) == -EAGAIN) sched_yield();
    cr_assert_eq(rc, 0);
  }
  return NULL;
}

static void *mt_drain(void *arg) {
  cq_mt *m = arg;
  tko_completion c[7];
  int k = 0;
  uint64_t quiet_since = 0;
  while (atomic_load(&m->delivered) < CQ_POSTERS * CQ_PER) {
    /* the other drainer may take the last ones: poll in short steps, and
     * fail only when nothing moved for AE_WAIT_MS (a stranded completion) */
    if (!cq_readable(m->cq, 50)) {
      long d = atomic_load(&m->delivered);
      (void)d; /* in the message only, which the TSan stand-in drops */
      if (!quiet_since) quiet_since = tt_now_ns();
      cr_assert(tt_now_ns() - quiet_since < (uint64_t)AE_WAIT_MS * 1000000u,
                "descriptor quiet for 30 s with %ld of %d delivered", d, CQ_POSTERS * CQ_PER);
      continue;
    }
    quiet_since = 0;
    if (k++ & 1) {
      long n = tko_cq_drain(m->cq, mt_fn, m, 5);
      cr_assert_geq(n, 0);
    } else {
      long n = tko_cq_take(m->cq, c, 7);
      cr_assert_geq(n, 0);
      for (long i = 0; i < n; i++) mt_fn(m, &c[i]);
    }
  }
  return NULL;
}

Test(attack_edges, cq_concurrent_drains_exactly_once) {
  alarm(AE_ALARM_S * 2);
  static cq_mt m;
  memset(&m, 0, sizeof m);
  cr_assert_eq(tko_cq_create(&m.cq, 16, NULL), 0);
  pthread_t p[CQ_POSTERS], d[2];
  mt_poster pa[CQ_POSTERS];
  for (int i = 0; i < 2; i++) cr_assert_eq(pthread_create(&d[i], NULL, mt_drain, &m), 0);
  for (int i = 0; i < CQ_POSTERS; i++) {
    pa[i] = (mt_poster){&m, i};
    cr_assert_eq(pthread_create(&p[i], NULL, mt_post, &pa[i]), 0);
  }
  for (int i = 0; i < CQ_POSTERS; i++) pthread_join(p[i], NULL);
  for (int i = 0; i < 2; i++) pthread_join(d[i], NULL);
  cr_assert_eq(atomic_load(&m.dup), 0);
  cr_assert_eq(atomic_load(&m.delivered), CQ_POSTERS * CQ_PER);
  cr_assert_eq(tko_cq_destroy(m.cq), 0);
  alarm(0);
}

/* Single loop thread, posts from pool tasks, hooks and on_cancel during a
 * shutdown: the loop drains only on readability and gets every completion. */
typedef struct cq_pool {
  tko_cq *cq;
  tko_pool *pool;
  atomic_long posted, refused;
  atomic_uchar seen[1 << 16];
  atomic_long dup;
} cq_pool;

static void cqp_post(cq_pool *cp, uint64_t id) {
  int rc = tko_cq_post(cp->cq, id, 0, NULL);
  if (rc == 0) atomic_fetch_add(&cp->posted, 1);
  else {
    cr_assert_eq(rc, -EAGAIN);
    atomic_fetch_add(&cp->refused, 1);
  }
}

static atomic_ulong g_cqp_id;
static int cqp_task(void *arg) {
  cqp_post(arg, atomic_fetch_add(&g_cqp_id, 1));
  return 0;
}
static void cqp_after(void *user, const tko_task_info *ti) {
  (void)ti;
  cqp_post(user, atomic_fetch_add(&g_cqp_id, 1));
}
static void cqp_cancel(void *user, const tko_task_info *ti) {
  (void)ti;
  cqp_post(user, atomic_fetch_add(&g_cqp_id, 1));
}
static void cqp_fn(void *user, const tko_completion *c) {
  cq_pool *cp = user;
  if (atomic_fetch_add(&cp->seen[c->id & 0xffff], 1) != 0) atomic_fetch_add(&cp->dup, 1);
}

typedef struct cqp_sub {
  cq_pool *cp;
  atomic_bool done;
} cqp_sub;

static void *cqp_submitter(void *arg) {
  cqp_sub *s = arg;
  for (int i = 0; i < 3000; i++) {
    int rc = tko_submit(s->cp->pool, cqp_task, s->cp, i % 5);
    if (rc == -ESHUTDOWN) break;
    cr_assert_eq(rc, 0);
    if ((i & 63) == 0) cqp_post(s->cp, atomic_fetch_add(&g_cqp_id, 1)); /* foreign thread */
  }
  atomic_store(&s->done, true);
  return NULL;
}

static void cq_pool_scene(tko_shutdown_mode mode) {
  static cq_pool cp;
  memset(&cp, 0, sizeof cp);
  atomic_store(&g_cqp_id, 0);
  cr_assert_eq(tko_cq_create(&cp.cq, 1 << 16, NULL), 0);
  tko_options o = tko_basic_options(2);
  o.hooks.user = &cp;
  o.hooks.after_run = cqp_after;
  o.hooks.on_cancel = cqp_cancel;
  cr_assert_eq(tko_pool_create(&cp.pool, &o), 0);
  static cqp_sub s;
  s.cp = &cp;
  atomic_store(&s.done, false);
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, cqp_submitter, &s), 0);
  long got = 0;
  int spins = 0;
  /* the loop: drain on readability, shut down part way */
  while (got < 2000) {
    cr_assert(cq_readable(cp.cq, (int)AE_WAIT_MS), "quiet descriptor, %ld delivered", got);
    long n = tko_cq_drain(cp.cq, cqp_fn, &cp, 0);
    cr_assert_geq(n, 0);
    got += n;
    if (++spins > 1000000) break;
  }
  cr_assert_eq(tko_pool_shutdown(cp.pool, mode), 0);
  pthread_join(th, NULL);
  cr_assert_eq(tko_pool_destroy(cp.pool), 0); /* every poster is done now */
  while (got < atomic_load(&cp.posted)) {
    cr_assert(cq_readable(cp.cq, (int)AE_WAIT_MS), "quiet descriptor after shutdown, %ld of %ld",
              got, atomic_load(&cp.posted));
    long n = tko_cq_drain(cp.cq, cqp_fn, &cp, 0);
    cr_assert_geq(n, 0);
    got += n;
  }
  cr_assert_eq(got, atomic_load(&cp.posted));
  cr_assert_eq(atomic_load(&cp.dup), 0);
  cr_assert_eq(tko_cq_destroy(cp.cq), 0);
}

Test(attack_edges, cq_posts_from_tasks_hooks_shutdown) {
  alarm(AE_ALARM_S * 2);
  for (int i = 0; i < TT_SCALE(4, 2); i++) {
    cq_pool_scene(TKO_DRAIN);
    cq_pool_scene(TKO_CANCEL);
    cq_pool_scene(TKO_CANCEL_NOWAIT);
  }
  alarm(0);
}

/* ============================================================================
 * 3. shutdown in every mode racing every task kind
 * ========================================================================== */

#define EV_TIMERS 24
#define EV_MARK_KEYS 8

typedef struct everything {
  tko_pool *pool;
  tko_lanes *lanes;
  tko_coalescer *co;
  tko_cq *async_cq; /* async starts hand their op to the completer here */
  tokpool toks;
  tko_group group;
  tko_timer timers[EV_TIMERS];
  tok *timer_tok[EV_TIMERS];
  tko_handle handles[512];
  tko_timer late_timers[2048]; /* armed by the submitters, racing shutdown */
  atomic_int nlate;
  tok *handle_tok[512];
  atomic_int nhandles;
  atomic_bool stop, completer_stop;
  atomic_int bad;
  atomic_long runs, cancels, accepted;
  /* coalescer: per key, last accepted value and last flushed value */
  atomic_ullong last_mark[2][EV_MARK_KEYS];
  atomic_ullong last_flush[2][EV_MARK_KEYS];
  atomic_int flush_order_bad;
} everything;

static everything *g_ev;

static void ev_bad(const char *what, int rc) {
  fprintf(stderr, "everything: %s -> %d\n", what, rc);
  atomic_fetch_add(&g_ev->bad, 1);
}

static int rc_unused(int rc) { return rc; }

static int ev_task(void *arg) {
  tok *t = arg;
  tok_run(t);
  atomic_fetch_add(&g_ev->runs, 1);
  if ((t->seq & 7) == 0) {
    int rc = tko_pool_wait_idle(g_ev->pool, 0);
    if (rc != -EDEADLK) ev_bad("wait_idle from task", rc);
    rc = tko_pool_shutdown(g_ev->pool, TKO_DRAIN);
    if (rc != -EDEADLK) ev_bad("shutdown from task", rc);
    tko_stats s;
    tko_pool_stats(g_ev->pool, &s);
    if (s.completed + s.cancelled + s.queued + s.running > s.submitted) ev_bad("stats sum", 0);
  }
  /* a member waiting on its own group, a task on its own handle */
  if (t->kind == K_GROUP && (rc_unused(tko_group_wait(&g_ev->group, 1000)) != -EDEADLK))
    ev_bad("group_wait from a member", 0);
  if (t->kind == K_HANDLE && tko_handle_wait(&g_ev->handles[t->by_depth], 1000) != -EDEADLK)
    ev_bad("handle_wait from its task", 0);
  return 0;
}

static int ev_async(tko_async *op, void *arg) {
  tok *t = arg;
  tok_run(t);
  atomic_fetch_add(&g_ev->runs, 1);
  if (tko_async_arg(op) != arg) ev_bad("async_arg", 0);
  int rc = tko_cq_post(g_ev->async_cq, 0, 0, op);
  if (rc != 0) {
    ev_bad("async post", rc);
    return -EIO; /* completes at once */
  }
  return 0;
}

static void ev_complete_fn(void *user, const tko_completion *c) {
  (void)user;
  int rc = tko_async_complete(c->user, 0);
  if (rc != 0) ev_bad("async_complete", rc);
}

static void *ev_completer(void *arg) {
  everything *ev = arg;
  while (!atomic_load(&ev->completer_stop)) {
    struct pollfd p = {.fd = tko_cq_fd(ev->async_cq), .events = POLLIN};
    if (poll(&p, 1, 20) == 1) tko_cq_drain(ev->async_cq, ev_complete_fn, NULL, 0);
  }
  tko_cq_drain(ev->async_cq, ev_complete_fn, NULL, 0);
  return NULL;
}

static void ev_pool_cancel(void *user, const tko_task_info *ti) {
  everything *ev = user;
  if (tko_lanes_pool_cancelled(ti)) {
    ev_bad("pool on_cancel saw a lane runner", 0);
    return;
  }
  if (tko_coalescer_pool_cancelled(ti)) {
    ev_bad("pool on_cancel saw a sweep", 0);
    return;
  }
  if (!is_tok(ti->arg)) {
    ev_bad("pool on_cancel saw a foreign task", 0);
    return;
  }
  tok *t = ti->arg;
  tok_cancel(t);
  atomic_fetch_add(&ev->cancels, 1);
  int rc = tko_pool_shutdown(ev->pool, TKO_CANCEL);
  if (rc != -EDEADLK) ev_bad("shutdown from on_cancel", rc);
  if (t->kind == K_GROUP && (rc = tko_group_wait(&ev->group, 1000)) != -EDEADLK)
    ev_bad("group_wait from on_cancel of a member", rc);
  if (t->kind == K_HANDLE && (rc = tko_handle_wait(&ev->handles[t->by_depth], 1000)) != -EDEADLK)
    ev_bad("handle_wait from on_cancel of its task", rc);
}

static void ev_lane_cancel(void *user, const tko_lane_task *lt) {
  everything *ev = user;
  tok_cancel(lt->arg);
  atomic_fetch_add(&ev->cancels, 1);
}

static void ev_before(void *user, const tko_task_info *ti) {
  everything *ev = user;
  (void)ti;
  tko_stats s;
  tko_pool_stats(ev->pool, &s);
  if ((ti->id & 63) == 1) {
    int rc = tko_pool_shutdown(ev->pool, TKO_CANCEL);
    if (rc != -EDEADLK) ev_bad("shutdown from before_run", rc);
  }
}

static void ev_flush(void *user, const tko_coalesce_entry *e, size_t n) {
  everything *ev = user;
  for (size_t i = 0; i < n; i++) {
    int th = (int)(e[i].key / 100), k = (int)(e[i].key % 100);
    uint64_t prev = atomic_load(&ev->last_flush[th][k]);
    if (e[i].value < prev) atomic_fetch_add(&ev->flush_order_bad, 1);
    atomic_store(&ev->last_flush[th][k], e[i].value);
  }
}

typedef struct ev_sub {
  everything *ev;
  int idx;
} ev_sub;

static int ev_submit_one(everything *ev, int kind, tok *t, uint32_t i) {
  switch (kind) {
  case K_PLAIN: return tko_submit(ev->pool, ev_task, t, (int)(i % 4));
  case K_GROUP: return tko_group_submit(ev->pool, &ev->group, ev_task, t, (int)(i % 4));
  case K_ASYNC: return tko_submit_async(ev->pool, ev_async, t, (int)(i % 4));
  case K_KEYED: return tko_submit_keyed(ev->pool, i % 13, ev_task, t, (int)(i % 4));
  case K_LANE: return tko_lanes_submit(ev->lanes, i % 11, ev_task, t, (int)(i % 4));
  case K_TIMER: {
    int n = atomic_fetch_add(&ev->nlate, 1);
    if (n >= 2048) return -ENOSPC;
    tko_timer_init(&ev->late_timers[n]);
    return tko_submit_after(ev->pool, &ev->late_timers[n], (long)(i % 3), ev_task, t, 1);
  }
  case K_HANDLE: {
    int h = atomic_fetch_add(&ev->nhandles, 1);
    if (h >= 512) return -ENOSPC;
    ev->handle_tok[h] = t;
    t->by_depth = h; /* its handle's index */
    return tko_submit_handle(ev->pool, &ev->handles[h], ev_task, t, (int)(i % 4));
  }
  }
  return -ENOSYS;
}

static void *ev_submitter(void *arg) {
  ev_sub *s = arg;
  everything *ev = s->ev;
  static const int kinds[] = {K_PLAIN, K_GROUP, K_ASYNC, K_KEYED, K_LANE, K_HANDLE, K_TIMER};
  uint64_t marks = 0;
  for (uint32_t i = 0; !atomic_load(&ev->stop); i++) {
    /* keep the backlog bounded, so that shutdown meets a busy pool and
     * submitters still going rather than a token pool used up */
    while (atomic_load(&ev->accepted) - atomic_load(&ev->runs) - atomic_load(&ev->cancels) > 3000 &&
           !atomic_load(&ev->stop))
      sched_yield();
    int kind = kinds[(i + (uint32_t)s->idx) % 7];
    if (s->idx == 0 && i == 500) {
      /* a periodic timer cancelled while the pool runs or shuts down */
      tok *pt = ev->timer_tok[0];
      atomic_store(&pt->user_cancelled, 1);
      int crc = tko_timer_cancel(&ev->timers[0]);
      if (crc != 0 && crc != -ENOENT) ev_bad("timer_cancel", crc);
      if (crc == -ENOENT) atomic_store(&pt->user_cancelled, 0); /* shutdown had it: one on_cancel */
    }
    tok *t = tp_get(&ev->toks, kind);
    if (!t) break;
    t->seq = i;
    atomic_store(&t->accepted, true);
    int rc = ev_submit_one(ev, kind, t, i);
    if (rc == -ENOSPC) {
      t->kind = K_PLAIN;
      rc = tko_submit(ev->pool, ev_task, t, 0);
    }
    if (rc == 0 && t->kind == K_HANDLE && i % 3 == 0) {
      int crc = tko_handle_cancel(&ev->handles[t->by_depth]);
      if (crc == 0) atomic_store(&t->user_cancelled, 1); /* promised never to run */
      else if (crc != -EBUSY && crc != -EALREADY) ev_bad("handle_cancel", crc);
    }
    if (rc != 0) {
      atomic_store(&t->accepted, false);
      if (rc != -ESHUTDOWN) ev_bad("submit", rc);
    } else if (t->kind != K_PERIODIC) {
      atomic_fetch_add(&ev->accepted, 1);
    }
    if ((i & 3) == 0) {
      int k = (int)(marks % EV_MARK_KEYS);
      uint64_t v = ++marks;
      rc = tko_coalescer_mark(ev->co, (uint64_t)(s->idx * 100 + k), v);
      if (rc == 0) atomic_store(&ev->last_mark[s->idx][k], v);
      else if (rc != -ESHUTDOWN) ev_bad("mark", rc);
    }
  }
  return NULL;
}

static void everything_scene(tko_shutdown_mode mode) {
  static everything ev;
  memset(&ev, 0, sizeof ev);
  g_ev = &ev;
  tp_init(&ev.toks, 200000);
  cr_assert_eq(tko_group_init(&ev.group), 0);
  cr_assert_eq(tko_cq_create(&ev.async_cq, 1 << 17, NULL), 0);
  tko_options o = tko_basic_options(2);
  o.hooks.user = &ev;
  o.hooks.on_cancel = ev_pool_cancel;
  o.hooks.before_run = ev_before;
  o.max_async_inflight = 8;
  cr_assert_eq(tko_pool_create(&ev.pool, &o), 0);
  tko_lane_options lo = tko_lane_default_options();
  lo.lanes = 8;
  lo.user = &ev;
  lo.on_cancel = ev_lane_cancel;
  cr_assert_eq(tko_lanes_create(&ev.lanes, ev.pool, &lo), 0);
  cr_assert_eq(tko_coalescer_create(&ev.co, ev.pool, 1, ev_flush, &ev, NULL), 0);
  pthread_t completer;
  cr_assert_eq(pthread_create(&completer, NULL, ev_completer, &ev), 0);
  for (int i = 0; i < EV_TIMERS; i++) {
    tko_timer_init(&ev.timers[i]);
    bool periodic = i % 4 == 0;
    tok *t = tp_get(&ev.toks, periodic ? K_PERIODIC : K_TIMER);
    ev.timer_tok[i] = t;
    atomic_store(&t->accepted, true);
    int rc = periodic ? tko_submit_every(ev.pool, &ev.timers[i], 1, ev_task, t, 1)
                      : tko_submit_after(ev.pool, &ev.timers[i], i % 5, ev_task, t, 1);
    cr_assert_eq(rc, 0);
  }
  pthread_t th[2];
  ev_sub subs[2] = {{&ev, 0}, {&ev, 1}};
  for (int i = 0; i < 2; i++) cr_assert_eq(pthread_create(&th[i], NULL, ev_submitter, &subs[i]), 0);
  while (atomic_load(&ev.runs) < 20000) sched_yield();
  int rc = tko_pool_shutdown(ev.pool, mode);
  cr_assert_eq(rc, 0);
  if (mode == TKO_CANCEL_NOWAIT) {
    rc = tko_pool_shutdown_timed(ev.pool, TKO_DRAIN, AE_WAIT_MS);
    cr_assert_eq(rc, 0, "shutdown after NOWAIT: %d", rc);
  }
  atomic_store(&ev.stop, true);
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  /* a NOWAIT-racing submit may be accepted late: a second shutdown settles it */
  cr_assert_eq(tko_pool_shutdown(ev.pool, TKO_CANCEL), 0);
  tko_stats s;
  tko_pool_stats(ev.pool, &s);
  cr_assert_eq(s.queued, 0);
  cr_assert_eq(s.running, 0);
  cr_assert_eq(s.async_inflight, 0);
  cr_assert_eq(s.submitted, s.completed + s.cancelled,
               "mode %d: submitted %llu != completed %llu + cancelled %llu", (int)mode,
               (unsigned long long)s.submitted, (unsigned long long)s.completed,
               (unsigned long long)s.cancelled);
  cr_assert_eq(tko_group_wait(&ev.group, 0), 0);
  cr_assert_eq(tko_group_pending(&ev.group), 0);
  cr_assert_eq(tko_group_destroy(&ev.group), 0);
  int nh = atomic_load(&ev.nhandles);
  if (nh > 512) nh = 512;
  for (int h = 0; h < nh; h++) {
    tok *t = ev.handle_tok[h];
    if (!atomic_load(&t->accepted)) continue;
    cr_assert_eq(tko_handle_wait(&ev.handles[h], 0), 0);
    int st = tko_handle_status(&ev.handles[h]);
    if (atomic_load(&t->user_cancelled))
      cr_assert_eq(atomic_load(&t->runs), 0, "a handle cancelled with 0 ran");
    if (atomic_load(&t->runs)) cr_assert_eq(st, 0);
    else cr_assert_eq(st, -ECANCELED);
  }
  for (int i = 0; i < EV_TIMERS; i++) cr_assert_eq(tko_timer_cancel(&ev.timers[i]), -ENOENT);
  for (int i = 0; i < atomic_load(&ev.nlate) && i < 2048; i++)
    cr_assert_eq(tko_timer_cancel(&ev.late_timers[i]), -ENOENT);
  tko_lane_stats ls;
  tko_lanes_stats(ev.lanes, &ls);
  cr_assert_eq(ls.queued, 0);
  cr_assert_eq(ls.submitted, ls.completed + ls.cancelled);
  cr_assert_eq(tko_lanes_destroy(ev.lanes), 0);
  cr_assert_eq(tko_coalescer_destroy(ev.co), 0);
  cr_assert_eq(tko_pool_destroy(ev.pool), 0);
  atomic_store(&ev.completer_stop, true);
  pthread_join(completer, NULL);
  cr_assert_eq(tko_cq_destroy(ev.async_cq), 0);
  cr_assert_eq(atomic_load(&ev.bad), 0);
  cr_assert_eq(atomic_load(&ev.flush_order_bad), 0);
  for (int th_i = 0; th_i < 2; th_i++)
    for (int k = 0; k < EV_MARK_KEYS; k++)
      cr_assert_eq(atomic_load(&ev.last_flush[th_i][k]), atomic_load(&ev.last_mark[th_i][k]),
                   "coalescer key %d/%d: last flushed %llu, last marked %llu", th_i, k,
                   (unsigned long long)atomic_load(&ev.last_flush[th_i][k]),
                   (unsigned long long)atomic_load(&ev.last_mark[th_i][k]));
  tp_summary(&ev.toks, "everything", &s);
  tp_check(&ev.toks, "everything");
  free(ev.toks.t);
}

Test(attack_edges, everything_shutdown_drain) {
  alarm(AE_ALARM_S * 2);
  for (int i = 0; i < TT_SCALE(3, 1); i++) everything_scene(TKO_DRAIN);
  alarm(0);
}

Test(attack_edges, everything_shutdown_cancel) {
  alarm(AE_ALARM_S * 2);
  for (int i = 0; i < TT_SCALE(3, 1); i++) everything_scene(TKO_CANCEL);
  alarm(0);
}

Test(attack_edges, everything_shutdown_nowait) {
  alarm(AE_ALARM_S * 2);
  for (int i = 0; i < TT_SCALE(3, 1); i++) everything_scene(TKO_CANCEL_NOWAIT);
  alarm(0);
}

/* ============================================================================
 * 1a'. a CALLER_RUNS lane submit runs its own task only
 * ========================================================================== */

typedef struct cr_own {
  tko_lanes *lanes;
  tt_pin pin;
  pthread_t submitter;
  atomic_int b_on_submitter;
  tt_count b_runs, a_done;
  int a_runs;
  int appended_rc;
  bool room_in_a; /* A itself frees the worker; else a helper does, later */
  bool keyed;     /* A and B are keyed tasks of the pool, not lane tasks */
  tko_pool *pool;
  long b_expected;
  int a_wait_rc;
  long a_running;
  bool check_running;
} cr_own;
static bool g_cr_check_running;

static int cr_b(void *arg) {
  cr_own *c = arg;
  if (pthread_equal(pthread_self(), c->submitter)) atomic_fetch_add(&c->b_on_submitter, 1);
  tt_count_add(&c->b_runs, 1);
  return 0;
}

static int cr_a(void *arg) {
  cr_own *c = arg;
  c->a_runs++;
  c->a_wait_rc = tko_pool_wait_idle(c->pool, 0);
  tko_stats st;
  tko_pool_stats(c->pool, &st);
  c->a_running = (long)st.running;
  /* appended behind A on A's lane, while A runs on the submitter */
  c->appended_rc = c->keyed ? tko_submit_keyed(c->pool, 7, cr_b, c, 0)
                            : tko_lanes_submit(c->lanes, 7, cr_b, c, 0);
  if (c->room_in_a) tt_gate_open(&c->pin.gate); /* room: B's runner can be queued */
  tt_count_add(&c->a_done, 1);
  return 0;
}

/* With the worker held and the queue full after A, the submitter must wait
 * for room to queue B's runner. The helper gives it room, but first leaves
 * it a while to misbehave in: B on the submitter before the worker is
 * free is the bug. (The bounded wait looks for an event that must not
 * happen; the verdict does not depend on its length.) */
static void *cr_helper(void *arg) {
  cr_own *c = arg;
  cr_assert(tt_count_wait_geq(&c->a_done, 1));
  (void)tt_count_wait_geq_within(&c->b_runs, 1, 300);
  tt_gate_open(&c->pin.gate);
  return NULL;
}

static cr_own *g_cr;
static int cr_outer(void *arg) {
  (void)arg;
  /* running on the submitter by CALLER_RUNS: the lane submit nests in it */
  if (g_cr->keyed) cr_assert_eq(tko_submit_keyed(g_cr->pool, 7, cr_a, g_cr, 0), 0);
  else cr_assert_eq(tko_lanes_submit(g_cr->lanes, 7, cr_a, g_cr, 0), 0);
  return 0;
}

enum { CR_DIRECT, CR_IN_PLAIN, CR_IN_KEYED };

static void cr_own_scene2(unsigned max_drain, bool room_in_a, int outer, bool keyed) {
  static cr_own c;
  memset(&c, 0, sizeof c);
  c.keyed = keyed;
  c.b_expected = 1;
  c.check_running = g_cr_check_running || keyed || outer != CR_DIRECT;
  c.pin = (tt_pin)TT_PIN_INIT;
  tt_count_init(&c.b_runs);
  tt_count_init(&c.a_done);
  c.room_in_a = room_in_a;
  pthread_t helper;
  if (!room_in_a) cr_assert_eq(pthread_create(&helper, NULL, cr_helper, &c), 0);
  tko_pool *pool;
  tko_options o = tko_basic_options(1);
  o.queue_capacity = 1;
  o.full_policy = TKO_FULL_CALLER_RUNS;
  cr_assert_eq(tko_pool_create(&pool, &o), 0);
  c.pool = pool;
  tko_lane_options lo = tko_lane_default_options();
  lo.max_drain = max_drain;
  cr_assert_eq(tko_lanes_create(&c.lanes, pool, &lo), 0);
  cr_assert_eq(tko_submit(pool, tt_pin_fn, &c.pin, 0), 0);
  cr_assert(tt_count_wait_geq(&c.pin.started, 1)); /* the worker is held */
  cr_assert_eq(tko_submit(pool, tt_nop_fn, NULL, 0), 0); /* the queue is full */
  c.submitter = pthread_self();
  g_cr = &c;
  if (outer == CR_DIRECT && keyed) cr_assert_eq(tko_submit_keyed(pool, 7, cr_a, &c, 0), 0);
  else if (outer == CR_DIRECT) cr_assert_eq(tko_lanes_submit(c.lanes, 7, cr_a, &c, 0), 0);
  else if (outer == CR_IN_PLAIN) cr_assert_eq(tko_submit(pool, cr_outer, NULL, 0), 0);
  else cr_assert_eq(tko_submit_keyed(pool, 99, cr_outer, NULL, 0), 0);
  cr_assert_eq(c.a_runs, 1, "the idle lane's first visit ran on the caller");
  if (getenv("AE_VERBOSE"))
    fprintf(stderr, "cr scene keyed %d outer %d: wait_idle from A %d, running %ld\n", (int)keyed,
            outer, c.a_wait_rc, c.a_running);
  if (c.check_running) {
    /* the runner A's visit stands for is a task of the pool (counted in
     * submitted and caller_runs): running while it runs, like a worker's */
    cr_assert_geq(c.a_running, 2, "stats.running %ld inside a CALLER_RUNS lane visit (pin + visit)",
                  c.a_running);
    cr_assert_eq(c.a_wait_rc, -EDEADLK, "pool_wait_idle(0) from a CALLER_RUNS lane task: %d",
                 c.a_wait_rc);
  }
  /* A keyed submit from A (a task CALLER_RUNS runs on this thread) to A's
   * busy key gets -EAGAIN rather than waiting for room, as a worker would:
   * the header names workers only, so both answers are read as allowed. */
  if (keyed && c.appended_rc == -EAGAIN) c.appended_rc = 0, c.b_expected = 0;
  cr_assert_eq(c.appended_rc, 0, "appended submit from A: %d", c.appended_rc);
  if (!room_in_a) pthread_join(helper, NULL);
  cr_assert_eq(tko_lanes_wait_idle(c.lanes, AE_WAIT_MS), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, AE_WAIT_MS), 0);
  cr_assert_eq(tt_count_get(&c.b_runs), c.b_expected);
  /* A lane submit made from a task the pool runs (here one it ran on its
   * caller) may not wait for room, as a worker's may not: it drains its
   * lane itself, appended tasks included (lanes.h); any other submitter
   * runs its own task only. */
  if (outer == CR_DIRECT || keyed)
    cr_assert_eq(atomic_load(&c.b_on_submitter), 0,
                 "a CALLER_RUNS lane submit ran a task appended behind its own (lanes.h: it never runs them)");
  else
    cr_assert_eq(atomic_load(&c.b_on_submitter), c.b_expected,
                 "a lane submit from a pool task that found the queue full left its lane undrained");
  cr_assert_eq(tko_lanes_destroy(c.lanes), 0);
  cr_assert_eq(tko_pool_destroy(pool), 0);
}

static void cr_own_scene(unsigned max_drain, bool room_in_a, int outer) {
  cr_own_scene2(max_drain, room_in_a, outer, false);
}

Test(attack_edges, caller_runs_keyed_submit_runs_own_task_only) {
  alarm(AE_ALARM_S);
  cr_own_scene2(32, false, CR_DIRECT, true);
}

Test(attack_edges, caller_runs_keyed_submit_nested_in_plain_task) {
  alarm(AE_ALARM_S);
  cr_own_scene2(32, false, CR_IN_PLAIN, true);
}


Test(attack_edges, caller_runs_lane_submit_runs_own_task_only) {
  alarm(AE_ALARM_S);
  cr_own_scene(32, true, CR_DIRECT);
  cr_own_scene(1, true, CR_DIRECT);
}

Test(attack_edges, caller_runs_lane_submit_waits_for_room_for_appended) {
  alarm(AE_ALARM_S);
  cr_own_scene(32, false, CR_DIRECT);
  cr_own_scene(1, false, CR_DIRECT);
}

/* ============================================================================
 * 2'. completion queue: a poster stopped inside its post (the header's
 * exception) never strands a completion behind a quiet descriptor
 * ========================================================================== */

#include <semaphore.h>
#include <signal.h>

static sem_t g_stall_sem;
static atomic_int g_stalls;
static void stall_handler(int sig) {
  (void)sig;
  atomic_fetch_add(&g_stalls, 1);
  while (sem_wait(&g_stall_sem) != 0) {
  }
}

#define ST_PER 20000

typedef struct stall_post {
  tko_cq *cq;
  uint64_t base;
  atomic_bool done;
} stall_post;

static void *stall_poster(void *arg) {
  stall_post *p = arg;
  for (uint64_t i = 0; i < ST_PER; i++) {
    int rc;
    while ((rc = tko_cq_post(p->cq, p->base + i, 0, NULL)) == -EAGAIN) sched_yield();
    cr_assert_eq(rc, 0);
  }
  atomic_store(&p->done, true);
  return NULL;
}

typedef struct stall_loop {
  uint64_t next[2]; /* per poster: the next id expected (one drainer: in order) */
  long got, out_of_order;
} stall_loop;

static void stall_fn(void *user, const tko_completion *c) {
  stall_loop *l = user;
  int who = c->id >= 1000000;
  uint64_t idx = c->id - (who ? 1000000 : 0);
  if (idx != l->next[who]) l->out_of_order++;
  l->next[who] = idx + 1;
  l->got++;
}

Test(attack_edges, cq_stalled_poster_never_strands) {
  alarm(AE_ALARM_S * 2);
  cr_assert_eq(sem_init(&g_stall_sem, 0, 0), 0);
  struct sigaction sa = {.sa_handler = stall_handler};
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  cr_assert_eq(sigaction(SIGUSR1, &sa, NULL), 0);
  tko_cq *cq;
  cr_assert_eq(tko_cq_create(&cq, 64, NULL), 0);
  static stall_post p[2];
  p[0] = (stall_post){.cq = cq, .base = 0};
  p[1] = (stall_post){.cq = cq, .base = 1000000};
  pthread_t th[2];
  for (int i = 0; i < 2; i++) cr_assert_eq(pthread_create(&th[i], NULL, stall_poster, &p[i]), 0);
  stall_loop l = {{0, 0}, 0, 0};
  long stalls_sent = 0, quiet_while_stalled = 0;
  while (l.got < 2 * ST_PER) {
    /* now and then stop poster 0 wherever it is - inside tko_cq_post too */
    bool stalled = false;
    if ((l.got & 7) == 0 && !atomic_load(&p[0].done)) {
      cr_assert_eq(pthread_kill(th[0], SIGUSR1), 0);
      stalls_sent++;
      stalled = true;
    }
    /* while it is stopped the descriptor may be quiet (the exception);
     * poll short, then release it: it must leave the descriptor readable */
    if (!cq_readable(cq, stalled ? 1 : (int)AE_WAIT_MS)) {
      cr_assert(stalled || l.got >= 2 * ST_PER, "quiet descriptor with %ld of %d delivered",
                l.got, 2 * ST_PER);
      quiet_while_stalled++;
    } else {
      long n = tko_cq_drain(cq, stall_fn, &l, 0);
      cr_assert_geq(n, 0);
    }
    if (stalled) cr_assert_eq(sem_post(&g_stall_sem), 0);
  }
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  cr_assert_eq(l.out_of_order, 0, "one poster's completions out of order");
  cr_assert_eq(l.got, 2 * ST_PER);
  cr_assert_eq(tko_cq_destroy(cq), 0);
  if (getenv("AE_VERBOSE"))
    fprintf(stderr, "stalls sent %ld taken %d, quiet polls while stalled %ld\n", stalls_sent,
            atomic_load(&g_stalls), quiet_while_stalled);
  alarm(0);
}

/* ============================================================================
 * 3'. shutdown steps: a timed-out DRAIN, then CANCEL, cancels what is queued
 * ========================================================================== */

static atomic_int g_sd_runs, g_sd_cancels;
static int sd_task(void *arg) {
  (void)arg;
  atomic_fetch_add(&g_sd_runs, 1);
  return 0;
}
static void sd_cancel(void *user, const tko_task_info *ti) {
  (void)user;
  (void)ti;
  atomic_fetch_add(&g_sd_cancels, 1);
}

Test(attack_edges, shutdown_timed_drain_then_cancel) {
  alarm(AE_ALARM_S);
  static tt_pin pin = TT_PIN_INIT;
  tko_pool *pool;
  tko_options o = tko_basic_options(1);
  o.max_batch = 1;
  o.hooks.on_cancel = sd_cancel;
  cr_assert_eq(tko_pool_create(&pool, &o), 0);
  cr_assert_eq(tko_submit(pool, tt_pin_fn, &pin, 0), 0);
  cr_assert(tt_count_wait_geq(&pin.started, 1));
  for (int i = 0; i < 50; i++) cr_assert_eq(tko_submit(pool, sd_task, NULL, 0), 0);
  for (int i = 0; i < 20; i++) cr_assert_eq(tko_submit_keyed(pool, (uint64_t)i % 4, sd_task, NULL, 0), 0);
  cr_assert_eq(tko_pool_shutdown_timed(pool, TKO_DRAIN, 0), -ETIMEDOUT);
  cr_assert_eq(tko_submit(pool, sd_task, NULL, 0), -ESHUTDOWN);
  cr_assert_eq(tko_pool_shutdown_timed(pool, TKO_CANCEL, 0), -ETIMEDOUT);
  cr_assert_eq(atomic_load(&g_sd_cancels), 70, "the CANCEL after a timed-out DRAIN cancelled %d of 70",
               atomic_load(&g_sd_cancels));
  cr_assert_eq(tko_pool_shutdown_timed(pool, TKO_CANCEL_NOWAIT, 0), 0);
  tt_gate_open(&pin.gate);
  cr_assert_eq(tko_pool_shutdown(pool, TKO_DRAIN), 0);
  cr_assert_eq(atomic_load(&g_sd_runs), 0);
  tko_stats s;
  tko_pool_stats(pool, &s);
  cr_assert_eq(s.submitted, 71);
  cr_assert_eq(s.completed, 1);
  cr_assert_eq(s.cancelled, 70);
  cr_assert_eq(tko_pool_destroy(pool), 0);
  alarm(0);
}

/* ============================================================================
 * 3''. coalescer marks racing close: flushed or rejected, never lost
 * ========================================================================== */

#define CO_KEYS 16
typedef struct co_race {
  tko_coalescer *co;
  atomic_ullong last_mark[2][CO_KEYS], last_flush[2][CO_KEYS];
  atomic_long rejected, accepted;
  atomic_int order_bad;
  atomic_int go;
} co_race;

static void co_flush(void *user, const tko_coalesce_entry *e, size_t n) {
  co_race *r = user;
  for (size_t i = 0; i < n; i++) {
    int th = (int)(e[i].key >> 32), k = (int)(e[i].key & 0xffffffffu);
    if (th > 1) continue; /* flush_fn's own mark */
    if (e[i].value < atomic_load(&r->last_flush[th][k])) atomic_fetch_add(&r->order_bad, 1);
    atomic_store(&r->last_flush[th][k], e[i].value);
  }
  /* a mark from flush_fn goes to the next sweep (or is refused once closed) */
  int rc = tko_coalescer_mark(r->co, ((uint64_t)1 << 40), 1);
  if (rc != 0 && rc != -ESHUTDOWN) atomic_fetch_add(&r->order_bad, 1000);
  if (tko_coalescer_flush(r->co) != -EDEADLK) atomic_fetch_add(&r->order_bad, 1000);
}

typedef struct co_arg {
  co_race *r;
  int th;
} co_arg;

static void *co_marker(void *arg) {
  co_arg *a = arg;
  co_race *r = a->r;
  atomic_fetch_add(&r->go, 1);
  for (uint64_t v = 1;; v++) {
    int k = (int)(v % CO_KEYS);
    int rc = tko_coalescer_mark(r->co, ((uint64_t)a->th << 32) | (uint64_t)k, v);
    if (rc == -ESHUTDOWN) {
      atomic_fetch_add(&r->rejected, 1);
      break;
    }
    cr_assert_eq(rc, 0);
    atomic_store(&r->last_mark[a->th][k], v);
    atomic_fetch_add(&r->accepted, 1);
  }
  return NULL;
}

Test(attack_edges, coalescer_marks_racing_close) {
  alarm(AE_ALARM_S);
  for (int round = 0; round < TT_SCALE(20, 5); round++) {
    static co_race r;
    memset(&r, 0, sizeof r);
    tko_pool *pool;
    tko_options o = tko_basic_options(2);
    cr_assert_eq(tko_pool_create(&pool, &o), 0);
    cr_assert_eq(tko_coalescer_create(&r.co, pool, (unsigned)(round % 2), co_flush, &r, NULL), 0);
    pthread_t th[2];
    co_arg a[2] = {{&r, 0}, {&r, 1}};
    for (int i = 0; i < 2; i++) cr_assert_eq(pthread_create(&th[i], NULL, co_marker, &a[i]), 0);
    while (atomic_load(&r.accepted) < 2000) sched_yield();
    if (round % 3 == 0) cr_assert_eq(tko_coalescer_flush(r.co), 0);
    if (round % 4 == 1) cr_assert_eq(tko_pool_shutdown(pool, TKO_CANCEL), 0);
    cr_assert_eq(tko_coalescer_close(r.co), 0);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    cr_assert_eq(tko_coalescer_mark(r.co, 1, 1), -ESHUTDOWN);
    tko_coalesce_stats cs;
    tko_coalescer_stats(r.co, &cs);
    cr_assert_eq(cs.dirty, 0);
    cr_assert_eq(tko_coalescer_destroy(r.co), 0);
    cr_assert_eq(tko_pool_destroy(pool), 0);
    cr_assert_eq(atomic_load(&r.order_bad), 0);
    for (int t = 0; t < 2; t++)
      for (int k = 0; k < CO_KEYS; k++)
        cr_assert_eq(atomic_load(&r.last_flush[t][k]), atomic_load(&r.last_mark[t][k]),
                     "round %d key %d/%d: flushed %llu, marked %llu", round, t, k,
                     (unsigned long long)atomic_load(&r.last_flush[t][k]),
                     (unsigned long long)atomic_load(&r.last_mark[t][k]));
  }
  alarm(0);
}

/* A lane submit from a task CALLER_RUNS runs on the submitter (a plain or
 * a keyed task) is a submit from a pool task: it may not wait for room, so
 * it drains its lane on the spot, B included, in order and exclusion
 * (lanes.h states it). */
Test(attack_edges, caller_runs_lane_submit_nested_in_plain_task) {
  alarm(AE_ALARM_S);
  cr_own_scene(32, false, CR_IN_PLAIN);
}

Test(attack_edges, caller_runs_lane_submit_nested_in_keyed_task) {
  alarm(AE_ALARM_S);
  cr_own_scene(32, false, CR_IN_KEYED);
}

/* The lane visit a CALLER_RUNS tko_lanes_submit runs on the submitter
 * runs inside the pool's run of its runner, so the pool counts it running:
 * stats.running includes it, tko_pool_wait_idle from the lane task is
 * -EDEADLK, and the pool is never idle while it runs (before the fix it
 * ran after the runner had returned). */
Test(attack_edges, caller_runs_lane_visit_counts_as_running) {
  alarm(AE_ALARM_S);
  g_cr_check_running = true;
  cr_own_scene(32, true, CR_DIRECT);
  alarm(0);
}
