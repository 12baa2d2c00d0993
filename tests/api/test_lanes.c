/* SPDX-License-Identifier: MIT */
/* Tests for keyed serial lanes: per-key FIFO order and mutual exclusion
 * under 8 submitting threads (also across keys that share a lane), no task
 * lost or run twice, parallelism across lanes, the weight rule, max_drain
 * and the batch callback, the per-lane limit, every cancel path (lanes
 * cancel, a pool TKO_CANCEL shutdown with and without forwarding), a pool
 * DRAIN shutdown with runners in flight, a caller-runs bounded pool,
 * -EDEADLK / -ETIMEDOUT from wait_idle, a cancel that splits each key
 * into a run prefix and a cancelled rest. Tasks never assert themselves: they
 * count violations in atomics that the test thread checks. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <taskorch.h>
#include <taskorch/lanes.h>

#include "tko_test.h"
#include "tko_test_feature.h"
#include "tko_test_sync.h"

static tko_pool *make_pool(unsigned workers) {
  tko_pool *p = NULL;
  tko_options o = tko_basic_options(workers);
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  return p;
}

/* Pins workers with tasks that block until released, so that what is
 * submitted meanwhile stays queued. (Used instead of tko_pool_pause, whose
 * promise these tests need not depend on.) Pins are submitted one at a
 * time, each after the previous started, so each lands on its own worker. */
typedef struct pin {
  tt_count started, released;
} pin;

static int pin_task(void *arg) {
  pin *g = arg;
  tt_count_add(&g->started, 1);
  tt_count_wait_geq(&g->released, 1);
  return 0;
}

static void pin_workers(tko_pool *p, pin *g, int n) {
  tt_count_init(&g->started);
  tt_count_init(&g->released);
  for (int i = 1; i <= n; i++) {
    cr_assert_eq(tko_submit(p, pin_task, g, 0), 0);
    cr_assert(tt_count_wait_geq(&g->started, i));
  }
}

static void unpin(pin *g) {
  tt_count_add(&g->released, 1);
}

/* Call once the pool is idle or destroyed. */
static void pin_fini(pin *g) {
  tt_count_fini(&g->started);
  tt_count_fini(&g->released);
}

static int count_fn(void *arg) {
  atomic_fetch_add_explicit((atomic_long *)arg, 1, memory_order_relaxed);
  return 0;
}

/* Two keys on different lanes of l. */
static void two_lanes(tko_lanes *l, uint64_t *a, uint64_t *b) {
  *a = 1;
  *b = 2;
  while (tko_lanes_index(l, *b) == tko_lanes_index(l, *a))
    (*b)++;
}

Test(lanes, invalid_arguments) {
  tko_pool *p = make_pool(1);
  tko_lanes *l = (tko_lanes *)&l;
  cr_assert_eq(tko_lanes_create(NULL, p, NULL), -EINVAL);
  cr_assert_eq(tko_lanes_create(&l, NULL, NULL), -EINVAL);
  cr_assert_null(l);
  tko_lane_options o = tko_lane_default_options();
  cr_assert_eq(o.lanes, 256);
  cr_assert_eq(o.max_drain, 32);
  o.lanes = TKO_MAX_LANES + 1;
  cr_assert_eq(tko_lanes_create(&l, p, &o), -EINVAL);
  o = tko_lane_default_options();
  o.max_drain = TKO_MAX_LANE_DRAIN + 1;
  cr_assert_eq(tko_lanes_create(&l, p, &o), -EINVAL);
  o = tko_lane_default_options();
  o.lanes = 5; /* rounded up to 8 */
  cr_assert_eq(tko_lanes_create(&l, p, &o), 0);
  for (uint64_t k = 0; k < 1000; k++)
    cr_assert_lt(tko_lanes_index(l, k), 8);
  cr_assert_eq(tko_lanes_submit(NULL, 1, count_fn, NULL, 0), -EINVAL);
  cr_assert_eq(tko_lanes_submit(l, 1, NULL, NULL, 0), -EINVAL); /* no batch callback */
  cr_assert_eq(tko_lanes_wait_idle(NULL, 0), -EINVAL);
  cr_assert_eq(tko_lanes_wait_idle(l, -2), -EINVAL);
  cr_assert_eq(tko_lanes_wait_idle(l, 0), 0);
  cr_assert_eq(tko_lanes_close(NULL), -EINVAL);
  cr_assert_eq(tko_lanes_cancel(NULL), -EINVAL);
  cr_assert_eq(tko_lanes_destroy(NULL), -EINVAL);
  cr_assert_eq(tko_lanes_pool_cancelled(NULL), 0);
  tko_task_info other = {.fn = count_fn};
  cr_assert_eq(tko_lanes_pool_cancelled(&other), 0);
  tko_lane_stats st;
  tko_lanes_stats(l, &st);
  cr_assert_eq(st.submitted, 0);
  cr_assert_eq(st.lanes_used, 0);
  tko_lanes_stats(NULL, &st);
  tko_lanes_stats(l, NULL);
  /* Closed: submits fail, nothing queued. */
  cr_assert_eq(tko_lanes_close(l), 0);
  cr_assert_eq(tko_lanes_close(l), 0);
  atomic_long n = 0;
  cr_assert_eq(tko_lanes_submit(l, 1, count_fn, &n, 0), -ESHUTDOWN);
  cr_assert_eq(tko_lanes_destroy(l), 0);
  tko_pool_destroy(p);
}

/* ---- order and exclusion under 8 submitting threads ---------------------- */

#define OX_THREADS 8
#define OX_KEYS 64

typedef struct ox_item {
  struct ox_ctx *ctx;
  unsigned thread, key;
  long seq; /* per (thread, key), from 0 */
  atomic_int runs;
} ox_item;

typedef struct ox_ctx {
  tko_lanes *lanes;
  ox_item *items; /* OX_THREADS * per_thread */
  long per_thread;
  atomic_long next[OX_THREADS][OX_KEYS]; /* next seq expected per (thread, key) */
  atomic_int in_key[OX_KEYS];            /* a task of this key is running */
  atomic_int in_lane[16];                /* a task of this lane is running */
  atomic_long order_violations, key_overlaps, lane_overlaps, ran;
} ox_ctx;

