/* SPDX-License-Identifier: MIT */
/* The close of a pool (src/engine/lifecycle.c: close_pool) sets its marks
 * one after another: the state, the gate's bit, the rings' and the inbox's
 * bits, then `closing`. A submit looks at the state, the first of them,
 * before it can be accepted, refused for want of room or run on its caller
 * (engine.h: tko__pool_refusing), so the pool never seems to reopen: a
 * thread that saw -ESHUTDOWN from one mark never gets an accepted submit,
 * -EAGAIN or a caller-run from a later call, though its ring may not be
 * closed yet and `closing` not set.
 *
 * The scenes park the closer just after the state's change (a test seam,
 * as a preemption would), when every later mark is still unset, and submit
 * there. */
#include <errno.h>
#include <stdatomic.h>

#include "internal.h"
#include "lifecycle.h"
#include "taskorch.h"
#include "tko_test.h"
#include "tko_test_feature.h"
#include "tko_test_sync.h"

/* A seam's parking place: who arrived, and the gate that lets them on. */
typedef struct parking {
  tt_gate gate;
  tt_count parked;
} parking;

static parking at_close = {TT_GATE_INIT, TT_COUNT_INIT}, at_gate = {TT_GATE_INIT, TT_COUNT_INIT},
               at_resolve = {TT_GATE_INIT, TT_COUNT_INIT};

static void park(parking *p) {
  tt_count_add(&p->parked, 1);
  (void)tt_gate_wait(&p->gate);
}

static void park_close(tko_pool *pool) {
  (void)pool;
  park(&at_close);
}

static void park_gate(tko_pool *pool) {
  (void)pool;
  park(&at_gate);
}

/* The sanitizer flavours run every test of a file in one process. */
static void reset(void) {
  at_close.gate.open = false;
  tt_count_init(&at_close.parked);
  at_gate.gate.open = false;
  tt_count_init(&at_gate.parked);
  at_resolve.gate.open = false;
  tt_count_init(&at_resolve.parked);
}

static int nothing(void *arg) {
  (void)arg;
  return 0;
}

static int shut_down(void *pool) { return tko_pool_shutdown(pool, TKO_DRAIN); }

/* Starts a DRAIN on its own thread and waits until it parks just after
 * the state's change. */
static void start_close(tko_pool *pool, tf_thread *closer) {
  atomic_store(&tko__test_close_window, park_close);
  cr_assert_eq(tf_thread_start(closer, shut_down, pool), 0);
  cr_assert(tt_count_wait_geq(&at_close.parked, 1), "the shutdown never reached its close");
  atomic_store(&tko__test_close_window, NULL);
}

static void finish_close(tko_pool *pool, tf_thread *closer) {
  tt_gate_open(&at_close.gate);
  int rc = -1;
  cr_assert(tf_thread_join(closer, &rc));
  cr_assert_eq(rc, 0);
  cr_assert_eq(tko_pool_destroy(pool), 0);
}

