/* SPDX-License-Identifier: MIT */
/* The runner protocol of keyed serial lanes on the public pool API: a fixed
 * table of lanes (lane.h), each a FIFO ring of tasks (lane_ring.c) plus at
 * most one runner task in the pool.
 *
 * The protocol, and why no task is lost, run twice, or run concurrently with
 * another of its lane:
 *
 * Each lane has a mutex guarding its ring and a flag, `scheduled`, true
 * exactly while one runner for the lane is out (queued in the pool or
 * running). A submit pushes its task under the lane mutex; if the lane was
 * not scheduled, it sets the flag and submits a runner, still under the
 * mutex, so that if the pool refuses the runner the task (necessarily the
 * only one in the ring, since an unscheduled lane is empty) is popped again
 * and the submit fails cleanly. A runner takes up to max_drain tasks from the
 * head into the lane's scratch array under the mutex, runs them with the
 * mutex released, then takes the mutex again: if the ring is empty it clears
 * `scheduled` (the next submit starts a new runner); otherwise it resubmits
 * itself, with the head's weight, before unlocking. Whoever sees the flag
 * set knows a runner will look at the ring after its push, because the
 * runner only clears the flag under the mutex after seeing the ring empty.
 * At most one runner per lane exists, so the lane's tasks run one at a time,
 * in ring (submit) order, and each runner's unlock happens-before the next
 * runner's lock: each task happens-before the next one.
 *
 * Runners are owned tasks (lifecycle.h, runner_owner): a worker takes one
 * alone, so that two lanes' runners never share a take (the second key
 * would wait behind the first), and one the pool cancels comes back to
 * tko__lanes_runner_cancelled.
 *
 * If the pool refuses the resubmission (it is shutting down, or a bounded
 * queue is full and this is its worker), the runner keeps draining on the
 * spot; the pool waits for running tasks, so the lane is finished before
 * shutdown returns. A runner is never submitted under a lane's mutex in a
 * way that lets the pool run it on the spot: the pool would run it through
 * its hooks, the host's code, with the mutex held (a hook's submit to the
 * lane then waited for its own thread). A full queue of a bounded pool
 * makes the first submit keep the runner token, accept its task, unlock,
 * and only then submit the runner (start_unlocked): TKO_FULL_BLOCK waits
 * for room there, and TKO_FULL_CALLER_RUNS runs the runner at once on that
 * thread; the runner sees the thread-local `starting` and runs the
 * lane's first visit there - one task, its own - inside the pool's run of
 * it, and the submitting thread, still owning the lane, then hands it on.
 * tko_lanes_submit_wait (lane_wait.c) starts its lane's runner on its own
 * thread the same way, for up to max_drain tasks (tko__lane_run_here). So
 * the mutex is never taken twice by one thread, and still at most one
 * thread drives a lane. The requeue after a visit never runs on the
 * caller (else the submitter would drain its lane for as long as others
 * append): a full queue makes that thread wait for room with the lane
 * unlocked (start_unlocked). A queued runner that the pool cancels is reported through
 * tko_lanes_pool_cancelled, or found by destroy once the pool is idle;
 * either way the one party that clears `scheduled` under the mutex hands
 * the ring's tasks to on_cancel.
 *
 * No thread waits for queue room while holding a lane's mutex: a runner
 * submitted under it uses a zero timeout. When a full TKO_FULL_BLOCK queue
 * refuses the first runner of a lane, the submitting thread keeps the runner
 * token (`scheduled` stays set), accepts its task, unlocks, and only then
 * waits for room (start_unlocked). Submits to that lane meanwhile append and
 * return; the runner, once out, finds their tasks. If the pool refuses even
 * then (shut down meanwhile), that thread drives the lane itself. A thread
 * that waits for room or drives a lane so holds the pool's gate
 * (enter_gate), so the pool's shutdown returns only after it is done.
 *
 * Lifetime: `runners` counts runners out across the table and is decremented
 * under idle_mu, as the runner's very last access to the table; destroy
 * waits for it to reach zero under idle_mu, so no runner touches freed
 * memory. Destroy never races with a call on the table (lanes.h), so the
 * token of a submit_wait that runs its idle lane is counted only if it
 * outlives the call (count_token). `pending` counts accepted tasks not yet
 * finished or cancelled; whoever brings it to zero broadcasts under
 * idle_mu (while still holding a runner reference or being the caller),
 * and wait_idle checks it under idle_mu, so no wake-up is lost.
 *
 * The pool's own keyed table (tko_submit_keyed; `keyed`, keyed_host.h)
 * differs in three ways: its tasks are the pool's - counted and given an id
 * when ring_push accepts them (kept in `meta`, beside the ring), run and
 * cancelled through the pool's hooks and counters; their room in a bounded
 * queue is taken before the lane is locked, so no wait for room happens
 * here; and its runners take no room and never run on the submitter, so a
 * runner's submit fails only at shutdown (or for want of memory), and the
 * thread holding the token then drives the lane itself. A caller-runs
 * submit runs only its own task (drive's first visit takes one) and only
 * if the lane was idle (ours is then the only task drive's first visit
 * finds); then it hands the lane to a runner.
 *
 * Lock order (ranked in witness.h): a lane's mu, then the pool's locks (a
 * runner's submit) or idle_mu. No lock is held while a task, the
 * batch callback or on_cancel runs. A runner is submitted under a lane's mu
 * only with a zero timeout (never a wait for room); the pool never calls back
 * into this file while holding its own locks. */

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

