/* SPDX-License-Identifier: MIT */
/* Closing and cancelling a lane table, waiting for it, destroying it, and
 * its stats; the pool's shutdown reaches it through its attachment. */
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

static void close_table(tko_lanes *l);

static void cancel_lanes(tko_lanes *l);

/* The pool's shutdown resolves the table (lifecycle.h): it closes it, so
 * later submits are -ESHUTDOWN, and waits for nothing. Queued runners then
 * run (DRAIN; one that cannot requeue itself finishes its lane where it
 * runs) or are cancelled by the pool, which hands them back here
 * (tko__lanes_runner_cancelled: their lanes' tasks go to on_cancel) (CANCEL); a
 * runner already running finishes its lane. The pool's keyed table, under
 * CANCEL, also cancels the keyed tasks queued behind a running runner, but
 * later, once the pool refuses submits (keyed.c: its phase's cancel), so
 * that the on_cancel it calls cannot submit. */
int tko__lanes_pool_closing(tko__attachment *a, tko_shutdown_mode mode, long timeout_ms) {
  (void)mode;
  (void)timeout_ms;
  close_table((tko_lanes *)((char *)a - offsetof(tko_lanes, attach)));
  return 0;
}

/* Waits, under no lock, for every submit that passed the closed check. */
static void close_table(tko_lanes *l) {
  tko__store_seq(&l->closed, true); /* seq_cst: see tko_lanes_submit */
  for (unsigned i = 0; i <= l->mask; i++) {
    lane *ln = lane_at(l, i);
    tko__mutex_lock(&ln->mu);
    tko__mutex_unlock(&ln->mu);
  }
}

int tko_lanes_close(tko_lanes *l) {
  int bad = tko__lanes_check(l);
  if (bad) return bad;
  close_table(l);
  return 0;
}

static void cancel_lanes(tko_lanes *l) {
  close_table(l);
  for (unsigned i = 0; i <= l->mask; i++)
    tko__lane_cancel(l, lane_at(l, i), false);
}

int tko_lanes_cancel(tko_lanes *l) {
  int bad = tko__lanes_check(l);
  if (bad) return bad;
  cancel_lanes(l);
  return 0;
}

static bool nothing_pending(void *l) { return tko__load_seq(&((tko_lanes *)l)->pending) == 0; }

int tko_lanes_wait_idle(tko_lanes *l, long timeout_ms) {
  int bad = tko__lanes_check(l);
  if (bad) return bad;
  if (timeout_ms < -1) return -EINVAL;
  if (tko__lanes_in_own_task(l)) return -EDEADLK;
  struct timespec deadline;
  if (timeout_ms >= 0) tko__deadline_after(&deadline, timeout_ms);
  tko__mutex_lock(&l->idle_mu);
  /* Seq_cst, before nothing_pending's seq_cst load: see
   * tko__lanes_pending_sub. */
  tko__add_seq(&l->idle_waiters, 1);
  int rc = tko__cond_wait_until(&l->idle_cv, &l->idle_mu,
                                timeout_ms < 0 ? NULL : &deadline, nothing_pending, l);
  tko__sub_relaxed(&l->idle_waiters, 1); /* a late broadcast is only wasted */
  tko__mutex_unlock(&l->idle_mu);
  return rc;
}

/* Destroy drains: runners queued in the pool are withdrawn and their lanes
 * driven here, so that a paused pool, which would not run them until it is
 * resumed, cannot hold destroy; runners already
 * running on workers finish their lanes there (the table is closed: they
 * do not requeue), each waking this thread as it counts itself out. */
int tko_lanes_destroy(tko_lanes *l) {
  int bad = tko__lanes_check(l);
  if (bad == -ECHILD) return 0; /* a forked child's copy: left alone, as the pool's */
  if (bad) return bad;
  if (tko__lanes_in_own_task(l)) return -EDEADLK;
  close_table(l);
  for (;;) {
    tko__lanes_drive_withdrawn(l);
    tko__mutex_lock(&l->idle_mu);
    if (tko__load_seq(&l->runners) == 0) break;
    /* Runners are out. If the pool has nothing queued or running, they
     * cannot be live: a live runner is queued or running, or has already
     * counted itself out (the pool's idle check errs only towards "busy").
     * Then the pool dropped them: dispose of their lanes here. */
    tko__mutex_unlock(&l->idle_mu);
    bool pool_idle = tko_pool_wait_idle(l->pool, 0) == 0;
    if (pool_idle && tko__load_seq(&l->runners) != 0) {
      for (unsigned i = 0; i <= l->mask; i++)
        tko__lane_cancel(l, lane_at(l, i), true);
    }
    tko__mutex_lock(&l->idle_mu);
    if (!pool_idle && tko__load_seq(&l->runners) != 0)
      tko__cond_wait(&l->idle_cv, &l->idle_mu);
    tko__mutex_unlock(&l->idle_mu);
  }
  tko__mutex_unlock(&l->idle_mu);
  /* Detached first: a shutdown of the pool resolving the table right now
   * (its close callback takes every lane's mu) is waited for before the
   * mutexes go (test attack_lanes2/destroy_races_shutdown_of_a_paused_pool,
   * under TSan). The pool may be freed from here on. */
  tko__detach(l->pool, &l->attach);
  const tko_allocator *a = l->opts.allocator;
  for (unsigned i = 0; i <= l->mask; i++) {
    lane *ln = lane_at(l, i);
    tko__mutex_destroy(&ln->mu);
    tko__mem_free(a, ln->ring);
    tko__mem_free(a, ln->scratch);
    tko__mem_free(a, ln->meta);
    tko__mem_free(a, ln->scratch_meta);
  }
  tko__mutex_destroy(&l->idle_mu);
  pthread_cond_destroy(&l->idle_cv);
  l->magic = LANES_DEAD;
  tko__mem_free(a, l->raw);
  tko__mem_free(a, l);
  return 0;
}

void tko_lanes_stats(tko_lanes *l, tko_lane_stats *out) {
  if (!l || !out) return;
  memset(out, 0, sizeof *out);
  if (tko__lanes_check(l)) return;
  for (unsigned i = 0; i <= l->mask; i++) {
    lane *ln = lane_at(l, i);
    tko__mutex_lock(&ln->mu);
    out->submitted += ln->submitted;
    out->completed += ln->completed;
    out->failed += ln->failed;
    out->cancelled += ln->cancelled;
    out->queued += ln->count;
    out->visits += ln->visits;
    if (ln->max_batch > out->max_batch) out->max_batch = ln->max_batch;
    if (ln->used) out->lanes_used++;
    tko__mutex_unlock(&ln->mu);
  }
}
