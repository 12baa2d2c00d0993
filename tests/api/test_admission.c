/* SPDX-License-Identifier: MIT */
/* Bounded queues stay exact while room moves in chunks (issue 15): a
 * submitting thread leases room ahead of its submits and a worker gives
 * room back a chunk at a time. Room held that way is not in use, so it
 * must never refuse a submit, send one to the caller, or keep a blocked
 * submitter waiting: a submit that finds the queue full takes every chunk
 * back first, and a waiter takes back what was leased while it slept.
 * Each test fills a paused pool and counts exactly queue_capacity tasks
 * in before the first refusal, or sees a blocked submit get in; and on a
 * running pool each start lets exactly one more submit in (kept from the
 * attack on this change, which found no violation: docs/RELIABILITY.md).
 * Public API only; waits are bounded by the suites' limits (a hang
 * fails). */
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#include "taskorch.h"
#include "tko_test.h"
#include "tko_test_feature.h"
#include "tko_test_sync.h"

static atomic_int runs;

static int count_run(void *arg) {
  (void)arg;
  atomic_fetch_add(&runs, 1);
  return 0;
}

static tko_pool *make_pool(unsigned workers, size_t cap, tko_full_policy policy) {
  tko_options o = tko_basic_options(workers);
  o.queue_capacity = cap;
  o.full_policy = policy;
  tko_pool *p = NULL;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  atomic_store(&runs, 0);
  return p;
}

/* One submit on a thread of its own, which then ends: whatever room it
 * leased stays behind in its ring. */
typedef struct one_submit {
  tko_pool *pool;
  int rc;
} one_submit;

static void *submit_one(void *arg) {
  one_submit *s = arg;
  s->rc = tko_submit(s->pool, count_run, NULL, 0);
  return NULL;
}

static void submit_on_a_thread(tko_pool *pool) {
  one_submit s = {pool, -1};
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, submit_one, &s), 0);
  cr_assert_eq(pthread_join(t, NULL), 0);
  cr_assert_eq(s.rc, 0);
}

/* Submits from this thread until one is not queued: returns how many
 * were; *last is the refused submit's code (0 for a caller-run). */
static size_t fill(tko_pool *pool, size_t most, int *last) {
  for (size_t n = 0; n < most; n++) {
    uint64_t queued = tf_stats(pool).queued;
    int rc = tko_submit(pool, count_run, NULL, 0);
    if (rc || tf_stats(pool).queued == queued) {
      *last = rc;
      return n;
    }
  }
  *last = 0;
  return most;
}

