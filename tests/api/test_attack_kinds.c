/* SPDX-License-Identifier: MIT */
/* Adversarial tests of the task kinds (group members, async tasks, timer
 * firings, task handles) where they meet each other and the hooks, through
 * the public headers only.
 * - member_hook_waits_own_group_*: tko_group_wait promises -EDEADLK at once
 *   when the calling thread is a pending member: "a member's task or one of
 *   its hooks". A plain member's hooks run on the worker; an async member's
 *   after_run and on_failure run on whichever thread calls
 *   tko_async_complete (a host thread here), while the member is still
 *   pending. A wait there with no limit would never return, and the
 *   completing call with it; the tests wait with timeout 0, so a wrong
 *   answer shows as -ETIMEDOUT rather than as a hang.
 * - caller_runs_member_waits_own_group: the same promise for a member that
 *   a full TKO_FULL_CALLER_RUNS queue runs on the submitting thread, inside
 *   tko_group_submit: its task and its hooks are a pending member's.
 * - caller_runs_handle_task_waits_itself: tko_handle_wait promises -EDEADLK
 *   at once when the caller is the task itself; a handle's task run on the
 *   submitting thread by TKO_FULL_CALLER_RUNS is the task itself too.
 * - timer_task_in_shutdown_has_an_id: a timer's task that comes due while
 *   the pool drains runs on the timer thread, never reaching the queue; the
 *   hooks' tko_task_info.id is "unique per pool, nonzero", and such a task's
 *   has the top bit set (only a full CALLER_RUNS queue's task has id 0).
 * - timer_thread_calls_during_shutdown_are_edeadlk: the same timer task, and
 *   on_cancel for a timer that the shutdown's last step closes, are the
 *   pool's task and hook: waiting on, shutting down or destroying the pool
 *   from them is -EDEADLK (not a hang: the shutdown waits for them). */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <taskorch.h>

#include "tko_test.h"

#define KW_WAIT_MS 30000L /* any single bounded wait */

static struct {
  tko_pool *pool;
  tko_group group;
  tko_async *_Atomic op;
  atomic_int after_run_rc, on_failure_rc, hooked;
} K;

static void k_after_run(void *user, const tko_task_info *task) {
  (void)user;
  (void)task;
  atomic_store(&K.after_run_rc, tko_group_wait(&K.group, 0));
  atomic_fetch_add(&K.hooked, 1);
}

static void k_on_failure(void *user, const tko_task_info *task) {
  (void)user;
  (void)task;
  atomic_store(&K.on_failure_rc, tko_group_wait(&K.group, 0));
}

static int k_fail(void *arg) {
  (void)arg;
  return 3;
}

static int k_async_start(tko_async *op, void *arg) {
  (void)arg;
  atomic_store(&K.op, op);
  return 0;
}

static void k_setup(void) {
  tko_options o = tko_basic_options(1);
  o.hooks.after_run = k_after_run;
  o.hooks.on_failure = k_on_failure;
  cr_assert_eq(tko_pool_create(&K.pool, &o), 0);
  cr_assert_eq(tko_group_init(&K.group), 0);
  atomic_store(&K.op, NULL);
  atomic_store(&K.after_run_rc, 1);
  atomic_store(&K.on_failure_rc, 1);
  atomic_store(&K.hooked, 0);
}

static void k_teardown(void) {
  cr_assert_eq(tko_group_wait(&K.group, KW_WAIT_MS), 0);
  cr_assert_eq(tko_pool_wait_idle(K.pool, KW_WAIT_MS), 0);
  cr_assert_eq(atomic_load(&K.hooked), 1);
  cr_assert_eq(tko_group_destroy(&K.group), 0);
  cr_assert_eq(tko_pool_destroy(K.pool), 0);
}

