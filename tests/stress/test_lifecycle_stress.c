/* SPDX-License-Identifier: MIT */
/* The lifecycle stress test (issue 14, "tests that find the next one").
 *
 * Each round builds a pool from a seeded random configuration (workers,
 * elastic workers, a bounded queue under each full policy, an async limit,
 * a failing allocator), attaches a lane table and a coalescer to some, and
 * lets three submitter threads drive every way in - single, timed, batch,
 * keyed, group and async submits, one-shot and periodic timers, lanes and
 * coalescer marks, pause and resume, the blocking hint, group waits and
 * cancels, trims, stats - while allocations and thread creation fail at
 * random. The main thread shuts the pool down in one of its modes (plain,
 * timed and retried, cancel-and-return, or destroy) at a random point of
 * that traffic, then destroys everything. The invariants, checked after
 * every round:
 *   - every accepted task ran or reached on_cancel exactly once, and a
 *     refused one did neither (timers: a one-shot timer the host cancelled
 *     did neither; a periodic one never runs after its on_cancel, and gets
 *     exactly one unless the host cancelled it - then at most its queued
 *     firing's);
 *   - every call returned one of the codes its header documents;
 *   - a stopped pool's stats add up: submitted = completed + cancelled;
 *   - nothing leaks: the counting allocator is back to zero blocks;
 *   - no call hangs: a watchdog ends the process if a round outlives its
 *     bound (the calls have deadlines or are resolved by the shutdown).
 * It uses only the public API plus the thread-creation test seam of
 * src/platform/prim.h, which is why it is built like the white-box suites. It runs in
 * every CI flavour (plain, ThreadSanitizer, ASan+UBSan); TKO_STRESS_ROUNDS
 * and TKO_STRESS_SEED replay or lengthen it. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "prim.h"
#include "taskorch.h"
#include "tko_test.h"
#include "tko_test_fault.h"
#include "tko_test_sync.h"

enum { SUBMITTERS = 3, TIMERS_PER_THREAD = 4, MAX_TOKENS = 8192, OPS = 160 };

typedef enum kind { K_TASK, K_ONESHOT, K_PERIODIC, K_LANE } kind;

typedef struct token {
  atomic_int runs, cancels;
  atomic_int late_runs; /* runs of a timer after its on_cancel */
  bool accepted;        /* set by the submitter once the call returned 0 */
  bool host_cancelled;  /* a timer the host disarmed (tko_timer_cancel 0) */
  kind kind;
  const char *how;      /* the call that submitted it */
} token;

typedef struct round round;

typedef struct submitter {
  round *r;
  uint64_t rng;
  tko_group group;
  tko_timer timers[TIMERS_PER_THREAD];
  token *timer_token[TIMERS_PER_THREAD];
  pthread_t thread;
} submitter;

/* The async completer: ops that async tasks started, completed in turn by
 * one thread (a host's I/O loop). */
typedef struct completer {
  pthread_mutex_t mu; /* protects ops, n, stop */
  pthread_cond_t cv;
  tko_async *ops[MAX_TOKENS];
  size_t n;
  bool stop;
  atomic_long bad_rc;
  pthread_t thread;
} completer;

struct round {
  uint64_t seed;
  tko_pool *pool;
  tko_lanes *lanes;
  tko_coalescer *co;
  tfa alloc;
  completer comp;
  token tokens[MAX_TOKENS];
  atomic_size_t next_token;
  tt_count ops_done;
  atomic_long bad_rc; /* calls that returned a code their header does not document */
  atomic_long bad_stats;
  atomic_long flushed;
  char first_bad[160];
  char config[160];       /* the round's configuration, for failure messages */
  pthread_mutex_t bad_mu; /* protects first_bad */
  size_t capacity;        /* queue_capacity, 0 = unbounded */
  bool elastic_only;
};

/* ---- recording what went wrong --------------------------------------------- */

static void note_bad(round *r, atomic_long *counter, const char *what, int rc) {
  if (atomic_fetch_add(counter, 1) > 0) return;
  pthread_mutex_lock(&r->bad_mu);
  snprintf(r->first_bad, sizeof r->first_bad, "%s returned %d (%s)", what, rc, tko_err_name(rc));
  pthread_mutex_unlock(&r->bad_mu);
}

