/* SPDX-License-Identifier: MIT */
/* bench_alloc: what the pool allocates, measured by the allocator itself.
 * With jemalloc linked, its cumulative statistics over all arenas give the
 * allocations and bytes per task in steady state (a warmed pool, then a
 * million tasks), and across elastic spawn/retire cycles; RSS is read
 * before and after each. Nothing may grow: the design promises zero heap
 * allocations per task once the queue has grown to the workload.
 *
 * jemalloc's arena counters see an allocation only when it reaches the
 * arena; with thread caches on, most mallocs are served from a cache and
 * counted only in refills. So this program turns thread caches off (the
 * malloc_conf below), making nmalloc count every allocation exactly. That
 * makes malloc slower here, which is fine: nothing in this program is a
 * timing. Under a sanitizer, whose allocator replaces jemalloc, only RSS is
 * reported. The queue slab column is tko_stats.queue_bytes: past 512 KiB the
 * slab is mapped directly (not malloc'd), so its growth shows there and in RSS.
 *
 * Checks (with jemalloc active): a steady run allocates nothing (the
 * warm-up grew the ring and the queue to the largest backlog); the
 * elastic spawn/retire cycles after the first allocate at most once per
 * elastic slot (the C library's set-up of a thread on a fresh stack), not
 * once per spawn or per cycle. */
#define _GNU_SOURCE
#include <stdio.h>
#include <taskorch/coalescer.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"
#include "taskorch.h"

#ifdef TKO_HAVE_JEMALLOC
/* Read by jemalloc at start-up (the documented way to configure it from
 * the program). */
const char *malloc_conf = "tcache:false";
#endif

static int empty_task(void *arg) {
  (void)arg;
  return 0;
}

static uint64_t burst_sleep_ns;

static int blocking_task(void *arg) {
  (void)arg;
  bench_sleep_ns(burst_sleep_ns);
  return 0;
}

static void submit_tasks(tko_pool *pool, long tasks) {
  for (long i = 0; i < tasks; i++) {
    int rc = tko_submit(pool, empty_task, NULL, (int)(i & 3));
    if (rc) bench_die("tko_submit: %s", tko_strerror(rc));
  }
}

static void submit_all(tko_pool *pool, long tasks) {
  submit_tasks(pool, tasks);
  tko_pool_wait_idle(pool, -1);
}

/* The warm-up: the same tasks submitted to the paused pool, so that all of
 * them wait at once - the largest backlog the workload can make - and the
 * submitter's ring, then the queue, grow to hold it. Whether an unpaused
 * run forms a backlog is the machine's timing (the workers keep up, or
 * not), and a ring grows by a segment per 1,024 tasks of backlog it has
 * not held before: a warm-up the workers kept up with would leave that
 * growth to a later run. */
static void warm_up(tko_pool *pool, long tasks) {
  int rc = tko_pool_pause(pool);
  if (rc) bench_die("tko_pool_pause: %s", tko_strerror(rc));
  submit_tasks(pool, tasks);
  rc = tko_pool_resume(pool);
  if (rc) bench_die("tko_pool_resume: %s", tko_strerror(rc));
  tko_pool_wait_idle(pool, -1);
}

static void add_mem_row(bench_table *t, const char *what, double per, const char *unit,
                        const bench_mem *m0, const bench_mem *m1, bool have, uint64_t rss0,
                        uint64_t rss1, tko_pool *pool) {
  bench_row(t);
  bench_cell_str(t, "phase", "%s", what);
  if (have) {
    bench_cell_num(t, "allocs", "%.0f", (double)(m1->nmalloc - m0->nmalloc));
    bench_cell_num(t, unit[0] == 't' ? "allocs/task" : "allocs/cycle", "%.6f",
                   (double)(m1->nmalloc - m0->nmalloc) / per);
    bench_cell_num(t, unit[0] == 't' ? "bytes/task" : "bytes/cycle", "%.2f",
                   (double)(m1->bytes - m0->bytes) / per);
    bench_cell_num(t, "live bytes change", "%.0f", (double)m1->live - (double)m0->live);
  } else {
    bench_cell_str(t, "allocs", "n/a");
  }
  bench_cell_num(t, "RSS before KiB", "%.0f", (double)rss0 / 1024);
  bench_cell_num(t, "RSS after KiB", "%.0f", (double)rss1 / 1024);
  bench_cell_num(t, "RSS change KiB", "%.0f", ((double)rss1 - (double)rss0) / 1024);
  tko_stats st;
  tko_pool_stats(pool, &st);
  bench_cell_num(t, "queue slab KiB", "%.0f", (double)st.queue_bytes / 1024);
}

