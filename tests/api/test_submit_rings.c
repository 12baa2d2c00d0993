/* SPDX-License-Identifier: MIT */
/* Submitting from many threads into a pool of several workers (issue 15:
 * each submitting thread has a submit ring of its own). The public
 * contract checked here: one thread's equal-weight tasks are taken in
 * submit order (and so start in it on one free worker), however they went in (singles, batches, a batch larger than any
 * ring, a ring filled while the pool is paused); every accepted task runs
 * exactly once; ids are unique, increase per thread and are consecutive in
 * a batch; more threads than a pool has rings, threads that end and new
 * ones that start, and a thread that alternates between pools all keep
 * these. The order is made observable by holding every worker, then
 * letting one go. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "taskorch.h"
#include "tko_test.h"
#include "tko_test_sync.h"

typedef struct slot {
  atomic_int runs;
  atomic_long rank; /* when it started, among all tasks of the test */
  _Atomic uint64_t id;
} slot;

typedef struct order_ctx {
  slot *slots;
  long n;
  atomic_long next_rank;
  tt_count ran;
} order_ctx;

static order_ctx *cur;

static int ranked_fn(void *arg) {
  slot *s = arg;
  atomic_store(&s->rank, atomic_fetch_add(&cur->next_rank, 1));
  atomic_fetch_add(&s->runs, 1);
  tt_count_add(&cur->ran, 1);
  return 0;
}

static void record_id(void *user, const tko_task_info *t) {
  (void)user;
  if (t->fn == ranked_fn) atomic_store(&((slot *)t->arg)->id, t->id);
}

static order_ctx *ctx_new(long n) {
  order_ctx *c = calloc(1, sizeof *c);
  c->slots = calloc((size_t)n, sizeof *c->slots);
  c->n = n;
  tt_count_init(&c->ran);
  cur = c;
  return c;
}

static void ctx_free(order_ctx *c) {
  cur = NULL;
  tt_count_fini(&c->ran);
  free(c->slots);
  free(c);
}

/* A pool of `workers`, every one held by a pinned task: nothing is taken
 * while the test submits, so each thread's ring fills and is moved along
 * by its submitter. free_one then lets one worker go, which runs every
 * other task, one at a time, in queue order; free_the_rest once they ran. */
static tko_pool *busy_pool(unsigned workers, tt_pin *pins) {
  tko_options o = tko_basic_options(workers);
  o.hooks.before_run = record_id;
  tko_pool *pool;
  cr_assert_eq(tko_pool_create(&pool, &o), 0);
  for (unsigned i = 0; i < workers; i++) {
    cr_assert_eq(tko_submit(pool, tt_pin_fn, &pins[i], 0), 0);
    cr_assert(tt_count_wait_geq(&pins[i].started, 1));
  }
  return pool;
}

static void free_one(tt_pin *pins) {
  tt_gate_open(&pins[0].gate);
}

static void free_the_rest(order_ctx *c, tt_pin *pins, unsigned workers) {
  cr_assert(tt_count_wait_geq(&c->ran, c->n)); /* on the one free worker */
  for (unsigned i = 1; i < workers; i++)
    tt_gate_open(&pins[i].gate);
}

typedef struct range {
  long begin, end;
} range;

/* Every task ran once, in submit order, with increasing ids; inside each
 * batch's range, consecutive ids. */
static void check_fifo_and_ids(order_ctx *c, const range *batches, size_t nbatch) {
  for (long i = 0; i < c->n; i++) {
    cr_assert_eq(atomic_load(&c->slots[i].runs), 1, "task %ld", i);
    cr_assert_eq(atomic_load(&c->slots[i].rank), i, "task %ld started out of submit order", i);
    if (i) cr_assert_gt(atomic_load(&c->slots[i].id), atomic_load(&c->slots[i - 1].id));
  }
  for (size_t b = 0; b < nbatch; b++)
    for (long i = batches[b].begin + 1; i < batches[b].end; i++)
      cr_assert_eq(atomic_load(&c->slots[i].id), atomic_load(&c->slots[i - 1].id) + 1);
}

