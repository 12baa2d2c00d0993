/* SPDX-License-Identifier: MIT */
/** @file
 * taskorch keyed serial lanes: tasks that share a key run one at a time, in
 * submit order; tasks with different keys run in parallel on the pool.
 *
 * A lane table is its own object bound to a pool. Each key hashes to one of
 * a fixed number of lanes; a lane is a ring of queued tasks plus at most one
 * "runner" pool task. The runner drains up to max_drain queued tasks in one
 * visit (or hands them to a batch callback all at once), then resubmits
 * itself if more are queued. Nothing is allocated per task: a lane's ring is
 * allocated at the lane's first use and grows geometrically; a ring that a
 * burst grew past four times lane_capacity goes back to lane_capacity when
 * the lane drains empty.
 *
 * Guarantees:
 * - Per-key order: tasks with the same key start in submit order (for
 *   submits from different threads, the order in which their calls took the
 *   lane's lock), each after the previous one returned.
 * - Per-key exclusion: no two tasks with the same key ever run at once. The
 *   task before happens-before the task after (lane mutex).
 * - Collisions: keys that hash to the same lane share it. Order and
 *   exclusion then hold across all of those keys together (they are
 *   serialized as one key would be); only parallelism is lost. The table
 *   is never "full": every key has a lane. tko_lanes_index says which.
 * - Parallelism: keys on different lanes run in parallel. A pool worker
 *   takes a runner by itself, never in one batch with other tasks, so a
 *   runner not yet started stays available to an idle worker.
 * - Exactly once: every task accepted (submit returned 0) is run exactly
 *   once or handed exactly once to the on_cancel callback.
 * - Weights: within a lane, order is submit order whatever the weights.
 *   A lane competes with the pool's other tasks through its runner, which
 *   is submitted with the weight of the task at the lane's head when the
 *   runner is (re)submitted; that runner then drains up to max_drain tasks
 *   whatever their weights. So a high-weight task queued behind a low-weight
 *   one waits for the low-weight runner (FIFO beats weight inside a lane),
 *   and a low-weight task drained in the same visit as a high-weight head
 *   runs with it. Set max_drain to 1 to re-rank the lane after every task.
 *
 * Bounded pools (queue_capacity): a submit that must start a runner
 * follows the pool's full policy: TKO_FULL_BLOCK waits for room (a worker
 * of the pool gets -EAGAIN instead); it waits with the lane unlocked and
 * its task already accepted, so other submits to that lane, the lane's
 * stats and the pool's tasks never wait for it (if the pool is shut down
 * while it waits, that thread runs the lane itself and returns 0; the
 * shutdown returns only after it has).
 * TKO_FULL_REJECT fails with -EAGAIN,
 * and TKO_FULL_CALLER_RUNS makes the submitting thread run the lane's first
 * visit itself - its own task, since the lane was idle - before the submit
 * returns, counted by the pool as a task it runs on its caller; tasks
 * appended meanwhile go to a runner in the pool, which that thread queues,
 * waiting for room as TKO_FULL_BLOCK would (it never runs them) - unless
 * the submit is made from a task of the pool (one the pool runs on its
 * caller included), which may not wait: it drains its lane itself, as a
 * runner on a worker does. A shutdown of the pool waits for such a submit's
 * own task to finish. A runner on a pool worker that cannot requeue itself
 * (full queue, or shutdown) keeps draining its lane on its worker, past max_drain, for
 * as long as its lane has tasks: on a bounded pool that stays full, a lane
 * fed as fast as its worker drains it holds that worker for good, and with
 * one worker no queued task runs meanwhile, however heavy. Give
 * such a pool room for a runner per busy lane, or more workers than busy
 * lanes.
 *
 * The pool's before_run and after_run hooks see each runner as one task,
 * with the library's fn; the lane tasks it runs are the table's (its stats).
 *
 * Cancellation: the pool only ever sees runners, never lane tasks. If the
 * pool is shut down with TKO_CANCEL while a runner is queued, the pool
 * hands the runner back to its table, which hands that lane's queued tasks
 * to the lanes' on_cancel; the pool's own on_cancel hook never sees a runner.
 * (tko_lanes_pool_cancelled remains for hooks written before that, and is
 * harmless.) A runner already running
 * when the pool shuts down, in either mode, finishes its lane on the spot
 * (the pool waits for running tasks); call tko_lanes_cancel first to drop
 * queued lane tasks instead. (The pool's own keyed table, tko_submit_keyed,
 * is the exception: its tasks are the pool's, and under TKO_CANCEL its
 * runner starts none once the pool refuses submits.)
 *
 * Lifetime: the table holds its pool from create to destroy: the pool's
 * tko_pool_destroy meanwhile shuts the pool down but returns -EBUSY, freeing
 * nothing (destroy the lanes, then call it again). The pool's shutdown
 * closes the table (later submits are -ESHUTDOWN); queued runners run or
 * are cancelled as described above, even on a paused pool, and lane tasks
 * that a submit runs on its own thread (above) finish before the shutdown
 * returns. A lane task run so that calls tko_pool_shutdown or
 * tko_pool_destroy gets -EDEADLK. All functions are safe from
 * any thread, lane tasks and pool tasks included, except where noted. A
 * destroyed table is caught while its memory is still mapped: calls on it
 * return -EINVAL (debug builds assert). In a child forked after create,
 * every call returns -ECHILD, except destroy, which returns 0 and leaves the
 * copy alone (the runners stayed in the parent). */
