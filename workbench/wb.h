/* SPDX-License-Identifier: MIT */
/* taskorch-workbench: the types its files share. A run goes
 * cli (argv -> wb_config) -> scenarios (defaults, task mix) -> run (pool,
 * producers, sampler) -> stats (percentiles) -> report / plot. */
#ifndef TKO_WORKBENCH_WB_H
#define TKO_WORKBENCH_WB_H

#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "taskorch.h"

#define WB_PROG "taskorch-workbench"
#define WB_EXIT_USAGE 2
#define WB_MAX_TASKS 50000000u   /* per-task arrays take ~40 bytes each */
#define WB_MAX_PRODUCERS 256u
#define WB_MAX_BURSTS 100000u
#define WB_MAX_CLASSES 8u        /* weight classes in the latency table */
/* Longest --io-ms (and --task-us / 1000): a task's work, up to 1.5 times
 * this in microseconds, fits wb_task's uint32_t. */
#define WB_MAX_WORK_MS 1000000u
#define WB_SAMPLE_MIN_NS 1000000u      /* first timeline period: 1 ms, doubled as it fills */
#define WB_SAMPLE_MAX_STEP_NS 100000000u /* the sampler wakes at least every 100 ms */
#define WB_TIMELINE_CAP 2048u            /* samples kept: half to all of it in a long run */

typedef enum wb_pool_kind { WB_POOL_BASIC = 0, WB_POOL_ELASTIC = 1 } wb_pool_kind;

typedef struct wb_range {
  int lo, hi;
} wb_range;

/* --resize B:E: tko_pool_resize(pool, B, E) before the middle task is
 * submitted (with several floods: at the start of the middle one). */
typedef struct wb_resize {
  bool on;
  unsigned basic, max_elastic;
} wb_resize;

/* Everything a run needs. A scenario supplies the defaults; options given on
 * the command line replace them field by field (cli.c). */
typedef struct wb_config {
  const struct wb_scenario *scenario;
  wb_pool_kind pool;
  unsigned workers;       /* basic workers; 0 in a scenario's defaults = CPU count */
  unsigned max_elastic;   /* elastic pools only */
  unsigned idle_ms;       /* elastic idle timeout */
  uint64_t tasks;
  unsigned producers;     /* submitting threads */
  wb_range weights;       /* task weights, uniform in [lo, hi] */
  unsigned task_us;       /* CPU work per CPU-bound task (varies 0.5x..1.5x) */
  unsigned io_ms;         /* sleep per blocking task (varies 0.5x..1.5x) */
  double io_pct;          /* share of blocking tasks, percent */
  double fail_pct;        /* share of tasks that return a failure status */
  unsigned bursts;        /* the tasks arrive in this many floods... */
  unsigned gap_ms;        /* ...each after the pool has idled this long */
  long tail_ms;           /* idle time after the last task; -1 = auto */
  uint64_t seed;
  /* Pool features; zero / false = off. */
  unsigned groups;        /* submit in groups of N (tko_group_*) and wait for each */
  unsigned handles;       /* submit through task handles, N at a time, and wait for each */
  double cancel_pct;      /* share of handle tasks cancelled after their window's submits */
  unsigned batch;         /* submit in batches of N (tko_submit_batch) */
  uint64_t capacity;      /* queue_capacity; 0 = unbounded */
  tko_full_policy full;   /* full_policy of a bounded queue */
  unsigned aging_ms;      /* anti-starvation aging */
  bool blocking_hint;     /* blocking tasks call tko_blocking_begin/end */
  unsigned delay_ms;      /* submit every task through a timer (tko_submit_after) */
  bool async;             /* blocking tasks run as async tasks, completed by a
                             completer thread when their sleep would end */
  unsigned max_async;     /* max_async_inflight (with async) */
  wb_resize resize;       /* resize the pool halfway through the submissions */
  const char *thread_name; /* tko_options.name; NULL = "wb" */
  bool quiet;             /* no progress bar */
  const char *json_path;
  const char *timeline_path;
  const char *plot_path;
} wb_config;

typedef struct wb_scenario {
  const char *name;
  const char *about;      /* one line for `list` */
  bool lead_idle;         /* idle gap_ms before the first flood, too */
  wb_config defaults;
} wb_scenario;

/* One task of the mix, stored by value in one array; its address is the
 * task's argument, so no task allocates. */