static int ox_task(void *arg) {
  ox_item *it = arg;
  ox_ctx *c = it->ctx;
  unsigned lane = tko_lanes_index(c->lanes, it->key);
  if (atomic_exchange(&c->in_key[it->key], 1)) atomic_fetch_add(&c->key_overlaps, 1);
  if (atomic_exchange(&c->in_lane[lane], 1)) atomic_fetch_add(&c->lane_overlaps, 1);
  /* Relaxed is enough if the lanes keep their promise (each task of a key
   * happens-before the next); a broken promise shows up as a wrong seq,
   * and under TSan as a race on the plain reads below. */
  long want = atomic_load_explicit(&c->next[it->thread][it->key], memory_order_relaxed);
  if (want != it->seq) atomic_fetch_add(&c->order_violations, 1);
  atomic_store_explicit(&c->next[it->thread][it->key], it->seq + 1, memory_order_relaxed);
  atomic_fetch_add(&it->runs, 1);
  atomic_fetch_add(&c->ran, 1);
  atomic_store(&c->in_lane[lane], 0);
  atomic_store(&c->in_key[it->key], 0);
  return 0;
}

typedef struct ox_thread {
  ox_ctx *c;
  unsigned t;
  atomic_long rejected;
} ox_thread;

static void *ox_submitter(void *arg) {
  ox_thread *th = arg;
  ox_ctx *c = th->c;
  long seq[OX_KEYS] = {0};
  for (long i = 0; i < c->per_thread; i++) {
    ox_item *it = &c->items[th->t * c->per_thread + i];
    unsigned key = (unsigned)((i * 7 + th->t * 3) % OX_KEYS);
    it->ctx = c;
    it->thread = th->t;
    it->key = key;
    it->seq = seq[key]++;
    atomic_init(&it->runs, 0);
    if (tko_lanes_submit(c->lanes, key, ox_task, it, (int)(i % 5) - 2))
      atomic_fetch_add(&th->rejected, 1);
  }
  return NULL;
}

Test(lanes, fifo_and_exclusion_under_8_submitters) {
  tko_pool *p = make_pool(4);
  ox_ctx *c = calloc(1, sizeof *c);
  c->per_thread = TT_SCALE(5000, 800);
  c->items = calloc((size_t)OX_THREADS * (size_t)c->per_thread, sizeof *c->items);
  tko_lane_options o = tko_lane_default_options();
  o.lanes = 16; /* 64 keys on 16 lanes: every lane is shared by 4 keys */
  o.max_drain = 8;
  o.lane_capacity = 2; /* make the rings grow while in use */
  cr_assert_eq(tko_lanes_create(&c->lanes, p, &o), 0);
  pthread_t th[OX_THREADS];
  ox_thread args[OX_THREADS];
  for (unsigned t = 0; t < OX_THREADS; t++) {
    args[t].c = c;
    args[t].t = t;
    atomic_init(&args[t].rejected, 0);
    cr_assert_eq(pthread_create(&th[t], NULL, ox_submitter, &args[t]), 0);
  }
  for (unsigned t = 0; t < OX_THREADS; t++) {
    pthread_join(th[t], NULL);
    cr_assert_eq(atomic_load(&args[t].rejected), 0);
  }
  cr_assert_eq(tko_lanes_wait_idle(c->lanes, TT_LONG_MS), 0);
  long total = OX_THREADS * c->per_thread;
  cr_assert_eq(atomic_load(&c->ran), total);
  cr_assert_eq(atomic_load(&c->order_violations), 0);
  cr_assert_eq(atomic_load(&c->key_overlaps), 0);
  cr_assert_eq(atomic_load(&c->lane_overlaps), 0);
  for (long i = 0; i < total; i++)
    cr_assert_eq(atomic_load(&c->items[i].runs), 1);
  tko_lane_stats st;
  tko_lanes_stats(c->lanes, &st);
  cr_assert_eq(st.submitted, (uint64_t)total);
  cr_assert_eq(st.completed, (uint64_t)total);
  cr_assert_eq(st.cancelled, 0);
  cr_assert_eq(st.queued, 0);
  cr_assert_leq(st.max_batch, 8);
  cr_assert_geq(st.visits * 8, (uint64_t)total);
  unsigned used = 0, seen[16] = {0};
  for (unsigned k = 0; k < OX_KEYS; k++)
    if (!seen[tko_lanes_index(c->lanes, k)]++) used++;
  cr_assert_eq(st.lanes_used, used);
  cr_assert_eq(tko_lanes_destroy(c->lanes), 0);
  tko_pool_destroy(p);
  free(c->items);
  free(c);
}

/* ---- parallelism across lanes; serialization across a shared lane -------- */

typedef struct meet {
  tt_count a_in, b_in;
  atomic_int a_saw_b, b_saw_a;
} meet;

static int meet_a(void *arg) {
  meet *m = arg;
  tt_count_add(&m->a_in, 1);
  atomic_store(&m->a_saw_b, tt_count_wait_geq(&m->b_in, 1));
  return 0;
}

static int meet_b(void *arg) {
  meet *m = arg;
  tt_count_add(&m->b_in, 1);
  atomic_store(&m->b_saw_a, tt_count_wait_geq(&m->a_in, 1));
  return 0;
}

Test(lanes, different_lanes_run_in_parallel) {
  tko_pool *p = make_pool(2);
  tko_lanes *l;
  cr_assert_eq(tko_lanes_create(&l, p, NULL), 0);
  uint64_t ka, kb;
  two_lanes(l, &ka, &kb);
  meet m;
  tt_count_init(&m.a_in);
  tt_count_init(&m.b_in);
  atomic_init(&m.a_saw_b, 0);
  atomic_init(&m.b_saw_a, 0);
  /* Each task waits until the other has started: both finish only if the
   * two lanes run at the same time. */
  cr_assert_eq(tko_lanes_submit(l, ka, meet_a, &m, 0), 0);
  cr_assert_eq(tko_lanes_submit(l, kb, meet_b, &m, 0), 0);
  cr_assert_eq(tko_lanes_wait_idle(l, -1), 0);
  cr_assert(atomic_load(&m.a_saw_b));
  cr_assert(atomic_load(&m.b_saw_a));
  cr_assert_eq(tko_lanes_destroy(l), 0);
  tko_pool_destroy(p);
  tt_count_fini(&m.a_in);
  tt_count_fini(&m.b_in);
}

