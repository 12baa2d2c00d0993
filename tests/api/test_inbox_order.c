/* SPDX-License-Identifier: MIT */
/* Weight order, and FIFO within a weight, for a backlog that reaches the
 * queue in full moves of the submit buffer (the inbox: it holds 1024 tasks,
 * and the submit that finds it full moves them all into the queue). A move
 * may push the tasks grouped by weight when the previous big move looked
 * mixed; these phases give it every kind of move in turn: alternating
 * weights, a single weight after a mixed move, more weights than a move
 * groups, async tasks among plain ones, and a few weights to group. Every
 * task must then run once, in weight order and submit order within each
 * weight.
 *
 * Deterministic: the pool's one worker is pinned while the test submits,
 * so only the submitting thread moves tasks, at every 1025th submit; it
 * takes one task at a time (max_batch 1), so the run order is the queue's. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#include "taskorch.h"
#include "tko_test.h"
#include "tko_test_sync.h"

enum { MOVE = 1024, PHASES = 8, N = MOVE * PHASES };

typedef struct entry {
  int idx, weight;
} entry;

static entry tasks[N];
static int log_idx[N];
static atomic_int logged;

static void record(const entry *e) {
  int at = atomic_fetch_add(&logged, 1);
  if (at < N) log_idx[at] = e->idx;
}

static int plain_fn(void *arg) {
  record(arg);
  return 0;
}

static int async_fn(tko_async *op, void *arg) {
  record(arg);
  return tko_async_complete(op, 0);
}

/* The weight of task i of a phase. */
static int weight_of(int phase, int i) {
  switch (phase) {
    case 0: return i % 2;          /* alternating: marks the next move mixed */
    case 1: return 2;              /* one weight, tallied: one group */
    case 2: return 3 + i % 2;      /* mixed again */
    case 3: return 5 + i % 10;     /* ten weights: more than a move groups */
    case 4: return i % 2;          /* mixed again */
    case 5: return 1 + i % 2;      /* with async tasks: not grouped */
    case 6: return 6 + i % 2;      /* mixed again */
    default: return 4 + i % 3;     /* three weights: grouped */
  }
}

static bool is_async(int phase, int i) { return phase == 5 && i % 100 == 7; }

Test(inbox_order, full_moves_of_every_mix_keep_weight_and_fifo_order) {
  tko_options o = tko_basic_options(1);
  o.max_batch = 1; /* one at a time: async and plain tasks in strict order */
  tko_pool *pool = NULL;
  cr_assert_eq(tko_pool_create(&pool, &o), 0);
  tt_pin pin = TT_PIN_INIT;
  cr_assert_eq(tko_submit(pool, tt_pin_fn, &pin, 0), 0);
  cr_assert(tt_count_wait_geq(&pin.started, 1));
  atomic_store(&logged, 0);
  for (int p = 0, idx = 0; p < PHASES; p++) {
    for (int i = 0; i < MOVE; i++, idx++) {
      tasks[idx] = (entry){idx, weight_of(p, i)};
      int rc = is_async(p, i) ? tko_submit_async(pool, async_fn, &tasks[idx], tasks[idx].weight)
                              : tko_submit(pool, plain_fn, &tasks[idx], tasks[idx].weight);
      cr_assert_eq(rc, 0);
    }
  }
  tt_gate_open(&pin.gate);
  cr_assert_eq(tko_pool_wait_idle(pool, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&logged), N);
  static bool seen[N];
  for (int k = 0; k < N; k++) {
    int i = log_idx[k];
    cr_assert(!seen[i], "task %d ran twice", i);
    seen[i] = true;
    if (k == 0) continue;
    const entry *a = &tasks[log_idx[k - 1]], *b = &tasks[i];
    cr_assert(a->weight > b->weight || (a->weight == b->weight && a->idx < b->idx),
              "run %d: task %d (weight %d) after task %d (weight %d)", k, b->idx, b->weight,
              a->idx, a->weight);
  }
  cr_assert_eq(tko_pool_destroy(pool), 0);
}

/* Concurrent batches through the shared inbox (a one-worker pool) keep each
 * thread's order. A batch publishes its slots one by one; a drain that
 * read a slot of it still empty, skipped it as a hole, and then read the
 * next slot already published moved that one first (found by an attack
 * program: 8 of 15 runs out of order with 32 threads; fixed by reading
 * skipped holes again before each slot moved past them, src/structures/inbox.c).
 * Every task checks, as it starts, that its thread's previous one started
 * before it. */
enum { SUBMITTERS = 16, PER = 4 * 1024 + 300 };

typedef struct seq_task {
  int thread, seq;
} seq_task;

static atomic_int last_seq[SUBMITTERS];
static atomic_int out_of_order;
static seq_task seq_tasks[SUBMITTERS][PER];

static int seq_fn(void *arg) {
  const seq_task *t = arg;
  int prev = atomic_exchange(&last_seq[t->thread], t->seq);
  if (prev != t->seq - 1) atomic_fetch_add(&out_of_order, 1);
  return 0;
}

typedef struct submitter {
  tko_pool *pool;
  int thread, rc;
  tt_gate *start;
} submitter;

static void *submit_batches(void *arg) {
  submitter *s = arg;
  tko_task *batch = calloc(MOVE, sizeof *batch);
  tt_gate_wait(s->start);
  for (int at = 0, round = 0; at < PER && s->rc == 0; round++) {
    int n = round % 3 == 2 ? 1 : MOVE; /* batches of the inbox's size, and singles */
    if (n > PER - at) n = PER - at;
    for (int i = 0; i < n; i++) {
      seq_task *t = &seq_tasks[s->thread][at + i];
      *t = (seq_task){s->thread, at + i};
      batch[i] = (tko_task){seq_fn, t, 0};
    }
    s->rc = n == 1 ? tko_submit(s->pool, seq_fn, batch[0].arg, 0) : tko_submit_batch(s->pool, batch, (size_t)n);
    at += n;
  }
  free(batch);
  return NULL;
}

Test(inbox_order, concurrent_batches_keep_each_threads_order) {
  for (int round = 0; round < TT_SCALE(4, 1); round++) {
    for (int i = 0; i < SUBMITTERS; i++) atomic_store(&last_seq[i], -1);
    atomic_store(&out_of_order, 0);
    tko_pool *pool;
    tko_options o = tko_basic_options(1); /* one worker: every submit goes through the inbox */
    cr_assert_eq(tko_pool_create(&pool, &o), 0);
    tt_gate start = TT_GATE_INIT;
    pthread_t th[SUBMITTERS];
    submitter sub[SUBMITTERS];
    for (int i = 0; i < SUBMITTERS; i++) {
      sub[i] = (submitter){pool, i, 0, &start};
      cr_assert_eq(pthread_create(&th[i], NULL, submit_batches, &sub[i]), 0);
    }
    tt_gate_open(&start);
    for (int i = 0; i < SUBMITTERS; i++) {
      pthread_join(th[i], NULL);
      cr_assert_eq(sub[i].rc, 0);
    }
    cr_assert_eq(tko_pool_wait_idle(pool, TT_LONG_MS), 0);
    for (int i = 0; i < SUBMITTERS; i++) cr_assert_eq(atomic_load(&last_seq[i]), PER - 1);
    cr_assert_eq(atomic_load(&out_of_order), 0, "round %d: a thread's tasks started out of order",
                 round);
    cr_assert_eq(tko_pool_destroy(pool), 0);
  }
}
