/* SPDX-License-Identifier: MIT */
/* The pool's lifecycle as the rest of the library sees it: its states, the
 * gate that every thread touching a pool from outside its workers passes,
 * and attachments (objects that hold a pool and are resolved at shutdown).
 * Kept apart from internal.h, and needing nothing of the pool's layout, so
 * that an extension (lanes, coalescer) or a feature (timers, async) can
 * attach without seeing the engine's structures.
 *
 * States (tko__pool_state), each reached once, in this order:
 *
 *   RUNNING    submits are accepted.
 *   CLOSING    a shutdown began: attachments are being resolved (each one's
 *              close callback runs until it returns 0), while the pool still
 *              runs tasks and accepts submits, so that a drain can finish
 *              through it. New attachments are refused.
 *   DRAINING   the pool is closed: submits fail with -ESHUTDOWN, the gate
 *   CANCELLING refuses entries, blocked submitters are woken; queued tasks
 *              run (DRAINING) or go to on_cancel (CANCELLING). A DRAIN that
 *              timed out may be escalated by a later CANCEL.
 *   STOPPED    every worker is joined, nobody is inside the gate, nothing is
 *              queued or in flight. Only destroy remains.
 *
 * The gate: a count of threads inside the pool that are not its workers -
 * a submitter waiting for room in a full blocking queue, a caller-runs task
 * (or batch) running on its submitter's thread. Shutdown closes the gate
 * and waits (within its deadline) for the count to reach zero before it
 * reports STOPPED, so destroy never frees a pool that such a thread is
 * still using. Entering is a slow path only (a full queue), never plain
 * tko_submit's.
 *
 * Attachments (libuv's model: the owner of the work reports its own
 * cancellation): an object that holds a pool registers a tko__attachment
 * with a close callback. Every shutdown call that finds the attachment
 * unresolved calls close(a, mode, timeout_ms) on the shutting-down thread,
 * with no pool lock held: the attachment runs (TKO_DRAIN) or cancels
 * (TKO_CANCEL) what it holds, returning 0 once nothing of it is left in the
 * pool, or -ETIMEDOUT if that did not happen within timeout_ms (-1 = no
 * limit; 0 = do not wait), in which case the next shutdown call asks again.
 * TKO_CANCEL_NOWAIT calls it once with TKO_CANCEL and 0 and goes on
 * whatever it returns. close must not call the pool's shutdown, destroy or
 * wait_idle (they return -EDEADLK there). The attachment stays registered
 * until its owner calls tko__detach (its own destroy): tko_pool_destroy
 * returns -EBUSY, freeing nothing, while any attachment remains; the host
 * destroys the attached objects and calls tko_pool_destroy again.
 *
 * Lock: the gate's mutex (gate_mu, ranked in witness.h) guards the state
 * changes, the count, the attachment list and the worker-thread count; it
 * is never held while a callback, a task or a hook runs. */
#ifndef TKO_LIFECYCLE_H
#define TKO_LIFECYCLE_H

#include <stdbool.h>

#include "taskorch.h"

typedef enum tko__pool_state {
  TKO__RUNNING = 0,
  TKO__CLOSING,
  TKO__DRAINING,
  TKO__CANCELLING,
  TKO__STOPPED
} tko__pool_state;

typedef struct tko__attachment tko__attachment;
struct tko__attachment {
  /* Set by the owner before tko__attach; see above. mode is TKO_DRAIN or
   * TKO_CANCEL. */
  int (*close)(tko__attachment *a, tko_shutdown_mode mode, long timeout_ms);
  /* The gate's own, guarded by gate_mu. */
  tko__attachment *prev, *next;
  bool resolved; /* close returned 0 */
};

/* Registers a (the caller keeps it alive until tko__detach). 0, -EINVAL,
 * -ECHILD, or -ESHUTDOWN once the pool's shutdown has begun. */
int tko__attach(tko_pool *pool, tko__attachment *a);
/* Unregisters a; safe in any state, once per successful tko__attach. */
void tko__detach(tko_pool *pool, tko__attachment *a);

/* Owned tasks: tasks the library submits for itself (a lane's runner, a
 * coalescer's sweep). The engine never names their owners: it reaches
 * them through the tko__task_owner record each carries (the layering
 * rule: a lower layer reaches a higher one only through what it
 * registered). Two promises differ from a host's task:
 * - a worker takes an owned task alone: a take ends before one, and one
 *   taken starts a take of its own, so that an owned task not yet started
 *   stays available to an idle worker (two lanes' runners in one take
 *   would run their keys one after the other);
 * - a queued owned task that the pool cancels goes to its owner's
 *   cancelled callback, never to the pool's on_cancel hook, which would
 *   not know what its argument is. It is called on the cancelling thread,
 *   with no pool lock held, once per task.
 * Otherwise an owned task is the host's task (room in a bounded queue,
 * hooks, stats), unless its owner is `internal`: the pool's own keyed
 * table, whose runners take no room, are not counted nor seen by hooks
 * (their keyed tasks are), and are refused only at shutdown or for want of
 * memory. The record must outlive its tasks (an owner counts them). */
typedef struct tko__task_owner tko__task_owner;
struct tko__task_owner {
  void (*cancelled)(tko__task_owner *owner, void *arg);
  bool internal;
};

/* Submits fn(arg) as owner's task: as tko_submit_timed does (the pool's
 * full policy, waiting up to timeout_ms for room), except that with
 * run_here false a full TKO_FULL_CALLER_RUNS queue waits for room as
 * TKO_FULL_BLOCK does instead of running the task on this thread. An
 * internal owner's task never waits and never runs here. 0 or a negative
 * errno, as tko_submit_timed. */
int tko__submit_owned(tko_pool *pool, tko__task_owner *owner, tko_task_fn fn, void *arg,
                      int weight, long timeout_ms, bool run_here);

/* Takes up to max queued tasks of owner out of the pool and stores their
 * arguments in args; returns how many (0: none queued). The pool counts
 * them as cancelled, calling nobody: their owner runs or disposes of their
 * work itself (a lane table being destroyed drives the lanes of its
 * withdrawn runners, so that a paused pool cannot hold the destroy). */
size_t tko__withdraw_owned(tko_pool *pool, tko__task_owner *owner, void **args, size_t max);

/* Enters the gate (see above): 0, or -ESHUTDOWN once the pool is closed
 * (DRAINING or later). Every successful enter is paired with a leave. */
int tko__gate_enter(tko_pool *pool);
void tko__gate_leave(tko_pool *pool);

#endif
