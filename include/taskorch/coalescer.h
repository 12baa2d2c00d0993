/* SPDX-License-Identifier: MIT */
/** @file
 * taskorch coalescer: a dirty set plus one periodic sweeper.
 *
 * Hosts that must persist "the latest state of key K" (a stream's metadata
 * sidecar, a stream head) mark K with its latest value on every change;
 * once per interval one sweep, run as a pool task, passes every key marked
 * since the previous sweep to the flush callback, once each, with its
 * latest value, in a single call. A mark is O(1): a hash-table update under
 * one mutex, with no allocation once the table has grown to the number of
 * keys dirty at once, and never a task or a timer per mark. After a burst
 * the memory goes back: once the timer thread's ticks have found nothing
 * dirty for a second (or one tick, for intervals over a second), the
 * tables shrink to initial_keys (a coalescer with interval 0 keeps them).
 *
 * Guarantees:
 * - Every accepted mark (mark returned 0) is passed to flush_fn in some sweep
 *   with its value or a later one of the same key: at the latest by the
 *   first sweep that starts after it, by tko_coalescer_flush, or by the final
 *   flush of close/destroy.
 * - A sweep passes each key at most once (latest value wins); sweeps never
 *   overlap, and a sweep that flushes K finishes before the next sweep that
 *   flushes K starts, so a key's flushed values follow its marks' order.
 * - Marks racing with close are either flushed by the final flush or
 *   rejected with -ESHUTDOWN, never silently lost.
 *
 * Timing: one dedicated thread per coalescer sleeps on a condition variable
 * (CLOCK_MONOTONIC deadline) and, once per interval, submits one sweep task
 * to the pool if anything is dirty and no sweep is queued or running (a
 * tick that finds one is skipped). That submit never waits for room: if
 * the pool refuses the task (shut down, or a bounded queue that is full,
 * whatever its full policy), that thread sweeps itself, so marks keep being
 * flushed and close never waits on a thread stuck in a submit.
 *
 * Cancellation: if the pool is shut down with TKO_CANCEL while a sweep task
 * is queued, the pool recognises it and tells the coalescer; the pool's
 * on_cancel hook never sees a sweep task. The keys stay dirty and are flushed by the next tick (on the timer thread) or
 * the final flush. A dropped sweep task is also noticed on its own once the
 * pool has nothing queued or running.
 *
 * Lifetime: the coalescer holds its pool from create to destroy: the
 * pool's tko_pool_destroy meanwhile shuts the pool down but returns -EBUSY,
 * freeing nothing (destroy the coalescer, then call it again), so the timer
 * thread never touches a freed pool; after the pool's shutdown it sweeps
 * itself. A destroyed coalescer is
 * caught while its memory is still mapped: calls on it return -EINVAL
 * (debug builds assert). In a child forked after create, every call returns
 * -ECHILD, except destroy, which returns 0 and leaves the copy alone (the
 * timer thread stayed in the parent).
 *
 * Thread safety: every function is safe from any thread, pool tasks
 * included, except where its comment says otherwise (flush, close and
 * destroy from flush_fn; destroy racing with other calls). */
#ifndef TASKORCH_COALESCER_H
#define TASKORCH_COALESCER_H

#include <taskorch.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TKO_MAX_COALESCE_INTERVAL_MS 3600000u /**< one hour */
#define TKO_MAX_COALESCE_KEYS ((size_t)1 << 30) /**< initial_keys limit */

typedef struct tko_coalescer tko_coalescer; /**< opaque */

/** One dirty key and its latest value. */
typedef struct tko_coalesce_entry {
  uint64_t key;   /**< the key */
  uint64_t value; /**< its latest value */
} tko_coalesce_entry;

/** Flushes one sweep: `count` (>= 1) distinct keys, in first-marked order.
 * Runs on a pool worker (a timer tick), on the thread that called
 * tko_coalescer_flush / close / destroy, or on the timer thread when the
 * pool refused the sweep. No lock is held: it may call tko_coalescer_mark
 * (those marks go to the next sweep), not flush, close or destroy
 * (-EDEADLK). The array is valid only during the call. */
typedef void (*tko_coalesce_flush_fn)(void *user, const tko_coalesce_entry *entries, size_t count);

