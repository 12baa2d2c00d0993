/* SPDX-License-Identifier: MIT */
/* A quick look at the hot path: one producer, N workers, a million empty
 * tasks with four weights, end to end (first submit to tko_pool_wait_idle
 * returning), submitted one by one and in batches (tko_submit_batch), on a
 * fresh pool per run and on one long-lived pool (after a warm-up run, so its
 * queue has already grown). Prints the median ns/task. Then plain
 * tko_submit against tko_submit_handle (a caller-owned handle per task) on
 * one reused pool, in alternating order run by run, with the median of the
 * runs' ratios. The full comparison
 * with other pools is bench_peers; this one is for a tight
 * edit-build-measure loop on the core. */
#include <stdio.h>
#include <stdlib.h>

#include "bench_common.h"
#include "taskorch.h"

static int empty_task(void *arg) {
  (void)arg;
  return 0;
}

static tko_pool *make_pool(long workers) {
  tko_options o = tko_basic_options((unsigned)workers);
  tko_pool *pool;
  int rc = tko_pool_create(&pool, &o);
  if (rc) bench_die("tko_pool_create: %s", tko_strerror(rc));
  return pool;
}

/* Submits `tasks` empty tasks, bn per call (0: one tko_submit_handle per
 * task, handles[i] for task i), waits for the pool to go idle; returns
 * ns/task and checks that every task completed. */
static double run_once(bench *b, tko_pool *pool, long tasks, long bn, tko_task *batch,
                       tko_handle *handles) {
  tko_stats before;
  tko_pool_stats(pool, &before);
  bench_wait_others_asleep(500);
  uint64_t t0 = bench_now_ns();
  int rc;
  if (bn == 0) {
    for (long i = 0; i < tasks; i++)
      if ((rc = tko_submit_handle(pool, &handles[i], empty_task, NULL, (int)(i & 3))) != 0)
        bench_die("tko_submit_handle: %s", tko_strerror(rc));
  } else if (bn == 1) {
    for (long i = 0; i < tasks; i++)
      if ((rc = tko_submit(pool, empty_task, NULL, (int)(i & 3))) != 0)
        bench_die("tko_submit: %s", tko_strerror(rc));
  } else {
    for (long i = 0; i < tasks; i += bn) {
      long n = tasks - i < bn ? tasks - i : bn;
      for (long j = 0; j < n; j++)
        batch[j] = (tko_task){empty_task, NULL, (int)((i + j) & 3)};
      if ((rc = tko_submit_batch(pool, batch, (size_t)n)) != 0)
        bench_die("tko_submit_batch: %s", tko_strerror(rc));
    }
  }
  tko_pool_wait_idle(pool, -1);
  double ns = (double)(bench_now_ns() - t0) / (double)tasks;
  /* Every handle's task has ended once the pool is idle (the end comes
   * before the finish is counted). */
  for (long i = 0; bn == 0 && i < tasks; i += tasks / 16 + 1)
    bench_check(b, tko_handle_status(&handles[i]) == 0, "handle %ld: status %d", i,
                tko_handle_status(&handles[i]));
  tko_stats st;
  tko_pool_stats(pool, &st);
  bench_check(b, st.completed - before.completed == (uint64_t)tasks,
              "batch %ld: %llu of %ld tasks completed", bn,
              (unsigned long long)(st.completed - before.completed), tasks);
  return ns;
}

