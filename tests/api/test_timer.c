/* SPDX-License-Identifier: MIT */
/* Tests for delayed and periodic tasks (tko_timer_init, tko_submit_after,
 * tko_submit_every, tko_timer_cancel): a delayed task runs once and never
 * before its delay; cancel before firing returns 0 and the task never runs;
 * cancel after firing gives -ENOENT; re-arming an armed timer gives -EBUSY,
 * a fired or cancelled one may be re-armed (even from its own task); a
 * periodic timer fires until cancelled (also from its own task); timers
 * fire in deadline order; the error codes; many timers armed and cancelled
 * at once; a timer that fires into a full reject pool goes to on_cancel;
 * and shutdown: timers not yet due go to on_cancel (with an id of their
 * own, counted in stats.submitted and stats.cancelled), a fired task still
 * queued is run by DRAIN and cancelled by CANCEL; a periodic timer's
 * argument reaches on_cancel once, after its last run; a refused periodic
 * firing skips its period; timers close after in-flight async tasks. Nothing is lost: runs +
 * on_cancel calls == timers armed and not cancelled. No test sleeps to wait
 * for something: completions are counted under a condition variable. */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "taskorch.h"
#include "tko_test.h"
#include "tko_test_feature.h"
#include "tko_test_sync.h"

typedef struct tctx {
  tt_count runs;        /* timer tasks that ran */
  tt_count cancels;     /* on_cancel calls */
  tt_count cancels_id0; /* of those, with id 0 (none since issue 14.19) */
  tt_count elastic_starts;
  atomic_int bad;
  tko_pool *pool;
  /* Set by the async-at-shutdown scene: its timer task's arg, which
   * on_cancel hands to at_cancel instead of counting it as a tjob. */
  void *special;
  void (*at_cancel)(void *arg);
} tctx;

static void tctx_init(tctx *c) {
  memset(c, 0, sizeof *c);
  tt_count_init(&c->runs);
  tt_count_init(&c->cancels);
  tt_count_init(&c->cancels_id0);
  tt_count_init(&c->elastic_starts);
  atomic_init(&c->bad, 0);
}

/* A timer's task: counts its runs and remembers when it started. */
typedef struct tjob {
  tctx *c;
  int tag;
  atomic_int ran, cancelled;
  uint64_t start_ns;  /* of the last run */
  uint64_t cancel_id; /* the id on_cancel saw */
  int ran_at_cancel;  /* runs when on_cancel came */
  tko_timer timer;
  /* Periodic / chaining behaviour. */
  int cancel_at; /* cancel own timer on this run (0 = never) */
  atomic_int cancel_ok;
  int rearm_times; /* re-arm own timer this many times */
  /* Deadline order: the run order is appended here. */
  atomic_int *order_next;
  int *order;
} tjob;

static void tjob_init(tjob *j, tctx *c, int tag) {
  memset(j, 0, sizeof *j);
  j->c = c;
  j->tag = tag;
  tko_timer_init(&j->timer);
}

static int tjob_fn(void *arg) {
  tjob *j = arg;
  j->start_ns = tt_now_ns();
  int n = atomic_fetch_add(&j->ran, 1) + 1;
  if (j->order) j->order[atomic_fetch_add(j->order_next, 1)] = j->tag;
  if (j->cancel_at && n >= j->cancel_at) {
    int rc = tko_timer_cancel(&j->timer);
    if (n == j->cancel_at) {
      if (rc == 0) atomic_fetch_add(&j->cancel_ok, 1);
    } else if (n > j->cancel_at && rc != -ENOENT) {
      atomic_fetch_add(&j->c->bad, 1);
    }
  }
  if (j->rearm_times && n <= j->rearm_times) {
    /* The timer fired, so it is no longer armed: re-arming must work. */
    if (tko_submit_after(j->c->pool, &j->timer, 0, tjob_fn, j, 0) != 0)
      atomic_fetch_add(&j->c->bad, 1);
  }
  tt_count_add(&j->c->runs, 1);
  return 0;
}

static void on_cancel(void *user, const tko_task_info *t) {
  tctx *c = user;
  if (t->worker != UINT32_MAX) atomic_fetch_add(&c->bad, 1);
  if (c->special && t->arg == c->special) {
    c->at_cancel(t->arg);
    return;
  }
  tjob *j = t->arg;
  j->cancel_id = t->id;
  j->ran_at_cancel = atomic_load(&j->ran);
  atomic_fetch_add(&j->cancelled, 1);
  if (t->id == 0) tt_count_add(&c->cancels_id0, 1);
  tt_count_add(&c->cancels, 1);
}

static void thread_start(void *user, unsigned index, tko_worker_kind kind) {
  if (kind == TKO_WORKER_ELASTIC) tt_count_add(&((tctx *)user)->elastic_starts, 1);
}

static tko_pool *make_pool_opts(tctx *c, tko_options o) {
  o.hooks.user = c;
  o.hooks.on_cancel = on_cancel;
  o.hooks.thread_start = thread_start;
  tko_pool *p = NULL;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  c->pool = p;
  return p;
}

static tko_pool *make_pool(tctx *c, unsigned workers) {
  return make_pool_opts(c, tko_basic_options(workers));
}

static void finish(tctx *c, tko_pool *pool) {
  cr_assert_eq(tko_pool_destroy(pool), 0);
  cr_assert_eq(atomic_load(&c->bad), 0);
}

