/* bench_cpu: CPU-bound tasks (a couple of microseconds of real arithmetic
 * each, mixed weights) on a basic and an elastic pool, end to end (first
 * submit to tko_pool_wait_idle returning), against running the same tasks
 * inline on one thread. Reports ns/task, tasks/s and the speedup over
 * inline; every run's results are compared with the inline ones, so a lost
 * or doubled task shows up as a failed check. */
#define _GNU_SOURCE
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
  const char *pool_name[3] = {"inline (1 thread)", "basic", "elastic"};
  char label[3][64];
  snprintf(label[0], sizeof label[0], "%s", pool_name[0]);
  snprintf(label[1], sizeof label[1], "basic %ld", workers);
  snprintf(label[2], sizeof label[2], "elastic %ld+%ld", ebasic, emax);

  size_t runs = (size_t)b->runs;
  double *res = calloc(sizes.n * 3 * runs, sizeof *res);
  double *first = calloc(sizes.n * 3 * runs, sizeof *first);
  double *last = calloc(sizes.n * 3 * runs, sizeof *last);
  unsigned *peak = calloc(sizes.n * runs, sizeof *peak);
  if (!res || !first || !last || !peak) bench_die("out of memory");
#define RES(s, p, r) res[((s)*3 + (p)) * runs + (r)]
#define FIRST(s, p, r) first[((s)*3 + (p)) * runs + (r)]
#define LAST(s, p, r) last[((s)*3 + (p)) * runs + (r)]
  for (size_t r = 0; r < runs; r++) {
    for (size_t s = 0; s < sizes.n; s++) {
      long n = sizes.v[s];
      cpu_task *expect = calloc((size_t)n, sizeof *expect);
      cpu_task *tasks = calloc((size_t)n, sizeof *tasks);
      if (!expect || !tasks) bench_die("out of memory");
      prepare(expect, n, task_ns);
      RES(s, 0, r) = run_inline(expect, n, &FIRST(s, 0, r), &LAST(s, 0, r));
      for (int p = 1; p <= 2; p++) {
        prepare(tasks, n, task_ns);
        unsigned pk = 0;
        RES(s, p, r) = run_pool(p == 1 ? &basic : &elastic, tasks, n, &pk, &FIRST(s, p, r),
                                &LAST(s, p, r));
        if (p == 2) peak[s * runs + r] = pk;
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
    double inline_med = bench_median(&RES(s, 0, 0), runs);
    for (int p = 0; p < 3; p++) {
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
      if (p == 2) {
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
  bench_note(b, "first task us: median time from the first submit to the first task's start "
                "(the workers are asleep when a run begins); last thread in us: to the first "
                "task of the last thread that ran any.");
  free(res);
  free(first);
  free(last);
  free(peak);
  return bench_finish(b);
}