/* The control: a plain member's hooks run on the worker and get -EDEADLK. */
Test(attack_kinds, member_hook_waits_own_group_plain) {
  k_setup();
  cr_assert_eq(tko_group_submit(K.pool, &K.group, k_fail, NULL, 0), 0);
  cr_assert_eq(tko_group_wait(&K.group, KW_WAIT_MS), 0);
  cr_assert_eq(tko_pool_wait_idle(K.pool, KW_WAIT_MS), 0);
  cr_assert_eq(atomic_load(&K.after_run_rc), -EDEADLK, "after_run got %d",
               atomic_load(&K.after_run_rc));
  cr_assert_eq(atomic_load(&K.on_failure_rc), -EDEADLK, "on_failure got %d",
               atomic_load(&K.on_failure_rc));
  k_teardown();
}

/* An async member completed (with a failure status) by this thread: its
 * after_run and on_failure run inside tko_async_complete, here, while the
 * member is pending. */
Test(attack_kinds, member_hook_waits_own_group_async) {
  k_setup();
  cr_assert_eq(tko_group_submit_async(K.pool, &K.group, k_async_start, NULL, 0), 0);
  tko_async *op;
  while (!(op = atomic_exchange(&K.op, NULL)))
    sched_yield();
  cr_assert_eq(tko_async_complete(op, 5), 0);
  cr_assert_eq(tko_group_wait(&K.group, KW_WAIT_MS), 0);
  cr_assert_eq(tko_group_status(&K.group), 5);
  cr_assert_eq(atomic_load(&K.after_run_rc), -EDEADLK, "after_run got %d",
               atomic_load(&K.after_run_rc));
  cr_assert_eq(atomic_load(&K.on_failure_rc), -EDEADLK, "on_failure got %d",
               atomic_load(&K.on_failure_rc));
  k_teardown();
}

/* ---- members and handle tasks run on the submitting thread ----------------- */

static struct {
  tko_pool *pool;
  tko_group group;
  tko_handle handle;
  atomic_bool armed;
  atomic_int task_rc, before_rc, after_rc, failure_rc, ran;
} C;

static void c_before(void *user, const tko_task_info *task) {
  (void)user;
  (void)task;
  if (atomic_load(&C.armed)) atomic_store(&C.before_rc, tko_group_wait(&C.group, 0));
}

static void c_after(void *user, const tko_task_info *task) {
  (void)user;
  (void)task;
  if (atomic_load(&C.armed)) atomic_store(&C.after_rc, tko_group_wait(&C.group, 0));
}

static void c_failure(void *user, const tko_task_info *task) {
  (void)user;
  (void)task;
  if (atomic_load(&C.armed)) atomic_store(&C.failure_rc, tko_group_wait(&C.group, 0));
}

static int c_member(void *arg) {
  (void)arg;
  atomic_store(&C.task_rc, tko_group_wait(&C.group, 0));
  atomic_fetch_add(&C.ran, 1);
  return 3;
}

static int c_handle_task(void *arg) {
  (void)arg;
  atomic_store(&C.task_rc, tko_handle_wait(&C.handle, 0));
  atomic_fetch_add(&C.ran, 1);
  return 0;
}

static int c_noop(void *arg) {
  (void)arg;
  return 0;
}

/* A one-slot CALLER_RUNS pool, paused with its slot taken: the next submit
 * runs its task on this thread before it returns. */
static void c_setup(void) {
  tko_options o = tko_basic_options(1);
  o.queue_capacity = 1;
  o.full_policy = TKO_FULL_CALLER_RUNS;
  o.hooks.before_run = c_before;
  o.hooks.after_run = c_after;
  o.hooks.on_failure = c_failure;
  cr_assert_eq(tko_pool_create(&C.pool, &o), 0);
  cr_assert_eq(tko_group_init(&C.group), 0);
  atomic_store(&C.armed, false);
  atomic_store(&C.task_rc, 1);
  atomic_store(&C.before_rc, 1);
  atomic_store(&C.after_rc, 1);
  atomic_store(&C.failure_rc, 1);
  atomic_store(&C.ran, 0);
  cr_assert_eq(tko_pool_pause(C.pool), 0);
  cr_assert_eq(tko_submit(C.pool, c_noop, NULL, 0), 0);
}

