/* SPDX-License-Identifier: MIT */
/* bench_soak: a long run that should leave no trace. Pushes at least 100
 * million tasks (by default) through one elastic pool in cycles: a burst
 * from two producers - batches, single submits, a group, async tasks, a few
 * blocking tasks that make elastic workers start - then a quiet spell long
 * enough for every elastic worker to retire; a periodic timer ticks
 * throughout. Every few seconds it prints the resident set (from
 * /proc/self/statm), the thread count (/proc/self/task), the open file
 * descriptors (/proc/self/fd), the elastic workers alive / spawned / retired
 * and the throughput, and at the end the range of each over the run after a
 * warm-up, so a drift (a leak of memory, threads or descriptors) shows.
 *
 * A default run takes minutes; CTest runs a quick one (label benchmark).
 * It exits non-zero if the pool's accounting does not add up at the end
 * (completed != submitted), if threads or descriptors grew between the
 * first and the last quiet spell after the warm-up, or if the resident set
 * did not plateau: the largest RSS (read after a tko_pool_trim) of the
 * later half of those quiet spells may exceed the largest of the earlier
 * half by at most 1 MiB or 2% (whichever is more; allocator and page-cache
 * jitter, not a leak). The process runs with transparent huge pages off
 * (PR_SET_THP_DISABLE): a huge page granted to a burst's slab adds 2 MiB to
 * RSS at once, a step the kernel decides per run that would read as growth,
 * while small pages move RSS by what is touched. Under
 * a sanitizer the RSS check is skipped, said so: RSS then measures the
 * sanitizer's shadow memory and quarantine, not the pool.
 *
 *   bench_soak [--tasks N] [--seconds S] [--interval S] [--max-elastic N]
 *              [--idle-ms MS] [--cycle N] [--warmup S]
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "taskorch.h"

typedef struct config {
  uint64_t tasks;       /* total tasks to push */
  double seconds;       /* stop after this long (0 = no limit) */
  double interval;      /* seconds between report lines */
  unsigned max_elastic;
  unsigned idle_ms;
  uint64_t cycle;       /* tasks per burst */
} config;

static config cfg = {100000000ull, 0, 5, 3, 50, 2000000};

static atomic_bool stop;
static atomic_uint_fast64_t pushed;    /* accepted by the pool */
static atomic_uint_fast64_t ticks;     /* periodic timer runs */
static atomic_uint_fast64_t refused;   /* submits refused (must stay 0) */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void sleep_ms(unsigned ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
  }
}

/* ---- /proc probes ------------------------------------------------------------ */

static long rss_kb(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  if (!f) return -1;
  long size = 0, resident = 0;
  if (fscanf(f, "%ld %ld", &size, &resident) != 2) resident = -1;
  fclose(f);
  return resident < 0 ? -1 : resident * (sysconf(_SC_PAGESIZE) / 1024);
}

static int count_dir(const char *path) {
  DIR *d = opendir(path);
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL)
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n - (strcmp(path, "/proc/self/fd") == 0); /* opendir's own fd */
}

/* ---- tasks ---------------------------------------------------------------------- */

static int empty_task(void *arg) {
  (void)arg;
  return 0;
}

static int failing_task(void *arg) {
  (void)arg;
  return 1;
}

/* A blocking task: tells the pool, so an elastic worker starts at once. */
static int blocking_task(void *arg) {
  (void)arg;
  tko_blocking_begin();
  sleep_ms(1);
  tko_blocking_end();
  return 0;
}

static int tick_task(void *arg) {
  (void)arg;
  atomic_fetch_add_explicit(&ticks, 1, memory_order_relaxed);
  return 0;
}

static int async_task(tko_async *op, void *arg) {
  (void)arg;
  return tko_async_complete(op, 0) ? 1 : 0; /* completes at once */
}

/* ---- producers -------------------------------------------------------------------- */

typedef struct producer {
  tko_pool *pool;
  int id;
  uint64_t quota; /* tasks to push in this burst */
} producer;

static void count_push(uint64_t n) { atomic_fetch_add_explicit(&pushed, n, memory_order_relaxed); }

static void refuse(void) { atomic_fetch_add_explicit(&refused, 1, memory_order_relaxed); }

