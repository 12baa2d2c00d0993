/* SPDX-License-Identifier: MIT */
/* bench_inversion: the priority-quality run. P producers submit tasks of
 * ~10 us with weights 0-6 and 1% at weight 7 into W workers; the tasks
 * stamp their own start. Reports the weight-7 wait (submit to start) at
 * p50 and p99 and the late priority inversions of the bounded-inversion
 * contract: a start of a task of weight v at time s is late when some task
 * of a higher weight, whose submit had returned by s - delta, was still
 * queued at s (started after s). Measured from the tasks' own stamps, so
 * it judges any design the same way, whatever the pool counts itself. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench_common.h"
#include "taskorch.h"

enum { WEIGHTS = 8, HIGH = WEIGHTS - 1 };

typedef struct stamped {
  uint64_t submit_ns;   /* just before the submit call */
  uint64_t returned_ns; /* just after it returned */
  uint64_t start_ns;    /* the task's own start */
  int weight;
} stamped;

static uint64_t work_iters;

static int stamped_task(void *arg) {
  stamped *t = arg;
  t->start_ns = bench_now_ns();
  (void)bench_work(work_iters, t->start_ns);
  return 0;
}

typedef struct producer {
  pthread_t thread;
  tko_pool *pool;
  stamped *tasks;
  long n;
  pthread_barrier_t *go;
  int rc;
} producer;

static void *produce(void *arg) {
  producer *p = arg;
  pthread_barrier_wait(p->go);
  for (long i = 0; i < p->n && !p->rc; i++) {
    stamped *t = &p->tasks[i];
    t->submit_ns = bench_now_ns();
    p->rc = tko_submit(p->pool, stamped_task, t, t->weight);
    t->returned_ns = bench_now_ns();
  }
  return NULL;
}

static int by_returned(const void *a, const void *b) {
  const stamped *x = *(const stamped *const *)a, *y = *(const stamped *const *)b;
  return (x->returned_ns > y->returned_ns) - (x->returned_ns < y->returned_ns);
}

/* Counts late starts. For each weight w, the tasks of weight w sorted by
 * when their submit returned, with the latest start among each prefix: a
 * start s of a lower weight is late if the prefix returned by s - delta
 * holds a task that started after s. */
static long late_inversions(stamped *all, long n, uint64_t delta_ns) {
  long r = 0;
  stamped **by = malloc((size_t)n * sizeof *by);
  uint64_t *maxstart = malloc((size_t)n * sizeof *maxstart);
  char *is_late = calloc((size_t)n, 1); /* a start counts once, whatever weights it passed */
  if (!by || !maxstart || !is_late) bench_die("out of memory");
  for (int w = 1; w < WEIGHTS; w++) {
    long m = 0;
    for (long i = 0; i < n; i++)
      if (all[i].weight == w) by[m++] = &all[i];
    if (!m) continue;
    qsort(by, (size_t)m, sizeof *by, by_returned);
    for (long i = 0; i < m; i++)
      maxstart[i] = i && maxstart[i - 1] > by[i]->start_ns ? maxstart[i - 1] : by[i]->start_ns;
    for (long i = 0; i < n; i++) {
      if (all[i].weight >= w || all[i].start_ns < delta_ns) continue;
      uint64_t s = all[i].start_ns, cut = s - delta_ns;
      long lo = 0, hi = m; /* count of tasks returned by cut */
      while (lo < hi) {
        long mid = (lo + hi) / 2;
        if (by[mid]->returned_ns <= cut)
          lo = mid + 1;
        else
          hi = mid;
      }
      if (lo && maxstart[lo - 1] > s) is_late[i] = 1;
    }
  }
  for (long i = 0; i < n; i++)
    r += is_late[i];
  free(is_late);
  free(by);
  free(maxstart);
  return r;
}

typedef struct result {
  double ns_per_task, high_p50_us, high_p99_us, handbacks;
  long late;
} result;

static bench *the_bench;
static long queues; /* --queues: tko_options.queues */

