/* SPDX-License-Identifier: MIT */
/* bench_concurrent: 1, 2, 4 and 8 producer threads enqueuing at once into
 * one pool, with empty and ~1 us tasks, one task per submit call or in
 * batches. Reports ns/task end to end (producers released together to
 * tko_pool_wait_idle returning), the producers' own cost per submit, and
 * how contended the pool was: the pool's lock_contended gauge and the
 * context switches the producers suffered (a producer that blocks or is
 * preempted mid-submit shows up there).
 *
 * Checks, after the timed runs: every run completed each of its tasks
 * (completed == submitted == tasks, none failed or cancelled), and one
 * untimed run per producer count and batch size on a one-worker pool
 * whose tasks record when they ran: each task ran exactly once, and each
 * producer's tasks of one weight ran in the order it submitted them (the
 * FIFO the pool promises within a weight). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "bench_common.h"
#include "taskorch.h"

static uint64_t work_iters;
enum { WEIGHTS_MAX = 64 };
static long weights; /* --weights: task i gets weight i % weights */
static long queues;  /* --queues: tko_options.queues */

static int empty_task(void *arg) {
  (void)arg;
  return 0;
}

static int work_task(void *arg) {
  (void)bench_work(work_iters, (uint64_t)(uintptr_t)arg);
  return 0;
}

/* The verification run's tasks: the one worker numbers them as they run.
 * Read after tko_pool_wait_idle, which orders the worker's writes first. */
typedef struct record {
  uint32_t runs;
  uint64_t seq;
} record;
static uint64_t next_seq;

static int record_task(void *arg) {
  record *r = arg;
  r->runs++;
  r->seq = next_seq++;
  return 0;
}

typedef struct producer {
  pthread_t thread;
  tko_pool *pool;
  tko_task_fn fn;
  long tasks, batch;
  record *recs; /* verification runs: task i's argument is &recs[i] */
  pthread_barrier_t *ready, *go;
  uint64_t submit_ns; /* the producer's own time in its submit loop */
  long vcsw, ivcsw;   /* its voluntary / involuntary context switches meanwhile */
  int rc;
} producer;

static void *producer_main(void *arg) {
  producer *p = arg;
  tko_task *batch = NULL;
  if (p->batch > 1) {
    batch = calloc((size_t)p->batch, sizeof *batch);
    if (!batch) bench_die("out of memory");
  }
  pthread_barrier_wait(p->ready);
  pthread_barrier_wait(p->go);
  struct rusage r0, r1;
  getrusage(RUSAGE_THREAD, &r0);
  uint64_t t0 = bench_now_ns();
  if (!batch) {
    for (long i = 0; i < p->tasks && !p->rc; i++)
      p->rc = tko_submit(p->pool, p->fn, p->recs ? (void *)&p->recs[i] : (void *)(uintptr_t)i,
                         (int)(i % weights));
  } else {
    for (long i = 0; i < p->tasks && !p->rc;) {
      long n = p->tasks - i < p->batch ? p->tasks - i : p->batch;
      for (long j = 0; j < n; j++)
        batch[j] = (tko_task){p->fn,
                              p->recs ? (void *)&p->recs[i + j] : (void *)(uintptr_t)(i + j),
                              (int)((i + j) % weights)};
      p->rc = tko_submit_batch(p->pool, batch, (size_t)n);
      i += n;
    }
  }
  p->submit_ns = bench_now_ns() - t0;
  getrusage(RUSAGE_THREAD, &r1);
  p->vcsw = r1.ru_nvcsw - r0.ru_nvcsw;
  p->ivcsw = r1.ru_nivcsw - r0.ru_nivcsw;
  free(batch);
  return NULL;
}

typedef struct result {
  double wall_ns, submit_ns_per_task, csw_per_ktask, contended_per_ktask;
} result;

/* Counts a run's tasks against what the pool says: a run that lost,
 * failed or cancelled a task is a failed check, not a figure. */
static bench *the_bench;