enum { WB_TASK_CPU = 0, WB_TASK_IO = 1 };
typedef struct wb_task {
  int32_t weight;
  uint32_t work_us;  /* CPU spin or sleep, microseconds */
  uint8_t kind;      /* WB_TASK_CPU or WB_TASK_IO */
  uint8_t fail;      /* returns 1 instead of 0 */
  uint8_t cancel;    /* --handles: its handle is cancelled (--cancel-pct) */
} wb_task;

/* One timeline sample, relative to the run's start. */
typedef struct wb_sample {
  uint64_t t_ns;
  uint64_t submitted, completed, queued, running;
  unsigned basic, elastic;
} wb_sample;

typedef struct wb_timeline {
  wb_sample *s;       /* preallocated; halved in resolution when full */
  size_t n, cap;
  uint64_t period_ns; /* spacing of kept samples: 1 ms, doubled on each halving */
} wb_timeline;

typedef struct wb_dist {
  uint64_t count;
  uint64_t p50, p90, p99, max;
  double mean;
} wb_dist;

typedef struct wb_class {
  int lo, hi;        /* weights in this class */
  wb_dist wait;
} wb_class;

/* What a finished run leaves behind. */
typedef struct wb_result {
  wb_config cfg;              /* as resolved */
  wb_task *tasks;
  uint64_t *wait_ns;          /* per task, UINT64_MAX = never ran */
  uint64_t *run_ns;
  uint8_t *on_elastic;        /* ran on an elastic worker */
  uint64_t mix_checksum;
  double wall_s;              /* first submit to last task done, gaps included */
  double active_s;            /* the same, gaps between floods left out */
  uint64_t submit_errors;
  int first_submit_error;
  uint64_t rejected;          /* -EAGAIN from a full reject queue, retried */
  uint64_t groups_waited;     /* groups submitted and waited for (--groups) */
  /* --handles: what the producers saw through the handles. */
  uint64_t handles_waited;    /* tko_handle_wait returned 0 */
  uint64_t cancels_won;       /* tko_handle_cancel returned 0: the task never ran */
  uint64_t cancels_late;      /* tko_handle_cancel returned -EBUSY: it had started */
  uint64_t handles_cancelled; /* tko_handle_status was -ECANCELED after the wait */
  uint64_t handles_broken;    /* a status that contradicts the cancel's answer (0 expected) */
  tko_stats stats;            /* after shutdown */
  tko_stats before_shutdown;  /* elastic counts after the tail */
  bool interrupted;           /* stopped by Ctrl-C: the figures cover what ran */
  bool resized;               /* --resize: the middle task was reached */
  int resize_rc;              /* what tko_pool_resize returned */
  double resize_at_s;         /* when, since the first flood began */
  bool allocs_known;
  uint64_t allocs;            /* heap allocations from first submit to shutdown */
  wb_timeline timeline;
  /* Filled by wb_summarize. */
  wb_dist wait, run;
  wb_class classes[WB_MAX_CLASSES];
  unsigned nclasses;
  uint64_t ran_on_elastic;
} wb_result;

/* cli.c: 0 = parsed, -1 = --help asked, WB_EXIT_USAGE = bad input (reported). */
int wb_cli_parse_run(int argc, char **argv, wb_config *cfg);
void wb_cli_usage(FILE *f);

/* scenarios.c */
const wb_scenario *wb_scenario_find(const char *name);
const wb_scenario *wb_scenario_at(size_t i); /* NULL past the end */
void wb_scenario_describe(FILE *f, const wb_scenario *s);
void wb_config_describe(FILE *f, const wb_config *c, const char *indent);
const char *wb_full_name(tko_full_policy p);
uint64_t wb_mix_generate(const wb_config *cfg, wb_task *out);
unsigned wb_cpu_count(void);

/* interrupt.c: Ctrl-C during a run. wb_interrupt_block blocks SIGINT in
 * the calling thread (threads started later inherit it) unless SIGINT is
 * ignored; wb_interrupt_watch starts the thread that calls fn(arg) on the
 * first Ctrl-C and absorbs the later ones; wb_interrupt_stop stops it and
 * says whether fn was called; wb_interrupt_unblock restores the signal
 * mask, first dropping a pending SIGINT when fn was called. */
