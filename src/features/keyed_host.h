/* SPDX-License-Identifier: MIT */
/* The pool's own keyed table (tko_submit_keyed) between keyed tasks' host
 * side (keyed.c, a feature) and the lanes (the lane_*.c files, an
 * extension), declared without the pool's layout, like lifecycle.h, so
 * that the lanes stay an extension. Calls go down only: the lanes call
 * keyed.c's functions, keyed.c calls the lanes' ops (tko__keyed_ops).
 *
 * Keyed tasks are the host's tasks: each is admitted by the pool's full
 * policy before its lane is locked (a bounded queue counts it until it
 * starts), counted as submitted with an id of its own when its lane
 * accepts it, and started, run and counted by the pool - hooks,
 * on_failure, stats - or cancelled through the pool's on_cancel. Its lane's runner is the library's own: it takes no
 * room, never waits and never runs on the submitter, and a worker takes it
 * alone, so that a runner not yet started stays available to an idle
 * worker. */
#ifndef TKO_KEYED_HOST_H
#define TKO_KEYED_HOST_H

#include <stdbool.h>
#include <stdint.h>

#include "taskorch.h"

/* keyed.c, for the lanes (lane_ring.c, lane_runner.c, lane_keyed.c). */

/* Counts one keyed task as submitted (its lane accepted it): its id,
 * nonzero and unique in the pool, and *enq_ns its submit time (0 when the
 * pool measures no times). */
uint64_t tko__keyed_accept(tko_pool *pool, uint64_t *enq_ns);
/* Runs a keyed task on the calling thread as the pool runs a task (its room
 * back, hooks, counters); returns its status. */
int tko__keyed_run(tko_pool *pool, const tko_lane_task *task, uint64_t id, uint64_t enq_ns);
/* A keyed task that will never run: its room back, the pool's on_cancel
 * with its id, counted as cancelled. */
void tko__keyed_cancel(tko_pool *pool, const tko_lane_task *task, uint64_t id, uint64_t enq_ns);

/* Whether the pool's full policy is TKO_FULL_CALLER_RUNS: a lane table's
 * submit that finds a full queue then runs its lane's first visit itself
 * (lane_runner.c: tko_lanes_submit), with the lane unlocked. */
bool tko__pool_caller_runs(const tko_pool *pool);

/* The lanes, for keyed.c: calls go down only. The public entry point,
 * tko_submit_keyed, is lane_keyed.c's, so a program linked statically
 * that submits keyed tasks pulls the lanes in with it (no constructor's
 * registration to lose); it passes these ops down with each submit, and
 * keyed.c keeps them in the pool with the table they made, for the pool's
 * destroy. So keyed.c names nothing of the layer above it. */

/* A keyed submit's outcome besides 0 and a negative errno (ops.submit). */
enum { TKO__LANE_BUSY = 1 };

typedef struct tko__keyed_ops {
  /* Makes the pool's keyed table (the default options, alloc its
   * allocator): its tasks run and are cancelled through the functions
   * above. */
  int (*create)(tko_lanes **out, tko_pool *pool, const tko_allocator *alloc);
  /* Queues a keyed task whose room the caller took. With run_here (a full
   * TKO_FULL_CALLER_RUNS queue, no room taken): if the key's lane is idle,
   * runs the task on this thread at once, and only it, then hands the lane
   * to the pool for what others queued meanwhile; if the lane has tasks
   * queued or running, does nothing and returns TKO__LANE_BUSY. Else 0,
   * -ESHUTDOWN (the table is closed) or -ENOMEM. */
  int (*submit)(tko_lanes *l, uint64_t key, tko_task_fn fn, void *arg, int weight,
                bool run_here);
  /* Hands every task queued in the table's lanes to on_cancel (a CANCEL
   * shutdown, once the pool refuses submits; the table is closed). */
  int (*cancel)(tko_lanes *l);
  /* Frees the table at the pool's destroy (its shutdown closed it). */
  int (*destroy)(tko_lanes *l);
} tko__keyed_ops;

/* keyed.c, for lane_keyed.c: tko_submit_keyed with the lanes' ops. The
 * pool's full policy is applied before the lane is locked; the first
 * submit makes the pool's table with ops->create. */
int tko__keyed_submit(tko_pool *pool, const tko__keyed_ops *ops, uint64_t key, tko_task_fn fn,
                      void *arg, int weight);

#endif
