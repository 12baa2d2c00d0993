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
 * Self-contained (no shared benchmark code): it needs only the library.
 * The measuring thread never polls: it waits on a condition variable that
 * the last task of a round signals. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "taskorch.h"

#define NAME "bench_timers"
#define MAX_DELAYS 8

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- options ------------------------------------------------------------ */

typedef struct config {
  long delays[MAX_DELAYS];
  size_t ndelays;
  long concurrent; /* timers armed at once in the concurrent shape */
  long single_ms;  /* time budget per delay for the single shape */
  long runs;
  long workers;
  bool smoke;
  const char *json;
} config;

static void usage(FILE *f) {
  fprintf(f, "usage: " NAME " [--smoke] [--runs N] [--json FILE] [--delays MS,MS,...]\n"
             "                    [--concurrent N] [--single-ms MS] [--workers N]\n"
             "\n"
             "Lateness of tko_submit_after deadlines: time from each deadline to its task's\n"
             "start, as p50/p90/p99/max in microseconds, for each delay, one timer at a time\n"
             "and many at once.\n"
             "\n"
             "  --smoke          a few seconds: 100 concurrent timers, short single rounds, 1 run\n"
             "  --runs N         repeat every case N times, samples pooled (default 3; smoke 1)\n"
             "  --json FILE      also write the results as JSON\n"
             "  --delays LIST    delays in ms, comma-separated (default 1,10,100)\n"
             "  --concurrent N   timers armed at once in the concurrent case (default 1000;\n"
             "                   smoke 100)\n"
             "  --single-ms MS   time spent per delay in the single case, at least 3 samples\n"
             "                   (default 1000; smoke 150)\n"
             "  --workers N      basic workers of the pool (default: CPU count)\n"
             "  --help           this text\n");
}

_Noreturn static void bad_arg(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, NAME ": ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, " (see --help)\n");
  va_end(ap);
  exit(2);
}

static long parse_long(const char *opt, const char *s, long min, long max) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (!*s || *end || errno) bad_arg("%s: '%s' is not a number", opt, s);
  if (v < min || v > max) bad_arg("%s must be in %ld..%ld (got %ld)", opt, min, max, v);
  return v;
}

static void parse_delays(config *c, const char *s) {
  c->ndelays = 0;
  char buf[256];
  snprintf(buf, sizeof buf, "%s", s);
  for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    if (c->ndelays == MAX_DELAYS) bad_arg("--delays: at most %d values", MAX_DELAYS);
    c->delays[c->ndelays++] = parse_long("--delays", tok, 0, 60000);
  }
  if (!c->ndelays) bad_arg("--delays needs at least one value");
}

static void parse_args(int argc, char **argv, config *c) {
  bool runs_given = false, conc_given = false, single_given = false;
  memset(c, 0, sizeof *c);
  parse_delays(c, "1,10,100");
  c->runs = 3;
  c->concurrent = 1000;
  c->single_ms = 1000;
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  c->workers = cpus < 1 ? 1 : cpus;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      exit(0);
    } else if (!strcmp(a, "--smoke")) {
      c->smoke = true;
    } else if (!strcmp(a, "--runs") || !strcmp(a, "--json") || !strcmp(a, "--delays") ||
               !strcmp(a, "--concurrent") || !strcmp(a, "--single-ms") || !strcmp(a, "--workers")) {
      if (!v) bad_arg("%s needs a value", a);
      i++;
      if (!strcmp(a, "--runs"))
        c->runs = parse_long(a, v, 1, 1000), runs_given = true;
      else if (!strcmp(a, "--json"))
        c->json = v;
      else if (!strcmp(a, "--delays"))
        parse_delays(c, v);
      else if (!strcmp(a, "--concurrent"))
        c->concurrent = parse_long(a, v, 1, 10000000), conc_given = true;
      else if (!strcmp(a, "--single-ms"))
        c->single_ms = parse_long(a, v, 1, 3600000), single_given = true;
      else
        c->workers = parse_long(a, v, 1, TKO_MAX_WORKERS);
    } else {
      bad_arg("unknown argument '%s'", a);
    }
  }
  if (c->smoke) {
    if (!runs_given) c->runs = 1;
    if (!conc_given) c->concurrent = 100;
    if (!single_given) c->single_ms = 150;
  }
}

/* ---- one round ---------------------------------------------------------- */