Test(timer, delayed_tasks_run_once_and_not_early) {
  tctx c;
  tctx_init(&c);
  tko_pool *pool = make_pool(&c, 2);
  static const long delays[] = {0, 1, 5, 25};
  enum { N = sizeof delays / sizeof delays[0] };
  tjob js[N];
  uint64_t armed_at[N];
  for (int i = 0; i < N; i++) {
    tjob_init(&js[i], &c, i);
    armed_at[i] = tt_now_ns();
    cr_assert_eq(tko_submit_after(pool, &js[i].timer, delays[i], tjob_fn, &js[i], 0), 0);
  }
  cr_assert(tt_count_wait_eq(&c.runs, N));
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  for (int i = 0; i < N; i++) {
    cr_assert_eq(atomic_load(&js[i].ran), 1);
    /* A lower bound only, which a monotonic clock guarantees: the timer
     * thread submits nothing before its deadline. */
    cr_assert_geq(js[i].start_ns - armed_at[i], (uint64_t)delays[i] * 1000000u,
                  "timer %d ran early", i);
    cr_assert_eq(tko_timer_cancel(&js[i].timer), -ENOENT, "a fired timer is not armed");
  }
  tko_stats s = tf_stats(pool);
  cr_assert_eq(s.submitted, N);
  cr_assert_eq(s.completed, N);
  finish(&c, pool);
}

Test(timer, invalid_arguments) {
  tctx c;
  tctx_init(&c);
  tko_pool *pool = make_pool(&c, 1);
  tjob j;
  tjob_init(&j, &c, 0);
  tko_timer_init(NULL); /* does nothing */
  cr_assert_eq(tko_submit_after(NULL, &j.timer, 0, tjob_fn, &j, 0), -EINVAL);
  cr_assert_eq(tko_submit_after(pool, NULL, 0, tjob_fn, &j, 0), -EINVAL);
  cr_assert_eq(tko_submit_after(pool, &j.timer, 0, NULL, &j, 0), -EINVAL);
  cr_assert_eq(tko_submit_after(pool, &j.timer, -1, tjob_fn, &j, 0), -EINVAL);
  cr_assert_eq(tko_submit_every(NULL, &j.timer, 5, tjob_fn, &j, 0), -EINVAL);
  cr_assert_eq(tko_submit_every(pool, NULL, 5, tjob_fn, &j, 0), -EINVAL);
  cr_assert_eq(tko_submit_every(pool, &j.timer, 5, NULL, &j, 0), -EINVAL);
  cr_assert_eq(tko_submit_every(pool, &j.timer, 0, tjob_fn, &j, 0), -EINVAL);
  cr_assert_eq(tko_submit_every(pool, &j.timer, -3, tjob_fn, &j, 0), -EINVAL);
  cr_assert_eq(tko_timer_cancel(NULL), -EINVAL);
  cr_assert_eq(tko_timer_cancel(&j.timer), -ENOENT, "never armed");
  tko_timer zero;
  memset(&zero, 0, sizeof zero);
  cr_assert_eq(tko_timer_cancel(&zero), -ENOENT, "zero-filled = initialised");
  /* Refused arms left nothing armed behind. */
  cr_assert_eq(tko_pool_shutdown(pool, TKO_DRAIN), 0);
  cr_assert_eq(tt_count_get(&c.runs), 0);
  cr_assert_eq(tt_count_get(&c.cancels), 0);
  finish(&c, pool);
}

Test(timer, ebusy_while_armed) {
  tctx c;
  tctx_init(&c);
  tko_pool *pool = make_pool(&c, 1);
  tjob j;
  tjob_init(&j, &c, 0);
  cr_assert_eq(tko_submit_after(pool, &j.timer, TT_LONG_MS, tjob_fn, &j, 0), 0);
  cr_assert_eq(tko_submit_after(pool, &j.timer, 0, tjob_fn, &j, 0), -EBUSY);
  cr_assert_eq(tko_submit_every(pool, &j.timer, 1, tjob_fn, &j, 0), -EBUSY);
  cr_assert_eq(tko_timer_cancel(&j.timer), 0);
  /* Cancelled: may be armed again, and this time it fires. */
  cr_assert_eq(tko_submit_after(pool, &j.timer, 0, tjob_fn, &j, 0), 0);
  cr_assert(tt_count_wait_eq(&c.runs, 1));
  cr_assert_eq(tko_timer_cancel(&j.timer), -ENOENT);
  cr_assert_eq(tko_pool_shutdown(pool, TKO_DRAIN), 0);
  cr_assert_eq(atomic_load(&j.ran), 1);
  cr_assert_eq(tt_count_get(&c.cancels), 0);
  finish(&c, pool);
}

Test(timer, cancel_before_firing_means_never) {
  tctx c;
  tctx_init(&c);
  tko_pool *pool = make_pool(&c, 1);
  enum { N = 10 };
  tjob js[N];
  for (int i = 0; i < N; i++) {
    tjob_init(&js[i], &c, i);
    cr_assert_eq(tko_submit_after(pool, &js[i].timer, TT_LONG_MS + i, tjob_fn, &js[i], 0), 0);
  }
  for (int i = 0; i < N; i++) {
    cr_assert_eq(tko_timer_cancel(&js[i].timer), 0);
    cr_assert_eq(tko_timer_cancel(&js[i].timer), -ENOENT);
  }
  /* Shutdown joins the timer thread: after it nothing can fire any more. */
  cr_assert_eq(tko_pool_shutdown(pool, TKO_DRAIN), 0);
  for (int i = 0; i < N; i++) {
    cr_assert_eq(atomic_load(&js[i].ran), 0);
    cr_assert_eq(atomic_load(&js[i].cancelled), 0, "a cancelled timer is the caller's again");
  }
  cr_assert_eq(tf_stats(pool).submitted, 0);
  finish(&c, pool);
}

Test(timer, rearm_from_its_own_task) {
  tctx c;
  tctx_init(&c);
  tko_pool *pool = make_pool(&c, 1);
  tjob j;
  tjob_init(&j, &c, 0);
  j.rearm_times = 5;
  cr_assert_eq(tko_submit_after(pool, &j.timer, 0, tjob_fn, &j, 0), 0);
  cr_assert(tt_count_wait_eq(&c.runs, 6));
  cr_assert_eq(tko_pool_shutdown(pool, TKO_DRAIN), 0);
  cr_assert_eq(atomic_load(&j.ran), 6);
  cr_assert_eq(tt_count_get(&c.cancels), 0);
  finish(&c, pool);
}

