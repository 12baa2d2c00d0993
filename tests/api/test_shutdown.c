/* SPDX-License-Identifier: MIT */
/* The pool's lifecycle at shutdown: everything that touches the pool from
 * outside its workers (a caller-runs task or batch, a submitter blocked on
 * a full queue) holds shutdown until it is done; the timed form returns
 * -ETIMEDOUT while anything runs and can be called again; TKO_CANCEL_NOWAIT
 * cancels what is queued and returns at once; a CANCEL after a timed-out
 * DRAIN cancels what is still queued. Tasks that must be running when the
 * test acts hold their thread on a gate the test opens; no test sleeps to
 * wait for something. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "taskorch.h"
#include "tko_test.h"
#include "tko_test_feature.h"
#include "tko_test_sync.h"

/* How long a test gives a shutdown that must not return yet to go wrong
 * (return early) before it lets the held task go. Never a wait for
 * something that has to happen. */
#define EARLY_MS 200

typedef struct held {
  tko_pool *pool;
  tt_pin pin;          /* the held task waits on pin.gate */
  atomic_int finished; /* the held task returned */
  tt_count runs, cancels;
  size_t batch;        /* caller-runs batch size (held task first) */
} held;

static void held_init(held *h) {
  memset(h, 0, sizeof *h);
  tt_count_init(&h->runs);
  tt_count_init(&h->cancels);
  pthread_mutex_init(&h->pin.gate.mu, NULL);
  pthread_cond_init(&h->pin.gate.cv, NULL);
  tt_count_init(&h->pin.started);
}

static int held_fn(void *arg) {
  held *h = arg;
  tt_count_add(&h->pin.started, 1);
  tt_gate_wait(&h->pin.gate);
  atomic_store(&h->finished, 1);
  tt_count_add(&h->runs, 1);
  return 0;
}

static int count_fn(void *arg) {
  tt_count_add(&((held *)arg)->runs, 1);
  return 0;
}

static void count_cancel(void *user, const tko_task_info *t) {
  (void)t;
  tt_count_add(&((held *)user)->cancels, 1);
}

static tko_pool *make_pool(held *h, size_t cap, tko_full_policy policy) {
  tko_options o = tko_basic_options(1);
  o.queue_capacity = cap;
  o.full_policy = policy;
  o.hooks.user = h;
  o.hooks.on_cancel = count_cancel;
  cr_assert_eq(tko_pool_create(&h->pool, &o), 0);
  return h->pool;
}

/* A full bounded pool: paused, with one task queued in its one slot. */
static tko_pool *make_full_pool(held *h, tko_full_policy policy) {
  tko_pool *pool = make_pool(h, 1, policy);
  cr_assert_eq(tko_pool_pause(pool), 0);
  cr_assert_eq(tko_submit(pool, count_fn, h, 0), 0);
  return pool;
}

/* Submits the held task (and, for a batch, more after it): on a full
 * caller-runs pool, it runs on this thread. */
static int submit_held(void *arg) {
  held *h = arg;
  if (!h->batch) return tko_submit(h->pool, held_fn, h, 0);
  tko_task tasks[8];
  for (size_t i = 0; i < h->batch; i++) tasks[i] = (tko_task){i ? count_fn : held_fn, h, 0};
  return tko_submit_batch(h->pool, tasks, h->batch);
}

/* Shuts the pool down; 0 if the held task had returned by then, 1 if not. */
static int shutdown_drain(void *arg) {
  held *h = arg;
  int rc = tko_pool_shutdown(h->pool, TKO_DRAIN);
  if (rc) return rc;
  return atomic_load(&h->finished) ? 0 : 1;
}

/* Starts a shutdown while the held task runs on a submitter's thread,
 * gives it EARLY_MS to return too early, then lets the task go. Returns
 * the submitter's result; *early says whether shutdown returned first. */