/* rc must be 0 or one of the listed negative codes (0-terminated list). */
static int expect(round *r, const char *what, int rc, const int *allowed) {
  if (rc == 0) return 0;
  for (const int *a = allowed; *a; a++)
    if (rc == *a) return rc;
  note_bad(r, &r->bad_rc, what, rc);
  return rc;
}

static const int submit_codes[] = {-ESHUTDOWN, -ENOMEM, -EAGAIN, -ETIMEDOUT, 0};
static const int timer_codes[] = {-ESHUTDOWN, -ENOMEM, -EAGAIN, -EBUSY, 0};

static token *new_token(round *r, kind k) {
  size_t i = atomic_fetch_add(&r->next_token, 1);
  if (i >= MAX_TOKENS) return NULL;
  r->tokens[i].kind = k;
  return &r->tokens[i];
}

/* ---- tasks ------------------------------------------------------------------ */

static int token_task(void *arg) {
  token *t = arg;
  if (atomic_load(&t->cancels)) atomic_fetch_add(&t->late_runs, 1);
  atomic_fetch_add(&t->runs, 1);
  return (atomic_load(&t->runs) & 7) == 3 ? -EIO : 0; /* some fail */
}

/* A task that holds the blocking hint around a short spin. */
static int blocking_task(void *arg) {
  int b = tko_blocking_begin();
  tt_spin_ns(20000);
  if (b == 0) tko_blocking_end();
  return token_task(arg);
}

static round *the_round; /* the round under way (rounds run one at a time) */

/* Hands op to the completer; one in eight completes at once instead. */
static int async_start(tko_async *op, void *arg) {
  token *t = arg;
  atomic_fetch_add(&t->runs, 1);
  if ((t - the_round->tokens) % 8 == 0) return -EIO;
  completer *c = &the_round->comp;
  pthread_mutex_lock(&c->mu);
  c->ops[c->n++] = op; /* at most one op per token: n < MAX_TOKENS */
  pthread_cond_signal(&c->cv);
  pthread_mutex_unlock(&c->mu);
  return 0;
}

static void *completer_main(void *p) {
  completer *c = p;
  pthread_mutex_lock(&c->mu);
  for (;;) {
    while (c->n == 0 && !c->stop)
      pthread_cond_wait(&c->cv, &c->mu);
    if (c->n == 0) break;
    tko_async *op = c->ops[--c->n];
    pthread_mutex_unlock(&c->mu);
    if (tko_async_complete(op, 0) != 0) atomic_fetch_add(&c->bad_rc, 1);
    pthread_mutex_lock(&c->mu);
  }
  pthread_mutex_unlock(&c->mu);
  return NULL;
}

static void on_cancel(void *user, const tko_task_info *task) {
  (void)user;
  token *t = task->arg;
  if (t) atomic_fetch_add(&t->cancels, 1);
}

static void lane_cancel(void *user, const tko_lane_task *task) {
  (void)user;
  token *t = task->arg;
  if (t) atomic_fetch_add(&t->cancels, 1);
}

static void flush_fn(void *user, const tko_coalesce_entry *entries, size_t count) {
  (void)entries;
  atomic_fetch_add(&((round *)user)->flushed, (long)count);
}

/* ---- the submitters ---------------------------------------------------------- */

static unsigned pick(submitter *s, unsigned n) { return (unsigned)(tt_rand(&s->rng) % n); }

static int weight_of(submitter *s) { return (int)pick(s, 5) - 2; }

/* One accepted-or-refused submit of a fresh task token. */
static void submit_task(submitter *s) {
  round *r = s->r;
  token *t = new_token(r, K_TASK);
  if (!t) return;
  tko_task_fn fn = pick(s, 8) == 0 ? blocking_task : token_task;
  int rc;
  switch (pick(s, 6)) {
  case 0: rc = expect(r, t->how = "tko_submit", tko_submit(r->pool, fn, t, weight_of(s)), submit_codes); break;
  case 1:
    rc = expect(r, t->how = "tko_submit_timed",
                tko_submit_timed(r->pool, fn, t, weight_of(s), (long)pick(s, 3)), submit_codes);
    break;
  case 2:
    rc = expect(r, t->how = "tko_submit_keyed",
                tko_submit_keyed(r->pool, pick(s, 6), fn, t, weight_of(s)), submit_codes);
    break;
  case 3:
    rc = expect(r, t->how = "tko_group_submit", tko_group_submit(r->pool, &s->group, fn, t, weight_of(s)),
                submit_codes);
    break;
  case 4:
    rc = expect(r, t->how = "tko_submit_async", tko_submit_async(r->pool, async_start, t, weight_of(s)),
                submit_codes);
    break;
  default:
    rc = expect(r, t->how = "tko_group_submit_async",
                tko_group_submit_async(r->pool, &s->group, async_start, t, weight_of(s)),
                submit_codes);
    break;
  }
  t->accepted = rc == 0;
}