/* The lane tables whose task, batch or on_cancel this thread is running,
 * innermost first (for -EDEADLK): a task of one table may call
 * submit_wait on another, whose task then runs nested on this thread, and
 * a call on the outer table from there is still a call from its task. */
typedef struct lanes_frame {
  tko_lanes *l;
  struct lanes_frame *outer;
} lanes_frame;
static _Thread_local lanes_frame *current_frame;
/* The lane table this thread is destroying: it drives withdrawn lanes to
 * their end instead of requeueing their runners. */
static _Thread_local tko_lanes *destroying;

static int lane_runner(void *arg);

/* What the starting runner did here: nothing (the pool queued it), ran
 * its visits (the submitting thread still owns the token), or ran them and
 * gave the token back, the lane being empty (the submitting thread then
 * only returns the runner count). */
enum { START_QUEUED = 0, START_RAN, START_GAVE_BACK };

/* A start of ln's runner by the thread that owns its token, on that
 * thread's stack: a runner the pool runs at once on this very thread
 * (TKO_FULL_CALLER_RUNS, or submit_wait's tko__run_owned_here) finds it
 * (`starting`) and runs its visits here; the submitting thread, still
 * owning the token, then hands the lane on. */
typedef struct start {
  lane *ln;
  size_t most;        /* tasks run here in all: 1 for a caller-runs submit, max_drain for
                         submit_wait */
  tko_lane_task *own; /* submit_wait's task on an idle lane, run first and never queued;
                         NULL when the caller's task is in the ring */
  bool counted;       /* the token is counted in runners (see count_token) */
  int ran;            /* START_*: what the runner did here */
} start;
static _Thread_local start *starting;

/* A submit_wait that runs its idle lane holds the token uncounted: runners
 * keeps the table alive for destroy, which never races with a call on the
 * table (lanes.h), and a token given back within the call is never seen
 * by destroy. It is counted here once it may outlive the call: before it
 * is handed on, or before a visit's end that a task ending its thread cuts
 * short hands it on (visit_exited). Relaxed: as tko_lanes_submit's. */
static void count_token(tko_lanes *l, start *st) {
  if (st->counted) return;
  st->counted = true;
  tko__add_relaxed(&l->runners, 1);
}

/* Calls the pool with st->ln's runner, `starting` set: submits it (now
 * false) or runs it here at once (now true, tko__run_owned_here: this
 * thread is inside the gate). Sets st->ran; returns the pool's answer. */
