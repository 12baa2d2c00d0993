/* SPDX-License-Identifier: MIT */
/* Regressions found by fuzz/fuzz_api.c: each crash the fuzzer found,
 * reduced to a direct test. Each was a bug in the core, since fixed; the
 * comments say what went wrong and where the fix is. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "taskorch.h"
#include "tko_test.h"
#include "tko_test_fault.h"
#include "tko_test_feature.h"
#include "tko_test_sync.h"

/* ---- async task run by TKO_FULL_CALLER_RUNS ----------------------------------------- */

/* Regression, fixed in 8f0737a (fuzz_api, check "async_inflight == 0" after wait_idle): an async
 * task that a full TKO_FULL_CALLER_RUNS queue runs on the submitting thread (run_here ->
 * tko__run_item -> the async kind's run) never takes an in-flight slot - only take_batch and
 * shutdown's empty_queue count async_running up - but its completion gives one back (finish ->
 * release_slot, async.c), so async_running wraps to UINT_MAX: stats say 4294967295 async tasks in
 * flight, shutdown (and so destroy) waits for them for good, with or without a limit,
 * and with max_async_inflight set no async task ever starts again (refresh_backlog sees the limit
 * reached), so wait_idle never returns either. Fix: count the slot in run_here for async items (and
 * let caller-runs respect the limit, or document that it bypasses it). */
static int complete_at_once(tko_async *op, void *arg) {
  atomic_fetch_add(&((tft_token *)arg)->runs, 1);
  return tko_async_complete(op, 0) == 0 ? 0 : 1;
}

static int run_shutdown(void *arg) {
  return tko_pool_shutdown(arg, TKO_DRAIN);
}

/* A caller-runs pool with a full queue runs an async task on the
 * submitting thread, exactly once, and its group sees it finish. */