Test(timer, periodic_fires_until_cancelled) {
  tctx c;
  tctx_init(&c);
  tko_pool *pool = make_pool(&c, 1);
  tjob p, sentinel;
  tjob_init(&p, &c, 0);
  tjob_init(&sentinel, &c, 1);
  cr_assert_eq(tko_submit_every(pool, &p.timer, 1, tjob_fn, &p, 0), 0);
  cr_assert(tt_count_wait_geq(&c.runs, 5), "a periodic timer stopped firing");
  cr_assert_eq(tko_timer_cancel(&p.timer), 0);
  cr_assert_eq(tko_timer_cancel(&p.timer), -ENOENT);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  int fired = atomic_load(&p.ran);
  /* Let several periods pass, measured by a one-shot timer's own firing:
   * a firing already on its way when cancel ran may still land, no more. */
  long before = tt_count_get(&c.runs);
  cr_assert_eq(tko_submit_after(pool, &sentinel.timer, 10, tjob_fn, &sentinel, 0), 0);
  cr_assert(tt_count_wait_geq(&c.runs, before + 1));
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  cr_assert_leq(atomic_load(&p.ran), fired + 1, "fired %d times after the cancel",
                atomic_load(&p.ran) - fired);
  cr_assert_eq(atomic_load(&sentinel.ran), 1);
  cr_assert_eq(tko_pool_shutdown(pool, TKO_DRAIN), 0);
  cr_assert_eq(tt_count_get(&c.cancels), 0, "a cancelled periodic timer went to on_cancel");
  tko_stats s = tf_stats(pool);
  cr_assert_eq(s.submitted, (uint64_t)atomic_load(&p.ran) + 1, "every firing ran");
  finish(&c, pool);
}

Test(timer, periodic_cancelled_from_its_own_task) {
  tctx c;
  tctx_init(&c);
  tko_pool *pool = make_pool(&c, 1);
  tjob p;
  tjob_init(&p, &c, 0);
  p.cancel_at = 3;
  cr_assert_eq(tko_submit_every(pool, &p.timer, 1, tjob_fn, &p, 0), 0);
  cr_assert(tt_count_wait_geq(&c.runs, 3));
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  cr_assert_eq(atomic_load(&p.cancel_ok), 1);
  cr_assert_eq(tko_timer_cancel(&p.timer), -ENOENT);
  cr_assert_eq(tko_pool_shutdown(pool, TKO_DRAIN), 0);
  cr_assert_geq(atomic_load(&p.ran), 3);
  finish(&c, pool);
}

/* Each deadline is taken when its timer is armed, so the order holds only
 * if the three arms take less than the smallest gap (10 ms): a round whose
 * arming thread lost its core that long is run again. */
Test(timer, fire_in_deadline_order) {
  tctx c;
  tctx_init(&c);
  tko_pool *pool = make_pool(&c, 1);
  static const long delays[] = {30, 10, 20};
  const uint64_t gap_ns = 10 * 1000000ull;
  bool checked = false;
  for (int round = 0; round < 5 && !checked; round++) {
    tjob js[3];
    atomic_int next = 0;
    int order[3] = {-1, -1, -1};
    for (int i = 0; i < 3; i++) {
      tjob_init(&js[i], &c, (int)delays[i]);
      js[i].order_next = &next;
      js[i].order = order;
    }
    uint64_t armed_from = tt_now_ns();
    for (int i = 0; i < 3; i++)
      cr_assert_eq(tko_submit_after(pool, &js[i].timer, delays[i], tjob_fn, &js[i], 0), 0);
    uint64_t arming_ns = tt_now_ns() - armed_from;
    cr_assert(tt_count_wait_eq(&c.runs, 3L * (round + 1)));
    cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
    if (arming_ns >= gap_ns) continue;
    cr_assert_eq(order[0], 10);
    cr_assert_eq(order[1], 20);
    cr_assert_eq(order[2], 30);
    checked = true;
  }
  cr_assert(checked, "every round's arming took longer than the smallest gap");
  finish(&c, pool);
}

/* Cancelling a timer from the middle of the deadline heap: the last timer
 * fills the hole and must move up past its new parent. Armed in this
 * order, the heap holds 1 5 2 | 6 7 9 3 (units of 30 ms); cancelling 6
 * moves 3 under 5. If 3 stayed there, 5 would reach the root before it
 * once 1 and 2 had fired, and fire first. */
Test(timer, cancel_from_the_middle_of_the_heap_keeps_deadline_order) {
  tctx c;
  tctx_init(&c);
  tko_pool *pool = make_pool(&c, 1);
  enum { N = 7, UNIT_MS = 30 };
  static const long units[N] = {1, 5, 2, 6, 7, 9, 3};
  tjob js[N];
  atomic_int next = 0;
  int order[N - 1];
  for (int i = 0; i < N; i++) {
    tjob_init(&js[i], &c, (int)units[i]);
    js[i].order_next = &next;
    js[i].order = order;
  }
  for (int i = 0; i < N; i++)
    cr_assert_eq(tko_submit_after(pool, &js[i].timer, units[i] * UNIT_MS, tjob_fn, &js[i], 0), 0);
  cr_assert_eq(tko_timer_cancel(&js[3].timer), 0); /* the 6 */
  cr_assert(tt_count_wait_eq(&c.runs, N - 1));
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  static const int expected[N - 1] = {1, 2, 3, 5, 7, 9};
  for (int i = 0; i < N - 1; i++)
    cr_assert_eq(order[i], expected[i], "firing %d was %d, expected %d", i, order[i], expected[i]);
  finish(&c, pool);
}