static void submit_batch(submitter *s) {
  round *r = s->r;
  tko_task tasks[5];
  token *toks[5];
  size_t n = 1 + pick(s, 5);
  for (size_t i = 0; i < n; i++) {
    toks[i] = new_token(r, K_TASK);
    if (!toks[i]) return; /* out of tokens: the unused ones stay refused */
    tasks[i] = (tko_task){token_task, toks[i], weight_of(s)};
    toks[i]->how = "tko_submit_batch";
  }
  static const int batch_codes[] = {-ESHUTDOWN, -ENOMEM, -EAGAIN, 0};
  int rc = expect(r, "tko_submit_batch", tko_submit_batch(r->pool, tasks, n), batch_codes);
  for (size_t i = 0; i < n; i++) toks[i]->accepted = rc == 0;
}

static void lanes_submit(submitter *s) {
  round *r = s->r;
  if (!r->lanes) return;
  if (pick(s, 8) == 0) {
    static const int wait_codes[] = {-ETIMEDOUT, 0};
    expect(r, "tko_lanes_wait_idle", tko_lanes_wait_idle(r->lanes, (long)pick(s, 2)), wait_codes);
    return;
  }
  token *t = new_token(r, K_LANE);
  if (!t) return;
  int rc = expect(r, t->how = "tko_lanes_submit",
                  tko_lanes_submit(r->lanes, pick(s, 16), token_task, t, weight_of(s)),
                  submit_codes);
  t->accepted = rc == 0;
}

static void coalescer_mark(submitter *s) {
  round *r = s->r;
  if (!r->co) return;
  static const int mark_codes[] = {-ESHUTDOWN, -ENOMEM, 0};
  if (pick(s, 8) == 0) {
    expect(r, "tko_coalescer_flush", tko_coalescer_flush(r->co), mark_codes);
    return;
  }
  expect(r, "tko_coalescer_mark", tko_coalescer_mark(r->co, pick(s, 32), tt_rand(&s->rng)),
         mark_codes);
}

/* Arms a timer slot (one-shot or periodic) or cancels it. */
static void timer_op(submitter *s) {
  round *r = s->r;
  unsigned i = pick(s, TIMERS_PER_THREAD);
  if (pick(s, 3) == 0) {
    int rc = tko_timer_cancel(&s->timers[i]);
    static const int cancel_codes[] = {-ENOENT, 0};
    expect(r, "tko_timer_cancel", rc, cancel_codes);
    if (rc == 0 && s->timer_token[i]) s->timer_token[i]->host_cancelled = true;
    if (rc == 0) s->timer_token[i] = NULL;
    return;
  }
  bool periodic = pick(s, 2);
  token *t = new_token(r, periodic ? K_PERIODIC : K_ONESHOT);
  if (!t) return;
  long ms = (long)pick(s, 4) + periodic;
  int rc = periodic ? tko_submit_every(r->pool, &s->timers[i], ms, token_task, t, weight_of(s))
                    : tko_submit_after(r->pool, &s->timers[i], ms, token_task, t, weight_of(s));
  expect(r, t->how = periodic ? "tko_submit_every" : "tko_submit_after", rc, timer_codes);
  t->accepted = rc == 0;
  if (rc == 0) s->timer_token[i] = t;
}

static void group_op(submitter *s) {
  round *r = s->r;
  if (pick(s, 2)) {
    long n = tko_group_cancel(&s->group);
    if (n < 0) note_bad(r, &r->bad_rc, "tko_group_cancel", (int)n);
    return;
  }
  static const int wait_codes[] = {-ETIMEDOUT, 0};
  expect(r, "tko_group_wait", tko_group_wait(&s->group, (long)pick(s, 3)), wait_codes);
}

