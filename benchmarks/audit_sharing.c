/* SPDX-License-Identifier: MIT */
/* The sharing audit's driver (benchmarks/MODEL.md): P producers
 * flood a pool of W workers with empty tasks in a build configured with
 * -DTKO_SHARING_AUDIT=ON, and the audit reports, per task, the RMWs on
 * cache lines that two or more threads write, the stores to lines other
 * threads read, and each shared line's demand. Those counts depend on
 * which threads touch which lines, not on timing, so this 2-core machine
 * measures what a 64-core one would pay.
 *
 *   audit_sharing [--producers 8] [--workers 8] [--tasks 200000]
 *                 [--weights 4] [--batch 1] [--top 12] [--enforce] [--enforce-lock]
 *                 [--self-check] [--capacity N] [--queues N]
 *
 * Gates, each printed PASS or FAIL: the first two, at most 0.05 contended
 * RMWs per task and no line with a demand above 1/P, and a third: the
 * sections of any one lock fetch at most 1/P lines per task (the drain
 * copies every task's slot under the queue lock, which serialises the pool
 * whatever the submit path; MODEL.md). --enforce fails the run on the
 * first two gates (the CTest entry: submit rings pass them), and
 * --enforce-lock on the third as well (several queues, --queues N, divide
 * it by N: MODEL.md, "Several queues"). --self-check asserts that the instrumentation sees the
 * design as it is: each kind of record made (below). --capacity N makes
 * the pool bounded (queue_capacity N, full policy BLOCK): admission's
 * leases (src/engine/admit.c) are then counted too. White-box: it
 * includes src/ to name the pool's lines. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "audit.h"
#include "internal.h"

typedef struct config {
  unsigned producers, workers, weights, batch, top, queues;
  unsigned long tasks, capacity;
  bool enforce, enforce_lock, self_check;
} config;

typedef struct producer {
  pthread_t thread;
  tko_pool *pool;
  pthread_barrier_t *start;
  const config *cfg;
  unsigned long n;
  unsigned index;
  int rc;
} producer;

static int empty(void *arg) {
  (void)arg;
  return 0;
}

static void name_worker(void *user, unsigned index, tko_worker_kind kind) {
  (void)user, (void)index, (void)kind;
  tko__audit_name_thread("worker");
}

static int submit_some(tko_pool *pool, const config *cfg, unsigned long first, unsigned long n) {
  tko_task tasks[64];
  for (unsigned long i = 0; i < n;) {
    unsigned long k = n - i < cfg->batch ? n - i : cfg->batch;
    int rc;
    if (cfg->batch == 1) {
      rc = tko_submit(pool, empty, NULL, (int)((first + i) % cfg->weights));
    } else {
      for (unsigned long j = 0; j < k; j++)
        tasks[j] = (tko_task){.fn = empty, .weight = (int)((first + i + j) % cfg->weights)};
      rc = tko_submit_batch(pool, tasks, k);
    }
    if (rc) return rc;
    i += k;
  }
  return 0;
}

static void *produce(void *arg) {
  producer *p = arg;
  tko__audit_name_thread("producer");
  pthread_barrier_wait(p->start);
  p->rc = submit_some(p->pool, p->cfg, p->index, p->n);
  return NULL;
}

/* Names the pool's memory and its hot fields in the report. Follows the
 * engine's layout: a redesign updates it with its own structures. */
#define LABEL_FIELD(pool, f) tko__audit_label(&(pool)->f, sizeof(pool)->f, #f)
static void label_pool(tko_pool *pool) {
  LABEL_FIELD(pool, inbox.tail);
  LABEL_FIELD(pool, inbox.head_seen);
  LABEL_FIELD(pool, inbox.head);
  LABEL_FIELD(pool, room_maker);
  static char names[TKO_MAX_QUEUES][3][24];
  for (unsigned i = 0; i < pool->nshards && i < 8; i++) { /* the audit keeps 32 labels */
    tko__shard *sh = &pool->shards[i];
    snprintf(names[i][0], sizeof names[i][0], "shard%u.lock.held", i);
    snprintf(names[i][1], sizeof names[i][1], "shard%u.queue.len", i);
    snprintf(names[i][2], sizeof names[i][2], "shard%u.backlog", i);
    tko__audit_label((const void *)&sh->lock.held, sizeof sh->lock.held, names[i][0]);
    tko__audit_label(&sh->queue.len, sizeof sh->queue.len, names[i][1]);
    tko__audit_label((const void *)&sh->backlog, sizeof sh->backlog, names[i][2]);
  }
  LABEL_FIELD(pool, paused);
  LABEL_FIELD(pool, idle.state);
  LABEL_FIELD(pool, idle_waiters);
  LABEL_FIELD(pool, cancelled);
  LABEL_FIELD(pool, room_taken);
  LABEL_FIELD(pool, space_waiters);
  tko__audit_label(pool->inbox.slots, (pool->inbox.mask + 1) * sizeof *pool->inbox.slots,
                   "inbox.slots");
  tko__audit_label(pool->slots, pool->nslots * sizeof *pool->slots, "workers");
  tko__audit_label(pool, sizeof *pool, "pool");
}

