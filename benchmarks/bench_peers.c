/* SPDX-License-Identifier: MIT */
/* bench_peers: taskorch side by side with GLib's GThreadPool, C-Thread-Pool
 * and libuv's uv_queue_work on the same workloads, in one run, with the
 * ratio taskorch/peer printed for each (below 1 means taskorch is faster).
 *
 * Workloads: empty tasks (1 producer), the same with taskorch's weights
 * i & 3 ("mixed"), ~1 us tasks of arithmetic (1 producer), empty tasks
 * from several producers at once, and with weights i & 3, and sleeping
 * "I/O" tasks. Each measurement is end to end: from the first submit to the
 * moment the pool's own completion call says the last task has run (see
 * bench_pools.h for how each pool is waited on, and the other fairness
 * rules). Runs are interleaved — run 1 of every pool, then run 2 — and the
 * order of pools rotates, so a noisy moment on this shared machine hits
 * every contender alike. */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_common.h"
#include "bench_pools.h"

/* ---- task bodies -------------------------------------------------------- */

static uint64_t work_iters; /* set once, before any pool or child exists */
static uint64_t io_sleep_ns;

static inline void empty_body(void *arg) {
  (void)arg;
}

static inline void work_body(void *arg) {
  (void)arg;
  /* bench_work lives in another file, so the call cannot be optimized out. */
  (void)bench_work(work_iters, (uint64_t)(uintptr_t)arg);
}

static inline void io_body(void *arg) {
  (void)arg;
  bench_sleep_ns(io_sleep_ns);
}

/* The same sleep, announced to taskorch with its blocking hint (only
 * taskorch runs this one: the peers have no such call). */
static inline void io_hint_body(void *arg) {
  (void)arg;
  tko_blocking_begin();
  bench_sleep_ns(io_sleep_ns);
  tko_blocking_end();
}

BP_TASK(empty_task, empty_body);
BP_TASK(work_task, work_body);
BP_TASK(io_task, io_body);
BP_TASK(io_hint_task, io_hint_body);

/* Every task gets this non-NULL argument (GLib cannot queue NULL). */
static char task_arg;

/* ---- workloads ------------------------------------------------------------ */

/* Contenders: the pools, plus taskorch again with the blocking hint (I/O
 * workload only). */
enum { C_HINT = BP_KINDS, C_COUNT };

enum { W_EMPTY, W_MIXED, W_WORK, W_CONCURRENT, W_MIXED_CONCURRENT, W_IO, W_COUNT };

typedef struct workload {
  const char *id, *title;
  const bp_task *task;
  long tasks;
  long producers;
  unsigned threads; /* workers for every pool (taskorch: see tko_opts) */
  bool elastic;     /* taskorch runs tko_elastic_options(io_basic, threads - io_basic) */
  bool enabled;
  unsigned weights; /* taskorch's task i gets weight i & (weights - 1) (1 or 4) */
} workload;

static workload workloads[W_COUNT];
static long opt_io_basic, opt_io_idle_ms;

/* ---- one measurement ---------------------------------------------------------- */

typedef struct producer_ctx {
  bp_pool *pool;
  long tasks;
  unsigned weights;
  pthread_barrier_t *ready, *go, *done;
  int rc;
} producer_ctx;

static void *producer_main(void *arg) {
  producer_ctx *c = arg;
  bp_producer *pr = bp_producer_open(c->pool, (size_t)c->tasks);
  pthread_barrier_wait(c->ready);
  pthread_barrier_wait(c->go);
  for (long i = 0; i < c->tasks && !c->rc; i++)
    c->rc = bp_submit_weighted(pr, &task_arg, (int)(i & (c->weights - 1)));
  bp_producer_finish(pr);
  /* Tell the timer this producer is done before freeing anything, so that
   * libuv's request array is not freed on the clock. */
  pthread_barrier_wait(c->done);
  bp_producer_close(pr);
  return NULL;
}

static int failed_checks; /* taskorch counts that did not add up */

/* Runs workload w once on pool kind (hint: taskorch with the blocking
 * hint); returns wall nanoseconds. */