static void *producer_main(void *arg) {
  producer *p = arg;
  tko_task batch[64];
  for (int i = 0; i < 64; i++)
    batch[i] = (tko_task){i % 61 == 60 ? failing_task : empty_task, NULL, i % 5 - 2};
  uint64_t done = 0;
  unsigned round = 0;
  while (done < p->quota && !atomic_load_explicit(&stop, memory_order_relaxed)) {
    round++;
    if (round % 512 == 0) { /* now and then a blocking task: elastic growth */
      if (tko_submit(p->pool, blocking_task, NULL, 1)) refuse();
      else done++;
    }
    if (round % 64 == 0) { /* an async task */
      if (tko_submit_async(p->pool, async_task, NULL, 0)) refuse();
      else done++;
    }
    if (round % 8 == 0) { /* single submits */
      for (int i = 0; i < 16; i++) {
        if (tko_submit(p->pool, empty_task, NULL, i & 3)) refuse();
        else done++;
      }
    }
    if (tko_submit_batch(p->pool, batch, 64)) refuse();
    else done += 64;
    if ((round & 63) == 0) {
      count_push(done);
      p->quota -= done < p->quota ? done : p->quota;
      done = 0;
    }
  }
  count_push(done);
  return NULL;
}

/* One burst: two producers, then a group of 1000 waited on. */
static void burst(tko_pool *pool, uint64_t n) {
  producer pr[2] = {{pool, 0, n / 2}, {pool, 1, n - n / 2}};
  pthread_t t[2];
  for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, producer_main, &pr[i]);
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
  tko_group g;
  tko_group_init(&g);
  uint64_t in_group = 0;
  for (int i = 0; i < 1000; i++) {
    if (tko_group_submit(pool, &g, empty_task, NULL, 0)) refuse();
    else in_group++;
  }
  tko_group_wait(&g, -1);
  tko_group_destroy(&g);
  count_push(in_group);
}

/* ---- reporting -------------------------------------------------------------------------- */

typedef struct sample {
  double t;
  long rss;
  int threads, fds;
  uint64_t completed;
} sample;

typedef struct range {
  long min, max;
  bool any;
} range;

static void widen(range *r, long v) {
  if (!r->any || v < r->min) r->min = v;
  if (!r->any || v > r->max) r->max = v;
  r->any = true;
}

static range rss_range, thread_range, fd_range;
static double warmup_s = 10;
static bool warmup_given;

/* RSS at each quiet spell after the warm-up, for the plateau check. */
static long *quiet_rss;
static size_t nquiet_rss, quiet_rss_cap;