int main(int argc, char **argv) {
  long tasks, workers;
  bench_list batches;
  bench_opt opts[] = {
      {"tasks", BENCH_OPT_LONG, &tasks, "1000000", "10000", 1, 1e9, "empty tasks per run"},
      {"workers", BENCH_OPT_LONG, &workers, "2", NULL, 1, 1024, "worker threads"},
      {"batch", BENCH_OPT_LIST, &batches, "1,256", NULL, 1, 1e6,
       "tasks per submit call (1 = tko_submit, more = tko_submit_batch)"},
  };
  bench *b = bench_init(argc, argv, "bench_quick",
                        "Empty tasks (weights 0-3) from one producer, end to end, on a fresh "
                        "pool per run and on one reused pool: the hot path in one number.",
                        opts, sizeof opts / sizeof opts[0]);
  size_t runs = (size_t)b->runs;
  long max_batch = 1;
  for (size_t k = 0; k < batches.n; k++)
    if (batches.v[k] > max_batch) max_batch = batches.v[k];
  /* [k][0] fresh pools, [k][1] the reused pool */
  double *ns = calloc(runs * batches.n * 2, sizeof *ns);
  tko_task *batch = calloc((size_t)max_batch, sizeof *batch);
  if (!ns || !batch) bench_die("out of memory");
#define NS(k, reused, r) ns[((k)*2 + (reused)) * runs + (r)]
  for (size_t k = 0; k < batches.n; k++) {
    long bn = batches.v[k];
    for (size_t r = 0; r < runs; r++) {
      tko_pool *pool = make_pool(workers);
      NS(k, 0, r) = run_once(b, pool, tasks, bn, batch, NULL);
      tko_pool_destroy(pool);
    }
    tko_pool *pool = make_pool(workers);
    (void)run_once(b, pool, tasks, bn, batch, NULL); /* warm-up: the queue grows */
    for (size_t r = 0; r < runs; r++) NS(k, 1, r) = run_once(b, pool, tasks, bn, batch, NULL);
    tko_pool_destroy(pool);
  }
  bench_table *t = bench_table_new(b, "quick", "empty tasks, 1 producer, end to end");
  for (size_t k = 0; k < batches.n; k++)
    for (int reused = 0; reused < 2; reused++) {
      double *v = &NS(k, reused, 0);
      bench_row(t);
      bench_cell_str(t, "submit", batches.v[k] == 1 ? "tko_submit" : "tko_submit_batch");
      bench_cell_int(t, "batch", batches.v[k]);
      bench_cell_str(t, "pool", reused ? "reused" : "fresh");
      bench_cell_int(t, "tasks", tasks);
      bench_cell_int(t, "workers", workers);
      bench_cell_num(t, "ns/task", "%.1f", bench_median(v, runs));
      bench_cell_num(t, "min", "%.1f", bench_min(v, runs));
      bench_cell_num(t, "max", "%.1f", bench_max(v, runs));
    }
  bench_table_print(t);
  bench_note(b, "fresh: a new pool per run (its queue grows during the run); reused: one pool "
                "for every run, after one warm-up run that is not counted.");

  /* Handles: the same pool for both, warmed up by both, each run's pair in
   * alternating order so that drift on a shared machine falls on both. */
  tko_handle *handles = calloc((size_t)tasks, sizeof *handles);
  double *plain = calloc(runs, sizeof *plain), *handled = calloc(runs, sizeof *handled);
  double *ratio = calloc(runs, sizeof *ratio);
  if (!handles || !plain || !handled || !ratio) bench_die("out of memory");
  tko_pool *pool = make_pool(workers);
  (void)run_once(b, pool, tasks, 1, batch, NULL);
  (void)run_once(b, pool, tasks, 0, batch, handles);
  for (size_t r = 0; r < runs; r++) {
    bool handle_first = r & 1;
    if (handle_first) handled[r] = run_once(b, pool, tasks, 0, batch, handles);
    plain[r] = run_once(b, pool, tasks, 1, batch, NULL);
    if (!handle_first) handled[r] = run_once(b, pool, tasks, 0, batch, handles);
    ratio[r] = handled[r] / plain[r];
  }
  tko_pool_destroy(pool);
  bench_table *ht = bench_table_new(b, "handle", "tko_submit against tko_submit_handle, one pool");
  for (int h = 0; h < 2; h++) {
    double *v = h ? handled : plain;
    bench_row(ht);
    bench_cell_str(ht, "submit", h ? "tko_submit_handle" : "tko_submit");
    bench_cell_int(ht, "tasks", tasks);
    bench_cell_int(ht, "workers", workers);
    bench_cell_num(ht, "ns/task", "%.1f", bench_median(v, runs));
    bench_cell_num(ht, "min", "%.1f", bench_min(v, runs));
    bench_cell_num(ht, "max", "%.1f", bench_max(v, runs));
    bench_cell_num(ht, "handle/plain", "%.3f", h ? bench_median(ratio, runs) : 1.0);
  }
  bench_table_print(ht);
  bench_note(b, "handle/plain: the median of each run's ratio (the pair ran back to back, in "
                "alternating order); a handle per task, caller-owned, in one array.");
  free(ratio);
  free(handled);
  free(plain);
  free(handles);
  free(batch);
  free(ns);
  return bench_finish(b);
}
