/* SPDX-License-Identifier: MIT */
/* Shared code for the benchmark executables: argument parsing, timing,
 * medians and percentiles, calibrated busy work, aligned (markdown) tables,
 * JSON output, and the machine facts every report starts with; plus the
 * memory probes (RSS, jemalloc statistics) and thread-state probes that let
 * a benchmark wait for a quiet pool instead of guessing with a sleep.
 *
 * Every benchmark's stdout is markdown: a heading, the configuration as a
 * bullet list, then pipe tables padded so they line up in a terminal. That
 * way benchmarks/run_all can paste the output into RESULTS.md unchanged. */
#ifndef TKO_BENCH_COMMON_H
#define TKO_BENCH_COMMON_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "taskorch.h"

/* ---- options ------------------------------------------------------------ */

typedef enum bench_opt_type {
  BENCH_OPT_LONG,   /* value: long *, checked against [min, max] */
  BENCH_OPT_DOUBLE, /* value: double *, checked against [min, max] */
  BENCH_OPT_STRING, /* value: const char ** (points into argv or the table) */
  BENCH_OPT_LIST    /* value: bench_list *, comma-separated longs in [min, max] */
} bench_opt_type;

#define BENCH_LIST_MAX 16
typedef struct bench_list {
  long v[BENCH_LIST_MAX];
  size_t n;
} bench_list;

/* One benchmark-specific option. Defaults are written as command-line text
 * so that they are parsed, checked and printed exactly like a user's value. */
typedef struct bench_opt {
  const char *name; /* without the leading "--" */
  bench_opt_type type;
  void *value;
  const char *def;   /* default */
  const char *smoke; /* default under --smoke; NULL = def */
  double min, max;   /* inclusive range for numbers and list items */
  const char *help;
} bench_opt;

/* What every benchmark gets from the common options. */
typedef struct bench {
  const char *name;    /* e.g. "bench_cpu" */
  const char *summary; /* one line: what it measures */
  bool smoke;          /* --smoke: tiny sizes, one run */
  long runs;           /* --runs N: repetitions of each case (median reported) */
  const char *json;    /* --json FILE, or NULL */
  int failed_checks;   /* correctness checks that failed (bench_check) */
} bench;

/* Parses argv: --help (prints usage, exits 0), --smoke, --runs N (default 5,
 * 1 under --smoke), --json FILE, and the benchmark's own options. A bad
 * argument prints one line on stderr and exits 2. Then prints the heading
 * and the configuration (machine facts, then every option's value). */
bench *bench_init(int argc, char **argv, const char *name, const char *summary, bench_opt *opts,
                  size_t nopts);
/* bench_init with another default for --runs: a benchmark whose cases are
 * long keeps its default run under a minute with fewer repetitions. */
bench *bench_init_runs(int argc, char **argv, const char *name, const char *summary,
                       bench_opt *opts, size_t nopts, long default_runs);

