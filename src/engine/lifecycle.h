/* SPDX-License-Identifier: MIT */
/* The pool's lifecycle as the rest of the library sees it: its states, the
 * gate that every thread touching a pool from outside its workers passes,
 * and attachments (objects that hold a pool and are resolved at shutdown).
 * Kept apart from pool.h, and needing nothing of the pool's layout, so
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
 * Phases: what a feature of the pool itself (its keyed table, async tasks,
 * timers) leaves for shutdown and destroy, registered as a tko__phase with
 * a number - its place in both (tko__phase_number). Shutdown, once the
 * workers are joined and the queue is empty, calls each registered close
 * in number order; destroy calls each registered fini in number order
 * before the engine frees its own parts. The engine names no feature: a
 * feature registers on its first use, with tko__phase_add.
 *
 * Lock: the gate's mutex (gate_mu, ranked in witness.h) guards the state
 * changes, the count, the attachment list, the phases' registrations and
 * progress, and the worker-thread count; it is never held while a
 * callback, a task or a hook runs. */
#ifndef TKO_LIFECYCLE_H
#define TKO_LIFECYCLE_H

#include <stdbool.h>
#include <time.h>

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
  /* Set by the owner before tko__attach: the pool's own object (its keyed
   * table), which a phase's fini destroys; it does not hold the pool, so
   * tko_pool_destroy is not -EBUSY for it. */
  bool pool_owned;
  /* The gate's own, guarded by gate_mu. */
  tko__attachment *prev, *next;
  bool resolved; /* close returned 0 */
};

/* Registers a (the caller keeps it alive until tko__detach). 0, -EINVAL,
 * -ECHILD, or -ESHUTDOWN once the pool's shutdown has begun. */
int tko__attach(tko_pool *pool, tko__attachment *a);
/* Unregisters a; safe in any state, once per successful tko__attach. */
void tko__detach(tko_pool *pool, tko__attachment *a);

/* Phase numbers, one per feature: the order of shutdown's closes and of
 * destroy's finis, in one place (as witness.h ranks every lock).
 *   KEYED   the keyed table (keyed.c). No close: it is an attachment,
 *           resolved when shutdown begins; its fini destroys it, first,
 *           while the rest of the pool is whole (the lanes' destroy uses it).
 *   ASYNC   async tasks (async.c). Close: waits, within the deadline, for
 *           the async tasks in flight to complete, as the running ones
 *           did, and for their completers to leave the pool; fini frees
 *           the records.
 *   TIMERS  timers (timer.c). Close, last: until then a timer that comes
 *           due may be what completes an async task waited for above (its
 *           task runs on the timer thread: the closed pool cannot queue
 *           it); it joins the timer thread and hands each timer still
 *           armed to on_cancel. Fini frees the heap and the records. */
typedef enum tko__phase_number {
  TKO__PHASE_KEYED = 0,
  TKO__PHASE_ASYNC,
  TKO__PHASE_TIMERS,
  TKO__PHASE_COUNT
} tko__phase_number;

/* A feature's phase: a static record, registered once per pool. */
typedef struct tko__phase {
  tko__phase_number number;
  /* Shutdown, once every worker is joined and the queue is empty, on the
   * shutting-down thread, with no pool lock held: 0 once the feature holds
   * nothing of the pool's work, or -ETIMEDOUT when deadline (NULL: none)
   * passed first; the next shutdown call then calls it again, and no later
   * phase runs before it returns 0. NULL: nothing to close. */
  int (*close)(tko_pool *pool, const struct timespec *deadline);
  /* A CANCEL shutdown, on the shutting-down thread, once the pool refuses
   * submits (after close_pool's state), with no pool lock held: hands what
   * the feature still queues outside the pool to on_cancel, whose submits
   * are then refused. NULL: nothing to cancel. */
  void (*cancel)(tko_pool *pool);
  /* Destroy, once, after the pool stopped and before the engine frees its
   * own parts, with no pool lock held. NULL: nothing to free. */
  void (*fini)(tko_pool *pool);
} tko__phase;