/* Two threads arm many timers and cancel every other one: the cancelled
 * ones that returned 0 never run, all the others run exactly once. */
enum { MANY = TT_SCALE(2000, 300) };

typedef struct armer {
  tctx *c;
  tjob *js;
  int n;
  int cancelled_ok;
  int errors;
} armer;

static int armer_fn(void *arg) {
  armer *a = arg;
  uint64_t seed = (uint64_t)(uintptr_t)a | 1;
  for (int i = 0; i < a->n; i++) {
    long delay = (long)(tt_rand(&seed) % 20);
    if (tko_submit_after(a->c->pool, &a->js[i].timer, delay, tjob_fn, &a->js[i], 0)) a->errors++;
  }
  for (int i = 0; i < a->n; i += 2) {
    int rc = tko_timer_cancel(&a->js[i].timer);
    if (rc == 0)
      a->cancelled_ok++;
    else if (rc != -ENOENT)
      a->errors++;
  }
  return 0;
}

Test(timer, many_timers_armed_and_cancelled_at_once) {
  tctx c;
  tctx_init(&c);
  tko_pool *pool = make_pool(&c, 2);
  tjob *js = calloc(2 * MANY, sizeof *js);
  for (int i = 0; i < 2 * MANY; i++)
    tjob_init(&js[i], &c, i);
  armer a[2] = {{&c, js, MANY, 0, 0}, {&c, js + MANY, MANY, 0, 0}};
  tf_thread t[2];
  for (int i = 0; i < 2; i++)
    cr_assert_eq(tf_thread_start(&t[i], armer_fn, &a[i]), 0);
  for (int i = 0; i < 2; i++) {
    cr_assert(tf_thread_join(&t[i], NULL));
    cr_assert_eq(a[i].errors, 0);
  }
  long expect = 2 * MANY - a[0].cancelled_ok - a[1].cancelled_ok;
  cr_assert(tt_count_wait_eq(&c.runs, expect));
  cr_assert_eq(tko_pool_shutdown(pool, TKO_DRAIN), 0);
  cr_assert_eq(tt_count_get(&c.runs), expect);
  for (int i = 0; i < 2 * MANY; i++)
    cr_assert_leq(atomic_load(&js[i].ran), 1);
  cr_assert_eq(tt_count_get(&c.cancels), 0);
  finish(&c, pool);
  free(js);
}

Test(timer, firing_into_a_full_reject_pool_goes_to_on_cancel) {
  tctx c;
  tctx_init(&c);
  tko_options o = tko_basic_options(1);
  o.queue_capacity = 1;
  o.full_policy = TKO_FULL_REJECT;
  tko_pool *pool = make_pool_opts(&c, o);
  tjob fill, j;
  tjob_init(&fill, &c, 0);
  tjob_init(&j, &c, 1);
  cr_assert_eq(tko_pool_pause(pool), 0);
  cr_assert_eq(tko_submit(pool, tjob_fn, &fill, 0), 0);
  cr_assert_eq(tko_submit_after(pool, &j.timer, 0, tjob_fn, &j, 0), 0);
  cr_assert(tt_count_wait_eq(&c.cancels, 1), "the refused firing was lost");
  cr_assert_eq(atomic_load(&j.cancelled), 1);
  /* Cancelled once and disarmed (issue 17, defect 3: now documented), and
   * counted as a cancelled task with an id of its own (issue 14.19). */
  cr_assert_eq(tko_timer_cancel(&j.timer), -ENOENT);
  cr_assert_eq(tt_count_get(&c.cancels_id0), 0);
  cr_assert_neq(j.cancel_id, 0);
  cr_assert_eq(tko_pool_resume(pool), 0);
  cr_assert_eq(tko_pool_shutdown(pool, TKO_DRAIN), 0);
  tko_stats st = tf_stats(pool); /* after shutdown: the timer thread's counts are in */
  cr_assert_eq(st.cancelled, 1);
  cr_assert_eq(st.submitted, 2);
  cr_assert_eq(atomic_load(&j.ran), 0);
  cr_assert_eq(atomic_load(&fill.ran), 1);
  finish(&c, pool);
}

/* ---- shutdown ------------------------------------------------------------ */

static void pending_timers_at_shutdown(tko_shutdown_mode mode) {
  tctx c;
  tctx_init(&c);
  tko_pool *pool = make_pool(&c, 2);
  enum { N = 4 };
  tjob js[N];
  for (int i = 0; i < N; i++)
    tjob_init(&js[i], &c, i);
  for (int i = 0; i < N - 1; i++)
    cr_assert_eq(tko_submit_after(pool, &js[i].timer, TT_LONG_MS, tjob_fn, &js[i], i), 0);
  cr_assert_eq(tko_submit_every(pool, &js[N - 1].timer, TT_LONG_MS, tjob_fn, &js[N - 1], 0), 0);
  cr_assert_eq(tko_pool_shutdown(pool, mode), 0);
  cr_assert_eq(tt_count_get(&c.cancels), N, "a pending timer was lost");
  cr_assert_eq(tt_count_get(&c.runs), 0);
  /* Issue 14, defect 19: each was handed over with id 0 and not counted.
   * A timer is a task accepted when armed: its cancellation counts in
   * stats (submitted and cancelled) and carries an id unique in the pool. */
  cr_assert_eq(tt_count_get(&c.cancels_id0), 0, "on_cancel got id 0");
  for (int i = 0; i < N; i++) {
    cr_assert_eq(atomic_load(&js[i].cancelled), 1);
    cr_assert_eq(tko_timer_cancel(&js[i].timer), -ENOENT, "still armed after shutdown");
    for (int k = 0; k < i; k++)
      cr_assert_neq(js[i].cancel_id, js[k].cancel_id);
  }
  tko_stats s = tf_stats(pool);
  cr_assert_eq(s.submitted, N);
  cr_assert_eq(s.cancelled, N);
  cr_assert_eq(s.queued, 0);
  tjob late;
  tjob_init(&late, &c, 9);
  cr_assert_eq(tko_submit_after(pool, &late.timer, 0, tjob_fn, &late, 0), -ESHUTDOWN);
  cr_assert_eq(tko_submit_every(pool, &late.timer, 1, tjob_fn, &late, 0), -ESHUTDOWN);
  finish(&c, pool);
}