/* Eight threads lease room and end; then one thread fills the queue. */
static void leased_room_is_used(tko_full_policy policy) {
  enum { CAP = 64, THREADS = 8 };
  tko_pool *pool = make_pool(4, CAP, policy);
  cr_assert_eq(tko_pool_pause(pool), 0);
  for (int i = 0; i < THREADS; i++) submit_on_a_thread(pool);
  int last;
  size_t n = fill(pool, 2 * CAP, &last);
  cr_assert_eq(n, CAP - THREADS, "leased room refused a submit: %zu of %d in", n + THREADS, CAP);
  cr_assert_eq(last, policy == TKO_FULL_REJECT ? -EAGAIN : 0);
  cr_assert_eq(tf_stats(pool).queued, CAP);
  cr_assert_eq(tko_pool_resume(pool), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  int caller_runs = policy == TKO_FULL_CALLER_RUNS;
  cr_assert_eq(atomic_load(&runs), CAP + caller_runs);
  cr_assert_eq(tko_pool_destroy(pool), 0);
}

Test(admission, room_leased_by_ended_threads_is_taken_back_before_a_refusal) {
  leased_room_is_used(TKO_FULL_REJECT);
}

Test(admission, room_leased_by_ended_threads_is_taken_back_before_a_caller_run) {
  leased_room_is_used(TKO_FULL_CALLER_RUNS);
}

/* A worker that has run tasks holds some of their room in its chunk; a
 * full queue takes it back. workers 1: the chunk's size follows from the
 * tasks run one at a time (the first gives its room back at once, the
 * second into the chunk). */
static void given_room_is_used(unsigned workers, unsigned waves) {
  enum { CAP = 1024 };
  tko_pool *pool = make_pool(workers, CAP, TKO_FULL_REJECT);
  for (unsigned w = 0; w < waves; w++) {
    for (unsigned i = 0; i <= w * 97 % 300; i++) cr_assert_eq(tko_submit(pool, count_run, NULL, 0), 0);
    cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  }
  int before = atomic_load(&runs);
  cr_assert_eq(tko_pool_pause(pool), 0);
  int last;
  size_t n = fill(pool, 2 * CAP, &last);
  cr_assert_eq(n, CAP, "room given back by workers refused a submit: %zu of %d in", n, CAP);
  cr_assert_eq(last, -EAGAIN);
  cr_assert_eq(tko_pool_resume(pool), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  cr_assert_eq(atomic_load(&runs), before + CAP);
  cr_assert_eq(tko_pool_destroy(pool), 0);
}

Test(admission, room_a_worker_gathers_is_taken_back_before_a_refusal) { given_room_is_used(1, 2); }

Test(admission, room_workers_gather_is_taken_back_before_a_refusal) { given_room_is_used(4, 12); }

/* A blocked submit on a thread of its own. */
typedef struct blocked {
  tko_pool *pool;
  tko_task *tasks;
  size_t n;
} blocked;

static int submit_blocked(void *arg) {
  blocked *b = arg;
  return b->n == 1 ? tko_submit(b->pool, count_run, NULL, 0)
                   : tko_submit_batch(b->pool, b->tasks, b->n);
}

Test(admission, a_blocked_batch_takes_back_room_leased_while_it_waited) {
  enum { CAP = 1024 }; /* room enough for the second thread to lease */
  tko_pool *pool = make_pool(4, CAP, TKO_FULL_BLOCK);
  cr_assert_eq(tko_pool_pause(pool), 0);
  submit_on_a_thread(pool); /* one task queued, and a lease beside it */
  static tko_task tasks[CAP];
  for (int i = 0; i < CAP; i++) tasks[i] = (tko_task){.fn = count_run};
  blocked b = {pool, tasks, CAP};
  tf_thread t;
  cr_assert_eq(tf_thread_start(&t, submit_blocked, &b), 0);
  cr_assert(tf_wait_thread_sleeping(t.tid), "the batch does not fit beside one task: it waits");
  /* Leased while the batch waits: that room must come back to it once the
   * two queued tasks have started, or it waits for good. */
  submit_on_a_thread(pool);
  cr_assert_eq(tko_pool_resume(pool), 0);
  int rc = -1;
  cr_assert(tf_thread_join(&t, &rc), "the batch still waits, for room leased and unused");
  cr_assert_eq(rc, 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  cr_assert_eq(atomic_load(&runs), CAP + 2);
  cr_assert_eq(tko_pool_destroy(pool), 0);
}

/* The first queued task holds the only worker until the test opens its
 * gate: one start, one task's room, and the blocked submit must get it
 * then, not a chunk of starts later. */
static tt_gate first_gate;

static int gated_run(void *arg) {
  (void)arg;
  (void)tt_gate_wait(&first_gate);
  atomic_fetch_add(&runs, 1);
  return 0;
}

Test(admission, a_blocked_submit_gets_the_room_of_one_start_at_once) {
  enum { CAP = 1024 }; /* room enough that the worker's chunks stay large */
  tko_pool *pool = make_pool(1, CAP, TKO_FULL_BLOCK);
  pthread_mutex_init(&first_gate.mu, NULL);
  pthread_cond_init(&first_gate.cv, NULL);
  first_gate.open = false;
  /* Two tasks, one at a time: the worker now gathers its give-backs. */
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(tko_submit(pool, count_run, NULL, 0), 0);
    cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  }
  cr_assert_eq(tko_pool_pause(pool), 0);
  cr_assert_eq(tko_submit_timed(pool, gated_run, NULL, 0, 0), 0);
  for (int i = 1; i < CAP; i++) cr_assert_eq(tko_submit_timed(pool, count_run, NULL, 0, 0), 0);
  blocked b = {pool, NULL, 1};
  tf_thread t;
  cr_assert_eq(tf_thread_start(&t, submit_blocked, &b), 0);
  cr_assert(tf_wait_thread_sleeping(t.tid));
  cr_assert_eq(tko_pool_resume(pool), 0);
  int rc = -1;
  /* Half the gate's own limit (TT_LONG_MS): the join must end while the
   * gated task still holds the worker. With the same limit, a gate that
   * timed out first let the worker start more tasks, whose chunk then
   * woke the submitter just inside the join's (the mutant
   * admit-give-back-ignores-waiters survived a CI run that way). */
  bool in = tf_thread_join_within(&t, TT_LONG_MS / 2, &rc);
  tt_gate_open(&first_gate);
  cr_assert(in, "one start's room did not reach the blocked submit while that task ran");
  cr_assert_eq(rc, 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  cr_assert_eq(atomic_load(&runs), 2 + CAP + 1);
  cr_assert_eq(tko_pool_destroy(pool), 0);
}

/* Many threads, each leasing, submit through a small queue that workers
 * drain: every task accepted runs once, and the queue never holds more
 * than its capacity (a paused check at the end: nothing queued). */
typedef struct producer {
  tko_pool *pool;
  int n, rc;
} producer;

static void *produce(void *arg) {
  producer *p = arg;
  for (int i = 0; i < p->n && !p->rc; i++) p->rc = tko_submit(p->pool, count_run, NULL, i % 3);
  return NULL;
}

Test(admission, producers_leasing_through_a_small_queue_lose_nothing) {
  enum { CAP = 128, THREADS = 6, PER = TT_SCALE(20000, 2000) };
  tko_pool *pool = make_pool(3, CAP, TKO_FULL_BLOCK);
  producer ps[THREADS];
  pthread_t ts[THREADS];
  for (int i = 0; i < THREADS; i++) {
    ps[i] = (producer){pool, PER, 0};
    cr_assert_eq(pthread_create(&ts[i], NULL, produce, &ps[i]), 0);
  }
  for (int i = 0; i < THREADS; i++) {
    cr_assert_eq(pthread_join(ts[i], NULL), 0);
    cr_assert_eq(ps[i].rc, 0);
  }
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  cr_assert_eq(atomic_load(&runs), THREADS * PER);
  /* And all the room is back: a paused pool takes exactly CAP again. */
  cr_assert_eq(tko_pool_pause(pool), 0);
  for (int i = 0; i < CAP; i++)
    cr_assert_eq(tko_submit_timed(pool, count_run, NULL, 0, 0), 0, "room lost: %d in", i);
  cr_assert_eq(tko_submit_timed(pool, count_run, NULL, 0, 0), -ETIMEDOUT);
  cr_assert_eq(tko_pool_resume(pool), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  cr_assert_eq(tko_pool_destroy(pool), 0);
}

/* Kept from the attack on leased room (its t02_stepwise): a running pool
 * whose tasks wait on a semaphore; each time one finishes and the worker
 * starts a queued one, exactly one more submit fits - the room the worker
 * gave back, in a chunk or not - also when a fresh thread (which may lease)
 * makes it. */
static sem_t stepper;
static tt_count step_started;

static int step_task(void *arg) {
  (void)arg;
  tt_count_add(&step_started, 1);
  sem_wait(&stepper);
  atomic_fetch_add(&runs, 1);
  return 0;
}

static int try_step_submit(tko_pool *pool, tko_full_policy policy) {
  int rc = policy == TKO_FULL_BLOCK ? tko_submit_timed(pool, step_task, NULL, 0, 0)
                                    : tko_submit(pool, step_task, NULL, 0);
  if (rc) cr_assert_eq(rc, policy == TKO_FULL_BLOCK ? -ETIMEDOUT : -EAGAIN);
  return rc == 0;
}

typedef struct step_helper {
  tko_pool *pool;
  tko_full_policy policy;
  int in;
} step_helper;

static void *step_from_a_thread(void *arg) {
  step_helper *h = arg;
  int rc = h->policy == TKO_FULL_BLOCK ? tko_submit_timed(h->pool, step_task, NULL, 0, 0)
                                       : tko_submit(h->pool, step_task, NULL, 0);
  h->in = rc == 0;
  return NULL;
}

static void each_start_frees_one_submit(tko_full_policy policy, size_t cap) {
  enum { WORKERS = 2, STEPS = TT_SCALE(150, 40) };
  cr_assert_eq(sem_init(&stepper, 0, 0), 0);
  tt_count_init(&step_started);
  tko_options o = tko_basic_options(WORKERS);
  o.queue_capacity = cap;
  o.full_policy = policy;
  o.max_batch = 1;
  tko_pool *pool;
  cr_assert_eq(tko_pool_create(&pool, &o), 0);
  atomic_store(&runs, 0);
  long in = 0;
  for (int i = 0; i < WORKERS; i++, in++) cr_assert(try_step_submit(pool, policy));
  cr_assert(tt_count_wait_geq(&step_started, WORKERS)); /* both workers hold a task */
  size_t queued = 0;
  while (try_step_submit(pool, policy)) cr_assert_leq(++queued, cap, "over the capacity");
  cr_assert_eq(queued, cap);
  in += (long)queued;
  for (int step = 0; step < STEPS; step++) {
    long before = tt_count_get(&step_started);
    cr_assert_eq(sem_post(&stepper), 0); /* one task ends; its worker starts a queued one */
    cr_assert(tt_count_wait_geq(&step_started, before + 1));
    int got = 0;
    if (step % 2) {
      step_helper h = {pool, policy, 0};
      pthread_t t;
      cr_assert_eq(pthread_create(&t, NULL, step_from_a_thread, &h), 0);
      cr_assert_eq(pthread_join(t, NULL), 0);
      got += h.in;
    }
    while (got < 3 && try_step_submit(pool, policy)) got++;
    cr_assert_eq(got, 1, "step %d: %d submits fit after one task started", step, got);
    in += got;
    cr_assert_leq(tf_stats(pool).queued, cap);
  }
  for (long i = 0; i < in; i++) cr_assert_eq(sem_post(&stepper), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  cr_assert_eq(atomic_load(&runs), in);
  cr_assert_eq(tko_pool_destroy(pool), 0);
  tt_count_fini(&step_started);
  sem_destroy(&stepper);
}

Test(admission, each_start_lets_exactly_one_more_submit_in_reject) {
  each_start_frees_one_submit(TKO_FULL_REJECT, 64);
}

Test(admission, each_start_lets_exactly_one_more_submit_in_block) {
  each_start_frees_one_submit(TKO_FULL_BLOCK, 1000);
}
