/* SPDX-License-Identifier: MIT */
/* Allocation failure, through the allocator option: a counting allocator
 * (tko_test_fault.h) fails exactly the Nth call, for every N that a
 * scenario reaches, in pool create, queue growth (single submits, group
 * submits and batches into a 16-slot queue), the timer heap, async record
 * chunks, lane tables and rings (also tko_submit_keyed's default table),
 * and the coalescer's dirty tables. Each
 * time: the failing call returns -ENOMEM (or succeeds, if the failure hit a
 * path that retries), the pool stays usable, every accepted task runs or is
 * cancelled exactly once and no refused task ever runs (tokens), and every
 * block is freed (the allocator's live count; ASan's LeakSanitizer checks
 * the rest in the address build).
 *
 * How the scenarios stay deterministic: the pool's one worker is pinned in a
 * task while the test submits, so only the submitting thread allocates and
 * the Nth call is the same call in every run. A reference run without
 * failures counts the calls, and the loop then fails each of them in turn.
 *
 * Two failures that were bugs in the core (a big batch losing a task, tasks
 * stuck in the inbox while allocations keep failing) are regression tests
 * now; their comments say what went wrong. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
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
#include "tko_test_sync.h"

/* ---- helpers ---------------------------------------------------------------- */

/* With -DTKO_FAULTS_VERBOSE each scenario says how many allocation calls
 * its reference run made, i.e. how many failure points the loop covers. */
static void note_calls(const char *what, long calls) {
#ifdef TKO_FAULTS_VERBOSE
  fprintf(stderr, "faults: %s: %ld allocation calls, each failed in turn\n", what, calls);
#else
  (void)what;
  (void)calls;
#endif
}

/* Weights that make the queue create buckets and rebuild its weight table,
 * the extremes of int included. */
static int weight_of(size_t i) {
  switch (i % 41) {
    case 0: return INT_MAX;
    case 1: return INT_MIN;
    default: return (int)(i % 37) - 18;
  }
}

/* One worker, a 16-slot queue, every allocation through f, and the given
 * on_cancel hook. */
static tko_pool *faulty_pool(tfa *f, void (*on_cancel)(void *, const tko_task_info *)) {
  tko_options o = tko_basic_options(1);
  o.initial_capacity = 16;
  o.allocator = &f->al;
  o.hooks.on_cancel = on_cancel;
  tko_pool *p = NULL;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  return p;
}

/* faulty_pool with its worker pinned by `pn` (pinned_pool: the one that
 * counts tokens). */
static tko_pool *pinned_pool_cancelling(tfa *f, tt_pin *pn,
                                        void (*on_cancel)(void *, const tko_task_info *)) {
  tko_pool *p = faulty_pool(f, on_cancel);
  cr_assert_eq(tko_submit(p, tt_pin_fn, pn, 0), 0);
  cr_assert(tt_count_wait_geq(&pn->started, 1));
  return p;
}

static tko_pool *pinned_pool(tfa *f, tt_pin *pn) {
  return pinned_pool_cancelling(f, pn, tft_on_cancel);
}

/* Releases the pinned worker, then drains or cancels; checks the stats add
 * up and frees the pool. `extra` tasks were submitted besides the tokens. */