Test(timer, shutdown_drain_hands_pending_timers_to_on_cancel) {
  pending_timers_at_shutdown(TKO_DRAIN);
}

Test(timer, shutdown_cancel_hands_pending_timers_to_on_cancel) {
  pending_timers_at_shutdown(TKO_CANCEL);
}

/* A timer that has fired but whose task is still queued (the pool is
 * paused) is an ordinary queued task: DRAIN runs it, CANCEL cancels it. On
 * an elastic-only pool the firing's submit starts the first worker, whose
 * thread_start hook tells the test that the task is queued. */
static void fired_task_at_shutdown(tko_shutdown_mode mode) {
  tctx c;
  tctx_init(&c);
  tko_pool *pool = make_pool_opts(&c, tko_elastic_options(0, 1, 1000));
  tjob fired, pending;
  tjob_init(&fired, &c, 0);
  tjob_init(&pending, &c, 1);
  cr_assert_eq(tko_pool_pause(pool), 0);
  cr_assert_eq(tko_submit_after(pool, &pending.timer, TT_LONG_MS, tjob_fn, &pending, 0), 0);
  cr_assert_eq(tko_submit_after(pool, &fired.timer, 0, tjob_fn, &fired, 0), 0);
  cr_assert(tt_count_wait_geq(&c.elastic_starts, 1));
  cr_assert_eq(tko_timer_cancel(&fired.timer), -ENOENT);
  tko_stats s = tf_stats(pool);
  cr_assert_eq(s.submitted, 1);
  cr_assert_eq(s.queued, 1);
  cr_assert_eq(tko_pool_shutdown(pool, mode), 0);
  cr_assert_eq(atomic_load(&pending.ran), 0);
  cr_assert_eq(atomic_load(&pending.cancelled), 1);
  if (mode == TKO_DRAIN) {
    cr_assert_eq(atomic_load(&fired.ran), 1);
    cr_assert_eq(atomic_load(&fired.cancelled), 0);
  } else {
    cr_assert_eq(atomic_load(&fired.ran), 0);
    cr_assert_eq(atomic_load(&fired.cancelled), 1);
  }
  cr_assert_eq(tt_count_get(&c.runs) + tt_count_get(&c.cancels), 2, "a timer task was lost");
  s = tf_stats(pool); /* the pending timer counts too (issue 14.19) */
  cr_assert_eq(s.submitted, 2);
  cr_assert_eq(s.completed + s.cancelled, 2);
  cr_assert_eq(s.cancelled, mode == TKO_CANCEL ? 2u : 1u);
  finish(&c, pool);
}

Test(timer, shutdown_drain_runs_a_fired_queued_task) {
  fired_task_at_shutdown(TKO_DRAIN);
}
Test(timer, shutdown_cancel_cancels_a_fired_queued_task) {
  fired_task_at_shutdown(TKO_CANCEL);
}

/* ---- regressions: core bugs these tests found, now fixed ------------- */

/* The timer thread submits like any producer, so on a full TKO_FULL_BLOCK
 * pool it blocks waiting for room. tko_pool_shutdown first joins the timer
 * thread (the timers' close, shutdown's last phase) and only then sets closing, resumes a paused
 * pool and wakes blocked submitters: so if the pool is paused (or its
 * workers are stuck behind the caller), shutdown waits for a timer thread
 * that waits for room that never comes. The header promises that shutdown
 * resumes a paused pool and wakes blocked submitters. */
static int shutdown_drain_fn(void *pool) {
  return tko_pool_shutdown(pool, TKO_DRAIN);
}

Test(timer, regression_shutdown_hangs_on_a_timer_blocked_in_submit) {
  tctx c;
  tctx_init(&c);
  tko_options o = tko_basic_options(1);
  o.queue_capacity = 1;
  o.full_policy = TKO_FULL_BLOCK;
  tko_pool *pool = make_pool_opts(&c, o);
  tjob fill, j;
  tjob_init(&fill, &c, 0);
  tjob_init(&j, &c, 1);
  cr_assert_eq(tko_pool_pause(pool), 0);
  cr_assert_eq(tko_submit(pool, tjob_fn, &fill, 0), 0);
  /* Arm until the timer is seen fired (its submit then blocks for good:
   * the pool is paused and full). A cancel that finds it still armed
   * disarms it, so arm it again. */
  cr_assert_eq(tko_submit_after(pool, &j.timer, 0, tjob_fn, &j, 0), 0);
  while (tko_timer_cancel(&j.timer) == 0) {
    sched_yield();
    cr_assert_eq(tko_submit_after(pool, &j.timer, 0, tjob_fn, &j, 0), 0);
  }
  tf_thread t;
  cr_assert_eq(tf_thread_start(&t, shutdown_drain_fn, pool), 0);
  int rc = -1;
  cr_assert(tf_thread_join_within(&t, 5000, &rc), "shutdown hangs on the blocked timer thread");
  cr_assert_eq(rc, 0);
  finish(&c, pool);
}

/* Issue 14, defect 5: a delay or period in milliseconds was multiplied into
 * nanoseconds without a bound, so it wrapped: a delay of LONG_MAX fired at
 * once, a period of 2^58+1 ms fired every millisecond, a period of LONG_MAX
 * submitted in a storm. Past TKO_MAX_TIMER_MS both are refused now, and a
 * timer at the bound is armed and far from due. */