/* A pause is always followed by the same thread's resume a few calls later
 * (a host that pauses and never resumes, with its submitters blocked on a
 * full queue, deadlocks itself); the calls between never wait without
 * bound. */
static void pause_window(submitter *s) {
  round *r = s->r;
  static const int ok[] = {0};
  expect(r, "tko_pool_pause", tko_pool_pause(r->pool), ok);
  for (unsigned i = pick(s, 3); i > 0; i--) {
    token *t = new_token(r, K_TASK);
    if (!t) break;
    t->accepted = expect(r, t->how = "tko_submit_timed (paused)",
                         tko_submit_timed(r->pool, token_task, t, weight_of(s), 0),
                         submit_codes) == 0;
  }
  expect(r, "tko_pool_resume", tko_pool_resume(r->pool), ok);
}

static void pool_op(submitter *s) {
  round *r = s->r;
  static const int wait_codes[] = {-ETIMEDOUT, 0};
  switch (pick(s, 4)) {
  case 0: pause_window(s); break;
  case 1: expect(r, "tko_pool_trim", tko_pool_trim(r->pool), wait_codes); break;
  case 2:
    expect(r, "tko_pool_wait_idle", tko_pool_wait_idle(r->pool, (long)pick(s, 2)), wait_codes);
    break;
  default: {
    /* Possible at one instant, whatever the other threads do. */
    tko_stats st;
    tko_pool_stats(r->pool, &st);
    if (st.completed + st.cancelled + st.queued + st.running > st.submitted ||
        (r->capacity && st.queued > r->capacity)) {
      char what[96];
      snprintf(what, sizeof what, "stats: submitted %llu completed %llu cancelled %llu queued %llu running",
               (unsigned long long)st.submitted, (unsigned long long)st.completed,
               (unsigned long long)st.cancelled, (unsigned long long)st.queued);
      note_bad(r, &r->bad_stats, what, (int)st.running);
    }
  }
  }
}

static void *submitter_main(void *p) {
  submitter *s = p;
  for (int op = 0; op < OPS; op++) {
    switch (pick(s, 12)) {
    case 0: submit_batch(s); break;
    case 1: lanes_submit(s); break;
    case 2: coalescer_mark(s); break;
    case 3: timer_op(s); break;
    case 4: group_op(s); break;
    case 5: pool_op(s); break;
    default: submit_task(s); break;
    }
    tt_count_add(&s->r->ops_done, 1);
  }
  return NULL;
}

/* Reports a broken invariant with the round's seed and fails the test. */
__attribute__((format(printf, 1, 2))) static void round_fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "lifecycle_stress: ");
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  cr_assert(false, "an invariant broke (see the line above)");
}

/* ---- one round -------------------------------------------------------------- */

typedef enum ending { END_DRAIN, END_CANCEL, END_TIMED, END_NOWAIT, END_DESTROY, ENDINGS } ending;

static const char *ending_name[] = {"drain", "cancel", "timed", "nowait", "destroy"};

/* Ends the process if a round outlives its bound: a hang is a failure. */
typedef struct watchdog {
  pthread_mutex_t mu; /* protects done */
  pthread_cond_t cv;
  bool done;
  uint64_t seed;
  pthread_t thread;
} watchdog;

static void *watchdog_main(void *p) {
  watchdog *w = p;
  struct timespec dl;
  tt_deadline(&dl, TT_SCALE(30000L, 120000L));
  pthread_mutex_lock(&w->mu);
  while (!w->done)
    if (pthread_cond_timedwait(&w->cv, &w->mu, &dl) == ETIMEDOUT && !w->done) {
      fprintf(stderr, "lifecycle_stress: round with seed %llu hung (a call did not return)\n",
              (unsigned long long)w->seed);
      abort();
    }
  pthread_mutex_unlock(&w->mu);
  return NULL;
}