typedef struct serial_ctx {
  atomic_int inside;
  atomic_long overlaps, pos;
  int order[64];
} serial_ctx;

typedef struct serial_item {
  serial_ctx *c;
  int id;
} serial_item;

static int serial_task(void *arg) {
  serial_item *it = arg;
  if (atomic_exchange(&it->c->inside, 1)) atomic_fetch_add(&it->c->overlaps, 1);
  it->c->order[atomic_fetch_add(&it->c->pos, 1)] = it->id;
  atomic_store(&it->c->inside, 0);
  return 0;
}

Test(lanes, colliding_keys_share_a_lane_in_submit_order) {
  tko_pool *p = make_pool(2);
  tko_lane_options o = tko_lane_default_options();
  o.lanes = 1; /* every key collides */
  o.max_drain = 3;
  tko_lanes *l;
  cr_assert_eq(tko_lanes_create(&l, p, &o), 0);
  serial_ctx c;
  memset(&c, 0, sizeof c);
  serial_item items[64];
  for (int i = 0; i < 64; i++) {
    items[i] = (serial_item){.c = &c, .id = i};
    cr_assert_eq(tko_lanes_index(l, (uint64_t)i * 977), 0);
    cr_assert_eq(tko_lanes_submit(l, (uint64_t)i * 977, serial_task, &items[i], i % 4), 0);
  }
  cr_assert_eq(tko_lanes_wait_idle(l, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&c.overlaps), 0);
  cr_assert_eq(atomic_load(&c.pos), 64);
  for (int i = 0; i < 64; i++)
    cr_assert_eq(c.order[i], i);
  cr_assert_eq(tko_lanes_destroy(l), 0);
  tko_pool_destroy(p);
}

/* ---- weights ------------------------------------------------------------- */

/* order[] is atomic because p3 is a plain pool task: its write reaches
 * this thread through tko_pool_wait_idle, which is the core's promise to
 * keep, not the lanes'. */
typedef struct rec_ctx {
  atomic_int n;
  atomic_int order[16];
} rec_ctx;

typedef struct rec_item {
  rec_ctx *c;
  int tag;
} rec_item;

static int rec_task(void *arg) {
  rec_item *it = arg;
  atomic_store(&it->c->order[atomic_fetch_add(&it->c->n, 1)], it->tag);
  return 0;
}

/* One worker, pinned: lane A gets a5 then a1, lane B gets b10, and a
 * plain pool task p3 sits between. The runner of A enters the pool with a5's
 * weight; whether a1 rides along depends on max_drain. */
static void weight_case(unsigned max_drain, const int *want) {
  tko_pool *p = make_pool(1);
  tko_lane_options o = tko_lane_default_options();
  o.max_drain = max_drain;
  tko_lanes *l;
  cr_assert_eq(tko_lanes_create(&l, p, &o), 0);
  uint64_t ka, kb;
  two_lanes(l, &ka, &kb);
  rec_ctx c;
  memset(&c, 0, sizeof c);
  rec_item a5 = {&c, 5}, a1 = {&c, 1}, p3 = {&c, 3}, b10 = {&c, 10};
  pin g;
  pin_workers(p, &g, 1);
  cr_assert_eq(tko_lanes_submit(l, ka, rec_task, &a5, 5), 0);
  cr_assert_eq(tko_lanes_submit(l, ka, rec_task, &a1, 1), 0);
  cr_assert_eq(tko_submit(p, rec_task, &p3, 3), 0);
  cr_assert_eq(tko_lanes_submit(l, kb, rec_task, &b10, 10), 0);
  unpin(&g);
  cr_assert_eq(tko_lanes_wait_idle(l, TT_LONG_MS), 0);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&c.n), 4);
  for (int i = 0; i < 4; i++) {
    if (atomic_load(&c.order[i]) != want[i])
      fprintf(stderr, "max_drain %u: ran %d %d %d %d\n", max_drain, atomic_load(&c.order[0]),
              atomic_load(&c.order[1]), atomic_load(&c.order[2]), atomic_load(&c.order[3]));
    cr_assert_eq(atomic_load(&c.order[i]), want[i]);
  }
  cr_assert_eq(tko_lanes_destroy(l), 0);
  tko_pool_destroy(p);
  pin_fini(&g);
}

Test(lanes, runner_takes_the_weight_of_the_lane_head) {
  /* max_drain 1: after a5 the runner re-enters the pool with a1's weight. */
  static const int one[4] = {10, 5, 3, 1};
  weight_case(1, one);
  /* max_drain 32: a1 is drained in a5's visit, ahead of p3. */
  static const int many[4] = {10, 5, 1, 3};
  weight_case(32, many);
}

/* ---- max_drain and the batch callback ------------------------------------ */

typedef struct batch_ctx {
  atomic_long calls, tasks, bad;
  long next; /* only touched under the lane: a plain long */
  unsigned lane;
} batch_ctx;

static void batch_apply(void *user, const tko_lane_batch *b) {
  batch_ctx *c = user;
  atomic_fetch_add(&c->calls, 1);
  if (b->count != 10 || b->lane != c->lane) atomic_fetch_add(&c->bad, 1);
  for (size_t i = 0; i < b->count; i++) {
    if ((long)(uintptr_t)b->tasks[i].arg != c->next || b->tasks[i].fn != NULL ||
        b->tasks[i].key != 7 || b->tasks[i].weight != 2)
      atomic_fetch_add(&c->bad, 1);
    c->next++;
  }
  atomic_fetch_add(&c->tasks, (long)b->count);
}