Test(timer, regression_huge_delays_and_periods_are_refused_not_wrapped) {
  tctx c;
  tctx_init(&c);
  tko_pool *pool = make_pool(&c, 1);
  tjob j;
  tjob_init(&j, &c, 0);
  cr_assert_eq(tko_submit_after(pool, &j.timer, LONG_MAX, tjob_fn, &j, 0), -EINVAL);
  cr_assert_eq(tko_submit_every(pool, &j.timer, LONG_MAX, tjob_fn, &j, 0), -EINVAL);
  cr_assert_eq(tko_submit_every(pool, &j.timer, (1L << 58) + 1, tjob_fn, &j, 0), -EINVAL);
  cr_assert_eq(tko_submit_after(pool, &j.timer, (long)TKO_MAX_TIMER_MS + 1, tjob_fn, &j, 0),
               -EINVAL);
  cr_assert_eq(tko_timer_cancel(&j.timer), -ENOENT, "a refused arm left the timer armed");
  /* At the bound: armed, and still armed (not fired) when cancelled. */
  cr_assert_eq(tko_submit_after(pool, &j.timer, (long)TKO_MAX_TIMER_MS, tjob_fn, &j, 0), 0);
  cr_assert_eq(tko_timer_cancel(&j.timer), 0);
  cr_assert_eq(tko_submit_every(pool, &j.timer, (long)TKO_MAX_TIMER_MS, tjob_fn, &j, 0), 0);
  cr_assert_eq(tko_timer_cancel(&j.timer), 0);
  cr_assert_eq(tko_pool_shutdown(pool, TKO_DRAIN), 0);
  cr_assert_eq(atomic_load(&j.ran), 0);
  cr_assert_eq(tt_count_get(&c.cancels), 0);
  finish(&c, pool);
}

/* ---- regressions: issues 14 and 17 ------------------------------------- */

/* Issue 14, defect 6: a periodic timer's argument reached on_cancel twice -
 * once from the timer thread, whose firing the closing pool refused, and
 * once from shutdown's disarming of the timer - in about one plain destroy
 * in three; and shutdown handed it over before queued firings ran. Now it
 * reaches on_cancel exactly once, after the timer's last run. */
enum { DESTROY_ROUNDS = TT_SCALE(60, 15) };

static void periodic_ends_once_after_its_last_run(tctx *c, tjob *p) {
  cr_assert_eq(atomic_load(&p->cancelled), 1, "on_cancel %d times", atomic_load(&p->cancelled));
  cr_assert_eq(p->ran_at_cancel, atomic_load(&p->ran), "ran after on_cancel");
  cr_assert_neq(p->cancel_id, 0);
  cr_assert_eq(atomic_load(&c->bad), 0);
}

Test(timer, regression_periodic_argument_reaches_on_cancel_once_at_destroy) {
  for (int round = 0; round < DESTROY_ROUNDS; round++) {
    tctx c;
    tctx_init(&c);
    tko_pool *pool = make_pool(&c, 2);
    tjob p;
    tjob_init(&p, &c, 0);
    cr_assert_eq(tko_submit_every(pool, &p.timer, 1, tjob_fn, &p, 0), 0);
    cr_assert(tt_count_wait_geq(&c.runs, 1 + round % 3));
    cr_assert_eq(tko_pool_destroy(pool), 0);
    periodic_ends_once_after_its_last_run(&c, &p);
  }
}

/* The same with a firing queued at shutdown (a paused elastic-only pool:
 * the firing's submit starts the worker, whose thread_start tells the test
 * it is queued). CANCEL hands the queued firing to on_cancel, and that ends
 * the timer (it used to be handed over a second time); DRAIN runs it and
 * then hands the timer over (it used to hand it over first). */
static void periodic_with_a_queued_firing_at_shutdown(tko_shutdown_mode mode) {
  tctx c;
  tctx_init(&c);
  tko_pool *pool = make_pool_opts(&c, tko_elastic_options(0, 1, 1000));
  tjob p;
  tjob_init(&p, &c, 0);
  cr_assert_eq(tko_pool_pause(pool), 0);
  cr_assert_eq(tko_submit_every(pool, &p.timer, 1, tjob_fn, &p, 0), 0);
  cr_assert(tt_count_wait_geq(&c.elastic_starts, 1));
  /* Periods pass: the timer skips them while its firing is queued (it used
   * to queue one firing per period, each its own trip to on_cancel). */
  struct timespec ts = {0, 10 * 1000000L};
  nanosleep(&ts, NULL);
  cr_assert_eq(tf_stats(pool).submitted, 1, "a second firing was queued");
  cr_assert_eq(tko_pool_shutdown(pool, mode), 0);
  periodic_ends_once_after_its_last_run(&c, &p);
  if (mode == TKO_CANCEL)
    cr_assert_eq(atomic_load(&p.ran), 0);
  else
    cr_assert_geq(atomic_load(&p.ran), 1);
  tko_stats s = tf_stats(pool);
  cr_assert_eq(s.submitted, s.completed + s.cancelled, "a task was lost or counted twice");
  finish(&c, pool);
}

Test(timer, regression_periodic_with_a_queued_firing_at_shutdown_cancel) {
  periodic_with_a_queued_firing_at_shutdown(TKO_CANCEL);
}

Test(timer, regression_periodic_with_a_queued_firing_at_shutdown_drain) {
  periodic_with_a_queued_firing_at_shutdown(TKO_DRAIN);
}

static int shutdown_cancel_fn(void *pool) {
  return tko_pool_shutdown(pool, TKO_CANCEL);
}

