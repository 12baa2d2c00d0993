/* SPDX-License-Identifier: MIT */
/* bench_wakeup: how fast a sleeping pool answers, and what an idle pool
 * costs. Wake-up latency is the time from submit to the task's first
 * instruction when every worker is asleep: before each sample the benchmark
 * waits until the kernel shows every other thread of the process sleeping
 * (/proc), then submits one task that stamps its start. Idle cost is the
 * CPU time the whole process uses over a window while the pool has nothing
 * to do (clock_getcpuclockid-style process CPU clock). Taskorch and, where
 * built, GLib GThreadPool, C-Thread-Pool and libuv, all with the same number
 * of threads; libuv runs in a child process (see bench_pools.h).
 *
 * Checks (of behaviour, never of time): every pool took samples (not every
 * one was skipped), and each sample's task started after its own submit
 * (a start stamped before it would be a stale task or a task run twice). */
#define _GNU_SOURCE
#include <semaphore.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"
#include "bench_pools.h"

/* The one task in flight: it stamps its start and posts done. */
typedef struct wake_slot {
  atomic_uint_fast64_t start_ns; /* atomic: GLib's futex-based queue hides the
                                    hand-off from ThreadSanitizer; sem_post does not */
  sem_t done;
} wake_slot;

static wake_slot slot;

static inline void wake_body(void *arg) {
  wake_slot *s = arg;
  atomic_store_explicit(&s->start_ns, bench_now_ns(), memory_order_relaxed);
  sem_post(&s->done);
}

static inline void idle_body(void *arg) {
  (void)arg;
}

BP_TASK(wake_task, wake_body);
BP_TASK(idle_task, idle_body);

static unsigned threads;
static long samples_per_run, gap_us, idle_ms;
static long not_asleep; /* samples skipped because a thread stayed awake */
static long early;      /* samples whose task stamped a start before its submit */

enum { CASE_LATENCY, CASE_IDLE };

/* Fills out[] with wake-up latencies in ns; returns how many. */
static size_t measure_latency(bp_kind kind, double *out, size_t cap) {
  bp_pool *pool;
  int rc = bp_pool_create(&pool, kind, &wake_task, threads, NULL);
  if (rc) bench_die("%s: cannot create a pool: %s", bp_name(kind), strerror(-rc));
  bp_producer *pr = bp_producer_open(pool, 1);
  size_t n = 0;
  for (size_t i = 0; i < cap; i++) {
    if (gap_us) bench_sleep_ns((uint64_t)gap_us * 1000u);
    if (!bench_wait_others_asleep(200)) {
      not_asleep++;
      continue;
    }
    uint64_t t0 = bench_now_ns();
    if ((rc = bp_submit(pr, &slot)) != 0) bench_die("%s: submit failed", bp_name(kind));
    while (sem_wait(&slot.done) != 0) {
    }
    bp_producer_finish(pr);
    uint64_t start = atomic_load_explicit(&slot.start_ns, memory_order_relaxed);
    if (start < t0) early++;
    out[n++] = (double)(start - t0);
  }
  bp_producer_close(pr);
  bp_pool_wait(pool);
  bp_pool_destroy(pool);
  return n;
}

/* Process CPU ns used over the idle window, with the pool created and quiet. */
static double measure_idle(bp_kind kind) {
  bp_pool *pool;
  int rc = bp_pool_create(&pool, kind, &idle_task, threads, NULL);
  if (rc) bench_die("%s: cannot create a pool: %s", bp_name(kind), strerror(-rc));
  bench_wait_others_asleep(500);
  uint64_t c0 = bench_process_cpu_ns(), t0 = bench_now_ns();
  bench_sleep_ns((uint64_t)idle_ms * 1000000u);
  uint64_t c1 = bench_process_cpu_ns(), t1 = bench_now_ns();
  bp_pool_wait(pool);
  bp_pool_destroy(pool);
  /* Per second of wall time, so a longer or shorter window compares. */
  return (double)(c1 - c0) * 1e9 / (double)(t1 - t0);
}