Test(lanes, batch_callback_gets_max_drain_tasks_in_order) {
  tko_pool *p = make_pool(2);
  batch_ctx c;
  memset(&c, 0, sizeof c);
  tko_lane_options o = tko_lane_default_options();
  o.max_drain = 10;
  o.batch = batch_apply;
  o.user = &c;
  tko_lanes *l;
  cr_assert_eq(tko_lanes_create(&l, p, &o), 0);
  c.lane = tko_lanes_index(l, 7);
  pin g;
  pin_workers(p, &g, 2);
  for (long i = 0; i < 100; i++)
    cr_assert_eq(tko_lanes_submit(l, 7, NULL, (void *)(uintptr_t)i, 2), 0);
  tko_lane_stats st;
  tko_lanes_stats(l, &st);
  cr_assert_eq(st.queued, 100);
  cr_assert_eq(st.lanes_used, 1);
  unpin(&g);
  cr_assert_eq(tko_lanes_wait_idle(l, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&c.calls), 10);
  cr_assert_eq(atomic_load(&c.tasks), 100);
  cr_assert_eq(atomic_load(&c.bad), 0);
  tko_lanes_stats(l, &st);
  cr_assert_eq(st.visits, 10);
  cr_assert_eq(st.max_batch, 10);
  cr_assert_eq(st.completed, 100);
  cr_assert_eq(tko_lanes_destroy(l), 0);
  tko_pool_destroy(p);
  pin_fini(&g);
}

Test(lanes, max_queued_gives_eagain) {
  tko_pool *p = make_pool(1);
  tko_lane_options o = tko_lane_default_options();
  o.max_queued = 4;
  tko_lanes *l;
  cr_assert_eq(tko_lanes_create(&l, p, &o), 0);
  atomic_long n = 0;
  pin g;
  pin_workers(p, &g, 1);
  for (int i = 0; i < 4; i++)
    cr_assert_eq(tko_lanes_submit(l, 9, count_fn, &n, 0), 0);
  cr_assert_eq(tko_lanes_submit(l, 9, count_fn, &n, 0), -EAGAIN);
  uint64_t other = 10;
  while (tko_lanes_index(l, other) == tko_lanes_index(l, 9))
    other++;
  cr_assert_eq(tko_lanes_submit(l, other, count_fn, &n, 0), 0); /* another lane has room */
  unpin(&g);
  cr_assert_eq(tko_lanes_wait_idle(l, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&n), 5);
  cr_assert_eq(tko_lanes_submit(l, 9, count_fn, &n, 0), 0); /* room again */
  cr_assert_eq(tko_lanes_destroy(l), 0);                    /* drains */
  cr_assert_eq(atomic_load(&n), 6);
  tko_pool_destroy(p);
  pin_fini(&g);
}

/* ---- cancel paths --------------------------------------------------------- */

typedef struct cancel_ctx {
  atomic_long ran, cancelled, runners_forwarded, other_cancelled;
  atomic_int bad_arg;
  bool forward;
  bool unpin_on_lane_cancel; /* pool CANCEL tests: the lanes' hook releases the pins */
  pin g; /* both workers, released by the first pool on_cancel (or by hand) */
} cancel_ctx;

static int cancel_ctx_task(void *arg) {
  atomic_fetch_add(&((cancel_ctx *)arg)->ran, 1);
  return 0;
}

static void lanes_on_cancel(void *user, const tko_lane_task *t) {
  cancel_ctx *c = user;
  /* A pool shutdown waits for the pinned workers: let them go (the pool
   * cancels lane runners itself, so this is where its CANCEL shows up). */
  if (c->unpin_on_lane_cancel) unpin(&c->g);
  if (t->arg != c || t->fn != cancel_ctx_task) atomic_store(&c->bad_arg, 1);
  atomic_fetch_add(&c->cancelled, 1);
}

static void pool_on_cancel(void *user, const tko_task_info *t) {
  cancel_ctx *c = user;
  /* Shutdown waits for the pinned workers: let them go. Tasks they take
   * from now on are cancelled too (the pool checks before running). */
  unpin(&c->g);
  if (c->forward && tko_lanes_pool_cancelled(t)) {
    atomic_fetch_add(&c->runners_forwarded, 1);
    return;
  }
  atomic_fetch_add(&c->other_cancelled, 1); /* a runner the host ignores */
}

static tko_lanes *cancel_setup(tko_pool **pp, cancel_ctx *c, bool forward) {
  memset(c, 0, sizeof *c);
  c->forward = forward;
  tko_options po = tko_basic_options(2);
  po.hooks.user = c;
  po.hooks.on_cancel = pool_on_cancel;
  cr_assert_eq(tko_pool_create(pp, &po), 0);
  tko_lane_options o = tko_lane_default_options();
  o.on_cancel = lanes_on_cancel;
  o.user = c;
  tko_lanes *l;
  cr_assert_eq(tko_lanes_create(&l, *pp, &o), 0);
  pin_workers(*pp, &c->g, 2);
  /* Three keys on three lanes, ten tasks each: three runners queued. */
  uint64_t keys[3] = {1, 2, 3};
  while (tko_lanes_index(l, keys[1]) == tko_lanes_index(l, keys[0]))
    keys[1]++;
  keys[2] = keys[1] + 1;
  while (tko_lanes_index(l, keys[2]) == tko_lanes_index(l, keys[0]) ||
         tko_lanes_index(l, keys[2]) == tko_lanes_index(l, keys[1]))
    keys[2]++;
  for (int i = 0; i < 30; i++)
    cr_assert_eq(tko_lanes_submit(l, keys[i % 3], cancel_ctx_task, c, 0), 0);
  return l;
}

Test(lanes, cancel_hands_queued_tasks_to_on_cancel) {
  tko_pool *p;
  cancel_ctx c;
  tko_lanes *l = cancel_setup(&p, &c, true);
  cr_assert_eq(tko_lanes_wait_idle(l, 0), -ETIMEDOUT);
  cr_assert_eq(tko_lanes_cancel(l), 0);
  cr_assert_eq(atomic_load(&c.cancelled), 30);
  cr_assert_eq(tko_lanes_submit(l, 1, cancel_ctx_task, &c, 0), -ESHUTDOWN);
  cr_assert_eq(tko_lanes_wait_idle(l, 0), 0); /* nothing pending: all cancelled */
  unpin(&c.g);                                /* the queued runners find empty lanes */
  cr_assert_eq(tko_lanes_destroy(l), 0);
  cr_assert_eq(atomic_load(&c.ran), 0);
  cr_assert_eq(atomic_load(&c.cancelled), 30);
  cr_assert_eq(atomic_load(&c.bad_arg), 0);
  tko_pool_destroy(p);
  pin_fini(&c.g);
}

