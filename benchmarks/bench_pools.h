/* SPDX-License-Identifier: MIT */
/* The pools under comparison behind one small interface: taskorch, GLib's
 * GThreadPool, C-Thread-Pool and libuv's uv_queue_work, each used the way
 * its documentation intends, so that bench_peers and bench_wakeup can run the
 * same workload on each and compare them fairly.
 *
 * Fairness rules kept here, not in each benchmark:
 * - Every pool gets the same number of worker threads (taskorch may instead
 *   be given elastic options, which the benchmark then prints).
 * - A task body is compiled into one entry point per pool (BP_TASK), so each
 *   pool calls the body through its own native callback type: no pool pays
 *   for an extra trampoline.
 * - Completion is observed without polling, by each pool's own means:
 *   taskorch tko_pool_wait_idle; GLib g_thread_pool_free(pool, FALSE, TRUE),
 *   which returns once every queued task has run; C-Thread-Pool thpool_wait;
 *   libuv uv_run on the submitting thread's loop, which returns once every
 *   request's after-work callback has run.
 * - A pool is created fresh for each run, and the run starts only once every
 *   thread of the process other than the caller is asleep.
 *
 * libuv's thread pool is process-global and sized once, from the
 * UV_THREADPOOL_SIZE environment variable, at its first use. So libuv runs
 * in a child process forked at start-up (bp_remote) for each thread count;
 * forking while the process is still single-threaded keeps that safe. */
#ifndef TKO_BENCH_POOLS_H
#define TKO_BENCH_POOLS_H

#include <stdbool.h>
#include <stddef.h>

#include "taskorch.h"

#ifdef BENCH_HAVE_LIBUV
#include <uv.h>
#endif

typedef enum bp_kind { BP_TASKORCH = 0, BP_GLIB, BP_THPOOL, BP_LIBUV, BP_KINDS } bp_kind;

struct uv_work_s; /* libuv's uv_work_t, so this header compiles without uv.h */

/* One task body, as each pool's native callback. Build it with BP_TASK. */
typedef struct bp_task {
  int (*tko)(void *arg);
  void (*glib)(void *data, void *user_data); /* GFunc */
  void (*thpool)(void *arg);
  void (*uv)(struct uv_work_s *req); /* uv_work_cb */
} bp_task;

/* BP_TASK(name, body) defines `static const bp_task name`, where body is a
 * function `void body(void *arg)` (ideally static inline, so that each entry
 * point inlines it). */
#ifdef BENCH_HAVE_LIBUV
#define BP_UV_ENTRY_(name, body)                                                                   \
  static void name##_uv(uv_work_t *req) {                                                          \
    body(req->data);                                                                               \
  }
#define BP_UV_REF_(name) name##_uv
#else
#define BP_UV_ENTRY_(name, body)
#define BP_UV_REF_(name) NULL
#endif
#define BP_TASK(name, body)                                                                        \
  static int name##_tko(void *arg) {                                                               \
    body(arg);                                                                                     \
    return 0;                                                                                      \
  }                                                                                                \
  static void name##_glib(void *data, void *user_data) {                                           \
    (void)user_data;                                                                               \
    body(data);                                                                                    \
  }                                                                                                \
  static void name##_thpool(void *arg) {                                                           \
    body(arg);                                                                                     \
  }                                                                                                \
  BP_UV_ENTRY_(name, body)                                                                         \
  static const bp_task name = {name##_tko, name##_glib, name##_thpool, BP_UV_REF_(name)}

/* Whether the pool was found at build time. */
bool bp_available(bp_kind kind);
/* "taskorch", "GLib GThreadPool", "C-Thread-Pool", "libuv uv_queue_work". */
const char *bp_name(bp_kind kind);
/* "taskorch", "glib", "thpool", "libuv": the names --pools accepts. */
const char *bp_short_name(bp_kind kind);
/* Parses a comma-separated list of short names into enabled[]; false (and
 * a message in *why) on an unknown name. Pools not built stay disabled. */
bool bp_parse_list(const char *list, bool enabled[BP_KINDS], const char **why);

typedef struct bp_pool bp_pool;
typedef struct bp_producer bp_producer;

/* Creates a pool of `threads` workers running `task`. For taskorch,
 * tko_opts (if not NULL) replaces the default tko_basic_options(threads).
 * Returns 0 or a negative errno; -ENOTSUP for a pool that was not built,
 * -EBUSY for libuv asked for a second thread count in one process, or for a
 * second C-Thread-Pool at once (its keep-alive flag is a global). */
int bp_pool_create(bp_pool **out, bp_kind kind, const bp_task *task, unsigned threads,
                   const tko_options *tko_opts);
/* The taskorch pool inside, for its statistics (NULL for the others). */
tko_pool *bp_pool_tko(bp_pool *pool);

/* A submitting thread's handle: open it on the thread that will submit
 * (libuv needs a loop per submitting thread and caller-owned requests, so
 * max_tasks requests are allocated here, before any timing). */
bp_producer *bp_producer_open(bp_pool *pool, size_t max_tasks);
/* Queues the task with arg, which must not be NULL (GLib's queue cannot
 * carry NULL; the rule holds for every pool so the bodies see the same). */
int bp_submit(bp_producer *pr, void *arg);
/* The same with a weight, which only taskorch has (the peers ignore it). */
int bp_submit_weighted(bp_producer *pr, void *arg, int weight);
/* libuv: runs this thread's loop until every request it submitted has
 * completed. Others: nothing (their completion is bp_pool_wait). */
void bp_producer_finish(bp_producer *pr);
void bp_producer_close(bp_producer *pr);

/* Blocks, without polling, until every task submitted so far has run. Call
 * it once per run, after the producers finished: for GLib it is
 * g_thread_pool_free(pool, FALSE, TRUE), after which only destroy is valid. */
void bp_pool_wait(bp_pool *pool);
void bp_pool_destroy(bp_pool *pool);

/* ---- running libuv in a child process --------------------------------- */

/* Runs one measurement (case_id, run) in the child and fills out[0..cap);
 * returns how many values it wrote. */
typedef size_t (*bp_remote_fn)(int case_id, int run, double *out, size_t cap);
typedef struct bp_remote bp_remote;

/* Forks a child that serves bp_remote_call requests by calling fn. Call it
 * while the process is single-threaded (before any pool exists), after
 * whatever set-up the child needs (it sees a copy of memory as of now).
 * Returns NULL if fork fails. */
bp_remote *bp_remote_start(bp_remote_fn fn);
/* Asks the child to run (case_id, run); returns the number of values, or
 * 0 if the child died. */
size_t bp_remote_call(bp_remote *r, int case_id, int run, double *out, size_t cap);
/* Ends the child and reaps it. Returns its exit status (0 = fine). */
int bp_remote_stop(bp_remote *r);

#endif