static tko_options round_options(round *r, uint64_t *rng) {
  unsigned workers = (unsigned)(tt_rand(rng) % 3), max_elastic = (unsigned)(tt_rand(rng) % 3);
  if (workers == 0 && max_elastic == 0) max_elastic = 1;
  tko_options o = tko_elastic_options(workers, max_elastic, 1 + (unsigned)(tt_rand(rng) % 20));
  r->elastic_only = workers == 0;
  if (tt_rand(rng) % 2) {
    r->capacity = 4 + tt_rand(rng) % 60;
    o.queue_capacity = r->capacity;
    o.full_policy = (tko_full_policy)(tt_rand(rng) % 3);
  }
  o.max_async_inflight = (unsigned)(tt_rand(rng) % 4);
  o.aging_ms = tt_rand(rng) % 4 == 0 ? 1 : 0;
  o.hooks.on_cancel = on_cancel;
  o.allocator = &r->alloc.al;
  return o;
}

static void attach(round *r, uint64_t *rng) {
  static const int create_codes[] = {-ENOMEM, -EAGAIN, 0};
  if (tt_rand(rng) % 2) {
    tko_lane_options lo = tko_lane_default_options();
    lo.lanes = 8;
    lo.max_drain = 1 + (unsigned)(tt_rand(rng) % 4);
    lo.on_cancel = lane_cancel;
    lo.allocator = &r->alloc.al;
    if (expect(r, "tko_lanes_create", tko_lanes_create(&r->lanes, r->pool, &lo), create_codes))
      r->lanes = NULL;
  }
  if (tt_rand(rng) % 2) {
    tko_coalesce_options co = {.allocator = &r->alloc.al};
    if (expect(r, "tko_coalescer_create",
               tko_coalescer_create(&r->co, r->pool, 1 + (unsigned)(tt_rand(rng) % 3), flush_fn,
                                    r, &co),
               create_codes))
      r->co = NULL;
  }
}

/* Shuts the pool down in the round's way, racing the submitters. Returns
 * whether the pool is stopped with nothing running (its stats must add up). */
static bool shut_down(round *r, ending e, uint64_t *rng) {
  static const int ok[] = {0};
  static const int timed_codes[] = {-ETIMEDOUT, 0};
  switch (e) {
  case END_DRAIN: expect(r, "tko_pool_shutdown(DRAIN)", tko_pool_shutdown(r->pool, TKO_DRAIN), ok); return true;
  case END_CANCEL: expect(r, "tko_pool_shutdown(CANCEL)", tko_pool_shutdown(r->pool, TKO_CANCEL), ok); return true;
  case END_TIMED:
    for (;;) {
      tko_shutdown_mode m = tt_rand(rng) % 2 ? TKO_DRAIN : TKO_CANCEL;
      int rc = expect(r, "tko_pool_shutdown_timed",
                      tko_pool_shutdown_timed(r->pool, m, (long)(tt_rand(rng) % 3)), timed_codes);
      if (rc != -ETIMEDOUT) return rc == 0;
    }
  case END_NOWAIT:
    expect(r, "tko_pool_shutdown_timed(NOWAIT)",
           tko_pool_shutdown_timed(r->pool, TKO_CANCEL_NOWAIT, 0), ok);
    return false;
  default: return false;
  }
}

/* Frees the attachments and the pool, in a random order where one exists
 * (destroying the pool first must say -EBUSY and free nothing). */
static void destroy_all(round *r, uint64_t *rng) {
  static const int ok[] = {0};
  static const int busy[] = {-EBUSY, 0};
  if ((r->lanes || r->co) && tt_rand(rng) % 2) {
    int rc = expect(r, "tko_pool_destroy (attached)", tko_pool_destroy(r->pool), busy);
    if (rc != -EBUSY) note_bad(r, &r->bad_rc, "tko_pool_destroy with attachments", rc);
  }
  if (r->lanes) expect(r, "tko_lanes_destroy", tko_lanes_destroy(r->lanes), ok);
  if (r->co) expect(r, "tko_coalescer_destroy", tko_coalescer_destroy(r->co), ok);
  expect(r, "tko_pool_destroy", tko_pool_destroy(r->pool), ok);
}

/* What the rounds did, printed at the end: a stress test that stopped
 * exercising anything would show it here. */
static struct totals {
  long rounds[ENDINGS], created, accepted, runs, cancels, refused;
} totals;