static int shutdown_during_caller_runs(held *h, bool *early) {
  tf_thread submitter, shutter;
  cr_assert_eq(tf_thread_start(&submitter, submit_held, h), 0);
  cr_assert(tt_count_wait_geq(&h->pin.started, 1));
  cr_assert_eq(tf_thread_start(&shutter, shutdown_drain, h), 0);
  int rc = -1;
  bool returned = tf_thread_join_within(&shutter, EARLY_MS, &rc);
  tt_gate_open(&h->pin.gate);
  int submitted = -1;
  cr_assert(tf_thread_join(&submitter, &submitted));
  if (!returned) cr_assert(tf_thread_join(&shutter, &rc));
  *early = rc != 0;
  return submitted;
}

/* Issue 14, defect 9: shutdown returned while a caller-runs task still ran
 * on a submitter's thread (stats.running 1), and destroy then freed the
 * pool under it. */
Test(shutdown, waits_for_a_caller_runs_task) {
  held h;
  held_init(&h);
  tko_pool *pool = make_full_pool(&h, TKO_FULL_CALLER_RUNS);
  bool early = true;
  cr_assert_eq(shutdown_during_caller_runs(&h, &early), 0);
  cr_assert_not(early, "shutdown returned while a caller-runs task ran");
  tko_stats s = tf_stats(pool);
  cr_assert_eq(s.running, 0);
  cr_assert_eq(s.completed, 2);
  cr_assert_eq(tko_pool_destroy(pool), 0);
}

/* Issue 14, defect 10: a caller-runs batch was not all-or-nothing: a
 * shutdown that began while its first task ran refused the rest
 * (-ESHUTDOWN after some had run). Once its first task runs, it runs all. */
Test(shutdown, a_caller_runs_batch_is_all_or_nothing) {
  held h;
  held_init(&h);
  h.batch = 5;
  tko_pool *pool = make_full_pool(&h, TKO_FULL_CALLER_RUNS);
  bool early = true;
  cr_assert_eq(shutdown_during_caller_runs(&h, &early), 0, "the batch was cut short");
  cr_assert_not(early);
  cr_assert_eq(tt_count_get(&h.runs), 1 + 5); /* the queued task and the batch */
  /* And a batch that comes after the close runs none. */
  tko_task tasks[3] = {{count_fn, &h, 0}, {count_fn, &h, 0}, {count_fn, &h, 0}};
  cr_assert_eq(tko_submit_batch(pool, tasks, 3), -ESHUTDOWN);
  cr_assert_eq(tt_count_get(&h.runs), 6);
  cr_assert_eq(tko_pool_destroy(pool), 0);
}

static int submit_blocked(void *arg) {
  held *h = arg;
  return tko_submit(h->pool, count_fn, h, 0);
}

/* Issue 14, defect 11: destroy while submitters were blocked on a full
 * blocking queue freed the pool under them (shutdown woke them but did not
 * wait for them to leave). Many submitters, so that some are still on
 * their way out when destroy would free: ASan+UBSan reported the use after
 * free in every run before the fix. */
Test(shutdown, destroy_waits_for_blocked_submitters_to_leave) {
  enum { T = 32 };
  for (int round = 0; round < TT_SCALE(10, 5); round++) {
    held h;
    held_init(&h);
    tko_pool *pool = make_full_pool(&h, TKO_FULL_BLOCK);
    tf_thread t[T];
    for (int i = 0; i < T; i++) cr_assert_eq(tf_thread_start(&t[i], submit_blocked, &h), 0);
    for (int i = 0; i < T; i++) cr_assert(tf_wait_thread_sleeping(t[i].tid));
    cr_assert_eq(tko_pool_destroy(pool), 0);
    for (int i = 0; i < T; i++) {
      int rc = 0;
      cr_assert(tf_thread_join(&t[i], &rc));
      cr_assert_eq(rc, -ESHUTDOWN);
    }
    cr_assert_eq(tt_count_get(&h.runs), 1);
  }
}

/* The timed form: -ETIMEDOUT while a task runs, the pool closed meanwhile,
 * and a later call finishes the job. */