/* Adds a configuration line (printed now, and stored for the JSON). */
void bench_config(bench *b, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* A free-text line printed after the tables, kept in the JSON "notes". */
void bench_note(bench *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Records a correctness check (never a timing one): a failure is printed,
 * kept in the JSON and makes bench_finish return 1. Returns ok. */
bool bench_check(bench *b, bool ok, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Writes the JSON file if asked, frees everything, and returns the exit
 * status: 0, or 1 when a check failed or the JSON could not be written. */
int bench_finish(bench *b);

/* Prints a fatal error (one line on stderr) and exits 1. */
_Noreturn void bench_die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- tables ------------------------------------------------------------- */

typedef struct bench_table bench_table;

/* A table, printed by bench_table_print; its rows also go to the JSON under
 * "tables" with the given id. Column order is the order keys first appear. */
bench_table *bench_table_new(bench *b, const char *id, const char *title);
/* Starts a new row; the cells below fill it. */
void bench_row(bench_table *t);
void bench_cell_str(bench_table *t, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A number: shown with fmt (e.g. "%.1f"), stored in the JSON at full precision. */
void bench_cell_num(bench_table *t, const char *key, const char *fmt, double v);
void bench_cell_int(bench_table *t, const char *key, long long v);
/* Prints the table (once all its rows are in) as an aligned markdown table. */
void bench_table_print(bench_table *t);

/* ---- time and statistics ------------------------------------------------ */

/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t bench_now_ns(void);
/* CPU time used by the whole process (every thread), in nanoseconds. */
uint64_t bench_process_cpu_ns(void);
/* Sleeps for ns nanoseconds (restarting after signals). */
void bench_sleep_ns(uint64_t ns);
/* One spin-wait pause (a thread busy-waiting on a flag). */
static inline void bench_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/* Sorts v in place and returns its median (mean of the middle two). */
double bench_median(double *v, size_t n);
/* Sorts v in place and returns the p-th percentile (0..100), nearest rank. */
double bench_percentile(double *v, size_t n, double p);
/* Minimum and maximum of v (unsorted is fine). */
double bench_min(const double *v, size_t n);
double bench_max(const double *v, size_t n);

/* ---- calibrated busy work ----------------------------------------------- */

/* A chain of dependent integer multiply/xor-shift steps: real arithmetic
 * that the compiler can neither drop nor vectorize. Returns the result so
 * the caller can keep it (store it somewhere the optimizer must honour). */
uint64_t bench_work(uint64_t iters, uint64_t seed);
/* Measures bench_work's cost on this machine (the fastest of several trials,
 * since interference only ever adds time) and returns ns per iteration. Done
 * once per process; later calls return the cached value. */
double bench_work_calibrate(void);
/* Iterations of bench_work that take about ns nanoseconds. */
uint64_t bench_work_iters(double ns);

/* ---- threads ------------------------------------------------------------ */

/* Waits (checking /proc every 100 us, never spinning) until every thread of
 * this process except the caller is asleep, or until timeout_ms passes.
 * Returns true if they all slept. This is how a benchmark knows a pool has
 * settled, or that every worker is parked before a wake-up measurement. */
bool bench_wait_others_asleep(long timeout_ms);
/* This process's threads (/proc/self/status), 0 where /proc cannot tell;
 * allocates nothing. */
unsigned bench_thread_count(void);
/* Waits until the process has at most n threads, or timeout_ms passes;
 * allocates nothing. */
bool bench_wait_thread_count(unsigned n, long timeout_ms);
/* Online CPUs. */
unsigned bench_cpus(void);

/* ---- elastic retirement ------------------------------------------------- */

/* Waits for a taskorch pool's elastic workers to retire without sleeping
 * on a guess: a thread_stop hook counts elastic workers as they stop and
 * signals a condition variable. */
typedef struct bench_retire_watch {
  pthread_mutex_t mu; /* guards stops */
  pthread_cond_t cv;  /* broadcast by the hook after each elastic stop */
  uint64_t stops;     /* elastic workers that have run their thread_stop hook */
} bench_retire_watch;

/* Initializes w and installs its hook in o (o->hooks.user becomes w, so
 * the pool must use no other hook that needs user). */
void bench_retire_watch_init(bench_retire_watch *w, tko_options *o);
/* Blocks until the pool has no elastic worker and every elastic worker it
 * spawned has stopped, or until timeout_ms passes (then false). */
bool bench_retire_wait(bench_retire_watch *w, tko_pool *pool, long timeout_ms);
void bench_retire_watch_destroy(bench_retire_watch *w);

/* ---- memory ------------------------------------------------------------- */

/* Resident set size of this process, in bytes (0 if unknown). */
uint64_t bench_rss_bytes(void);

/* jemalloc's cumulative statistics over all arenas. */
typedef struct bench_mem {
  uint64_t nmalloc; /* allocations served by the arenas, ever */
  uint64_t bytes;   /* bytes of those allocations (size-class rounded), ever */
  uint64_t live;    /* bytes allocated now (stats.allocated) */
} bench_mem;

/* True when jemalloc is linked in and is the malloc actually in use (not so
 * under ASan or TSan, whose own allocator takes over). */
bool bench_jemalloc_active(void);
/* Refreshes jemalloc's statistics and reads them; false when unavailable. */
bool bench_jemalloc_snapshot(bench_mem *out);
/* Makes jemalloc give the pages of freed memory back to the system now
 * rather than after its decay time (nothing without jemalloc). */
void bench_jemalloc_purge(void);
/* "jemalloc 5.3.0 (active)", "glibc malloc", ... */
const char *bench_allocator_name(void);

#endif