static void check_tokens(round *r) {
  size_t n = atomic_load(&r->next_token);
  if (n > MAX_TOKENS) n = MAX_TOKENS;
  for (size_t i = 0; i < n; i++) {
    token *t = &r->tokens[i];
    int runs = atomic_load(&t->runs), cancels = atomic_load(&t->cancels);
    bool ok;
    switch (t->kind) {
    case K_ONESHOT: ok = runs + cancels == (t->accepted && !t->host_cancelled); break;
    case K_PERIODIC: /* a host-cancelled timer's queued firing may still be cancelled */
      ok = !t->accepted ? runs + cancels == 0 : t->host_cancelled ? cancels <= 1 : cancels == 1;
      break;
    default: ok = runs + cancels == t->accepted; break;
    }
    ok = ok && atomic_load(&t->late_runs) == 0;
    totals.accepted += t->accepted;
    totals.refused += !t->accepted;
    totals.runs += runs;
    totals.cancels += cancels;
    if (!ok)
      round_fail("seed %llu [%s]: token %zu (%s, accepted %d, host cancelled %d): %d runs, "
              "%d cancels, %d after its on_cancel",
              (unsigned long long)r->seed, r->config, i, t->how, t->accepted, t->host_cancelled, runs,
              cancels, atomic_load(&t->late_runs));
  }
}