/* A pool CANCEL hands each queued lane runner to the lanes themselves: the
 * lanes' on_cancel gets every queued lane task, and the host's pool hook
 * never sees a runner (its argument is the library's, not the host's),
 * whether or not the hook would forward it with tko_lanes_pool_cancelled. */
static void check_pool_cancel(bool forward) {
  tko_pool *p;
  cancel_ctx c;
  tko_lanes *l = cancel_setup(&p, &c, forward);
  c.unpin_on_lane_cancel = true;
  cr_assert_eq(tko_pool_shutdown(p, TKO_CANCEL), 0);
  cr_assert_eq(atomic_load(&c.runners_forwarded), 0);
  cr_assert_eq(atomic_load(&c.other_cancelled), 0);
  cr_assert_eq(atomic_load(&c.cancelled), 30);
  cr_assert_eq(tko_lanes_wait_idle(l, 0), 0);
  tko_lane_stats st;
  tko_lanes_stats(l, &st);
  cr_assert_eq(st.cancelled, 30);
  cr_assert_eq(st.queued, 0);
  /* The pool refuses runners now: submits fail and queue nothing. */
  cr_assert_eq(tko_lanes_submit(l, 1, cancel_ctx_task, &c, 0), -ESHUTDOWN);
  cr_assert_eq(tko_lanes_destroy(l), 0);
  cr_assert_eq(atomic_load(&c.ran), 0);
  cr_assert_eq(atomic_load(&c.cancelled), 30);
  cr_assert_eq(atomic_load(&c.bad_arg), 0);
  tko_pool_destroy(p);
  pin_fini(&c.g);
}

Test(lanes, pool_cancel_cancels_lane_tasks_not_the_host_hook) { check_pool_cancel(true); }

Test(lanes, pool_cancel_needs_no_forwarding_hook) { check_pool_cancel(false); }

Test(lanes, pool_drain_shutdown_runs_every_lane_task) {
  tko_pool *p = make_pool(2);
  tko_lane_options o = tko_lane_default_options();
  o.max_drain = 1; /* a resubmission per task: many refused during shutdown */
  tko_lanes *l;
  cr_assert_eq(tko_lanes_create(&l, p, &o), 0);
  atomic_long n = 0;
  long total = TT_SCALE(20000, 2000);
  for (long i = 0; i < total; i++)
    cr_assert_eq(tko_lanes_submit(l, (uint64_t)(i % 4), count_fn, &n, 0), 0);
  cr_assert_eq(tko_pool_shutdown(p, TKO_DRAIN), 0);
  cr_assert_eq(atomic_load(&n), total);
  cr_assert_eq(tko_lanes_wait_idle(l, 0), 0);
  cr_assert_eq(tko_lanes_submit(l, 1, count_fn, &n, 0), -ESHUTDOWN);
  cr_assert_eq(tko_lanes_destroy(l), 0);
  tko_pool_destroy(p);
}

/* ---- destroy drains; a caller-runs pool; deadlock and timeout ------------ */

Test(lanes, destroy_drains_queued_tasks) {
  tko_pool *p = make_pool(2);
  tko_lanes *l;
  cr_assert_eq(tko_lanes_create(&l, p, NULL), 0);
  atomic_long n = 0;
  for (int i = 0; i < 5000; i++)
    cr_assert_eq(tko_lanes_submit(l, (uint64_t)(i % 50), count_fn, &n, 0), 0);
  cr_assert_eq(tko_lanes_destroy(l), 0);
  cr_assert_eq(atomic_load(&n), 5000);
  tko_pool_destroy(p);
}

/* A runner still running when destroy comes finishes its lane on its
 * worker, and destroy waits for it: destroy returns after the lane's held
 * task and the task queued behind it have run. */
typedef struct running_destroy {
  tko_lanes *l;
  atomic_long *ran;
  atomic_int tid;
  long ran_at_return;
  int rc;
} running_destroy;

static void *destroy_thread(void *arg) {
  running_destroy *d = arg;
  atomic_store(&d->tid, (int)syscall(SYS_gettid));
  d->rc = tko_lanes_destroy(d->l);
  d->ran_at_return = atomic_load(d->ran);
  return NULL;
}

/* Whether thread tid of this process is asleep (state S in its stat). */
static bool thread_asleep(int tid) { return tf_thread_state((pid_t)tid) == 'S'; }

Test(lanes, destroy_waits_for_a_runner_that_is_running) {
  tko_pool *p = make_pool(2);
  tko_lanes *l;
  cr_assert_eq(tko_lanes_create(&l, p, NULL), 0);
  pin g;
  tt_count_init(&g.started);
  tt_count_init(&g.released);
  atomic_long ran = 0;
  cr_assert_eq(tko_lanes_submit(l, 7, pin_task, &g, 0), 0);
  cr_assert(tt_count_wait_geq(&g.started, 1));
  cr_assert_eq(tko_lanes_submit(l, 7, count_fn, &ran, 0), 0);
  running_destroy d = {.l = l, .ran = &ran, .rc = 1};
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, destroy_thread, &d), 0);
  /* Best effort, no assertion: destroy asleep in its wait for the runner
   * before the held task ends. */
  struct timespec start;
  clock_gettime(CLOCK_MONOTONIC, &start);
  for (;;) {
    int tid = atomic_load(&d.tid);
    if (tid && thread_asleep(tid)) break;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (now.tv_sec - start.tv_sec > 2) break;
    sched_yield();
  }
  cr_assert_eq(atomic_load(&ran), 0);
  unpin(&g);
  cr_assert_eq(pthread_join(t, NULL), 0);
  cr_assert_eq(d.rc, 0);
  cr_assert_eq(d.ran_at_return, 1, "destroy returned before the running lane finished");
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  tko_pool_destroy(p);
  pin_fini(&g);
}

typedef struct where_ctx {
  pthread_t submitter;
  atomic_long on_submitter, elsewhere;
} where_ctx;