Test(fuzz_regressions, caller_runs_async_task_runs_once) {
  tko_options o = tko_basic_options(1);
  o.queue_capacity = 1;
  o.full_policy = TKO_FULL_CALLER_RUNS;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  cr_assert_eq(tko_pool_pause(p), 0);
  cr_assert_eq(tko_submit(p, tt_nop_fn, NULL, 0), 0); /* fills the queue */
  static tft_token tok;
  memset(&tok, 0, sizeof tok);
  tko_group g;
  cr_assert_eq(tko_group_init(&g), 0);
  cr_assert_eq(tko_group_submit_async(p, &g, complete_at_once, &tok, 0), 0);
  cr_assert_eq(atomic_load(&tok.runs), 1, "ran on this thread, at once");
  cr_assert_eq(tko_group_wait(&g, 0), 0);
  cr_assert_eq(tko_pool_resume(p), 0);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  cr_assert_eq(tko_group_destroy(&g), 0);
  /* Even without an in-flight limit, the wrapped count makes shutdown wait
   * in its wait for async tasks in flight for good. */
  tf_thread t;
  cr_assert_eq(tf_thread_start(&t, run_shutdown, p), 0);
  int rc = 1;
  cr_assert(tf_thread_join_within(&t, 5000, &rc),
            "shutdown hangs waiting for async tasks in flight");
  cr_assert_eq(rc, 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

Test(fuzz_regressions, caller_runs_async_task_gives_back_no_slot_it_did_not_take) {
  tko_options o = tko_basic_options(1);
  o.queue_capacity = 1;
  o.full_policy = TKO_FULL_CALLER_RUNS;
  o.max_async_inflight = 1;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  cr_assert_eq(tko_pool_pause(p), 0);
  cr_assert_eq(tko_submit(p, tt_nop_fn, NULL, 0), 0);
  static tft_token tok[2];
  memset(tok, 0, sizeof tok);
  cr_assert_eq(tko_submit_async(p, complete_at_once, &tok[0], 0), 0);
  tko_stats s;
  tko_pool_stats(p, &s);
  cr_assert_eq(s.async_inflight, 0, "async_inflight %u", s.async_inflight);
  cr_assert_eq(tko_pool_resume(p), 0);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  /* A later async task, queued normally, must start. */
  cr_assert_eq(tko_submit_async(p, complete_at_once, &tok[1], 0), 0);
  cr_assert_eq(tko_pool_wait_idle(p, 2000), 0, "the next async task never started");
  tf_thread t;
  cr_assert_eq(tf_thread_start(&t, run_shutdown, p), 0);
  int rc = 1;
  cr_assert(tf_thread_join_within(&t, 5000, &rc),
            "shutdown hangs waiting for async tasks in flight");
  cr_assert_eq(rc, 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* ---- a group whose submit failed ---------------------------------------------------------- */

/* A group whose submits all went to one pool works; one whose members are
 * in one pool refuses another. */
static int gated_member(void *arg) {
  return tt_gate_wait(arg) ? 0 : 1;
}

Test(fuzz_regressions, a_group_refuses_a_second_pool_only_while_bound_by_members) {
  tko_options o = tko_basic_options(1);
  tko_pool *a, *b;
  cr_assert_eq(tko_pool_create(&a, &o), 0);
  cr_assert_eq(tko_pool_create(&b, &o), 0);
  tko_group g;
  cr_assert_eq(tko_group_init(&g), 0);
  /* The member stays pending until the gate opens, so the group is bound. */
  tt_gate gate = TT_GATE_INIT;
  cr_assert_eq(tko_group_submit(a, &g, gated_member, &gate, 0), 0);
  cr_assert_eq(tko_group_submit(b, &g, tt_nop_fn, NULL, 0), -EINVAL);
  tt_gate_open(&gate);
  cr_assert_eq(tko_group_wait(&g, TT_LONG_MS), 0);
  cr_assert_eq(tko_group_status(&g), 0);
  /* Empty again: the group may now move to the other pool. */
  cr_assert_eq(tko_group_submit(b, &g, tt_nop_fn, NULL, 0), 0);
  cr_assert_eq(tko_group_wait(&g, TT_LONG_MS), 0);
  cr_assert_eq(tko_group_destroy(&g), 0);
  cr_assert_eq(tko_pool_destroy(a), 0);
  cr_assert_eq(tko_pool_destroy(b), 0);
}

/* Regression, fixed in 8f0737a (fuzz_api, a group submit that returned -EINVAL): in
 * tko__group_submit_ctx the group records its pool (g->pool = pool) before the submit, and a failed
 * submit (-ESHUTDOWN, -ENOMEM, -EAGAIN, ...) only takes back the pending count. The group stays
 * bound to a pool where it has no member: a later submit to another pool is refused with -EINVAL,
 * and once that pool is destroyed, tko_group_cancel on the group locks the freed pool (ASan:
 * heap-use-after-free in tko_group_cancel). Fix: bind only when pending goes 0 -> 1 and the submit
 * succeeds (or unbind on failure when pending returns to 0). */
Test(fuzz_regressions, a_failed_group_submit_leaves_the_group_unbound) {
  tko_options o = tko_basic_options(1);
  tko_pool *a, *b;
  cr_assert_eq(tko_pool_create(&a, &o), 0);
  cr_assert_eq(tko_pool_create(&b, &o), 0);
  cr_assert_eq(tko_pool_shutdown(a, TKO_DRAIN), 0);
  tko_group g;
  cr_assert_eq(tko_group_init(&g), 0);
  cr_assert_eq(tko_group_submit(a, &g, tt_nop_fn, NULL, 0), -ESHUTDOWN);
  cr_assert_eq(tko_pool_destroy(a), 0);
  cr_assert_eq(tko_group_cancel(&g), 0); /* must not touch the freed pool */
  cr_assert_eq(tko_group_submit(b, &g, tt_nop_fn, NULL, 0), 0, "the group is still bound to a");
  cr_assert_eq(tko_group_wait(&g, TT_LONG_MS), 0);
  cr_assert_eq(tko_group_destroy(&g), 0);
  cr_assert_eq(tko_pool_destroy(b), 0);
}

/* ---- a pause after shutdown began ------------------------------------------------------------ */

/* Regression (fuzz_api, two streams: "op 'shutdown' has run for over 15000 ms"): a pause that
 * comes after shutdown began (its close unpaused the pool and woke every sleeper) lets workers go
 * back to sleep with tasks still queued: not runnable (paused), not "closing and nothing left".
 * tko_pool_resume then woke one sleeper, as it does for new work; that worker ran what was queued
 * and left, but the others slept on with nothing left to do, nobody woke them again, and shutdown
 * waited for their exit forever (stats quiet, one worker thread parked). Fix: a resume while the
 * pool is closing wakes every sleeper, so each re-checks and exits once nothing is left. */
static pid_t resume_tids[2];
static tt_count resume_returned = TT_COUNT_INIT;

static void resume_thread_start(void *user, unsigned index, tko_worker_kind kind) {
  (void)user;
  (void)kind;
  if (index < 2) resume_tids[index] = tf_gettid();
}

static void resume_after_run(void *user, const tko_task_info *info) {
  (void)user;
  (void)info;
  tt_count_add(&resume_returned, 1);
}

Test(fuzz_regressions, a_resume_after_a_pause_during_shutdown_lets_every_worker_exit) {
  tko_options o = tko_basic_options(2);
  o.hooks.thread_start = resume_thread_start;
  o.hooks.after_run = resume_after_run;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  static tt_pin pin = TT_PIN_INIT;
  cr_assert_eq(tko_submit(p, tt_pin_fn, &pin, 0), 0);
  cr_assert_eq(tko_submit(p, tt_pin_fn, &pin, 0), 0);
  cr_assert(tt_count_wait_geq(&pin.started, 2), "both workers are pinned");
  static tft_token queued;
  cr_assert_eq(tko_submit(p, tft_run, &queued, 0), 0); /* no worker free: stays queued */
  /* Shutdown begins (closed, draining) and times out on the pinned workers. */
  cr_assert_eq(tko_pool_shutdown_timed(p, TKO_DRAIN, 0), -ETIMEDOUT);
  cr_assert_eq(tko_pool_pause(p), 0);
  tt_gate_open(&pin.gate);
  cr_assert(tt_count_wait_geq(&resume_returned, 2));
  /* Both workers go to sleep: the queued task may not start while paused. */
  cr_assert(tf_wait_thread_sleeping(resume_tids[0]));
  cr_assert(tf_wait_thread_sleeping(resume_tids[1]));
  cr_assert_eq(tko_pool_resume(p), 0);
  /* A bound for a hang, not a timing: the queued task is all that is left. */
  cr_assert_eq(tko_pool_shutdown_timed(p, TKO_DRAIN, TT_LONG_MS / 6), 0,
               "a worker sleeps on in a drained, closing pool");
  cr_assert_eq(atomic_load(&queued.runs), 1);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* ---- a wait for idle that a group cancel ends ------------------------------------------------ */

/* Regression (fuzz_api: "op 'wait_forever' has run for over 15000 ms", a pool with nothing queued
 * or running, submitted 1, cancelled 1): tko__cancel_item counted a cancelled task but, unlike a
 * finished one, woke nobody waiting in tko_pool_wait_idle; while the pool runs only
 * tko_group_cancel (and a timer's task refused at its firing) cancels, so a wait whose last task a
 * group cancel took slept for good. Fix: a cancel notifies idle waiters as a finish does
 * (run.c, timer.c). */
static int wait_idle_no_limit(void *arg) {
  return tko_pool_wait_idle(arg, -1);
}

Test(fuzz_regressions, a_group_cancel_wakes_a_wait_for_idle) {
  tko_options o = tko_basic_options(1);
  o.hooks.on_cancel = tft_on_cancel;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  cr_assert_eq(tko_pool_pause(p), 0);
  tko_group g;
  cr_assert_eq(tko_group_init(&g), 0);
  static tft_token member;
  cr_assert_eq(tko_group_submit(p, &g, tft_run, &member, 0), 0); /* queued: paused */
  tf_thread t;
  cr_assert_eq(tf_thread_start(&t, wait_idle_no_limit, p), 0);
  cr_assert(tf_wait_thread_sleeping(t.tid), "the waiter waits for the member");
  cr_assert_eq(tko_group_cancel(&g), 1);
  int rc = 1;
  /* A bound for a hang, not a timing: the pool is idle once the member is cancelled. */
  cr_assert(tf_thread_join_within(&t, TT_LONG_MS / 6, &rc), "wait_idle sleeps on, the pool idle");
  cr_assert_eq(rc, 0);
  cr_assert_eq(atomic_load(&member.cancels), 1);
  cr_assert_eq(atomic_load(&member.runs), 0);
  cr_assert_eq(tko_group_destroy(&g), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}