static int call_starting(tko_lanes *l, start *st, int weight, long timeout_ms, bool may_run_here,
                         bool now) {
  start *saved = starting;
  starting = st;
  st->ran = START_QUEUED;
  int rc = now ? tko__run_owned_here(l->pool, &l->runner_owner, lane_runner, st->ln, weight)
               /* The keyed table's owner is internal: its runner never waits nor runs here. */
               : tko__submit_owned(l->pool, &l->runner_owner, lane_runner, st->ln, weight,
                                   timeout_ms, may_run_here);
  starting = saved;
  return rc;
}

/* Submits ln's runner; runner token owned. Returns 0 when the runner is out
 * in the pool (the token goes with it), START_RAN when the pool ran it on
 * this thread and the caller still owns the token, START_GAVE_BACK when it
 * ran here and gave the token back (the caller then owes
 * tko__lanes_runner_done), or a negative errno (the caller still owns the
 * token). Under ln->mu it must not wait for room
 * (timeout_ms 0: a full TKO_FULL_BLOCK queue is -ETIMEDOUT, or -EAGAIN on a
 * worker of the pool): a lane task or any other submit to this lane could
 * then be the one that has to take the lock to free room. Only a submit
 * that has released ln->mu waits (timeout_ms -1). With may_run_here false,
 * a full TKO_FULL_CALLER_RUNS queue is treated as a blocking one. */
int tko__lane_submit_runner(tko_lanes *l, lane *ln, int weight, long timeout_ms,
                            bool may_run_here) {
  start st = {.ln = ln, .most = 1, .own = NULL, .counted = true};
  int rc = call_starting(l, &st, weight, timeout_ms, may_run_here, false);
  if (rc) return rc;
  return st.ran;
}

/* A visit: the tasks a runner took from its lane's head into scratch (or
 * submit_wait's own task, from its caller's stack), run with no lock held. */
typedef struct visit {
  lanes_frame frame; /* its table, and the thread's frames around the visit */
  lane *ln;
  tko_lane_task *tasks; /* the lane's scratch, or the own task */
  lane_meta *metas;     /* beside them: the keyed table's scratch_meta */
  size_t n, next;       /* next: the task running, then n */
  uint64_t failed;
  uint64_t first; /* the ticket of the visit's first task */
  bool own;       /* the own task: never in the ring, so it has no ticket nor waiter */
} visit;

static void run_visit(visit *v) {
  tko_lanes *l = v->frame.l;
  lane *ln = v->ln;
  tko__witness_assert_none_held(); /* the host's code follows */
  current_frame = &v->frame;
  if (l->opts.batch) {
    tko_lane_batch b = {.lane = ln->index, .count = v->n, .tasks = v->tasks};
    v->next = v->n - 1; /* one call runs them all */
    l->opts.batch(l->opts.user, &b);
  } else if (l->keyed) { /* the pool runs them as its tasks: hooks, stats */
    for (v->next = 0; v->next < v->n; v->next++)
      if (tko__keyed_run(l->pool, &v->tasks[v->next], v->metas[v->next].id,
                         v->metas[v->next].enq_ns))
        v->failed++;
  } else {
    for (v->next = 0; v->next < v->n; v->next++)
      if (v->tasks[v->next].fn(v->tasks[v->next].arg)) v->failed++;
  }
  v->next = v->n;
  current_frame = v->frame.outer;
}

/* Under ln->mu: the lane's figures after n of a visit's tasks ran. */
static void count_visit(tko_lanes *l, lane *ln, size_t n, uint64_t failed) {
  if (!n) return;
  ln->visits++;
  ln->completed += n;
  ln->failed += failed;
  if (n > ln->max_batch) ln->max_batch = n;
  tko__lanes_pending_sub(l, n); /* lane mu, then idle_mu: the documented order */
}

static void start_unlocked(tko_lanes *l, lane *ln, int weight, bool may_run_here);
static bool hand_on(tko_lanes *l, lane *ln);
static void visit_exited(void *arg);

