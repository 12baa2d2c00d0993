/* SPDX-License-Identifier: MIT */
/* Tests of task handles (tko_submit_handle and tko_handle_*): a caller-
 * owned record of one task that reports its id, status and end, and that
 * cancels the task if it has not started - exactly one of "it ran" and "it
 * reached on_cancel", also when the cancel races the start. Waits from a
 * worker of the task's pool run the task when it is queued. No test sleeps
 * to wait for something; waits that a bug would hang carry a long bound. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "taskorch.h"
#include "tko_test.h"
#include "tko_test_feature.h"
#include "tko_test_sync.h"

/* What the pool's hooks saw. */
typedef struct seen {
  tt_count cancels; /* on_cancel calls */
  atomic_ullong cancelled_id;
  atomic_ullong started_id; /* before_run's last id */
} seen;

static void on_cancel(void *user, const tko_task_info *t) {
  seen *s = user;
  atomic_store(&s->cancelled_id, t->id);
  tt_count_add(&s->cancels, 1);
}

static void before_run(void *user, const tko_task_info *t) {
  atomic_store(&((seen *)user)->started_id, t->id);
}

static tko_pool *make_pool(unsigned workers, seen *s) {
  tko_options o = tko_basic_options(workers);
  if (s) {
    memset(s, 0, sizeof *s);
    tt_count_init(&s->cancels);
    o.hooks.user = s;
    o.hooks.on_cancel = on_cancel;
    o.hooks.before_run = before_run;
  }
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  return p;
}

/* A task that counts its runs and returns 7. */
static int count_fn(void *arg) {
  atomic_fetch_add((atomic_int *)arg, 1);
  return 7;
}

