/* SPDX-License-Identifier: MIT */
/* Tests for the pool's core promises: exact (weight desc, submit order)
 * execution with one worker, unique ids (increasing per thread), independent pools,
 * re-entrant submit, exactly-once execution under concurrent submitters, no
 * lost wake-up over a million submit/sleep cycles, stats, and no allocation
 * per task in a steady state. */
#include <limits.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "taskorch.h"
#include "tko_test.h"
#include "tko_test_feature.h"
#include "tko_test_sync.h"

static int count_fn(void *arg) {
  atomic_fetch_add_explicit((atomic_long *)arg, 1, memory_order_relaxed);
  return 0;
}

/* A task that announces it started, then blocks until the test opens the
 * gate: it pins a worker while the test queues work behind it. */
typedef struct gate_task {
  tt_gate gate;
  tt_count started;
  atomic_int timed_out;
} gate_task;

static void gate_task_init(gate_task *g) {
  pthread_mutex_init(&g->gate.mu, NULL);
  pthread_cond_init(&g->gate.cv, NULL);
  g->gate.open = false;
  tt_count_init(&g->started);
  atomic_init(&g->timed_out, 0);
}

static int gate_fn(void *arg) {
  gate_task *g = arg;
  tt_count_add(&g->started, 1);
  if (!tt_gate_wait(&g->gate)) atomic_store(&g->timed_out, 1);
  return 0;
}

static void pool_wait(tko_pool *p) { cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0); }

