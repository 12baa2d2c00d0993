/* SPDX-License-Identifier: MIT */
/* The stage (src/structures/ring.h): a worker copies a shard's published
 * ring slots before it takes the shard's lock, and the drain under the
 * lock takes the copies only while the ring's head is still where they
 * begin. Checked here: current copies are moved once, in order; copies
 * made before another drain moved the head are dropped; a stage copies a
 * run per segment, and a drain follows the copies into the next segment;
 * grouped copies keep submit order within each
 * weight; a stage reads nothing while a trim runs; and a trim waits for a
 * stage in progress before it frees segments, while the task that stage
 * saw, cancelled meanwhile, never runs. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "internal.h"
#include "taskorch.h"
#include "tko_test.h"
#include "tko_test_feature.h"
#include "tko_test_sync.h"

static int nothing(void *arg) {
  (void)arg;
  return 0;
}

/* A ring of this thread's in a set of one shard, and the queues a drain
 * moves into. */
typedef struct bench {
  tko__rings rs;
  tko__ring *r;
  tko__queue q, hq;
  tko__ring_stage *st;
} bench;

static void bench_init(bench *b) {
  cr_assert_eq(tko__rings_init(&b->rs, false, 1, NULL), 0);
  b->r = tko__rings_mine(&b->rs);
  cr_assert_not_null(b->r);
  cr_assert_eq(tko__queue_init(&b->q, 64, NULL), 0);
  cr_assert_eq(tko__queue_init(&b->hq, 16, NULL), 0);
  b->st = malloc(sizeof *b->st);
  cr_assert_not_null(b->st);
}

static void bench_fini(bench *b) {
  free(b->st);
  tko__queue_fini(&b->hq);
  tko__queue_fini(&b->q);
  tko__rings_fini(&b->rs);
}

/* Publishes n tasks; task at position p has arg p and weight weight_of(p). */
static void publish(bench *b, size_t n, int (*weight_of)(uint64_t)) {
  tko__ring *r = b->r;
  uint64_t t = atomic_load(&r->tail);
  tko__ring_seg *seg = r->wseg;
  for (size_t i = 0; i < n; i++) {
    seg = tko__ring_seg_for(r, seg, t + i);
    cr_assert_not_null(seg);
    tko__ring_write(seg, t + i, nothing, (void *)(uintptr_t)(t + i), 0, weight_of(t + i), 0);
  }
  r->wseg = seg;
  cr_assert_eq(tko__ring_publish(r, t, n), 0);
}

static int one_weight(uint64_t p) {
  (void)p;
  return 0;
}

static int three_weights(uint64_t p) { return (int)(p % 3); }

static void drain(bench *b, const tko__ring_stage *st) {
  cr_assert_eq(tko__rings_drain(&b->rs, 0, &b->q, &b->hq, TKO__CTX_HELD, st), 0);
}

/* Pops everything and checks positions [0, n) came out once each, heavier
 * weights first and in position order within a weight, each with its id. */
static void expect_all_once(bench *b, size_t n, int (*weight_of)(uint64_t)) {
  cr_assert_eq(b->q.len, n, "queued %zu, published %zu", b->q.len, n);
  bool *seen = calloc(n, 1);
  cr_assert_not_null(seen);
  tko__item it, prev = {0};
  for (size_t i = 0; i < n; i++) {
    cr_assert_eq(tko__queue_pop(&b->q, &it, 1), 1);
    uint64_t p = (uint64_t)(uintptr_t)it.arg;
    cr_assert_lt(p, n);
    cr_assert(!seen[p], "position %llu moved twice", (unsigned long long)p);
    seen[p] = true;
    cr_assert_eq(it.id, b->r->id_base | (p + 1), "position %llu has another's id",
                 (unsigned long long)p);
    cr_assert_eq(it.weight, weight_of(p));
    if (i && it.weight == prev.weight)
      cr_assert_gt(it.id, prev.id, "within weight %d, position %llu came out after a later one",
                   it.weight, (unsigned long long)p);
    if (i) cr_assert_leq(it.weight, prev.weight, "a lighter task came out before a heavier one");
    prev = it;
  }
  free(seen);
}