Test(handle, submit_wait_and_status) {
  seen s;
  tko_pool *p = make_pool(2, &s);
  atomic_int ran = 0;
  tko_handle h;
  /* Once wait_idle returns the status is final: the end comes before the
   * finish is counted. */
  cr_assert_eq(tko_submit_handle(p, &h, count_fn, &ran, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  cr_assert_eq(tko_handle_status(&h), 7);
  cr_assert_eq(tko_handle_wait(&h, 0), 0);
  cr_assert_eq(tko_handle_cancel(&h), -EBUSY, "a finished task cannot be cancelled");
  /* The handle may be submitted again; the wait returns at the end. */
  cr_assert_eq(tko_submit_handle(p, &h, count_fn, &ran, 3), 0);
  cr_assert_eq(tko_handle_wait(&h, TT_LONG_MS), 0);
  cr_assert_eq(tko_handle_status(&h), 7);
  cr_assert_eq(atomic_load(&ran), 2);
  cr_assert_eq(tko_pool_destroy(p), 0);
  tt_count_fini(&s.cancels);
}

Test(handle, the_id_is_the_id_the_hooks_see) {
  seen s;
  tko_pool *p = make_pool(1, &s);
  atomic_int ran = 0;
  for (int i = 0; i < 50; i++) {
    tko_handle h;
    cr_assert_eq(tko_submit_handle(p, &h, count_fn, &ran, i % 3), 0);
    cr_assert_eq(tko_handle_wait(&h, TT_LONG_MS), 0);
    cr_assert_neq(tko_handle_id(&h), 0);
    cr_assert_eq(tko_handle_id(&h), (uint64_t)atomic_load(&s.started_id));
  }
  cr_assert_eq(tko_pool_destroy(p), 0);
  tt_count_fini(&s.cancels);
}

Test(handle, cancel_while_queued_reaches_on_cancel_once) {
  seen s;
  tko_pool *p = make_pool(1, &s);
  cr_assert_eq(tko_pool_pause(p), 0);
  atomic_int ran = 0;
  tko_handle h;
  cr_assert_eq(tko_submit_handle(p, &h, count_fn, &ran, 0), 0);
  cr_assert_eq(tko_handle_status(&h), -EINPROGRESS);
  cr_assert_eq(tko_handle_cancel(&h), 0);
  cr_assert_eq(tt_count_get(&s.cancels), 1, "on_cancel ran before cancel returned");
  cr_assert_eq(atomic_load(&s.cancelled_id), tko_handle_id(&h));
  cr_assert_eq(tko_handle_status(&h), -ECANCELED);
  cr_assert_eq(tko_handle_wait(&h, 0), 0);
  cr_assert_eq(tko_handle_cancel(&h), -EALREADY);
  cr_assert_eq(tko_pool_resume(p), 0);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  tko_stats st;
  tko_pool_stats(p, &st);
  cr_assert_eq(st.cancelled, 1);
  cr_assert_eq(atomic_load(&ran), 0);
  cr_assert_eq(tt_count_get(&s.cancels), 1);
  cr_assert_eq(tko_pool_destroy(p), 0);
  tt_count_fini(&s.cancels);
}

Test(handle, cancel_after_start_is_busy_and_the_task_finishes) {
  seen s;
  tko_pool *p = make_pool(1, &s);
  tt_pin pin = TT_PIN_INIT;
  tko_handle h;
  cr_assert_eq(tko_submit_handle(p, &h, tt_pin_fn, &pin, 0), 0);
  cr_assert(tt_count_wait_geq(&pin.started, 1));
  cr_assert_eq(tko_handle_cancel(&h), -EBUSY);
  cr_assert_eq(tko_handle_status(&h), -EINPROGRESS);
  tt_gate_open(&pin.gate);
  cr_assert_eq(tko_handle_wait(&h, TT_LONG_MS), 0);
  cr_assert_eq(tko_handle_status(&h), 0);
  cr_assert_eq(tt_count_get(&s.cancels), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
  tt_count_fini(&s.cancels);
}

/* The worker took both tasks in one batch and runs the first: the second
 * is out of the queue and not started when the cancel comes, so the cancel
 * wins and the worker, reaching it, hands it to on_cancel instead. */
Test(handle, cancel_of_a_task_a_worker_took_and_has_not_started) {
  seen s;
  tko_pool *p = make_pool(1, &s);
  tt_pin pin = TT_PIN_INIT;
  atomic_int ran = 0;
  tko_handle h;
  cr_assert_eq(tko_pool_pause(p), 0);
  cr_assert_eq(tko_submit(p, tt_pin_fn, &pin, 0), 0);
  cr_assert_eq(tko_submit_handle(p, &h, count_fn, &ran, 0), 0);
  cr_assert_eq(tko_pool_resume(p), 0);
  cr_assert(tt_count_wait_geq(&pin.started, 1));
  cr_assert_eq(tko_handle_cancel(&h), 0);
  tt_gate_open(&pin.gate);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  cr_assert_eq(tko_handle_status(&h), -ECANCELED);
  cr_assert_eq(tko_handle_wait(&h, 0), 0);
  cr_assert_eq(atomic_load(&ran), 0, "a cancelled task ran");
  cr_assert_eq(tt_count_get(&s.cancels), 1);
  cr_assert_eq(tko_pool_destroy(p), 0);
  tt_count_fini(&s.cancels);
}

/* Round after round, a cancel races the task's start: exactly one wins. */
Test(handle, cancel_racing_the_start_lets_exactly_one_win) {
  seen s;
  tko_pool *p = make_pool(2, &s);
  const int rounds = TT_SCALE(3000, 300);
  long cancelled = 0;
  for (int r = 0; r < rounds; r++) {
    atomic_int ran = 0;
    tko_handle h;
    cr_assert_eq(tko_submit_handle(p, &h, count_fn, &ran, 0), 0);
    int rc = tko_handle_cancel(&h);
    cr_assert(rc == 0 || rc == -EBUSY, "cancel: %d", rc);
    cr_assert_eq(tko_handle_wait(&h, TT_LONG_MS), 0);
    if (rc == 0) {
      cancelled++;
      cr_assert_eq(tko_handle_status(&h), -ECANCELED);
      cr_assert_eq(atomic_load(&ran), 0, "round %d: cancelled and ran", r);
    } else {
      cr_assert_eq(tko_handle_status(&h), 7);
      cr_assert_eq(atomic_load(&ran), 1);
    }
    cr_assert_eq(tt_count_get(&s.cancels), cancelled, "round %d: on_cancel calls", r);
  }
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  tko_stats st;
  tko_pool_stats(p, &st);
  cr_assert_eq(st.cancelled, (uint64_t)cancelled);
  cr_assert_eq(st.completed, (uint64_t)(rounds - cancelled));
  cr_assert_eq(tko_pool_destroy(p), 0);
  tt_count_fini(&s.cancels);
}

Test(handle, wait_times_out_while_the_task_is_held) {
  tko_pool *p = make_pool(1, NULL);
  tt_pin pin = TT_PIN_INIT;
  tko_handle h;
  cr_assert_eq(tko_submit_handle(p, &h, tt_pin_fn, &pin, 0), 0);
  cr_assert(tt_count_wait_geq(&pin.started, 1));
  cr_assert_eq(tko_handle_wait(&h, 0), -ETIMEDOUT);
  cr_assert_eq(tko_handle_wait(&h, 20), -ETIMEDOUT);
  cr_assert_eq(tko_handle_status(&h), -EINPROGRESS);
  tt_gate_open(&pin.gate);
  cr_assert_eq(tko_handle_wait(&h, TT_LONG_MS), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* ---- waiters asleep when the task ends ---------------------------------- */

typedef struct waiter {
  tko_handle *h;
  tt_count *returned; /* counts the waits that returned */
  atomic_int tid;     /* the waiting thread's, once known */
  int rc;
} waiter;

/* Waits with no limit: a wake-up it missed leaves it asleep for good, and
 * the test's bounded wait for it reports that. */
static void *wait_thread(void *arg) {
  waiter *w = arg;
  atomic_store(&w->tid, (int)syscall(SYS_gettid));
  w->rc = tko_handle_wait(w->h, -1);
  tt_count_add(w->returned, 1);
  return NULL;
}

/* Whether thread tid of this process is asleep (state S in its stat). */
static bool asleep(int tid) { return tf_thread_state((pid_t)tid) == 'S'; }

/* Two threads are asleep in tko_handle_wait (the kernel says so) when the
 * task ends: both wake and return 0. */
Test(handle, waiters_asleep_when_the_task_ends_are_woken) {
  tko_pool *p = make_pool(1, NULL);
  tt_pin pin = TT_PIN_INIT;
  tko_handle h;
  cr_assert_eq(tko_submit_handle(p, &h, tt_pin_fn, &pin, 0), 0);
  cr_assert(tt_count_wait_geq(&pin.started, 1));
  tt_count returned = TT_COUNT_INIT;
  waiter w[2] = {{.h = &h, .returned = &returned}, {.h = &h, .returned = &returned}};
  pthread_t t[2];
  for (int i = 0; i < 2; i++)
    cr_assert_eq(pthread_create(&t[i], NULL, wait_thread, &w[i]), 0);
  /* Waiting on the kernel, as tt_wait_thread_count does: the threads
   * report their ids, then fall asleep in the wait. */
  uint64_t end = tt_now_ns() + 10000000000ull;
  for (int i = 0; i < 2; i++) {
    while ((!atomic_load(&w[i].tid) || !asleep(atomic_load(&w[i].tid))) && tt_now_ns() < end)
      sched_yield();
    cr_assert(asleep(atomic_load(&w[i].tid)), "waiter %d never fell asleep", i);
  }
  tt_gate_open(&pin.gate);
  cr_assert(tt_count_wait_geq(&returned, 2), "a waiter missed the end");
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(pthread_join(t[i], NULL), 0);
    cr_assert_eq(w[i].rc, 0, "a waiter missed the end");
  }
  cr_assert_eq(tko_handle_status(&h), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* ---- waits from inside tasks ----------------------------------------------- */

typedef struct outer {
  tko_pool *pool;
  tko_handle inner, *self;
  atomic_int inner_ran;
  int submit_rc, wait_rc, inner_status, self_rc;
} outer;

/* Submits a task on its own one-worker pool and waits for it: the wait
 * runs it here. Then waits on its own handle: -EDEADLK. */
static int outer_fn(void *arg) {
  outer *o = arg;
  o->submit_rc = tko_submit_handle(o->pool, &o->inner, count_fn, &o->inner_ran, 0);
  o->wait_rc = tko_handle_wait(&o->inner, -1);
  o->inner_status = tko_handle_status(&o->inner);
  o->self_rc = o->self ? tko_handle_wait(o->self, -1) : 0;
  return 0;
}

Test(handle, a_task_waiting_on_a_queued_handle_runs_it_on_a_one_worker_pool) {
  tko_pool *p = make_pool(1, NULL);
  outer o = {.pool = p};
  tko_handle h;
  o.self = &h;
  cr_assert_eq(tko_submit_handle(p, &h, outer_fn, &o, 0), 0);
  cr_assert_eq(tko_handle_wait(&h, TT_LONG_MS), 0, "the waiting task hung");
  cr_assert_eq(o.submit_rc, 0);
  cr_assert_eq(o.wait_rc, 0);
  cr_assert_eq(o.inner_status, 7);
  cr_assert_eq(atomic_load(&o.inner_ran), 1);
  cr_assert_eq(o.self_rc, -EDEADLK);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

typedef struct pair {
  tko_handle second;
  atomic_int second_ran;
  int wait_rc;
} pair;

static int first_fn(void *arg) {
  pair *pr = arg;
  pr->wait_rc = tko_handle_wait(&pr->second, -1);
  return 0;
}

/* Both taken in one batch by the only worker: the first waits on the
 * second, which no queue holds, and the wait runs the batch on to it. */
Test(handle, a_task_waiting_on_a_handle_in_its_own_batch_runs_it) {
  tko_pool *p = make_pool(1, NULL);
  pair pr = {.wait_rc = 1};
  tko_handle first;
  cr_assert_eq(tko_pool_pause(p), 0);
  cr_assert_eq(tko_submit_handle(p, &first, first_fn, &pr, 0), 0);
  cr_assert_eq(tko_submit_handle(p, &pr.second, count_fn, &pr.second_ran, 0), 0);
  cr_assert_eq(tko_pool_resume(p), 0);
  cr_assert_eq(tko_handle_wait(&first, TT_LONG_MS), 0, "the waiting task hung");
  cr_assert_eq(pr.wait_rc, 0);
  cr_assert_eq(tko_handle_status(&pr.second), 7);
  cr_assert_eq(atomic_load(&pr.second_ran), 1);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* A worker waiting on a handle whose task another worker holds runs the
 * pool's other queued tasks meanwhile: here the held task waits for a
 * gate that only a task queued behind the wait opens, and both workers are
 * busy, so the pool finishes only if the wait helps. */
typedef struct held {
  tko_handle task;
  tt_gate gate;
  tt_count started; /* the held task and the waiter */
  int wait_rc;
} held;

static int gated_fn(void *arg) {
  held *h = arg;
  tt_count_add(&h->started, 1);
  return tt_gate_wait(&h->gate) ? 3 : -1;
}

static int waiter_fn(void *arg) {
  held *h = arg;
  tt_count_add(&h->started, 1);
  h->wait_rc = tko_handle_wait(&h->task, -1);
  return 0;
}

static int opener_fn(void *arg) {
  tt_gate_open(&((held *)arg)->gate);
  return 0;
}

Test(handle, a_wait_on_a_task_another_worker_holds_runs_other_tasks) {
  tko_pool *p = make_pool(2, NULL);
  held h = {.gate = TT_GATE_INIT, .wait_rc = 1};
  tt_count_init(&h.started);
  cr_assert_eq(tko_submit_handle(p, &h.task, gated_fn, &h, 0), 0);
  cr_assert_eq(tko_submit(p, waiter_fn, &h, 0), 0);
  cr_assert(tt_count_wait_geq(&h.started, 2));
  cr_assert_eq(tko_submit(p, opener_fn, &h, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0, "the waiting worker ran nothing");
  cr_assert_eq(h.wait_rc, 0);
  cr_assert_eq(tko_handle_status(&h.task), 3);
  cr_assert_eq(tko_pool_destroy(p), 0);
  tt_count_fini(&h.started);
}

/* ---- shutdown, bad arguments, allocation ------------------------------------- */

Test(handle, shutdown_cancel_hands_queued_handles_to_on_cancel) {
  seen s;
  tko_pool *p = make_pool(1, &s);
  enum { N = 20 };
  tko_handle h[N];
  atomic_int ran = 0;
  cr_assert_eq(tko_pool_pause(p), 0);
  for (int i = 0; i < N; i++)
    cr_assert_eq(tko_submit_handle(p, &h[i], count_fn, &ran, i % 4), 0);
  cr_assert_eq(tko_pool_shutdown(p, TKO_CANCEL), 0);
  cr_assert_eq(tt_count_get(&s.cancels), N);
  for (int i = 0; i < N; i++) {
    cr_assert_eq(tko_handle_status(&h[i]), -ECANCELED);
    cr_assert_eq(tko_handle_wait(&h[i], 0), 0);
    cr_assert_eq(tko_handle_cancel(&h[i]), -EALREADY);
  }
  cr_assert_eq(atomic_load(&ran), 0);
  tko_handle late;
  cr_assert_eq(tko_submit_handle(p, &late, count_fn, &ran, 0), -ESHUTDOWN);
  cr_assert_eq(tko_handle_status(&late), -EINVAL, "a refused submit arms nothing");
  cr_assert_eq(tko_pool_destroy(p), 0);
  tt_count_fini(&s.cancels);
}

/* A full TKO_FULL_CALLER_RUNS queue runs the task on the submitter: it
 * has ended when the submit returns, and has no id (as its hooks see). */
Test(handle, a_task_run_on_its_submitter_has_ended_when_the_submit_returns) {
  seen s;
  memset(&s, 0, sizeof s);
  tt_count_init(&s.cancels);
  tko_options o = tko_basic_options(1);
  o.queue_capacity = 1;
  o.full_policy = TKO_FULL_CALLER_RUNS;
  o.hooks.user = &s;
  o.hooks.before_run = before_run;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  atomic_int ran = 0, mine = 0;
  cr_assert_eq(tko_pool_pause(p), 0);
  cr_assert_eq(tko_submit(p, count_fn, &ran, 0), 0); /* the queue is full */
  atomic_store(&s.started_id, 99);
  tko_handle h;
  memset(&h, 0xa5, sizeof h); /* whatever it held before: the submit sets the id */
  cr_assert_eq(tko_submit_handle(p, &h, count_fn, &mine, 0), 0);
  cr_assert_eq(atomic_load(&mine), 1, "it ran before the submit returned");
  cr_assert_eq(tko_handle_status(&h), 7);
  cr_assert_eq(tko_handle_wait(&h, 0), 0);
  cr_assert_eq(tko_handle_id(&h), 0);
  cr_assert_eq(atomic_load(&s.started_id), 0);
  cr_assert_eq(tko_pool_resume(p), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
  cr_assert_eq(atomic_load(&ran), 1);
  tt_count_fini(&s.cancels);
}

Test(handle, bad_arguments_are_refused) {
  tko_pool *p = make_pool(1, NULL);
  atomic_int ran = 0;
  tko_handle h;
  memset(&h, 0, sizeof h);
  cr_assert_eq(tko_submit_handle(p, NULL, count_fn, &ran, 0), -EINVAL);
  cr_assert_eq(tko_submit_handle(p, &h, NULL, &ran, 0), -EINVAL);
  cr_assert_eq(tko_submit_handle(NULL, &h, count_fn, &ran, 0), -EINVAL);
  cr_assert_eq(tko_handle_status(&h), -EINVAL);
  cr_assert_eq(tko_handle_cancel(&h), -EINVAL);
  cr_assert_eq(tko_handle_wait(&h, 0), -EINVAL);
  cr_assert_eq(tko_handle_id(&h), 0);
  cr_assert_eq(tko_handle_status(NULL), -EINVAL);
  cr_assert_eq(tko_handle_cancel(NULL), -EINVAL);
  cr_assert_eq(tko_handle_wait(NULL, 0), -EINVAL);
  cr_assert_eq(tko_handle_id(NULL), 0);
  cr_assert_eq(tko_submit_handle(p, &h, count_fn, &ran, 0), 0);
  cr_assert_eq(tko_handle_wait(&h, -2), -EINVAL);
  cr_assert_eq(tko_handle_wait(&h, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&ran), 1);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

typedef struct counting_alloc {
  atomic_long allocs, live;
} counting_alloc;

static void *ca_alloc(void *ctx, size_t size) {
  counting_alloc *c = ctx;
  void *p = malloc(size);
  if (p) {
    atomic_fetch_add(&c->allocs, 1);
    atomic_fetch_add(&c->live, 1);
  }
  return p;
}

static void *ca_realloc(void *ctx, void *ptr, size_t size) {
  counting_alloc *c = ctx;
  void *p = realloc(ptr, size);
  if (p) {
    atomic_fetch_add(&c->allocs, 1);
    if (!ptr) atomic_fetch_add(&c->live, 1);
  }
  return p;
}

static void ca_free(void *ctx, void *ptr) {
  counting_alloc *c = ctx;
  if (!ptr) return;
  atomic_fetch_sub(&c->live, 1);
  free(ptr);
}

/* As pool/steady_state_allocates_nothing_per_task, with handles: the
 * handle is the caller's, and a submit through it allocates nothing. A
 * queue may still grow once when the timing of takes first brings it a
 * weight it had not held (its bucket table: seen under load), which is
 * not per task: a steady phase that allocated runs again, and one that
 * allocates per task allocates in every attempt. */
static bool steady_handles_allocate_nothing(tko_pool *p, counting_alloc *ca, tko_handle *h,
                                            int burst, atomic_int *ran) {
  long before = atomic_load(&ca->allocs);
  for (int r = 0; r < TT_SCALE(40, 5); r++) {
    for (int i = 0; i < burst; i++) {
      int rc = tko_submit_handle(p, &h[i], count_fn, ran, i % 5);
      if (rc) cr_assert_eq(rc, 0);
    }
    for (int i = 0; i < burst; i++) {
      int rc = tko_handle_wait(&h[i], TT_LONG_MS);
      if (rc) cr_assert_eq(rc, 0);
    }
  }
  return atomic_load(&ca->allocs) == before;
}

Test(handle, a_handle_submit_allocates_nothing_in_a_steady_state) {
  counting_alloc ca = {0};
  tko_allocator al = {ca_alloc, ca_realloc, ca_free, &ca};
  tko_options o = tko_basic_options(2);
  o.initial_capacity = 16;
  o.allocator = &al;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  enum { BURST = 500 };
  static tko_handle h[BURST];
  atomic_int ran = 0;
  const int rounds = TT_SCALE(40, 5);
  for (int r = 0; r < 3; r++) { /* warm up: the whole burst queued at once */
    cr_assert_eq(tko_pool_pause(p), 0);
    for (int i = 0; i < BURST; i++)
      cr_assert_eq(tko_submit_handle(p, &h[i], count_fn, &ran, i % 5), 0);
    cr_assert_eq(tko_pool_resume(p), 0);
    cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  }
  int attempts = 0;
  bool none = false;
  while (!none && attempts < TT_ATTEMPTS) {
    attempts++;
    none = steady_handles_allocate_nothing(p, &ca, h, BURST, &ran);
  }
  cr_assert(none, "allocations in every one of %d steady phases", attempts);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&ran), BURST * (rounds * attempts + 3));
  cr_assert_eq(tko_pool_destroy(p), 0);
  cr_assert_eq(atomic_load(&ca.live), 0);
}

/* ---- cancels and waits around a cancel that has not ended ------------------- */

/* The worker took both tasks in one batch and runs the first; a cancel of
 * the second wins, and until the worker meets it the task has not ended:
 * its status says so, a wait times out, and a second cancel is -EALREADY
 * (it never reaches on_cancel twice). */
Test(handle, a_second_cancel_before_the_first_has_ended_is_ealready) {
  seen s;
  tko_pool *p = make_pool(1, &s);
  tt_pin pin = TT_PIN_INIT;
  atomic_int ran = 0;
  tko_handle h;
  cr_assert_eq(tko_pool_pause(p), 0);
  cr_assert_eq(tko_submit(p, tt_pin_fn, &pin, 0), 0);
  cr_assert_eq(tko_submit_handle(p, &h, count_fn, &ran, 0), 0);
  cr_assert_eq(tko_pool_resume(p), 0);
  cr_assert(tt_count_wait_geq(&pin.started, 1));
  cr_assert_eq(tko_handle_cancel(&h), 0);
  cr_assert_eq(tko_handle_status(&h), -EINPROGRESS, "the worker has not met it yet");
  cr_assert_eq(tko_handle_cancel(&h), -EALREADY);
  cr_assert_eq(tko_handle_wait(&h, 0), -ETIMEDOUT);
  cr_assert_eq(tko_handle_wait(&h, 5), -ETIMEDOUT);
  cr_assert_eq(tt_count_get(&s.cancels), 0, "on_cancel ran before the worker met it");
  tt_gate_open(&pin.gate);
  cr_assert_eq(tko_handle_wait(&h, TT_LONG_MS), 0);
  cr_assert_eq(tko_handle_status(&h), -ECANCELED);
  cr_assert_eq(tko_handle_cancel(&h), -EALREADY);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&ran), 0, "a cancelled task ran");
  cr_assert_eq(tt_count_get(&s.cancels), 1);
  cr_assert_eq(tko_pool_destroy(p), 0);
  tt_count_fini(&s.cancels);
}

/* An on_cancel hook runs as the cancelled task: a wait there on its own
 * handle would never end (-EDEADLK); waits on other unfinished things are
 * plain waits (here with timeout 0). */
typedef struct hook_waits {
  tko_handle target, other;
  tko_group group;
  atomic_int calls;
  int self_rc, other_rc, group_rc;
} hook_waits;

static hook_waits hw;

static void waiting_on_cancel(void *user, const tko_task_info *t) {
  (void)user;
  (void)t;
  atomic_fetch_add(&hw.calls, 1);
  hw.self_rc = tko_handle_wait(&hw.target, -1);
  hw.other_rc = tko_handle_wait(&hw.other, 0);
  hw.group_rc = tko_group_wait(&hw.group, 0);
}

Test(handle, an_on_cancel_hook_waiting_on_its_own_handle_gets_edeadlk) {
  memset(&hw, 0, sizeof hw);
  tko_options o = tko_basic_options(1);
  o.hooks.on_cancel = waiting_on_cancel;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  atomic_int ran = 0;
  cr_assert_eq(tko_group_init(&hw.group), 0);
  cr_assert_eq(tko_pool_pause(p), 0);
  cr_assert_eq(tko_submit_handle(p, &hw.target, count_fn, &ran, 0), 0);
  cr_assert_eq(tko_submit_handle(p, &hw.other, count_fn, &ran, 0), 0);
  cr_assert_eq(tko_group_submit(p, &hw.group, count_fn, &ran, 0), 0);
  cr_assert_eq(tko_handle_cancel(&hw.target), 0);
  cr_assert_eq(atomic_load(&hw.calls), 1);
  cr_assert_eq(hw.self_rc, -EDEADLK);
  cr_assert_eq(hw.other_rc, -ETIMEDOUT);
  cr_assert_eq(hw.group_rc, -ETIMEDOUT);
  cr_assert_eq(tko_handle_status(&hw.target), -ECANCELED);
  cr_assert_eq(tko_pool_resume(p), 0);
  cr_assert_eq(tko_handle_wait(&hw.other, TT_LONG_MS), 0);
  cr_assert_eq(tko_group_wait(&hw.group, TT_LONG_MS), 0);
  cr_assert_eq(tko_handle_status(&hw.other), 7);
  cr_assert_eq(atomic_load(&ran), 2, "the other two ran, the cancelled one did not");
  cr_assert_eq(tko_group_destroy(&hw.group), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* ---- waits from a worker that cannot run the task ----------------------------- */

typedef struct paused_wait {
  tko_handle h;
  atomic_int ran;
  tt_count stage; /* 1: the waiter runs; 2: its timed waits returned */
  tt_gate go;     /* the pool is paused and h submitted */
  int rc_zero, rc_short, rc_long, status_paused, rc_end;
} paused_wait;

static int paused_waiter_fn(void *arg) {
  paused_wait *pw = arg;
  tt_count_add(&pw->stage, 1);
  tt_gate_wait(&pw->go);
  pw->rc_zero = tko_handle_wait(&pw->h, 0);  /* runs nothing, paused or not */
  pw->rc_short = tko_handle_wait(&pw->h, 5); /* below the worker's look-again period */
  pw->rc_long = tko_handle_wait(&pw->h, 40); /* above it */
  pw->status_paused = tko_handle_status(&pw->h);
  tt_count_add(&pw->stage, 1);
  pw->rc_end = tko_handle_wait(&pw->h, -1); /* after the resume: runs it */
  return 0;
}

/* A task waiting on a queued handle of its own pool runs it - but not while
 * the pool is paused: its timed waits time out with the task still queued;
 * after the resume the wait runs it (the only worker is the waiter). */
Test(handle, a_worker_waiting_on_a_paused_pool_runs_nothing_until_the_resume) {
  tko_pool *p = make_pool(1, NULL);
  static paused_wait pw;
  memset(&pw, 0, sizeof pw);
  tt_count_init(&pw.stage);
  pw.go = (tt_gate)TT_GATE_INIT;
  cr_assert_eq(tko_submit(p, paused_waiter_fn, &pw, 0), 0);
  cr_assert(tt_count_wait_geq(&pw.stage, 1));
  cr_assert_eq(tko_pool_pause(p), 0);
  cr_assert_eq(tko_submit_handle(p, &pw.h, count_fn, &pw.ran, 0), 0);
  tt_gate_open(&pw.go);
  cr_assert(tt_count_wait_geq(&pw.stage, 2));
  cr_assert_eq(atomic_load(&pw.ran), 0, "a paused pool ran a task");
  cr_assert_eq(pw.rc_zero, -ETIMEDOUT);
  cr_assert_eq(pw.rc_short, -ETIMEDOUT);
  cr_assert_eq(pw.rc_long, -ETIMEDOUT);
  cr_assert_eq(pw.status_paused, -EINPROGRESS);
  cr_assert_eq(tko_pool_resume(p), 0);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  cr_assert_eq(pw.rc_end, 0);
  cr_assert_eq(tko_handle_status(&pw.h), 7);
  cr_assert_eq(atomic_load(&pw.ran), 1);
  cr_assert_eq(tko_pool_destroy(p), 0);
  tt_count_fini(&pw.stage);
}

/* Handles submitted by several threads land in several queues; the only
 * worker, waiting on each in turn, finds each in its queue and runs it. */
enum { SPREAD = 4 };

typedef struct spread {
  tko_pool *pool;
  tko_handle h[SPREAD];
  atomic_int ran;
  int submit_rc[SPREAD], wait_rc[SPREAD];
  tt_gate go;
  tt_count started;
} spread;

typedef struct spread_submitter {
  spread *s;
  int i;
} spread_submitter;

static void *spread_submit(void *arg) {
  spread_submitter *ss = arg;
  ss->s->submit_rc[ss->i] = tko_submit_handle(ss->s->pool, &ss->s->h[ss->i], count_fn,
                                              &ss->s->ran, 0);
  return NULL;
}

static int spread_waiter_fn(void *arg) {
  spread *s = arg;
  tt_count_add(&s->started, 1);
  tt_gate_wait(&s->go);
  for (int i = SPREAD - 1; i >= 0; i--) s->wait_rc[i] = tko_handle_wait(&s->h[i], -1);
  return 0;
}

Test(handle, a_worker_waiting_on_handles_in_several_queues_runs_each) {
  tko_options o = tko_basic_options(1);
  o.queues = SPREAD;
  static spread s;
  memset(&s, 0, sizeof s);
  s.go = (tt_gate)TT_GATE_INIT;
  tt_count_init(&s.started);
  cr_assert_eq(tko_pool_create(&s.pool, &o), 0);
  cr_assert_eq(tko_submit(s.pool, spread_waiter_fn, &s, 0), 0);
  cr_assert(tt_count_wait_geq(&s.started, 1));
  /* The only worker is the waiter: the handles stay queued. One submitting
   * thread each, so they go to different queues. */
  for (int i = 0; i < SPREAD; i++) {
    spread_submitter ss = {&s, i};
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, spread_submit, &ss), 0);
    cr_assert_eq(pthread_join(t, NULL), 0);
    cr_assert_eq(s.submit_rc[i], 0);
  }
  cr_assert_eq(atomic_load(&s.ran), 0);
  tt_gate_open(&s.go);
  cr_assert_eq(tko_pool_wait_idle(s.pool, TT_LONG_MS), 0);
  for (int i = 0; i < SPREAD; i++) {
    cr_assert_eq(s.wait_rc[i], 0);
    cr_assert_eq(tko_handle_status(&s.h[i]), 7);
  }
  cr_assert_eq(atomic_load(&s.ran), SPREAD);
  cr_assert_eq(tko_pool_destroy(s.pool), 0);
  tt_count_fini(&s.started);
}

/* A handle in another worker's batch: the waiting worker cannot run it
 * (no queue holds it, its own batch does not), so it waits until that
 * worker runs it. The scene's precondition - the other worker took the
 * handle with its pinned task - is read from the thread that ran it. */
typedef struct batch_wait {
  tko_handle h;
  tt_pin pin;
  pthread_t pin_thread, h_thread;
  atomic_int h_ran;
  tt_count waiter_started;
  int status_before, rc;
} batch_wait;

static int pin_recording_fn(void *arg) {
  batch_wait *bw = arg;
  bw->pin_thread = pthread_self();
  return tt_pin_fn(&bw->pin);
}

static int h_recording_fn(void *arg) {
  batch_wait *bw = arg;
  bw->h_thread = pthread_self();
  atomic_fetch_add(&bw->h_ran, 1);
  return 7;
}

static int batch_waiter_fn(void *arg) {
  batch_wait *bw = arg;
  bw->status_before = tko_handle_status(&bw->h);
  tt_count_add(&bw->waiter_started, 1);
  bw->rc = tko_handle_wait(&bw->h, -1);
  return 0;
}

static bool handle_in_another_workers_batch(void *arg) {
  (void)arg;
  tko_pool *p = make_pool(2, NULL);
  static batch_wait bw;
  memset(&bw, 0, sizeof bw);
  bw.pin = (tt_pin)TT_PIN_INIT;
  tt_count_init(&bw.waiter_started);
  cr_assert_eq(tko_pool_pause(p), 0);
  cr_assert_eq(tko_submit(p, pin_recording_fn, &bw, 0), 0);
  cr_assert_eq(tko_submit_handle(p, &bw.h, h_recording_fn, &bw, 0), 0);
  /* A take moves a share of the queue (its length over the workers): two
   * more tasks make the first take's share the pinned task and h. */
  for (int i = 0; i < 2; i++) cr_assert_eq(tko_submit(p, tt_nop_fn, NULL, 0), 0);
  cr_assert_eq(tko_pool_resume(p), 0);
  cr_assert(tt_count_wait_geq(&bw.pin.started, 1));
  cr_assert_eq(tko_submit(p, batch_waiter_fn, &bw, 0), 0);
  cr_assert(tt_count_wait_geq(&bw.waiter_started, 1));
  tt_gate_open(&bw.pin.gate);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0, "the waiter hung");
  cr_assert_eq(atomic_load(&bw.h_ran), 1);
  cr_assert_eq(bw.rc, 0);
  cr_assert_eq(tko_handle_status(&bw.h), 7);
  bool held = bw.status_before == -EINPROGRESS && pthread_equal(bw.h_thread, bw.pin_thread);
  cr_assert_eq(tko_pool_destroy(p), 0);
  tt_count_fini(&bw.waiter_started);
  return held;
}

Test(handle, a_worker_waiting_on_a_handle_in_another_workers_batch_waits_for_it) {
  cr_assert(tt_rerun(handle_in_another_workers_batch, NULL),
            "the pinned worker never took the handle with its task");
}

/* ---- the depth of waits that run their task --------------------------------- */

/* A chain on one worker: node d submits node d+1 and waits on it, which
 * runs it below. TKO_MAX_HELP_DEPTH such waits deep, the next wait runs
 * nothing and is -EDEADLK at once (as a group wait that deep is), the chain
 * unwinds, and the worker then runs the last node from the queue. */
enum { CHAIN = TKO_MAX_HELP_DEPTH + 2 };

typedef struct chain {
  tko_pool *pool;
  tko_handle h[CHAIN];
  atomic_int ran[CHAIN];
  int wait_rc[CHAIN];
} chain;

static chain ch;

static int chain_fn(void *arg) {
  int d = (int)(intptr_t)arg;
  atomic_fetch_add(&ch.ran[d], 1);
  if (d + 1 < CHAIN) {
    if (tko_submit_handle(ch.pool, &ch.h[d + 1], chain_fn, (void *)(intptr_t)(d + 1), 0))
      ch.wait_rc[d] = 1;
    else
      ch.wait_rc[d] = tko_handle_wait(&ch.h[d + 1], d < (int)TKO_MAX_HELP_DEPTH ? -1 : 20);
  }
  return 0;
}

Test(handle, waits_that_run_their_task_nest_at_most_tko_max_help_depth_deep) {
  memset(&ch, 0, sizeof ch);
  ch.pool = make_pool(1, NULL);
  cr_assert_eq(tko_submit_handle(ch.pool, &ch.h[0], chain_fn, (void *)(intptr_t)0, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(ch.pool, TT_LONG_MS), 0);
  for (int d = 0; d + 1 < CHAIN; d++)
    cr_assert_eq(ch.wait_rc[d], d < (int)TKO_MAX_HELP_DEPTH ? 0 : -EDEADLK, "node %d", d);
  for (int d = 0; d < CHAIN; d++) {
    cr_assert_eq(atomic_load(&ch.ran[d]), 1, "node %d", d);
    cr_assert_eq(tko_handle_status(&ch.h[d]), 0);
  }
  cr_assert_eq(tko_pool_destroy(ch.pool), 0);
}

/* ---- waits from a worker on a task it may not run ------------------------------ */

typedef struct far_wait {
  tko_handle *h;
  tt_count timed_out; /* the timed wait returned */
  int rc_timed, status_timed, rc_end;
} far_wait;

static int far_waiter_fn(void *arg) {
  far_wait *fw = arg;
  fw->rc_timed = tko_handle_wait(fw->h, 10);
  fw->status_timed = tko_handle_status(fw->h);
  tt_count_add(&fw->timed_out, 1);
  fw->rc_end = tko_handle_wait(fw->h, -1);
  return 0;
}

/* The task runs on the pool's other worker: the waiting worker sleeps until
 * it ends (a timed wait times out meanwhile). */
Test(handle, a_worker_waiting_on_a_task_running_on_another_worker_sleeps_until_its_end) {
  tko_pool *p = make_pool(2, NULL);
  tt_pin pin = TT_PIN_INIT;
  tko_handle h;
  static far_wait fw;
  memset(&fw, 0, sizeof fw);
  tt_count_init(&fw.timed_out);
  fw.h = &h;
  cr_assert_eq(tko_submit_handle(p, &h, tt_pin_fn, &pin, 0), 0);
  cr_assert(tt_count_wait_geq(&pin.started, 1));
  cr_assert_eq(tko_submit(p, far_waiter_fn, &fw, 0), 0);
  cr_assert(tt_count_wait_geq(&fw.timed_out, 1));
  cr_assert_eq(fw.rc_timed, -ETIMEDOUT);
  cr_assert_eq(fw.status_timed, -EINPROGRESS);
  tt_gate_open(&pin.gate);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0, "the waiter missed the end");
  cr_assert_eq(fw.rc_end, 0);
  cr_assert_eq(tko_handle_status(&h), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
  tt_count_fini(&fw.timed_out);
}

/* A worker of pool A waits on a task queued in paused pool B: it runs only
 * its own pool's tasks, so the task stays queued until B resumes and runs
 * it. */
Test(handle, a_worker_of_another_pool_waits_without_running_the_task) {
  seen s;
  tko_pool *a = make_pool(1, NULL);
  tko_pool *b = make_pool(1, &s);
  atomic_int ran = 0;
  tko_handle h;
  static far_wait fw;
  memset(&fw, 0, sizeof fw);
  tt_count_init(&fw.timed_out);
  fw.h = &h;
  cr_assert_eq(tko_pool_pause(b), 0);
  cr_assert_eq(tko_submit_handle(b, &h, count_fn, &ran, 0), 0);
  cr_assert_eq(tko_submit(a, far_waiter_fn, &fw, 0), 0);
  cr_assert(tt_count_wait_geq(&fw.timed_out, 1));
  cr_assert_eq(fw.rc_timed, -ETIMEDOUT);
  cr_assert_eq(fw.status_timed, -EINPROGRESS);
  cr_assert_eq(atomic_load(&ran), 0, "pool A's worker ran pool B's task");
  cr_assert_eq(tko_pool_resume(b), 0);
  cr_assert_eq(tko_pool_wait_idle(a, TT_LONG_MS), 0, "the waiter missed the end");
  cr_assert_eq(fw.rc_end, 0);
  cr_assert_eq(tko_handle_status(&h), 7);
  cr_assert_eq(atomic_load(&ran), 1);
  cr_assert_eq(atomic_load(&s.started_id), tko_handle_id(&h), "pool B ran it");
  cr_assert_eq(tko_pool_destroy(a), 0);
  cr_assert_eq(tko_pool_destroy(b), 0);
  tt_count_fini(&fw.timed_out);
  tt_count_fini(&s.cancels);
}