static void c_teardown(void) {
  cr_assert_eq(tko_pool_resume(C.pool), 0);
  cr_assert_eq(tko_group_wait(&C.group, KW_WAIT_MS), 0);
  cr_assert_eq(tko_group_destroy(&C.group), 0);
  cr_assert_eq(tko_pool_destroy(C.pool), 0);
}

Test(attack_kinds, caller_runs_member_waits_own_group) {
  c_setup();
  atomic_store(&C.armed, true);
  cr_assert_eq(tko_group_submit(C.pool, &C.group, c_member, NULL, 0), 0);
  atomic_store(&C.armed, false);
  cr_assert_eq(atomic_load(&C.ran), 1, "the member ran on this thread");
  cr_assert_eq(tko_group_pending(&C.group), 0);
  cr_assert_eq(atomic_load(&C.task_rc), -EDEADLK, "the member's task got %d",
               atomic_load(&C.task_rc));
  cr_assert_eq(atomic_load(&C.before_rc), -EDEADLK, "before_run got %d", atomic_load(&C.before_rc));
  cr_assert_eq(atomic_load(&C.after_rc), -EDEADLK, "after_run got %d", atomic_load(&C.after_rc));
  cr_assert_eq(atomic_load(&C.failure_rc), -EDEADLK, "on_failure got %d",
               atomic_load(&C.failure_rc));
  c_teardown();
}

Test(attack_kinds, caller_runs_handle_task_waits_itself) {
  c_setup();
  cr_assert_eq(tko_submit_handle(C.pool, &C.handle, c_handle_task, NULL, 0), 0);
  cr_assert_eq(atomic_load(&C.ran), 1, "the task ran on this thread");
  cr_assert_eq(tko_handle_status(&C.handle), 0);
  cr_assert_eq(atomic_load(&C.task_rc), -EDEADLK, "the task's wait on its own handle got %d",
               atomic_load(&C.task_rc));
  c_teardown();
}

/* ---- a timer's task run on the timer thread during shutdown -------------- */

static struct {
  tko_pool *pool;
  tko_timer timer;
  atomic_bool release, timer_ran;
  _Atomic uint64_t before_id, after_id;
  atomic_int before_calls;
} S;

static int s_marker; /* the timer task's arg, so the hooks can tell it apart */

static void s_before(void *user, const tko_task_info *task) {
  (void)user;
  if (task->arg != &s_marker) return;
  atomic_store(&S.before_id, task->id);
  atomic_fetch_add(&S.before_calls, 1);
}

static void s_after(void *user, const tko_task_info *task) {
  (void)user;
  if (task->arg == &s_marker) atomic_store(&S.after_id, task->id);
}

static int s_blocker(void *arg) {
  (void)arg;
  while (!atomic_load(&S.release))
    sched_yield();
  return 0;
}

static int s_timer_task(void *arg) {
  (void)arg;
  atomic_store(&S.timer_ran, true);
  return 0;
}

Test(attack_kinds, timer_task_in_shutdown_has_an_id) {
  tko_options o = tko_basic_options(1);
  o.hooks.before_run = s_before;
  o.hooks.after_run = s_after;
  cr_assert_eq(tko_pool_create(&S.pool, &o), 0);
  atomic_store(&S.release, false);
  atomic_store(&S.timer_ran, false);
  atomic_store(&S.before_id, UINT64_MAX);
  atomic_store(&S.after_id, UINT64_MAX);
  atomic_store(&S.before_calls, 0);
  cr_assert_eq(tko_submit(S.pool, s_blocker, NULL, 0), 0);
  /* The blocker keeps the drain going: the shutdown stays under way. */
  cr_assert_eq(tko_pool_shutdown_timed(S.pool, TKO_DRAIN, 0), -ETIMEDOUT);
  cr_assert_eq(tko_submit(S.pool, s_blocker, NULL, 0), -ESHUTDOWN);
  tko_timer_init(&S.timer);
  cr_assert_eq(tko_submit_after(S.pool, &S.timer, 0, s_timer_task, &s_marker, 0), 0);
  while (!atomic_load(&S.timer_ran))
    sched_yield();
  atomic_store(&S.release, true);
  cr_assert_eq(tko_pool_shutdown(S.pool, TKO_DRAIN), 0);
  tko_stats st;
  tko_pool_stats(S.pool, &st);
  cr_assert_eq(st.caller_runs, 1, "the timer's task ran on the timer thread");
  cr_assert_eq(atomic_load(&S.before_calls), 1);
  uint64_t id = atomic_load(&S.before_id);
  cr_assert_neq(id, 0, "before_run saw id 0 for the timer's task");
  cr_assert_neq(id & (UINT64_C(1) << 63), 0, "id %#llx lacks the top bit", (unsigned long long)id);
  cr_assert_eq(atomic_load(&S.after_id), id);
  cr_assert_eq(tko_pool_destroy(S.pool), 0);
}