typedef struct wb_interrupt {
  bool active;            /* SIGINT was not ignored: it is blocked and watched */
  bool started;           /* the watcher thread runs */
  sigset_t old_mask;
  pthread_t thread;
  void (*fn)(void *);
  void *arg;
  pthread_mutex_t mu;     /* guards stop and fired while the watcher runs */
  bool stop, fired;
} wb_interrupt;
void wb_interrupt_block(wb_interrupt *w);
int wb_interrupt_watch(wb_interrupt *w, void (*fn)(void *), void *arg);
bool wb_interrupt_stop(wb_interrupt *w);
void wb_interrupt_unblock(wb_interrupt *w);

/* run.c: intr is blocked by the caller; wb_run watches it while the pool runs. */
int wb_run(const wb_config *cfg, wb_interrupt *intr, wb_result *res);
void wb_result_free(wb_result *res);

/* timeline.c */
typedef struct wb_sampler wb_sampler;
typedef struct wb_progress wb_progress;
int wb_sampler_start(wb_sampler **out, tko_pool *pool, wb_timeline *tl,
                     uint64_t t0_ns, wb_progress *progress);
void wb_sampler_stop(wb_sampler *s); /* takes a last sample, joins, frees */
int wb_timeline_alloc(wb_timeline *tl, size_t cap);
/* Keeps x if it falls in a later period than the last sample kept (with
 * last: if it is 1 us or more after it), halving the buffer and doubling
 * the period first when it is full. Returns whether x was kept. */
bool wb_timeline_add(wb_timeline *tl, const wb_sample *x, bool last);
void wb_timeline_free(wb_timeline *tl);
int wb_timeline_write_csv(FILE *f, const wb_timeline *tl);

/* progress.c: the live line on stderr, drawn by the sampler thread. Its
 * rate is over the last WB_RATE_HISTORY draws (a second at 10 a second):
 * wb_rate_push adds (t_ns, count) and returns counts per second since the
 * oldest entry kept (0 for the first). */
#define WB_RATE_HISTORY 10
typedef struct wb_rate {
  unsigned n, head;
  uint64_t t[WB_RATE_HISTORY], c[WB_RATE_HISTORY];
} wb_rate;
double wb_rate_push(wb_rate *r, uint64_t t_ns, uint64_t count);
/* What one draw shows; wb_progress_format lays it out in cols - 1
 * columns at most (the bar and the fields that fit; see progress.c) and
 * returns its length, 0 when nothing fits. No \r, no escapes. */
typedef struct wb_progress_view {
  uint64_t done, total, queued, running;
  unsigned basic, elastic;
  double rate; /* tasks/s; 0 = not known yet */
} wb_progress_view;
size_t wb_progress_format(char *buf, size_t len, unsigned cols, const wb_progress_view *v);
wb_progress *wb_progress_new(uint64_t total); /* NULL when off or on error */
void wb_progress_update(wb_progress *p, const wb_sample *s);
void wb_progress_clear(wb_progress *p);
void wb_progress_free(wb_progress *p);

/* alloc.c */
bool wb_allocs_read(uint64_t *total); /* false when not built with jemalloc */
const char *wb_allocs_source(void);

/* stats.c. wb_weight_classes cuts r into at most WB_MAX_CLASSES classes
 * of one width (the highest may be narrower), highest first; returns how many.
 * wb_dist_describe fills d from v[0..n), which it reorders.
 * wb_summarize_capped is wb_summarize taking percentiles from at most cap
 * values per distribution (WB_PERCENTILE_SAMPLE in wb_summarize). */
#define WB_PERCENTILE_SAMPLE (1u << 20)
int wb_summarize(wb_result *res);
int wb_summarize_capped(wb_result *res, size_t cap);
void wb_dist_describe(uint64_t *v, size_t n, wb_dist *d);
unsigned wb_weight_classes(wb_range r, wb_class out[WB_MAX_CLASSES]);

/* report.c */
void wb_report_table(FILE *f, const wb_result *res);
int wb_report_json(FILE *f, const wb_result *res);
void wb_fmt_ns(char *buf, size_t len, double ns);

/* plot.c */
int wb_plot_svg(FILE *f, const wb_result *res);

/* quote.c: s escaped for an error line (\n, \t, \\, \', \xNN for other
 * control bytes), cut with "..." to fit len; returns buf. */
#define WB_QUOTE_MAX 256
const char *wb_quote(char *buf, size_t len, const char *s);

/* clock.c */
uint64_t wb_now_ns(void);
void wb_sleep_ns(uint64_t ns);

#endif