/* One visit: entered with ln->mu held by the owner of the runner token;
 * takes at most `most` tasks from the head, runs them with the lane
 * unlocked, and returns with the mutex held, the visit counted and its
 * waiters woken; returns how many it took. */
static size_t visit_once(tko_lanes *l, lane *ln, size_t most) {
  size_t n = ln->count < most ? ln->count : most;
  uint64_t first = ln->taken;
  for (size_t i = 0; i < n; i++)
    tko__lane_ring_pop(ln, &ln->scratch[i], ln->scratch_meta ? &ln->scratch_meta[i] : NULL);
  ln->taken += n;
  tko__mutex_unlock(&ln->mu);
  visit v = {.frame = {l, current_frame}, .ln = ln, .tasks = ln->scratch,
             .metas = ln->scratch_meta, .n = n, .first = first};
  if (n) {
    /* A cleanup attribute (lane_runner.c is built with -fexceptions): a few
     * stores a visit. */
    pthread_cleanup_push(visit_exited, &v);
    run_visit(&v);
    pthread_cleanup_pop(0);
  }
  tko__mutex_lock(&ln->mu);
  count_visit(l, ln, n, v.failed);
  tko__lane_waiters_ran(ln, first + n);
  return n;
}

/* submit_wait's own task on the lane it found idle, run as a visit of one
 * from the caller's stack with the lane unlocked (the caller owns the
 * token); returns with ln->mu held and the visit counted. Skipping the
 * ring saves a critical section and the waiter's wake-up on every call
 * (bench_combining's wait mode). */
static void visit_own(tko_lanes *l, lane *ln, tko_lane_task *own) {
  visit v = {.frame = {l, current_frame}, .ln = ln, .tasks = own, .n = 1, .own = true};
  pthread_cleanup_push(visit_exited, &v);
  run_visit(&v);
  pthread_cleanup_pop(0);
  tko__mutex_lock(&ln->mu);
  count_visit(l, ln, 1, v.failed);
}

/* After a visit, ln->mu held by the token's owner: hands the token on, or
 * drives the lane on here while it must (hand_on); returns with the mutex
 * released. */
static void hand_on_or_drive(tko_lanes *l, lane *ln) {
  while (!hand_on(l, ln)) visit_once(l, ln, l->opts.max_drain);
}

/* Drives the lane: entered with ln->mu held by the owner of the runner
 * token; returns with the mutex released and the token either passed to a
 * new runner in the pool or given back (scheduled cleared, tko__lanes_runner_done).
 * The first visit takes at most `first` tasks, later ones max_drain. */
static void drive_first(tko_lanes *l, lane *ln, size_t first) {
  visit_once(l, ln, first);
  hand_on_or_drive(l, ln);
}

void tko__lane_drive(tko_lanes *l, lane *ln) { drive_first(l, ln, l->opts.max_drain); }

/* Under ln->mu, owning the runner token of an empty lane: gives the token
 * back and unlocks; the runner count is still to return (the table is
 * still ours). */
static void give_back(tko_lanes *l, lane *ln) {
  ln->scheduled = false;
  if (!tko__lane_ring_oversized(l, ln)) {
    tko__mutex_unlock(&ln->mu);
    return;
  }
  ring_old old;
  tko__lane_ring_shrink(l, ln, &old);
  tko__mutex_unlock(&ln->mu);
  tko__lane_ring_free(l, &old); /* before tko__lanes_runner_done */
}

/* Under ln->mu, owning the runner token, after a visit: gives the token
 * back when the lane is empty, or passes it to a new runner, and returns
 * true with the mutex released; false, still holding it, when this thread
 * has to drive the lane on. */