#ifndef TASKORCH_LANES_H
#define TASKORCH_LANES_H

#include <taskorch.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TKO_MAX_LANES (1u << 20)  /**< lane table size limit */
#define TKO_MAX_LANE_DRAIN 65536u /**< max_drain limit */
#define TKO_MAX_LANE_CAPACITY ((size_t)1 << 30) /**< lane_capacity limit */

typedef struct tko_lanes tko_lanes; /**< opaque */

/** One queued lane task, as the batch and cancel callbacks see it. */
typedef struct tko_lane_task {
  uint64_t key;   /**< the task's key */
  tko_task_fn fn; /**< NULL allowed only with a batch callback */
  void *arg;      /**< its argument */
  int weight;     /**< its weight */
} tko_lane_task;

/** One visit's worth of tasks of one lane, oldest first. The array lives in
 * the lane and is valid only during the callback. */
typedef struct tko_lane_batch {
  unsigned lane; /**< lane index (tko_lanes_index) */
  size_t count;  /**< 1 .. max_drain */
  const tko_lane_task *tasks; /**< the tasks, oldest first */
} tko_lane_batch;

/** Applies a whole drained batch at once (one lock, one flush). Called on a
 * pool worker (or a submitting thread, see bounded pools) with the lane
 * held: no other batch or task of this lane runs meanwhile. The library does not call the tasks' fn in batch mode; the
 * callback owns their effects (it may call fn itself). */
typedef void (*tko_lane_batch_fn)(void *user, const tko_lane_batch *batch);
/** A queued lane task that will never run: free its arg here. */
typedef void (*tko_lane_cancel_fn)(void *user, const tko_lane_task *task);

/** Lane table options. Fill with tko_lane_default_options, then adjust.
 * Zero-filled fields mean the defaults noted beside them. */
typedef struct tko_lane_options {
  unsigned lanes;                 /**< table size, rounded up to a power of two; 0 = 256;
                                     over TKO_MAX_LANES is -EINVAL */
  unsigned max_drain;             /**< tasks a runner takes per visit; 0 = 32; over
                                     TKO_MAX_LANE_DRAIN is -EINVAL */
  size_t lane_capacity;           /**< ring slots a lane allocates at first use; 0 = 16;
                                     over TKO_MAX_LANE_CAPACITY is -EINVAL */
  size_t max_queued;              /**< queued tasks per lane before submit fails with
                                     -EAGAIN; 0 = no limit (the ring grows) */
  void *user;                     /**< passed to batch and on_cancel */
  tko_lane_batch_fn batch;        /**< NULL: the runner calls each task's fn */
  tko_lane_cancel_fn on_cancel;   /**< NULL: cancelled tasks are just dropped */
  const tko_allocator *allocator; /**< NULL = malloc/realloc/free */
} tko_lane_options;

/** Lane table statistics: a snapshot, each lane read under its lock.
 * When quiet: submitted = completed + cancelled + queued. */
typedef struct tko_lane_stats {
  uint64_t submitted;  /**< lane tasks accepted */
  uint64_t completed;  /**< run by a runner (or passed to batch) */
  uint64_t failed;     /**< of those, fn returned non-zero (not in batch mode) */
  uint64_t cancelled;  /**< handed to on_cancel (or dropped without one) */
  uint64_t queued;     /**< accepted, not yet taken by a runner */
  uint64_t visits;     /**< runner visits that took at least one task */
  uint64_t max_batch;  /**< most tasks taken in one visit */
  unsigned lanes_used; /**< lanes that have been given a task */
} tko_lane_stats;

/** The defaults: 256 lanes, max_drain 32, rings of 16, no limit, no callbacks. */
TKO_API tko_lane_options tko_lane_default_options(void);

/** Creates a lane table on `pool` (opts NULL = defaults); the table holds
 * the pool until tko_lanes_destroy.
 * @details Allocates the table (256 bytes a lane); rings come at each
 * lane's first use. -EINVAL: NULL out or pool, or an option over its limit;
 * -ENOMEM; -ESHUTDOWN: the pool's shutdown has begun. */
TKO_API int tko_lanes_create(tko_lanes **out, tko_pool *pool, const tko_lane_options *opts);

