/* SPDX-License-Identifier: MIT */
/* bench_mixed: half CPU-bound, half I/O-bound tasks with mixed weights,
 * submitted in one burst, on a basic and an elastic pool. Reports each
 * weight's queue wait (submit to start) at p50 and p99, so priority is
 * visible: higher weights should wait less. Waits are measured by the tasks
 * themselves (the producer stamps each task just before submitting it; the
 * task stamps its own start), so no hook changes what the pool does.
 *
 * Checks: every task started, and, in one untimed run of the same mix on a
 * paused one-worker pool, resumed once everything is queued, the tasks
 * start in the order the pool promises: higher weights first, submit
 * order within a weight. */
#define _GNU_SOURCE
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"
#include "taskorch.h"

typedef struct mixed_task {
  uint64_t submit_ns, start_ns;
  uint64_t iters; /* CPU tasks: arithmetic; 0 for I/O tasks */
  uint64_t io_ns; /* I/O tasks: sleep */
  int weight;
  bool hint;      /* I/O tasks announce the sleep with tko_blocking_begin/end */
  uint64_t seq;   /* start order (meaningful in the one-worker order check only) */
} mixed_task;

/* The order check's start sequence: only its one worker writes it, and it
 * is read after tko_pool_wait_idle. */
static uint64_t start_seq;

/* The order check's task: it records only when it started. */
static int order_fn(void *arg) {
  mixed_task *t = arg;
  t->seq = start_seq++;
  return 0;
}

static int mixed_fn(void *arg) {
  mixed_task *t = arg;
  t->start_ns = bench_now_ns();
  if (t->iters)
    (void)bench_work(t->iters, t->start_ns);
  else if (t->hint) {
    tko_blocking_begin();
    bench_sleep_ns(t->io_ns);
    tko_blocking_end();
  } else {
    bench_sleep_ns(t->io_ns);
  }
  return 0;
}

/* The mix on a paused pool of one worker, resumed once all is queued:
 * checks that the tasks start by weight (higher first), FIFO within one. */
static void check_order(bench *b, mixed_task *tk, long tasks, const bench_list *weights,
                        uint64_t iters) {
  for (long i = 0; i < tasks; i++)
    tk[i] = (mixed_task){.iters = i % 2 ? 0 : iters,
                         .weight = (int)weights->v[(size_t)(i / 2) % weights->n]};
  tko_options o = tko_basic_options(1);
  tko_pool *pool;
  int rc = tko_pool_create(&pool, &o);
  if (rc) bench_die("tko_pool_create: %s", tko_strerror(rc));
  tko_pool_pause(pool);
  start_seq = 0;
  for (long i = 0; i < tasks; i++)
    if ((rc = tko_submit(pool, order_fn, &tk[i], tk[i].weight)) != 0)
      bench_die("tko_submit: %s", tko_strerror(rc));
  tko_pool_resume(pool);
  tko_pool_wait_idle(pool, -1);
  tko_pool_destroy(pool);
  /* Task i must start after every task j that outranks it. */
  long wrong = 0, first_i = -1, first_j = -1;
  for (long i = 0; i < tasks; i++)
    for (long j = 0; j < tasks; j++) {
      bool before = tk[j].weight > tk[i].weight || (tk[j].weight == tk[i].weight && j < i);
      if (before && tk[j].seq > tk[i].seq) {
        if (!wrong++) first_i = i, first_j = j;
      }
    }
  bench_check(b, wrong == 0,
              "order on a paused 1-worker pool: %ld pairs started out of weight/FIFO order (first: "
              "task %ld, weight %d, started before task %ld, weight %d)",
              wrong, first_i, first_i >= 0 ? tk[first_i].weight : 0, first_j,
              first_j >= 0 ? tk[first_j].weight : 0);
}