/* Registers phase for pool, once (a later call with the same record is a
 * lock-free check); call it before the feature first holds anything the
 * phase closes or frees, with no lock held. 0, or -ESHUTDOWN when a
 * shutdown has already gone past the phase's number: the phase would
 * never close, so the feature refuses its work. A phase registered while
 * a shutdown runs, before it reaches that number, is closed in turn. */
int tko__phase_add(tko_pool *pool, const tko__phase *phase);

/* Owned tasks: tasks the library submits for itself (a lane's runner, a
 * keyed runner, a coalescer's sweep). They are task kinds (kind.h) like a
 * group's members: the item's ctx is its tko__task_owner, which starts
 * with its kind, one of the engine's two owner kinds (lifecycle.c: the
 * host's, or the internal one), set by tko__owner_init; the engine reaches
 * the owner only through that kind, so it never names one (the layering
 * rule: a lower layer reaches a higher one only through what it
 * registered). Two promises differ from a host's task:
 * - a worker takes an owned task alone (TKO__CTX_ALONE): a take ends
 *   before one, and one taken starts a take of its own, so that an owned
 *   task not yet started stays available to an idle worker (two lanes'
 *   runners in one take would run their keys one after the other);
 * - a queued owned task that the pool cancels goes to its owner's
 *   cancelled callback, never to the pool's on_cancel hook, which would
 *   not know what its argument is. It is called on the cancelling thread,
 *   with no pool lock held, once per task.
 * Otherwise an owned task is the host's task (room in a bounded queue,
 * hooks, stats), unless its owner is internal: the pool's own keyed
 * table, whose runners take no room, are not counted nor seen by hooks
 * (their keyed tasks are), and are refused only at shutdown or for want of
 * memory. The record must outlive its tasks (an owner counts them). */
typedef struct tko__task_owner tko__task_owner;
struct tko__task_owner {
  const struct tko__task_kind *kind; /* first: the record of a kind's task */
  void (*cancelled)(tko__task_owner *owner, void *arg);
};

/* Makes owner a record for owned tasks: cancelled gets each back that the
 * pool cancels; internal, the pool's own (see above). Before its first
 * task. */
void tko__owner_init(tko__task_owner *owner, void (*cancelled)(tko__task_owner *owner, void *arg),
                     bool internal);

/* Submits fn(arg) as owner's task: as tko_submit_timed does (the pool's
 * full policy, waiting up to timeout_ms for room), except that with
 * run_here false a full TKO_FULL_CALLER_RUNS queue waits for room as
 * TKO_FULL_BLOCK does instead of running the task on this thread. An
 * internal owner's task never waits and never runs here. 0 or a negative
 * errno, as tko_submit_timed. */
int tko__submit_owned(tko_pool *pool, tko__task_owner *owner, tko_task_fn fn, void *arg,
                      int weight, long timeout_ms, bool run_here);

/* Runs fn(arg) as owner's task on the calling thread at once, as a full
 * TKO_FULL_CALLER_RUNS queue's submit runs a task: through the hooks,
 * counted in stats.caller_runs, the thread counting as the pool's
 * meanwhile (its waits on the pool are -EDEADLK). The caller is inside the
 * gate (tko__gate_enter), so a shutdown waits for it; it may have been
 * closed since. 0 once it ran, or tko_submit's handle errors (-EINVAL,
 * -ECHILD). Not for an internal owner. */
int tko__run_owned_here(tko_pool *pool, tko__task_owner *owner, tko_task_fn fn, void *arg,
                        int weight);

/* Whether the calling thread runs a task of pool (on a worker, or one the
 * pool runs on its caller) or is in its shutdown: what tko_pool_wait_idle
 * answers -EDEADLK for, read from thread-locals alone (no lock, no wait). */
bool tko__pool_is_current(const tko_pool *pool);

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