/** Queues fn(arg) on the lane of `key`: it runs after the key's earlier
 * tasks and never at once with another of them, exactly once or handed to
 * on_cancel once. See the guarantees above.
 * @details The lane's runner, if it must be started, is submitted to the pool
 * with `weight`. -EINVAL: NULL lanes, or NULL fn without a batch callback;
 * -ESHUTDOWN: the lanes are closed or cancelled, or the pool refused the runner
 * (shut down); -EAGAIN: the lane holds max_queued tasks; -ENOMEM: the ring
 * could not grow, or the pool's queue could not. On error the task is not
 * queued. */
TKO_API int tko_lanes_submit(tko_lanes *lanes, uint64_t key, tko_task_fn fn, void *arg, int weight);

/** Queues fn(arg) as tko_lanes_submit does and returns once it ran: flat
 * combining. If the key's lane is idle, the calling thread runs it: its own
 * task, then what others appended meanwhile (batch callback included), at
 * most max_drain tasks in all, then hands what remains to a runner in the
 * pool (on a full TKO_FULL_REJECT pool, which cannot take that runner, it
 * drives the lane on until it is empty, as a runner on a worker does);
 * it counts as one task the pool ran on its caller (stats.caller_runs).
 * If the lane is busy, it sleeps until the lane's runner has run the task.
 * So other threads' tasks of that lane (tko_lanes_submit's too) may run on
 * the calling thread: one that ends its thread (pthread_exit) ends the
 * caller's.
 * @details 0 once fn ran (or its batch was passed to the batch callback);
 * -ECANCELED once it was accepted and then handed to on_cancel (which saw fn
 * and arg) instead; other errors as tko_lanes_submit's, with nothing queued.
 * -EDEADLK from a task, batch callback or on_cancel of these lanes (also
 * from another table's task run nested in one of them); -EBUSY
 * from a task of the lanes' pool when the lane is busy (a worker may not wait
 * for a runner its pool may still have to run): nothing queued, submit it
 * with tko_lanes_submit instead. An idle lane runs here even on a paused pool;
 * a pool's shutdown waits for a lane run here. Nothing is allocated per call. */
TKO_API int tko_lanes_submit_wait(tko_lanes *lanes, uint64_t key, tko_task_fn fn, void *arg,
                                  int weight);

/** The lane index of `key`: keys with equal indexes share a lane. */
TKO_API unsigned tko_lanes_index(const tko_lanes *lanes, uint64_t key);

/** Blocks, without polling, until no lane task is queued or running, or
 * timeout_ms passes (-1 = no limit, 0 = just check).
 * @details -ETIMEDOUT on timeout; -EDEADLK when called from a task of the
 * lanes' pool, a lane task, a batch callback or these lanes' on_cancel (which
 * may be running on any thread: the wait would include the call itself);
 * -EINVAL for NULL or timeout_ms < -1. Lane tasks whose runner the pool
 * cancelled count as queued until tko_lanes_pool_cancelled, tko_lanes_cancel or
 * tko_lanes_destroy disposes of them. */
TKO_API int tko_lanes_wait_idle(tko_lanes *lanes, long timeout_ms);

/** Closes the table: later submits fail with -ESHUTDOWN and queued tasks
 * still run. Idempotent.
 * @details A runner running at the close finishes its lane on its worker rather
 * than requeueing itself. Submits racing with close either are accepted (and
 * run) or fail. -EINVAL for NULL. */
TKO_API int tko_lanes_close(tko_lanes *lanes);

/** Closes the table and hands every queued (not yet taken) lane task to
 * on_cancel, on the calling thread, oldest first per lane. Idempotent.
 * @details Tasks a runner has already taken still run. -EINVAL for NULL. */
TKO_API int tko_lanes_cancel(tko_lanes *lanes);

/** For the pool's on_cancel hook: returns 1 if `task` is a lane runner of any
 * lane table, after handing that lane's queued tasks to its table's
 * on_cancel (the hook must then ignore the task); 0 for any other task or
 * NULL.
 * @details The lane table must still exist. */
TKO_API int tko_lanes_pool_cancelled(const tko_task_info *task);

/** Closes the table, waits until every accepted task has run or been
 * cancelled and every runner is back, then frees the table; a paused pool
 * does not hold it.
 * @details This drains the lanes: runners still queued in the pool are taken
 * back (the pool counts each as cancelled; its on_cancel hook never sees it)
 * and their lanes run on the calling thread, so a paused pool does not hold
 * destroy (the pool stays paused for its other tasks); runners already running
 * finish their lanes on their workers. Call it while the pool runs (or is
 * paused) or after its shutdown returned, not during one; no other call on
 * these lanes may race with destroy. -EINVAL for NULL; -EDEADLK, doing nothing,
 * from a task of the lanes' pool or from these lanes' on_cancel. */
TKO_API int tko_lanes_destroy(tko_lanes *lanes);

/** Fills *out with a snapshot. Does nothing when either pointer is NULL. */
TKO_API void tko_lanes_stats(tko_lanes *lanes, tko_lane_stats *out);

#ifdef __cplusplus
}
#endif
#endif /* TASKORCH_LANES_H */