int main(int argc, char **argv) {
  long tasks, workers, ebasic, emax, eidle, io_us;
  double cpu_ns;
  bench_list weights;
  bench_opt opts[] = {
      {"tasks", BENCH_OPT_LONG, &tasks, "2000", "80", 2, 1e7, "tasks per run (half CPU, half I/O)"},
      {"weights", BENCH_OPT_LIST, &weights, "0,1,2,3", NULL, -2147483648.0, 2147483647.0,
       "weights, assigned round-robin to pairs of tasks"},
      {"cpu-ns", BENCH_OPT_DOUBLE, &cpu_ns, "2000", NULL, 1, 1e9, "CPU task length in ns"},
      {"io-us", BENCH_OPT_LONG, &io_us, "1000", "200", 0, 1e8, "I/O task sleep in us"},
      {"workers", BENCH_OPT_LONG, &workers, "2", NULL, 1, 1024, "basic pool workers"},
      {"elastic-basic", BENCH_OPT_LONG, &ebasic, "2", NULL, 0, 1024,
       "elastic pool's basic workers"},
      {"elastic-max", BENCH_OPT_LONG, &emax, "14", "2", 1, 1024, "elastic pool's extra workers"},
      {"elastic-idle-ms", BENCH_OPT_LONG, &eidle, "1000", NULL, 1, 3600000, "elastic idle timeout"},
  };
  bench *b = bench_init(argc, argv, "bench_mixed",
                        "Half CPU-bound, half I/O-bound tasks with mixed weights in one burst: "
                        "queue wait (submit to start) per weight at p50/p99, so priority shows.",
                        opts, sizeof opts / sizeof opts[0]);
  uint64_t iters = bench_work_iters(cpu_ns);
  bench_config(b, "tasks",
               "task i is CPU-bound if i is even, I/O (sleep) if odd; weight = "
               "weights[(i / 2) %% %zu]",
               weights.n);

  /* Pool 2 is pool 1 with the blocking hint around every I/O sleep. */
  enum { NPOOLS = 3 };
  tko_options pools[NPOOLS] = {
      tko_basic_options((unsigned)workers),
      tko_elastic_options((unsigned)ebasic, (unsigned)emax, (unsigned)eidle),
      tko_elastic_options((unsigned)ebasic, (unsigned)emax, (unsigned)eidle)};
  char label[NPOOLS][48];
  snprintf(label[0], sizeof label[0], "basic %ld", workers);
  snprintf(label[1], sizeof label[1], "elastic %ld+%ld", ebasic, emax);
  snprintf(label[2], sizeof label[2], "elastic %ld+%ld, hint", ebasic, emax);

  size_t runs = (size_t)b->runs;
  mixed_task *tk = calloc((size_t)tasks, sizeof *tk);
  /* waits[p][w]: every run's waits for pool p and weight index w. */
  double *waits[NPOOLS][BENCH_LIST_MAX] = {{0}};
  size_t nwait[NPOOLS][BENCH_LIST_MAX] = {{0}};
  double *cpu_waits[NPOOLS]; /* CPU tasks only: do they wait behind blocked I/O? */
  size_t ncpu[NPOOLS] = {0};
  double *wall[NPOOLS];
  for (int p = 0; p < NPOOLS; p++) {
    wall[p] = calloc(runs, sizeof *wall[p]);
    cpu_waits[p] = calloc((size_t)tasks * runs, sizeof(double));
    if (!wall[p] || !cpu_waits[p]) bench_die("out of memory");
    for (size_t w = 0; w < weights.n; w++)
      waits[p][w] = calloc((size_t)tasks * runs, sizeof(double));
  }
  if (!tk) bench_die("out of memory");

  for (size_t r = 0; r < runs; r++)
    for (int p = 0; p < NPOOLS; p++) {
      for (long i = 0; i < tasks; i++)
        tk[i] = (mixed_task){.iters = i % 2 ? 0 : iters,
                             .io_ns = (uint64_t)io_us * 1000u,
                             .weight = (int)weights.v[(size_t)(i / 2) % weights.n],
                             .hint = p == 2};
      tko_pool *pool;
      int rc = tko_pool_create(&pool, &pools[p]);
      if (rc) bench_die("tko_pool_create: %s", tko_strerror(rc));
      bench_wait_others_asleep(500);
      uint64_t t0 = bench_now_ns();
      for (long i = 0; i < tasks; i++) {
        tk[i].submit_ns = bench_now_ns();
        if ((rc = tko_submit(pool, mixed_fn, &tk[i], tk[i].weight)) != 0)
          bench_die("tko_submit: %s", tko_strerror(rc));
      }
      tko_pool_wait_idle(pool, -1);
      wall[p][r] = (double)(bench_now_ns() - t0);
      tko_pool_destroy(pool);
      for (long i = 0; i < tasks; i++) {
        size_t w = (size_t)(i / 2) % weights.n;
        bench_check(b, tk[i].start_ns >= tk[i].submit_ns, "%s: task %ld never started", label[p],
                    i);
        waits[p][w][nwait[p][w]++] = (double)(tk[i].start_ns - tk[i].submit_ns);
        if (tk[i].iters) cpu_waits[p][ncpu[p]++] = (double)(tk[i].start_ns - tk[i].submit_ns);
      }
    }

  bench_table *t = bench_table_new(b, "mixed", "queue wait per weight (all runs pooled)");
  for (int p = 0; p < NPOOLS; p++)
    for (size_t w = weights.n; w-- > 0;) {
      double *v = waits[p][w];
      size_t n = nwait[p][w];
      bench_row(t);
      bench_cell_str(t, "pool", "%s", label[p]);
      bench_cell_int(t, "weight", weights.v[w]);
      bench_cell_int(t, "tasks", (long long)n);
      bench_cell_num(t, "wait p50 ms", "%.3f", bench_percentile(v, n, 50) / 1e6);
      bench_cell_num(t, "wait p99 ms", "%.3f", bench_percentile(v, n, 99) / 1e6);
      bench_cell_num(t, "wait max ms", "%.3f", bench_max(v, n) / 1e6);
      bench_cell_num(t, "run wall ms", "%.2f", bench_median(wall[p], runs) / 1e6);
    }
  bench_table_print(t);
  bench_table *c = bench_table_new(b, "cpu_wait",
                                   "queue wait of the CPU tasks only (behind blocked I/O?)");
  for (int p = 0; p < NPOOLS; p++) {
    bench_row(c);
    bench_cell_str(c, "pool", "%s", label[p]);
    bench_cell_int(c, "cpu tasks", (long long)ncpu[p]);
    bench_cell_num(c, "wait p50 ms", "%.3f", bench_percentile(cpu_waits[p], ncpu[p], 50) / 1e6);
    bench_cell_num(c, "wait p99 ms", "%.3f", bench_percentile(cpu_waits[p], ncpu[p], 99) / 1e6);
    bench_cell_num(c, "run wall ms", "%.2f", bench_median(wall[p], runs) / 1e6);
  }
  bench_table_print(c);
  bench_note(b,
             "run wall ms: median time for the whole burst on that pool (same for each weight's "
             "row). A worker takes up to max_batch (default 64) queued tasks at a time, so a "
             "burst's first tasks may start before higher weights submitted just after them.");
  for (int p = 0; p < NPOOLS; p++) {
    free(wall[p]);
    free(cpu_waits[p]);
    for (size_t w = 0; w < weights.n; w++)
      free(waits[p][w]);
  }
  check_order(b, tk, tasks < 2000 ? tasks : 2000, &weights, iters);
  free(tk);
  return bench_finish(b);
}