Test(ring_stage, current_copies_are_moved_once_in_order) {
  bench b;
  bench_init(&b);
  publish(&b, 10, one_weight);
  tko__rings_stage(&b.rs, 0, TKO__CTX_HELD, b.st);
  cr_assert_eq(b.st->entries, 1);
  cr_assert_eq(b.st->at[0].n, 10);
  drain(&b, b.st);
  cr_assert_eq(atomic_load(&b.r->head), 10);
  expect_all_once(&b, 10, one_weight);
  bench_fini(&b);
}

Test(ring_stage, copies_made_before_another_drain_moved_the_head_are_dropped) {
  bench b;
  bench_init(&b);
  publish(&b, 5, one_weight);
  tko__rings_stage(&b.rs, 0, TKO__CTX_HELD, b.st);
  cr_assert_eq(b.st->at[0].n, 5);
  drain(&b, NULL); /* another lock holder, with no stage of its own */
  publish(&b, 10, one_weight); /* more than the stage copied, at later positions */
  drain(&b, b.st);             /* the stale stage: its five copies were moved already */
  expect_all_once(&b, 15, one_weight);
  bench_fini(&b);
}

/* Pops n tasks and checks they are positions [from, from + n), in order. */
static void expect_run(bench *b, uint64_t from, size_t n) {
  cr_assert_eq(b->q.len, n);
  for (uint64_t p = from; p < from + n; p++) {
    tko__item it;
    cr_assert_eq(tko__queue_pop(&b->q, &it, 1), 1);
    cr_assert_eq((uint64_t)(uintptr_t)it.arg, p, "position %llu came out for %llu",
                 (unsigned long long)(uintptr_t)it.arg, (unsigned long long)p);
  }
}

/* Publishes n more and checks a drain with no stage moves them in order:
 * the ring's chain is whole after what came before. */
static void expect_the_next_drain_whole(bench *b, size_t n) {
  uint64_t from = atomic_load(&b->r->tail);
  publish(b, n, one_weight);
  drain(b, NULL);
  expect_run(b, from, n);
}

Test(ring_stage, a_stage_across_a_segments_end_copies_one_run_per_segment) {
  bench b;
  bench_init(&b);
  publish(&b, TKO__RING_CAPACITY - 4, one_weight);
  drain(&b, NULL);
  expect_run(&b, 0, TKO__RING_CAPACITY - 4);
  publish(&b, 10, one_weight); /* four in the first segment, six in the next */
  tko__rings_stage(&b.rs, 0, TKO__CTX_HELD, b.st);
  cr_assert_eq(b.st->entries, 2);
  cr_assert_eq(b.st->at[0].n, 4, "a run of copies crossed its segment's end");
  cr_assert_eq(b.st->at[1].head, TKO__RING_CAPACITY);
  cr_assert_eq(b.st->at[1].n, 6);
  drain(&b, b.st);
  expect_run(&b, TKO__RING_CAPACITY - 4, 10);
  /* The first segment went back to the owner at once, as a drain from the
   * slots gives it back (else a steady state allocates segments). */
  cr_assert_eq(atomic_load(&atomic_load(&b.r->rseg)->base), TKO__RING_CAPACITY);
  expect_the_next_drain_whole(&b, 5);
  bench_fini(&b);
}

Test(ring_stage, a_head_at_its_segments_end_is_staged_from_the_next) {
  bench b;
  bench_init(&b);
  publish(&b, TKO__RING_CAPACITY, one_weight);
  drain(&b, NULL); /* the head stops at the segment's end, still on it */
  expect_run(&b, 0, TKO__RING_CAPACITY);
  publish(&b, 10, one_weight);
  tko__rings_stage(&b.rs, 0, TKO__CTX_HELD, b.st);
  cr_assert_eq(b.st->entries, 1);
  cr_assert_eq(b.st->at[0].head, TKO__RING_CAPACITY);
  cr_assert_eq(b.st->at[0].n, 10);
  drain(&b, b.st); /* all of it staged: the drain reads no slot */
  expect_run(&b, TKO__RING_CAPACITY, 10);
  expect_the_next_drain_whole(&b, 5); /* the drain must have followed the link */
  bench_fini(&b);
}