/* Singles, more singles than a ring segment holds, a batch larger than a
 * segment, and a small batch, while every worker is busy (the ring grows
 * by segments; its submitter waits a moment for room at each, in vain,
 * and must go on: mutant ring-full-waits-for-ever): one thread's tasks
 * stay FIFO. A segment must follow the last at its position
 * (ring-segment-base-off-by-one), a spare must not be handed out twice
 * (ring-spare-kept-after-its-take), and a drain must give positions back
 * (ring-head-not-released). */
Test(submit_rings, one_threads_tasks_start_in_submit_order) {
  enum { SINGLES = 3000, BIG = 2500, SMALL = 7, N = SINGLES + BIG + SMALL };
  order_ctx *c = ctx_new(N);
  tt_pin pins[2] = {TT_PIN_INIT, TT_PIN_INIT};
  tko_pool *pool = busy_pool(2, pins);
  long at = 0;
  for (; at < SINGLES; at++)
    cr_assert_eq(tko_submit(pool, ranked_fn, &c->slots[at], 0), 0);
  range batches[2];
  tko_task *batch = calloc(BIG, sizeof *batch);
  for (long i = 0; i < BIG; i++)
    batch[i] = (tko_task){ranked_fn, &c->slots[at + i], 0};
  cr_assert_eq(tko_submit_batch(pool, batch, BIG), 0);
  batches[0] = (range){at, at + BIG};
  at += BIG;
  for (long i = 0; i < SMALL; i++)
    batch[i] = (tko_task){ranked_fn, &c->slots[at + i], 0};
  cr_assert_eq(tko_submit_batch(pool, batch, SMALL), 0);
  batches[1] = (range){at, at + SMALL};
  at += SMALL;
  cr_assert_eq(at, N);
  free_one(pins);
  free_the_rest(c, pins, 2);
  cr_assert_eq(tko_pool_wait_idle(pool, TT_LONG_MS), 0);
  check_fifo_and_ids(c, batches, 2);
  cr_assert_eq(tko_pool_destroy(pool), 0);
  free(batch);
  ctx_free(c);
}

/* Each of T threads submits PER tasks (singles and a batch in turn) to a
 * pool whose workers are all busy but one; more threads than a pool has
 * rings (64), so the last ones share the pool's inbox, and a second wave
 * of threads starts after the first ended. Every task runs once, each
 * thread's tasks in its submit order, ids unique and increasing per
 * thread. */
typedef struct wave_thread {
  tko_pool *pool;
  slot *slots; /* PER of its own */
  long per;
  int rc;
  tt_gate *start;
} wave_thread;