static bool hand_on(tko_lanes *l, lane *ln) {
  if (ln->count == 0) {
    give_back(l, ln);
    tko__lanes_runner_done(l);
    return true;
  }
  /* More queued: give the worker back to the pool's ordering, ranked by
   * the new head. The new runner inherits this one's count in runners.
   * Never run here again: a caller-runs submitter runs one visit at most
   * (else it would drain its lane for as long as others append). */
  /* Destroy drives the lane to its end, and so does a runner of a closed
   * table, where it runs: nothing can append to the lane any more, and a
   * destroy waiting for its runners must not wait on a pool that may be
   * paused. close_table sets `closed`, then takes
   * every lane's mu: a requeue decided here before the flag was set is
   * queued before close returns, so destroy withdraws it. */
  if (destroying == l || tko__load_seq(&l->closed)) return false;
  int weight = ln->ring[ln->head].weight;
  int rc = tko__lane_submit_runner(l, ln, weight, 0, false);
  if (rc == 0) {
    tko__mutex_unlock(&ln->mu);
    return true;
  }
  if (rc == -ETIMEDOUT) {
    /* A full queue, on a thread that may wait for room (a caller-runs
     * submitter, not a worker): wait with the lane unlocked. */
    tko__mutex_unlock(&ln->mu);
    start_unlocked(l, ln, weight, false);
    return true;
  }
  /* The pool refused (shutting down, or full and this is its worker):
   * keep draining here, still owning the lane. */
  return false;
}

/* ---- a task that ends its thread --------------------------------------
 *
 * pthread_exit from a lane's task (or its batch callback) unwinds through
 * the visit running it. Its handler leaves the lane as a visit's end does,
 * so that the lane's later tasks still run and waits and destroy end:
 * the ended task counts as run and failed (the pool's own rule for a task
 * that ends its thread: taskorch.h), the visit's tasks it did not start go
 * back to the head of the ring in their order (on_cancel only when the
 * ring cannot grow to take them, or a cancel emptied the lane meanwhile),
 * and the token goes on to a new runner (hand_on). The ending thread runs no more tasks: unwinding, it cannot
 * take another exit, nor a helping wait's work. So where a visit's end
 * would drive the lane on this thread - its table closed, or the pool
 * refusing a runner (shutting down, or a full queue) - the lane's queued
 * tasks go to on_cancel instead (tko__lane_cancel; taskorch.h says so). Then
 * the pool's handler ends the runner, as it does any of its tasks that
 * ends its thread (worker.c: tko__task_exited); a keyed task first counts
 * itself in the pool (keyed.c). */

/* Hands a task taken from the ring to on_cancel; no lock held. */
void tko__lane_cancel_task(tko_lanes *l, const tko_lane_task *t, const lane_meta *m) {
  tko__witness_assert_none_held(); /* the host's on_cancel follows */
  if (l->keyed) { /* the pool's on_cancel, with the task's id */
    tko__keyed_cancel(l->pool, t, m->id, m->enq_ns);
  } else if (l->opts.on_cancel) {
    /* As in a batch: waiting on or destroying these lanes from on_cancel
     * would wait for this very call, so it is -EDEADLK. */
    lanes_frame frame = {l, current_frame};
    current_frame = &frame;
    l->opts.on_cancel(l->opts.user, t);
    current_frame = frame.outer;
  }
}

/* Hands every task queued on ln to on_cancel. The whole ring is detached
 * under the mutex at once (the lane starts a new one at its next push,
 * tko__lane_ring_grow), then its tasks go to on_cancel in order with the lane
 * unlocked. So a runner in the middle of a visit finds the lane empty when
 * it looks again and takes nothing more: per key, the tasks that ran are a
 * prefix and the cancelled ones the rest, never a task run after an
 * earlier one was cancelled. If `unschedule`, the lane's runner was dropped
 * by the pool and this caller owns its runner count: it clears the flag
 * and returns the count. Returns whether it did. */