Test(ring_stage, grouped_copies_keep_submit_order_within_each_weight) {
  bench b;
  bench_init(&b);
  atomic_store(&b.r->mixed_weights, true); /* as a big drain of mixed weights leaves it */
  publish(&b, 600, three_weights);
  tko__rings_stage(&b.rs, 0, TKO__CTX_HELD, b.st);
  cr_assert_eq(b.st->at[0].n, TKO__STAGE_MAX);
  cr_assert_eq(b.st->at[0].groups, 3, "a big stage of three weights was not grouped");
  drain(&b, b.st);
  expect_all_once(&b, 600, three_weights);
  bench_fini(&b);
}

/* ---- with a pool: stages and trims ------------------------------------ */

/* A pool whose workers stage: a queue per worker, enough of them
 * (pool.c: stages), named, as a build may default to one queue. */
static tko_options staging_options(void) {
  tko_options o = tko_basic_options(TKO__STAGE_MIN_QUEUES);
  o.queues = TKO__STAGE_MIN_QUEUES;
  return o;
}

Test(ring_stage, a_pool_of_few_queues_does_not_stage) {
  tko_options o = staging_options();
  o.queues = TKO__STAGE_MIN_QUEUES - 1;
  tko_pool *pool;
  cr_assert_eq(tko_pool_create(&pool, &o), 0);
  for (unsigned i = 0; i < pool->nslots; i++) cr_assert_null(pool->slots[i].stage);
  cr_assert_eq(tko_pool_destroy(pool), 0);
  o = staging_options();
  cr_assert_eq(tko_pool_create(&pool, &o), 0);
  for (unsigned i = 0; i < pool->nslots; i++) cr_assert_not_null(pool->slots[i].stage);
  cr_assert_eq(tko_pool_destroy(pool), 0);
}

Test(ring_stage, a_stage_reads_nothing_while_a_trim_runs) {
  tko_options o = staging_options();
  tko_pool *pool;
  cr_assert_eq(tko_pool_create(&pool, &o), 0);
  cr_assert_eq(tko_pool_pause(pool), 0); /* the task stays in this thread's ring */
  cr_assert_eq(tko_submit(pool, nothing, NULL, 0), 0);
  tko__ring *mine = tko__rings_mine(&pool->rings);
  cr_assert_not_null(mine);
  /* A worker slot of the test's own, so the pool's workers' flags stay
   * theirs. */
  tko__worker w = {.stage = malloc(sizeof(tko__ring_stage))};
  cr_assert_not_null(w.stage);
  tko__shard *sh = &pool->shards[mine->shard];
  atomic_store(&pool->trims, 1);
  cr_assert_null(tko__shard_stage(pool, &w, sh), "a stage ran beside a trim");
  atomic_store(&pool->trims, 0);
  const tko__ring_stage *st = tko__shard_stage(pool, &w, sh);
  cr_assert_not_null(st);
  cr_assert_eq(st->entries, 1);
  cr_assert_eq(st->at[0].n, 1);
  cr_assert_eq(atomic_load(&w.staging), false);
  free(w.stage);
  cr_assert_eq(tko_pool_resume(pool), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, TT_LONG_MS), 0);
  cr_assert_eq(tko_pool_destroy(pool), 0);
}

/* One scene's state: reset at the start of each attempt. */
static tt_count parked, holding, outcome;
static tt_gate release, unhold;
static atomic_bool park_next;
enum { NONE, TRIM_WAITED, TRIM_RETURNED };
static atomic_int first_event;
static tt_count events;
static atomic_int ran, cancelled;

static void park_a_stage(void) {
  bool expected = true;
  if (!atomic_compare_exchange_strong(&park_next, &expected, false)) return;
  tt_count_add(&parked, 1);
  tt_count_add(&outcome, 1);
  tt_gate_wait(&release);
}

static void note(int event) {
  int none = NONE;
  atomic_compare_exchange_strong(&first_event, &none, event);
  tt_count_add(&events, 1);
}

static void trim_waits(void) { note(TRIM_WAITED); }