/** Options (NULL = defaults; zero fields mean the defaults beside them). */
typedef struct tko_coalesce_options {
  size_t initial_keys;            /**< dirty keys held before the table grows; 0 = 64;
                                     over TKO_MAX_COALESCE_KEYS is -EINVAL */
  int weight;                     /**< weight of the sweep task; default 0 */
  const tko_allocator *allocator; /**< NULL = malloc/realloc/free */
} tko_coalesce_options;

/** A snapshot of the counters. */
typedef struct tko_coalesce_stats {
  uint64_t marks;         /**< marks accepted */
  uint64_t rejected;      /**< marks refused with -ESHUTDOWN */
  uint64_t sweeps;        /**< sweeps that flushed at least one key */
  uint64_t flushed;       /**< entries passed to flush_fn, all sweeps together */
  uint64_t max_sweep;     /**< most entries in one sweep */
  uint64_t skipped_ticks; /**< ticks that found a sweep still queued or running */
  uint64_t inline_sweeps; /**< sweeps the timer thread ran because the pool refused */
  uint64_t dirty;         /**< keys marked and not yet taken by a sweep */
} tko_coalesce_stats;

/** Creates a coalescer sweeping every `interval_ms` on `pool` (0 = never on
 * its own: only tko_coalescer_flush and the final flush); it holds the
 * pool until tko_coalescer_destroy.
 * @details Starts its timer thread (none when interval_ms is 0). -EINVAL: NULL
 * out, pool or flush, or interval over TKO_MAX_COALESCE_INTERVAL_MS; -ENOMEM;
 * -EAGAIN: the timer thread could not start; -ESHUTDOWN: the pool's shutdown
 * has begun. */
TKO_API int tko_coalescer_create(tko_coalescer **out, tko_pool *pool, unsigned interval_ms,
                                 tko_coalesce_flush_fn flush, void *user,
                                 const tko_coalesce_options *opts);

/** Marks `key` dirty with `value`, replacing the value of an earlier mark
 * not yet flushed; an accepted mark reaches flush_fn with this value or a
 * later one of its key.
 * @details O(1); allocates only when the dirty table must grow. -EINVAL: NULL;
 * -ESHUTDOWN: closed; -ENOMEM: the table could not grow (the mark is not
 * recorded). */
TKO_API int tko_coalescer_mark(tko_coalescer *c, uint64_t key, uint64_t value);

/** Flushes now, on the calling thread: returns once every mark that
 * happened before the call has been passed to flush_fn.
 * @details Waits for a sweep in progress to end, then sweeps. -EINVAL: NULL;
 * -EDEADLK: called from flush_fn. */
TKO_API int tko_coalescer_flush(tko_coalescer *c);

/** Closes: later marks fail with -ESHUTDOWN, marks racing with it are
 * flushed or rejected, and the final flush runs on the calling thread.
 * Idempotent.
 * @details Stops and joins the timer thread before the final flush. Works from
 * any thread, a task of the coalescer's pool included (even when that pool's
 * bounded queue is full: the timer thread never waits for room). -EINVAL: NULL
 * or a destroyed coalescer; -EDEADLK: called from flush_fn. */
TKO_API int tko_coalescer_close(tko_coalescer *c);

/** Closes (final flush), waits for any sweep running on a worker, then
 * frees the coalescer; a paused pool does not hold it.
 * @details Takes back a sweep task still queued in the pool (the final flush
 * covered its keys; the pool counts it as cancelled, and its on_cancel hook
 * never sees it), waits for a sweep running on a worker to end, then frees; a
 * paused pool does not hold it. No other call may race with it. -EINVAL: NULL;
 * -EDEADLK, doing nothing, when called from flush_fn or from a task of the
 * coalescer's pool. */
TKO_API int tko_coalescer_destroy(tko_coalescer *c);

/** For the pool's on_cancel hook: returns 1 if `task` is a sweep task of any
 * coalescer (then ignore it: its keys stay dirty), 0 otherwise. */
TKO_API int tko_coalescer_pool_cancelled(const tko_task_info *task);

/** Fills *out with a snapshot. Does nothing when either pointer is NULL. */
TKO_API void tko_coalescer_stats(tko_coalescer *c, tko_coalesce_stats *out);

#ifdef __cplusplus
}
#endif
#endif /* TASKORCH_COALESCER_H */
