/* SPDX-License-Identifier: MIT */
/* tko_submit_keyed and the pool around it: shutdown and destroy of a pool
 * with keyed tasks (paused, closing, cancelling with an on_cancel that calls
 * back into the pool), and the pool's first keyed submits racing. These are
 * regressions of issue 14; each test names the defect. Calls that used to
 * hang run on a helper thread that the test joins with a deadline, so a
 * hang fails an assertion instead of the suite. Also: each submitter's tasks
 * of a key run in its submit order, for keyed tasks and lane tables alike. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <taskorch.h>
#include <taskorch/lanes.h>

#include "tko_test.h"
#include "tko_test_fault.h"
#include "tko_test_feature.h"
#include "tko_test_sync.h"

/* A hang shows within this; the calls below return in milliseconds. */
#define KT_HANG_MS 20000L

typedef struct shutdown_call {
  tko_pool *pool;
  tko_shutdown_mode mode;
} shutdown_call;

static int shutdown_fn(void *arg) {
  shutdown_call *c = arg;
  return tko_pool_shutdown(c->pool, c->mode);
}

static int destroy_fn(void *arg) { return tko_pool_destroy(arg); }

/* Issue 14, defect 1: shutdown and destroy of a paused pool with keyed
 * tasks pending used to hang: the keyed lanes were drained before the pool
 * was unpaused, and their runners could not start. Now shutdown unpauses
 * first and the keyed tasks run like any other queued task. */
static void paused_pool_with_keyed_tasks(bool via_destroy) {
  enum { N = 40 };
  static tft_token tok[N];
  memset(tok, 0, sizeof tok);
  tko_options o = tko_basic_options(2);
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  cr_assert_eq(tko_pool_pause(p), 0);
  for (int i = 0; i < N; i++) {
    cr_assert_eq(tko_submit_keyed(p, (uint64_t)(i % 5), tft_run, &tok[i], 0), 0);
    tok[i].accepted = true;
  }
  cr_assert_eq(tko_pool_wait_idle(p, 0), -ETIMEDOUT); /* paused: nothing ran */
  tf_thread t;
  shutdown_call c = {p, TKO_DRAIN};
  cr_assert_eq(via_destroy ? tf_thread_start(&t, destroy_fn, p) : tf_thread_start(&t, shutdown_fn, &c),
               0);
  int rc = -1;
  cr_assert(tf_thread_join_within(&t, KT_HANG_MS, &rc), "shutdown of a paused pool hangs");
  cr_assert_eq(rc, 0);
  cr_assert_eq(tft_first_bad(tok, N), -1);
  for (int i = 0; i < N; i++) cr_assert_eq(atomic_load(&tok[i].runs), 1);
  if (!via_destroy) cr_assert_eq(tko_pool_destroy(p), 0);
}

Test(keyed, shutdown_of_a_paused_pool_runs_its_keyed_tasks) {
  paused_pool_with_keyed_tasks(false);
}

Test(keyed, destroy_of_a_paused_pool_runs_its_keyed_tasks) {
  paused_pool_with_keyed_tasks(true);
}

/* Issue 14, defect 3: tko_submit used to return 0 during a DRAIN shutdown
 * while the keyed lanes drained (the pool was closed only after them). A
 * keyed task holds the only worker; once the shutting-down thread sleeps
 * (it is inside shutdown, waiting for that task), submits are refused. */