static void *wave_main(void *arg) {
  wave_thread *t = arg;
  tt_gate_wait(t->start);
  for (long i = 0; i < t->per && t->rc == 0;) {
    if (i % 3 == 2 && i + 4 <= t->per) {
      tko_task b[4];
      for (int k = 0; k < 4; k++)
        b[k] = (tko_task){ranked_fn, &t->slots[i + k], 0};
      t->rc = tko_submit_batch(t->pool, b, 4);
      i += 4;
    } else {
      t->rc = tko_submit(t->pool, ranked_fn, &t->slots[i], 0);
      i++;
    }
  }
  return NULL;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

Test(submit_rings, more_threads_than_rings_in_two_waves) {
  enum { T = 80, PER = 60, WAVES = 2, N = WAVES * T * PER };
  order_ctx *c = ctx_new(N);
  tt_pin pins[3] = {TT_PIN_INIT, TT_PIN_INIT, TT_PIN_INIT};
  tko_pool *pool = busy_pool(3, pins); /* all of both waves queued before any runs */
  for (int w = 0; w < WAVES; w++) {
    tt_gate start = TT_GATE_INIT;
    pthread_t th[T];
    wave_thread wt[T];
    for (int i = 0; i < T; i++) {
      wt[i] = (wave_thread){pool, &c->slots[(long)(w * T + i) * PER], PER, 0, &start};
      cr_assert_eq(pthread_create(&th[i], NULL, wave_main, &wt[i]), 0);
    }
    tt_gate_open(&start);
    for (int i = 0; i < T; i++) {
      pthread_join(th[i], NULL);
      cr_assert_eq(wt[i].rc, 0);
    }
  }
  free_one(pins);
  free_the_rest(c, pins, 3);
  cr_assert_eq(tko_pool_wait_idle(pool, TT_LONG_MS), 0);
  uint64_t *ids = malloc(N * sizeof *ids);
  for (long th = 0; th < WAVES * T; th++)
    for (long i = th * PER; i < (th + 1) * PER; i++) {
      cr_assert_eq(atomic_load(&c->slots[i].runs), 1, "task %ld", i);
      ids[i] = atomic_load(&c->slots[i].id);
      if (i > th * PER) {
        cr_assert_gt(atomic_load(&c->slots[i].rank), atomic_load(&c->slots[i - 1].rank),
                     "thread %ld: task %ld started before its predecessor", th, i);
        cr_assert_gt(ids[i], ids[i - 1]);
      }
    }
  qsort(ids, N, sizeof *ids, cmp_u64);
  for (long i = 1; i < N; i++)
    cr_assert_neq(ids[i], ids[i - 1], "an id given twice");
  free(ids);
  tko_stats st;
  tko_pool_stats(pool, &st);
  cr_assert_eq(st.submitted, (uint64_t)N + 3);
  cr_assert_eq(st.completed, (uint64_t)N + 3);
  cr_assert_eq(tko_pool_destroy(pool), 0);
  ctx_free(c);
}

/* One thread alternates between two pools, and pools made and destroyed
 * one after another (which may reuse an address): every task runs once
 * on the pool it went to, in order per pool. */
static int count_fn(void *arg) {
  atomic_fetch_add((atomic_long *)arg, 1);
  return 0;
}

Test(submit_rings, one_thread_alternates_between_pools) {
  enum { ROUNDS = 40, PER = 300 };
  for (int r = 0; r < ROUNDS; r++) {
    tko_pool *a, *b;
    tko_options o = tko_basic_options(2);
    cr_assert_eq(tko_pool_create(&a, &o), 0);
    cr_assert_eq(tko_pool_create(&b, &o), 0);
    atomic_long ran_a = 0, ran_b = 0;
    for (int i = 0; i < PER; i++) {
      cr_assert_eq(tko_submit(a, count_fn, &ran_a, 0), 0);
      cr_assert_eq(tko_submit(b, count_fn, &ran_b, 0), 0);
    }
    cr_assert_eq(tko_pool_wait_idle(a, TT_LONG_MS), 0);
    cr_assert_eq(tko_pool_wait_idle(b, TT_LONG_MS), 0);
    cr_assert_eq(atomic_load(&ran_a), PER);
    cr_assert_eq(atomic_load(&ran_b), PER);
    tko_stats sa, sb;
    tko_pool_stats(a, &sa);
    tko_pool_stats(b, &sb);
    cr_assert_eq(sa.submitted, PER);
    cr_assert_eq(sb.submitted, PER);
    /* Destroyed in turn: the next round's pools may take these addresses. */
    cr_assert_eq(tko_pool_destroy(r % 2 ? a : b), 0);
    cr_assert_eq(tko_pool_destroy(r % 2 ? b : a), 0);
  }
}

/* After shutdown every thread's ring is closed: singles and batches of any
 * size are refused with -ESHUTDOWN and nothing is counted. */
Test(submit_rings, closed_rings_refuse_every_path) {
  tko_pool *pool;
  tko_options o = tko_basic_options(2);
  cr_assert_eq(tko_pool_create(&pool, &o), 0);
  atomic_long ran = 0;
  cr_assert_eq(tko_submit(pool, count_fn, &ran, 0), 0); /* claims this thread's ring */
  cr_assert_eq(tko_pool_shutdown(pool, TKO_DRAIN), 0);
  enum { BIG = 3000 };
  tko_task *t = calloc(BIG, sizeof *t);
  for (int i = 0; i < BIG; i++)
    t[i] = (tko_task){count_fn, &ran, 0};
  cr_assert_eq(tko_submit(pool, count_fn, &ran, 0), -ESHUTDOWN);
  cr_assert_eq(tko_submit_batch(pool, t, 5), -ESHUTDOWN);
  cr_assert_eq(tko_submit_batch(pool, t, BIG), -ESHUTDOWN);
  tko_stats st;
  tko_pool_stats(pool, &st);
  cr_assert_eq(st.submitted, 1);
  cr_assert_eq(atomic_load(&ran), 1);
  cr_assert_eq(tko_pool_destroy(pool), 0);
  free(t);
}

/* An allocator that hands a freed block back to the next request of the
 * same size (most recent first), so that a new pool takes a destroyed
 * one's address for sure. */
typedef struct recycler {
  pthread_mutex_t mu;
  struct block *free;
} recycler;

typedef struct block {
  struct block *next;
  size_t size;
  _Alignas(64) unsigned char data[];
} block;

static void *rc_alloc(void *ctx, size_t size) {
  recycler *r = ctx;
  pthread_mutex_lock(&r->mu);
  for (block **p = &r->free; *p; p = &(*p)->next)
    if ((*p)->size == size) {
      block *b = *p;
      *p = b->next;
      pthread_mutex_unlock(&r->mu);
      return b->data;
    }
  pthread_mutex_unlock(&r->mu);
  block *b = aligned_alloc(64, (sizeof *b + size + 63) / 64 * 64);
  if (!b) return NULL;
  b->size = size;
  return b->data;
}

static void rc_free(void *ctx, void *p) {
  if (!p) return;
  recycler *r = ctx;
  block *b = (block *)((unsigned char *)p - offsetof(block, data));
  pthread_mutex_lock(&r->mu);
  b->next = r->free;
  r->free = b;
  pthread_mutex_unlock(&r->mu);
}

static void *rc_realloc(void *ctx, void *p, size_t size) {
  void *n = rc_alloc(ctx, size);
  if (n && p) {
    block *b = (block *)((unsigned char *)p - offsetof(block, data));
    memcpy(n, p, b->size < size ? b->size : size);
    rc_free(ctx, p);
  }
  return n;
}

/* A thread that submitted to a pool, which is then destroyed, submits to a
 * new pool made at the same address: its task goes to the new pool (the
 * thread's ring of the old one went with it). Mutant
 * ring-cache-ignores-the-pool-id: the task went into the old, freed ring
 * and never ran. */
Test(submit_rings, a_new_pool_at_a_destroyed_pools_address) {
  recycler r = {PTHREAD_MUTEX_INITIALIZER, NULL};
  tko_allocator al = {rc_alloc, rc_realloc, rc_free, &r};
  tko_options o = tko_basic_options(2);
  o.allocator = &al;
  void *before = NULL;
  for (int round = 0; round < 3; round++) {
    tko_pool *pool;
    cr_assert_eq(tko_pool_create(&pool, &o), 0);
    if (round) cr_assert_eq((void *)pool, before, "the allocator did not reuse the block");
    before = pool;
    atomic_long ran = 0;
    for (int i = 0; i < 100; i++)
      cr_assert_eq(tko_submit(pool, count_fn, &ran, 0), 0);
    cr_assert_eq(tko_pool_wait_idle(pool, 10000), 0, "round %d: tasks went astray", round);
    cr_assert_eq(atomic_load(&ran), 100);
    cr_assert_eq(tko_pool_destroy(pool), 0);
  }
  while (r.free) {
    block *b = r.free;
    r.free = b->next;
    free(b);
  }
}

/* Four interleaved weights from one thread, more than several rings' worth,
 * while every worker is busy: the ring's full moves group the tasks by
 * weight (queue.h: tko__grouping) once a move looked mixed. The one free
 * worker then starts them by weight, heaviest first, and in submit order
 * within each weight (mutant grouping-not-fifo). */
Test(submit_rings, interleaved_weights_keep_weight_then_submit_order) {
  enum { N = 5000, WEIGHTS = 4 };
  order_ctx *c = ctx_new(N);
  tt_pin pins[2] = {TT_PIN_INIT, TT_PIN_INIT};
  tko_pool *pool = busy_pool(2, pins);
  for (long i = 0; i < N; i++)
    cr_assert_eq(tko_submit(pool, ranked_fn, &c->slots[i], (int)(i % WEIGHTS)), 0);
  free_one(pins);
  free_the_rest(c, pins, 2);
  cr_assert_eq(tko_pool_wait_idle(pool, TT_LONG_MS), 0);
  /* Task i has weight i % 4: heaviest first, then by index. */
  for (long i = 0; i < N; i++) {
    long w = i % WEIGHTS, before = 0;
    for (long v = WEIGHTS - 1; v > w; v--) before += (N - v + WEIGHTS - 1) / WEIGHTS;
    long want = before + i / WEIGHTS;
    cr_assert_eq(atomic_load(&c->slots[i].runs), 1, "task %ld", i);
    cr_assert_eq(atomic_load(&c->slots[i].rank), want, "task %ld (weight %ld) started at %ld, not %ld",
                 i, w, atomic_load(&c->slots[i].rank), want);
  }
  cr_assert_eq(tko_pool_destroy(pool), 0);
  ctx_free(c);
}

/* With several workers free, one thread's tasks may start out of submit
 * order across workers (one worker's batch of longer tasks lets another
 * start later ones: the attack on order saw milliseconds), but each worker
 * starts the tasks it took in the order it took them, and they are taken
 * in submit order: every worker's starts of this thread's tasks increase. */
enum { ORDER_WORKERS = 3, ORDER_TASKS = 20000 };
static long *order_log[ORDER_WORKERS];
static size_t order_len[ORDER_WORKERS]; /* each written by its worker only */
static atomic_int order_bad_worker;

static void log_start(void *user, const tko_task_info *t) {
  (void)user;
  if (t->worker >= ORDER_WORKERS) {
    atomic_store(&order_bad_worker, 1);
    return;
  }
  order_log[t->worker][order_len[t->worker]++] = (long)(intptr_t)t->arg;
}

static int mixed_length_fn(void *arg) {
  if ((intptr_t)arg / 64 % 2) tt_spin_ns(2000); /* batches of short and of longer tasks */
  return 0;
}

Test(submit_rings, each_worker_starts_a_threads_tasks_in_submit_order) {
  tko_options o = tko_basic_options(ORDER_WORKERS);
  o.hooks.before_run = log_start;
  tko_pool *pool;
  cr_assert_eq(tko_pool_create(&pool, &o), 0);
  atomic_store(&order_bad_worker, 0);
  for (int w = 0; w < ORDER_WORKERS; w++) {
    order_log[w] = calloc(ORDER_TASKS, sizeof *order_log[w]);
    order_len[w] = 0;
  }
  long n = TT_SCALE(ORDER_TASKS, ORDER_TASKS / 4);
  for (long i = 0; i < n; i++)
    cr_assert_eq(tko_submit(pool, mixed_length_fn, (void *)(intptr_t)i, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, TT_LONG_MS), 0);
  cr_assert_eq(tko_pool_destroy(pool), 0); /* every worker joined: their logs are ours */
  cr_assert_eq(atomic_load(&order_bad_worker), 0);
  size_t total = 0;
  for (int w = 0; w < ORDER_WORKERS; w++) {
    for (size_t i = 1; i < order_len[w]; i++)
      cr_assert_gt(order_log[w][i], order_log[w][i - 1], "worker %d started task %ld after %ld", w,
                   order_log[w][i], order_log[w][i - 1]);
    total += order_len[w];
    free(order_log[w]);
  }
  cr_assert_eq(total, (size_t)n);
}