static int where_task(void *arg) {
  where_ctx *w = arg;
  if (pthread_equal(pthread_self(), w->submitter))
    atomic_fetch_add(&w->on_submitter, 1);
  else
    atomic_fetch_add(&w->elsewhere, 1);
  return 0;
}

static tt_count hold_released, hold_started;

static int hold_task(void *arg) {
  (void)arg;
  tt_count_add(&hold_started, 1);
  tt_count_wait_geq(&hold_released, 1);
  return 0;
}

Test(lanes, caller_runs_pool_runs_the_lane_on_the_submitter) {
  tt_count_init(&hold_released);
  tt_count_init(&hold_started);
  tko_options po = tko_basic_options(1);
  po.queue_capacity = 1;
  po.full_policy = TKO_FULL_CALLER_RUNS;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &po), 0);
  tko_lanes *l;
  cr_assert_eq(tko_lanes_create(&l, p, NULL), 0);
  /* Pin the only worker, then fill the one queue slot. */
  cr_assert_eq(tko_submit(p, hold_task, NULL, 0), 0);
  cr_assert(tt_count_wait_geq(&hold_started, 1));
  atomic_long filler = 0;
  cr_assert_eq(tko_submit(p, count_fn, &filler, 0), 0);
  where_ctx w = {.submitter = pthread_self()};
  /* The runner cannot be queued: the pool runs it here, and the lane with
   * it, before submit returns. */
  for (int i = 0; i < 5; i++)
    cr_assert_eq(tko_lanes_submit(l, 42, where_task, &w, 0), 0);
  cr_assert_eq(atomic_load(&w.on_submitter), 5);
  cr_assert_eq(atomic_load(&w.elsewhere), 0);
  cr_assert_eq(tko_lanes_wait_idle(l, 0), 0);
  tt_count_add(&hold_released, 1);
  cr_assert_eq(tko_lanes_destroy(l), 0);
  tko_pool_destroy(p);
  cr_assert_eq(atomic_load(&filler), 1);
  tt_count_fini(&hold_released);
  tt_count_fini(&hold_started);
}

typedef struct self_ctx {
  tko_lanes *l;
  atomic_int wait_rc, destroy_rc;
} self_ctx;

static int self_task(void *arg) {
  self_ctx *s = arg;
  atomic_store(&s->wait_rc, tko_lanes_wait_idle(s->l, -1));
  atomic_store(&s->destroy_rc, tko_lanes_destroy(s->l));
  return 0;
}

static void self_batch(void *user, const tko_lane_batch *b) {
  (void)b;
  self_task(user);
}

Test(lanes, wait_and_destroy_from_a_lane_task_are_edeadlk) {
  tko_pool *p = make_pool(2);
  self_ctx s;
  atomic_init(&s.wait_rc, 1);
  atomic_init(&s.destroy_rc, 1);
  cr_assert_eq(tko_lanes_create(&s.l, p, NULL), 0);
  pin g;
  pin_workers(p, &g, 2);
  cr_assert_eq(tko_lanes_submit(s.l, 3, self_task, &s, 0), 0);
  cr_assert_eq(tko_lanes_wait_idle(s.l, 0), -ETIMEDOUT);
  cr_assert_eq(tko_lanes_wait_idle(s.l, 20), -ETIMEDOUT); /* a timed wait, not a sleep */
  unpin(&g);
  cr_assert_eq(tko_lanes_wait_idle(s.l, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&s.wait_rc), -EDEADLK);
  cr_assert_eq(atomic_load(&s.destroy_rc), -EDEADLK);
  cr_assert_eq(tko_lanes_destroy(s.l), 0);
  /* The same from a batch callback, and from a plain task of the pool. */
  tko_lane_options o = tko_lane_default_options();
  o.batch = self_batch;
  o.user = &s;
  atomic_store(&s.wait_rc, 1);
  cr_assert_eq(tko_lanes_create(&s.l, p, &o), 0);
  cr_assert_eq(tko_lanes_submit(s.l, 3, NULL, NULL, 0), 0);
  cr_assert_eq(tko_lanes_wait_idle(s.l, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&s.wait_rc), -EDEADLK);
  atomic_store(&s.wait_rc, 1);
  cr_assert_eq(tko_submit(p, self_task, &s, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&s.wait_rc), -EDEADLK);
  cr_assert_eq(tko_lanes_destroy(s.l), 0);
  tko_pool_destroy(p);
  pin_fini(&g);
}

typedef struct chain_ctx {
  tko_lanes *l;
  atomic_int ran, bad;
} chain_ctx;

static int chain_last(void *arg) {
  atomic_fetch_add(&((chain_ctx *)arg)->ran, 1);
  return 0;
}

/* Queues the next task behind itself in its own lane, while its runner
 * holds the lane: the runner must find it after the batch. */
static int chain_first(void *arg) {
  chain_ctx *c = arg;
  if (tko_lanes_submit(c->l, 7, chain_last, c, 0) != 0) atomic_fetch_add(&c->bad, 1);
  atomic_fetch_add(&c->ran, 1);
  return 0;
}

/* A lane whose batch leaves exactly one task queued behind it (submitted by
 * the batch's own task, so it is there whatever the timing) keeps its
 * runner: the task runs. A runner that gave the lane up with a task queued
 * would strand it, and wait_idle would never return. */
Test(lanes, a_task_queued_by_the_running_batch_runs) {
  tko_pool *p = make_pool(1);
  chain_ctx c = {0};
  cr_assert_eq(tko_lanes_create(&c.l, p, NULL), 0);
  cr_assert_eq(tko_lanes_submit(c.l, 7, chain_first, &c, 0), 0);
  cr_assert_eq(tko_lanes_wait_idle(c.l, TT_LONG_MS), 0, "the task queued by the batch is stranded");
  cr_assert_eq(atomic_load(&c.ran), 2);
  cr_assert_eq(atomic_load(&c.bad), 0);
  cr_assert_eq(tko_lanes_destroy(c.l), 0);
  tko_pool_destroy(p);
}

/* Without an on_cancel, tko_lanes_cancel just drops the queued tasks: none
 * runs, and the stats count them cancelled. */
