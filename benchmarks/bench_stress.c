/* SPDX-License-Identifier: MIT */
/* bench_stress: many tasks, many weights, several producers, and bursts
 * that make elastic workers spawn and retire over and over; checks that
 * every task ran exactly once and that the pool's counts return to zero.
 *
 * Throughput cases: 5,000, 10,000 and 1,000,000 tasks with weights spread
 * over the whole int range (extremes included), from one producer and from
 * several, on a basic and an elastic pool; each task marks its own slot, so
 * a lost or doubled task is found. Burst cases: a burst of short blocking
 * tasks wakes elastic workers, then the benchmark waits (on the pool's
 * thread_stop hook, not a sleep) until all of them have retired, and checks
 * that elastic_workers is back to 0 and spawned == retired. */
#define _GNU_SOURCE
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"
#include "taskorch.h"

/* ---- throughput -------------------------------------------------------------- */

static unsigned char *marks; /* one per task: set by that task alone */

static int mark_task(void *arg) {
  marks[(uintptr_t)arg]++;
  return 0;
}

/* Weights from a fixed-seed generator, with the extremes mixed in. */
static int weight_of(uint64_t i) {
  uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ULL;
  x ^= x >> 29;
  switch (x % 16) {
  case 0: return INT_MIN;
  case 1: return INT_MAX;
  case 2: return 0;
  default: return (int)(uint32_t)(x >> 32);
  }
}

typedef struct producer {
  pthread_t thread;
  tko_pool *pool;
  long first, count;
  pthread_barrier_t *go;
  int rc;
} producer;

static void *producer_main(void *arg) {
  producer *p = arg;
  pthread_barrier_wait(p->go);
  for (long i = p->first; i < p->first + p->count && !p->rc; i++)
    p->rc = tko_submit(p->pool, mark_task, (void *)(uintptr_t)i, weight_of((uint64_t)i));
  return NULL;
}

/* One run: returns wall ns; checks every count. */
static double run_throughput(bench *b, const char *label, const tko_options *o, long tasks,
                             long nprod) {
  memset(marks, 0, (size_t)tasks);
  tko_pool *pool;
  int rc = tko_pool_create(&pool, o);
  if (rc) bench_die("tko_pool_create: %s", tko_strerror(rc));
  pthread_barrier_t go;
  pthread_barrier_init(&go, NULL, (unsigned)nprod + 1);
  producer *p = calloc((size_t)nprod, sizeof *p);
  if (!p) bench_die("out of memory");
  long first = 0;
  for (long i = 0; i < nprod; i++) {
    long count = tasks / nprod + (i < tasks % nprod);
    p[i] = (producer){.pool = pool, .first = first, .count = count, .go = &go};
    first += count;
    if (pthread_create(&p[i].thread, NULL, producer_main, &p[i]))
      bench_die("pthread_create failed");
  }
  bench_wait_others_asleep(500);
  uint64_t t0 = bench_now_ns();
  pthread_barrier_wait(&go);
  for (long i = 0; i < nprod; i++)
    pthread_join(p[i].thread, NULL);
  tko_pool_wait_idle(pool, -1);
  double ns = (double)(bench_now_ns() - t0);
  for (long i = 0; i < nprod; i++)
    if (p[i].rc) bench_die("tko_submit: %s", tko_strerror(p[i].rc));
  tko_stats st;
  tko_pool_stats(pool, &st);
  long bad = 0;
  for (long i = 0; i < tasks; i++)
    bad += marks[i] != 1;
  bench_check(b, bad == 0, "%s, %ld tasks: %ld tasks did not run exactly once", label, tasks, bad);
  bench_check(b,
              st.submitted == (uint64_t)tasks && st.completed == (uint64_t)tasks &&
                  st.queued == 0 && st.running == 0 && st.failed == 0 && st.cancelled == 0,
              "%s, %ld tasks: submitted %llu completed %llu queued %llu running %llu failed "
              "%llu cancelled %llu",
              label, tasks, (unsigned long long)st.submitted, (unsigned long long)st.completed,
              (unsigned long long)st.queued, (unsigned long long)st.running,
              (unsigned long long)st.failed, (unsigned long long)st.cancelled);
  free(p);
  pthread_barrier_destroy(&go);
  tko_pool_destroy(pool);
  return ns;
}

/* ---- bursts -------------------------------------------------------------------- */