/* Names the submit rings (claimed by the producers' first submits): each
 * ring's tail, head and slots. */
static void label_rings(tko_pool *pool) {
  static char names[TKO__RINGS_MAX][3][24];
  unsigned n = atomic_load(&pool->rings.count);
  for (unsigned i = 0; i < n && i < 8; i++) { /* the audit keeps 32 labels */
    tko__ring *r = pool->rings.ring[i];
    snprintf(names[i][0], sizeof names[i][0], "ring%u.tail", i);
    snprintf(names[i][1], sizeof names[i][1], "ring%u.head", i);
    snprintf(names[i][2], sizeof names[i][2], "ring%u.slots", i);
    tko__audit_label((const void *)&r->tail, sizeof r->tail, names[i][0]);
    tko__audit_label((const void *)&r->head, sizeof r->head, names[i][1]);
    tko__audit_label(r->rseg->slots, sizeof r->rseg->slots, names[i][2]); /* the first segment */
  }
}

static unsigned long number(const char *flag, const char *s, unsigned long lo, unsigned long hi) {
  char *end;
  errno = 0;
  unsigned long v = strtoul(s ? s : "", &end, 10);
  if (!s || errno || *end || end == s || v < lo || v > hi) {
    fprintf(stderr, "audit_sharing: %s wants a number in %lu..%lu\n", flag, lo, hi);
    exit(2);
  }
  return v;
}

static config parse(int argc, char **argv) {
  config c = {.producers = 8, .workers = 8, .weights = 4, .batch = 1, .top = 12, .tasks = 200000};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--enforce"))
      c.enforce = true;
    else if (!strcmp(a, "--enforce-lock"))
      c.enforce = c.enforce_lock = true;
    else if (!strcmp(a, "--self-check"))
      c.self_check = true;
    else if (!strcmp(a, "--producers"))
      c.producers = (unsigned)number(a, v, 1, 32), i++;
    else if (!strcmp(a, "--workers"))
      c.workers = (unsigned)number(a, v, 1, 30), i++;
    else if (!strcmp(a, "--weights"))
      c.weights = (unsigned)number(a, v, 1, 1000), i++;
    else if (!strcmp(a, "--batch"))
      c.batch = (unsigned)number(a, v, 1, 64), i++;
    else if (!strcmp(a, "--top"))
      c.top = (unsigned)number(a, v, 1, 1000), i++;
    else if (!strcmp(a, "--queues"))
      c.queues = (unsigned)number(a, v, 1, TKO_MAX_QUEUES), i++;
    else if (!strcmp(a, "--capacity"))
      c.capacity = number(a, v, 64, 100000000), i++;
    else if (!strcmp(a, "--tasks"))
      c.tasks = number(a, v, 1, 100000000), i++;
    else {
      fprintf(stderr, "usage: audit_sharing [--producers N] [--workers N] [--tasks N] "
                      "[--weights N] [--batch N] [--top N] [--enforce] [--enforce-lock] "
                      "[--self-check] [--capacity N] [--queues N]\n");
      exit(2);
    }
  }
  return c;
}

static bool gate(const char *what, double value, double limit) {
  bool ok = value <= limit;
  printf("gate: %-34s %8.4f <= %.4f  %s\n", what, value, limit, ok ? "PASS" : "FAIL");
  return ok;
}