static double measure(int w, bp_kind kind, bool hint) {
  const workload *wl = &workloads[w];
  tko_options o;
  const tko_options *po = NULL;
  if (wl->elastic && kind == BP_TASKORCH) {
    o = tko_elastic_options((unsigned)opt_io_basic, wl->threads - (unsigned)opt_io_basic,
                            (unsigned)opt_io_idle_ms);
    po = &o;
  }
  bp_pool *pool;
  int rc = bp_pool_create(&pool, kind, hint ? &io_hint_task : wl->task, wl->threads, po);
  if (rc)
    bench_die("%s: cannot create a pool of %u threads: %s", bp_name(kind), wl->threads,
              strerror(-rc));
  uint64_t t0, t1;
  if (wl->producers == 1) {
    bp_producer *pr = bp_producer_open(pool, (size_t)wl->tasks);
    bench_wait_others_asleep(500);
    t0 = bench_now_ns();
    for (long i = 0; i < wl->tasks; i++)
      if ((rc = bp_submit_weighted(pr, &task_arg, (int)(i & (wl->weights - 1)))) != 0)
        bench_die("%s: submit failed: %s", bp_name(kind), strerror(-rc));
    bp_producer_finish(pr);
    bp_pool_wait(pool);
    t1 = bench_now_ns();
    bp_producer_close(pr);
  } else {
    unsigned n = (unsigned)wl->producers;
    pthread_barrier_t ready, go, done;
    pthread_barrier_init(&ready, NULL, n + 1);
    pthread_barrier_init(&go, NULL, n + 1);
    pthread_barrier_init(&done, NULL, n + 1);
    producer_ctx *ctx = calloc(n, sizeof *ctx);
    pthread_t *th = calloc(n, sizeof *th);
    if (!ctx || !th) bench_die("out of memory");
    for (unsigned p = 0; p < n; p++) {
      /* Split the tasks as evenly as possible. */
      ctx[p] =
          (producer_ctx){pool,  wl->tasks / n + ((long)p < wl->tasks % n),
                         wl->weights, &ready, &go, &done, 0};
      if (pthread_create(&th[p], NULL, producer_main, &ctx[p])) bench_die("pthread_create failed");
    }
    pthread_barrier_wait(&ready);
    /* Producers are parked on the start barrier, workers asleep. */
    bench_wait_others_asleep(500);
    t0 = bench_now_ns();
    pthread_barrier_wait(&go);
    pthread_barrier_wait(&done);
    bp_pool_wait(pool);
    t1 = bench_now_ns();
    for (unsigned p = 0; p < n; p++) {
      pthread_join(th[p], NULL);
      if (ctx[p].rc) bench_die("%s: submit failed: %s", bp_name(kind), strerror(-ctx[p].rc));
    }
    free(ctx);
    free(th);
    pthread_barrier_destroy(&ready);
    pthread_barrier_destroy(&go);
    pthread_barrier_destroy(&done);
  }
  if (kind == BP_TASKORCH) {
    tko_stats st;
    tko_pool_stats(bp_pool_tko(pool), &st);
    if (st.completed != (uint64_t)wl->tasks || st.queued || st.running) {
      fprintf(stderr, "bench_peers: taskorch %s: %llu of %ld tasks completed\n", wl->id,
              (unsigned long long)st.completed, wl->tasks);
      failed_checks++;
    }
  }
  bp_pool_destroy(pool);
  return (double)(t1 - t0);
}

/* The libuv child process: one per distinct thread count. */
static size_t remote_measure(int w, int run, double *out, size_t cap) {
  (void)run;
  if (cap < 1) return 0;
  out[0] = measure(w, BP_LIBUV, false);
  return 1;
}

/* ---- main ------------------------------------------------------------------- */

