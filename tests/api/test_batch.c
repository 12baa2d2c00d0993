/* SPDX-License-Identifier: MIT */
/* Tests for tko_submit_batch: every task runs; ids are consecutive in array
 * order (seen through the before_run hook); priority order across the
 * batch; all or nothing (a NULL fn anywhere, or too little room in a
 * bounded reject pool, and nothing is queued or run); batches larger than
 * the submit inbox (1024); blocking and caller-runs bounded pools; batches
 * from several threads at once; and shutdown (refused after it, cancelled or
 * drained with it, nothing lost). No test sleeps to wait for something. */
#include <errno.h>
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

/* One slot per task of a test: the task's index is its argument's offset. */
typedef struct bctx {
  size_t n;
  atomic_uint_fast64_t *id; /* id the before_run hook saw, per task */
  atomic_int *ran;          /* runs per task */
  atomic_int *cancelled;    /* on_cancel calls per task */
  atomic_long order_next;   /* run order counter */
  long *order;              /* run position of each task (one worker) */
  pthread_t *thread;        /* thread each task ran on */
  atomic_int bad;           /* an argument outside the table */
  tt_count runs, cancels;
} bctx;

static bctx *bctx_new(size_t n) {
  bctx *c = calloc(1, sizeof *c);
  c->n = n;
  c->id = calloc(n, sizeof *c->id);
  c->ran = calloc(n, sizeof *c->ran);
  c->cancelled = calloc(n, sizeof *c->cancelled);
  c->order = calloc(n, sizeof *c->order);
  c->thread = calloc(n, sizeof *c->thread);
  atomic_init(&c->order_next, 0);
  atomic_init(&c->bad, 0);
  tt_count_init(&c->runs);
  tt_count_init(&c->cancels);
  return c;
}

static void bctx_free(bctx *c) {
  free(c->id);
  free(c->ran);
  free(c->cancelled);
  free(c->order);
  free(c->thread);
  tt_count_fini(&c->runs);
  tt_count_fini(&c->cancels);
  free(c);
}

/* Tasks get (void *)(index + 1) so that index 0 is not NULL. */
static void *arg_of(size_t i) {
  return (void *)(uintptr_t)(i + 1);
}

static size_t index_of(bctx *c, void *arg) {
  size_t i = (size_t)(uintptr_t)arg - 1;
  if (i >= c->n) {
    atomic_fetch_add(&c->bad, 1);
    return 0;
  }
  return i;
}

static _Thread_local bctx *cur; /* set by the hooks, for the task body */

static void before_run(void *user, const tko_task_info *t) {
  bctx *c = user;
  cur = c;
  atomic_store(&c->id[index_of(c, t->arg)], t->id);
}

static void on_cancel(void *user, const tko_task_info *t) {
  bctx *c = user;
  atomic_fetch_add(&c->cancelled[index_of(c, t->arg)], 1);
  tt_count_add(&c->cancels, 1);
}

static int task_fn(void *arg) {
  bctx *c = cur;
  size_t i = index_of(c, arg);
  c->order[i] = atomic_fetch_add(&c->order_next, 1);
  c->thread[i] = pthread_self();
  atomic_fetch_add(&c->ran[i], 1);
  tt_count_add(&c->runs, 1);
  return 0;
}

static tko_pool *make_pool(bctx *c, unsigned workers, size_t capacity, tko_full_policy policy) {
  tko_options o = tko_basic_options(workers);
  o.queue_capacity = capacity;
  o.full_policy = policy;
  o.hooks.user = c;
  o.hooks.before_run = before_run;
  o.hooks.on_cancel = on_cancel;
  tko_pool *p = NULL;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  return p;
}

static tko_task *tasks_new(size_t n, size_t first_index) {
  tko_task *t = calloc(n, sizeof *t);
  for (size_t i = 0; i < n; i++)
    t[i] = (tko_task){task_fn, arg_of(first_index + i), 0};
  return t;
}

static uint64_t submitted(tko_pool *pool) {
  tko_stats s;
  tko_pool_stats(pool, &s);
  return s.submitted;
}

