/* SPDX-License-Identifier: MIT */
/** @file
 * taskorch-thpool: C-Thread-Pool's thpool_* API, implemented on taskorch.
 *
 * A program written for C-Thread-Pool (Pithikos) builds against this header
 * unchanged and links with `pkg-config --cflags --libs taskorch-thpool`.
 * Each function keeps the original's name, signature and documented
 * behaviour; where this one differs (pause does not stop a job that is
 * already running; destroy from inside a job; thread-count limits; argument
 * checks instead of crashes) the comment beside it says so, and
 * docs/MIGRATING.md lists every difference.
 *
 * Unlike the original, nothing is global: every pool is independent, so
 * pausing, resuming or destroying one never touches another.
 *
 * Thread safety: every function may be called from any thread, jobs
 * included, except that thpool_destroy must not race with other calls on
 * the same pool.
 *
 * Like C-Thread-Pool, each thread takes one job at a time (the core option
 * max_batch = 1), so a job that blocks until a later job has run finds it
 * on another free thread. */
#ifndef TASKORCH_THPOOL_H
#define TASKORCH_THPOOL_H

#ifdef __cplusplus
extern "C" {
#endif

/** Marks the library's functions (default visibility). */
#if defined(__GNUC__) && !defined(_WIN32)
#define THPOOL_API __attribute__((visibility("default")))
#else
#define THPOOL_API
#endif

/** Defined by this implementation only, so a program can test for the
 * extensions below with `#ifdef`. */
#define THPOOL_TASKORCH 1

/** The most threads one pool may have: taskorch's basic plus elastic limits
 * (TKO_MAX_WORKERS + TKO_MAX_ELASTIC). */
#define THPOOL_MAX_THREADS 2048

/** A pool handle, opaque as in the original. */
typedef struct thpool_ *threadpool;

/** Creates a pool of num_threads threads and returns it, or NULL on error.
 * Errors: num_threads < 1 or > THPOOL_MAX_THREADS, out of memory, or a
 * thread that could not be started. (The original accepts 0 and negative
 * counts and makes a pool with no threads, whose queued jobs never run;
 * here that is an error.) Up to 1024 threads start at once; beyond that,
 * the rest are started by taskorch when queued jobs find every thread busy,
 * and each of those leaves after an hour without work. Never more than
 * num_threads jobs run at once. */
THPOOL_API threadpool thpool_init(int num_threads);

/** Queues function_p(arg_p). Jobs are taken first in, first out.
 * Returns 0, or -1 when the pool or function_p is NULL, the pool is being
 * destroyed, or memory ran out. May be called from jobs. */
THPOOL_API int thpool_add_work(threadpool, void (*function_p)(void *), void *arg_p);

/** Blocks, without polling, until no job is queued or running. On a paused
 * pool with jobs queued it returns only after thpool_resume. Called from one
 * of the pool's own jobs it returns at once instead of waiting forever for
 * itself. Does nothing for NULL. */
THPOOL_API void thpool_wait(threadpool);

/** Pauses the pool: no queued job starts until thpool_resume; jobs may still
 * be added. Unlike the original, a job that is already running is not
 * stopped mid-way: it finishes (the original interrupted it with SIGUSR1,
 * which its users report as deadlocks). Idempotent; does nothing for NULL. */
THPOOL_API void thpool_pause(threadpool);

/** Resumes a paused pool; queued jobs start again. Idempotent; does nothing
 * for NULL. */
THPOOL_API void thpool_resume(threadpool);

/** Waits for the jobs that are running to finish, discards the jobs still
 * queued (they never run), stops every thread and frees the pool. A paused
 * pool is destroyed the same way. Does nothing for NULL, and does nothing
 * (the pool stays usable) when called from one of the pool's own jobs,
 * which would otherwise wait for itself forever. */
THPOOL_API void thpool_destroy(threadpool);

/** The number of threads running a job right now, or -1 for NULL. */
THPOOL_API int thpool_num_threads_working(threadpool);

/* ---- Extensions: not in C-Thread-Pool; use them under #ifdef THPOOL_TASKORCH. */

/** thpool_add_work with a priority: higher weight starts first, over the
 * whole int range; equal weights start in the order added. thpool_add_work
 * is this with weight 0. Returns 0 or -1 as thpool_add_work. */
THPOOL_API int thpool_add_work_weighted(threadpool, void (*function_p)(void *), void *arg_p,
                                        int weight);

struct tko_pool;
/** The taskorch pool underneath, for tko_pool_stats, tko_pool_wait_idle with
 * a timeout and the like (`#include <taskorch.h>` and link taskorch). It
 * belongs to the threadpool: never shut it down or destroy it directly.
 * NULL for NULL. */
THPOOL_API struct tko_pool *thpool_taskorch_pool(threadpool);

#ifdef __cplusplus
}
#endif
#endif /* TASKORCH_THPOOL_H */
