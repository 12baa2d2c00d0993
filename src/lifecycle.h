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
 * Lock: the gate's mutex (gate_mu, ranked in internal.h) guards the state
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

/* Enters the gate (see above): 0, or -ESHUTDOWN once the pool is closed
 * (DRAINING or later). Every successful enter is paired with a leave. */
int tko__gate_enter(tko_pool *pool);
void tko__gate_leave(tko_pool *pool);

#endif
