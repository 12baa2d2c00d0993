/* SPDX-License-Identifier: MIT */
/* The pool's own keyed table (keyed_host.h): tko_submit_keyed, and the ops
 * through which keyed.c makes, feeds and frees the table. */
#define _GNU_SOURCE
#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "invariant.h"
#include "atomics.h"
#include "keyed_host.h"
#include "lifecycle.h"
#include "mem.h"
#include "prim.h"
#include "witness.h"
#include "taskorch/lanes.h"
#include "lane.h"

/* The pool's keyed table: tasks accepted here are the pool's (counted,
 * with an id) once tko__lane_ring_push returns 0, so they must run or be cancelled;
 * the runner, which takes no room, is refused only at shutdown or for want
 * of memory, and this thread then drives the lane itself, as a runner
 * whose requeue was refused does. */
static int keyed_submit(tko_lanes *l, uint64_t key, tko_task_fn fn, void *arg, int weight,
                        bool run_here) {
  lane *ln = lane_at(l, (unsigned)(tko__mix64(key) & l->mask));
  tko__mutex_lock(&ln->mu);
  if (run_here && ln->scheduled) { /* earlier tasks of the lane come first */
    tko__mutex_unlock(&ln->mu);
    return TKO__LANE_BUSY;
  }
  int rc = tko__lane_ring_push(l, ln, key, fn, arg, weight);
  if (rc) {
    tko__mutex_unlock(&ln->mu);
    return rc;
  }
  tko__add_relaxed(&l->pending, 1); /* relaxed: see tko_lanes_submit */
  ln->submitted++;
  if (ln->scheduled) {
    tko__mutex_unlock(&ln->mu);
    return 0;
  }
  tko__add_relaxed(&l->runners, 1); /* relaxed: see tko_lanes_submit */
  ln->scheduled = true;
  /* Caller-runs: the lane was idle, so ours is its only task: drive's first
   * visit runs it here, then hands the lane to the pool (a runner, refused
   * only at shutdown), whatever others queued meanwhile. */
  if (run_here || tko__lane_submit_runner(l, ln, weight, 0, false) != 0) tko__lane_drive(l, ln);
  else tko__mutex_unlock(&ln->mu);
  return 0;
}

static int keyed_create(tko_lanes **out, tko_pool *pool, const tko_allocator *alloc) {
  tko_lane_options o = tko_lane_default_options();
  o.allocator = alloc;
  return tko__lanes_create(out, pool, &o, true);
}

/* What keyed.c may do with the pool's keyed table, passed down with each
 * submit: keyed.c keeps the admission and the table's lifetime, and names
 * nothing of this layer (keyed_host.h). */
static const tko__keyed_ops keyed_ops = {
    .create = keyed_create,
    .submit = keyed_submit,
    .cancel = tko_lanes_cancel,
    .destroy = tko_lanes_destroy,
};

/* The public entry point is here, with the lanes, rather than in keyed.c:
 * a program linked statically that submits keyed tasks then pulls the
 * lanes in through this call, and nothing depends on a registration that
 * an unlinked object would have made. */
int tko_submit_keyed(tko_pool *pool, uint64_t key, tko_task_fn fn, void *arg, int weight) {
  return tko__keyed_submit(pool, &keyed_ops, key, fn, arg, weight);
}