static uint64_t burst_sleep_ns;

static int blocking_task(void *arg) {
  (void)arg;
  bench_sleep_ns(burst_sleep_ns);
  return 0;
}

typedef struct burst_result {
  double cycle_ns; /* median time of one burst until every elastic worker retired */
  uint64_t spawned, retired;
  unsigned peak;
  long cycles_with_spawn, cycles_not_retired;
} burst_result;

static burst_result run_bursts(bench *b, long cycles, long burst, unsigned ebasic, unsigned emax,
                               unsigned idle_ms) {
  tko_options o = tko_elastic_options(ebasic, emax, idle_ms);
  bench_retire_watch watch;
  bench_retire_watch_init(&watch, &o);
  tko_pool *pool;
  int rc = tko_pool_create(&pool, &o);
  if (rc) bench_die("tko_pool_create: %s", tko_strerror(rc));
  double *cycle = calloc((size_t)cycles, sizeof *cycle);
  if (!cycle) bench_die("out of memory");
  burst_result r = {0};
  uint64_t spawned_before = 0;
  for (long c = 0; c < cycles; c++) {
    uint64_t t0 = bench_now_ns();
    for (long i = 0; i < burst; i++)
      if ((rc = tko_submit(pool, blocking_task, NULL, (int)(i % 3))) != 0)
        bench_die("tko_submit: %s", tko_strerror(rc));
    tko_pool_wait_idle(pool, -1);
    bool retired = bench_retire_wait(&watch, pool, 10000 + 10L * idle_ms);
    cycle[c] = (double)(bench_now_ns() - t0);
    tko_stats st;
    tko_pool_stats(pool, &st);
    if (st.elastic_spawned > spawned_before) r.cycles_with_spawn++;
    spawned_before = st.elastic_spawned;
    if (!retired || st.elastic_workers != 0) r.cycles_not_retired++;
    bench_check(b, st.queued == 0 && st.running == 0 && st.elastic_workers == 0,
                "burst %ld: queued %llu running %llu elastic alive %u after retirement", c,
                (unsigned long long)st.queued, (unsigned long long)st.running, st.elastic_workers);
  }
  tko_stats st;
  tko_pool_stats(pool, &st);
  r.spawned = st.elastic_spawned;
  r.retired = st.elastic_retired;
  r.peak = st.elastic_peak;
  r.cycle_ns = bench_median(cycle, (size_t)cycles);
  bench_check(b, st.elastic_spawned == st.elastic_retired && watch.stops == st.elastic_spawned,
              "bursts: spawned %llu, retired %llu, stop hooks %llu",
              (unsigned long long)st.elastic_spawned, (unsigned long long)st.elastic_retired,
              (unsigned long long)watch.stops);
  bench_check(b, st.completed == (uint64_t)(cycles * burst) && st.failed == 0,
              "bursts: %llu of %ld tasks completed", (unsigned long long)st.completed,
              cycles * burst);
  free(cycle);
  tko_pool_destroy(pool);
  bench_retire_watch_destroy(&watch);
  return r;
}

