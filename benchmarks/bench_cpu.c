/* SPDX-License-Identifier: MIT */
/* bench_cpu: CPU-bound tasks (a couple of microseconds of real arithmetic
 * each, mixed weights) on a basic and an elastic pool, end to end (first
 * submit to tko_pool_wait_idle returning), against running the same tasks
 * inline on one thread. Reports ns/task, tasks/s and the speedup over
 * inline; every run's results are compared with the inline ones, so a lost
 * or doubled task shows up as a failed check. Two reference rows run the
 * same tasks on plain threads, no pool: already spinning (the machine's
 * ceiling for the speedup) and created at the first instant. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdatomic.h>
#include <string.h>

#include "bench_common.h"
#include "taskorch.h"

typedef struct cpu_task {
  uint64_t iters, seed;
  uint64_t result; /* written by the task, compared with the inline run */
} cpu_task;

/* When the run's first task started (0 = none yet): how long the pool took
 * to get a worker going is part of every end-to-end figure, and on a VM
 * waking a sleeping thread can cost a large share of a 2 ms job. */
static _Atomic uint64_t first_start_ns;

/* And when the last thread to join in ran its first task of the run: how
 * long the pool took to get every worker going (the run number tells a
 * thread that it has not counted itself in this run yet). */
static _Atomic uint64_t run_number, last_join_ns;
static _Thread_local uint64_t joined_run;

static int cpu_task_fn(void *arg) {
  cpu_task *t = arg;
  if (!atomic_load_explicit(&first_start_ns, memory_order_relaxed)) {
    uint64_t none = 0;
    atomic_compare_exchange_strong(&first_start_ns, &none, bench_now_ns());
  }
  uint64_t run = atomic_load_explicit(&run_number, memory_order_relaxed);
  if (joined_run != run) {
    joined_run = run;
    uint64_t now = bench_now_ns(), seen = atomic_load(&last_join_ns);
    while (seen < now && !atomic_compare_exchange_weak(&last_join_ns, &seen, now)) {
    }
  }
  t->result = bench_work(t->iters, t->seed);
  return 0;
}

/* Weights spread over negative and positive values, so the queue really
 * orders (and the benchmark pays for it), as a mixed-priority host would. */
static int weight_of(long i) {
  return (int)(i % 7) - 3;
}

static void prepare(cpu_task *tasks, long n, double mean_ns) {
  for (long i = 0; i < n; i++) {
    /* Lengths 0.75x .. 1.25x the mean, in a fixed pattern. */
    double f = 0.75 + 0.125 * (double)((i * 7) % 5);
    tasks[i] = (cpu_task){bench_work_iters(mean_ns * f), (uint64_t)i + 1, 0};
  }
}

/* Starts a run's clocks; the task threads count themselves in again. */
static void begin_run(void) {
  atomic_store(&first_start_ns, 0);
  atomic_store(&last_join_ns, 0);
  atomic_fetch_add(&run_number, 1);
}

static double run_inline(cpu_task *tasks, long n, double *first_us, double *last_us) {
  begin_run();
  uint64_t t0 = bench_now_ns();
  for (long i = 0; i < n; i++)
    cpu_task_fn(&tasks[i]);
  double ns = (double)(bench_now_ns() - t0);
  *first_us = (double)(atomic_load(&first_start_ns) - t0) / 1e3;
  *last_us = (double)(atomic_load(&last_join_ns) - t0) / 1e3;
  return ns;
}

/* One end-to-end run on a fresh pool; returns wall ns, fills *peak and
 * *first_us (first submit to first task start). */
static double run_pool(const tko_options *o, cpu_task *tasks, long n, unsigned *peak,
                       double *first_us, double *last_us) {
  tko_pool *pool;
  int rc = tko_pool_create(&pool, o);
  if (rc) bench_die("tko_pool_create: %s", tko_strerror(rc));
  bench_wait_others_asleep(500);
  begin_run();
  uint64_t t0 = bench_now_ns();
  for (long i = 0; i < n; i++)
    if ((rc = tko_submit(pool, cpu_task_fn, &tasks[i], weight_of(i))) != 0)
      bench_die("tko_submit: %s", tko_strerror(rc));
  tko_pool_wait_idle(pool, -1);
  double ns = (double)(bench_now_ns() - t0);
  *first_us = (double)(atomic_load(&first_start_ns) - t0) / 1e3;
  *last_us = (double)(atomic_load(&last_join_ns) - t0) / 1e3;
  tko_stats st;
  tko_pool_stats(pool, &st);
  *peak = st.elastic_peak;
  tko_pool_destroy(pool);
  return ns;
}