/* The instrumentation sees the design as it is: the pool's lines are
 * shared (the lock's exchange: contended RMWs; the workers' counters:
 * shared-line stores), the queue locks' sections fetch the task slots the
 * drain copies (at least half a line per task, over the shards: 40-byte
 * slots), and each
 * producer's ring tail is written by that producer alone (a CAS each
 * publish) - each kind of record made. */
static bool self_check(const config *c, const tko__audit_summary *s, tko_pool *pool) {
  uintptr_t lo = (uintptr_t)pool->shards, hi = lo + pool->nshards * sizeof *pool->shards;
  bool lock = s->worst_lock >= lo && s->worst_lock < hi;
  unsigned rings = atomic_load(&pool->rings.count);
  bool ok = s->overflow == 0 && s->threads >= c->producers + 1 && s->contended_rmws_per_task > 0 &&
            s->shared_stores_per_task > 0 && lock &&
            s->serialised_per_task >= 0.5 / pool->nshards &&
            rings >= c->producers;
  printf("self-check: %u rings for %u producers; contended RMWs %.4f, shared-line stores %.4f "
         "per task; the pool's lock serialises %.4f fetches per task: %s\n",
         rings, c->producers, s->contended_rmws_per_task, s->shared_stores_per_task,
         lock ? s->serialised_per_task : 0.0, ok ? "PASS" : "FAIL");
  return ok;
}

int main(int argc, char **argv) {
  config c = parse(argc, argv);
  tko__audit_name_thread("main");
  tko_options opts = tko_basic_options(c.workers);
  opts.hooks.thread_start = name_worker;
  opts.queue_capacity = c.capacity;
  opts.queues = c.queues;
  tko_pool *pool;
  int rc = tko_pool_create(&pool, &opts);
  if (rc) {
    fprintf(stderr, "audit_sharing: tko_pool_create: %s\n", tko_strerror(rc));
    return 1;
  }
  label_pool(pool);
  /* Warm up (the queue grows, the workers start), then count from an idle
   * pool: setup writes by the creating thread are not the steady state. */
  submit_some(pool, &c, 0, 64u * c.workers);
  tko_pool_wait_idle(pool, -1);
  tko__audit_reset();

  producer *ps = calloc(c.producers, sizeof *ps);
  pthread_barrier_t start;
  pthread_barrier_init(&start, NULL, c.producers);
  unsigned long per = c.tasks / c.producers, total = per * c.producers;
  for (unsigned i = 0; i < c.producers; i++) {
    ps[i] = (producer){.pool = pool, .start = &start, .cfg = &c, .n = per, .index = i};
    if (pthread_create(&ps[i].thread, NULL, produce, &ps[i])) {
      fprintf(stderr, "audit_sharing: cannot start producer %u\n", i);
      return 1;
    }
  }
  for (unsigned i = 0; i < c.producers; i++) {
    pthread_join(ps[i].thread, NULL);
    if (ps[i].rc) fprintf(stderr, "audit_sharing: producer %u: %s\n", i, tko_strerror(ps[i].rc));
    rc = rc ? rc : ps[i].rc;
  }
  tko_pool_wait_idle(pool, -1);
  label_rings(pool);

  printf("audit_sharing: %u producers, %u workers, %u queues, %lu empty tasks, %u weights, "
         "batch %u, queue capacity %lu\n",
         c.producers, c.workers, pool->nshards, total, c.weights, c.batch, c.capacity);
  tko__audit_report(stdout, total, c.top);
  tko__audit_summary s;
  tko__audit_summarize(total, &s);
  printf("\n");
  bool pass = gate("contended RMWs per task", s.contended_rmws_per_task, 0.05);
  pass &= gate("worst line's demand per task (1/P)", s.worst.demand, 1.0 / c.producers);
  bool lock_pass =
      gate("serialised fetches per task (1/P)", s.serialised_per_task, 1.0 / c.producers);
  printf("gates enforced: %s\n", c.enforce_lock ? "all three"
                                 : c.enforce    ? "the first two (issue 15's)"
                                                : "none");
  bool ok = !rc && (!c.enforce || pass) && (!c.enforce_lock || lock_pass);
  if (c.self_check) ok &= self_check(&c, &s, pool);

  tko_pool_destroy(pool);
  pthread_barrier_destroy(&start);
  free(ps);
  return ok ? 0 : 1;
}