Test(pool, runs_every_task) {
  tko_pool *p;
  tko_options o = tko_basic_options(2);
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  cr_assert_not_null(p);
  atomic_long n = 0;
  for (int i = 0; i < 1000; i++) cr_assert_eq(tko_submit(p, count_fn, &n, i % 5), 0);
  pool_wait(p);
  cr_assert_eq(atomic_load(&n), 1000);
  tko_stats s;
  tko_pool_stats(p, &s);
  cr_assert_eq(s.submitted, 1000);
  cr_assert_eq(s.completed, 1000);
  cr_assert_eq(s.failed, 0);
  cr_assert_eq(s.cancelled, 0);
  cr_assert_eq(s.queued, 0);
  cr_assert_eq(s.running, 0);
  cr_assert_eq(s.basic_workers, 2);
  cr_assert_eq(s.elastic_workers, 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

Test(pool, basic_options_zero_means_cpu_count) {
  tko_options o = tko_basic_options(0);
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  cr_assert_eq((long)o.workers, cpus < 1 ? 1 : cpus);
  cr_assert_eq(o.max_elastic, 0);
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  tko_stats s;
  tko_pool_stats(p, &s);
  cr_assert_eq(s.basic_workers, o.workers);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* ---- exact order with one worker ---------------------------------------- */

typedef struct order_ctx {
  int *order;           /* indices in execution order */
  atomic_int n;         /* entries in order */
  uint64_t *ids;        /* id each task was given, from before_run */
  int *seen_weight;     /* weight before_run saw */
  struct order_arg *args;
  size_t count;
  gate_task *gate;
  atomic_int gate_id_ok;
} order_ctx;

typedef struct order_arg {
  order_ctx *ctx;
  int idx;
} order_arg;

static int order_fn(void *arg) {
  order_arg *a = arg;
  /* One worker, so no data race on order[]: the atomic only hands out slots. */
  a->ctx->order[atomic_fetch_add(&a->ctx->n, 1)] = a->idx;
  return 0;
}

static void order_before(void *user, const tko_task_info *t) {
  order_ctx *c = user;
  if (t->arg == c->gate) {
    atomic_store(&c->gate_id_ok, t->id == 1);
    return;
  }
  order_arg *a = t->arg;
  c->ids[a->idx] = t->id;
  c->seen_weight[a->idx] = t->weight;
}

static int *cmp_weights; /* qsort has no context argument */

static int cmp_expected(const void *x, const void *y) {
  int i = *(const int *)x, j = *(const int *)y;
  if (cmp_weights[i] != cmp_weights[j]) return cmp_weights[i] > cmp_weights[j] ? -1 : 1;
  return i - j; /* ties: submit order */
}

/* n tasks queued behind a gate on one worker, weights drawn from palette
 * (and, if any_int, one in eight from the whole int range), must run in
 * exactly (weight desc, submit order) with ids in submit order. */
static void check_exact_order(const int *palette, size_t palette_n, bool any_int, size_t n) {
  int *weights = malloc(n * sizeof *weights);
  int *expected = malloc(n * sizeof *expected);
  order_ctx c;
  memset(&c, 0, sizeof c);
  c.order = calloc(n, sizeof *c.order);
  c.ids = calloc(n, sizeof *c.ids);
  c.seen_weight = calloc(n, sizeof *c.seen_weight);
  c.args = calloc(n, sizeof *c.args);
  c.count = n;
  gate_task g;
  gate_task_init(&g);
  c.gate = &g;
  cr_assert(weights && expected && c.order && c.ids && c.seen_weight && c.args);
  uint64_t seed = 7;
  for (size_t i = 0; i < n; i++) {
    uint64_t r = tt_rand(&seed);
    weights[i] = (r & 7) || !any_int ? palette[(r >> 8) % palette_n] : (int)(uint32_t)(r >> 32);
    expected[i] = (int)i;
    c.args[i] = (order_arg){&c, (int)i};
  }
  tko_options o = tko_basic_options(1);
  o.initial_capacity = 16; /* the queue must also grow under the gate */
  o.hooks.user = &c;
  o.hooks.before_run = order_before;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  /* The gate occupies the only worker before anything else is queued, so
   * every later task waits in the queue and is taken in priority order. */
  cr_assert_eq(tko_submit(p, gate_fn, &g, INT_MIN), 0);
  cr_assert(tt_count_wait_geq(&g.started, 1));
  for (size_t i = 0; i < n; i++) cr_assert_eq(tko_submit(p, order_fn, &c.args[i], weights[i]), 0);
  tko_stats s;
  tko_pool_stats(p, &s);
  cr_assert_eq(s.running, 1);
  cr_assert_eq(s.queued, n);
  tt_gate_open(&g.gate);
  pool_wait(p);
  cr_assert_eq(atomic_load(&g.timed_out), 0);
  cr_assert_eq(atomic_load(&c.n), (int)n);
  cmp_weights = weights;
  qsort(expected, n, sizeof *expected, cmp_expected);
  for (size_t i = 0; i < n; i++) cr_assert_eq(c.order[i], expected[i], "position %zu", i);
  /* Ids: the gate got 1, then one per submit in submit order, no gaps. */
  cr_assert(atomic_load(&c.gate_id_ok));
  for (size_t i = 0; i < n; i++) {
    cr_assert_eq(c.ids[i], (uint64_t)i + 2, "task %zu", i);
    cr_assert_eq(c.seen_weight[i], weights[i]);
  }
  cr_assert_eq(tko_pool_destroy(p), 0);
  free(weights);
  free(expected);
  free(c.order);
  free(c.ids);
  free(c.seen_weight);
  free(c.args);
}

Test(pool, one_worker_exact_order_over_mixed_weights_and_ties) {
  static const int palette[] = {INT_MIN, -100, -1, 0, 0, 1, 7, 7, 100, INT_MAX, INT_MAX - 1,
                                INT_MIN + 1};
  check_exact_order(palette, sizeof palette / sizeof palette[0], true, 3000);
}

/* A few weights: the inbox moves tasks into the queue grouped by weight
 * (inbox.c), which must keep submit order within each weight. */
Test(pool, one_worker_exact_order_over_a_few_weights) {
  static const int palette[] = {3, 0, 2, 1, INT_MAX, INT_MIN};
  check_exact_order(palette, 4, false, 5000);
  check_exact_order(palette, 6, false, 5000);
}

/* ---- independence ------------------------------------------------------- */

typedef struct cross_wait {
  tko_pool *other;
  atomic_int rc;
} cross_wait;

static int wait_other_fn(void *arg) {
  cross_wait *cw = arg;
  /* A task of one pool may wait on a different pool: only its own pool
   * would deadlock. */
  atomic_store(&cw->rc, tko_pool_wait_idle(cw->other, TT_LONG_MS));
  return 0;
}

Test(pool, two_pools_do_not_interfere) {
  tko_pool *a, *b;
  tko_options oa = tko_basic_options(1), ob = tko_basic_options(2);
  cr_assert_eq(tko_pool_create(&a, &oa), 0);
  cr_assert_eq(tko_pool_create(&b, &ob), 0);
  cr_assert(a != b);
  gate_task g;
  gate_task_init(&g);
  cr_assert_eq(tko_submit(a, gate_fn, &g, 0), 0);
  cr_assert(tt_count_wait_geq(&g.started, 1));
  atomic_long na = 0, nb = 0;
  for (int i = 0; i < 100; i++) cr_assert_eq(tko_submit(a, count_fn, &na, 1), 0);
  for (int i = 0; i < 500; i++) cr_assert_eq(tko_submit(b, count_fn, &nb, 1), 0);
  /* B finishes while A is blocked; A is still busy. */
  pool_wait(b);
  cr_assert_eq(atomic_load(&nb), 500);
  cr_assert_eq(atomic_load(&na), 0);
  cr_assert_eq(tko_pool_wait_idle(a, 0), -ETIMEDOUT);
  tko_stats sa, sb;
  tko_pool_stats(a, &sa);
  tko_pool_stats(b, &sb);
  cr_assert_eq(sa.submitted, 101);
  cr_assert_eq(sa.completed, 0);
  cr_assert_eq(sa.queued, 100);
  cr_assert_eq(sb.submitted, 500);
  cr_assert_eq(sb.completed, 500);
  cr_assert_eq(sa.basic_workers, 1);
  cr_assert_eq(sb.basic_workers, 2);
  /* A task of B waits on A, which is legal; then B is shut down and
   * destroyed while A lives on. */
  cross_wait cw = {a, -1};
  cr_assert_eq(tko_submit(b, wait_other_fn, &cw, 0), 0);
  tt_gate_open(&g.gate);
  pool_wait(b);
  cr_assert_eq(atomic_load(&cw.rc), 0);
  cr_assert_eq(tko_pool_destroy(b), 0);
  pool_wait(a);
  cr_assert_eq(atomic_load(&na), 100);
  cr_assert_eq(tko_submit(a, count_fn, &na, 0), 0);
  pool_wait(a);
  cr_assert_eq(atomic_load(&na), 101);
  tko_pool_stats(a, &sa);
  cr_assert_eq(sa.submitted, 102);
  cr_assert_eq(sa.completed, 102);
  cr_assert_eq(tko_pool_destroy(a), 0);
}

/* ---- re-entrant submit -------------------------------------------------- */

typedef struct tree {
  tko_pool *pool;
  atomic_long ran;
  atomic_int submit_failed;
} tree;

typedef struct tree_node {
  tree *t;
  int depth;
} tree_node;

static tree_node nodes[1 << 12]; /* node k's children are 2k+1 and 2k+2 */

static int tree_fn(void *arg) {
  tree_node *nd = arg;
  atomic_fetch_add(&nd->t->ran, 1);
  if (nd->depth < 10) {
    size_t k = (size_t)(nd - nodes);
    for (size_t c = 2 * k + 1; c <= 2 * k + 2; c++) {
      nodes[c] = (tree_node){nd->t, nd->depth + 1};
      if (tko_submit(nd->t->pool, tree_fn, &nodes[c], nd->depth)) atomic_store(&nd->t->submit_failed, 1);
    }
  }
  return 0;
}

Test(pool, submit_from_inside_a_task) {
  tree t = {0};
  tko_options o = tko_basic_options(2);
  cr_assert_eq(tko_pool_create(&t.pool, &o), 0);
  nodes[0] = (tree_node){&t, 0};
  cr_assert_eq(tko_submit(t.pool, tree_fn, &nodes[0], 0), 0);
  /* Children are submitted before their parent returns, so the pool is
   * never idle until the whole tree has run. */
  pool_wait(t.pool);
  cr_assert_eq(atomic_load(&t.submit_failed), 0);
  cr_assert_eq(atomic_load(&t.ran), (1 << 11) - 1);
  tko_stats s;
  tko_pool_stats(t.pool, &s);
  cr_assert_eq(s.submitted, (1 << 11) - 1);
  cr_assert_eq(s.completed, (1 << 11) - 1);
  cr_assert_eq(tko_pool_destroy(t.pool), 0);
}

Test(pool, submit_from_inside_a_task_single_worker) {
  /* With one worker the submitting task is the only thread that can run
   * the children: they must wait in the queue, not deadlock the submit. */
  tree t = {0};
  tko_options o = tko_basic_options(1);
  cr_assert_eq(tko_pool_create(&t.pool, &o), 0);
  nodes[0] = (tree_node){&t, 0};
  cr_assert_eq(tko_submit(t.pool, tree_fn, &nodes[0], 0), 0);
  pool_wait(t.pool);
  cr_assert_eq(atomic_load(&t.submit_failed), 0);
  cr_assert_eq(atomic_load(&t.ran), (1 << 11) - 1);
  cr_assert_eq(tko_pool_destroy(t.pool), 0);
}

/* ---- takes are sized by time ------------------------------------------- */

/* Long tasks (each spins 100 us, five times the 20 us a take aims to hold)
 * are taken one at a time once the worker has timed its first batch, so a
 * higher weight submitted by one of them runs next, not behind a batch. */
typedef struct long_stream {
  tko_pool *pool;
  uint64_t spin_ns;   /* each stream task spins at least this long */
  atomic_int ran;     /* stream tasks run so far */
  atomic_int high_at; /* stream tasks run before the high one; -1 = not yet */
  int submit_after;   /* the stream task that submits the high one */
  atomic_int errors;
} long_stream;

static int high_fn(void *arg) {
  long_stream *ls = arg;
  atomic_store(&ls->high_at, atomic_load(&ls->ran));
  return 0;
}

static int long_fn(void *arg) {
  long_stream *ls = arg;
  tt_spin_ns(ls->spin_ns);
  if (atomic_fetch_add(&ls->ran, 1) + 1 == ls->submit_after &&
      tko_submit(ls->pool, high_fn, ls, 10) != 0)
    atomic_fetch_add(&ls->errors, 1);
  return 0;
}

/* One worker: `singles` stream tasks submitted and waited for one by one,
 * then 100 queued while paused and released at once; the stream task
 * numbered submit_after (counting from the first single) submits a task of
 * weight 10. Returns how many stream tasks ran before that one. */
static int high_task_position(uint64_t spin_ns, int singles, int submit_after) {
  long_stream ls = {.spin_ns = spin_ns, .submit_after = submit_after};
  atomic_init(&ls.ran, 0);
  atomic_init(&ls.high_at, -1);
  atomic_init(&ls.errors, 0);
  tko_options o = tko_basic_options(1);
  cr_assert_eq(tko_pool_create(&ls.pool, &o), 0);
  for (int i = 0; i < singles; i++) {
    cr_assert_eq(tko_submit(ls.pool, long_fn, &ls, 0), 0);
    pool_wait(ls.pool);
  }
  cr_assert_eq(tko_pool_pause(ls.pool), 0);
  for (int i = 0; i < 100; i++) cr_assert_eq(tko_submit(ls.pool, long_fn, &ls, 0), 0);
  cr_assert_eq(tko_pool_resume(ls.pool), 0);
  pool_wait(ls.pool);
  cr_assert_eq(atomic_load(&ls.errors), 0);
  cr_assert_eq(atomic_load(&ls.ran), singles + 100);
  cr_assert_eq(tko_pool_destroy(ls.pool), 0);
  return atomic_load(&ls.high_at);
}

Test(pool, long_tasks_are_taken_one_at_a_time) {
  int at = high_task_position(100000, 0, 40);
  cr_assert_eq(at, 40, "the high task ran after %d stream tasks, not right after the 40th", at);
}

/* Tasks of 9 us, first taken one at a time (each waited for), must not let
 * the cap grow past what 20 us holds (two of them) because each take held
 * one: when a backlog comes, a later high weight waits for one task more at
 * most, not for a take of 64. */
Test(pool, short_takes_do_not_grow_the_cap_past_the_budget) {
  int at = high_task_position(9000, 10, 30);
  cr_assert(at >= 30 && at <= 31, "the high task ran after %d stream tasks; the 30th submitted it",
            at);
}

/* ---- exactly once under concurrent submitters --------------------------- */

#define SUBMITTERS 8

typedef struct once_ctx {
  tko_pool *pool;
  atomic_uchar *runs;   /* per-task run counter */
  _Atomic uint64_t *ids; /* per-task id, as before_run saw it */
  long per_thread;
  atomic_int bad_id;
  tt_count ready;
  tt_gate start;
} once_ctx;

typedef struct once_thread {
  once_ctx *c;
  int t;
  long rejected;
} once_thread;

static int once_fn(void *arg) {
  atomic_fetch_add_explicit((atomic_uchar *)arg, 1, memory_order_relaxed);
  /* Every tenth task fails, to check the failed count too. */
  return ((uintptr_t)arg % 10) == 3;
}

static void once_before(void *user, const tko_task_info *t) {
  once_ctx *c = user;
  long idx = (const atomic_uchar *)t->arg - c->runs;
  if (t->id < 1 || idx < 0 || idx >= c->per_thread * SUBMITTERS || atomic_exchange(&c->ids[idx], t->id))
    atomic_store(&c->bad_id, 1); /* a stray id, or a task seen twice */
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

static void *once_submitter(void *arg) {
  once_thread *th = arg;
  once_ctx *c = th->c;
  tt_count_add(&c->ready, 1);
  tt_gate_wait(&c->start); /* all submitters start together */
  for (long i = 0; i < c->per_thread; i++) {
    long idx = th->t * c->per_thread + i;
    int weight = (int)((idx * 31 + th->t) % 9) - 4;
    if (tko_submit(c->pool, once_fn, (void *)&c->runs[idx], weight)) th->rejected++;
  }
  return NULL;
}

Test(pool, every_task_runs_exactly_once_with_eight_submitters) {
  once_ctx c;
  memset(&c, 0, sizeof c);
  c.per_thread = TT_SCALE(20000, 2000);
  long total = c.per_thread * SUBMITTERS;
  c.runs = calloc((size_t)total, sizeof *c.runs);
  c.ids = calloc((size_t)total, sizeof *c.ids);
  cr_assert(c.runs && c.ids);
  tt_count_init(&c.ready);
  pthread_mutex_init(&c.start.mu, NULL);
  pthread_cond_init(&c.start.cv, NULL);
  tko_options o = tko_basic_options(4);
  o.hooks.user = &c;
  o.hooks.before_run = once_before;
  cr_assert_eq(tko_pool_create(&c.pool, &o), 0);
  pthread_t th[SUBMITTERS];
  once_thread args[SUBMITTERS];
  for (int t = 0; t < SUBMITTERS; t++) {
    args[t] = (once_thread){&c, t, 0};
    cr_assert_eq(pthread_create(&th[t], NULL, once_submitter, &args[t]), 0);
  }
  cr_assert(tt_count_wait_geq(&c.ready, SUBMITTERS));
  tt_gate_open(&c.start);
  for (int t = 0; t < SUBMITTERS; t++) {
    pthread_join(th[t], NULL);
    cr_assert_eq(args[t].rejected, 0);
  }
  pool_wait(c.pool);
  long expect_failed = 0;
  for (long i = 0; i < total; i++) {
    cr_assert_eq(atomic_load(&c.runs[i]), 1, "task %ld", i);
    /* One thread's ids increase (ids: unique, per-thread order). */
    if (i % c.per_thread) cr_assert_gt(atomic_load(&c.ids[i]), atomic_load(&c.ids[i - 1]));
    if (((uintptr_t)&c.runs[i] % 10) == 3) expect_failed++;
  }
  cr_assert_eq(atomic_load(&c.bad_id), 0);
  tko_stats s;
  tko_pool_stats(c.pool, &s);
  cr_assert_eq(s.submitted, (uint64_t)total);
  cr_assert_eq(s.completed, (uint64_t)total);
  cr_assert_eq(s.failed, (uint64_t)expect_failed);
  cr_assert_eq(s.queued, 0);
  cr_assert_eq(s.running, 0);
  cr_assert_eq(tko_pool_destroy(c.pool), 0);
  free(c.runs);
  uint64_t *sorted = malloc((size_t)total * sizeof *sorted);
  for (long i = 0; i < total; i++) sorted[i] = atomic_load(&c.ids[i]);
  qsort(sorted, (size_t)total, sizeof *sorted, cmp_u64);
  for (long i = 1; i < total; i++) cr_assert_neq(sorted[i], sorted[i - 1], "an id given twice");
  free(sorted);
  free(c.ids);
}

/* ---- no lost wake-up ---------------------------------------------------- */

/* One task at a time, waited for each time: between cycles the worker finds
 * the queue empty and goes (or is going) to sleep, so every submit races
 * with a worker falling asleep. A lost wake-up hangs wait_idle, which then
 * fails after TT_LONG_MS. */
typedef struct chain {
  unsigned workers, spin_yields;
  long cycles;
  long failed_at; /* -1, or the first cycle that went wrong */
  int rc;         /* what went wrong there */
  tko_stats stats;
} chain;

static void *run_chain(void *arg) {
  chain *c = arg;
  c->failed_at = -1;
  tko_options o = tko_basic_options(c->workers);
  o.spin_yields = c->spin_yields;
  tko_pool *p;
  if ((c->rc = tko_pool_create(&p, &o)) != 0) {
    c->failed_at = 0;
    return NULL;
  }
  atomic_long n = 0;
  for (long i = 0; i < c->cycles; i++) {
    int rc = tko_submit(p, count_fn, &n, (int)(i & 3));
    if (rc == 0) rc = tko_pool_wait_idle(p, TT_LONG_MS);
    /* wait_idle returned, so this cycle's task has finished. */
    if (rc == 0 && atomic_load_explicit(&n, memory_order_relaxed) != i + 1) rc = 1;
    if (rc) {
      c->failed_at = i;
      c->rc = rc;
      break;
    }
  }
  tko_pool_stats(p, &c->stats);
  tko_pool_destroy(p);
  return NULL;
}

/* Runs `chains` independent pools, each on its own thread, so the cycles
 * use both cores of a small machine: a single chain is a ping-pong that
 * keeps only one core busy at a time. */
static void submit_sleep_cycles(int chains, unsigned workers, unsigned spin_yields, long cycles) {
  chain c[4];
  pthread_t th[4];
  cr_assert_leq(chains, 4);
  for (int i = 0; i < chains; i++) {
    c[i] = (chain){workers, spin_yields, cycles / chains, -1, 0, {0}};
    cr_assert_eq(pthread_create(&th[i], NULL, run_chain, &c[i]), 0);
  }
  for (int i = 0; i < chains; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < chains; i++) {
    cr_assert_eq(c[i].failed_at, -1, "chain %d, cycle %ld: rc %d (1 = wait_idle returned early)",
                 i, c[i].failed_at, c[i].rc);
    cr_assert_eq(c[i].stats.submitted, (uint64_t)c[i].cycles);
    cr_assert_eq(c[i].stats.completed, (uint64_t)c[i].cycles);
  }
}

Test(pool, no_lost_wakeup_over_a_million_submit_sleep_cycles, .timeout = 300) {
  /* spin_yields = 1: the worker reaches the sleep path almost at once, so
   * most cycles exercise the sleep/wake handshake rather than the spin. */
  submit_sleep_cycles(4, 1, 1, TT_SCALE(1000000L, 20000L));
}

Test(pool, no_lost_wakeup_with_two_workers, .timeout = 300) {
  submit_sleep_cycles(2, 2, 1, TT_SCALE(50000L, 5000L));
}

/* The same handshake met at its end every time: both workers parked (in
 * the kernel, as /proc shows), then one submit, which must wake one. The
 * cycles above meet it only when the submitter is late enough. */
typedef struct parked_workers {
  pid_t tid[2];
  tt_count started;
} parked_workers;

static parked_workers parked;

static void note_worker(void *user, unsigned index, tko_worker_kind kind) {
  (void)user;
  (void)kind;
  if (index < 2) parked.tid[index] = tf_gettid();
  tt_count_add(&parked.started, 1);
}

Test(pool, a_submit_wakes_a_worker_when_every_worker_is_parked) {
  memset(parked.tid, 0, sizeof parked.tid);
  tt_count_init(&parked.started);
  tko_options o = tko_basic_options(2);
  o.hooks.thread_start = note_worker;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  cr_assert(tt_count_wait_geq(&parked.started, 2));
  atomic_long n = 0;
  for (long round = 0; round < 5; round++) {
    for (int w = 0; w < 2; w++)
      cr_assert(tf_wait_thread_sleeping(parked.tid[w]), "worker %d never parked", w);
    cr_assert_eq(tko_submit(p, count_fn, &n, 0), 0);
    cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0, "round %ld: the submit woke nobody", round);
    cr_assert_eq(atomic_load(&n), round + 1);
  }
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* ---- stats while busy, and no allocation per task ----------------------- */

/* Two tasks that each wait for the other to start: they finish only if
 * two workers run them at once. */
typedef struct rendezvous {
  tt_count arrived;
  atomic_int missed;
} rendezvous;

static int meet_fn(void *arg) {
  rendezvous *r = arg;
  tt_count_add(&r->arrived, 1);
  if (!tt_count_wait_geq_within(&r->arrived, 2, 10000)) atomic_store(&r->missed, 1);
  return 0;
}

/* One submit wakes one worker; that worker, leaving queued work behind its
 * take, wakes the next (signal.c: the last searcher wakes one more). A
 * batch of two lands in one submitting thread's ring: the first worker
 * moves both into the queue and takes one, so the second task is found
 * by the second worker only through that worker's look at what is
 * queued (backlog). */
Test(pool, queued_work_left_by_a_take_wakes_a_second_worker) {
  tko_pool *p;
  tko_options o = tko_basic_options(2);
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  for (int round = 0; round < TT_SCALE(20, 5); round++) {
    pool_wait(p); /* both workers go back to sleep */
    rendezvous r;
    tt_count_init(&r.arrived);
    atomic_init(&r.missed, 0);
    tko_task two[2] = {{meet_fn, &r, 0}, {meet_fn, &r, 0}};
    cr_assert_eq(tko_submit_batch(p, two, 2), 0);
    pool_wait(p);
    cr_assert_eq(atomic_load(&r.missed), 0, "round %d: the second task waited for the first", round);
    tt_count_fini(&r.arrived);
  }
  cr_assert_eq(tko_pool_destroy(p), 0);
}

Test(pool, stats_while_a_task_runs) {
  tko_pool *p;
  tko_options o = tko_basic_options(1);
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  gate_task g;
  gate_task_init(&g);
  cr_assert_eq(tko_submit(p, gate_fn, &g, 0), 0);
  cr_assert(tt_count_wait_geq(&g.started, 1));
  atomic_long n = 0;
  for (int i = 0; i < 10; i++) cr_assert_eq(tko_submit(p, count_fn, &n, 0), 0);
  tko_stats s;
  tko_pool_stats(p, &s);
  cr_assert_eq(s.submitted, 11);
  cr_assert_eq(s.running, 1);
  cr_assert_eq(s.queued, 10);
  cr_assert_eq(s.completed, 0);
  cr_assert_eq(s.submitted, s.completed + s.cancelled + s.queued + s.running);
  tt_gate_open(&g.gate);
  pool_wait(p);
  tko_pool_stats(p, &s);
  cr_assert_eq(s.completed, 11);
  cr_assert_eq(s.running, 0);
  cr_assert_eq(s.queued, 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

Test(pool, stats_show_the_queue_memory_it_grew_and_kept) {
  tko_pool *p;
  tko_options o = tko_basic_options(1);
  o.initial_capacity = 16;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  tko_stats s0, s1, s2;
  tko_pool_stats(p, &s0);
  cr_assert_gt(s0.queue_bytes, 0, "the initial slab is counted");
  gate_task g;
  gate_task_init(&g);
  cr_assert_eq(tko_submit(p, gate_fn, &g, 0), 0);
  cr_assert(tt_count_wait_geq(&g.started, 1));
  /* More than the inbox holds, while the only worker is held: the queue
   * must take them and grow. */
  atomic_long n = 0;
  const long backlog = 5000;
  for (long i = 0; i < backlog; i++) cr_assert_eq(tko_submit(p, count_fn, &n, (int)(i & 3)), 0);
  tko_pool_stats(p, &s1);
  cr_assert_gt(s1.queue_bytes, s0.queue_bytes, "a backlog of %ld grew the slab", backlog);
  tt_gate_open(&g.gate);
  pool_wait(p);
  tko_pool_stats(p, &s2);
  cr_assert_eq(atomic_load(&n), backlog);
  cr_assert_geq(s2.queue_bytes, s1.queue_bytes, "the slab is kept for the next burst");
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* A large initial capacity (its slab a mapping of its own, not malloc's)
 * holds that many queued tasks without growing. */
Test(pool, a_large_initial_capacity_holds_its_backlog_without_growing) {
  tko_pool *p;
  tko_options o = tko_basic_options(1);
  o.initial_capacity = (size_t)1 << 15;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  tko_stats s0, s1;
  tko_pool_stats(p, &s0);
  cr_assert_gt(s0.queue_bytes, 0, "the initial slab is counted");
  gate_task g;
  gate_task_init(&g);
  cr_assert_eq(tko_submit(p, gate_fn, &g, 0), 0);
  cr_assert(tt_count_wait_geq(&g.started, 1));
  atomic_long n = 0;
  const long backlog = 20000; /* below the capacity, far above the inbox */
  for (long i = 0; i < backlog; i++) cr_assert_eq(tko_submit(p, count_fn, &n, (int)(i & 3)), 0);
  tko_pool_stats(p, &s1);
  cr_assert_eq(s1.queue_bytes, s0.queue_bytes, "a backlog below the capacity grew the slab");
  tt_gate_open(&g.gate);
  pool_wait(p);
  cr_assert_eq(atomic_load(&n), backlog);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

typedef struct counting_alloc {
  atomic_long allocs, frees; /* calls, realloc counted as an alloc */
  atomic_long live;          /* blocks not yet freed */
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
  atomic_fetch_add(&c->frees, 1);
  atomic_fetch_sub(&c->live, 1);
  free(ptr);
}

/* capacity > 0: a bounded queue, whose room moves in leases and chunks
 * (admit.c), the same. */
static void steady_state_allocates_nothing(size_t capacity) {
  counting_alloc ca = {0};
  tko_allocator al = {ca_alloc, ca_realloc, ca_free, &ca};
  tko_options o = tko_basic_options(2);
  o.initial_capacity = 16;
  o.allocator = &al;
  o.queue_capacity = capacity;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  cr_assert_gt(atomic_load(&ca.allocs), 0, "the pool's own memory comes from the allocator");
  atomic_long n = 0;
  /* Warm up with the same bursts as the steady phase, submitted while
   * paused: the whole burst is queued at once, so the slab grows to its
   * size however fast the workers are (unpaused, workers that kept up
   * could leave it smaller than a later burst on a loaded machine needs),
   * and the weight table learns the weights. */
  const int burst = 2000, rounds = TT_SCALE(100, 10);
  for (int r = 0; r < 3; r++) {
    cr_assert_eq(tko_pool_pause(p), 0);
    for (int i = 0; i < burst; i++) cr_assert_eq(tko_submit(p, count_fn, &n, i % 50), 0);
    cr_assert_eq(tko_pool_resume(p), 0);
    pool_wait(p);
  }
  long before = atomic_load(&ca.allocs);
  for (int r = 0; r < rounds; r++) {
    for (int i = 0; i < burst; i++) {
      int rc = tko_submit(p, count_fn, &n, i % 50);
      if (rc) cr_assert_eq(rc, 0);
    }
    pool_wait(p);
  }
  cr_assert_eq(atomic_load(&n), (long)burst * (rounds + 3));
  cr_assert_eq(atomic_load(&ca.allocs), before, "allocations in a steady state");
  cr_assert_eq(tko_pool_destroy(p), 0);
  cr_assert_eq(atomic_load(&ca.live), 0, "destroy frees everything it allocated");
}

Test(pool, steady_state_allocates_nothing_per_task) { steady_state_allocates_nothing(0); }

Test(pool, steady_state_allocates_nothing_per_task_in_a_bounded_queue) {
  steady_state_allocates_nothing(4096);
}