/* Reference rows, no pool: the same tasks dealt out in a fixed interleave
 * (thread k runs tasks k, k + T, ...) to T plain threads. "spinning"
 * threads already run, waiting on a flag, so nobody is woken: what T
 * threads can do with these tasks on this machine, the ceiling for any
 * pool. "started" threads are created at the first instant, so they pay
 * what a pool whose workers sleep pays to get going. Both end when the
 * measuring thread's join returns, as a pool run ends when its wait
 * returns. */
typedef struct share {
  pthread_t thread;
  cpu_task *tasks;
  long n, first, step;
  atomic_int *go; /* NULL: start at once */
} share;

static void *run_share(void *arg) {
  share *sh = arg;
  if (sh->go)
    while (!atomic_load_explicit(sh->go, memory_order_acquire)) /* pairs with the release */
      bench_cpu_relax();
  for (long i = sh->first; i < sh->n; i += sh->step)
    cpu_task_fn(&sh->tasks[i]);
  return NULL;
}

static double run_threads(cpu_task *tasks, long n, long nthreads, bool spinning, double *first_us,
                          double *last_us) {
  share *sh = calloc((size_t)nthreads, sizeof *sh);
  if (!sh) bench_die("out of memory");
  atomic_int go = 0;
  for (long k = 0; k < nthreads; k++)
    sh[k] = (share){.tasks = tasks, .n = n, .first = k, .step = nthreads,
                    .go = spinning ? &go : NULL};
  if (spinning)
    for (long k = 0; k < nthreads; k++)
      if (pthread_create(&sh[k].thread, NULL, run_share, &sh[k]))
        bench_die("pthread_create failed");
  begin_run();
  uint64_t t0 = bench_now_ns();
  if (spinning)
    atomic_store_explicit(&go, 1, memory_order_release); /* pairs with run_share's acquire */
  else
    for (long k = 0; k < nthreads; k++)
      if (pthread_create(&sh[k].thread, NULL, run_share, &sh[k]))
        bench_die("pthread_create failed");
  for (long k = 0; k < nthreads; k++)
    pthread_join(sh[k].thread, NULL);
  double ns = (double)(bench_now_ns() - t0);
  *first_us = (double)(atomic_load(&first_start_ns) - t0) / 1e3;
  *last_us = (double)(atomic_load(&last_join_ns) - t0) / 1e3;
  free(sh);
  return ns;
}