/* The same window with no pool at all: what the measuring itself costs. */
static double measure_baseline(void) {
  bench_wait_others_asleep(500);
  uint64_t c0 = bench_process_cpu_ns(), t0 = bench_now_ns();
  bench_sleep_ns((uint64_t)idle_ms * 1000000u);
  uint64_t c1 = bench_process_cpu_ns(), t1 = bench_now_ns();
  return (double)(c1 - c0) * 1e9 / (double)(t1 - t0);
}

static size_t remote(int case_id, int run, double *out, size_t cap) {
  (void)run;
  if (case_id == CASE_IDLE) {
    if (cap < 1) return 0;
    out[0] = measure_idle(BP_LIBUV);
    return 1;
  }
  if (cap < 2) return 0;
  size_t n = measure_latency(BP_LIBUV, out + 2, cap - 2);
  out[0] = (double)not_asleep; /* the child's counts travel as the first values */
  out[1] = (double)early;
  not_asleep = early = 0;
  return n + 2;
}

int main(int argc, char **argv) {
  long nthreads, samples;
  const char *pools_opt;
  bench_opt opts[] = {
      {"pools", BENCH_OPT_STRING, &pools_opt, "taskorch,glib,thpool,libuv", NULL, 0, 0,
       "pools to run, of taskorch, glib, thpool, libuv (those not built are skipped)"},
      {"threads", BENCH_OPT_LONG, &nthreads, "2", NULL, 1, 256, "worker threads of every pool"},
      {"samples", BENCH_OPT_LONG, &samples, "1000", "20", 1, 1e7,
       "wake-up samples per pool, spread over the runs"},
      {"gap-us", BENCH_OPT_LONG, &gap_us, "500", "0", 0, 1e7,
       "extra time every thread stays asleep before each sample"},
      {"idle-ms", BENCH_OPT_LONG, &idle_ms, "1000", "50", 1, 600000,
       "idle window over which CPU use is measured"},
  };
  bench *b = bench_init(argc, argv, "bench_wakeup",
                        "Wake-up latency (submit to task start with every worker asleep) at "
                        "p50/p99, and CPU used by an idle pool, for taskorch and its peers.",
                        opts, sizeof opts / sizeof opts[0]);
  bool enabled[BP_KINDS];
  const char *why;
  if (!bp_parse_list(pools_opt, enabled, &why)) {
    fprintf(stderr, "bench_wakeup: --pools '%s': %s\n", pools_opt, why);
    return 2;
  }
  threads = (unsigned)nthreads;
  size_t runs = (size_t)b->runs;
  samples_per_run = (samples + (long)runs - 1) / (long)runs;
  if (sem_init(&slot.done, 0, 0) != 0) bench_die("sem_init failed");
  bench_config(b, "asleep",
               "before each sample, every other thread of the process is seen "
               "sleeping in /proc for %ld us or more",
               gap_us);

  bp_remote *child = enabled[BP_LIBUV] ? bp_remote_start(remote) : NULL;
  if (enabled[BP_LIBUV] && !child) bench_die("fork failed");

  size_t cap = (size_t)samples_per_run * runs;
  double *lat[BP_KINDS], *idle[BP_KINDS], *base = calloc(runs, sizeof(double));
  size_t nlat[BP_KINDS] = {0};
  long skipped[BP_KINDS] = {0};
  long early_of[BP_KINDS] = {0};
  double *buf = calloc((size_t)samples_per_run + 2, sizeof *buf);
  if (!buf || !base) bench_die("out of memory");
  for (int k = 0; k < BP_KINDS; k++) {
    lat[k] = calloc(cap ? cap : 1, sizeof(double));
    idle[k] = calloc(runs, sizeof(double));
    if (!lat[k] || !idle[k]) bench_die("out of memory");
  }
  for (size_t r = 0; r < runs; r++) {
    base[r] = measure_baseline();
    for (int i = 0; i < BP_KINDS; i++) {
      int k = (i + (int)r) % BP_KINDS; /* rotate who goes first */
      if (!enabled[k]) continue;
      size_t n;
      if (k == BP_LIBUV) {
        n = bp_remote_call(child, CASE_LATENCY, (int)r, buf, (size_t)samples_per_run + 2);
        if (n < 2) bench_die("the libuv child process died");
        skipped[k] += (long)buf[0];
        early_of[k] += (long)buf[1];
        memcpy(lat[k] + nlat[k], buf + 2, (n - 2) * sizeof *buf);
        nlat[k] += n - 2;
        if (bp_remote_call(child, CASE_IDLE, (int)r, &idle[k][r], 1) != 1)
          bench_die("the libuv child process died");
      } else {
        not_asleep = early = 0;
        nlat[k] += measure_latency((bp_kind)k, lat[k] + nlat[k], (size_t)samples_per_run);
        skipped[k] += not_asleep;
        early_of[k] += early;
        idle[k][r] = measure_idle((bp_kind)k);
      }
    }
  }
  if (child && bp_remote_stop(child) != 0) bench_die("the libuv child process failed");

  char title[96];
  snprintf(title, sizeof title, "wake-up latency, every worker asleep (%u threads)", threads);
  bench_table *t = bench_table_new(b, "wakeup", title);
  for (int k = 0; k < BP_KINDS; k++) {
    if (!enabled[k]) continue;
    bench_row(t);
    bench_cell_str(t, "pool", "%s", bp_name((bp_kind)k));
    bench_cell_int(t, "samples", (long long)nlat[k]);
    bench_cell_num(t, "p50 us", "%.1f", bench_percentile(lat[k], nlat[k], 50) / 1e3);
    bench_cell_num(t, "p99 us", "%.1f", bench_percentile(lat[k], nlat[k], 99) / 1e3);
    bench_cell_num(t, "max us", "%.1f", bench_max(lat[k], nlat[k]) / 1e3);
    bench_cell_int(t, "skipped (a thread stayed awake)", skipped[k]);
  }
  bench_table_print(t);
  for (int k = 0; k < BP_KINDS; k++) {
    if (!enabled[k]) continue;
    bench_check(b, nlat[k] > 0, "%s: every sample was skipped (a thread never slept)",
                bp_name((bp_kind)k));
    bench_check(b, early_of[k] == 0, "%s: %ld tasks stamped a start before their submit",
                bp_name((bp_kind)k), early_of[k]);
  }

  snprintf(title, sizeof title, "idle pool: process CPU over %ld ms, per second (%u threads)",
           idle_ms, threads);
  bench_table *it = bench_table_new(b, "idle", title);
  bench_row(it);
  bench_cell_str(it, "pool", "baseline: no pool");
  bench_cell_num(it, "CPU us/s", "%.1f", bench_median(base, runs) / 1e3);
  bench_cell_num(it, "min", "%.1f", bench_min(base, runs) / 1e3);
  bench_cell_num(it, "max", "%.1f", bench_max(base, runs) / 1e3);
  for (int k = 0; k < BP_KINDS; k++) {
    if (!enabled[k]) continue;
    bench_row(it);
    bench_cell_str(it, "pool", "%s", bp_name((bp_kind)k));
    bench_cell_num(it, "CPU us/s", "%.1f", bench_median(idle[k], runs) / 1e3);
    bench_cell_num(it, "min", "%.1f", bench_min(idle[k], runs) / 1e3);
    bench_cell_num(it, "max", "%.1f", bench_max(idle[k], runs) / 1e3);
    bench_cell_num(it, "above baseline", "%.1f",
                   (bench_median(idle[k], runs) - bench_median(base, runs)) / 1e3);
  }
  bench_table_print(it);
  bench_note(b, "idle CPU is the whole process's (every thread, the sleeping benchmark thread "
                "included), read from CLOCK_PROCESS_CPUTIME_ID (the process's clock_getcpuclockid "
                "clock); the baseline row is the same window with no pool. The target for taskorch "
                "is under 1000 us per second.");
  for (int k = 0; k < BP_KINDS; k++) {
    free(lat[k]);
    free(idle[k]);
  }
  free(buf);
  free(base);
  sem_destroy(&slot.done);
  return bench_finish(b);
}