static void *trimmer(void *arg) {
  cr_assert_eq(tko_pool_trim(arg), 0);
  note(TRIM_RETURNED);
  return NULL;
}

static int hold(void *arg) {
  (void)arg;
  tt_count_add(&holding, 1);
  tt_gate_wait(&unhold);
  return 0;
}

static int counted(void *arg) {
  (void)arg;
  atomic_fetch_add(&ran, 1);
  tt_count_add(&outcome, 1);
  return 0;
}

static void count_cancel(void *user, const tko_task_info *task) {
  (void)task;
  (void)user;
  atomic_fetch_add(&cancelled, 1);
}

static void scene_begin(void) {
  tt_count_init(&parked);
  tt_count_init(&holding);
  tt_count_init(&outcome);
  tt_count_init(&events);
  release = (tt_gate)TT_GATE_INIT;
  unhold = (tt_gate)TT_GATE_INIT;
  atomic_store(&first_event, NONE);
  atomic_store(&ran, 0);
  atomic_store(&cancelled, 0);
}

static void scene_end(void) {
  tt_count_fini(&events);
  tt_count_fini(&outcome);
  tt_count_fini(&holding);
  tt_count_fini(&parked);
}

/* The precondition is that the free worker's take stages the task and
 * parks in the stage. A take that read the ring before the submit's
 * publish was visible stages nothing and runs the task from its drain
 * under the lock: the attempt then asserts nothing and reruns. */
static bool trim_waits_for_a_cancelled_stage(void *arg) {
  (void)arg;
  scene_begin();
  tko_options o = staging_options();
  o.hooks.on_cancel = count_cancel;
  tko_pool *pool;
  cr_assert_eq(tko_pool_create(&pool, &o), 0);
  /* Every worker but one held in a task, one after another (a held worker
   * takes no other): only the last can take what follows. */
  for (long held = 1; held < (long)o.workers; held++) {
    cr_assert_eq(tko_submit(pool, hold, NULL, 0), 0);
    cr_assert(tt_count_wait_geq(&holding, held));
  }
  atomic_store(&tko__test_stage_window, park_a_stage);
  atomic_store(&tko__test_trim_waits, trim_waits);
  atomic_store(&park_next, true);
  tko_group g;
  cr_assert_eq(tko_group_init(&g), 0);
  cr_assert_eq(tko_group_submit(pool, &g, counted, NULL, 0), 0);
  /* The free worker's take stages the task and parks before it reads a
   * slot, or it runs the task without a stage. */
  cr_assert(tt_count_wait_geq(&outcome, 1));
  bool staged = tt_count_get(&parked) == 1;
  if (staged) {
    /* The cancel drains the ring under the lock: the head moves past the
     * staged task, and the pool is left with nothing queued. */
    cr_assert_eq(tko_group_cancel(&g), 1);
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, trimmer, pool), 0);
    /* The trim must wait for the parked stage; one that returned first
     * could have freed a segment the stage is about to read. */
    cr_assert(tt_count_wait_geq(&events, 1));
    int first = atomic_load(&first_event);
    tt_gate_open(&release);
    cr_assert_eq(pthread_join(t, NULL), 0);
    cr_assert_eq(first, TRIM_WAITED, "the trim returned while a stage was in progress");
  }
  atomic_store(&park_next, false);
  tt_gate_open(&unhold);
  atomic_store(&tko__test_stage_window, NULL);
  atomic_store(&tko__test_trim_waits, NULL);
  cr_assert_eq(tko_group_wait(&g, TT_LONG_MS), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, TT_LONG_MS), 0);
  if (staged) {
    cr_assert_eq(tko_group_status(&g), -ECANCELED);
    cr_assert_eq(atomic_load(&ran), 0, "a cancelled task ran from a stale stage");
    cr_assert_eq(atomic_load(&cancelled), 1);
  }
  cr_assert_eq(tko_group_destroy(&g), 0);
  cr_assert_eq(tko_pool_destroy(pool), 0);
  scene_end();
  return staged;
}

Test(ring_stage, a_trim_waits_for_a_stage_in_progress_whose_task_was_cancelled) {
  cr_assert(tt_rerun(trim_waits_for_a_cancelled_stage, NULL), "no take staged the task");
}