static result run_once(unsigned workers, long nprod, long tasks, tko_task_fn fn, long batch,
                       record *recs) {
  tko_options o = tko_basic_options(workers);
  o.queues = (unsigned)queues;
  tko_pool *pool;
  int rc = tko_pool_create(&pool, &o);
  if (rc) bench_die("tko_pool_create: %s", tko_strerror(rc));
  pthread_barrier_t ready, go;
  pthread_barrier_init(&ready, NULL, (unsigned)nprod + 1);
  pthread_barrier_init(&go, NULL, (unsigned)nprod + 1);
  producer *p = calloc((size_t)nprod, sizeof *p);
  if (!p) bench_die("out of memory");
  for (long i = 0; i < nprod; i++) {
    p[i] = (producer){.pool = pool,
                      .fn = fn,
                      .batch = batch,
                      .ready = &ready,
                      .go = &go,
                      .tasks = tasks / nprod + (i < tasks % nprod)};
    if (recs) {
      p[i].recs = recs;
      recs += p[i].tasks;
    }
    if (pthread_create(&p[i].thread, NULL, producer_main, &p[i]))
      bench_die("pthread_create failed");
  }
  pthread_barrier_wait(&ready);
  bench_wait_others_asleep(500); /* producers parked at the start line, workers asleep */
  tko_stats before, after;
  tko_pool_stats(pool, &before);
  uint64_t t0 = bench_now_ns();
  pthread_barrier_wait(&go);
  for (long i = 0; i < nprod; i++)
    pthread_join(p[i].thread, NULL);
  tko_pool_wait_idle(pool, -1);
  result r = {.wall_ns = (double)(bench_now_ns() - t0)};
  tko_pool_stats(pool, &after);
  double submit = 0, csw = 0;
  for (long i = 0; i < nprod; i++) {
    if (p[i].rc) bench_die("submit failed: %s", tko_strerror(p[i].rc));
    submit += (double)p[i].submit_ns / (double)(p[i].tasks ? p[i].tasks : 1);
    csw += (double)(p[i].vcsw + p[i].ivcsw);
  }
  r.submit_ns_per_task = submit / (double)nprod;
  r.csw_per_ktask = csw * 1000.0 / (double)tasks;
  r.contended_per_ktask =
      (double)(after.lock_contended - before.lock_contended) * 1000.0 / (double)tasks;
  bench_check(the_bench,
              after.submitted == (uint64_t)tasks && after.completed == (uint64_t)tasks &&
                  after.failed == 0 && after.cancelled == 0 && after.queued == 0,
              "%ld producers, batch %ld: %llu submitted, %llu completed, %llu failed, %llu "
              "cancelled, %llu queued of %ld tasks",
              nprod, batch, (unsigned long long)after.submitted,
              (unsigned long long)after.completed, (unsigned long long)after.failed,
              (unsigned long long)after.cancelled, (unsigned long long)after.queued, tasks);
  free(p);
  pthread_barrier_destroy(&ready);
  pthread_barrier_destroy(&go);
  tko_pool_destroy(pool);
  return r;
}

/* Untimed runs on one worker: exactly once, and FIFO per producer and weight. */
static void verify(bench *b, const bench_list *prods, const bench_list *batches, long tasks) {
  record *recs = calloc((size_t)tasks, sizeof *recs);
  if (!recs) bench_die("out of memory");
  for (size_t bi = 0; bi < batches->n; bi++)
    for (size_t pi = 0; pi < prods->n; pi++) {
      long nprod = prods->v[pi];
      memset(recs, 0, (size_t)tasks * sizeof *recs);
      next_seq = 0;
      run_once(1, nprod, tasks, record_task, batches->v[bi], recs);
      long not_once = 0, out_of_order = 0;
      record *r = recs;
      for (long pr = 0; pr < nprod; pr++) {
        long n = tasks / nprod + (pr < tasks % nprod);
        uint64_t last[WEIGHTS_MAX] = {0};
        bool seen[WEIGHTS_MAX] = {false};
        for (long i = 0; i < n; i++) {
          if (r[i].runs != 1) {
            not_once++;
            continue;
          }
          int w = (int)(i % weights);
          if (seen[w] && r[i].seq < last[w]) out_of_order++;
          last[w] = r[i].seq;
          seen[w] = true;
        }
        r += n;
      }
      bench_check(b, not_once == 0 && out_of_order == 0,
                  "%ld producers, batch %ld, %ld tasks on 1 worker: %ld tasks did not run exactly "
                  "once, %ld ran before an earlier task of the same producer and weight",
                  nprod, batches->v[bi], tasks, not_once, out_of_order);
    }
  free(recs);
}