int main(int argc, char **argv) {
  long workers, empty_tasks, work_tasks, conc_tasks, producers, io_tasks, io_ms, io_threads;
  double work_ns;
  const char *pools_opt, *workloads_opt;
  bench_opt opts[] = {
      {"pools", BENCH_OPT_STRING, &pools_opt, "taskorch,glib,thpool,libuv", NULL, 0, 0,
       "pools to run, of taskorch, glib, thpool, libuv (those not built are skipped)"},
      {"workloads", BENCH_OPT_STRING, &workloads_opt, "empty,mixed,work,concurrent,mixed-concurrent,io", NULL, 0, 0,
       "workloads to run, of empty, mixed, work, concurrent, mixed-concurrent, io (mixed: "
       "taskorch's task i has weight i & 3; the peers have no weights)"},
      {"workers", BENCH_OPT_LONG, &workers, "2", NULL, 1, 256,
       "worker threads of every pool (empty, work and concurrent workloads)"},
      {"empty-tasks", BENCH_OPT_LONG, &empty_tasks, "1000000", "2000", 1, 1e8,
       "empty tasks from one producer"},
      {"work-tasks", BENCH_OPT_LONG, &work_tasks, "200000", "500", 1, 1e8,
       "arithmetic tasks from one producer"},
      {"work-ns", BENCH_OPT_DOUBLE, &work_ns, "1000", NULL, 1, 1e8,
       "length of one arithmetic task, in ns (calibrated)"},
      {"producers", BENCH_OPT_LONG, &producers, "4", "2", 2, 64,
       "producer threads in the concurrent workload"},
      {"concurrent-tasks", BENCH_OPT_LONG, &conc_tasks, "1000000", "2000", 1, 1e8,
       "empty tasks in the concurrent workload, split among the producers"},
      {"io-tasks", BENCH_OPT_LONG, &io_tasks, "100", "16", 1, 1e6, "sleeping tasks"},
      {"io-ms", BENCH_OPT_LONG, &io_ms, "10", "1", 0, 10000, "sleep per I/O task, in ms"},
      {"io-threads", BENCH_OPT_LONG, &io_threads, "16", "4", 1, 1024,
       "threads of each peer in the I/O workload; taskorch gets io-basic of them as basic "
       "workers and the rest as elastic"},
      {"io-basic", BENCH_OPT_LONG, &opt_io_basic, "2", NULL, 0, 1024,
       "taskorch's basic workers in the I/O workload"},
      {"io-idle-ms", BENCH_OPT_LONG, &opt_io_idle_ms, "1000", NULL, 1, 3600000,
       "taskorch's elastic idle timeout in the I/O workload"},
  };
  bench *b = bench_init(argc, argv, "bench_peers",
                        "taskorch vs GLib GThreadPool, C-Thread-Pool and libuv: same workloads, "
                        "same thread counts, end to end (first submit to last completion), "
                        "ratios taskorch/peer from the same run (below 1: taskorch faster).",
                        opts, sizeof opts / sizeof opts[0]);

  bool enabled[BP_KINDS];
  const char *why;
  if (!bp_parse_list(pools_opt, enabled, &why)) {
    fprintf(stderr, "bench_peers: --pools '%s': %s\n", pools_opt, why);
    return 2;
  }
  if (opt_io_basic >= io_threads) {
    fprintf(stderr, "bench_peers: --io-basic must be below --io-threads\n");
    return 2;
  }
  const char *wl_names[W_COUNT] = {"empty", "mixed", "work", "concurrent", "mixed-concurrent", "io"};
  bool wl_on[W_COUNT] = {false};
  for (const char *p = workloads_opt; *p;) {
    size_t len = strcspn(p, ",");
    int w = 0;
    while (w < W_COUNT && !(strlen(wl_names[w]) == len && !strncmp(wl_names[w], p, len)))
      w++;
    if (w == W_COUNT) {
      fprintf(stderr,
              "bench_peers: --workloads: unknown '%.*s' (known: empty, mixed, work, concurrent, "
              "mixed-concurrent, io)\n",
              (int)len, p);
      return 2;
    }
    wl_on[w] = true;
    p += len + (p[len] == ',');
  }

  work_iters = bench_work_iters(work_ns);
  io_sleep_ns = (uint64_t)io_ms * 1000000u;
  char skipped[128] = "";
  for (int k = 0; k < BP_KINDS; k++)
    if (!bp_available((bp_kind)k))
      snprintf(skipped + strlen(skipped), sizeof skipped - strlen(skipped), "%s%s",
               skipped[0] ? ", " : "", bp_name((bp_kind)k));
  bench_config(b, "peers not built (skipped)", "%s", skipped[0] ? skipped : "none");
  bench_config(b, "arithmetic task", "%llu iterations of bench_work at %.3f ns each",
               (unsigned long long)work_iters, bench_work_calibrate());
  bench_config(
      b, "completion",
      "taskorch tko_pool_wait_idle; GLib g_thread_pool_free(pool, FALSE, "
      "TRUE); C-Thread-Pool thpool_wait; libuv uv_run until every after-work callback ran");
  bench_config(b, "pools",
               "created fresh for each run; GLib exclusive (threads started at "
               "creation); libuv in a child process (its pool is global, sized by "
               "UV_THREADPOOL_SIZE), requests preallocated");

  char title[W_COUNT][160];
  snprintf(title[W_EMPTY], sizeof title[0], "empty task: 1 producer, %ld workers, %ld tasks",
           workers, empty_tasks);
  snprintf(title[W_WORK], sizeof title[0],
           "%.0f ns arithmetic task: 1 producer, %ld workers, %ld tasks", work_ns, workers,
           work_tasks);
  snprintf(title[W_CONCURRENT], sizeof title[0],
           "concurrent enqueue: %ld producers, %ld workers, %ld empty tasks in all", producers,
           workers, conc_tasks);
  snprintf(title[W_MIXED], sizeof title[0],
           "empty task, weights i & 3: 1 producer, %ld workers, %ld tasks", workers, empty_tasks);
  snprintf(title[W_MIXED_CONCURRENT], sizeof title[0],
           "concurrent enqueue, weights i & 3: %ld producers, %ld workers, %ld empty tasks in all",
           producers, workers, conc_tasks);
  snprintf(title[W_IO], sizeof title[0],
           "I/O: %ld tasks sleeping %ld ms; peers %ld threads, taskorch elastic %ld+%ld", io_tasks,
           io_ms, io_threads, opt_io_basic, io_threads - opt_io_basic);
  workloads[W_EMPTY] = (workload){"empty", title[W_EMPTY],    &empty_task, empty_tasks,
                                  1,       (unsigned)workers, false,       wl_on[W_EMPTY], 1};
  workloads[W_MIXED] = (workload){"mixed", title[W_MIXED],    &empty_task, empty_tasks,
                                  1,       (unsigned)workers, false,       wl_on[W_MIXED], 4};
  workloads[W_MIXED_CONCURRENT] =
      (workload){"mixed-concurrent", title[W_MIXED_CONCURRENT], &empty_task, conc_tasks,
                 producers, (unsigned)workers, false, wl_on[W_MIXED_CONCURRENT], 4};
  workloads[W_WORK] = (workload){"work", title[W_WORK],     &work_task, work_tasks,
                                 1,      (unsigned)workers, false,      wl_on[W_WORK], 1};
  workloads[W_CONCURRENT] =
      (workload){"concurrent", title[W_CONCURRENT], &empty_task, conc_tasks,
                 producers,    (unsigned)workers,   false,       wl_on[W_CONCURRENT], 1};
  workloads[W_IO] =
      (workload){"io", title[W_IO], &io_task, io_tasks, 1, (unsigned)io_threads, true, wl_on[W_IO], 1};

  /* libuv children, forked now while this process has one thread. */
  bp_remote *uv_small = NULL, *uv_io = NULL;
  if (enabled[BP_LIBUV]) {
    uv_small = bp_remote_start(remote_measure);
    uv_io = (unsigned)io_threads == (unsigned)workers ? uv_small : bp_remote_start(remote_measure);
    if (!uv_small || !uv_io) bench_die("fork failed");
  }

  size_t runs = (size_t)b->runs;
  double *res = calloc((size_t)W_COUNT * C_COUNT * runs, sizeof *res);
  if (!res) bench_die("out of memory");
#define RES(w, k, r) res[((size_t)(w)*C_COUNT + (size_t)(k)) * runs + (r)]
  /* Which contenders run which workload. */
  bool on[W_COUNT][C_COUNT];
  for (int w = 0; w < W_COUNT; w++)
    for (int c = 0; c < C_COUNT; c++)
      on[w][c] =
          workloads[w].enabled && (c == C_HINT ? w == W_IO && enabled[BP_TASKORCH] : enabled[c]);
  for (size_t r = 0; r < runs; r++) {
    for (int w = 0; w < W_COUNT; w++) {
      if (!workloads[w].enabled) continue;
      for (int i = 0; i < C_COUNT; i++) {
        int k = (i + (int)r) % C_COUNT; /* rotate who goes first */
        if (!on[w][k]) continue;
        double v;
        if (k == BP_LIBUV) {
          bp_remote *child = w == W_IO ? uv_io : uv_small;
          if (bp_remote_call(child, w, (int)r, &v, 1) != 1)
            bench_die("the libuv child process died");
        } else {
          v = k == C_HINT ? measure(w, BP_TASKORCH, true) : measure(w, (bp_kind)k, false);
        }
        RES(w, k, r) = v;
      }
    }
  }
  if (uv_io && uv_io != uv_small && bp_remote_stop(uv_io) != 0) bench_die("libuv child failed");
  if (uv_small && bp_remote_stop(uv_small) != 0) bench_die("libuv child failed");

  for (int w = 0; w < W_COUNT; w++) {
    const workload *wl = &workloads[w];
    if (!wl->enabled) continue;
    bench_table *t = bench_table_new(b, wl->id, wl->title);
    double med[C_COUNT];
    for (int k = 0; k < C_COUNT; k++) {
      med[k] = NAN;
      if (!on[w][k]) continue;
      double *v = &RES(w, k, 0);
      med[k] = bench_median(v, runs);
    }
    for (int k = 0; k < C_COUNT; k++) {
      if (!on[w][k]) continue;
      double *v = &RES(w, k, 0);
      bench_row(t);
      if (k == C_HINT)
        bench_cell_str(t, "pool", "taskorch (elastic %ld+%ld, blocking hint)", opt_io_basic,
                       (long)wl->threads - opt_io_basic);
      else if (k == BP_TASKORCH && wl->elastic)
        bench_cell_str(t, "pool", "taskorch (elastic %ld+%ld)", opt_io_basic,
                       (long)wl->threads - opt_io_basic);
      else
        bench_cell_str(t, "pool", "%s", bp_name((bp_kind)k));
      bench_cell_int(t, "threads", (long long)wl->threads);
      bench_cell_int(t, "tasks", wl->tasks);
      if (w == W_IO) {
        double rounds = ceil((double)wl->tasks / (double)wl->threads);
        double ideal_ms = rounds * (double)io_ms;
        bench_cell_num(t, "wall ms", "%.2f", med[k] / 1e6);
        bench_cell_num(t, "min ms", "%.2f", bench_min(v, runs) / 1e6);
        bench_cell_num(t, "max ms", "%.2f", bench_max(v, runs) / 1e6);
        bench_cell_num(t, "wall/ideal", "%.3f", ideal_ms > 0 ? med[k] / 1e6 / ideal_ms : NAN);
      } else {
        double per = (double)wl->tasks;
        bench_cell_num(t, "ns/task", "%.1f", med[k] / per);
        bench_cell_num(t, "min", "%.1f", bench_min(v, runs) / per);
        bench_cell_num(t, "max", "%.1f", bench_max(v, runs) / per);
        bench_cell_num(t, "Mtasks/s", "%.2f", per / med[k] * 1e3);
      }
      bench_cell_num(t, "taskorch/peer", "%.2f",
                     k == C_HINT || !enabled[BP_TASKORCH] ? NAN : med[BP_TASKORCH] / med[k]);
    }
    bench_table_print(t);
    /* The fastest peer of this workload, against taskorch. */
    int best = -1;
    for (int k = 0; k < BP_KINDS; k++)
      if (k != BP_TASKORCH && on[w][k] && (best < 0 || med[k] < med[best])) best = k;
    if (best >= 0 && on[w][BP_TASKORCH])
      bench_note(b, "%s: taskorch %.2fx the fastest peer (%s)", wl->id, med[best] / med[BP_TASKORCH],
                 bp_name((bp_kind)best));
  }
  if (workloads[W_IO].enabled)
    bench_note(b, "I/O ideal: ceil(tasks / threads) rounds x sleep = %.0f ms.",
               ceil((double)io_tasks / (double)io_threads) * (double)io_ms);
  bench_check(b, failed_checks == 0, "taskorch completed counts did not add up %d time(s)",
              failed_checks);
  free(res);
  return bench_finish(b);
}
