/* SPDX-License-Identifier: MIT */
/* Keyed tasks are the host's tasks (issue 17, defects 5, 6, 7 and 9; issue
 * 14, defect 19): hooks and stats see them, not the library's lane runners;
 * different keys run in parallel whatever a worker's take size; a bounded
 * queue counts them and its full policy applies to them; a caller-runs
 * submitter runs its own task only; a cancel shutdown splits each key into
 * a run prefix and a cancelled rest. Public headers only. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <taskorch.h>

#include "tko_test.h"
#include "tko_test_fault.h"
#include "tko_test_feature.h"
#include "tko_test_sync.h"

/* A hang or a missed rendezvous shows within this. */
#define KT_WAIT_MS 10000L

/* Two keys on different lanes of the pool's keyed table, which is made with
 * tko_lane_default_options (taskorch.h): a table of the same options says
 * which lane a key takes. */
static void two_lanes(uint64_t *a, uint64_t *b) {
  tko_pool *p;
  tko_options o = tko_basic_options(1);
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  tko_lanes *l;
  cr_assert_eq(tko_lanes_create(&l, p, NULL), 0);
  *a = 1;
  *b = 2;
  while (tko_lanes_index(l, *b) == tko_lanes_index(l, *a)) (*b)++;
  cr_assert_eq(tko_lanes_destroy(l), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* ---- defect 5: hooks and failures see the host's keyed tasks ---------------- */

enum { NFAIL = 100 };

typedef struct seen {
  atomic_int before, after, failures, foreign;
  atomic_uint_fast64_t ids[NFAIL]; /* before_run's id of each task */
  tft_token tok[NFAIL];
} seen;

static seen seen_;

static int failing_task(void *arg) {
  tft_run(arg);
  return -1;
}

/* The index of a task's token, or -1 if arg is not one (a lane runner's). */
static long token_index(const tko_task_info *t) {
  tft_token *tok = t->arg;
  if (t->fn != failing_task || tok < seen_.tok || tok >= seen_.tok + NFAIL) return -1;
  return tok - seen_.tok;
}

static void seen_before(void *user, const tko_task_info *t) {
  (void)user;
  long i = token_index(t);
  if (i < 0) {
    atomic_fetch_add(&seen_.foreign, 1);
    return;
  }
  atomic_fetch_add(&seen_.before, 1);
  atomic_store(&seen_.ids[i], t->id);
}

static void seen_after(void *user, const tko_task_info *t) {
  (void)user;
  long i = token_index(t);
  if (i < 0 || t->status != -1 || t->id != atomic_load(&seen_.ids[i])) {
    atomic_fetch_add(&seen_.foreign, 1);
    return;
  }
  atomic_fetch_add(&seen_.after, 1);
}

static void seen_failure(void *user, const tko_task_info *t) {
  (void)user;
  if (token_index(t) < 0) atomic_fetch_add(&seen_.foreign, 1);
  else atomic_fetch_add(&seen_.failures, 1);
}

Test(keyed_tasks, hooks_and_failures_see_the_host_keyed_task) {
  seen *s = &seen_;
  memset(s, 0, sizeof *s);
  tko_options o = tko_basic_options(2);
  o.hooks.before_run = seen_before;
  o.hooks.after_run = seen_after;
  o.hooks.on_failure = seen_failure;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  for (int i = 0; i < NFAIL; i++) {
    cr_assert_eq(tko_submit_keyed(p, (uint64_t)(i % 7), failing_task, &s->tok[i], 0), 0);
    s->tok[i].accepted = true;
  }
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  tko_stats st;
  tko_pool_stats(p, &st);
  cr_assert_eq(atomic_load(&s->foreign), 0, "a hook saw something other than the host's task");
  cr_assert_eq(atomic_load(&s->before), NFAIL);
  cr_assert_eq(atomic_load(&s->after), NFAIL);
  cr_assert_eq(atomic_load(&s->failures), NFAIL, "failing keyed tasks reach on_failure");
  cr_assert_eq(st.failed, NFAIL);
  cr_assert_eq(st.completed, NFAIL);
  for (int i = 0; i < NFAIL; i++) {
    uint64_t id = atomic_load(&s->ids[i]);
    cr_assert_neq(id, 0, "a keyed task has an id");
    for (int j = 0; j < i; j++) cr_assert_neq(id, atomic_load(&s->ids[j]), "ids are unique");
  }
  cr_assert_eq(tft_first_bad(s->tok, NFAIL), -1);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* ---- issue 14, defect 19: stats count keyed tasks, not lane runners -------- */

static void assert_idle_invariant(tko_pool *p, uint64_t accepted) {
  tko_stats st;
  tko_pool_stats(p, &st);
  cr_assert_eq(st.submitted, accepted, "stats count keyed tasks as tasks");
  cr_assert_eq(st.submitted, st.completed + st.cancelled + st.queued + st.running);
  cr_assert_eq(st.queued + st.running, 0);
}

typedef struct mix {
  tko_pool *pool;
  tft_token tok[2][600];
} mix;

static mix mix_;

static int mix_submitter(void *arg) {
  tft_token *tok = arg;
  for (int i = 0; i < 600; i++) {
    int rc = i % 3 ? tko_submit_keyed(mix_.pool, (uint64_t)(i % 5), tft_run, &tok[i], i % 4)
                   : tko_submit(mix_.pool, tft_run, &tok[i], i % 4);
    if (rc) return rc;
    tok[i].accepted = true;
  }
  return 0;
}

Test(keyed_tasks, stats_count_keyed_tasks_and_add_up_once_idle) {
  mix *m = &mix_;
  memset(m, 0, sizeof *m);
  tko_options o = tko_basic_options(2);
  cr_assert_eq(tko_pool_create(&m->pool, &o), 0);
  /* Paused: every keyed task is queued, and counted so. */
  cr_assert_eq(tko_pool_pause(m->pool), 0);
  static tft_token early[30];
  memset(early, 0, sizeof early);
  for (int i = 0; i < 30; i++) {
    cr_assert_eq(tko_submit_keyed(m->pool, (uint64_t)(i % 3), tft_run, &early[i], 0), 0);
    early[i].accepted = true;
  }
  tko_stats st;
  tko_pool_stats(m->pool, &st);
  cr_assert_eq(st.submitted, 30);
  cr_assert_eq(st.queued, 30, "queued keyed tasks count as queued");
  cr_assert_eq(tko_pool_resume(m->pool), 0);
  cr_assert_eq(tko_pool_wait_idle(m->pool, TT_LONG_MS), 0);
  assert_idle_invariant(m->pool, 30);
  /* Two submitters mixing plain and keyed tasks. */
  tf_thread t[2];
  for (int i = 0; i < 2; i++) cr_assert_eq(tf_thread_start(&t[i], mix_submitter, m->tok[i]), 0);
  for (int i = 0; i < 2; i++) {
    int rc = -1;
    cr_assert(tf_thread_join(&t[i], &rc));
    cr_assert_eq(rc, 0);
  }
  cr_assert_eq(tko_pool_wait_idle(m->pool, TT_LONG_MS), 0);
  assert_idle_invariant(m->pool, 30 + 2 * 600);
  cr_assert_eq(tft_first_bad(early, 30), -1);
  for (int i = 0; i < 2; i++) cr_assert_eq(tft_first_bad(m->tok[i], 600), -1);
  cr_assert_eq(tko_pool_destroy(m->pool), 0);
}

enum { NCANCEL = 50 };

typedef struct cancels {
  atomic_int calls, zero_ids;
  atomic_uint_fast64_t ids[NCANCEL];
  tft_token tok[NCANCEL];
} cancels;

static cancels cancels_;

static void record_cancel(void *user, const tko_task_info *t) {
  (void)user;
  tft_token *tok = t->arg;
  if (tok < cancels_.tok || tok >= cancels_.tok + NCANCEL) return;
  tft_on_cancel(NULL, t);
  atomic_fetch_add(&cancels_.calls, 1);
  if (!t->id) atomic_fetch_add(&cancels_.zero_ids, 1);
  atomic_store(&cancels_.ids[tok - cancels_.tok], t->id);
}

Test(keyed_tasks, cancelled_keyed_tasks_count_and_carry_their_ids) {
  cancels *c = &cancels_;
  memset(c, 0, sizeof *c);
  tko_options o = tko_basic_options(2);
  o.hooks.on_cancel = record_cancel;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  cr_assert_eq(tko_pool_pause(p), 0);
  for (int i = 0; i < NCANCEL; i++) {
    cr_assert_eq(tko_submit_keyed(p, (uint64_t)(i % 4), tft_run, &c->tok[i], 0), 0);
    c->tok[i].accepted = true;
  }
  cr_assert_eq(tko_pool_shutdown(p, TKO_CANCEL), 0);
  tko_stats st;
  tko_pool_stats(p, &st);
  cr_assert_eq(atomic_load(&c->calls), NCANCEL);
  cr_assert_eq(atomic_load(&c->zero_ids), 0, "a cancelled keyed task's on_cancel gets its id");
  for (int i = 0; i < NCANCEL; i++)
    for (int j = 0; j < i; j++) cr_assert_neq(atomic_load(&c->ids[i]), atomic_load(&c->ids[j]));
  cr_assert_eq(st.cancelled, NCANCEL, "cancelled keyed tasks are in stats.cancelled");
  cr_assert_eq(st.submitted, NCANCEL);
  cr_assert_eq(st.submitted, st.completed + st.cancelled + st.queued + st.running);
  cr_assert_eq(tft_first_bad(c->tok, NCANCEL), -1);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* ---- defect 6: different keys run in parallel, whatever the take size ------ */

typedef struct meet {
  tt_count started;
  atomic_int missed; /* a task that never saw the other key's start */
} meet;

static meet meet_;

/* Blocks until both keys' tasks have started (a bounded rendezvous). */
static int meet_task(void *arg) {
  meet *m = arg;
  tt_count_add(&m->started, 1);
  if (!tt_count_wait_geq_within(&m->started, 2, KT_WAIT_MS)) atomic_fetch_add(&m->missed, 1);
  return 0;
}

Test(keyed_tasks, different_keys_run_in_parallel_whatever_the_take_size) {
  meet *m = &meet_;
  uint64_t ka, kb;
  two_lanes(&ka, &kb);
  tko_options o = tko_basic_options(2);
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  for (int round = 0; round < 8; round++) {
    if (round == 4) {
      /* Empty tasks by the thousand: the workers' takes grow to their cap. */
      for (int i = 0; i < 20000; i++) cr_assert_eq(tko_submit(p, tt_nop_fn, NULL, 0), 0);
      cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
    }
    memset(m, 0, sizeof *m);
    tt_count_init(&m->started);
    /* Both runners queued at once, ahead of a few plain tasks, so that one
     * worker's take could hold them both. */
    cr_assert_eq(tko_pool_pause(p), 0);
    cr_assert_eq(tko_submit_keyed(p, ka, meet_task, m, 5), 0);
    cr_assert_eq(tko_submit_keyed(p, kb, meet_task, m, 5), 0);
    for (int i = 0; i < 4; i++) cr_assert_eq(tko_submit(p, tt_nop_fn, NULL, 0), 0);
    cr_assert_eq(tko_pool_resume(p), 0);
    cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
    cr_assert_eq(atomic_load(&m->missed), 0, "round %d: one key waited behind the other", round);
    tt_count_fini(&m->started);
  }
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* A runner is taken alone: a plain task queued behind it is not held
 * behind the lane's tasks in the same take (even rounds), and a runner
 * queued behind a plain task stays for an idle worker (odd rounds). */
Test(keyed_tasks, a_runner_is_taken_alone) {
  meet *m = &meet_;
  tko_options o = tko_basic_options(2);
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  for (int round = 0; round < 40; round++) {
    /* Grown takes first (each round's long meet tasks shrink them), so that
     * a worker would take both in one batch if a runner could join one: a
     * take of one task hid that, and the mutant keyed-runner-joins-a-take
     * survived a CI run. */
    for (int i = 0; i < 5000; i++) cr_assert_eq(tko_submit(p, tt_nop_fn, NULL, 0), 0);
    cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
    memset(m, 0, sizeof *m);
    tt_count_init(&m->started);
    cr_assert_eq(tko_pool_pause(p), 0);
    int plain_weight = round % 2 ? 6 : 4; /* after or before the runner (5) */
    cr_assert_eq(tko_submit_keyed(p, 3, meet_task, m, 5), 0);
    cr_assert_eq(tko_submit(p, meet_task, m, plain_weight), 0);
    for (int i = 0; i < 4; i++) cr_assert_eq(tko_submit(p, tt_nop_fn, NULL, 0), 0);
    cr_assert_eq(tko_pool_resume(p), 0);
    cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
    cr_assert_eq(atomic_load(&m->missed), 0, "round %d: a runner and a plain task shared a take",
                 round);
    tt_count_fini(&m->started);
  }
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* ---- defect 9: queue_capacity bounds keyed tasks --------------------------- */

Test(keyed_tasks, reject_bounds_keyed_tasks_by_the_capacity) {
  enum { N = 20, CAP = 4 };
  static tft_token tok[N];
  memset(tok, 0, sizeof tok);
  tko_options o = tko_basic_options(1);
  o.queue_capacity = CAP;
  o.full_policy = TKO_FULL_REJECT;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  cr_assert_eq(tko_pool_pause(p), 0);
  int accepted = 0;
  for (int i = 0; i < N; i++) {
    int rc = tko_submit_keyed(p, (uint64_t)(i < N / 2 ? 1 : i), tft_run, &tok[i], 0);
    cr_assert(rc == 0 || rc == -EAGAIN);
    tok[i].accepted = rc == 0;
    accepted += rc == 0;
  }
  cr_assert_eq(accepted, CAP, "a capacity-4 queue accepts 4 keyed tasks");
  cr_assert_eq(tko_submit(p, tt_nop_fn, NULL, 0), -EAGAIN, "keyed tasks fill the queue");
  cr_assert_eq(tko_pool_resume(p), 0);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  cr_assert_eq(tft_first_bad(tok, N), -1);
  assert_idle_invariant(p, CAP);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

typedef struct filler {
  tko_pool *pool;
  tt_count accepted;
  tft_token tok[12];
} filler;

static filler filler_;

static int fill_keyed(void *arg) {
  filler *f = arg;
  for (int i = 0; i < 12; i++) {
    int rc = tko_submit_keyed(f->pool, (uint64_t)(i % 3), tft_run, &f->tok[i], 0);
    if (rc) return rc;
    f->tok[i].accepted = true;
    tt_count_add(&f->accepted, 1);
  }
  return 0;
}

Test(keyed_tasks, block_waits_for_room_for_keyed_tasks) {
  filler *f = &filler_;
  memset(f, 0, sizeof *f);
  tt_count_init(&f->accepted);
  tko_options o = tko_basic_options(1);
  o.queue_capacity = 4;
  o.full_policy = TKO_FULL_BLOCK;
  cr_assert_eq(tko_pool_create(&f->pool, &o), 0);
  cr_assert_eq(tko_pool_pause(f->pool), 0);
  tf_thread t;
  cr_assert_eq(tf_thread_start(&t, fill_keyed, f), 0);
  cr_assert(tt_count_wait_geq(&f->accepted, 4));
  /* The fifth waits for room: it has not been accepted, and waits for a
   * start that only resume can bring. */
  tko_stats st;
  tko_pool_stats(f->pool, &st);
  cr_assert_eq(st.submitted, 4, "a capacity-4 blocking queue holds 4 keyed tasks");
  cr_assert_eq(tko_pool_resume(f->pool), 0);
  int rc = -1;
  cr_assert(tf_thread_join_within(&t, KT_WAIT_MS, &rc));
  cr_assert_eq(rc, 0);
  cr_assert_eq(tko_pool_wait_idle(f->pool, TT_LONG_MS), 0);
  cr_assert_eq(tft_first_bad(f->tok, 12), -1);
  assert_idle_invariant(f->pool, 12);
  cr_assert_eq(tko_pool_destroy(f->pool), 0);
  tt_count_fini(&f->accepted);
}

/* ---- defect 7: a caller-runs keyed submitter runs its own task only -------- */

enum { MAXA = 1000 };

typedef struct caller {
  tko_pool *pool;
  uint64_t key;
  pthread_t a_thread;    /* the caller-runs submitter */
  atomic_bool a_set, stop;
  atomic_int ran_on_a;   /* keyed tasks run on the submitter's thread */
  tt_count t0_in, appended;
  tt_gate t0_gate;
  tt_pin pin0, pin1;
  tft_token t0, tok[MAXA];
} caller;

static caller caller_;

static int keyed_task(void *arg) {
  caller *c = &caller_;
  if (atomic_load(&c->a_set) && pthread_equal(pthread_self(), c->a_thread))
    atomic_fetch_add(&c->ran_on_a, 1);
  return tft_run(arg);
}

static int first_task(void *arg) {
  caller *c = &caller_;
  keyed_task(arg);
  tt_count_add(&c->t0_in, 1);
  tt_gate_wait(&c->t0_gate);
  return 0;
}

static int submitter_a(void *arg) {
  caller *c = arg;
  c->a_thread = pthread_self();
  atomic_store(&c->a_set, true);
  int rc = tko_submit_keyed(c->pool, c->key, first_task, &c->t0, 0);
  if (rc == 0) c->t0.accepted = true;
  return rc;
}

/* Another thread appending to the same key until told to stop. */
static int appender(void *arg) {
  caller *c = arg;
  for (int i = 0; i < MAXA && !atomic_load(&c->stop); i++) {
    int rc = tko_submit_keyed(c->pool, c->key, keyed_task, &c->tok[i], 0);
    if (rc) return rc;
    c->tok[i].accepted = true;
    tt_count_add(&c->appended, 1);
  }
  return 0;
}

Test(keyed_tasks, caller_runs_submitter_runs_its_own_task_only) {
  caller *c = &caller_;
  memset(c, 0, sizeof *c);
  tt_count_init(&c->t0_in);
  tt_count_init(&c->appended);
  c->t0_gate = (tt_gate)TT_GATE_INIT;
  c->pin0 = (tt_pin)TT_PIN_INIT;
  c->pin1 = (tt_pin)TT_PIN_INIT;
  c->key = 77;
  tko_options o = tko_basic_options(1);
  o.queue_capacity = 4;
  o.full_policy = TKO_FULL_CALLER_RUNS;
  cr_assert_eq(tko_pool_create(&c->pool, &o), 0);
  /* The worker held, the queue full: three empty tasks and a second pin. */
  cr_assert_eq(tko_submit(c->pool, tt_pin_fn, &c->pin0, 0), 0);
  cr_assert(tt_count_wait_geq(&c->pin0.started, 1));
  for (int i = 0; i < 3; i++) cr_assert_eq(tko_submit(c->pool, tt_nop_fn, NULL, 0), 0);
  cr_assert_eq(tko_submit(c->pool, tt_pin_fn, &c->pin1, 0), 0);
  /* A's keyed submit finds the queue full and its lane idle: A runs it. */
  tf_thread a, b;
  cr_assert_eq(tf_thread_start(&a, submitter_a, c), 0);
  cr_assert(tt_count_wait_geq(&c->t0_in, 1));
  /* The worker runs the queue down to the second pin: room for 4. */
  tt_gate_open(&c->pin0.gate);
  cr_assert(tt_count_wait_geq(&c->pin1.started, 1));
  /* Another thread appends to A's key while A's task runs, and the queue
   * fills up again behind the held worker. */
  cr_assert_eq(tf_thread_start(&b, appender, c), 0);
  cr_assert(tt_count_wait_geq(&c->appended, 4));
  for (int i = 0; i < 4; i++) cr_assert_eq(tko_submit(c->pool, tt_nop_fn, NULL, 0), 0);
  tt_gate_open(&c->t0_gate);
  int rc = -1;
  cr_assert(tf_thread_join_within(&a, KT_WAIT_MS, &rc), "the caller-runs submitter is held");
  cr_assert_eq(rc, 0);
  cr_assert_eq(atomic_load(&c->ran_on_a), 1, "the caller ran tasks other than its own");
  /* The appender waits for room (its key is busy): no more than the
   * capacity of its tasks was accepted. Two pins, three empty tasks, t0,
   * 4 appended, 4 fillers (run by this thread, the queue being full). */
  tko_stats st;
  tko_pool_stats(c->pool, &st);
  cr_assert_eq(st.submitted, 14, "the caller-runs pool took more keyed tasks than its capacity");
  atomic_store(&c->stop, true);
  tt_gate_open(&c->pin1.gate);
  cr_assert(tf_thread_join_within(&b, KT_WAIT_MS, &rc));
  cr_assert_eq(rc, 0);
  cr_assert_eq(tko_pool_wait_idle(c->pool, TT_LONG_MS), 0);
  cr_assert_eq(tft_first_bad(&c->t0, 1), -1);
  cr_assert_eq(tft_first_bad(c->tok, MAXA), -1);
  cr_assert_eq(tko_pool_destroy(c->pool), 0);
}

/* Found by the adversarial review of the keyed fixes: a keyed task run on a
 * CALLER_RUNS submitter (its key idle, the queue full) counts in
 * stats.caller_runs, as a plain one does. */
static int count_run(void *arg) {
  tt_count_add(arg, 1);
  return 0;
}

Test(keyed_tasks, caller_run_keyed_tasks_count_in_caller_runs) {
  tko_options o = tko_basic_options(1);
  o.queue_capacity = 1;
  o.full_policy = TKO_FULL_CALLER_RUNS;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  tt_pin pin = TT_PIN_INIT;
  cr_assert_eq(tko_submit(p, tt_pin_fn, &pin, 0), 0);
  cr_assert(tt_count_wait_geq(&pin.started, 1));
  cr_assert_eq(tko_submit(p, tt_nop_fn, NULL, 0), 0); /* the queue is full now */
  tt_count runs = TT_COUNT_INIT;
  enum { N = 20 };
  for (int i = 0; i < N; i++) cr_assert_eq(tko_submit_keyed(p, 100u + (uint64_t)i, count_run, &runs, 0), 0);
  cr_assert_eq(tt_count_get(&runs), N); /* the only worker is pinned: all ran here */
  tko_stats s = tf_stats(p);
  cr_assert_eq(s.caller_runs, (uint64_t)N, "caller_runs %llu", (unsigned long long)s.caller_runs);
  tt_gate_open(&pin.gate);
  cr_assert_eq(tko_pool_wait_idle(p, KT_WAIT_MS), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* A lane table's runners are tasks of the pool: a TKO_CANCEL shutdown hands
 * their lanes' tasks to the table's on_cancel (never the pool's hook) and
 * counts each runner in stats.cancelled, as taskorch.h says; the pool's
 * on_cancel sees only the keyed tasks. */
static atomic_int pool_cancels, lane_cancels;

static void count_pool_cancel(void *user, const tko_task_info *t) {
  (void)user;
  (void)t;
  atomic_fetch_add(&pool_cancels, 1);
}

static void count_lane_cancel(void *user, const tko_lane_task *t) {
  (void)user;
  (void)t;
  atomic_fetch_add(&lane_cancels, 1);
}

Test(keyed_tasks, cancelled_lane_runners_count_as_cancelled) {
  tko_options o = tko_basic_options(1);
  o.hooks.on_cancel = count_pool_cancel;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  tko_lane_options lo = tko_lane_default_options();
  lo.on_cancel = count_lane_cancel;
  tko_lanes *l;
  cr_assert_eq(tko_lanes_create(&l, p, &lo), 0);
  cr_assert_eq(tko_pool_pause(p), 0);
  enum { K = 5 };
  uint64_t keys[K];
  for (int k = 0, key = 0; k < K; key++) { /* K keys on K different lanes: K runners */
    bool fresh = true;
    for (int j = 0; j < k; j++) fresh = fresh && tko_lanes_index(l, keys[j]) != tko_lanes_index(l, (uint64_t)key);
    if (fresh) keys[k++] = (uint64_t)key;
  }
  for (int k = 0; k < K; k++) cr_assert_eq(tko_lanes_submit(l, keys[k], tt_nop_fn, NULL, 0), 0);
  for (int k = 0; k < K; k++) cr_assert_eq(tko_submit_keyed(p, (uint64_t)k, tt_nop_fn, NULL, 0), 0);
  cr_assert_eq(tko_pool_shutdown(p, TKO_CANCEL), 0);
  cr_assert_eq(tko_lanes_destroy(l), 0);
  tko_stats s = tf_stats(p);
  cr_assert_eq(atomic_load(&lane_cancels), K);
  cr_assert_eq(atomic_load(&pool_cancels), K); /* the keyed tasks only */
  cr_assert_eq(s.cancelled, (uint64_t)(2 * K), "cancelled %llu", (unsigned long long)s.cancelled);
  cr_assert_eq(s.submitted, s.completed + s.cancelled);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* ---- a cancel splits each key into a run prefix and a cancelled rest ------- */

/* As for lane tables (test_lanes.c): once a TKO_CANCEL or TKO_CANCEL_NOWAIT
 * shutdown begins, each key's tasks that ran are a prefix of its stream
 * and the rest went to on_cancel, never a task run after an earlier one
 * was cancelled. Key 0's first task holds its runner in the middle of its
 * first visit (the table's max_drain, 32 by default) until the shutdown's
 * on_cancel reaches key 0, which opens the gate and waits until that
 * visit's tasks have ended: so the cancel always meets a running runner,
 * which hands the visit's tasks it had not started to on_cancel (test
 * keyed/a_running_runner_cancels_the_keyed_tasks_it_takes_once_a_cancel_refuses_submits). */
enum { KS_KEYS = 3, KS_DRAIN = 32, KS_PER_KEY = 3 * KS_DRAIN };

typedef struct ks_item {
  int key, i;
} ks_item;

typedef struct ks_scene {
  uint64_t keys[KS_KEYS];
  ks_item items[KS_KEYS][KS_PER_KEY];
  _Atomic char outcome[KS_KEYS][KS_PER_KEY];
  atomic_int twice, gate_open;
  tt_count started, ended0, gate; /* ended0: key 0's tasks run or cancelled */
} ks_scene;

static ks_scene *ks_;

static void ks_end(const ks_item *it, char how) {
  char none = 0;
  if (!atomic_compare_exchange_strong(&ks_->outcome[it->key][it->i], &none, how))
    atomic_fetch_add(&ks_->twice, 1);
  if (it->key == 0) tt_count_add(&ks_->ended0, 1);
}

static int ks_task(void *arg) {
  ks_item *it = arg;
  if (it->key == 0 && it->i == 0) {
    tt_count_add(&ks_->started, 1);
    tt_count_wait_geq(&ks_->gate, 1);
  }
  ks_end(it, 'R');
  return 0;
}

static void ks_cancel(void *user, const tko_task_info *t) {
  (void)user;
  if (t->fn != ks_task) return;
  const ks_item *it = t->arg;
  ks_end(it, 'C');
  if (it->key == 0 && !atomic_exchange(&ks_->gate_open, 1)) {
    tt_count_add(&ks_->gate, 1);
    tt_count_wait_geq(&ks_->ended0, KS_DRAIN + 1); /* the visit's and this one */
  }
}

static void keyed_cancel_splits_each_key(tko_shutdown_mode mode) {
  ks_ = calloc(1, sizeof *ks_);
  cr_assert_not_null(ks_);
  ks_scene *s = ks_;
  /* Keys on lanes of their own (see two_lanes). */
  tko_pool *probe;
  tko_options po = tko_basic_options(1);
  cr_assert_eq(tko_pool_create(&probe, &po), 0);
  tko_lanes *l;
  cr_assert_eq(tko_lanes_create(&l, probe, NULL), 0);
  for (int k = 0, next = 1; k < KS_KEYS; k++) {
    for (bool fresh = false; !fresh; next++) {
      fresh = true;
      for (int j = 0; j < k; j++)
        if (tko_lanes_index(l, (uint64_t)next) == tko_lanes_index(l, s->keys[j])) fresh = false;
      s->keys[k] = (uint64_t)next;
    }
  }
  cr_assert_eq(tko_lanes_destroy(l), 0);
  cr_assert_eq(tko_pool_destroy(probe), 0);
  int rounds = TT_SCALE(20, 5), mixed = 0;
  for (int round = 0; round < rounds; round++) {
    memset(s->outcome, 0, sizeof s->outcome);
    atomic_store(&s->twice, 0);
    atomic_store(&s->gate_open, 0);
    tt_count_init(&s->started);
    tt_count_init(&s->ended0);
    tt_count_init(&s->gate);
    tko_options o = tko_basic_options(KS_KEYS);
    o.hooks.on_cancel = ks_cancel;
    tko_pool *p;
    cr_assert_eq(tko_pool_create(&p, &o), 0);
    /* All queued before any runner starts: key 0's first visit is then its
     * first KS_DRAIN tasks. */
    cr_assert_eq(tko_pool_pause(p), 0);
    for (int i = 0; i < KS_PER_KEY; i++)
      for (int k = 0; k < KS_KEYS; k++) {
        s->items[k][i] = (ks_item){k, i};
        cr_assert_eq(tko_submit_keyed(p, s->keys[k], ks_task, &s->items[k][i], 0), 0);
      }
    cr_assert_eq(tko_pool_resume(p), 0);
    cr_assert(tt_count_wait_geq(&s->started, 1));
    cr_assert_eq(tko_pool_shutdown(p, mode), 0);
    cr_assert_eq(tko_pool_destroy(p), 0); /* waits for the running tasks */
    cr_assert_eq(atomic_load(&s->twice), 0, "round %d: a task ended twice", round);
    for (int k = 0; k < KS_KEYS; k++) {
      char line[KS_PER_KEY + 1] = {0};
      for (int i = 0; i < KS_PER_KEY; i++) {
        char c = atomic_load(&s->outcome[k][i]);
        line[i] = c ? c : '-';
      }
      bool cancelled = false;
      for (int i = 0; i < KS_PER_KEY; i++) {
        cr_assert(line[i] == 'R' || line[i] == 'C', "round %d key %d task %d never ended",
                  round, k, i);
        cr_assert(!(cancelled && line[i] == 'R'),
                  "round %d key %d: a task ran after an earlier one was cancelled: %s", round, k,
                  line);
        cancelled |= line[i] == 'C';
      }
      if (k == 0 && cancelled && line[0] == 'R') mixed++;
    }
    tt_count_fini(&s->started);
    tt_count_fini(&s->ended0);
    tt_count_fini(&s->gate);
  }
  /* The shutdown met key 0's runner in the middle of its lane every round:
   * the check was not vacuous. */
  cr_assert_eq(mixed, rounds);
  free(s);
  ks_ = NULL;
}

Test(keyed_tasks, a_cancel_shutdown_runs_a_prefix_of_each_key_and_cancels_the_rest) {
  keyed_cancel_splits_each_key(TKO_CANCEL);
}

Test(keyed_tasks, a_nowait_shutdown_runs_a_prefix_of_each_key_and_cancels_the_rest) {
  keyed_cancel_splits_each_key(TKO_CANCEL_NOWAIT);
}