static void run_round(round *r, uint64_t seed) {
  memset(r, 0, sizeof *r);
  r->seed = seed;
  pthread_mutex_init(&r->bad_mu, NULL);
  tt_count_init(&r->ops_done);
  tfa_init(&r->alloc);
  completer *c = &r->comp;
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, NULL);
  cr_assert_eq(pthread_create(&c->thread, NULL, completer_main, c), 0);
  the_round = r;
  uint64_t rng = seed * 0x9e3779b97f4a7c15ull + 1;

  watchdog w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false, seed, 0};
  cr_assert_eq(pthread_create(&w.thread, NULL, watchdog_main, &w), 0);

  tko_options o = round_options(r, &rng);
  ending e = (ending)(tt_rand(&rng) % ENDINGS);
  /* Thread creation fails only where a basic worker exists: with none, the
   * submitters would wait for room that only the healed spawner can make,
   * and the heal waits for their progress. */
  bool fail_threads = !r->elastic_only && tt_rand(&rng) % 4 == 0, fail_allocs = tt_rand(&rng) % 3 == 0;
  static const char *policy[] = {"block", "reject", "caller-runs"};
  snprintf(r->config, sizeof r->config,
           "%u+%u workers, capacity %zu %s, async limit %u, aging %u, %s%s%s", o.workers,
           o.max_elastic, r->capacity, r->capacity ? policy[o.full_policy] : "", o.max_async_inflight,
           o.aging_ms, ending_name[e], fail_threads ? ", spawns fail" : "",
           fail_allocs ? ", allocations fail" : "");
  static const int create_codes[] = {-ENOMEM, -EAGAIN, 0};
  if (fail_allocs) tfa_fail_every(&r->alloc, 5 + (long)(tt_rand(&rng) % 40));
  int rc = expect(r, "tko_pool_create", tko_pool_create(&r->pool, &o), create_codes);
  submitter subs[SUBMITTERS];
  totals.rounds[e]++;
  if (rc == 0) {
    totals.created++;
    attach(r, &rng);
    if (fail_threads) atomic_store(&tko__test_thread_create_errno, EAGAIN);
    for (int i = 0; i < SUBMITTERS; i++) {
      memset(&subs[i], 0, sizeof subs[i]);
      subs[i].r = r;
      subs[i].rng = tt_rand(&rng) | 1;
      cr_assert_eq(tko_group_init(&subs[i].group), 0);
      for (int k = 0; k < TIMERS_PER_THREAD; k++) tko_timer_init(&subs[i].timers[k]);
      cr_assert_eq(pthread_create(&subs[i].thread, NULL, submitter_main, &subs[i]), 0);
    }
    /* Thread creation recovers, then shutdown comes, at random points of
     * the traffic (e = END_DESTROY waits for the submitters first: a
     * destroy racing calls on the pool is the host's bug). */
    long total = (long)SUBMITTERS * OPS;
    long heal_at = (long)(tt_rand(&rng) % (uint64_t)total);
    long stop_at = e == END_DESTROY ? total : heal_at + (long)(tt_rand(&rng) % (uint64_t)(total - heal_at + 1));
    cr_assert(tt_count_wait_geq(&r->ops_done, heal_at));
    atomic_store(&tko__test_thread_create_errno, 0);
    cr_assert(tt_count_wait_geq(&r->ops_done, stop_at));
    bool stopped = shut_down(r, e, &rng);
    for (int i = 0; i < SUBMITTERS; i++) pthread_join(subs[i].thread, NULL);
    if (stopped) {
      tko_stats st;
      tko_pool_stats(r->pool, &st);
      if (st.submitted != st.completed + st.cancelled || st.queued || st.running)
        round_fail("seed %llu (%s): stopped pool's stats: submitted %llu, completed %llu, "
                "cancelled %llu, queued %llu, running %llu",
                (unsigned long long)seed, ending_name[e], (unsigned long long)st.submitted,
                (unsigned long long)st.completed, (unsigned long long)st.cancelled,
                (unsigned long long)st.queued, (unsigned long long)st.running);
    }
    destroy_all(r, &rng);
    for (int i = 0; i < SUBMITTERS; i++) {
      if (tko_group_pending(&subs[i].group))
        round_fail("seed %llu: group members left", (unsigned long long)seed);
      cr_assert_eq(tko_group_destroy(&subs[i].group), 0);
      for (int k = 0; k < TIMERS_PER_THREAD; k++)
        if (tko_timer_cancel(&subs[i].timers[k]) != -ENOENT)
          round_fail("seed %llu: a timer still armed after destroy", (unsigned long long)seed);
    }
  }
  atomic_store(&tko__test_thread_create_errno, 0);
  tfa_heal(&r->alloc);

  pthread_mutex_lock(&c->mu);
  c->stop = true;
  pthread_cond_signal(&c->cv);
  pthread_mutex_unlock(&c->mu);
  pthread_join(c->thread, NULL);
  pthread_mutex_lock(&w.mu);
  w.done = true;
  pthread_cond_signal(&w.cv);
  pthread_mutex_unlock(&w.mu);
  pthread_join(w.thread, NULL);

  if (atomic_load(&r->bad_rc))
    round_fail("seed %llu (%s): %ld undocumented return codes, first: %s", (unsigned long long)seed,
            ending_name[e], atomic_load(&r->bad_rc), r->first_bad);
  if (atomic_load(&r->bad_stats))
    round_fail("seed %llu [%s]: an impossible snapshot: %s", (unsigned long long)seed, r->config,
               r->first_bad);
  if (atomic_load(&c->bad_rc))
    round_fail("seed %llu: tko_async_complete failed", (unsigned long long)seed);
  if (c->n) round_fail("seed %llu: async ops never completed", (unsigned long long)seed);
  check_tokens(r);
  if (atomic_load(&r->alloc.live))
    round_fail("seed %llu (%s): %ld blocks leaked", (unsigned long long)seed, ending_name[e],
               atomic_load(&r->alloc.live));
  tt_count_fini(&r->ops_done);
  pthread_mutex_destroy(&r->bad_mu);
  pthread_mutex_destroy(&c->mu);
  pthread_cond_destroy(&c->cv);
}

static long env_long(const char *name, long dflt) {
  const char *v = getenv(name);
  return v && *v ? strtol(v, NULL, 0) : dflt;
}

Test(lifecycle_stress, every_way_in_meets_every_way_out) {
  static round r; /* large: not on the stack */
  long rounds = env_long("TKO_STRESS_ROUNDS", TT_SCALE(1000, 300));
  uint64_t seed0 = (uint64_t)env_long("TKO_STRESS_SEED", 1);
  for (long i = 0; i < rounds; i++) run_round(&r, seed0 + (uint64_t)i);
  fprintf(stderr,
          "lifecycle_stress: %ld rounds from seed %llu (%ld pools created; ended by drain %ld, "
          "cancel %ld, timed %ld, nowait %ld, destroy %ld): %ld tasks accepted, %ld refused, "
          "%ld runs, %ld cancels\n",
          rounds, (unsigned long long)seed0, totals.created, totals.rounds[END_DRAIN],
          totals.rounds[END_CANCEL], totals.rounds[END_TIMED], totals.rounds[END_NOWAIT],
          totals.rounds[END_DESTROY], totals.accepted, totals.refused, totals.runs, totals.cancels);
  cr_assert_gt(totals.accepted, 0);
}