Test(shutdown, timed_times_out_while_a_task_runs_and_can_be_called_again) {
  held h;
  held_init(&h);
  tko_pool *pool = make_pool(&h, 0, TKO_FULL_BLOCK);
  cr_assert_eq(tko_submit(pool, held_fn, &h, 0), 0);
  cr_assert(tt_count_wait_geq(&h.pin.started, 1));
  cr_assert_eq(tko_submit(pool, count_fn, &h, 0), 0);
  cr_assert_eq(tko_pool_shutdown_timed(pool, TKO_DRAIN, 0), -ETIMEDOUT);
  cr_assert_eq(tko_submit(pool, count_fn, &h, 0), -ESHUTDOWN);
  cr_assert_eq(tko_pool_shutdown_timed(pool, TKO_DRAIN, 20), -ETIMEDOUT);
  cr_assert_eq(tko_pool_wait_idle(pool, 0), -ETIMEDOUT);
  tt_gate_open(&h.pin.gate);
  cr_assert_eq(tko_pool_shutdown_timed(pool, TKO_DRAIN, -1), 0);
  cr_assert_eq(tt_count_get(&h.runs), 2); /* the held task and the queued one */
  cr_assert_eq(tko_pool_shutdown_timed(pool, TKO_CANCEL, 0), 0); /* idempotent */
  cr_assert_eq(tko_pool_shutdown_timed(pool, (tko_shutdown_mode)3, 0), -EINVAL);
  cr_assert_eq(tko_pool_shutdown_timed(pool, TKO_DRAIN, -2), -EINVAL);
  cr_assert_eq(tko_pool_destroy(pool), 0);
}

/* The timed form also waits for a caller-runs task (the gate). */
Test(shutdown, timed_times_out_while_a_caller_runs_task_runs) {
  held h;
  held_init(&h);
  tko_pool *pool = make_full_pool(&h, TKO_FULL_CALLER_RUNS);
  tf_thread submitter;
  cr_assert_eq(tf_thread_start(&submitter, submit_held, &h), 0);
  cr_assert(tt_count_wait_geq(&h.pin.started, 1));
  cr_assert_eq(tko_pool_shutdown_timed(pool, TKO_DRAIN, 0), -ETIMEDOUT);
  tt_gate_open(&h.pin.gate);
  int rc = -1;
  cr_assert(tf_thread_join(&submitter, &rc));
  cr_assert_eq(rc, 0);
  cr_assert_eq(tko_pool_shutdown_timed(pool, TKO_DRAIN, -1), 0);
  cr_assert_eq(tt_count_get(&h.runs), 2);
  cr_assert_eq(tko_pool_destroy(pool), 0);
}

/* TKO_CANCEL_NOWAIT: queued tasks go to on_cancel and the call returns
 * while a task still runs; destroy then waits for it. */
Test(shutdown, cancel_nowait_cancels_the_queue_and_returns_at_once) {
  enum { N = 5 };
  held h;
  held_init(&h);
  tko_pool *pool = make_pool(&h, 0, TKO_FULL_BLOCK);
  cr_assert_eq(tko_submit(pool, held_fn, &h, 0), 0);
  cr_assert(tt_count_wait_geq(&h.pin.started, 1));
  for (int i = 0; i < N; i++) cr_assert_eq(tko_submit(pool, count_fn, &h, 0), 0);
  cr_assert_eq(tko_pool_shutdown_timed(pool, TKO_CANCEL_NOWAIT, -1), 0);
  cr_assert_eq(tt_count_get(&h.cancels), N);
  cr_assert_eq(atomic_load(&h.finished), 0); /* it could not have returned */
  cr_assert_eq(tko_submit(pool, count_fn, &h, 0), -ESHUTDOWN);
  cr_assert_eq(tko_pool_shutdown_timed(pool, TKO_DRAIN, 0), -ETIMEDOUT);
  tt_gate_open(&h.pin.gate);
  cr_assert_eq(tko_pool_destroy(pool), 0);
  cr_assert_eq(tt_count_get(&h.runs), 1);
  cr_assert_eq(tt_count_get(&h.cancels), N);
}