/* The same with the timer thread blocked submitting a firing into a full
 * TKO_FULL_BLOCK queue when shutdown comes (this doubled the hand-over every
 * time): closing wakes it, the firing runs on the timer thread, and the
 * timer is handed over once, after it. The pause lets several periods pass
 * so that the thread is blocked by then (the checks hold either way). */
static void periodic_blocked_in_submit_at_shutdown(tko_shutdown_mode mode) {
  tctx c;
  tctx_init(&c);
  tko_options o = tko_basic_options(1);
  o.queue_capacity = 1;
  o.full_policy = TKO_FULL_BLOCK;
  tko_pool *pool = make_pool_opts(&c, o);
  tjob fill, p;
  tjob_init(&fill, &c, 0);
  tjob_init(&p, &c, 1);
  cr_assert_eq(tko_pool_pause(pool), 0);
  cr_assert_eq(tko_submit(pool, tjob_fn, &fill, 0), 0); /* the queue is full */
  cr_assert_eq(tko_submit_every(pool, &p.timer, 1, tjob_fn, &p, 0), 0);
  struct timespec ts = {0, 10 * 1000000L}; /* time passes for the timer thread */
  nanosleep(&ts, NULL);
  tf_thread t;
  cr_assert_eq(
      tf_thread_start(&t, mode == TKO_DRAIN ? shutdown_drain_fn : shutdown_cancel_fn, pool), 0);
  int rc = -1;
  cr_assert(tf_thread_join_within(&t, TT_LONG_MS, &rc));
  cr_assert_eq(rc, 0);
  periodic_ends_once_after_its_last_run(&c, &p);
  tko_stats s = tf_stats(pool);
  cr_assert_eq(s.submitted, s.completed + s.cancelled, "a task was lost or counted twice");
  finish(&c, pool);
}

Test(timer, regression_periodic_blocked_in_submit_at_shutdown_drain) {
  periodic_blocked_in_submit_at_shutdown(TKO_DRAIN);
}

Test(timer, regression_periodic_blocked_in_submit_at_shutdown_cancel) {
  periodic_blocked_in_submit_at_shutdown(TKO_CANCEL);
}

/* Issue 17, defect 3: a periodic timer firing into a full TKO_FULL_REJECT
 * queue handed its argument to on_cancel at every refused period (12
 * times), stayed armed and then ran again with it (8 times). A refused
 * firing now skips its period: nothing reaches on_cancel, the timer stays
 * armed and fires again once there is room, and shutdown hands the argument
 * over once, after its last run. The refusals are timed by a one-shot
 * timer due after many periods, refused too (cancelled once, disarmed). */
Test(timer, regression_periodic_firing_refused_by_a_full_queue_skips_the_period) {
  tctx c;
  tctx_init(&c);
  tko_options o = tko_basic_options(1);
  o.queue_capacity = 1;
  o.full_policy = TKO_FULL_REJECT;
  tko_pool *pool = make_pool_opts(&c, o);
  tjob fill, p, clock;
  tjob_init(&fill, &c, 0);
  tjob_init(&p, &c, 1);
  tjob_init(&clock, &c, 2);
  cr_assert_eq(tko_pool_pause(pool), 0);
  cr_assert_eq(tko_submit(pool, tjob_fn, &fill, 0), 0); /* the queue is full */
  cr_assert_eq(tko_submit_every(pool, &p.timer, 1, tjob_fn, &p, 0), 0);
  cr_assert_eq(tko_submit_after(pool, &clock.timer, 20, tjob_fn, &clock, 0), 0);
  /* Deadline order: the periodic timer's refused periods come first. */
  cr_assert(tt_count_wait_geq(&c.cancels, 1));
  cr_assert_eq(atomic_load(&clock.cancelled), 1);
  cr_assert_eq(atomic_load(&p.cancelled), 0, "a refused period went to on_cancel");
  cr_assert_eq(atomic_load(&p.ran), 0);
  cr_assert_eq(tko_pool_resume(pool), 0);
  cr_assert(tt_count_wait_geq(&c.runs, 1 + 3), "the periodic timer stopped firing");
  cr_assert_eq(tko_pool_shutdown(pool, TKO_DRAIN), 0);
  periodic_ends_once_after_its_last_run(&c, &p);
  cr_assert_eq(atomic_load(&fill.ran), 1);
  cr_assert_eq(atomic_load(&clock.ran), 0);
  finish(&c, pool);
}

/* Issue 14, defect 12: an async task that a tko_submit_after task would
 * complete. Shutdown, in either mode, disarmed the timer first (to
 * on_cancel) and then waited forever for the completion it had made
 * impossible. Timers now close last: the timer fires while shutdown waits
 * for the async task, its task runs on the timer thread (the closed pool
 * cannot queue it) and completes the async task.
 *
 * The scene needs the timer to fire after the pool closed. A timer that
 * fires before (the shutdown thread held off the CPU for the whole delay,
 * on a loaded machine) queues its task like any other, and a TKO_CANCEL
 * shutdown hands it to on_cancel, which here completes the async task, as
 * a host's on_cancel should; the scene then reruns with a longer delay. */
typedef struct async_timeout {
  tko_pool *pool;
  tko_async *op;
  tjob job; /* the timer and its counts */
  tt_count started;
  atomic_int completions, cancelled;
  long delay_ms;
} async_timeout;

static int complete_op_fn(void *arg) {
  async_timeout *a = arg;
  atomic_fetch_add(&a->job.ran, 1);
  if (tko_async_complete(a->op, 0) == 0) atomic_fetch_add(&a->completions, 1);
  return 0;
}

static void complete_op_at_cancel(void *arg) {
  async_timeout *a = arg;
  atomic_fetch_add(&a->cancelled, 1);
  if (tko_async_complete(a->op, -ECANCELED) == 0) atomic_fetch_add(&a->completions, 1);
}