/* Two workers, so that submit rings are on, and this thread's ring claimed. */
static tko_pool *pool_with_a_ring(void) {
  tko_options o = tko_basic_options(2);
  tko_pool *pool;
  cr_assert_eq(tko_pool_create(&pool, &o), 0);
  cr_assert_eq(tko_submit(pool, nothing, NULL, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  return pool;
}

Test(close, a_submit_once_the_state_changed_is_refused_though_its_ring_is_open) {
  reset();
  tko_pool *pool = pool_with_a_ring();
  tf_thread closer;
  start_close(pool, &closer);
  cr_assert_eq(tko_submit(pool, nothing, NULL, 0), -ESHUTDOWN);
  tko_task batch[2] = {{nothing, NULL, 0}, {nothing, NULL, 1}};
  cr_assert_eq(tko_submit_batch(pool, batch, 2), -ESHUTDOWN);
  finish_close(pool, &closer);
}

Test(close, a_submit_through_the_shared_inbox_once_the_state_changed_is_refused) {
  reset();
  tko_options o = tko_basic_options(1); /* one worker: the shared inbox */
  tko_pool *pool;
  cr_assert_eq(tko_pool_create(&pool, &o), 0);
  tf_thread closer;
  start_close(pool, &closer);
  cr_assert_eq(tko_submit(pool, nothing, NULL, 0), -ESHUTDOWN);
  finish_close(pool, &closer);
}

/* A full bounded queue: refused for the close, not for want of room, and
 * not run on the caller, whatever the policy. */
static void full_queue_is_refused(tko_full_policy policy) {
  reset();
  enum { CAP = 4 };
  tko_options o = tko_basic_options(1);
  o.queue_capacity = CAP;
  o.full_policy = policy;
  tko_pool *pool;
  cr_assert_eq(tko_pool_create(&pool, &o), 0);
  cr_assert_eq(tko_pool_pause(pool), 0);
  for (int i = 0; i < CAP; i++) cr_assert_eq(tko_submit(pool, nothing, NULL, 0), 0);
  tf_thread closer;
  start_close(pool, &closer);
  tko_stats before, after;
  tko_pool_stats(pool, &before);
  cr_assert_eq(tko_submit_timed(pool, nothing, NULL, 0, 0), -ESHUTDOWN);
  cr_assert_eq(tko_submit(pool, nothing, NULL, 0), -ESHUTDOWN);
  tko_task batch[CAP + 1];
  for (int i = 0; i <= CAP; i++) batch[i] = (tko_task){nothing, NULL, 0};
  cr_assert_eq(tko_submit_batch(pool, batch, CAP + 1), -ESHUTDOWN, "an over-capacity batch");
  tko_pool_stats(pool, &after);
  cr_assert_eq(after.caller_runs, before.caller_runs, "a refused task ran on its caller");
  finish_close(pool, &closer);
}

Test(close, a_full_reject_queue_once_the_state_changed_is_eshutdown_not_eagain) {
  full_queue_is_refused(TKO_FULL_REJECT);
}

Test(close, a_full_caller_runs_queue_once_the_state_changed_runs_nothing_here) {
  full_queue_is_refused(TKO_FULL_CALLER_RUNS);
}

Test(close, a_full_blocking_queue_once_the_state_changed_is_eshutdown) {
  full_queue_is_refused(TKO_FULL_BLOCK);
}

/* A caller-run that looked at the state while the pool was open, and is
 * stopped before it enters the gate while the pool closes: the gate's
 * closed bit, the mark after the state, refuses it, so its task never runs
 * after the shutdown that it did not hold up has returned. */
static int count_run(void *arg) {
  atomic_fetch_add((atomic_int *)arg, 1);
  return 0;
}

static atomic_int late_runs;

static int submit_here(void *pool) { return tko_submit(pool, count_run, &late_runs, 0); }

Test(close, a_caller_run_stopped_before_the_gate_while_the_pool_closes_is_refused) {
  reset();
  atomic_store(&late_runs, 0);
  tko_options o = tko_basic_options(1);
  o.queue_capacity = 1;
  o.full_policy = TKO_FULL_CALLER_RUNS;
  tko_pool *pool;
  cr_assert_eq(tko_pool_create(&pool, &o), 0);
  cr_assert_eq(tko_pool_pause(pool), 0);
  cr_assert_eq(tko_submit(pool, nothing, NULL, 0), 0); /* the queue is full */
  atomic_store(&tko__test_gate_window, park_gate);
  tf_thread caller;
  cr_assert_eq(tf_thread_start(&caller, submit_here, pool), 0);
  cr_assert(tt_count_wait_geq(&at_gate.parked, 1), "the caller-run never reached the gate");
  atomic_store(&tko__test_gate_window, NULL);
  cr_assert_eq(tko_pool_shutdown(pool, TKO_DRAIN), 0); /* not held up: not in the gate yet */
  tt_gate_open(&at_gate.gate);
  int rc = 0;
  cr_assert(tf_thread_join(&caller, &rc));
  cr_assert_eq(rc, -ESHUTDOWN);
  cr_assert_eq(atomic_load(&late_runs), 0, "a task ran on its caller after the shutdown returned");
  tko_stats st;
  tko_pool_stats(pool, &st);
  cr_assert_eq(st.caller_runs, 0);
  cr_assert_eq(tko_pool_destroy(pool), 0);
}

/* A worker may hold the queue's lock through drain after drain while
 * submitters keep its rings full, and only the state stops them: the close
 * changes the state before it waits for that lock. This thread holds the
 * lock, as such a worker, while the shutdown begins: the closer must reach
 * its window past the state, and a submit meanwhile is refused. */
Test(close, the_state_changes_while_a_worker_holds_the_queue_lock) {
  reset();
  tko_pool *pool = pool_with_a_ring();
  tko__shard *first = &pool->shards[0];
  tko__lock_acquire(&first->lock);
  tf_thread closer;
  start_close(pool, &closer);
  int rc = tko_submit(pool, nothing, NULL, 0);
  tko__unlock(&first->lock);
  cr_assert_eq(rc, -ESHUTDOWN);
  finish_close(pool, &closer);
}

/* A CANCEL's state is its first mark, and the one a worker that took a
 * task looks at before it starts it: a task met once the state changed is
 * cancelled, not started, though the rest of the close has not happened
 * yet, and its on_cancel's submit is refused. The closer parks just after
 * the state; the worker, let go from its first task meanwhile, meets the
 * second, whose fn or on_cancel submits. */
typedef struct late_submit {
  tko_pool *pool;
  tt_gate hold; /* the first task waits on it */
  tt_count handled;
  atomic_int rc; /* the second task's submit, from its fn or its on_cancel */
  atomic_int ran; /* the second task ran (it should be cancelled) */
} late_submit;

static late_submit late = {.hold = TT_GATE_INIT, .handled = TT_COUNT_INIT};

static void submit_late(void) {
  atomic_store(&late.rc, tko_submit(late.pool, nothing, NULL, 0));
  tt_count_add(&late.handled, 1);
}

static int held_first(void *arg) {
  (void)arg;
  return tt_gate_wait(&late.hold) ? 0 : 1;
}

static int second(void *arg) {
  (void)arg;
  atomic_store(&late.ran, 1);
  submit_late();
  return 0;
}

static void second_cancelled(void *user, const tko_task_info *info) {
  (void)user;
  if (info->fn == second) submit_late();
}

static int cancel_down(void *pool) { return tko_pool_shutdown(pool, TKO_CANCEL); }

Test(close, a_task_taken_once_a_cancels_state_changed_is_cancelled_and_submits_nothing) {
  reset();
  late.hold.open = false;
  tt_count_init(&late.handled);
  atomic_store(&late.rc, 1);
  atomic_store(&late.ran, 0);
  tko_options o = tko_basic_options(1);
  o.hooks.on_cancel = second_cancelled;
  cr_assert_eq(tko_pool_create(&late.pool, &o), 0);
  cr_assert_eq(tko_submit(late.pool, held_first, NULL, 0), 0);
  cr_assert_eq(tko_submit(late.pool, second, NULL, 0), 0);
  atomic_store(&tko__test_close_window, park_close);
  tf_thread closer;
  cr_assert_eq(tf_thread_start(&closer, cancel_down, late.pool), 0);
  cr_assert(tt_count_wait_geq(&at_close.parked, 1), "the cancel never reached its window");
  atomic_store(&tko__test_close_window, NULL);
  tt_gate_open(&late.hold);
  cr_assert(tt_count_wait_geq(&late.handled, 1), "the second task was neither run nor cancelled");
  cr_assert_eq(atomic_load(&late.rc), -ESHUTDOWN,
               "a submit during the CANCEL was not refused (%d)", atomic_load(&late.rc));
  cr_assert_eq(atomic_load(&late.ran), 0, "a task started after the CANCEL changed the state");
  tt_gate_open(&at_close.gate);
  int rc = -1;
  cr_assert(tf_thread_join(&closer, &rc));
  cr_assert_eq(rc, 0);
  cr_assert_eq(tko_pool_destroy(late.pool), 0);
}

/* While attached objects resolve (CLOSING), plain submits are still
 * accepted, but a keyed submit is refused from the shutdown's first step,
 * before the full policy: a full REJECT queue does not make it -EAGAIN, a
 * full BLOCK queue does not make it wait. An attachment whose close parks
 * holds the shutdown there (the keyed lanes' cancel, whose on_cancel could
 * hold it too, comes later now). */
static int parked_close(tko__attachment *a, tko_shutdown_mode mode, long timeout_ms) {
  (void)a;
  (void)mode;
  (void)timeout_ms;
  park(&at_resolve);
  return 0;
}

static void keyed_submit_refused_while_resolving(tko_full_policy policy) {
  reset();
  tko_options o = tko_basic_options(1);
  o.queue_capacity = 1;
  o.full_policy = policy;
  tko_pool *pool;
  cr_assert_eq(tko_pool_create(&pool, &o), 0);
  cr_assert_eq(tko_submit_keyed(pool, 1, nothing, NULL, 0), 0); /* the keyed table exists */
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  static tt_pin pin = TT_PIN_INIT;
  pin.gate.open = false;
  tt_count_init(&pin.started);
  cr_assert_eq(tko_submit(pool, tt_pin_fn, &pin, 0), 0);
  cr_assert(tt_count_wait_geq(&pin.started, 1));
  cr_assert_eq(tko_submit(pool, nothing, NULL, 0), 0); /* the queue is full */
  tko__attachment resolving = {.close = parked_close};
  cr_assert_eq(tko__attach(pool, &resolving), 0);
  tf_thread closer;
  cr_assert_eq(tf_thread_start(&closer, shut_down, pool), 0);
  cr_assert(tt_count_wait_geq(&at_resolve.parked, 1), "the shutdown never resolved its attachment");
  int rc = tko_submit_keyed(pool, 7, nothing, NULL, 0);
  tt_gate_open(&at_resolve.gate);
  tt_gate_open(&pin.gate);
  cr_assert_eq(rc, -ESHUTDOWN, "a keyed submit while the shutdown resolved returned %d", rc);
  cr_assert(tf_thread_join(&closer, &rc));
  cr_assert_eq(rc, 0);
  tko__detach(pool, &resolving);
  cr_assert_eq(tko_pool_destroy(pool), 0);
}

Test(close, a_keyed_submit_on_a_full_reject_queue_while_the_shutdown_resolves_is_eshutdown) {
  keyed_submit_refused_while_resolving(TKO_FULL_REJECT);
}

Test(close, a_keyed_submit_on_a_full_blocking_queue_while_the_shutdown_resolves_is_eshutdown,
     .timeout = 60) {
  keyed_submit_refused_while_resolving(TKO_FULL_BLOCK);
}