/* A CANCEL after a DRAIN that timed out cancels what is still queued. */
Test(shutdown, a_cancel_after_a_timed_out_drain_cancels_the_rest) {
  enum { N = 5 };
  held h;
  held_init(&h);
  tko_pool *pool = make_pool(&h, 0, TKO_FULL_BLOCK);
  cr_assert_eq(tko_submit(pool, held_fn, &h, 0), 0);
  cr_assert(tt_count_wait_geq(&h.pin.started, 1));
  for (int i = 0; i < N; i++) cr_assert_eq(tko_submit(pool, count_fn, &h, 0), 0);
  cr_assert_eq(tko_pool_shutdown_timed(pool, TKO_DRAIN, 0), -ETIMEDOUT);
  cr_assert_eq(tt_count_get(&h.cancels), 0);
  cr_assert_eq(tko_pool_shutdown_timed(pool, TKO_CANCEL, 0), -ETIMEDOUT);
  cr_assert_eq(tt_count_get(&h.cancels), N);
  tt_gate_open(&h.pin.gate);
  cr_assert_eq(tko_pool_shutdown(pool, TKO_CANCEL), 0);
  cr_assert_eq(tt_count_get(&h.runs), 1);
  tko_stats s = tf_stats(pool);
  cr_assert_eq(s.submitted, 1 + N);
  cr_assert_eq(s.completed + s.cancelled, 1 + N);
  cr_assert_eq(tko_pool_destroy(pool), 0);
}

/* An allocator that keeps what it is given back until the test ends, so a
 * destroyed pool's memory stays mapped and unreused (as it would be, for a
 * while, under a real allocator) and ASan sees no access to freed memory. */
typedef struct keeper {
  void *blocks[4096];
  int n;
  pthread_mutex_t mu; /* protects blocks and n */
} keeper;

static void *keep_alloc(void *ctx, size_t size) {
  (void)ctx;
  return aligned_alloc(64, (size + 63) / 64 * 64); /* the pool's cache-line alignment */
}
static void *keep_realloc(void *ctx, void *p, size_t size) {
  (void)ctx;
  return realloc(p, size);
}
static void keep_free(void *ctx, void *p) {
  keeper *k = ctx;
  if (!p) return;
  pthread_mutex_lock(&k->mu);
  if (k->n < 4096) k->blocks[k->n++] = p;
  else free(p);
  pthread_mutex_unlock(&k->mu);
}

static void keeper_release(keeper *k) {
  for (int i = 0; i < k->n; i++) free(k->blocks[i]);
  k->n = 0;
}

/* Issue 14, defect 20 (the pool's part): a second destroy and calls on a
 * destroyed pool were silent uses of freed memory (the second destroy
 * freed everything again). A handle carries a magic number that destroy
 * clears: while the memory is not reused, each such call is -EINVAL. */
Test(shutdown, calls_on_a_destroyed_pool_are_einval) {
  static keeper k = {.mu = PTHREAD_MUTEX_INITIALIZER};
  tko_allocator al = {keep_alloc, keep_realloc, keep_free, &k};
  tko_options o = tko_basic_options(1);
  o.allocator = &al;
  held h;
  held_init(&h);
  tko_pool *pool = NULL;
  cr_assert_eq(tko_pool_create(&pool, &o), 0);
  cr_assert_eq(tko_submit(pool, count_fn, &h, 0), 0);
  cr_assert_eq(tko_pool_destroy(pool), 0);
  int freed = k.n;
  cr_assert_eq(tko_pool_destroy(pool), -EINVAL, "a second destroy was accepted");
  cr_assert_eq(k.n, freed, "the second destroy freed memory again");
  cr_assert_eq(tko_submit(pool, count_fn, &h, 0), -EINVAL);
  tko_task t = {count_fn, &h, 0};
  cr_assert_eq(tko_submit_batch(pool, &t, 1), -EINVAL);
  cr_assert_eq(tko_submit_timed(pool, count_fn, &h, 0, 0), -EINVAL);
  cr_assert_eq(tko_pool_wait_idle(pool, 0), -EINVAL);
  cr_assert_eq(tko_pool_shutdown(pool, TKO_DRAIN), -EINVAL);
  cr_assert_eq(tko_pool_shutdown_timed(pool, TKO_CANCEL, 0), -EINVAL);
  cr_assert_eq(tko_pool_pause(pool), -EINVAL);
  cr_assert_eq(tko_pool_resume(pool), -EINVAL);
  tko_stats s;
  memset(&s, 0xff, sizeof s);
  tko_pool_stats(pool, &s);
  cr_assert_eq(s.submitted, 0);
  cr_assert_eq(tt_count_get(&h.runs), 1);
  keeper_release(&k);
}