/* Memory at three moments of a burst: before it, at its peak, and after
 * the memory should have gone back. "held" is what
 * the object itself reports holding (the queue's slab), or jemalloc's live
 * bytes for the coalescer's malloc'd tables. */
typedef struct burst_mem {
  uint64_t rss[3], held[3];
} burst_mem;

static void add_burst_row(bench_table *t, const char *what, const char *held_what,
                          const burst_mem *m) {
  static const char *when[3] = {"before", "peak", "after"};
  bench_row(t);
  bench_cell_str(t, "burst", "%s", what);
  char key[48];
  for (int i = 0; i < 3; i++) {
    snprintf(key, sizeof key, "RSS %s KiB", when[i]);
    bench_cell_num(t, key, "%.0f", (double)m->rss[i] / 1024);
  }
  for (int i = 0; i < 3; i++) {
    snprintf(key, sizeof key, "%s %s KiB", held_what, when[i]);
    bench_cell_num(t, key, "%.0f", (double)m->held[i] / 1024);
  }
}

static uint64_t queue_bytes(tko_pool *pool) {
  tko_stats st;
  tko_pool_stats(pool, &st);
  return st.queue_bytes;
}

/* A backlog of `tasks` queued on a paused pool, drained, then trimmed. */
static void burst_queue(bench *b, bench_table *t, long tasks, bool judge_rss) {
  tko_options o = tko_basic_options(2);
  tko_pool *pool;
  int rc = tko_pool_create(&pool, &o);
  if (rc) bench_die("tko_pool_create: %s", tko_strerror(rc));
  burst_mem m;
  m.rss[0] = bench_rss_bytes();
  m.held[0] = queue_bytes(pool);
  tko_pool_pause(pool);
  for (long i = 0; i < tasks; i++)
    if ((rc = tko_submit(pool, empty_task, NULL, (int)(i & 3))) != 0)
      bench_die("tko_submit: %s", tko_strerror(rc));
  m.rss[1] = bench_rss_bytes();
  m.held[1] = queue_bytes(pool);
  tko_pool_resume(pool);
  tko_pool_wait_idle(pool, -1);
  tko_pool_trim(pool);
  /* The burst waited in this thread's submit ring first, whose segments
   * are malloc'd: the trim frees them, and the purge makes jemalloc hand
   * their pages back now rather than after its decay time. */
  bench_jemalloc_purge();
  m.rss[2] = bench_rss_bytes();
  m.held[2] = queue_bytes(pool);
  add_burst_row(t, "queue: paused backlog, drained, tko_pool_trim", "slab", &m);
  bench_check(b, m.held[2] == m.held[0], "queue slab %llu bytes after the trim, %llu at create",
              (unsigned long long)m.held[2], (unsigned long long)m.held[0]);
  /* RSS is judged only where jemalloc is the allocator, i.e. with no
   * sanitizer: ThreadSanitizer's shadow of the unmapped slab stays resident. */
  if (judge_rss)
    bench_check(b, m.rss[2] < m.rss[1] &&
                       (m.rss[2] <= m.rss[0] || m.rss[2] - m.rss[0] <= (m.rss[1] - m.rss[0]) / 4),
              "queue burst: RSS %llu KiB after the trim, %llu before, %llu at the peak",
              (unsigned long long)m.rss[2] / 1024, (unsigned long long)m.rss[0] / 1024,
              (unsigned long long)m.rss[1] / 1024);
  tko_pool_destroy(pool);
}

static void note_flush(void *user, const tko_coalesce_entry *e, size_t n) {
  (void)e;
  *(uint64_t *)user += n;
}