int main(int argc, char **argv) {
  bench_list prods, batches;
  long workers, empty_tasks, work_tasks;
  double work_ns;
  bench_opt opts[] = {
      {"producers", BENCH_OPT_LIST, &prods, "1,2,4,8", "1,2", 1, 256, "producer thread counts"},
      {"workers", BENCH_OPT_LONG, &workers, "2", NULL, 1, 1024, "pool workers"},
      {"empty-tasks", BENCH_OPT_LONG, &empty_tasks, "1000000", "2000", 1, 1e9,
       "empty tasks per case, split among the producers"},
      {"work-tasks", BENCH_OPT_LONG, &work_tasks, "200000", "400", 1, 1e9,
       "arithmetic tasks per case, split among the producers"},
      {"work-ns", BENCH_OPT_DOUBLE, &work_ns, "1000", NULL, 1, 1e9, "arithmetic task length in ns"},
      {"batch", BENCH_OPT_LIST, &batches, "1,64", NULL, 1, 1000000,
       "tasks per submit call (1 = tko_submit, more = tko_submit_batch)"},
      {"weights", BENCH_OPT_LONG, &weights, "4", NULL, 1, WEIGHTS_MAX,
       "distinct weights, interleaved (task i gets i % weights)"},
      {"queues", BENCH_OPT_LONG, &queues, "0", NULL, 0, TKO_MAX_QUEUES,
       "tko_options.queues (0: the default, one)"},
  };
  bench *b = the_bench = bench_init(argc, argv, "bench_concurrent",
                        "Several producer threads enqueuing into one pool at once (interleaved "
                        "weights): ns/task end to end, the producers' cost per submit, and "
                        "contention.",
                        opts, sizeof opts / sizeof opts[0]);
  work_iters = bench_work_iters(work_ns);
  bench_config(b, "arithmetic task", "%llu iterations of bench_work at %.3f ns each",
               (unsigned long long)work_iters, bench_work_calibrate());

  size_t runs = (size_t)b->runs;
  size_t ncase = 2 * batches.n * prods.n;
  result *res = calloc(ncase * runs, sizeof *res);
  if (!res) bench_die("out of memory");
  /* Interleave: every case once per round, so noise spreads evenly. */
  for (size_t r = 0; r < runs; r++) {
    size_t c = 0;
    for (int kind = 0; kind < 2; kind++)
      for (size_t bi = 0; bi < batches.n; bi++)
        for (size_t pi = 0; pi < prods.n; pi++, c++)
          res[c * runs + r] =
              run_once((unsigned)workers, prods.v[pi], kind ? work_tasks : empty_tasks,
                       kind ? work_task : empty_task, batches.v[bi], NULL);
  }

  bench_table *t = bench_table_new(b, "concurrent", "concurrent enqueue, end to end");
  double *v = calloc(runs, sizeof *v);
  if (!v) bench_die("out of memory");
  size_t c = 0;
  for (int kind = 0; kind < 2; kind++)
    for (size_t bi = 0; bi < batches.n; bi++)
      for (size_t pi = 0; pi < prods.n; pi++, c++) {
        long tasks = kind ? work_tasks : empty_tasks;
        result *rr = &res[c * runs];
        bench_row(t);
        if (kind)
          bench_cell_str(t, "task", "%.0f ns", work_ns);
        else
          bench_cell_str(t, "task", "empty");
        bench_cell_int(t, "batch", batches.v[bi]);
        bench_cell_int(t, "producers", prods.v[pi]);
        bench_cell_int(t, "tasks", tasks);
        for (size_t r = 0; r < runs; r++)
          v[r] = rr[r].wall_ns / (double)tasks;
        bench_cell_num(t, "ns/task", "%.1f", bench_median(v, runs));
        bench_cell_num(t, "min", "%.1f", bench_min(v, runs));
        bench_cell_num(t, "max", "%.1f", bench_max(v, runs));
        for (size_t r = 0; r < runs; r++)
          v[r] = rr[r].submit_ns_per_task;
        bench_cell_num(t, "submit ns", "%.1f", bench_median(v, runs));
        for (size_t r = 0; r < runs; r++)
          v[r] = rr[r].contended_per_ktask;
        bench_cell_num(t, "lock contended /1k", "%.2f", bench_median(v, runs));
        for (size_t r = 0; r < runs; r++)
          v[r] = rr[r].csw_per_ktask;
        bench_cell_num(t, "producer ctx sw /1k", "%.2f", bench_median(v, runs));
      }
  bench_table_print(t);
  bench_note(b,
             "submit ns: a producer's time in its submit loop per task (mean over producers). "
             "lock contended: the pool's lock_contended gauge (a worker or full-inbox submitter "
             "waited for the queue lock), per 1000 tasks. producer ctx sw: voluntary plus "
             "involuntary context switches of the producers during their loops, per 1000 tasks.");
  free(v);
  free(res);
  verify(b, &prods, &batches, empty_tasks < 20000 ? empty_tasks : 20000);
  return bench_finish(b);
}