static void note_quiet_rss(long kb) {
  if (nquiet_rss == quiet_rss_cap) {
    quiet_rss_cap = quiet_rss_cap ? 2 * quiet_rss_cap : 64;
    long *p = realloc(quiet_rss, quiet_rss_cap * sizeof *p);
    if (!p) {
      fprintf(stderr, "bench_soak: out of memory\n");
      exit(1);
    }
    quiet_rss = p;
  }
  quiet_rss[nquiet_rss++] = kb;
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SOAK_SANITIZED 1
#else
#define SOAK_SANITIZED 0
#endif

/* The plateau: the later half's peak within max(1 MiB, 2%) of the earlier
 * half's. Fewer than 4 quiet spells judge nothing (said, and failed). */
static bool rss_plateau(void) {
  if (SOAK_SANITIZED) {
    printf("RSS plateau: not checked under a sanitizer (RSS measures its shadow memory)\n");
    return true;
  }
  if (nquiet_rss < 4) {
    printf("RSS plateau: only %zu quiet spells after the warm-up; need 4 (raise --tasks or "
           "lower --cycle or --warmup)\n",
           nquiet_rss);
    return false;
  }
  size_t half = nquiet_rss / 2;
  long early = 0, late = 0;
  for (size_t i = 0; i < nquiet_rss; i++) {
    long *peak = i < half ? &early : &late;
    if (quiet_rss[i] > *peak) *peak = quiet_rss[i];
  }
  long slack = early / 50 > 1024 ? early / 50 : 1024;
  bool ok = late <= early + slack;
  printf("RSS plateau over %zu quiet spells: peak %.1f MiB in the earlier half, %.1f MiB in the "
         "later (allowed %.1f): %s\n",
         nquiet_rss, (double)early / 1024, (double)late / 1024, (double)(early + slack) / 1024,
         ok ? "plateau" : "STILL GROWING");
  return ok;
}

static sample take(tko_pool *pool, double t0) {
  tko_stats st;
  tko_pool_stats(pool, &st);
  return (sample){now_s() - t0, rss_kb(), count_dir("/proc/self/task"), count_dir("/proc/self/fd"),
                  st.completed};
}

static void report(tko_pool *pool, const sample *s, const sample *prev) {
  tko_stats st;
  tko_pool_stats(pool, &st);
  double dt = s->t - prev->t;
  double rate = dt > 0 ? (double)(s->completed - prev->completed) / dt : 0;
  printf("%8.1fs  done %12" PRIu64 "  %6.2f Mtask/s  rss %7.1f MiB  threads %3d  fds %3d  "
         "elastic %u/%u (spawned %" PRIu64 ", retired %" PRIu64 ")  queued %" PRIu64 "\n",
         s->t, s->completed, rate / 1e6, (double)s->rss / 1024, s->threads, s->fds,
         st.elastic_workers, cfg.max_elastic, st.elastic_spawned, st.elastic_retired, st.queued);
  fflush(stdout);
  if (s->t >= warmup_s) {
    widen(&rss_range, s->rss);
    widen(&thread_range, s->threads);
    widen(&fd_range, s->fds);
  }
}

typedef struct reporter {
  tko_pool *pool;
  double t0;
  atomic_bool done;
} reporter;

static void *reporter_main(void *arg) {
  reporter *r = arg;
  sample prev = take(r->pool, r->t0);
  while (!atomic_load(&r->done)) {
    double next = prev.t + cfg.interval;
    while (!atomic_load(&r->done) && now_s() - r->t0 < next) sleep_ms(50);
    sample s = take(r->pool, r->t0);
    report(r->pool, &s, &prev);
    prev = s;
    if (cfg.seconds > 0 && s.t >= cfg.seconds) atomic_store(&stop, true);
  }
  return NULL;
}

/* ---- main --------------------------------------------------------------------------------- */

static void usage(FILE *f) {
  fprintf(f,
          "usage: bench_soak [options]\n"
          "  --tasks N        tasks to push in all (default 100000000)\n"
          "  --seconds S      stop after S seconds even if fewer were pushed (default: none)\n"
          "  --interval S     seconds between report lines (default 5)\n"
          "  --max-elastic N  elastic workers at most (default 3; 1 basic worker)\n"
          "  --idle-ms MS     elastic idle timeout (default 50)\n"
          "  --cycle N        tasks per burst between quiet spells (default 2000000)\n"
          "  --warmup S       seconds before the checks start watching (default 10, or a\n"
          "                   quarter of --seconds when that is under 20)\n"
          "Prints RSS, threads, open fds, elastic workers and throughput every interval;\n"
          "exits 1 if the pool's counts do not add up, threads/fds grew over the run or\n"
          "RSS did not plateau (see the top of bench_soak.c).\n");
}

static bool parse_num(const char *s, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end || v < 0) return false;
  *out = v;
  return true;
}