int main(int argc, char **argv) {
  bench_list sizes;
  double task_ns;
  long workers, ebasic, emax, eidle;
  unsigned cpus = bench_cpus();
  char def_workers[16], def_ebasic[16], def_emax[16];
  snprintf(def_workers, sizeof def_workers, "%u", cpus);
  snprintf(def_ebasic, sizeof def_ebasic, "%u", cpus / 2 ? cpus / 2 : 1);
  snprintf(def_emax, sizeof def_emax, "%u", cpus);
  bench_opt opts[] = {
      {"tasks", BENCH_OPT_LIST, &sizes, "1000,10000", "200", 1, 1e8, "task counts to run"},
      {"task-ns", BENCH_OPT_DOUBLE, &task_ns, "2000", NULL, 1, 1e9,
       "mean task length in ns; tasks run 0.75x to 1.25x of it"},
      {"workers", BENCH_OPT_LONG, &workers, def_workers, NULL, 1, 1024,
       "basic pool workers (the CPU count)"},
      {"elastic-basic", BENCH_OPT_LONG, &ebasic, def_ebasic, NULL, 0, 1024,
       "elastic pool's basic workers (half the CPUs, as in the original's example)"},
      {"elastic-max", BENCH_OPT_LONG, &emax, def_emax, NULL, 1, 1024,
       "elastic pool's extra workers (the CPU count)"},
      {"elastic-idle-ms", BENCH_OPT_LONG, &eidle, "500", NULL, 1, 3600000, "elastic idle timeout"},
  };
  bench *b = bench_init(argc, argv, "bench_cpu",
                        "CPU-bound tasks of real arithmetic with mixed weights, basic and elastic "
                        "pools, end to end (first submit to last completion), against the same "
                        "tasks run inline on one thread.",
                        opts, sizeof opts / sizeof opts[0]);
  bench_config(b, "arithmetic", "bench_work at %.3f ns per iteration (calibrated now)",
               bench_work_calibrate());

  tko_options basic = tko_basic_options((unsigned)workers);
  tko_options elastic = tko_elastic_options((unsigned)ebasic, (unsigned)emax, (unsigned)eidle);
  enum { INLINE, BASIC, ELASTIC, SPINNING, STARTED, ROWS };
  char label[ROWS][64];
  snprintf(label[INLINE], sizeof label[INLINE], "inline (1 thread)");
  snprintf(label[BASIC], sizeof label[BASIC], "basic %ld", workers);
  snprintf(label[ELASTIC], sizeof label[ELASTIC], "elastic %ld+%ld", ebasic, emax);
  snprintf(label[SPINNING], sizeof label[SPINNING], "no pool: %ld threads spinning", workers);
  snprintf(label[STARTED], sizeof label[STARTED], "no pool: %ld threads started", workers);

  size_t runs = (size_t)b->runs;
  double *res = calloc(sizes.n * ROWS * runs, sizeof *res);
  double *first = calloc(sizes.n * ROWS * runs, sizeof *first);
  double *last = calloc(sizes.n * ROWS * runs, sizeof *last);
  unsigned *peak = calloc(sizes.n * runs, sizeof *peak);
  if (!res || !first || !last || !peak) bench_die("out of memory");
#define RES(s, p, r) res[((s)*ROWS + (p)) * runs + (r)]
#define FIRST(s, p, r) first[((s)*ROWS + (p)) * runs + (r)]
#define LAST(s, p, r) last[((s)*ROWS + (p)) * runs + (r)]
  for (size_t r = 0; r < runs; r++) {
    for (size_t s = 0; s < sizes.n; s++) {
      long n = sizes.v[s];
      cpu_task *expect = calloc((size_t)n, sizeof *expect);
      cpu_task *tasks = calloc((size_t)n, sizeof *tasks);
      if (!expect || !tasks) bench_die("out of memory");
      prepare(expect, n, task_ns);
      RES(s, INLINE, r) = run_inline(expect, n, &FIRST(s, INLINE, r), &LAST(s, INLINE, r));
      for (int p = BASIC; p < ROWS; p++) {
        prepare(tasks, n, task_ns);
        unsigned pk = 0;
        if (p == BASIC || p == ELASTIC)
          RES(s, p, r) = run_pool(p == BASIC ? &basic : &elastic, tasks, n, &pk, &FIRST(s, p, r),
                                  &LAST(s, p, r));
        else
          RES(s, p, r) = run_threads(tasks, n, workers, p == SPINNING, &FIRST(s, p, r),
                                     &LAST(s, p, r));
        if (p == ELASTIC) peak[s * runs + r] = pk;
        long bad = 0;
        for (long i = 0; i < n; i++)
          bad += tasks[i].result != expect[i].result;
        bench_check(b, bad == 0, "%s, %ld tasks: %ld results differ from inline", label[p], n, bad);
      }
      free(expect);
      free(tasks);
    }
  }

  bench_table *t = bench_table_new(b, "cpu", "CPU-bound tasks, end to end");
  for (size_t s = 0; s < sizes.n; s++) {
    double inline_med = bench_median(&RES(s, INLINE, 0), runs);
    for (int p = 0; p < ROWS; p++) {
      double *v = &RES(s, p, 0);
      double med = bench_median(v, runs), n = (double)sizes.v[s];
      bench_row(t);
      bench_cell_str(t, "pool", "%s", label[p]);
      bench_cell_int(t, "tasks", sizes.v[s]);
      bench_cell_num(t, "ns/task", "%.1f", med / n);
      bench_cell_num(t, "min", "%.1f", bench_min(v, runs) / n);
      bench_cell_num(t, "max", "%.1f", bench_max(v, runs) / n);
      bench_cell_num(t, "tasks/s", "%.0f", n / med * 1e9);
      bench_cell_num(t, "speedup vs inline", "%.2f", inline_med / med);
      bench_cell_num(t, "first task us", "%.1f", bench_median(&FIRST(s, p, 0), runs));
      bench_cell_num(t, "last thread in us", "%.1f", bench_median(&LAST(s, p, 0), runs));
      if (p == ELASTIC) {
        unsigned mx = 0;
        for (size_t r = 0; r < runs; r++)
          if (peak[s * runs + r] > mx) mx = peak[s * runs + r];
        bench_cell_int(t, "elastic peak", mx);
      } else {
        bench_cell_str(t, "elastic peak", "-");
      }
    }
  }
  bench_table_print(t);
  bench_note(b,
             "speedup = inline median / pool median for the same tasks; the ideal on %u CPUs is "
             "%u.00, less what the submitting thread itself needs.",
             bench_cpus(), bench_cpus());
  bench_note(b, "no pool: the same tasks dealt out to %ld plain threads in a fixed "
                "interleave, no queue; \"spinning\" threads were already running (no wake-up "
                "to pay: the most %ld threads do with these tasks here, a ceiling for any "
                "pool), \"started\" ones are created at the first instant.",
             workers, workers);
  bench_note(b, "first task us: median time from the first submit to the first task's start "
                "(the workers are asleep when a run begins); last thread in us: to the first "
                "task of the last thread that ran any.");
  free(res);
  free(first);
  free(last);
  free(peak);
  return bench_finish(b);
}