Test(batch, every_task_runs_once) {
  enum { N = 100 };
  bctx *c = bctx_new(N);
  tko_pool *pool = make_pool(c, 2, 0, TKO_FULL_BLOCK);
  tko_task *t = tasks_new(N, 0);
  cr_assert_eq(tko_submit_batch(pool, t, N), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  for (size_t i = 0; i < N; i++)
    cr_assert_eq(atomic_load(&c->ran[i]), 1);
  tko_stats s;
  tko_pool_stats(pool, &s);
  cr_assert_eq(s.submitted, N);
  cr_assert_eq(s.completed, N);
  cr_assert_eq(tko_pool_destroy(pool), 0);
  cr_assert_eq(atomic_load(&c->bad), 0);
  free(t);
  bctx_free(c);
}

Test(batch, invalid_arguments_queue_nothing) {
  enum { N = 8 };
  bctx *c = bctx_new(N);
  tko_pool *pool = make_pool(c, 1, 0, TKO_FULL_BLOCK);
  tko_task *t = tasks_new(N, 0);
  cr_assert_eq(tko_submit_batch(NULL, t, N), -EINVAL);
  cr_assert_eq(tko_submit_batch(pool, NULL, N), -EINVAL);
  cr_assert_eq(tko_submit_batch(pool, t, 0), -EINVAL);
  /* A NULL fn first, in the middle or last: all or nothing. */
  size_t holes[] = {0, N / 2, N - 1};
  for (size_t h = 0; h < 3; h++) {
    tko_task_fn saved = t[holes[h]].fn;
    t[holes[h]].fn = NULL;
    cr_assert_eq(tko_submit_batch(pool, t, N), -EINVAL);
    t[holes[h]].fn = saved;
  }
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  cr_assert_eq(submitted(pool), 0);
  cr_assert_eq(tt_count_get(&c->runs), 0, "a refused batch ran tasks");
  /* The next good batch gets the first ids: the refused ones used none. */
  cr_assert_eq(tko_submit_batch(pool, t, N), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  for (size_t i = 0; i < N; i++)
    cr_assert_eq(atomic_load(&c->id[i]), i + 1);
  cr_assert_eq(tko_pool_destroy(pool), 0);
  cr_assert_eq(atomic_load(&c->bad), 0);
  free(t);
  bctx_free(c);
}

/* Ids (header: tko_task_info.id): a batch's are consecutive in array
 * order, one thread's increase; a one-worker pool's are gap-free in
 * submit order (its shared inbox), a pool with more workers gives each
 * submitting thread its own range (its ring). */
static void check_batch_ids(unsigned workers) {
  enum { N = 50 };
  bctx *c = bctx_new(N + 2);
  tko_pool *pool = make_pool(c, workers, 0, TKO_FULL_BLOCK);
  tko_task *t = tasks_new(N, 1);
  /* Mixed weights: ids follow the array even though run order does not. */
  for (size_t i = 0; i < N; i++)
    t[i].weight = (int)(i * 7 % 11) - 5;
  cr_assert_eq(tko_submit(pool, task_fn, arg_of(0), 0), 0);
  cr_assert_eq(tko_submit_batch(pool, t, N), 0);
  cr_assert_eq(tko_submit(pool, task_fn, arg_of(N + 1), 0), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  uint64_t first = atomic_load(&c->id[0]);
  if (workers == 1) cr_assert_eq(first, 1);
  for (size_t i = 1; i < N + 2; i++) {
    uint64_t id = atomic_load(&c->id[i]), prev = atomic_load(&c->id[i - 1]);
    if (workers == 1 || (i > 1 && i <= N)) /* gap-free; inside the batch */
      cr_assert_eq(id, prev + 1, "task %zu: id %llu after %llu", i, (unsigned long long)id,
                   (unsigned long long)prev);
    else
      cr_assert_gt(id, prev, "one thread's ids increase");
  }
  cr_assert_eq(tko_pool_destroy(pool), 0);
  cr_assert_eq(atomic_load(&c->bad), 0);
  free(t);
  bctx_free(c);
}

Test(batch, ids_are_consecutive_in_array_order) {
  check_batch_ids(1);
  check_batch_ids(2);
}

Test(batch, runs_in_weight_then_array_order) {
  enum { N = 64 };
  bctx *c = bctx_new(N);
  tko_pool *pool = make_pool(c, 1, 0, TKO_FULL_BLOCK);
  tko_task *t = tasks_new(N, 0);
  for (size_t i = 0; i < N; i++)
    t[i].weight = (int)(i % 4); /* 0,1,2,3,0,1,... */
  cr_assert_eq(tko_pool_pause(pool), 0);
  cr_assert_eq(tko_submit_batch(pool, t, N), 0);
  cr_assert_eq(tko_pool_resume(pool), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  /* One worker: weight 3 first, then 2, ...; equal weights in array order. */
  for (size_t i = 0; i < N; i++) {
    size_t w = i % 4, rank = i / 4;
    long want = (long)((3 - w) * (N / 4) + rank);
    cr_assert_eq(c->order[i], want, "task %zu ran at %ld, want %ld", i, c->order[i], want);
  }
  cr_assert_eq(tko_pool_destroy(pool), 0);
  cr_assert_eq(atomic_load(&c->bad), 0);
  free(t);
  bctx_free(c);
}

Test(batch, larger_than_the_inbox) {
  enum { N = 5000, PRE = 10 };
  bctx *c = bctx_new(PRE + N);
  tko_pool *pool = make_pool(c, 1, 0, TKO_FULL_BLOCK);
  tko_task *t = tasks_new(N, PRE);
  /* Singles first, still in the inbox when the big batch comes (paused). */
  cr_assert_eq(tko_pool_pause(pool), 0);
  for (size_t i = 0; i < PRE; i++)
    cr_assert_eq(tko_submit(pool, task_fn, arg_of(i), 0), 0);
  cr_assert_eq(tko_submit_batch(pool, t, N), 0);
  tko_stats s;
  tko_pool_stats(pool, &s);
  cr_assert_eq(s.submitted, PRE + N);
  cr_assert_eq(s.queued, PRE + N);
  cr_assert_eq(tko_pool_resume(pool), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  for (size_t i = 0; i < PRE + N; i++) {
    cr_assert_eq(atomic_load(&c->ran[i]), 1);
    cr_assert_eq(atomic_load(&c->id[i]), i + 1, "task %zu has id %llu", i,
                 (unsigned long long)atomic_load(&c->id[i]));
    cr_assert_eq(c->order[i], (long)i, "equal weights: submit order");
  }
  /* And once more on a running pool, from the test thread. */
  cr_assert_eq(tko_submit_batch(pool, t, N), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  cr_assert_eq(tt_count_get(&c->runs), PRE + 2 * N);
  cr_assert_eq(tko_pool_destroy(pool), 0);
  cr_assert_eq(atomic_load(&c->bad), 0);
  free(t);
  bctx_free(c);
}

Test(batch, bounded_reject_is_all_or_nothing) {
  enum { CAP = 8 };
  bctx *c = bctx_new(32);
  tko_pool *pool = make_pool(c, 1, CAP, TKO_FULL_REJECT);
  tko_task *t = tasks_new(16, 16);
  cr_assert_eq(tko_pool_pause(pool), 0);
  for (size_t i = 0; i < 5; i++)
    cr_assert_eq(tko_submit(pool, task_fn, arg_of(i), 0), 0);
  cr_assert_eq(tko_submit_batch(pool, t, 4), -EAGAIN, "4 do not fit in 3");
  cr_assert_eq(tko_submit_batch(pool, t, CAP + 1), -EAGAIN, "more than the capacity");
  tko_stats s;
  tko_pool_stats(pool, &s);
  cr_assert_eq(s.submitted, 5);
  cr_assert_eq(s.queued, 5);
  cr_assert_eq(tko_submit_batch(pool, t + 8, 3), 0, "3 fit exactly");
  tko_pool_stats(pool, &s);
  cr_assert_eq(s.queued, CAP);
  cr_assert_eq(tko_submit_batch(pool, t, 1), -EAGAIN);
  cr_assert_eq(tko_pool_resume(pool), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  cr_assert_eq(tt_count_get(&c->runs), CAP);
  for (size_t i = 16; i < 24; i++)
    cr_assert_eq(atomic_load(&c->ran[i]), 0, "refused, yet ran");
  for (size_t i = 24; i < 27; i++)
    cr_assert_eq(atomic_load(&c->ran[i]), 1);
  cr_assert_eq(tko_pool_destroy(pool), 0);
  cr_assert_eq(atomic_load(&c->bad), 0);
  free(t);
  bctx_free(c);
}

typedef struct batch_job {
  tko_pool *pool;
  const tko_task *tasks;
  size_t n;
} batch_job;

static int submit_batch_job(void *arg) {
  batch_job *j = arg;
  return tko_submit_batch(j->pool, j->tasks, j->n);
}

Test(batch, bounded_block_waits_for_room_for_all) {
  enum { CAP = 4 };
  bctx *c = bctx_new(8);
  tko_pool *pool = make_pool(c, 1, CAP, TKO_FULL_BLOCK);
  tko_task *t = tasks_new(3, 2);
  cr_assert_eq(tko_pool_pause(pool), 0);
  for (size_t i = 0; i < 2; i++)
    cr_assert_eq(tko_submit(pool, task_fn, arg_of(i), 0), 0);
  batch_job j = {pool, t, 3};
  tf_thread th;
  cr_assert_eq(tf_thread_start(&th, submit_batch_job, &j), 0);
  tf_wait_thread_sleeping(th.tid); /* best effort: it waits for room */
  cr_assert_not(tf_thread_is_done(&th), "3 more fit only after the pool moves");
  tko_stats s;
  tko_pool_stats(pool, &s);
  cr_assert_eq(s.submitted, 2, "a blocked batch queued part of itself");
  cr_assert_eq(tko_pool_resume(pool), 0);
  int rc = -1;
  cr_assert(tf_thread_join(&th, &rc));
  cr_assert_eq(rc, 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  cr_assert_eq(tt_count_get(&c->runs), 5);
  cr_assert_eq(tko_pool_destroy(pool), 0);
  cr_assert_eq(atomic_load(&c->bad), 0);
  free(t);
  bctx_free(c);
}

Test(batch, bounded_caller_runs_runs_the_batch_here) {
  enum { CAP = 4 };
  bctx *c = bctx_new(8);
  tko_pool *pool = make_pool(c, 1, CAP, TKO_FULL_CALLER_RUNS);
  tko_task *t = tasks_new(3, 2);
  cr_assert_eq(tko_pool_pause(pool), 0);
  for (size_t i = 0; i < 2; i++)
    cr_assert_eq(tko_submit(pool, task_fn, arg_of(i), 0), 0);
  cr_assert_eq(tko_submit_batch(pool, t, 3), 0);
  /* Ran before the submit returned, on this thread, in array order. */
  for (size_t i = 2; i < 5; i++) {
    cr_assert_eq(atomic_load(&c->ran[i]), 1);
    cr_assert(pthread_equal(c->thread[i], pthread_self()));
  }
  cr_assert_lt(c->order[2], c->order[3]);
  cr_assert_lt(c->order[3], c->order[4]);
  tko_stats s;
  tko_pool_stats(pool, &s);
  cr_assert_eq(s.caller_runs, 3);
  cr_assert_eq(s.queued, 2);
  cr_assert_eq(tko_pool_resume(pool), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  tko_pool_stats(pool, &s);
  cr_assert_eq(s.submitted, 5);
  cr_assert_eq(s.completed, 5);
  cr_assert_eq(tko_pool_destroy(pool), 0);
  cr_assert_eq(atomic_load(&c->bad), 0);
  free(t);
  bctx_free(c);
}

Test(batch, refused_after_shutdown) {
  bctx *c = bctx_new(4);
  tko_pool *pool = make_pool(c, 1, 0, TKO_FULL_BLOCK);
  tko_task *t = tasks_new(4, 0);
  cr_assert_eq(tko_pool_shutdown(pool, TKO_DRAIN), 0);
  cr_assert_eq(tko_submit_batch(pool, t, 4), -ESHUTDOWN);
  cr_assert_eq(tt_count_get(&c->runs), 0);
  cr_assert_eq(tt_count_get(&c->cancels), 0);
  cr_assert_eq(submitted(pool), 0);
  cr_assert_eq(tko_pool_destroy(pool), 0);
  free(t);
  bctx_free(c);
}

static void shutdown_with_batch(tko_shutdown_mode mode, size_t n) {
  bctx *c = bctx_new(n);
  tko_pool *pool = make_pool(c, 2, 0, TKO_FULL_BLOCK);
  tko_task *t = tasks_new(n, 0);
  cr_assert_eq(tko_pool_pause(pool), 0);
  cr_assert_eq(tko_submit_batch(pool, t, n), 0);
  cr_assert_eq(tko_pool_shutdown(pool, mode), 0);
  long runs = tt_count_get(&c->runs), cancels = tt_count_get(&c->cancels);
  cr_assert_eq(runs + cancels, (long)n, "a task was lost");
  for (size_t i = 0; i < n; i++)
    cr_assert_eq(atomic_load(&c->ran[i]) + atomic_load(&c->cancelled[i]), 1);
  tko_stats s;
  tko_pool_stats(pool, &s);
  if (mode == TKO_DRAIN) {
    cr_assert_eq(runs, (long)n);
  } else {
    cr_assert_eq(cancels, (long)n);
    cr_assert_eq(s.cancelled, n);
  }
  cr_assert_eq(s.completed + s.cancelled, s.submitted);
  cr_assert_eq(tko_pool_destroy(pool), 0);
  cr_assert_eq(atomic_load(&c->bad), 0);
  free(t);
  bctx_free(c);
}

Test(batch, shutdown_cancel_cancels_a_queued_batch) {
  shutdown_with_batch(TKO_CANCEL, 50);
  shutdown_with_batch(TKO_CANCEL, 3000);
}

Test(batch, shutdown_drain_runs_a_queued_batch) {
  shutdown_with_batch(TKO_DRAIN, 50);
  shutdown_with_batch(TKO_DRAIN, 3000);
}

/* Several threads submit batches at once: every id is unique, and each
 * batch's ids are consecutive. */
enum { CT_THREADS = 4, CT_BATCHES = TT_SCALE(200, 30), CT_SIZE = 16 };

typedef struct cthread {
  tko_pool *pool;
  size_t first; /* index of this thread's first task */
  int rc;
} cthread;

static void *cthread_main(void *arg) {
  cthread *ct = arg;
  tko_task t[CT_SIZE];
  for (int b = 0; b < CT_BATCHES && !ct->rc; b++) {
    for (size_t i = 0; i < CT_SIZE; i++)
      t[i] = (tko_task){task_fn, arg_of(ct->first + (size_t)b * CT_SIZE + i), (int)(i & 1)};
    ct->rc = tko_submit_batch(ct->pool, t, CT_SIZE);
  }
  return NULL;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

Test(batch, concurrent_batches_keep_ids_consecutive) {
  size_t n = (size_t)CT_THREADS * CT_BATCHES * CT_SIZE;
  bctx *c = bctx_new(n);
  tko_pool *pool = make_pool(c, 2, 0, TKO_FULL_BLOCK);
  cthread ct[CT_THREADS];
  pthread_t th[CT_THREADS];
  for (int i = 0; i < CT_THREADS; i++) {
    ct[i] = (cthread){pool, (size_t)i * CT_BATCHES * CT_SIZE, 0};
    cr_assert_eq(pthread_create(&th[i], NULL, cthread_main, &ct[i]), 0);
  }
  for (int i = 0; i < CT_THREADS; i++) {
    pthread_join(th[i], NULL);
    cr_assert_eq(ct[i].rc, 0);
  }
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  uint64_t *ids = calloc(n, sizeof *ids);
  for (size_t i = 0; i < n; i++) {
    cr_assert_eq(atomic_load(&c->ran[i]), 1);
    uint64_t id = ids[i] = atomic_load(&c->id[i]);
    cr_assert(id >= 1);
    /* Consecutive inside a batch; increasing over one thread's batches. */
    if (i % CT_SIZE) cr_assert_eq(id, atomic_load(&c->id[i - 1]) + 1);
    else if (i % (CT_BATCHES * CT_SIZE)) cr_assert_gt(id, atomic_load(&c->id[i - 1]));
  }
  qsort(ids, n, sizeof *ids, cmp_u64);
  for (size_t i = 1; i < n; i++)
    cr_assert_neq(ids[i], ids[i - 1], "id %llu given twice", (unsigned long long)ids[i]);
  free(ids);
  cr_assert_eq(tko_pool_destroy(pool), 0);
  cr_assert_eq(atomic_load(&c->bad), 0);
  bctx_free(c);
}

/* With TKO_FULL_CALLER_RUNS a batch larger than queue_capacity can never be
 * queued, but it can run on the caller like any batch that finds no room;
 * the header gives -EAGAIN for the reject policy only. The core refuses it
 * with -EAGAIN whatever the policy. */
Test(batch, regression_caller_runs_batch_over_capacity) {
  enum { CAP = 2 };
  bctx *c = bctx_new(8);
  tko_pool *pool = make_pool(c, 1, CAP, TKO_FULL_CALLER_RUNS);
  tko_task *t = tasks_new(3, 0);
  cr_assert_eq(tko_submit_batch(pool, t, 3), 0, "caller-runs refused a batch over capacity");
  cr_assert_eq(tt_count_get(&c->runs), 3);
  cr_assert_eq(tko_pool_destroy(pool), 0);
  free(t);
  bctx_free(c);
}