int main(int argc, char **argv) {
  /* Before any memory is mapped; see the top of this file. Where the kernel
   * refuses, the check runs with whatever pages it grants. */
  (void)prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0);
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      return 0;
    }
    double v;
    if (i + 1 >= argc || !parse_num(argv[i + 1], &v)) {
      fprintf(stderr, "bench_soak: %s needs a non-negative number\n", a);
      usage(stderr);
      return 2;
    }
    i++;
    if (!strcmp(a, "--tasks")) cfg.tasks = (uint64_t)v;
    else if (!strcmp(a, "--seconds")) cfg.seconds = v;
    else if (!strcmp(a, "--interval") && v > 0) cfg.interval = v;
    else if (!strcmp(a, "--max-elastic") && v >= 1 && v <= TKO_MAX_ELASTIC) cfg.max_elastic = (unsigned)v;
    else if (!strcmp(a, "--idle-ms") && v >= 1 && v <= 60000) cfg.idle_ms = (unsigned)v;
    else if (!strcmp(a, "--cycle") && v >= 1000) cfg.cycle = (uint64_t)v;
    else if (!strcmp(a, "--warmup")) warmup_s = v, warmup_given = true;
    else {
      fprintf(stderr, "bench_soak: bad option or value: %s %s\n", a, argv[i]);
      usage(stderr);
      return 2;
    }
  }
  if (!warmup_given && cfg.seconds > 0 && cfg.seconds < 2 * warmup_s) warmup_s = cfg.seconds / 4;

  tko_options o = tko_elastic_options(1, cfg.max_elastic, cfg.idle_ms);
  o.name = "soak";
  tko_pool *pool;
  int rc = tko_pool_create(&pool, &o);
  if (rc) {
    fprintf(stderr, "bench_soak: create: %s\n", tko_strerror(rc));
    return 1;
  }
  tko_timer timer;
  tko_timer_init(&timer);
  if ((rc = tko_submit_every(pool, &timer, 10, tick_task, NULL, 5))) {
    fprintf(stderr, "bench_soak: timer: %s\n", tko_strerror(rc));
    return 1;
  }
  printf("bench_soak: %" PRIu64 " tasks%s, bursts of %" PRIu64 ", 1 basic + up to %u elastic "
         "workers (idle %u ms), report every %.0f s\n",
         cfg.tasks, cfg.seconds > 0 ? " or the time limit" : "", cfg.cycle, cfg.max_elastic,
         cfg.idle_ms, cfg.interval);
  double t0 = now_s();
  reporter rep = {pool, t0, false};
  pthread_t rt;
  pthread_create(&rt, NULL, reporter_main, &rep);

  int quiet_threads_first = -1, quiet_threads_last = -1, quiet_fds_first = -1, quiet_fds_last = -1;
  unsigned cycles = 0, retired_all = 0;
  while (atomic_load(&pushed) < cfg.tasks && !atomic_load(&stop)) {
    uint64_t left = cfg.tasks - atomic_load(&pushed);
    burst(pool, left < cfg.cycle ? left : cfg.cycle);
    tko_pool_wait_idle(pool, -1);
    /* Quiet: long enough for every elastic worker to retire. */
    sleep_ms(cfg.idle_ms * 3 + 20);
    tko_stats st;
    tko_pool_stats(pool, &st);
    if (st.elastic_workers == 0) retired_all++;
    /* Threads not counting elastic workers still alive: a periodic tick
     * every 10 ms can keep one busy enough never to idle out (the most
     * recently idle worker is woken first), which is not a leak. */
    int th = count_dir("/proc/self/task") - (int)st.elastic_workers;
    int fd = count_dir("/proc/self/fd");
    if (now_s() - t0 >= warmup_s) {
      if (quiet_threads_first < 0) quiet_threads_first = th, quiet_fds_first = fd;
      quiet_threads_last = th;
      quiet_fds_last = fd;
      /* RSS after a trim: the idle decay gives a burst's memory back on
       * its own, but when depends on timing (on a loaded machine a spell
       * can end before it ran, and a burst that queued more than the
       * earlier ones then reads as growth); a leak is what no trim gives
       * back. */
      tko_pool_trim(pool);
      note_quiet_rss(rss_kb());
    }
    cycles++;
  }
  double elapsed = now_s() - t0;
  atomic_store(&rep.done, true);
  pthread_join(rt, NULL);
  tko_timer_cancel(&timer);
  tko_pool_wait_idle(pool, -1);
  tko_stats st;
  tko_pool_stats(pool, &st);
  uint64_t accepted = atomic_load(&pushed) + atomic_load(&ticks);
  bool counts_ok = st.completed + st.cancelled == st.submitted && st.submitted == accepted &&
                   atomic_load(&refused) == 0;
  printf("\nbench_soak: %" PRIu64 " tasks in %.1f s (%.2f Mtask/s), %u cycles, elastic workers "
         "all retired in %u quiet spells; spawned %" PRIu64 ", retired %" PRIu64 ", peak %u\n",
         st.completed, elapsed, (double)st.completed / elapsed / 1e6, cycles, retired_all,
         st.elastic_spawned, st.elastic_retired, st.elastic_peak);
  printf("after %.0f s warm-up: rss %.1f..%.1f MiB, threads %ld..%ld, fds %ld..%ld\n", warmup_s,
         (double)rss_range.min / 1024, (double)rss_range.max / 1024, thread_range.min,
         thread_range.max, fd_range.min, fd_range.max);
  printf("quiet spells (threads less live elastic workers): threads %d -> %d, fds %d -> %d; submitted %" PRIu64 " = completed %" PRIu64
         " + cancelled %" PRIu64 " (%" PRIu64 " failed by design); %s\n",
         quiet_threads_first, quiet_threads_last, quiet_fds_first, quiet_fds_last, st.submitted,
         st.completed, st.cancelled, st.failed, counts_ok ? "counts add up" : "COUNTS DO NOT ADD UP");
  bool drift = quiet_threads_last > quiet_threads_first || quiet_fds_last > quiet_fds_first;
  if (drift) printf("bench_soak: threads or fds grew between quiet spells\n");
  bool plateau = rss_plateau();
  printf("checks: %d passed, %d failed\n", counts_ok + !drift + plateau,
         !counts_ok + drift + !plateau);
  tko_pool_destroy(pool);
  free(quiet_rss);
  return counts_ok && !drift && plateau ? 0 : 1;
}