bool tko__lane_cancel(tko_lanes *l, lane *ln, bool unschedule) {
  tko__mutex_lock(&ln->mu);
  bool owned = unschedule && ln->scheduled;
  if (owned) ln->scheduled = false;
  size_t n = ln->count, head = ln->head, cap = ln->cap;
  ring_old gone = {NULL, NULL};
  if (n) {
    gone = (ring_old){ln->ring, ln->meta};
    ln->ring = NULL;
    ln->meta = NULL;
    ln->cap = ln->head = ln->count = 0;
    ln->cancelled += n;
  }
  /* The detached tasks' tickets: their waiters wake once on_cancel saw them. */
  lane_waiter *waiters = tko__lane_waiters_take(ln, ln->taken, ln->taken + n);
  ln->taken += n;
  tko__mutex_unlock(&ln->mu);
  for (size_t i = 0, at = head; i < n; i++, at = at + 1 == cap ? 0 : at + 1)
    tko__lane_cancel_task(l, &gone.ring[at], gone.meta ? &gone.meta[at] : NULL);
  tko__lane_ring_free(l, &gone);
  tko__lane_waiters_end(waiters, LANE_CANCELLED);
  tko__lanes_pending_sub(l, n);
  if (owned) tko__lanes_runner_done(l);
  return owned;
}

static void visit_exited(void *arg) {
  visit *v = arg;
  tko_lanes *l = v->frame.l;
  lane *ln = v->ln;
  current_frame = v->frame.outer;
  size_t ran = v->next + 1, back = v->n - ran;
  tko__mutex_lock(&ln->mu);
  start *st = starting;
  if (st && st->ln == ln) count_token(l, st); /* the hand-on below needs it counted */
  /* A cancel that emptied the lane meanwhile moved taken on: the tasks
   * cannot go back in front of later tickets, so they go to on_cancel, as
   * the cancel would have sent them. (An own visit has nothing to put
   * back.) */
  bool cancelled = !v->own && ln->taken != v->first + v->n;
  while (!cancelled && ln->cap - ln->count < back && tko__lane_ring_grow(l, ln) == 0) {
  }
  bool room = !cancelled && ln->cap - ln->count >= back;
  if (room) {
    for (size_t i = v->n; i-- > ran;) tko__lane_ring_unpop(ln, i);
    ln->taken -= back;
  }
  count_visit(l, ln, ran, v->failed + 1);
  if (!v->own) tko__lane_waiters_ran(ln, v->first + ran);
  if (!room) { /* out of memory, or cancelled: the visit's scratch is still this thread's */
    lane_waiter *waiters = tko__lane_waiters_take(ln, v->first + ran, v->first + v->n);
    tko__mutex_unlock(&ln->mu);
    for (size_t i = ran; i < v->n; i++)
      tko__lane_cancel_task(l, &v->tasks[i], v->metas ? &v->metas[i] : NULL);
    tko__lane_waiters_end(waiters, LANE_CANCELLED);
    tko__mutex_lock(&ln->mu);
    ln->cancelled += back;
    tko__lanes_pending_sub(l, back);
  }
  while (!hand_on(l, ln)) { /* tasks appended meanwhile: hand_on again */
    tko__mutex_unlock(&ln->mu);
    tko__lane_cancel(l, ln, false);
    tko__mutex_lock(&ln->mu);
  }
}

static int lane_runner(void *arg) {
  lane *ln = arg;
  start *st = starting;
  if (st && st->ln == ln) {
    /* Run at once by the pool on the submitting thread, which owns the
     * token with the lane unlocked (start_unlocked, tko__lane_run_here):
     * its visits - at most st->most tasks, the submitter's own first
     * (the lane was idle), then what others appended meanwhile - run
     * here, inside the pool's run of the runner, so the pool counts them
     * running; the submitter hands on. An empty lane is given back here,
     * in the critical section that counted the last visit (one lock of
     * ln->mu fewer for each submit_wait on an idle lane; bench_combining's
     * wait mode), and the submitter only returns the runner count, if it
     * counted one (count_token). */
    st->ran = START_RAN;
    size_t most = st->most;
    if (st->own) {
      visit_own(ln->owner, ln, st->own);
      most--;
    } else {
      tko__mutex_lock(&ln->mu);
    }
    while (most && ln->count) most -= visit_once(ln->owner, ln, most);
    if (ln->count == 0) {
      give_back(ln->owner, ln);
      st->ran = START_GAVE_BACK;
      return 0;
    }
    count_token(ln->owner, st); /* the submitter hands the lane on */
    tko__mutex_unlock(&ln->mu);
    return 0;
  }
  tko__mutex_lock(&ln->mu);
  tko__lane_drive(ln->owner, ln);
  return 0;
}