/* `keys` distinct keys marked at once, flushed, then a second of idle ticks. */
static void burst_coalescer(bench *b, bench_table *t, long keys, bool have) {
  tko_options o = tko_basic_options(1);
  tko_pool *pool;
  tko_coalescer *c;
  uint64_t flushed = 0;
  int rc = tko_pool_create(&pool, &o);
  if (!rc) rc = tko_coalescer_create(&c, pool, 10, note_flush, &flushed, NULL);
  if (rc) bench_die("create: %s", tko_strerror(rc));
  burst_mem m;
  bench_mem jm;
  m.rss[0] = bench_rss_bytes();
  m.held[0] = bench_jemalloc_snapshot(&jm) ? jm.live : 0;
  for (long k = 0; k < keys; k++)
    if ((rc = tko_coalescer_mark(c, (uint64_t)k, 1)) != 0)
      bench_die("tko_coalescer_mark: %s", tko_strerror(rc));
  m.rss[1] = bench_rss_bytes();
  m.held[1] = bench_jemalloc_snapshot(&jm) ? jm.live : 0;
  tko_coalescer_flush(c);
  /* The coalescer gives its tables back after 1 s of idle ticks: look every
   * 50 ms, for at most 10 s (a loaded machine delays the timer thread). */
  uint64_t target = m.held[0] + (m.held[1] - m.held[0]) / 8;
  int waited_ms = 0;
  do {
    bench_sleep_ns(50000000u);
    waited_ms += 50;
    m.held[2] = bench_jemalloc_snapshot(&jm) ? jm.live : 0;
  } while (have && m.held[2] > target && waited_ms < 10000);
  if (!have) { /* nothing to watch: give it the second and a half it needs */
    bench_sleep_ns(1500000000u);
    waited_ms += 1500;
  }
  m.rss[2] = bench_rss_bytes();
  char what[96];
  snprintf(what, sizeof what, "coalescer: distinct keys marked, flushed, %d ms idle", waited_ms);
  add_burst_row(t, what, "malloc live", &m);
  bench_check(b, flushed == (uint64_t)keys, "coalescer burst: %llu of %ld keys flushed",
              (unsigned long long)flushed, keys);
  if (have)
    bench_check(b, m.held[2] <= target,
                "coalescer burst: %llu live bytes after %d ms idle, %llu before, %llu at the peak",
                (unsigned long long)m.held[2], waited_ms, (unsigned long long)m.held[0],
                (unsigned long long)m.held[1]);
  tko_coalescer_destroy(c);
  tko_pool_destroy(pool);
}