/* ---- pool calls from the timer thread during shutdown --------------------- */

static struct {
  tko_pool *pool;
  tko_timer due, armed;
  atomic_bool release, probed_task, probed_cancel;
  atomic_int task_rc[4], cancel_rc[4];
} D;

static void d_probe(atomic_int *rc) {
  atomic_store(&rc[0], tko_pool_wait_idle(D.pool, 0));
  atomic_store(&rc[1], tko_pool_shutdown_timed(D.pool, TKO_DRAIN, 0));
  atomic_store(&rc[2], tko_pool_shutdown_timed(D.pool, TKO_CANCEL, 0));
  atomic_store(&rc[3], tko_pool_destroy(D.pool));
}

static int d_blocker(void *arg) {
  (void)arg;
  while (!atomic_load(&D.release))
    sched_yield();
  return 0;
}

static int d_due_task(void *arg) {
  (void)arg;
  d_probe(D.task_rc);
  atomic_store(&D.probed_task, true);
  return 0;
}

static int d_never(void *arg) {
  (void)arg;
  return 0;
}

static void d_on_cancel(void *user, const tko_task_info *task) {
  (void)user;
  if (task->fn != d_never) return;
  d_probe(D.cancel_rc);
  atomic_store(&D.probed_cancel, true);
}

Test(attack_kinds, timer_thread_calls_during_shutdown_are_edeadlk) {
  tko_options o = tko_basic_options(1);
  o.hooks.on_cancel = d_on_cancel;
  cr_assert_eq(tko_pool_create(&D.pool, &o), 0);
  atomic_store(&D.release, false);
  atomic_store(&D.probed_task, false);
  atomic_store(&D.probed_cancel, false);
  for (int i = 0; i < 4; i++) {
    atomic_store(&D.task_rc[i], 1);
    atomic_store(&D.cancel_rc[i], 1);
  }
  tko_timer_init(&D.armed);
  cr_assert_eq(tko_submit_after(D.pool, &D.armed, TKO_MAX_TIMER_MS, d_never, NULL, 0), 0);
  cr_assert_eq(tko_submit(D.pool, d_blocker, NULL, 0), 0);
  cr_assert_eq(tko_pool_shutdown_timed(D.pool, TKO_DRAIN, 0), -ETIMEDOUT);
  tko_timer_init(&D.due);
  cr_assert_eq(tko_submit_after(D.pool, &D.due, 0, d_due_task, NULL, 0), 0);
  while (!atomic_load(&D.probed_task))
    sched_yield();
  atomic_store(&D.release, true);
  cr_assert_eq(tko_pool_shutdown(D.pool, TKO_DRAIN), 0);
  cr_assert(atomic_load(&D.probed_cancel), "the armed timer reached on_cancel at the close");
  for (int i = 0; i < 4; i++) {
    cr_assert_eq(atomic_load(&D.task_rc[i]), -EDEADLK, "timer task call %d got %d", i,
                 atomic_load(&D.task_rc[i]));
    cr_assert_eq(atomic_load(&D.cancel_rc[i]), -EDEADLK, "on_cancel call %d got %d", i,
                 atomic_load(&D.cancel_rc[i]));
  }
  cr_assert_eq(tko_timer_cancel(&D.armed), -ENOENT);
  cr_assert_eq(tko_pool_destroy(D.pool), 0);
}