int main(int argc, char **argv) {
  bench_list sizes, prods;
  long workers, ebasic, emax, eidle, cycles, burst, sleep_us, bidle;
  bench_opt opts[] = {
      {"tasks", BENCH_OPT_LIST, &sizes, "5000,10000,1000000", "500,5000", 1, 1e9,
       "task counts of the throughput cases"},
      {"producers", BENCH_OPT_LIST, &prods, "1,4", NULL, 1, 256, "producer thread counts"},
      {"workers", BENCH_OPT_LONG, &workers, "2", NULL, 1, 1024, "basic pool workers"},
      {"elastic-basic", BENCH_OPT_LONG, &ebasic, "1", NULL, 0, 1024,
       "elastic pool's basic workers (throughput cases)"},
      {"elastic-max", BENCH_OPT_LONG, &emax, "3", NULL, 1, 1024,
       "elastic pool's extra workers (both kinds of case)"},
      {"elastic-idle-ms", BENCH_OPT_LONG, &eidle, "10", NULL, 1, 3600000,
       "elastic idle timeout (throughput cases)"},
      {"cycles", BENCH_OPT_LONG, &cycles, "100", "5", 1, 1e6, "bursts per burst run"},
      {"burst", BENCH_OPT_LONG, &burst, "64", "16", 1, 1e6, "tasks per burst"},
      {"burst-sleep-us", BENCH_OPT_LONG, &sleep_us, "200", "100", 0, 1e7,
       "how long each burst task blocks"},
      {"burst-idle-ms", BENCH_OPT_LONG, &bidle, "2", NULL, 1, 3600000,
       "elastic idle timeout in the burst runs (short, so workers retire fast)"},
  };
  bench *b = bench_init(argc, argv, "bench_stress",
                        "Many tasks over the whole weight range from one or several producers, "
                        "and bursts that spawn and retire elastic workers: throughput, and checks "
                        "that every task ran once and every count returns to zero.",
                        opts, sizeof opts / sizeof opts[0]);
  burst_sleep_ns = (uint64_t)sleep_us * 1000u;

  long max_n = 0;
  for (size_t s = 0; s < sizes.n; s++)
    if (sizes.v[s] > max_n) max_n = sizes.v[s];
  marks = calloc((size_t)max_n, 1);
  if (!marks) bench_die("out of memory");

  tko_options pools[2] = {tko_basic_options((unsigned)workers),
                          tko_elastic_options((unsigned)ebasic, (unsigned)emax, (unsigned)eidle)};
  char label[2][48];
  snprintf(label[0], sizeof label[0], "basic %ld", workers);
  snprintf(label[1], sizeof label[1], "elastic %ld+%ld", ebasic, emax);

  size_t runs = (size_t)b->runs, ncase = 2 * prods.n * sizes.n;
  double *res = calloc(ncase * runs, sizeof *res);
  burst_result *bursts = calloc(runs, sizeof *bursts);
  if (!res || !bursts) bench_die("out of memory");
  for (size_t r = 0; r < runs; r++) {
    size_t c = 0;
    for (int p = 0; p < 2; p++)
      for (size_t pi = 0; pi < prods.n; pi++)
        for (size_t s = 0; s < sizes.n; s++, c++)
          res[c * runs + r] = run_throughput(b, label[p], &pools[p], sizes.v[s], prods.v[pi]);
    bursts[r] = run_bursts(b, cycles, burst, 1, (unsigned)emax, (unsigned)bidle);
  }

  bench_table *t = bench_table_new(b, "throughput", "many tasks, weights over the whole int range");
  size_t c = 0;
  for (int p = 0; p < 2; p++)
    for (size_t pi = 0; pi < prods.n; pi++)
      for (size_t s = 0; s < sizes.n; s++, c++) {
        double *v = &res[c * runs], n = (double)sizes.v[s];
        bench_row(t);
        bench_cell_str(t, "pool", "%s", label[p]);
        bench_cell_int(t, "producers", prods.v[pi]);
        bench_cell_int(t, "tasks", sizes.v[s]);
        bench_cell_num(t, "ns/task", "%.1f", bench_median(v, runs) / n);
        bench_cell_num(t, "min", "%.1f", bench_min(v, runs) / n);
        bench_cell_num(t, "max", "%.1f", bench_max(v, runs) / n);
      }
  bench_table_print(t);

  char title[160];
  snprintf(title, sizeof title,
           "elastic bursts: elastic 1+%ld, idle %ld ms, %ld bursts of %ld tasks blocking %ld us",
           emax, bidle, cycles, burst, sleep_us);
  bench_table *bt = bench_table_new(b, "bursts", title);
  for (size_t r = 0; r < runs; r++) {
    bench_row(bt);
    bench_cell_int(bt, "run", (long long)r + 1);
    bench_cell_num(bt, "ms/burst", "%.2f", bursts[r].cycle_ns / 1e6);
    bench_cell_int(bt, "bursts that spawned", bursts[r].cycles_with_spawn);
    bench_cell_int(bt, "spawned", (long long)bursts[r].spawned);
    bench_cell_int(bt, "retired", (long long)bursts[r].retired);
    bench_cell_int(bt, "peak", bursts[r].peak);
    bench_cell_int(bt, "bursts not retired in time", bursts[r].cycles_not_retired);
  }
  bench_table_print(bt);
  bench_note(b,
             "ms/burst: median time from a burst's first submit until the pool is idle and every "
             "elastic worker has retired (waited for on the thread_stop hook).");
  free(res);
  free(bursts);
  free(marks);
  return bench_finish(b);
}
