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
static bool asleep(int tid) {
  char path[64], buf[256];
  snprintf(path, sizeof path, "/proc/self/task/%d/stat", tid);
  FILE *f = fopen(path, "r");
  if (!f) return false;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  const char *close = strrchr(buf, ')'); /* the name may hold spaces */
  return close && close[1] == ' ' && close[2] == 'S';
}

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
 * handle is the caller's, and a submit through it allocates nothing. */
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
  long before = atomic_load(&ca.allocs);
  for (int r = 0; r < rounds; r++) {
    for (int i = 0; i < BURST; i++) {
      int rc = tko_submit_handle(p, &h[i], count_fn, &ran, i % 5);
      if (rc) cr_assert_eq(rc, 0);
    }
    for (int i = 0; i < BURST; i++) {
      int rc = tko_handle_wait(&h[i], TT_LONG_MS);
      if (rc) cr_assert_eq(rc, 0);
    }
  }
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&ran), BURST * (rounds + 3));
  cr_assert_eq(atomic_load(&ca.allocs), before, "allocations in a steady state");
  cr_assert_eq(tko_pool_destroy(p), 0);
  cr_assert_eq(atomic_load(&ca.live), 0);
}