static int arm_completion_fn(tko_async *op, void *arg) {
  async_timeout *a = arg;
  a->op = op;
  int rc = tko_submit_after(a->pool, &a->job.timer, a->delay_ms, complete_op_fn, a, 0);
  tt_count_add(&a->started, 1);
  return rc;
}

typedef struct async_scene {
  tko_shutdown_mode mode;
  long delay_ms;
} async_scene;

static bool async_completed_by_a_timer_scene(void *arg) {
  async_scene *sc = arg;
  tctx c;
  tctx_init(&c);
  tko_pool *pool = make_pool(&c, 1);
  async_timeout a;
  memset(&a, 0, sizeof a);
  a.pool = pool;
  a.delay_ms = sc->delay_ms;
  tjob_init(&a.job, &c, 0);
  tt_count_init(&a.started);
  c.special = &a;
  c.at_cancel = complete_op_at_cancel;
  cr_assert_eq(tko_submit_async(pool, arm_completion_fn, &a, 0), 0);
  cr_assert(tt_count_wait_geq(&a.started, 1));
  tf_thread t;
  cr_assert_eq(
      tf_thread_start(&t, sc->mode == TKO_DRAIN ? shutdown_drain_fn : shutdown_cancel_fn, pool),
      0);
  int rc = -1;
  cr_assert(tf_thread_join_within(&t, TT_LONG_MS, &rc),
            "shutdown waits for a completion it made impossible");
  cr_assert_eq(rc, 0);
  cr_assert_eq(atomic_load(&a.completions), 1);
  tko_stats s = tf_stats(pool);
  /* After the close the task runs on the timer thread, off the workers. */
  bool fired_after_the_close = atomic_load(&a.cancelled) == 0 && s.caller_runs == 1;
  if (atomic_load(&a.cancelled) == 0) {
    cr_assert_eq(atomic_load(&a.job.ran), 1);
    cr_assert_eq(atomic_load(&a.job.cancelled), 0);
  } else {
    cr_assert_eq(sc->mode, TKO_CANCEL, "a DRAIN shutdown cancelled the timer's task");
    cr_assert_eq(atomic_load(&a.job.ran), 0);
  }
  cr_assert_eq(s.async_inflight, 0);
  cr_assert_eq(s.submitted, s.completed + s.cancelled);
  finish(&c, pool);
  sc->delay_ms *= 4; /* for a rerun */
  return fired_after_the_close;
}

static void async_completed_by_a_timer_at_shutdown(tko_shutdown_mode mode) {
  async_scene sc = {mode, 20};
  cr_assert(tt_rerun(async_completed_by_a_timer_scene, &sc),
            "the timer fired before the pool closed in every try");
}

Test(timer, regression_shutdown_drain_lets_a_timer_complete_an_async_task) {
  async_completed_by_a_timer_at_shutdown(TKO_DRAIN);
}

Test(timer, regression_shutdown_cancel_lets_a_timer_complete_an_async_task) {
  async_completed_by_a_timer_at_shutdown(TKO_CANCEL);
}

/* A late periodic timer skips its missed periods rather than firing them in
 * a burst (issue 18's survivor). The rule of one firing at a time already
 * hides a burst while a firing waits in the queue; here each firing runs on
 * the timer thread itself (TKO_FULL_CALLER_RUNS into a full queue), so only
 * the deadline arithmetic can prevent one. The first run holds the timer
 * thread for 5.5 periods; after it returns at most two runs may start
 * within a quarter period (the one for the missed deadlines, and a grid
 * point if the stall ended just before one); a burst starts five. The bound
 * is from above, by a factor a scheduling delay does not reach. */
enum { BURST_RUNS = 4 };

typedef struct stall {
  tt_count runs;
  uint64_t start[BURST_RUNS + 8];
  uint64_t first_end;
  long period_ms;
} stall;

static int stall_fn(void *arg) {
  stall *s = arg;
  long n = tt_count_get(&s->runs);
  if (n < BURST_RUNS + 8) s->start[n] = tt_now_ns();
  if (n == 0) {
    long ms = s->period_ms * 11 / 2; /* long-running: the timer thread is held up */
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) == EINTR) {
    }
    s->first_end = tt_now_ns();
  }
  tt_count_add(&s->runs, 1);
  return 0;
}

Test(timer, late_periodic_timer_skips_missed_periods_when_run_on_the_timer_thread) {
  tko_options o = tko_basic_options(1);
  o.queue_capacity = 1;
  o.full_policy = TKO_FULL_CALLER_RUNS;
  tko_pool *pool = NULL;
  cr_assert_eq(tko_pool_create(&pool, &o), 0);
  tt_pin pin = TT_PIN_INIT;
  cr_assert_eq(tko_submit(pool, tt_pin_fn, &pin, 0), 0);
  cr_assert(tt_count_wait_geq(&pin.started, 1));
  cr_assert_eq(tko_submit(pool, tt_nop_fn, NULL, 0), 0); /* the queue is full */
  stall s;
  memset(&s, 0, sizeof s);
  tt_count_init(&s.runs);
  s.period_ms = 40;
  tko_timer timer;
  tko_timer_init(&timer);
  cr_assert_eq(tko_submit_every(pool, &timer, s.period_ms, stall_fn, &s, 0), 0);
  cr_assert(tt_count_wait_geq(&s.runs, BURST_RUNS));
  cr_assert_eq(tko_timer_cancel(&timer), 0);
  tt_gate_open(&pin.gate);
  cr_assert_eq(tko_pool_destroy(pool), 0);
  uint64_t quarter = (uint64_t)s.period_ms * 1000000u / 4;
  int early = 0;
  for (int i = 1; i < BURST_RUNS; i++)
    if (s.start[i] < s.first_end + quarter) early++;
  cr_assert_leq(early, 2, "%d runs at once after the stall: a burst of missed periods", early);
}
