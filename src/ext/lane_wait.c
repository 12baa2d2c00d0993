/* SPDX-License-Identifier: MIT */
/* Flat combining on keyed lanes (tko_lanes_submit_wait): a submit that
 * returns once its task ran, and that runs the lane itself when it finds
 * it idle.
 *
 * The protocol, on top of lane_runner.c's (its essay is the rule book):
 *
 * If the lane is idle (not scheduled: no runner queued or running, and
 * so an empty ring), the caller, under the lane's mutex, takes the runner
 * token and counts its task submitted and pending, but does not queue it:
 * it becomes the lane's runner on its own thread. The pool runs the
 * lane's runner here at once as a caller-runs task (tko__run_owned_here:
 * inside the gate, hooks, stats.caller_runs), and the runner, seeing it
 * was started here (lane_runner.c: `starting`), runs the caller's task
 * from the caller's stack as a visit of one, then, the combining, visits
 * of what other submitters appended meanwhile, at most max_drain tasks in
 * all, each visit one batch in batch mode, with the lane unlocked around
 * them, as any runner does. Then the caller hands the lane on as a
 * runner's visit ends (a new runner in the pool if tasks remain), so no
 * caller is held by others' appends for more than max_drain tasks. Its
 * own task never was in the ring, so no cancel can take it, no waiter
 * record is needed, and the call returns 0 once the visit ran it.
 *
 * If the lane is busy, the caller pushes its task as tko_lanes_submit
 * does and lists a waiter record, on its own stack, with its task's
 * ticket: the task's place in the lane, taken + its ring position
 * (lane.h). Tickets only grow along the ring (a visit or a cancel takes
 * from the head and moves taken on), so the waiters' list, appended in
 * push order, stays in ticket order. Then it waits: the token holder will
 * run its task.
 *
 * Waking: whoever ends a task ends its waiter. A visit, once its tasks
 * ran and are counted, takes the mutex and resolves every waiter with a
 * ticket below its last (tko__lane_waiters_ran; earlier tickets were run
 * or cancelled before). A cancel detaches the ring and the waiters of its
 * tickets under the mutex, hands the tasks to on_cancel unlocked, and only
 * then resolves those waiters, so a caller returns -ECANCELED after
 * on_cancel saw its fn and arg, never before. Resolving stores the state
 * with release (the task's effects, or on_cancel's, happen-before the
 * caller's return), by an exchange that tells whether the caller sleeps,
 * and then wakes the word only if it does (prim.h: tko__word_wake_all
 * reads nothing at the address, so the caller may already have returned).
 * The caller, before it sleeps, turns LANE_WAITING into LANE_SLEEPING with
 * a CAS, then sleeps on the word while it reads LANE_SLEEPING. The word
 * orders the CAS and the exchange: if the exchange came first the CAS
 * fails and the caller sees the result; if the CAS came first the
 * exchange sees LANE_SLEEPING and wakes, and the word wait re-checks the
 * word before it sleeps, so no wake-up is lost. Every listed waiter's task is in the
 * ring or in a visit's scratch, and each of those either runs (its visit
 * resolves it) or goes to on_cancel (its cancel resolves it): no waiter is
 * left listed.
 *
 * A task of the pool may not wait: its worker could be the one that has
 * to run the lane's queued runner. So from a task of the pool (or the
 * pool's shutdown hooks) a busy lane is -EBUSY, with nothing queued; an
 * idle lane it runs itself, as any caller does. A task, batch or on_cancel
 * of these very lanes gets -EDEADLK: it may be the lane's runner. */
#define _GNU_SOURCE
#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "atomics.h"
#include "lifecycle.h"
#include "prim.h"
#include "witness.h"
#include "taskorch/lanes.h"
#include "lane.h"

int tko_lanes_submit_wait(tko_lanes *l, uint64_t key, tko_task_fn fn, void *arg, int weight) {
  int bad = tko__lanes_check(l);
  if (bad) return bad;
  if (!fn && !l->opts.batch) return -EINVAL;
  if (tko__lanes_in_batch(l)) return -EDEADLK;
  lane *ln = lane_at(l, (unsigned)(tko__mix64(key) & l->mask));
  tko__mutex_lock(&ln->mu);
  if (!ln->scheduled) {
    /* Seq_cst: as tko__lane_ring_push's closed check. */
    if (tko__load_seq(&l->closed)) {
      tko__mutex_unlock(&ln->mu);
      return -ESHUTDOWN;
    }
    /* Relaxed: as tko_lanes_submit's (every decrement follows a later
     * lock of ln->mu). The token taken here is counted in runners only
     * if it outlives this call (lane_runner.c: count_token). */
    tko__add_relaxed(&l->pending, 1);
    ln->submitted++;
    ln->used = true;
    ln->scheduled = true;
    /* Entered under ln->mu while the table is open: the pool's shutdown
     * has yet to close its gate (lane_runner.c: enter_gate), and waits for
     * this thread to leave it. */
    bool gated = tko__gate_enter(l->pool) == 0;
    tko__mutex_unlock(&ln->mu);
    tko_lane_task own = {.key = key, .fn = fn, .arg = arg, .weight = weight};
    tko__lane_run_here(l, ln, &own, l->opts.max_drain, gated);
    if (gated) tko__gate_leave(l->pool);
    return 0; /* the own task never is in the ring, where a cancel finds tasks */
  }
  /* A task of the pool may not wait for a busy lane (see above). */
  if (tko__pool_is_current(l->pool)) { /* a thread-local look */
    tko__mutex_unlock(&ln->mu);
    return -EBUSY;
  }
  int rc = tko__lane_ring_push(l, ln, key, fn, arg, weight);
  if (rc) {
    tko__mutex_unlock(&ln->mu);
    return rc;
  }
  lane_waiter w = {.ticket = ln->taken + ln->count - 1, .next = NULL};
  atomic_init(&w.state, LANE_WAITING);
  if (ln->waiters_last) ln->waiters_last->next = &w;
  else ln->waiters = &w;
  ln->waiters_last = &w;
  tko__add_relaxed(&l->pending, 1); /* relaxed: as above */
  ln->submitted++;
  tko__mutex_unlock(&ln->mu);
  /* Acquire: pairs with the release in tko__lane_waiters_end. */
  unsigned state;
  while ((state = tko__load_acquire(&w.state)) == LANE_WAITING || state == LANE_SLEEPING) {
    /* Relaxed: a failed CAS loops back to the acquire load. */
    if (state == LANE_WAITING && !tko__cas_relaxed(&w.state, &state, LANE_SLEEPING)) continue;
    tko__word_wait(&w.state, LANE_SLEEPING, UINT64_MAX);
  }
  return state == LANE_RAN ? 0 : -ECANCELED;
}