typedef struct slot {
  uint64_t deadline_ns;
  uint64_t late_ns; /* written by the task */
  struct round *r;
} slot;

typedef struct round {
  pthread_mutex_t mu; /* guards left */
  pthread_cond_t cv;  /* signalled when left reaches 0 */
  long left;
} round;

static int timer_task(void *arg) {
  uint64_t t = now_ns();
  slot *s = arg;
  s->late_ns = t > s->deadline_ns ? t - s->deadline_ns : 0;
  round *r = s->r;
  pthread_mutex_lock(&r->mu);
  if (--r->left == 0) pthread_cond_signal(&r->cv);
  pthread_mutex_unlock(&r->mu);
  return 0;
}

/* Arms n timers with delay_ms at once and waits until every task has run;
 * their lateness lands in out[0..n). */
static void run_round(tko_pool *pool, tko_timer *timers, slot *slots, long n, long delay_ms,
                      uint64_t *out) {
  round r = {.left = n};
  pthread_mutex_init(&r.mu, NULL);
  pthread_cond_init(&r.cv, NULL);
  for (long i = 0; i < n; i++) {
    tko_timer_init(&timers[i]);
    slots[i].r = &r;
    slots[i].deadline_ns = now_ns() + (uint64_t)delay_ms * 1000000u;
    int rc = tko_submit_after(pool, &timers[i], delay_ms, timer_task, &slots[i], 0);
    if (rc) {
      fprintf(stderr, NAME ": tko_submit_after: %s\n", tko_strerror(rc));
      exit(1);
    }
  }
  pthread_mutex_lock(&r.mu);
  while (r.left > 0)
    pthread_cond_wait(&r.cv, &r.mu);
  pthread_mutex_unlock(&r.mu);
  for (long i = 0; i < n; i++)
    out[i] = slots[i].late_ns;
  pthread_cond_destroy(&r.cv);
  pthread_mutex_destroy(&r.mu);
}

/* ---- statistics --------------------------------------------------------- */

typedef struct dist {
  size_t count;
  double mean_us, p50_us, p90_us, p99_us, max_us;
} dist;

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of sorted v[0..n). */
static uint64_t pct(const uint64_t *v, size_t n, double p) {
  size_t k = (size_t)(p / 100.0 * (double)n + 0.999999);
  if (k < 1) k = 1;
  if (k > n) k = n;
  return v[k - 1];
}

static dist summarize(uint64_t *v, size_t n) {
  dist d = {.count = n};
  if (!n) return d;
  qsort(v, n, sizeof *v, cmp_u64);
  double sum = 0;
  for (size_t i = 0; i < n; i++)
    sum += (double)v[i];
  d.mean_us = sum / (double)n / 1e3;
  d.p50_us = (double)pct(v, n, 50) / 1e3;
  d.p90_us = (double)pct(v, n, 90) / 1e3;
  d.p99_us = (double)pct(v, n, 99) / 1e3;
  d.max_us = (double)v[n - 1] / 1e3;
  return d;
}

/* ---- main --------------------------------------------------------------- */

typedef struct result {
  long delay_ms;
  const char *shape;
  long timers; /* armed at once */
  dist d;
} result;