Test(lanes, cancel_without_on_cancel_drops_the_queued_tasks) {
  tko_pool *p = make_pool(1);
  pin g;
  pin_workers(p, &g, 1);
  tko_lanes *l;
  cr_assert_eq(tko_lanes_create(&l, p, NULL), 0);
  atomic_long ran = 0;
  for (uint64_t k = 0; k < 10; k++) cr_assert_eq(tko_lanes_submit(l, k, count_fn, &ran, 0), 0);
  cr_assert_eq(tko_lanes_cancel(l), 0);
  unpin(&g);
  cr_assert_eq(tko_lanes_wait_idle(l, TT_LONG_MS), 0);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  tko_lane_stats st;
  tko_lanes_stats(l, &st);
  cr_assert_eq(st.submitted, 10);
  cr_assert_eq(st.cancelled, 10);
  cr_assert_eq(st.completed, 0);
  cr_assert_eq(atomic_load(&ran), 0);
  cr_assert_eq(tko_lanes_destroy(l), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
  pin_fini(&g);
}

/* ---- a cancel splits each key into a run prefix and a cancelled rest ------- */

/* Each key's tasks, in submit order, record how they ended: 'R' when run,
 * 'C' when handed to on_cancel. Once a cancel begins, a key's tasks that
 * ran are a prefix of its stream and the cancelled ones the rest: the
 * stream reads R*C*, never a task run after an earlier one was cancelled.
 * Key 0's first task holds its runner in the middle of a visit until the
 * cancel reaches key 0 (its on_cancel opens the gate and waits for that
 * visit's last task), so the cancel always meets a running runner. */
enum { SP_KEYS = 4, SP_DRAIN = 8, SP_PER_KEY = 5 * SP_DRAIN };

typedef struct sp_item {
  struct sp_scene *s;
  int key, i;
} sp_item;

typedef struct sp_scene {
  tko_lanes *l;
  uint64_t keys[SP_KEYS];
  sp_item items[SP_KEYS][SP_PER_KEY];
  _Atomic char outcome[SP_KEYS][SP_PER_KEY];
  atomic_int twice;     /* a task that ended twice */
  atomic_int gate_open; /* key 0's first task may return */
  tt_count started;     /* key 0's first task began */
  tt_count ran0;        /* key 0's tasks run */
  tt_count gate;        /* 1 once the gate opened */
} sp_scene;

static void sp_end(sp_item *it, char how) {
  char none = 0;
  if (!atomic_compare_exchange_strong(&it->s->outcome[it->key][it->i], &none, how))
    atomic_fetch_add(&it->s->twice, 1);
}

static int sp_task(void *arg) {
  sp_item *it = arg;
  sp_scene *s = it->s;
  if (it->key == 0 && it->i == 0) {
    tt_count_add(&s->started, 1);
    tt_count_wait_geq(&s->gate, 1);
  }
  sp_end(it, 'R');
  if (it->key == 0) tt_count_add(&s->ran0, 1);
  return 0;
}

static void sp_open(sp_scene *s) {
  if (!atomic_exchange(&s->gate_open, 1)) tt_count_add(&s->gate, 1);
}

static void sp_cancel(void *user, const tko_lane_task *t) {
  sp_item *it = t->arg;
  sp_scene *s = user;
  sp_end(it, 'C');
  /* The first cancel met on key 0: its runner is held inside its first
   * visit (tasks 0 .. SP_DRAIN - 1); let that visit finish first. */
  if (it->key == 0 && !atomic_load(&s->gate_open)) {
    sp_open(s);
    tt_count_wait_geq(&s->ran0, SP_DRAIN);
  }
}

typedef enum { SP_LANES_CANCEL, SP_SHUTDOWN_CANCEL, SP_SHUTDOWN_NOWAIT } sp_how;

/* Checks every key's stream: each task ended once, as R*C*. Returns how
 * many keys had both (the cancel met them in the middle). */
static int sp_check(sp_scene *s, int round) {
  cr_assert_eq(atomic_load(&s->twice), 0, "round %d: a task ended twice", round);
  int mixed = 0;
  for (int k = 0; k < SP_KEYS; k++) {
    char line[SP_PER_KEY + 1];
    for (int i = 0; i < SP_PER_KEY; i++) {
      char c = atomic_load(&s->outcome[k][i]);
      line[i] = c ? c : '-';
    }
    bool cancelled = false;
    for (int i = 0; i < SP_PER_KEY; i++) {
      char c = line[i];
      cr_assert(c == 'R' || c == 'C', "round %d key %d task %d never ended", round, k, i);
      cr_assert(!(cancelled && c == 'R'),
                "round %d key %d: a task ran after an earlier one was cancelled: %.*s", round,
                k, SP_PER_KEY, line);
      cancelled |= c == 'C';
    }
    if (cancelled && atomic_load(&s->outcome[k][0]) == 'R') mixed++;
  }
  return mixed;
}

static void cancel_splits_each_key(sp_how how) {
  sp_scene *s = calloc(1, sizeof *s);
  cr_assert_not_null(s);
  int rounds = TT_SCALE(20, 5), mixed = 0;
  for (int round = 0; round < rounds; round++) {
    memset(s, 0, sizeof *s);
    tt_count_init(&s->started);
    tt_count_init(&s->ran0);
    tt_count_init(&s->gate);
    tko_pool *p = make_pool(SP_KEYS);
    tko_lane_options o = tko_lane_default_options();
    o.max_drain = SP_DRAIN;
    o.on_cancel = sp_cancel;
    o.user = s;
    cr_assert_eq(tko_lanes_create(&s->l, p, &o), 0);
    /* Keys on lanes of their own. */
    for (int k = 0, next = 1; k < SP_KEYS; k++) {
      for (bool fresh = false; !fresh; next++) {
        fresh = true;
        for (int j = 0; j < k; j++)
          if (tko_lanes_index(s->l, (uint64_t)next) == tko_lanes_index(s->l, s->keys[j]))
            fresh = false;
        s->keys[k] = (uint64_t)next;
      }
    }
    /* All queued before any runner starts: a runner's first visit is
     * then its key's first SP_DRAIN tasks. Keys interleaved per task. */
    cr_assert_eq(tko_pool_pause(p), 0);
    for (int i = 0; i < SP_PER_KEY; i++)
      for (int k = 0; k < SP_KEYS; k++) {
        s->items[k][i] = (sp_item){s, k, i};
        cr_assert_eq(tko_lanes_submit(s->l, s->keys[k], sp_task, &s->items[k][i], 0), 0);
      }
    cr_assert_eq(tko_pool_resume(p), 0);
    cr_assert(tt_count_wait_geq(&s->started, 1));
    if (how == SP_LANES_CANCEL) {
      cr_assert_eq(tko_lanes_cancel(s->l), 0);
      sp_open(s); /* key 0's tasks may all have been taken by its runner */
      cr_assert_eq(tko_lanes_wait_idle(s->l, TT_LONG_MS), 0);
    } else {
      /* A runner running when the pool shuts down finishes its lane: the
       * gate must open for the shutdown to return. */
      sp_open(s);
      cr_assert_eq(tko_pool_shutdown(p, how == SP_SHUTDOWN_CANCEL ? TKO_CANCEL
                                                                  : TKO_CANCEL_NOWAIT), 0);
      cr_assert_eq(tko_lanes_wait_idle(s->l, TT_LONG_MS), 0);
    }
    mixed += sp_check(s, round);
    cr_assert_eq(tko_lanes_destroy(s->l), 0);
    cr_assert_eq(tko_pool_destroy(p), 0);
    tt_count_fini(&s->started);
    tt_count_fini(&s->ran0);
    tt_count_fini(&s->gate);
  }
  /* tko_lanes_cancel met key 0's runner in the middle of its lane in every
   * round: the check above was not vacuous. */
  if (how == SP_LANES_CANCEL) cr_assert_geq(mixed, rounds);
  free(s);
}

Test(lanes, a_lanes_cancel_runs_a_prefix_of_each_key_and_cancels_the_rest) {
  cancel_splits_each_key(SP_LANES_CANCEL);
}

Test(lanes, a_cancel_shutdown_runs_a_prefix_of_each_key_and_cancels_the_rest) {
  cancel_splits_each_key(SP_SHUTDOWN_CANCEL);
}

Test(lanes, a_nowait_shutdown_runs_a_prefix_of_each_key_and_cancels_the_rest) {
  cancel_splits_each_key(SP_SHUTDOWN_NOWAIT);
}

/* wait_idle asleep when the lanes' last pending task leaves is woken, even
 * while a runner is still out: here a cancel disposes of the task whose
 * runner waits in the pool behind a pinned worker (lane_table.c's
 * pending_sub and wait_idle's waiter count, a Dekker pair). */
static int wait_idle_forever(void *arg) { return tko_lanes_wait_idle(arg, -1); }

Test(lanes, a_wait_idle_asleep_when_the_last_task_leaves_is_woken) {
  tko_pool *p = make_pool(1);
  tko_lanes *l;
  cr_assert_eq(tko_lanes_create(&l, p, NULL), 0);
  tt_pin pin = TT_PIN_INIT;
  cr_assert_eq(tko_submit(p, tt_pin_fn, &pin, 0), 0);
  cr_assert(tt_count_wait_geq(&pin.started, 1)); /* the one worker is held */
  cr_assert_eq(tko_lanes_submit(l, 7, tt_nop_fn, NULL, 0), 0); /* its runner waits */
  cr_assert_eq(tko_lanes_wait_idle(l, 0), -ETIMEDOUT);
  tf_thread waiter;
  cr_assert_eq(tf_thread_start(&waiter, wait_idle_forever, l), 0);
  /* Asleep inside wait_idle: still asleep over 100 more looks, so not just
   * blocked for a moment on its way in (the check can only make the scene
   * stricter: a waiter that looks after the cancel returns at once). */
  for (int looks = 0; looks < 100; looks = tf_thread_state(waiter.tid) == 'S' ? looks + 1 : 0) {
    cr_assert(tf_wait_thread_sleeping(waiter.tid));
    sched_yield();
  }
  cr_assert_eq(tko_lanes_cancel(l), 0); /* pending reaches 0; the runner is still queued */
  int rc = -1;
  /* Within a quarter of the pin's own limit (tt_gate_wait gives up after
   * TT_LONG_MS, and then the runner's end would wake the waiter too). */
  bool woken = tf_thread_join_within(&waiter, TT_LONG_MS / 4, &rc);
  tt_gate_open(&pin.gate);
  cr_assert(woken, "wait_idle was not woken when pending reached 0");
  cr_assert_eq(rc, 0);
  cr_assert_eq(tko_lanes_destroy(l), 0);
  tko_pool_destroy(p);
}

/* The pool's run hooks see a lane table's runner, one task with the
 * library's fn, never the host's lane task (SEMANTICS: hooks). */
typedef struct hook_seen {
  atomic_int host_fn, other_fn, after;
} hook_seen;

static int host_lane_task(void *arg) {
  (void)arg;
  return 0;
}

static void seen_before(void *user, const tko_task_info *t) {
  hook_seen *s = user;
  atomic_fetch_add(t->fn == host_lane_task ? &s->host_fn : &s->other_fn, 1);
}

static void seen_after(void *user, const tko_task_info *t) {
  (void)t;
  atomic_fetch_add(&((hook_seen *)user)->after, 1);
}

Test(lanes, the_pools_run_hooks_see_a_runner_never_the_lane_task) {
  hook_seen s = {0};
  tko_options po = tko_basic_options(2);
  po.hooks.user = &s;
  po.hooks.before_run = seen_before;
  po.hooks.after_run = seen_after;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &po), 0);
  tko_lanes *l;
  cr_assert_eq(tko_lanes_create(&l, p, NULL), 0);
  cr_assert_eq(tko_lanes_submit(l, 1, host_lane_task, NULL, 0), 0);
  cr_assert_eq(tko_lanes_wait_idle(l, TT_LONG_MS), 0);
  cr_assert_eq(tko_lanes_destroy(l), 0);
  cr_assert_eq(tko_pool_destroy(p), 0); /* joins the workers: every hook returned */
  cr_assert_eq(atomic_load(&s.host_fn), 0);
  cr_assert_eq(atomic_load(&s.other_fn), 1, "runners seen: %d", atomic_load(&s.other_fn));
  cr_assert_eq(atomic_load(&s.after), 1);
}