int main(int argc, char **argv) {
  long tasks, workers, cycles, burst, sleep_us, emax, idle_ms, backlog, keys;
  bench_opt opts[] = {
      {"tasks", BENCH_OPT_LONG, &tasks, "1000000", "2000", 1, 1e9,
       "tasks per measured run (and for the warm-up)"},
      {"workers", BENCH_OPT_LONG, &workers, "2", NULL, 1, 1024, "basic workers"},
      {"cycles", BENCH_OPT_LONG, &cycles, "100", "5", 1, 1e6, "elastic spawn/retire cycles"},
      {"burst", BENCH_OPT_LONG, &burst, "32", "8", 1, 1e6, "tasks per cycle's burst"},
      {"burst-sleep-us", BENCH_OPT_LONG, &sleep_us, "200", "100", 0, 1e7,
       "how long each burst task blocks"},
      {"elastic-max", BENCH_OPT_LONG, &emax, "4", NULL, 1, 1024, "elastic workers (cycles)"},
      {"elastic-idle-ms", BENCH_OPT_LONG, &idle_ms, "1", NULL, 1, 3600000,
       "elastic idle timeout (short, so workers retire fast)"},
      {"backlog", BENCH_OPT_LONG, &backlog, "4000000", "100000", 1, 1e9,
       "tasks queued at once in the memory-back burst"},
      {"keys", BENCH_OPT_LONG, &keys, "1000000", "50000", 1, 1e9,
       "distinct coalescer keys in the memory-back burst"},
  };
  bench *b = bench_init(argc, argv, "bench_alloc",
                        "Allocations and bytes per task in steady state and per elastic "
                        "spawn/retire cycle, from jemalloc's own statistics, and RSS before and "
                        "after: nothing may grow.",
                        opts, sizeof opts / sizeof opts[0]);
  burst_sleep_ns = (uint64_t)sleep_us * 1000u;
  bool have = bench_jemalloc_active();
  bench_mem m0 = {0}, m1 = {0};
  bench_config(b, "allocation counts",
               have ? "jemalloc arena statistics over all arenas, thread caches off (exact)"
                    : "unavailable (jemalloc not linked or not the active malloc): RSS only");

  /* Steady state: warm the pool with the same workload, all of it queued
   * at once (warm_up), so the queue has grown to what it needs, then
   * measure `runs` times. */
  bench_table *t = bench_table_new(b, "steady", "steady state: empty tasks on a warmed basic pool");
  uint64_t rss_start = bench_rss_bytes();
  tko_options o = tko_basic_options((unsigned)workers);
  tko_pool *pool;
  int rc = tko_pool_create(&pool, &o);
  if (rc) bench_die("tko_pool_create: %s", tko_strerror(rc));
  bench_jemalloc_snapshot(&m0);
  warm_up(pool, tasks);
  bench_jemalloc_snapshot(&m1);
  uint64_t rss_warm = bench_rss_bytes();
  add_mem_row(t, "warm-up, paused (queue grows)", (double)tasks, "task", &m0, &m1, have, rss_start,
              rss_warm, pool);
  size_t runs = (size_t)b->runs;
  double *per = calloc(runs, sizeof *per);
  if (!per) bench_die("out of memory");
  for (size_t r = 0; r < runs; r++) {
    uint64_t rss0 = bench_rss_bytes();
    tko_stats q0, q1;
    tko_pool_stats(pool, &q0);
    bench_jemalloc_snapshot(&m0);
    submit_all(pool, tasks);
    bench_jemalloc_snapshot(&m1);
    tko_pool_stats(pool, &q1);
    uint64_t rss1 = bench_rss_bytes();
    /* The claim, checked: no allocation at all. The warm-up queued every
     * task at once, so no run can make a larger backlog for the ring or
     * the queue to grow to. */
    uint64_t allocs = m1.nmalloc - m0.nmalloc;
    if (have)
      bench_check(b, allocs == 0,
                  "steady run %zu: %llu allocations for %ld tasks (queue slab %llu -> %llu "
                  "bytes)",
                  r + 1, (unsigned long long)allocs, tasks, (unsigned long long)q0.queue_bytes,
                  (unsigned long long)q1.queue_bytes);
    char what[48];
    snprintf(what, sizeof what, "steady run %zu", r + 1);
    add_mem_row(t, what, (double)tasks, "task", &m0, &m1, have, rss0, rss1, pool);
    per[r] = (double)(m1.nmalloc - m0.nmalloc) / (double)tasks;
  }
  tko_stats st;
  tko_pool_stats(pool, &st);
  bench_check(b, st.completed == (uint64_t)tasks * (runs + 1),
              "steady: %llu of %llu tasks completed", (unsigned long long)st.completed,
              (unsigned long long)tasks * (runs + 1));
  tko_pool_destroy(pool);
  bench_table_print(t);

  /* Elastic cycles: each burst spawns elastic workers, which then retire;
   * one warm-up cycle first (thread stacks and first-use allocations). */
  char title[160];
  snprintf(title, sizeof title,
           "elastic spawn/retire: 1 basic + up to %ld elastic, idle %ld ms, %ld cycles of %ld "
           "tasks blocking %ld us",
           emax, idle_ms, cycles, burst, sleep_us);
  bench_table *ct = bench_table_new(b, "elastic", title);
  o = tko_elastic_options(1, (unsigned)emax, (unsigned)idle_ms);
  bench_retire_watch watch;
  bench_retire_watch_init(&watch, &o);
  rc = tko_pool_create(&pool, &o);
  if (rc) bench_die("tko_pool_create: %s", tko_strerror(rc));
  uint64_t rss0 = bench_rss_bytes();
  /* A retired worker's thread runs its thread_stop hook, then exits; the
   * C library can give its stack to the next spawn only once it is gone.
   * Each cycle waits for that too, or a spawn that came first maps a fresh
   * stack (and callocs its DTV): an allocation the check below would
   * count against the pool. */
  unsigned threads = bench_thread_count();
  long not_retired = 0, not_exited = 0;
  for (long c = 0; c <= cycles; c++) {
    if (c == 1) { /* after the warm-up cycle */
      rss0 = bench_rss_bytes();
      bench_jemalloc_snapshot(&m0);
    }
    for (long i = 0; i < burst; i++)
      if ((rc = tko_submit(pool, blocking_task, NULL, 0)) != 0)
        bench_die("tko_submit: %s", tko_strerror(rc));
    tko_pool_wait_idle(pool, -1);
    if (!bench_retire_wait(&watch, pool, 10000 + 10 * idle_ms)) not_retired++;
    if (threads && !bench_wait_thread_count(threads, 10000)) not_exited++;
  }
  bench_jemalloc_snapshot(&m1);
  uint64_t rss1 = bench_rss_bytes();
  tko_pool_stats(pool, &st);
  add_mem_row(ct, "cycles after the first", (double)cycles, "cycle", &m0, &m1, have, rss0, rss1,
              pool);
  bench_table_print(ct);
  bench_note(b, "elastic cycles: %llu workers spawned, %llu retired, peak %u.",
             (unsigned long long)st.elastic_spawned, (unsigned long long)st.elastic_retired,
             st.elastic_peak);
  bench_check(b, not_retired == 0, "%ld cycles did not see every elastic worker retire",
              not_retired);
  bench_check(b, not_exited == 0, "%ld cycles did not see every retired worker's thread exit",
              not_exited);
  /* glibc callocs a new thread's DTV when it maps a fresh stack rather than
   * reusing a cached one: once per new high-water of live threads, at most
   * once per elastic slot. Per spawn or per cycle would be more. */
  if (have)
    bench_check(b, m1.nmalloc - m0.nmalloc <= (uint64_t)emax,
                "elastic cycles: %llu allocations in %ld spawn/retire cycles (%llu spawns); at "
                "most %ld allowed (the C library's thread set-up, once per elastic slot)",
                (unsigned long long)(m1.nmalloc - m0.nmalloc), cycles,
                (unsigned long long)st.elastic_spawned, emax);
  else
    bench_note(b, "allocation checks skipped: jemalloc is not the active malloc.");
  if (st.elastic_spawned == 0)
    bench_note(b, "the bursts never spawned an elastic worker: the cycles measured nothing "
                  "(try a longer --burst-sleep-us or a larger --burst).");
  tko_pool_destroy(pool);
  bench_retire_watch_destroy(&watch);

  bench_table *mt = bench_table_new(b, "burst", "memory back after a burst: before, at the peak, after");
  burst_queue(b, mt, backlog, have);
  burst_coalescer(b, mt, keys, have);
  bench_table_print(mt);
  bench_note(b, "memory back: the queue's slab past 512 KiB is its own mapping, unmapped by the "
                "trim, so RSS drops at once; the coalescer's tables go back to malloc (its live "
                "bytes drop), and jemalloc returns those pages to the system only after its decay "
                "time (dirty_decay_ms, 10 s by default), so RSS lags there.");

  if (have)
    bench_note(b,
               "steady state: %.6f allocations per task (median of %zu runs; the design target "
               "is 0). The warm-up queued every task on the paused pool, so the submitter's ring "
               "(a segment per 1,024 tasks) and the queue grew to the largest backlog a run can "
               "make, and a steady run has nothing left to grow. Thread stacks are mmap'd by the C "
               "library, not malloc'd, so they show in RSS only; so does a queue slab past 512 KiB "
               "(its own huge-page mapping): the queue slab column shows its size after each "
               "phase, and a step in it is a growth.",
               bench_median(per, runs), runs);
  free(per);
  return bench_finish(b);
}