/* After a start that did not put the runner out in the pool, the token
 * still this thread's: what the starting runner did here (st->ran;
 * START_QUEUED: it did not run, the pool refused or is closed) decides
 * what is left - the runner count to return, the lane to hand on, or the
 * lane to drive here, own task first. */
static void finish_start(tko_lanes *l, start *st) {
  lane *ln = st->ln;
  if (st->ran == START_GAVE_BACK) {
    if (st->counted) tko__lanes_runner_done(l);
    return;
  }
  if (st->ran == START_RAN) {
    tko__mutex_lock(&ln->mu);
    hand_on_or_drive(l, ln);
  } else if (st->own) {
    count_token(l, st); /* before the visit: no `starting` tells visit_exited */
    visit_own(l, ln, st->own);
    hand_on_or_drive(l, ln);
  } else {
    tko__mutex_lock(&ln->mu);
    drive_first(l, ln, l->opts.max_drain);
  }
}

/* Starts ln's runner with the lane unlocked, waiting for room; the caller
 * owns the runner token and its task is accepted. With may_run_here, a
 * full TKO_FULL_CALLER_RUNS queue makes the pool run the runner here at
 * once, through its hooks - host code, so the lane must be unlocked - and
 * the runner runs the lane's first visit there: one task, its own (the
 * lane was idle when it was accepted, and nothing takes from a lane whose
 * token this thread holds but a cancel), never what others appended
 * meanwhile, which this thread then hands to a runner in the pool. If the
 * pool refuses (shut down meanwhile), this thread drives the lane itself,
 * as a runner whose requeue was refused does, so the accepted tasks still
 * run. */
static void start_unlocked(tko_lanes *l, lane *ln, int weight, bool may_run_here) {
  start st = {.ln = ln, .most = 1, .own = NULL, .counted = true};
  int rc = call_starting(l, &st, weight, -1, may_run_here, false);
  if (rc == 0 && st.ran == START_QUEUED) return; /* out in the pool */
  finish_start(l, &st);
}

/* tko_lanes_submit_wait's start (lane_wait.c), owning the runner token of
 * the idle lane it took `own` to, with the lane unlocked: inside the gate,
 * the pool runs the runner here at once, as a caller-runs task, and the
 * runner runs `own`, then visits of what others appended meanwhile, at
 * most `most` tasks in all (lane_runner); then this thread hands the lane
 * on. Outside it (the pool closed before the gate could be entered) this
 * thread runs `own` and drives the lane itself, as start_unlocked does
 * when the pool refuses. */
void tko__lane_run_here(tko_lanes *l, lane *ln, tko_lane_task *own, size_t most, bool gated) {
  start st = {.ln = ln, .most = most, .own = own, .counted = false, .ran = START_QUEUED};
  if (gated) (void)call_starting(l, &st, own->weight, -1, true, true);
  finish_start(l, &st);
}

/* A submit that will drive its lane, or wait for room for its runner, on
 * its own thread enters the pool's gate (lifecycle.h) first, so that the
 * pool's shutdown waits for it to leave: it never returns while this thread
 * still runs tasks of the lane (a coalescer's thread blocked in a lane
 * submit on a full queue, say; tests lane_tables/shutdown_waits_for_*).
 * Called under ln->mu after tko__lane_ring_push accepted a task: the table
 * was open, so close_table, which the pool's shutdown runs before it closes
 * the gate, has yet to take this mutex, and the entry succeeds. Returns
 * whether it did (a caller then leaves). */
static bool enter_gate(tko_lanes *l) { return tko__gate_enter(l->pool) == 0; }