static result run_once(long producers, long workers, long tasks, long high_every,
                       uint64_t delta_ns, long recheck_us) {
  tko_options o = tko_basic_options((unsigned)workers);
  o.recheck_us = (unsigned)recheck_us;
  o.queues = (unsigned)queues;
  tko_pool *pool;
  int rc = tko_pool_create(&pool, &o);
  if (rc) bench_die("tko_pool_create: %s", tko_strerror(rc));
  stamped *all = calloc((size_t)tasks, sizeof *all);
  producer *p = calloc((size_t)producers, sizeof *p);
  if (!all || !p) bench_die("out of memory");
  /* Weights 0-6 in turn, and every high_every-th task of a producer at 7. */
  long per = tasks / producers;
  for (long i = 0; i < producers * per; i++) {
    long k = i % per;
    all[i].weight = k % high_every == high_every / 2 ? HIGH : (int)(k % HIGH);
  }
  pthread_barrier_t go;
  pthread_barrier_init(&go, NULL, (unsigned)producers + 1);
  for (long i = 0; i < producers; i++) {
    p[i] = (producer){.pool = pool, .tasks = all + i * per, .n = per, .go = &go};
    if (pthread_create(&p[i].thread, NULL, produce, &p[i])) bench_die("pthread_create failed");
  }
  bench_wait_others_asleep(500);
  uint64_t t0 = bench_now_ns();
  pthread_barrier_wait(&go);
  for (long i = 0; i < producers; i++) {
    pthread_join(p[i].thread, NULL);
    if (p[i].rc) bench_die("submit failed: %s", tko_strerror(p[i].rc));
  }
  tko_pool_wait_idle(pool, -1);
  long n = producers * per;
  result r = {.ns_per_task = (double)(bench_now_ns() - t0) / (double)n};
  double *waits = malloc((size_t)n * sizeof *waits);
  if (!waits) bench_die("out of memory");
  size_t nh = 0;
  long unstarted = 0;
  for (long i = 0; i < n; i++)
    unstarted += all[i].start_ns == 0;
  bench_check(the_bench, unstarted == 0, "%ld of %ld tasks never started", unstarted, n);
  for (long i = 0; i < n; i++)
    if (all[i].weight == HIGH) waits[nh++] = (double)(all[i].start_ns - all[i].submit_ns) / 1e3;
  r.high_p50_us = nh ? bench_percentile(waits, nh, 50) : 0;
  r.high_p99_us = nh ? bench_percentile(waits, nh, 99) : 0;
  r.late = late_inversions(all, n, delta_ns);
  tko_stats st;
  tko_pool_stats(pool, &st);
  r.handbacks = (double)st.handbacks;
  free(waits);
  free(all);
  free(p);
  pthread_barrier_destroy(&go);
  tko_pool_destroy(pool);
  return r;
}

int main(int argc, char **argv) {
  long producers, workers, tasks, high_every, recheck_us;
  double work_ns, delta_us;
  bench_opt opts[] = {
      {"producers", BENCH_OPT_LONG, &producers, "8", "2", 1, 256, "producer threads"},
      {"workers", BENCH_OPT_LONG, &workers, "8", "2", 1, 1024, "pool workers"},
      {"tasks", BENCH_OPT_LONG, &tasks, "200000", "2000", 1, 1e9,
       "tasks per run, split among the producers"},
      {"work-ns", BENCH_OPT_DOUBLE, &work_ns, "10000", "1000", 0, 1e9,
       "arithmetic task length in ns"},
      {"high-every", BENCH_OPT_LONG, &high_every, "100", NULL, 2, 1e9,
       "one task in this many is weight 7 (100: 1%)"},
      {"delta-us", BENCH_OPT_DOUBLE, &delta_us, "100", NULL, 0, 1e9,
       "the inversion window: a lower-weight start this long after a higher-weight "
       "submit returned, while that task is still queued, is a late inversion"},
      {"recheck-us", BENCH_OPT_LONG, &recheck_us, "0", NULL, 0, 4294967295.0,
       "the pool's recheck_us (0: its default, 100 us); 4294967295 all but turns the "
       "recheck off"},
      {"queues", BENCH_OPT_LONG, &queues, "0", NULL, 0, TKO_MAX_QUEUES,
       "tko_options.queues (0: the default, one)"},
  };
  bench *b = bench_init(argc, argv, "bench_inversion",
                        "Priority quality under load (issue 15): weight-7 wait and late "
                        "inversions with P producers and W workers.",
                        opts, sizeof opts / sizeof opts[0]);
  the_bench = b;
  work_iters = bench_work_iters(work_ns);
  if (tasks < producers) bench_die("--tasks must be at least --producers");
  size_t runs = (size_t)b->runs;
  result *res = calloc(runs, sizeof *res);
  if (!res) bench_die("out of memory");
  for (size_t r = 0; r < runs; r++)
    res[r] = run_once(producers, workers, tasks, high_every, (uint64_t)(delta_us * 1e3),
                      recheck_us);
  bench_table *t = bench_table_new(b, "inversion", "priority quality (medians of runs)");
  double *v = calloc(runs, sizeof *v);
  if (!v) bench_die("out of memory");
  bench_row(t);
  bench_cell_int(t, "producers", producers);
  bench_cell_int(t, "workers", workers);
#define MEDIAN(key, fmt, field)                                                                    \
  do {                                                                                             \
    for (size_t r = 0; r < runs; r++)                                                              \
      v[r] = (double)res[r].field;                                                                 \
    bench_cell_num(t, key, fmt, bench_median(v, runs));                                            \
  } while (0)
  MEDIAN("ns/task", "%.1f", ns_per_task);
  MEDIAN("w7 wait p50 us", "%.1f", high_p50_us);
  MEDIAN("w7 wait p99 us", "%.1f", high_p99_us);
  MEDIAN("late inversions", "%.0f", late);
  MEDIAN("pool handbacks", "%.0f", handbacks);
#undef MEDIAN
  bench_table_print(t);
  bench_note(b, "late inversions: starts of a task while a higher-weight task whose submit "
                "had returned at least delta-us earlier was still queued (from the tasks' own "
                "stamps, all weights).");
  free(v);
  free(res);
  return bench_finish(b);
}