static void finish_pool(tko_pool *p, tt_pin *pn, bool cancel) {
  tt_gate_open(&pn->gate);
  if (cancel) cr_assert_eq(tko_pool_shutdown(p, TKO_CANCEL), 0);
  else cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0, "an accepted task was lost");
  tko_stats s;
  tko_pool_stats(p, &s);
  cr_assert_eq(s.completed + s.cancelled, s.submitted);
  cr_assert_eq(s.queued, 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

static void check_tokens(tft_token *t, size_t n, const char *what, long nth) {
  long bad = tft_first_bad(t, n);
  cr_assert_eq(bad, -1, "%s, failing call %ld: token %ld accepted=%d ran %d cancelled %d", what,
               nth, bad, bad >= 0 ? t[bad].accepted : 0, bad >= 0 ? atomic_load(&t[bad].runs) : 0,
               bad >= 0 ? atomic_load(&t[bad].cancels) : 0);
}

/* ---- create ------------------------------------------------------------------ */

/* Fails each allocation of create in turn, for several option sets. */
static void create_fails_cleanly(tko_options o, const char *what) {
  /* A first pool, so that threads a runtime starts lazily (ThreadSanitizer's
   * background thread) are in the baseline. */
  tko_pool *warm;
  tko_options wo = tko_basic_options(1);
  cr_assert_eq(tko_pool_create(&warm, &wo), 0);
  cr_assert_eq(tko_pool_destroy(warm), 0);
  int baseline = tt_thread_count();
  tfa f;
  tfa_init(&f);
  o.allocator = &f.al;
  o.hooks.on_cancel = tft_on_cancel;
  bool created = false;
  for (long nth = 1; nth < 200 && !created; nth++) {
    tfa_fail_nth(&f, nth);
    tko_pool *p = NULL;
    int rc = tko_pool_create(&p, &o);
    if (rc == 0) {
      cr_assert_eq(atomic_load(&f.failures), 0, "%s: call %ld failed, create said 0", what, nth);
      created = true;
      tfa_heal(&f);
      tft_token t[8];
      memset(t, 0, sizeof t);
      for (int i = 0; i < 8; i++) {
        cr_assert_eq(tko_submit(p, tft_run, &t[i], i), 0);
        t[i].accepted = true;
      }
      cr_assert_eq(tko_pool_destroy(p), 0);
      check_tokens(t, 8, what, nth);
    } else {
      cr_assert_eq(rc, -ENOMEM, "%s, failing call %ld: rc %d", what, nth, rc);
      cr_assert_null(p);
    }
    cr_assert_eq(atomic_load(&f.live), 0, "%s, failing call %ld: blocks leaked", what, nth);
    cr_assert_leq(tt_wait_thread_count_leq(baseline), baseline, "%s: threads left", what);
  }
  cr_assert(created, "%s: create never succeeded", what);
}

Test(faults, create_fails_cleanly_at_every_allocation) {
  create_fails_cleanly(tko_basic_options(2), "basic");
  tko_options e = tko_elastic_options(1, 3, 10);
  e.aging_ms = 5;
  e.max_async_inflight = 2;
  e.initial_capacity = 4096;
  create_fails_cleanly(e, "elastic");
  tko_options z = tko_elastic_options(0, 2, 10);
  z.queue_capacity = 64;
  z.full_policy = TKO_FULL_REJECT;
  z.name = "faults-pool-name";
  create_fails_cleanly(z, "elastic-only bounded");
}

/* ---- queue growth: single submits and group submits -------------------------- */

#define NTOK 1500

typedef enum { VIA_SUBMIT, VIA_GROUP } via_t;

/* NTOK submits into the pinned pool while the allocator fails call `nth`
 * from the start of the submits (0 = none), then drain or cancel. Returns
 * the allocator calls the submits made. */
static long submit_scenario(long nth, via_t via, bool cancel) {
  static tft_token tok[NTOK];
  memset(tok, 0, sizeof tok);
  tfa f;
  tfa_init(&f);
  tt_pin pn = TT_PIN_INIT;
  tko_pool *p = pinned_pool(&f, &pn);
  tko_group g;
  cr_assert_eq(tko_group_init(&g), 0);
  long before = atomic_load(&f.calls);
  if (nth) tfa_fail_nth(&f, nth);
  long refused = 0, accepted = 0;
  for (size_t i = 0; i < NTOK; i++) {
    int w = weight_of(i);
    int rc = via == VIA_GROUP ? tko_group_submit(p, &g, tft_run, &tok[i], w)
                              : tko_submit(p, tft_run, &tok[i], w);
    if (rc == 0) {
      tok[i].accepted = true;
      accepted++;
    } else {
      cr_assert_eq(rc, -ENOMEM, "failing call %ld: submit %zu rc %d", nth, i, rc);
      refused++;
    }
  }
  long calls = atomic_load(&f.calls) - before;
  /* A failed allocation fails at most the submit that made it. */
  cr_assert_leq(refused, atomic_load(&f.failures));
  if (via == VIA_GROUP) cr_assert_eq(tko_group_pending(&g), (uint64_t)accepted);
  tko_stats s;
  tko_pool_stats(p, &s);
  cr_assert_eq(s.submitted, (uint64_t)accepted + 1, "refused submits were counted");
  /* The pool is still usable: one more submit goes through. */
  tfa_heal(&f);
  static tft_token extra;
  memset(&extra, 0, sizeof extra);
  cr_assert_eq(tko_submit(p, tft_run, &extra, 0), 0);
  extra.accepted = true;
  if (nth) tfa_fail_nth(&f, 1); /* and the worker's own first drain fails too */
  finish_pool(p, &pn, cancel);
  if (via == VIA_GROUP) {
    cr_assert_eq(tko_group_wait(&g, TT_LONG_MS), 0);
    cr_assert_eq(tko_group_pending(&g), 0);
    int st = tko_group_status(&g);
    cr_assert(st == 0 || (cancel && st == -ECANCELED), "group status %d", st);
  }
  cr_assert_eq(tko_group_destroy(&g), 0);
  check_tokens(tok, NTOK, via == VIA_GROUP ? "group submit" : "submit", nth);
  check_tokens(&extra, 1, "extra submit", nth);
  cr_assert_eq(atomic_load(&f.live), 0, "failing call %ld: blocks leaked", nth);
  return calls;
}

Test(faults, queue_growth_fails_cleanly_at_every_allocation) {
  long calls = submit_scenario(0, VIA_SUBMIT, false);
  note_calls("queue growth", calls);
  cr_assert_gt(calls, 2, "the scenario should make the queue grow");
  for (long nth = 1; nth <= calls + 1; nth++) submit_scenario(nth, VIA_SUBMIT, nth % 2 == 0);
}

Test(faults, group_submit_fails_cleanly_at_every_allocation) {
  long calls = submit_scenario(0, VIA_GROUP, false);
  note_calls("group submit", calls);
  cr_assert_gt(calls, 2);
  for (long nth = 1; nth <= calls + 1; nth++) submit_scenario(nth, VIA_GROUP, nth % 2 == 1);
}

/* ---- batches ------------------------------------------------------------------ */

#define NPREFILL 100

/* Optionally NPREFILL single submits (they wait in the inbox: no
 * allocation), then one batch per size, while call `nth` fails. Each batch
 * is all or nothing. Returns the calls the batches made. */
static long batch_scenario(long nth, bool prefill, const size_t *sizes, size_t nsizes) {
  size_t total = NPREFILL;
  for (size_t i = 0; i < nsizes; i++) total += sizes[i];
  tft_token *tok = calloc(total, sizeof *tok);
  tko_task *tasks = calloc(total, sizeof *tasks);
  cr_assert(tok && tasks);
  tfa f;
  tfa_init(&f);
  tt_pin pn = TT_PIN_INIT;
  tko_pool *p = pinned_pool(&f, &pn);
  size_t next = 0;
  if (prefill) {
    for (; next < NPREFILL; next++) {
      cr_assert_eq(tko_submit(p, tft_run, &tok[next], weight_of(next)), 0);
      tok[next].accepted = true;
    }
  }
  long before = atomic_load(&f.calls);
  if (nth) tfa_fail_nth(&f, nth);
  for (size_t b = 0; b < nsizes; b++) {
    for (size_t i = 0; i < sizes[b]; i++)
      tasks[i] = (tko_task){tft_run, &tok[next + i], weight_of(next + i)};
    int rc = tko_submit_batch(p, tasks, sizes[b]);
    if (rc == 0) {
      for (size_t i = 0; i < sizes[b]; i++) tok[next + i].accepted = true;
    } else {
      cr_assert_eq(rc, -ENOMEM, "failing call %ld: batch of %zu rc %d", nth, sizes[b], rc);
    }
    next += sizes[b];
  }
  long calls = atomic_load(&f.calls) - before;
  finish_pool(p, &pn, false);
  check_tokens(tok, next, "batch", nth);
  cr_assert_eq(atomic_load(&f.live), 0, "failing call %ld: blocks leaked", nth);
  free(tok);
  free(tasks);
  return calls;
}

static void batch_every_failure(bool prefill, const size_t *sizes, size_t nsizes) {
  long calls = batch_scenario(0, prefill, sizes, nsizes);
  note_calls(prefill ? "batches behind queued tasks" : "big batches", calls);
  cr_assert_gt(calls, 2);
  for (long nth = 1; nth <= calls + 1; nth++) batch_scenario(nth, prefill, sizes, nsizes);
}

Test(faults, batch_is_all_or_nothing_at_every_allocation) {
  /* Through the inbox (up to 1024 tasks), behind tasks already waiting. */
  static const size_t small[] = {1, 7, 300, 1024};
  batch_every_failure(true, small, 4);
  /* Larger than the inbox: straight into the queue, inbox empty. */
  static const size_t big[] = {1500, 2100};
  batch_every_failure(false, big, 2);
}

/* Regression, fixed in 8f0737a. It was: a batch larger than the inbox (submit_big_batch in
 * submit.c) reserves queue room for its n tasks, then drains the inbox into the queue - which uses
 * up that room - and then pushes its tasks ignoring tko__queue_push's result ("cannot fail:
 * reserved above"). When the push has to grow the queue and that allocation fails, the task is
 * dropped while the batch returns 0: with 100 tasks waiting in the inbox and a 2048-task batch,
 * failing the 5th allocation loses one task (ran 2147 of 2148) and wait_idle never returns 0. Fix:
 * reserve n + (inbox tail - head) items and buckets before draining, or drain first and reserve
 * after. */
Test(faults, big_batch_behind_queued_tasks_loses_no_task) {
  static const size_t sizes[] = {2048};
  batch_every_failure(true, sizes, 1);
}

/* ---- persistent allocation failure --------------------------------------------- */

/* Regression, fixed in 8f0737a. It was: tko__inbox_drain moves tasks from the inbox into the queue
 * all or nothing (tko__queue_reserve for tail - head). If the queue cannot grow to hold every task
 * waiting in the inbox, nothing moves, even though the queue has free slots: with a 16-slot queue
 * and 1024 tasks accepted into the inbox, none of them ever runs while allocations keep failing,
 * the worker spins at full speed (take_batch finds nothing, spin_for_work sees the inbox pending),
 * and wait_idle, shutdown and destroy never return. Memory that never comes back is an extreme, but
 * accepted tasks should not depend on new memory: drain min(tail - head, free slots) when growing
 * fails, and let the worker sleep when it could move nothing. */
Test(faults, accepted_tasks_run_while_allocations_keep_failing) {
  static tft_token tok[2000];
  memset(tok, 0, sizeof tok);
  tfa f;
  tfa_init(&f);
  tt_pin pn = TT_PIN_INIT;
  tko_pool *p = pinned_pool(&f, &pn);
  tfa_fail_from(&f, 1);
  size_t n = 0;
  int rc = 0;
  for (; n < 2000 && rc == 0; n++) {
    rc = tko_submit(p, tft_run, &tok[n], 0);
    tok[n].accepted = rc == 0;
  }
  cr_assert_eq(rc, -ENOMEM);
  tt_gate_open(&pn.gate);
  /* Still failing: the accepted tasks fit the queue 16 at a time. */
  cr_assert_eq(tko_pool_wait_idle(p, 10000), 0, "accepted tasks stuck in the inbox");
  tfa_heal(&f);
  cr_assert_eq(tko_pool_destroy(p), 0);
  check_tokens(tok, n, "persistent failure", 0);
}

/* With allocation failing for a while and then recovering, every task that
 * was accepted meanwhile runs once memory is back, and shutdown returns. */
Test(faults, accepted_tasks_run_once_allocations_recover) {
  static tft_token tok[3000];
  memset(tok, 0, sizeof tok);
  tfa f;
  tfa_init(&f);
  tt_pin pn = TT_PIN_INIT;
  tko_pool *p = pinned_pool(&f, &pn);
  tfa_fail_from(&f, 1);
  size_t n = 0;
  long refused = 0;
  for (; n < 3000; n++) {
    int rc = tko_submit(p, tft_run, &tok[n], weight_of(n));
    tok[n].accepted = rc == 0;
    if (rc) {
      cr_assert_eq(rc, -ENOMEM);
      refused++;
    }
  }
  cr_assert_gt(refused, 0);
  tfa_heal(&f);
  finish_pool(p, &pn, false);
  check_tokens(tok, n, "recovery", 0);
  cr_assert_eq(atomic_load(&f.live), 0);
}

/* ---- concurrent submitters, elastic workers, random failures -------------------- */

typedef struct load {
  tko_pool *pool;
  tft_token *tok;
  size_t from, to;
  atomic_long refused, bad_rc; /* checked by the test's thread */
} load;

static void *load_main(void *arg) {
  load *l = arg;
  uint64_t seed = 0x9e3779b97f4a7c15ull ^ l->from;
  for (size_t i = l->from; i < l->to;) {
    uint64_t r = tt_rand(&seed);
    if (r % 8 == 0 && l->to - i >= 8) { /* a batch of 8 now and then */
      tko_task t[8];
      for (int k = 0; k < 8; k++) t[k] = (tko_task){tft_run, &l->tok[i + k], weight_of(i + k)};
      int rc = tko_submit_batch(l->pool, t, 8);
      for (int k = 0; k < 8; k++) l->tok[i + k].accepted = rc == 0;
      if (rc) atomic_fetch_add(&l->refused, 1);
      if (rc && rc != -ENOMEM) atomic_store(&l->bad_rc, rc);
      i += 8;
      continue;
    }
    int rc = tko_submit(l->pool, tft_run, &l->tok[i], (int)(r % 997) - 498);
    l->tok[i].accepted = rc == 0;
    if (rc) atomic_fetch_add(&l->refused, 1);
    if (rc && rc != -ENOMEM) atomic_store(&l->bad_rc, rc);
    i++;
  }
  return NULL;
}

/* Two producers and up to three elastic workers growing and retiring while
 * one allocation in five fails: whatever was accepted runs exactly once. */
Test(faults, random_failures_with_concurrent_producers_and_elastic_workers) {
  size_t ntok = TT_SCALE(60000, 12000);
  tft_token *tok = calloc(ntok, sizeof *tok);
  cr_assert_not_null(tok);
  tfa f;
  tfa_init(&f);
  tko_options o = tko_elastic_options(1, 3, 2);
  o.initial_capacity = 16;
  o.allocator = &f.al;
  o.hooks.on_cancel = tft_on_cancel;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  for (int round = 0; round < 3; round++) {
    size_t lo = ntok * (size_t)round / 3, hi = ntok * (size_t)(round + 1) / 3, mid = (lo + hi) / 2;
    tfa_fail_every(&f, 5);
    load a = {p, tok, lo, mid, 0, 0}, b = {p, tok, mid, hi, 0, 0};
    pthread_t ta, tb;
    cr_assert_eq(pthread_create(&ta, NULL, load_main, &a), 0);
    cr_assert_eq(pthread_create(&tb, NULL, load_main, &b), 0);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    cr_assert_eq(atomic_load(&a.bad_rc), 0);
    cr_assert_eq(atomic_load(&b.bad_rc), 0);
    tfa_heal(&f);
    cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  }
  tko_stats s;
  tko_pool_stats(p, &s);
  cr_assert_eq(s.completed + s.cancelled, s.submitted);
  cr_assert_leq(s.elastic_peak, 3);
  cr_assert_eq(tko_pool_destroy(p), 0);
  check_tokens(tok, ntok, "random failures", 0);
  long acc, runs, cancels;
  tft_counts(tok, ntok, &acc, &runs, &cancels);
  cr_assert_eq((uint64_t)acc, s.submitted);
  cr_assert_eq(atomic_load(&f.live), 0);
  free(tok);
}

/* ---- timer heap ------------------------------------------------------------------ */

#define NTIMERS 200

typedef struct timer_case {
  tko_timer timer[NTIMERS];
  tft_token tok[NTIMERS];
  int arm_rc[NTIMERS];
  int cancel_rc[NTIMERS];
} timer_case;

/* Arms NTIMERS far-off timers (the heap grows 16, 32, ... 256) while call
 * `nth` fails; cancels every other one; shutdown hands the rest to
 * on_cancel. Returns the calls the arming made. */
static long timer_scenario(long nth) {
  static timer_case tc;
  memset(&tc, 0, sizeof tc);
  tfa f;
  tfa_init(&f);
  tko_options o = tko_basic_options(1);
  o.allocator = &f.al;
  o.hooks.on_cancel = tft_on_cancel;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  long before = atomic_load(&f.calls);
  if (nth) tfa_fail_nth(&f, nth);
  for (int i = 0; i < NTIMERS; i++) {
    tko_timer_init(&tc.timer[i]);
    tc.arm_rc[i] = i % 3 ? tko_submit_after(p, &tc.timer[i], 3600000, tft_run, &tc.tok[i], 0)
                         : tko_submit_every(p, &tc.timer[i], 3600000, tft_run, &tc.tok[i], 0);
    cr_assert(tc.arm_rc[i] == 0 || tc.arm_rc[i] == -ENOMEM, "timer %d: rc %d", i, tc.arm_rc[i]);
    tc.tok[i].accepted = tc.arm_rc[i] == 0;
  }
  long calls = atomic_load(&f.calls) - before;
  tfa_heal(&f);
  for (int i = 0; i < NTIMERS; i += 2) {
    tc.cancel_rc[i] = tko_timer_cancel(&tc.timer[i]);
    cr_assert_eq(tc.cancel_rc[i], tc.arm_rc[i] == 0 ? 0 : -ENOENT, "timer %d", i);
    if (tc.cancel_rc[i] == 0) atomic_fetch_add(&tc.tok[i].cancels, 1);
  }
  /* A refused timer can be armed again: this one fires at once. */
  static tft_token now_tok;
  memset(&now_tok, 0, sizeof now_tok);
  tko_timer now_timer;
  tko_timer_init(&now_timer);
  for (int i = 0; i < NTIMERS; i++) {
    if (tc.arm_rc[i]) {
      cr_assert_eq(tko_submit_after(p, &tc.timer[i], 0, tft_run, &now_tok, 0), 0);
      now_tok.accepted = true;
      break;
    }
  }
  if (!now_tok.accepted) {
    cr_assert_eq(tko_submit_after(p, &now_timer, 0, tft_run, &now_tok, 0), 0);
    now_tok.accepted = true;
  }
  cr_assert_eq(tko_pool_destroy(p), 0); /* the far-off timers go to on_cancel */
  check_tokens(tc.tok, NTIMERS, "timers", nth);
  /* The timer armed with delay 0 either fired or, if shutdown came first,
   * was handed to on_cancel. */
  check_tokens(&now_tok, 1, "timer re-armed after a failure", nth);
  cr_assert_eq(atomic_load(&f.live), 0, "failing call %ld: blocks leaked", nth);
  return calls;
}

Test(faults, timer_heap_growth_fails_cleanly_at_every_allocation) {
  long calls = timer_scenario(0);
  note_calls("timer heap", calls);
  cr_assert_geq(calls, 4, "the heap should grow several times");
  for (long nth = 1; nth <= calls + 1; nth++) timer_scenario(nth);
}

/* ---- async record chunks ---------------------------------------------------------- */

#define NASYNC 200

typedef struct async_case {
  pthread_mutex_t mu; /* protects ops and nops */
  tko_async *ops[NASYNC];
  size_t nops;
  tft_token tok[NASYNC];
  tt_count marker;
} async_case;

static async_case ac = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* Starts and holds: the record stays in flight until the test completes it. */
static int hold_async(tko_async *op, void *arg) {
  atomic_fetch_add(&((tft_token *)arg)->runs, 1);
  pthread_mutex_lock(&ac.mu);
  ac.ops[ac.nops++] = op;
  pthread_mutex_unlock(&ac.mu);
  return 0;
}

static int marker_fn(void *arg) {
  tt_count_add(arg, 1);
  return 0;
}

/* NASYNC async group members held in flight at once (records come 64 to a
 * chunk), while call `nth` fails: a member whose record could not be
 * allocated cannot start - its fn never runs, it goes to on_cancel (the
 * host's argument comes back exactly once), counts as cancelled, and the
 * group's status is -ECANCELED. Returns the calls made. */
static long async_scenario(long nth) {
  pthread_mutex_lock(&ac.mu);
  memset(ac.ops, 0, sizeof ac.ops);
  ac.nops = 0;
  pthread_mutex_unlock(&ac.mu);
  memset(ac.tok, 0, sizeof ac.tok);
  tt_count_init(&ac.marker);
  tfa f;
  tfa_init(&f);
  tko_options o = tko_basic_options(1);
  o.initial_capacity = 1024; /* no queue growth: only records allocate */
  o.allocator = &f.al;
  o.hooks.on_cancel = tft_on_cancel;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  tt_pin pn = TT_PIN_INIT;
  cr_assert_eq(tko_submit(p, tt_pin_fn, &pn, 0), 0);
  cr_assert(tt_count_wait_geq(&pn.started, 1));
  tko_group g;
  cr_assert_eq(tko_group_init(&g), 0);
  for (int i = 0; i < NASYNC; i++) {
    cr_assert_eq(tko_group_submit_async(p, &g, hold_async, &ac.tok[i], 1), 0);
    ac.tok[i].accepted = true;
  }
  /* The marker has a lower weight: once it runs, every member has started. */
  cr_assert_eq(tko_submit(p, marker_fn, &ac.marker, 0), 0);
  long before = atomic_load(&f.calls);
  if (nth) tfa_fail_nth(&f, nth);
  tt_gate_open(&pn.gate);
  cr_assert(tt_count_wait_geq(&ac.marker, 1));
  long calls = atomic_load(&f.calls) - before;
  tfa_heal(&f);
  pthread_mutex_lock(&ac.mu);
  size_t held = ac.nops;
  pthread_mutex_unlock(&ac.mu);
  long not_started = NASYNC - (long)held;
  cr_assert_leq(not_started, atomic_load(&f.failures), "failing call %ld", nth);
  tko_stats s;
  tko_pool_stats(p, &s);
  cr_assert_eq(s.cancelled, (uint64_t)not_started, "a task that could not start is cancelled");
  cr_assert_eq(s.failed, 0u);
  cr_assert_eq(s.async_inflight, held);
  cr_assert_eq(tko_group_pending(&g), held);
  for (size_t i = 0; i < held; i++) cr_assert_eq(tko_async_complete(ac.ops[i], 0), 0);
  cr_assert_eq(tko_group_wait(&g, TT_LONG_MS), 0);
  cr_assert_eq(tko_group_status(&g), not_started ? -ECANCELED : 0);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  tko_pool_stats(p, &s);
  cr_assert_eq(s.completed + s.cancelled, s.submitted);
  /* The pool is still usable for async tasks. */
  pthread_mutex_lock(&ac.mu);
  ac.nops = 0;
  pthread_mutex_unlock(&ac.mu);
  static tft_token again;
  memset(&again, 0, sizeof again);
  cr_assert_eq(tko_submit_async(p, hold_async, &again, 0), 0);
  again.accepted = true;
  /* Its start is in flight by the time the pool is idle except for it. */
  cr_assert_eq(tko_submit(p, marker_fn, &ac.marker, -1), 0);
  cr_assert(tt_count_wait_geq(&ac.marker, 2));
  pthread_mutex_lock(&ac.mu);
  cr_assert_eq(ac.nops, 1);
  tko_async *op = ac.ops[0];
  pthread_mutex_unlock(&ac.mu);
  cr_assert_eq(tko_async_complete(op, 0), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
  cr_assert_eq(tko_group_destroy(&g), 0);
  check_tokens(ac.tok, NASYNC, "async records", nth);
  check_tokens(&again, 1, "async after failure", nth);
  cr_assert_eq(atomic_load(&f.live), 0, "failing call %ld: blocks leaked", nth);
  tt_count_fini(&ac.marker);
  return calls;
}

Test(faults, async_record_chunks_fail_cleanly_at_every_allocation) {
  long calls = async_scenario(0);
  note_calls("async records", calls);
  cr_assert_geq(calls, 4, "200 records in flight need four chunks");
  for (long nth = 1; nth <= calls + 1; nth++) async_scenario(nth);
}

/* ---- lanes ------------------------------------------------------------------------- */

static void lane_cancel_token(void *user, const tko_lane_task *t) {
  (void)user;
  atomic_fetch_add(&((tft_token *)t->arg)->cancels, 1);
}

/* The pool's on_cancel: lane runners hand their lane to the lanes'. */
static void pool_cancel_lanes(void *user, const tko_task_info *t) {
  if (tko_lanes_pool_cancelled(t)) return;
  tft_on_cancel(user, t);
}

static tko_lane_options lane_opts(tfa *f) {
  tko_lane_options lo = tko_lane_default_options();
  lo.lanes = 8;
  lo.lane_capacity = 2; /* rings grow 2, 4, 8, ... */
  lo.max_drain = 4;
  lo.on_cancel = lane_cancel_token;
  lo.allocator = &f->al;
  return lo;
}

Test(faults, lanes_create_fails_cleanly_at_every_allocation) {
  tfa f;
  tfa_init(&f);
  tko_pool *p;
  tko_options o = tko_basic_options(1);
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  tko_lane_options lo = lane_opts(&f);
  bool created = false;
  for (long nth = 1; nth < 50 && !created; nth++) {
    tfa_fail_nth(&f, nth);
    tko_lanes *l = NULL;
    int rc = tko_lanes_create(&l, p, &lo);
    if (rc == 0) {
      created = true;
      cr_assert_eq(atomic_load(&f.failures), 0);
      cr_assert_eq(tko_lanes_destroy(l), 0);
    } else {
      cr_assert_eq(rc, -ENOMEM);
      cr_assert_null(l);
    }
    cr_assert_eq(atomic_load(&f.live), 0, "failing call %ld: blocks leaked", nth);
  }
  cr_assert(created);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

#define NLANE_TOK 600

/* Lane submits on 13 keys (8 lanes) while call `nth` fails: rings and
 * scratch arrays grow in the lanes' allocator, runners queue in the pinned
 * pool's 16-slot queue (same allocator). */
static long lanes_scenario(long nth, bool cancel) {
  static tft_token tok[NLANE_TOK];
  memset(tok, 0, sizeof tok);
  tfa f;
  tfa_init(&f);
  tt_pin pn = TT_PIN_INIT;
  tko_pool *p = pinned_pool_cancelling(&f, &pn, pool_cancel_lanes);
  tko_lane_options lo = lane_opts(&f);
  tko_lanes *l;
  cr_assert_eq(tko_lanes_create(&l, p, &lo), 0);
  long before = atomic_load(&f.calls);
  if (nth) tfa_fail_nth(&f, nth);
  long accepted = 0;
  for (size_t i = 0; i < NLANE_TOK; i++) {
    int rc = tko_lanes_submit(l, i % 13, tft_run, &tok[i], weight_of(i));
    if (rc == 0) {
      tok[i].accepted = true;
      accepted++;
    } else {
      cr_assert_eq(rc, -ENOMEM, "failing call %ld: lane submit %zu rc %d", nth, i, rc);
    }
  }
  long calls = atomic_load(&f.calls) - before;
  tko_lane_stats ls;
  tko_lanes_stats(l, &ls);
  cr_assert_eq(ls.submitted, (uint64_t)accepted);
  tt_gate_open(&pn.gate);
  if (cancel) {
    cr_assert_eq(tko_lanes_cancel(l), 0);
  }
  cr_assert_eq(tko_lanes_wait_idle(l, TT_LONG_MS), 0);
  tko_lanes_stats(l, &ls);
  cr_assert_eq(ls.completed + ls.cancelled, (uint64_t)accepted);
  cr_assert_eq(tko_lanes_destroy(l), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
  check_tokens(tok, NLANE_TOK, "lanes", nth);
  cr_assert_eq(atomic_load(&f.live), 0, "failing call %ld: blocks leaked", nth);
  return calls;
}

Test(faults, lane_rings_fail_cleanly_at_every_allocation) {
  long calls = lanes_scenario(0, false);
  note_calls("lane rings", calls);
  cr_assert_gt(calls, 8);
  for (long nth = 1; nth <= calls + 1; nth++) lanes_scenario(nth, nth % 3 == 0);
}

#define NKEYED_TOK 400

/* tko_submit_keyed on 13 keys while call `nth` fails: the pool's default
 * lane table is made on the first keyed submit (a failure there must leave
 * no table behind, and the next submit tries again), then its rings grow,
 * all in the pool's allocator. Cancelled keyed tasks reach the pool's
 * on_cancel with their own argument. */
static long keyed_scenario(long nth, bool cancel) {
  static tft_token tok[NKEYED_TOK];
  memset(tok, 0, sizeof tok);
  tfa f;
  tfa_init(&f);
  tt_pin pn = TT_PIN_INIT;
  tko_pool *p = pinned_pool(&f, &pn);
  long before = atomic_load(&f.calls);
  if (nth) tfa_fail_nth(&f, nth);
  for (size_t i = 0; i < NKEYED_TOK; i++) {
    int rc = tko_submit_keyed(p, i % 13, tft_run, &tok[i], weight_of(i));
    if (rc == 0) tok[i].accepted = true;
    else cr_assert_eq(rc, -ENOMEM, "failing call %ld: keyed submit %zu rc %d", nth, i, rc);
  }
  long calls = atomic_load(&f.calls) - before;
  tt_gate_open(&pn.gate);
  if (cancel) cr_assert_eq(tko_pool_shutdown(p, TKO_CANCEL), 0);
  else cr_assert_eq(tko_pool_shutdown(p, TKO_DRAIN), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
  check_tokens(tok, NKEYED_TOK, "keyed", nth);
  cr_assert_eq(atomic_load(&f.live), 0, "failing call %ld: blocks leaked", nth);
  return calls;
}

Test(faults, submit_keyed_fails_cleanly_at_every_allocation) {
  long calls = keyed_scenario(0, false);
  note_calls("tko_submit_keyed", calls);
  cr_assert_gt(calls, 2);
  for (long nth = 1; nth <= calls + 1; nth++) keyed_scenario(nth, nth % 3 == 0);
}

/* ---- coalescer ------------------------------------------------------------------------ */

#define NKEYS 200

typedef struct flushed {
  uint64_t value[NKEYS];
  int times[NKEYS];
} flushed;

static void record_flush(void *user, const tko_coalesce_entry *e, size_t n) {
  flushed *fl = user;
  for (size_t i = 0; i < n; i++) {
    if (e[i].key >= NKEYS) continue;
    fl->value[e[i].key] = e[i].value;
    fl->times[e[i].key]++;
  }
}

Test(faults, coalescer_create_fails_cleanly_at_every_allocation) {
  tfa f;
  tfa_init(&f);
  tko_pool *p;
  tko_options o = tko_basic_options(1);
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  tko_coalesce_options co = {.initial_keys = 4, .allocator = &f.al};
  flushed fl;
  bool created = false;
  for (long nth = 1; nth < 50 && !created; nth++) {
    tfa_fail_nth(&f, nth);
    tko_coalescer *c = NULL;
    int rc = tko_coalescer_create(&c, p, 0, record_flush, &fl, &co);
    if (rc == 0) {
      created = true;
      cr_assert_eq(atomic_load(&f.failures), 0);
      cr_assert_eq(tko_coalescer_destroy(c), 0);
    } else {
      cr_assert_eq(rc, -ENOMEM);
      cr_assert_null(c);
    }
    cr_assert_eq(atomic_load(&f.live), 0, "failing call %ld: blocks leaked", nth);
  }
  cr_assert(created);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* Marks 200 keys three rounds over (the table grows 4, 8, ... 256) while
 * call `nth` fails: a refused mark is not recorded, an accepted one is
 * flushed once with its key's last accepted value. */
static long coalescer_scenario(long nth) {
  tfa f;
  tfa_init(&f);
  tko_pool *p;
  tko_options o = tko_basic_options(1);
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  static flushed fl;
  memset(&fl, 0, sizeof fl);
  tko_coalesce_options co = {.initial_keys = 4, .allocator = &f.al};
  tko_coalescer *c;
  cr_assert_eq(tko_coalescer_create(&c, p, 0, record_flush, &fl, &co), 0);
  uint64_t last[NKEYS];
  bool any[NKEYS];
  memset(any, 0, sizeof any);
  long before = atomic_load(&f.calls);
  if (nth) tfa_fail_nth(&f, nth);
  long accepted = 0;
  for (int round = 0; round < 3; round++) {
    for (uint64_t k = 0; k < NKEYS; k++) {
      uint64_t v = k * 1000 + (uint64_t)round;
      int rc = tko_coalescer_mark(c, k, v);
      if (rc == 0) {
        last[k] = v;
        any[k] = true;
        accepted++;
      } else {
        cr_assert_eq(rc, -ENOMEM, "failing call %ld: mark rc %d", nth, rc);
      }
    }
  }
  long calls = atomic_load(&f.calls) - before;
  tko_coalesce_stats st;
  tko_coalescer_stats(c, &st);
  cr_assert_eq(st.marks, (uint64_t)accepted);
  cr_assert_eq(tko_coalescer_flush(c), 0);
  for (int k = 0; k < NKEYS; k++) {
    cr_assert_eq(fl.times[k], any[k] ? 1 : 0, "failing call %ld: key %d flushed %d times", nth, k,
                 fl.times[k]);
    if (any[k]) cr_assert_eq(fl.value[k], last[k]);
  }
  /* Still usable: a new mark is flushed by destroy's final flush. */
  tfa_heal(&f);
  cr_assert_eq(tko_coalescer_mark(c, 7, 777), 0);
  cr_assert_eq(tko_coalescer_destroy(c), 0);
  cr_assert_eq(fl.value[7], 777);
  cr_assert_eq(tko_pool_destroy(p), 0);
  cr_assert_eq(atomic_load(&f.live), 0, "failing call %ld: blocks leaked", nth);
  return calls;
}

Test(faults, coalescer_marks_fail_cleanly_at_every_allocation) {
  long calls = coalescer_scenario(0);
  note_calls("coalescer marks", calls);
  cr_assert_geq(calls, 6, "the dirty table should grow several times");
  for (long nth = 1; nth <= calls + 1; nth++) coalescer_scenario(nth);
}

/* A keyed submit whose lane's runner the pool cannot queue (its queue
 * cannot grow) runs the lane on the submitting thread: that runner was
 * never queued, so it counts neither as queued nor as done - wait_idle
 * returns once the tasks ran, and the stats add up. Key 2's lane ran once
 * before the allocations fail, so it has its ring and is idle again. */
Test(faults, a_keyed_runner_the_queue_has_no_room_for_leaves_the_counts_balanced) {
  tfa f;
  tfa_init(&f);
  tko_pool *p = faulty_pool(&f, tft_on_cancel);
  static tft_token warm, here, plain[4096];
  memset(&warm, 0, sizeof warm);
  memset(&here, 0, sizeof here);
  memset(plain, 0, sizeof plain);
  cr_assert_eq(tko_submit_keyed(p, 2, tft_run, &warm, 0), 0);
  warm.accepted = true;
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  tt_pin pn = TT_PIN_INIT;
  cr_assert_eq(tko_submit(p, tt_pin_fn, &pn, 0), 0);
  cr_assert(tt_count_wait_geq(&pn.started, 1));
  tfa_fail_from(&f, 1);
  size_t n = 0;
  int rc = 0;
  while (n < 4096 && (rc = tko_submit(p, tft_run, &plain[n], 0)) == 0) plain[n++].accepted = true;
  cr_assert_eq(rc, -ENOMEM, "the queue never ran out of room (%zu tasks)", n);
  cr_assert_eq(tko_submit_keyed(p, 2, tft_run, &here, 0), 0);
  here.accepted = true;
  cr_assert_eq(atomic_load(&here.runs), 1, "the lane did not run on the submitting thread");
  tfa_heal(&f);
  finish_pool(p, &pn, false);
  cr_assert_eq(tft_first_bad(&warm, 1), -1);
  cr_assert_eq(tft_first_bad(plain, n), -1);
  cr_assert_eq(atomic_load(&f.live), 0, "blocks leaked");
}