int tko_lanes_submit(tko_lanes *l, uint64_t key, tko_task_fn fn, void *arg, int weight) {
  int bad = tko__lanes_check(l);
  if (bad) return bad;
  if (!fn && !l->opts.batch) return -EINVAL;
  lane *ln = lane_at(l, (unsigned)(tko__mix64(key) & l->mask));
  tko__mutex_lock(&ln->mu);
  int rc = tko__lane_ring_push(l, ln, key, fn, arg, weight);
  if (rc) {
    tko__mutex_unlock(&ln->mu);
    return rc;
  }
  if (!ln->scheduled) {
    /* Relaxed: destroy reads runners only after close_table has taken this
     * lane's mutex, and the decrement comes after a later lock of ln->mu. */
    tko__add_relaxed(&l->runners, 1);
    ln->scheduled = true;
    /* Under the lock the pool must never run the runner here: it would run
     * it through its hooks, the host's code, with ln->mu held. */
    int started = tko__lane_submit_runner(l, ln, weight, 0, false);
    if (started == -ETIMEDOUT || (started == -EAGAIN && tko__pool_caller_runs(l->pool))) {
      /* A full queue that this thread waits for (TKO_FULL_BLOCK) or runs
       * the lane on (TKO_FULL_CALLER_RUNS; on a worker of the pool, where
       * a wait would be -EAGAIN): accept the task and go on with the lane
       * unlocked. Others append behind it meanwhile (they see
       * `scheduled`); the runner, once out, finds them all. */
      tko__add_relaxed(&l->pending, 1); /* relaxed: see below */
      ln->submitted++;
      bool gated = enter_gate(l);
      tko__mutex_unlock(&ln->mu);
      start_unlocked(l, ln, weight, true);
      if (gated) tko__gate_leave(l->pool);
      return 0;
    }
    if (started < 0) {
      /* The lane was unscheduled, hence empty, and we held its mutex
       * throughout: ours is the only task, and no one has seen it. */
      ln->count--;
      ln->scheduled = false;
      tko__sub_relaxed(&l->runners, 1);
      tko__mutex_unlock(&ln->mu);
      return started;
    }
  }
  /* Relaxed: every decrement of this unit comes after a lock of ln->mu that
   * follows this point; zero is only acted on under idle_mu. */
  tko__add_relaxed(&l->pending, 1);
  ln->submitted++;
  tko__mutex_unlock(&ln->mu);
  return 0;
}

/* A runner the pool cancelled (its owner's callback, lifecycle.h). */
void tko__lanes_runner_cancelled(tko__task_owner *owner, void *arg) {
  (void)owner;
  lane *ln = arg;
  tko__lane_cancel(ln->owner, ln, true);
}

int tko_lanes_pool_cancelled(const tko_task_info *task) {
  if (!task || task->fn != lane_runner || !task->arg) return 0;
  lane *ln = task->arg;
  if (tko__lanes_check(ln->owner)) return 0;
  tko__lane_cancel(ln->owner, ln, true);
  return 1;
}

/* True when the calling thread runs a task of the pool (the pool's own
 * wait_idle says so with -EDEADLK) or a batch of these lanes. */
bool tko__lanes_in_own_task(tko_lanes *l) {
  return tko__lanes_in_batch(l) || tko_pool_wait_idle(l->pool, 0) == -EDEADLK;
}

bool tko__lanes_in_batch(tko_lanes *l) {
  for (const lanes_frame *f = current_frame; f; f = f->outer)
    if (f->l == l) return true;
  return false;
}

/* Takes this table's queued runners back from the pool and drives their
 * lanes to the end on this thread (each withdrawn runner's token is ours).
 * Returns whether it found any. */
bool tko__lanes_drive_withdrawn(tko_lanes *l) {
  void *args[32];
  size_t n, total = 0;
  tko_lanes *saved = destroying;
  destroying = l;
  while ((n = tko__withdraw_owned(l->pool, &l->runner_owner, args, 32))) {
    for (size_t i = 0; i < n; i++) {
      lane *ln = args[i];
      tko__mutex_lock(&ln->mu);
      tko__lane_drive(l, ln);
    }
    total += n;
  }
  destroying = saved;
  return total;
}