int main(int argc, char **argv) {
  config c;
  parse_args(argc, argv, &c);

  tko_options o = tko_basic_options((unsigned)c.workers);
  o.name = "bt";
  tko_pool *pool = NULL;
  int rc = tko_pool_create(&pool, &o);
  if (rc) {
    fprintf(stderr, NAME ": tko_pool_create: %s\n", tko_strerror(rc));
    return 1;
  }

  long most = c.concurrent;
  tko_timer *timers = calloc((size_t)most, sizeof *timers);
  slot *slots = calloc((size_t)most, sizeof *slots);
  result res[2 * MAX_DELAYS];
  size_t nres = 0;
  if (!timers || !slots) {
    fprintf(stderr, NAME ": out of memory\n");
    return 1;
  }

  printf("# %s: lateness of delayed tasks\n\n", NAME);
  printf("- taskorch %s, %ld basic workers, %ld CPUs online\n", tko_version_string(), c.workers,
         sysconf(_SC_NPROCESSORS_ONLN));
  printf("- runs per case: %ld (samples pooled)%s\n", c.runs, c.smoke ? ", smoke sizes" : "");
  printf("- single: one timer at a time for ~%ld ms per delay; concurrent: %ld timers armed at "
         "once\n",
         c.single_ms, c.concurrent);
  printf("- lateness = task start - (time of arming + delay), microseconds\n\n");
  fflush(stdout);

  for (size_t di = 0; di < c.ndelays; di++) {
    long delay = c.delays[di];
    /* Single: as many samples as fit in single_ms, at least 3. */
    long per_run = delay > 0 ? c.single_ms / delay : c.single_ms * 10;
    if (per_run < 3) per_run = 3;
    size_t n = (size_t)(per_run * c.runs);
    uint64_t *v = malloc(n * sizeof *v);
    if (!v) return 1;
    size_t k = 0;
    for (long r = 0; r < c.runs; r++)
      for (long i = 0; i < per_run; i++)
        run_round(pool, timers, slots, 1, delay, &v[k++]);
    res[nres++] = (result){delay, "single", 1, summarize(v, k)};
    free(v);

    n = (size_t)(c.concurrent * c.runs);
    v = malloc(n * sizeof *v);
    if (!v) return 1;
    for (long r = 0; r < c.runs; r++)
      run_round(pool, timers, slots, c.concurrent, delay, &v[(size_t)r * (size_t)c.concurrent]);
    res[nres++] = (result){delay, "concurrent", c.concurrent, summarize(v, n)};
    free(v);
  }

  printf("| delay ms | shape      | timers at once | samples |  p50 us |  p90 us |  p99 us |"
         "   max us |  mean us |\n");
  printf("|---------:|:-----------|---------------:|--------:|--------:|--------:|--------:|"
         "---------:|---------:|\n");
  for (size_t i = 0; i < nres; i++) {
    const result *r = &res[i];
    printf("| %8ld | %-10s | %14ld | %7zu | %7.1f | %7.1f | %7.1f | %8.1f | %8.1f |\n", r->delay_ms,
           r->shape, r->timers, r->d.count, r->d.p50_us, r->d.p90_us, r->d.p99_us, r->d.max_us,
           r->d.mean_us);
  }

  /* The last task signals its round before the pool counts it finished. */
  tko_pool_wait_idle(pool, -1);
  tko_stats s;
  tko_pool_stats(pool, &s);
  int status = 0;
  uint64_t expected = 0;
  for (size_t i = 0; i < nres; i++)
    expected += res[i].d.count;
  if (s.submitted != expected || s.completed != expected) {
    fprintf(stderr,
            NAME ": check failed: %" PRIu64 " submitted, %" PRIu64 " completed, %" PRIu64
                 " expected\n",
            s.submitted, s.completed, expected);
    status = 1;
  }
  printf("\nEvery timer fired once: %" PRIu64 " tasks submitted and completed.\n", s.completed);

  if (c.json) {
    FILE *f = fopen(c.json, "w");
    if (!f) {
      fprintf(stderr, NAME ": cannot write %s: %s\n", c.json, strerror(errno));
      status = 1;
    } else {
      fprintf(f, "{\n  \"benchmark\": \"%s\",\n  \"version\": \"%s\",\n", NAME,
              tko_version_string());
      fprintf(f,
              "  \"config\": {\"workers\": %ld, \"runs\": %ld, \"smoke\": %s, \"concurrent\": %ld, "
              "\"single_ms\": %ld},\n",
              c.workers, c.runs, c.smoke ? "true" : "false", c.concurrent, c.single_ms);
      fprintf(f, "  \"unit\": \"us\",\n  \"cases\": [");
      for (size_t i = 0; i < nres; i++) {
        const result *r = &res[i];
        fprintf(f,
                "%s\n    {\"delay_ms\": %ld, \"shape\": \"%s\", \"timers\": %ld, \"samples\": %zu, "
                "\"p50\": %.3f, \"p90\": %.3f, \"p99\": %.3f, \"max\": %.3f, \"mean\": %.3f}",
                i ? "," : "", r->delay_ms, r->shape, r->timers, r->d.count, r->d.p50_us,
                r->d.p90_us, r->d.p99_us, r->d.max_us, r->d.mean_us);
      }
      fprintf(f, "\n  ],\n  \"checks_failed\": %d\n}\n", status);
      if (fclose(f) != 0) status = 1;
    }
  }

  tko_pool_destroy(pool);
  free(timers);
  free(slots);
  return status;
}
