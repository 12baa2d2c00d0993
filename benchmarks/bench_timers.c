/* SPDX-License-Identifier: MIT */
/* bench_timers: how late do delayed tasks start? For each delay (1, 10 and
 * 100 ms by default) it arms timers with tko_submit_after and measures, for
 * every one, the time from its deadline (the moment of arming plus the
 * delay) to the moment its task starts: the lateness. Two shapes per delay:
 *
 *   single      one timer at a time, armed again once its task has run
 *               (the timer thread's wake-up plus a worker's);
 *   concurrent  1,000 timers armed at once with the same delay, all due
 *               together (the deadline heap, the submit path and the
 *               workers under a burst).
 *
 * Reported: p50 / p90 / p99 / max and mean of the lateness, in
 * microseconds, over every sample of every run. The deadline is taken just
 * before each tko_submit_after call, so a lateness also includes the few
 * nanoseconds the call takes to read the clock itself.
 *
 * Checks: every timer fired exactly once (the pool's submitted and
 * completed counts equal the timers armed), and no task started before its
 * deadline (a timer never fires early).
 *
 * The measuring thread never polls: it waits on a condition variable that
 * the last task of a round signals. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench_common.h"
#include "taskorch.h"

/* ---- one round ---------------------------------------------------------- */

typedef struct slot {
  uint64_t deadline_ns;
  uint64_t start_ns; /* written by the task */
  struct round *r;
} slot;

typedef struct round {
  pthread_mutex_t mu; /* guards left */
  pthread_cond_t cv;  /* signalled when left reaches 0 */
  long left;
} round;

static int timer_task(void *arg) {
  slot *s = arg;
  s->start_ns = bench_now_ns();
  round *r = s->r;
  pthread_mutex_lock(&r->mu);
  if (--r->left == 0) pthread_cond_signal(&r->cv);
  pthread_mutex_unlock(&r->mu);
  return 0;
}

/* Arms n timers with delay_ms at once and waits until every task has run;
 * their lateness (ns) lands in out[0..n); a start before its deadline is
 * counted in *early (and its lateness is 0). */
static void run_round(tko_pool *pool, tko_timer *timers, slot *slots, long n, long delay_ms,
                      double *out, long *early) {
  round r = {.left = n};
  pthread_mutex_init(&r.mu, NULL);
  pthread_cond_init(&r.cv, NULL);
  for (long i = 0; i < n; i++) {
    tko_timer_init(&timers[i]);
    slots[i].r = &r;
    slots[i].deadline_ns = bench_now_ns() + (uint64_t)delay_ms * 1000000u;
    int rc = tko_submit_after(pool, &timers[i], delay_ms, timer_task, &slots[i], 0);
    if (rc) bench_die("tko_submit_after: %s", tko_strerror(rc));
  }
  pthread_mutex_lock(&r.mu);
  while (r.left > 0)
    pthread_cond_wait(&r.cv, &r.mu);
  pthread_mutex_unlock(&r.mu);
  for (long i = 0; i < n; i++) {
    bool ok = slots[i].start_ns >= slots[i].deadline_ns;
    *early += !ok;
    out[i] = ok ? (double)(slots[i].start_ns - slots[i].deadline_ns) : 0;
  }
  pthread_cond_destroy(&r.cv);
  pthread_mutex_destroy(&r.mu);
}

/* ---- main --------------------------------------------------------------- */

int main(int argc, char **argv) {
  bench_list delays;
  long concurrent, single_ms, workers;
  bench_opt opts[] = {
      {"delays", BENCH_OPT_LIST, &delays, "1,10,100", NULL, 0, 60000, "delays in ms"},
      {"concurrent", BENCH_OPT_LONG, &concurrent, "1000", "100", 1, 1e7,
       "timers armed at once in the concurrent shape"},
      {"single-ms", BENCH_OPT_LONG, &single_ms, "1000", "150", 1, 3600000,
       "time spent per delay in the single shape (at least 3 samples)"},
      {"workers", BENCH_OPT_LONG, &workers, "0", NULL, 0, TKO_MAX_WORKERS,
       "basic workers of the pool (0 = one per CPU)"},
  };
  bench *b = bench_init(argc, argv, "bench_timers",
                        "Lateness of tko_submit_after deadlines (deadline to task start) at "
                        "p50/p90/p99/max, one timer at a time and many at once.",
                        opts, sizeof opts / sizeof opts[0]);
  if (workers == 0) workers = (long)bench_cpus();
  bench_config(b, "lateness", "task start - (time of arming + delay), microseconds");

  tko_options o = tko_basic_options((unsigned)workers);
  o.name = "bt";
  tko_pool *pool = NULL;
  int rc = tko_pool_create(&pool, &o);
  if (rc) bench_die("tko_pool_create: %s", tko_strerror(rc));
  tko_timer *timers = calloc((size_t)concurrent, sizeof *timers);
  slot *slots = calloc((size_t)concurrent, sizeof *slots);
  if (!timers || !slots) bench_die("out of memory");

  bench_table *t = bench_table_new(b, "lateness", "lateness of delayed tasks (samples pooled)");
  long runs = b->runs, early = 0;
  uint64_t armed = 0;
  for (size_t di = 0; di < delays.n; di++) {
    long delay = delays.v[di];
    /* Single: as many samples as fit in single_ms, at least 3; then the
     * concurrent shape. */
    long per_run = delay > 0 ? single_ms / delay : single_ms * 10;
    if (per_run < 3) per_run = 3;
    for (int shape = 0; shape < 2; shape++) {
      long at_once = shape ? concurrent : 1, rounds = shape ? 1 : per_run;
      size_t n = (size_t)(at_once * rounds * runs), k = 0;
      double *v = malloc(n * sizeof *v);
      if (!v) bench_die("out of memory");
      for (long r = 0; r < runs; r++)
        for (long i = 0; i < rounds; i++, k += (size_t)at_once)
          run_round(pool, timers, slots, at_once, delay, &v[k], &early);
      armed += n;
      bench_row(t);
      bench_cell_int(t, "delay ms", delay);
      bench_cell_str(t, "shape", "%s", shape ? "concurrent" : "single");
      bench_cell_int(t, "timers at once", at_once);
      bench_cell_int(t, "samples", (long long)n);
      double mean = 0;
      for (size_t i = 0; i < n; i++) mean += v[i] / (double)n;
      bench_cell_num(t, "p50 us", "%.1f", bench_percentile(v, n, 50) / 1e3);
      bench_cell_num(t, "p90 us", "%.1f", bench_percentile(v, n, 90) / 1e3);
      bench_cell_num(t, "p99 us", "%.1f", bench_percentile(v, n, 99) / 1e3);
      bench_cell_num(t, "max us", "%.1f", bench_max(v, n) / 1e3);
      bench_cell_num(t, "mean us", "%.1f", mean / 1e3);
      free(v);
    }
  }
  bench_table_print(t);

  /* The last task signals its round before the pool counts it finished. */
  tko_pool_wait_idle(pool, -1);
  tko_stats s;
  tko_pool_stats(pool, &s);
  bench_check(b, s.submitted == armed && s.completed == armed,
              "%llu timers armed, %llu tasks submitted, %llu completed",
              (unsigned long long)armed, (unsigned long long)s.submitted,
              (unsigned long long)s.completed);
  bench_check(b, early == 0, "%ld tasks started before their deadline", early);
  tko_pool_destroy(pool);
  free(timers);
  free(slots);
  return bench_finish(b);
}