Test(keyed, submits_are_refused_once_a_drain_shutdown_began) {
  tko_options o = tko_basic_options(1);
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  static tt_pin pin = TT_PIN_INIT;
  static tft_token tok[3];
  memset(tok, 0, sizeof tok);
  cr_assert_eq(tko_submit_keyed(p, 7, tt_pin_fn, &pin, 0), 0);
  cr_assert(tt_count_wait_geq(&pin.started, 1));
  cr_assert_eq(tko_submit_keyed(p, 7, tft_run, &tok[0], 0), 0); /* queued behind it */
  tok[0].accepted = true;
  tf_thread t;
  shutdown_call c = {p, TKO_DRAIN};
  cr_assert_eq(tf_thread_start(&t, shutdown_fn, &c), 0);
  cr_assert(tf_wait_thread_sleeping(t.tid));
  cr_assert_eq(tko_submit(p, tft_run, &tok[1], 0), -ESHUTDOWN);
  cr_assert_eq(tko_submit_keyed(p, 8, tft_run, &tok[2], 0), -ESHUTDOWN);
  tt_gate_open(&pin.gate);
  int rc = -1;
  cr_assert(tf_thread_join_within(&t, KT_HANG_MS, &rc));
  cr_assert_eq(rc, 0);
  cr_assert_eq(tft_first_bad(tok, 3), -1); /* the queued keyed task ran, the refused ones not */
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* Issue 14, defect 2: a keyed task's on_cancel that shut its pool down
 * deadlocked on the shutdown in progress (a plain task's on_cancel got
 * -EDEADLK). Now it gets -EDEADLK too, and the shutdown finishes. */
static tko_pool *reentrant_pool;
static tt_count reentrant_calls = TT_COUNT_INIT;
static atomic_int reentrant_bad;

static void shutdown_from_on_cancel(void *user, const tko_task_info *task) {
  (void)user;
  if (tko_pool_shutdown(reentrant_pool, TKO_DRAIN) != -EDEADLK) atomic_fetch_add(&reentrant_bad, 1);
  if (tko_pool_wait_idle(reentrant_pool, -1) != -EDEADLK) atomic_fetch_add(&reentrant_bad, 1);
  tft_on_cancel(NULL, task);
  tt_count_add(&reentrant_calls, 1);
}

Test(keyed, on_cancel_of_a_keyed_task_gets_edeadlk_from_its_pool) {
  tko_options o = tko_basic_options(1);
  o.hooks.on_cancel = shutdown_from_on_cancel;
  cr_assert_eq(tko_pool_create(&reentrant_pool, &o), 0);
  static tt_pin pin = TT_PIN_INIT;
  static tft_token tok[4];
  memset(tok, 0, sizeof tok);
  cr_assert_eq(tko_submit(reentrant_pool, tt_pin_fn, &pin, 0), 0);
  cr_assert(tt_count_wait_geq(&pin.started, 1));
  for (int i = 0; i < 4; i++) {
    cr_assert_eq(tko_submit_keyed(reentrant_pool, (uint64_t)i % 2, tft_run, &tok[i], 0), 0);
    tok[i].accepted = true;
  }
  tf_thread t;
  shutdown_call c = {reentrant_pool, TKO_CANCEL};
  cr_assert_eq(tf_thread_start(&t, shutdown_fn, &c), 0);
  cr_assert(tt_count_wait_geq(&reentrant_calls, 4), "on_cancel hangs in shutdown");
  tt_gate_open(&pin.gate);
  int rc = -1;
  cr_assert(tf_thread_join_within(&t, KT_HANG_MS, &rc));
  cr_assert_eq(rc, 0);
  cr_assert_eq(atomic_load(&reentrant_bad), 0);
  cr_assert_eq(tft_first_bad(tok, 4), -1);
  for (int i = 0; i < 4; i++) cr_assert_eq(atomic_load(&tok[i].cancels), 1);
  cr_assert_eq(tko_pool_destroy(reentrant_pool), 0);
}

/* Issue 14, defect 14: two tasks making the pool's first keyed submit at
 * once each made a lane table; the loser's was destroyed from inside a
 * task, which is -EDEADLK, so it leaked. The allocator holds the first
 * table allocation until the other task's keyed submit has returned (or a
 * short while, for a library where that submit waits for the first table),
 * which makes the race happen every time. */
typedef struct race {
  tfa f;
  atomic_bool armed;
  pthread_mutex_t mu; /* guards returned and arrivals */
  pthread_cond_t cv;
  int returned, arrivals;
  pthread_barrier_t start;
  tko_pool *pool;
  tft_token tok[2];
} race;

static race rc_;

static void *race_alloc(void *ctx, size_t size) {
  race *r = ctx;
  if (atomic_exchange(&r->armed, false)) { /* the first allocation in the window */
    struct timespec dl;
    tt_deadline(&dl, 500);
    pthread_mutex_lock(&r->mu);
    while (r->returned == 0 && pthread_cond_timedwait(&r->cv, &r->mu, &dl) != ETIMEDOUT) {
    }
    pthread_mutex_unlock(&r->mu);
  }
  return tfa_alloc(&r->f, size);
}

static void *race_realloc(void *ctx, void *p, size_t size) { return tfa_realloc(&((race *)ctx)->f, p, size); }
static void race_free(void *ctx, void *p) { tfa_free(&((race *)ctx)->f, p); }

static int first_keyed(void *arg) {
  tft_token *tok = arg;
  pthread_barrier_wait(&rc_.start);
  int rc = tko_submit_keyed(rc_.pool, (uint64_t)(tok - rc_.tok), tft_run, tok, 0);
  tok->accepted = rc == 0;
  pthread_mutex_lock(&rc_.mu);
  rc_.returned++;
  pthread_cond_broadcast(&rc_.cv);
  pthread_mutex_unlock(&rc_.mu);
  return 0;
}

Test(keyed, first_keyed_submits_racing_make_one_table_and_leak_nothing) {
  race *r = &rc_;
  for (int round = 0; round < TT_SCALE(4, 2); round++) {
    memset(r, 0, sizeof *r);
    tfa_init(&r->f);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    pthread_barrier_init(&r->start, NULL, 2);
    tko_allocator al = {race_alloc, race_realloc, race_free, r};
    tko_options o = tko_basic_options(2);
    o.max_batch = 1; /* the two tasks must run on two workers, at once */
    o.allocator = &al;
    cr_assert_eq(tko_pool_create(&r->pool, &o), 0);
    atomic_store(&r->armed, true);
    cr_assert_eq(tko_submit(r->pool, first_keyed, &r->tok[0], 0), 0);
    cr_assert_eq(tko_submit(r->pool, first_keyed, &r->tok[1], 0), 0);
    cr_assert_eq(tko_pool_wait_idle(r->pool, TT_LONG_MS), 0);
    cr_assert_eq(tko_pool_destroy(r->pool), 0);
    cr_assert(r->tok[0].accepted && r->tok[1].accepted);
    cr_assert_eq(tft_first_bad(r->tok, 2), -1);
    cr_assert_eq(atomic_load(&r->f.live), 0, "round %d: a lane table leaked", round);
    pthread_barrier_destroy(&r->start);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
  }
}

/* Issue 17, defect 1: on a full TKO_FULL_BLOCK pool (capacity 1, one
 * worker), a host thread's keyed submit that had to start its lane's runner
 * waited for room holding the lane's lock; the worker's task then made a
 * keyed submit to that lane, blocked on the lock, and no room ever came. The
 * host thread now waits with the lane unlocked. */
typedef struct lockstep {
  tko_pool *pool;
  tko_lanes *lanes; /* NULL: the pool's keyed table (tko_submit_keyed) */
  tt_count worker_in, host_ready, done;
  pid_t host_tid;
  atomic_int worker_rc;
  tft_token tok[2];
} lockstep;

static lockstep ls_;

static int lockstep_submit(lockstep *s, tft_token *t) {
  return s->lanes ? tko_lanes_submit(s->lanes, 9, tft_run, t, 0)
                  : tko_submit_keyed(s->pool, 9, tft_run, t, 0);
}

static int lockstep_worker(void *arg) {
  lockstep *s = arg;
  tt_count_add(&s->worker_in, 1);
  tt_count_wait_geq(&s->host_ready, 1);
  tf_wait_thread_sleeping(s->host_tid); /* the host thread waits for room */
  atomic_store(&s->worker_rc, lockstep_submit(s, &s->tok[1]));
  tt_count_add(&s->done, 1);
  return 0;
}

static int lockstep_host(void *arg) {
  lockstep *s = arg;
  return lockstep_submit(s, &s->tok[0]);
}

static void lockstep_run(bool lanes) {
  lockstep *s = &ls_;
  memset(s, 0, sizeof *s);
  tt_count_init(&s->worker_in);
  tt_count_init(&s->host_ready);
  tt_count_init(&s->done);
  tko_options o = tko_basic_options(1);
  o.queue_capacity = 1;
  o.full_policy = TKO_FULL_BLOCK;
  cr_assert_eq(tko_pool_create(&s->pool, &o), 0);
  if (lanes) cr_assert_eq(tko_lanes_create(&s->lanes, s->pool, NULL), 0);
  atomic_init(&s->worker_rc, 1);
  cr_assert_eq(tko_submit(s->pool, lockstep_worker, s, 0), 0);
  cr_assert(tt_count_wait_geq(&s->worker_in, 1));
  cr_assert_eq(tko_submit(s->pool, tt_nop_fn, NULL, 0), 0); /* the queue is full */
  tf_thread host;
  cr_assert_eq(tf_thread_start(&host, lockstep_host, s), 0);
  s->host_tid = host.tid;
  tt_count_add(&s->host_ready, 1);
  cr_assert(tt_count_wait_geq(&s->done, 1), "the worker's submit waits on the lane lock");
  /* A lane table's task needs no room once its runner is out; a keyed task
   * takes room too (defect 9): a worker's keyed submit to its own full
   * blocking queue is -EAGAIN, as its plain submit is. */
  cr_assert_eq(atomic_load(&s->worker_rc), lanes ? 0 : -EAGAIN);
  int rc = -1;
  cr_assert(tf_thread_join_within(&host, KT_HANG_MS, &rc));
  cr_assert_eq(rc, 0);
  if (lanes) cr_assert_eq(tko_lanes_wait_idle(s->lanes, TT_LONG_MS), 0);
  cr_assert_eq(tko_pool_wait_idle(s->pool, TT_LONG_MS), 0);
  s->tok[0].accepted = true;
  s->tok[1].accepted = lanes;
  cr_assert_eq(tft_first_bad(s->tok, 2), -1);
  if (lanes) cr_assert_eq(tko_lanes_destroy(s->lanes), 0);
  cr_assert_eq(tko_pool_destroy(s->pool), 0);
}

Test(keyed, a_submit_waiting_for_room_holds_no_lane_lock) { lockstep_run(false); }

/* The same through a lane table of the host's own (tko_lanes_submit), whose
 * first runner of a lane waits for room with the lane unlocked. */
Test(keyed, a_lanes_submit_waiting_for_room_holds_no_lane_lock) { lockstep_run(true); }

/* ---- per-key submit order, with several submitters ---------------------- */

/* Submitters each queue tasks for a few keys, all while the pool is paused
 * (so a key's tasks pile up before its lane runs), then the pool runs
 * them: each submitter's tasks of a key run in the order it submitted
 * them, whatever the other submitters interleaved. A task checks that it
 * follows its submitter's previous task of its key (the key's tasks run
 * one at a time, so the check needs no lock of its own). */
enum { PO_SUBMITTERS = 4, PO_KEYS = 3, PO_EACH = 200 };

typedef struct po_task {
  struct po_scene *s;
  int sub, key, seq;
} po_task;

typedef struct po_scene {
  tko_pool *p;
  tko_lanes *l; /* NULL: tko_submit_keyed */
  po_task tasks[PO_SUBMITTERS][PO_KEYS][PO_EACH];
  atomic_int next[PO_SUBMITTERS][PO_KEYS]; /* the seq each (submitter, key) expects */
  atomic_int out_of_order, ran, refused;
} po_scene;

static int po_run(void *arg) {
  po_task *t = arg;
  po_scene *s = t->s;
  if (atomic_load(&s->next[t->sub][t->key]) != t->seq) atomic_fetch_add(&s->out_of_order, 1);
  atomic_store(&s->next[t->sub][t->key], t->seq + 1);
  atomic_fetch_add(&s->ran, 1);
  return 0;
}

typedef struct po_submitter {
  po_scene *s;
  int sub;
} po_submitter;

static void *po_submit(void *arg) {
  po_submitter *me = arg;
  po_scene *s = me->s;
  for (int seq = 0; seq < PO_EACH; seq++)
    for (int key = 0; key < PO_KEYS; key++) {
      po_task *t = &s->tasks[me->sub][key][seq];
      *t = (po_task){s, me->sub, key, seq};
      uint64_t k = 100 + (uint64_t)key;
      int rc = s->l ? tko_lanes_submit(s->l, k, po_run, t, 0)
                    : tko_submit_keyed(s->p, k, po_run, t, 0);
      if (rc) atomic_fetch_add(&s->refused, 1);
    }
  return NULL;
}

static void per_key_order_under_submitters(bool lanes) {
  po_scene *s = calloc(1, sizeof *s);
  cr_assert_not_null(s);
  tko_options o = tko_basic_options(2);
  cr_assert_eq(tko_pool_create(&s->p, &o), 0);
  if (lanes) {
    tko_lane_options lo = tko_lane_default_options();
    lo.max_drain = 8; /* many visits, each a batch */
    cr_assert_eq(tko_lanes_create(&s->l, s->p, &lo), 0);
  }
  cr_assert_eq(tko_pool_pause(s->p), 0);
  pthread_t th[PO_SUBMITTERS];
  po_submitter who[PO_SUBMITTERS];
  for (int i = 0; i < PO_SUBMITTERS; i++) {
    who[i] = (po_submitter){s, i};
    cr_assert_eq(pthread_create(&th[i], NULL, po_submit, &who[i]), 0);
  }
  for (int i = 0; i < PO_SUBMITTERS; i++) cr_assert_eq(pthread_join(th[i], NULL), 0);
  cr_assert_eq(tko_pool_resume(s->p), 0);
  if (s->l) cr_assert_eq(tko_lanes_wait_idle(s->l, TT_LONG_MS), 0);
  cr_assert_eq(tko_pool_wait_idle(s->p, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&s->refused), 0);
  cr_assert_eq(atomic_load(&s->ran), PO_SUBMITTERS * PO_KEYS * PO_EACH);
  cr_assert_eq(atomic_load(&s->out_of_order), 0,
               "a key's tasks ran out of their submitter's order");
  if (s->l) cr_assert_eq(tko_lanes_destroy(s->l), 0);
  cr_assert_eq(tko_pool_destroy(s->p), 0);
  free(s);
}

Test(keyed, each_submitters_keyed_tasks_of_a_key_run_in_its_order) {
  per_key_order_under_submitters(false);
}

Test(keyed, each_submitters_lane_tasks_of_a_key_run_in_its_order) {
  per_key_order_under_submitters(true);
}

/* A worker of pool A submits a keyed task to pool B, whose bounded queue is
 * full and whose policy is TKO_FULL_CALLER_RUNS: the task runs on A's
 * worker before the submit returns, counted by B as a caller's run. */
typedef struct cross_keyed {
  tko_pool *b;
  pthread_t submitter, ran_on;
  atomic_int ran;
  int rc, ran_at_return;
} cross_keyed;

static int keyed_here_fn(void *arg) {
  cross_keyed *x = arg;
  x->ran_on = pthread_self();
  atomic_fetch_add(&x->ran, 1);
  return 0;
}

static int submit_keyed_to_b(void *arg) {
  cross_keyed *x = arg;
  x->submitter = pthread_self();
  x->rc = tko_submit_keyed(x->b, 1, keyed_here_fn, x, 0);
  x->ran_at_return = atomic_load(&x->ran);
  return 0;
}

Test(keyed, a_full_caller_runs_pool_runs_a_keyed_task_on_another_pools_worker) {
  static cross_keyed x;
  memset(&x, 0, sizeof x);
  x.rc = 1;
  tko_options o = tko_basic_options(1);
  o.queue_capacity = 1;
  o.full_policy = TKO_FULL_CALLER_RUNS;
  cr_assert_eq(tko_pool_create(&x.b, &o), 0);
  o = tko_basic_options(1);
  tko_pool *a;
  cr_assert_eq(tko_pool_create(&a, &o), 0);
  static tft_token filler;
  memset(&filler, 0, sizeof filler);
  cr_assert_eq(tko_pool_pause(x.b), 0);
  cr_assert_eq(tko_submit(x.b, tft_run, &filler, 0), 0); /* the queue is full */
  cr_assert_eq(tko_submit(a, submit_keyed_to_b, &x, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(a, KT_HANG_MS), 0);
  cr_assert_eq(x.rc, 0);
  cr_assert_eq(x.ran_at_return, 1, "the keyed task had not run when the submit returned");
  cr_assert(pthread_equal(x.ran_on, x.submitter), "it ran on another thread");
  tko_stats st;
  tko_pool_stats(x.b, &st);
  cr_assert_eq(st.completed, 1);
  cr_assert_eq(atomic_load(&filler.runs), 0);
  cr_assert_eq(tko_pool_resume(x.b), 0);
  cr_assert_eq(tko_pool_wait_idle(x.b, KT_HANG_MS), 0);
  cr_assert_eq(atomic_load(&filler.runs), 1);
  cr_assert_eq(tko_pool_destroy(a), 0);
  cr_assert_eq(tko_pool_destroy(x.b), 0);
}

/* A CANCEL hands the keyed tasks still queued to on_cancel once the pool
 * refuses submits, so an on_cancel that submits is refused, as it is for
 * the pool's other tasks, not while attached objects resolve, when plain
 * submits are still accepted. */
static tko_pool *cancel_submit_pool;
static tft_token cancel_submit_tok[3];
static atomic_int cancel_submit_rc;

static void submit_from_on_cancel(void *user, const tko_task_info *task) {
  tft_on_cancel(user, task);
  if (task->arg != &cancel_submit_tok[0]) return;
  int rc = tko_submit(cancel_submit_pool, tft_run, &cancel_submit_tok[2], 0);
  cancel_submit_tok[2].accepted = rc == 0;
  atomic_store(&cancel_submit_rc, rc);
}

Test(keyed, an_on_cancel_of_a_cancelled_keyed_task_cannot_submit) {
  memset(cancel_submit_tok, 0, sizeof cancel_submit_tok);
  atomic_store(&cancel_submit_rc, 1);
  tko_options o = tko_basic_options(1);
  o.hooks.on_cancel = submit_from_on_cancel;
  cr_assert_eq(tko_pool_create(&cancel_submit_pool, &o), 0);
  tko_pool *p = cancel_submit_pool;
  static tt_pin pin = TT_PIN_INIT;
  cr_assert_eq(tko_submit(p, tt_pin_fn, &pin, 10), 0);
  cr_assert(tt_count_wait_geq(&pin.started, 1));
  cr_assert_eq(tko_submit_keyed(p, 7, tft_run, &cancel_submit_tok[0], 0), 0);
  cancel_submit_tok[0].accepted = true;
  cr_assert_eq(tko_submit(p, tft_run, &cancel_submit_tok[1], 0), 0);
  cancel_submit_tok[1].accepted = true;
  tf_thread t;
  shutdown_call c = {p, TKO_CANCEL};
  cr_assert_eq(tf_thread_start(&t, shutdown_fn, &c), 0);
  cr_assert(tf_wait_thread_sleeping(t.tid)); /* waiting for the pinned task */
  tt_gate_open(&pin.gate);
  int rc = -1;
  cr_assert(tf_thread_join_within(&t, KT_HANG_MS, &rc));
  cr_assert_eq(rc, 0);
  cr_assert_eq(atomic_load(&cancel_submit_rc), -ESHUTDOWN,
               "on_cancel's submit during a CANCEL returned %d", atomic_load(&cancel_submit_rc));
  cr_assert_eq(atomic_load(&cancel_submit_tok[0].cancels), 1, "the keyed task was not cancelled");
  cr_assert_eq(tft_first_bad(cancel_submit_tok, 3), -1);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* A DRAIN that timed out and goes on as a CANCEL hands the keyed tasks
 * still queued behind a running one to on_cancel, as a CANCEL from the
 * start does; they used to run after it. */
Test(keyed, a_cancel_after_a_timed_out_drain_cancels_the_queued_keyed_tasks) {
  tko_options o = tko_basic_options(1);
  o.hooks.on_cancel = tft_on_cancel;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  static tt_pin pin = TT_PIN_INIT;
  static tft_token behind;
  memset(&behind, 0, sizeof behind);
  cr_assert_eq(tko_submit_keyed(p, 7, tt_pin_fn, &pin, 0), 0);
  cr_assert(tt_count_wait_geq(&pin.started, 1));
  cr_assert_eq(tko_submit_keyed(p, 7, tft_run, &behind, 0), 0); /* in the lane, behind it */
  behind.accepted = true;
  cr_assert_eq(tko_pool_shutdown_timed(p, TKO_DRAIN, 0), -ETIMEDOUT);
  cr_assert_eq(tko_pool_shutdown_timed(p, TKO_CANCEL, 0), -ETIMEDOUT); /* the pinned task runs */
  int cancels = atomic_load(&behind.cancels);
  tt_gate_open(&pin.gate);
  cr_assert_eq(tko_pool_shutdown(p, TKO_CANCEL), 0);
  cr_assert_eq(cancels, 1, "the keyed task behind the running one was not cancelled");
  cr_assert_eq(tft_first_bad(&behind, 1), -1);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* A runner that is running when a CANCEL begins goes on with its lane, but
 * each keyed task it takes once the pool refuses submits goes to on_cancel
 * instead of starting, as a task a worker took does: none starts after a
 * thread saw the refusal. The closer is held in a plain task's on_cancel,
 * before the keyed lanes' own cancel, while the lane's first task returns
 * and its runner takes the tasks behind it. */
enum { BEHIND_RUNNER = 8 };
static tft_token behind_runner[BEHIND_RUNNER];
static tt_count behind_handled = TT_COUNT_INIT;
static tt_pin closer_held = TT_PIN_INIT;
static int held_plain;

static int run_behind(void *arg) {
  tft_run(arg);
  tt_count_add(&behind_handled, 1);
  return 0;
}

static void hold_closer_or_count(void *user, const tko_task_info *task) {
  if (task->arg == &held_plain) {
    (void)tt_pin_fn(&closer_held);
    return;
  }
  tft_on_cancel(user, task);
  tt_count_add(&behind_handled, 1);
}

Test(keyed, a_running_runner_cancels_the_keyed_tasks_it_takes_once_a_cancel_refuses_submits) {
  memset(behind_runner, 0, sizeof behind_runner);
  tko_options o = tko_basic_options(1);
  o.hooks.on_cancel = hold_closer_or_count;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  static tt_pin first = TT_PIN_INIT;
  cr_assert_eq(tko_submit_keyed(p, 7, tt_pin_fn, &first, 0), 0);
  cr_assert(tt_count_wait_geq(&first.started, 1));
  for (int i = 0; i < BEHIND_RUNNER; i++) {
    cr_assert_eq(tko_submit_keyed(p, 7, run_behind, &behind_runner[i], 0), 0);
    behind_runner[i].accepted = true;
  }
  cr_assert_eq(tko_submit(p, tt_nop_fn, &held_plain, 0), 0); /* queued: the worker is busy */
  tf_thread t;
  shutdown_call c = {p, TKO_CANCEL};
  cr_assert_eq(tf_thread_start(&t, shutdown_fn, &c), 0);
  cr_assert(tt_count_wait_geq(&closer_held.started, 1), "the CANCEL never cancelled the plain task");
  cr_assert_eq(tko_submit(p, tt_nop_fn, NULL, 0), -ESHUTDOWN);
  tt_gate_open(&first.gate);
  cr_assert(tt_count_wait_geq(&behind_handled, BEHIND_RUNNER),
            "the tasks behind the runner were neither run nor cancelled");
  long accepted, runs, cancels;
  tft_counts(behind_runner, BEHIND_RUNNER, &accepted, &runs, &cancels);
  cr_assert_eq(runs, 0, "%ld keyed tasks started after the CANCEL refused a submit", runs);
  tt_gate_open(&closer_held.gate);
  int rc = -1;
  cr_assert(tf_thread_join_within(&t, KT_HANG_MS, &rc));
  cr_assert_eq(rc, 0);
  cr_assert_eq(tft_first_bad(behind_runner, BEHIND_RUNNER), -1);
  cr_assert_eq(tko_pool_destroy(p), 0);
}
