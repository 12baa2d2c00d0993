/* SPDX-License-Identifier: MIT */
/* The pool's lifecycle: states, the gate, attachments, phases and shutdown
 * (the model is explained in lifecycle.h).
 *
 * Why shutdown cannot free a pool that someone still uses: every thread
 * that touches the pool from outside its workers while it may block (a
 * submitter waiting for room, a caller-runs task) entered the gate while
 * the pool was not yet closed, and leaves it after its last touch; every
 * worker thread is counted in `threads` from before its creation to its
 * last touch. Shutdown moves the state to DRAINING or CANCELLING under
 * gate_mu and closes the gate, wakes whoever waits, and reports STOPPED
 * only after both counts were seen at zero under gate_mu and every thread
 * was joined.
 *
 * The gate takes no lock while the pool is open, so a thread stopped in
 * its entry or leave holds up no one (tests/stress/test_stalled_admission.c
 * enters it from parked submitters). One word holds the count, in steps of
 * GATE_ONE, and GATE_CLOSED. An entry is a CAS that fails once the bit is
 * set; a leave before the close is a CAS too, and after it nothing touches
 * the pool. The close sets the bit with an RMW on the same word, under
 * gate_mu, so every entry and leave is ordered before or after it in the
 * word's modification order: an entry either counted before the close, and
 * finish() waits for its leave, or saw the bit and was refused. A leave
 * that sees the bit decrements under gate_mu and broadcasts if it was the
 * last, and finish() reads the count under gate_mu before it sleeps, so no
 * wake-up is lost; that leaver's unlock of gate_mu is its last touch, which
 * POSIX allows to race with the destroy of a mutex it no longer holds.
 *
 * Why no shutdown blocks forever: every wait here (for the shutter role,
 * the attachments, the gate, the workers, a phase's close) is on a
 * condition variable with the caller's deadline; a timed-out call leaves the
 * pool in its current state, and the next call continues from there.
 *
 * Why a phase registered during a shutdown cannot be missed: a
 * registration, and the pass that runs the phases, read and write the
 * phase slots and phase_next under gate_mu. The pass moves phase_next past
 * a number only in a critical section that found its slot empty, or after
 * the slot's close returned 0. A registration therefore either comes
 * first, and the pass reaches it in turn, or finds phase_next past its
 * number and is refused (-ESHUTDOWN); the feature then refuses its work
 * and holds nothing a close would have to resolve. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <time.h>

#include "engine.h"
#include "invariant.h"
#include "seam.h"
#include "wake.h"

/* The pool whose shutdown the calling thread is in: from taking the
 * shutter role (role) and from closing the pool (closing_pool). The
 * attachments' close callbacks run between the two and must not look like
 * calls from inside the pool (lanes ask tko_pool_wait_idle whether it is
 * -EDEADLK). */
static _Thread_local const tko_pool *role, *closing_pool;

bool tko__in_shutdown(const tko_pool *pool) { return closing_pool == pool; }

/* The pool whose gate this thread entered first, and how many entries it
 * holds (of any pool): a thread inside a pool's gate must not wait for the
 * gate to empty, so shutdown and destroy are -EDEADLK there (a lane task
 * that a lane submit runs on its own thread, lane_runner.c). */
static _Thread_local const tko_pool *gated_pool;
static _Thread_local unsigned gated_depth;

static bool gate_held(const tko_pool *pool) { return gated_pool == pool; }

static int get_state(tko_pool *pool) {
  /* Relaxed: every decision on the state is taken under gate_mu; lock-free
   * readers (stats) only report it. */
  return tko__load_relaxed(&pool->state);
}

enum { GATE_CLOSED = 1u, GATE_ONE = 2u };

/* Caller holds gate_mu. */
static void set_state(tko_pool *pool, int state) {
  TKO__INVARIANT(state >= get_state(pool)); /* each state is reached once, in order */
  tko__store_relaxed(&pool->state, state);
  /* Seq_cst RMW: orders the close against every entry's and leave's CAS in
   * the gate word's modification order (see above). */
  if (state >= TKO__DRAINING) tko__or_seq(&pool->gate, GATE_CLOSED);
}

/* Waits on gate_cv until done(pool) or the deadline (NULL = none); caller
 * holds gate_mu. */
static int gate_wait(tko_pool *pool, bool (*done)(void *pool), const struct timespec *deadline) {
  return tko__cond_wait_until(&pool->gate_cv, &pool->gate_mu, deadline, done, pool);
}

/* The seam (seam.h): tests/unit/test_close.c parks a caller-run here,
 * after its look at the state, while the pool closes. */
#ifdef TKO_TEST_SEAMS
void (*_Atomic tko__test_gate_window)(tko_pool *pool);
#endif

int tko__gate_enter(tko_pool *pool) {
  void (*seam)(tko_pool *) = TKO__SEAM(tko__test_gate_window);
  if (seam) seam(pool);
  /* Relaxed: the CAS re-reads the word. */
  unsigned v = tko__load_relaxed(&pool->gate);
  do {
    if (v & GATE_CLOSED) {
      /* Acquire: the close's OR came after the state (engine.h:
       * tko__pool_refusing), which this thread's later submits then see. */
      (void)tko__load_acquire(&pool->gate);
      return -ESHUTDOWN;
    }
    /* Acq_rel: the entry's place before the close (see above); acquire
     * pairs with the release of earlier leaves, as gate_mu's lock did. */
  } while (!tko__cas_acq_rel(&pool->gate, &v, v + GATE_ONE));
  if (gated_depth++ == 0) gated_pool = pool;
  return 0;
}

void tko__gate_leave(tko_pool *pool) {
  TKO__INVARIANT(gated_depth > 0); /* every leave pairs with an enter */
  if (--gated_depth == 0) gated_pool = NULL;
  unsigned v = tko__load_relaxed(&pool->gate); /* the CAS re-reads it */
  while (!(v & GATE_CLOSED)) {
    TKO__INVARIANT(v >= GATE_ONE);
    /* Release: this thread's touches of the pool happen-before quiet()'s
     * acquire load; after the CAS it touches nothing. */
    if (tko__cas_acq_rel(&pool->gate, &v, v - GATE_ONE)) return;
  }
  tko__mutex_lock(&pool->gate_mu);
  /* Seq_cst (release for quiet()'s acquire); under gate_mu, where finish()
   * reads the count before it sleeps. */
  unsigned before = tko__sub_seq(&pool->gate, GATE_ONE);
  TKO__INVARIANT(before >= GATE_ONE + GATE_CLOSED);
  if (before == GATE_ONE + GATE_CLOSED) pthread_cond_broadcast(&pool->gate_cv);
  tko__mutex_unlock(&pool->gate_mu);
}

void tko__thread_enter(tko_pool *pool) {
  tko__mutex_lock(&pool->gate_mu);
  pool->threads++;
  tko__mutex_unlock(&pool->gate_mu);
}

void tko__thread_exit(tko_pool *pool) {
  tko__mutex_lock(&pool->gate_mu);
  TKO__INVARIANT(pool->threads > 0);
  if (--pool->threads == 0) pthread_cond_broadcast(&pool->gate_cv);
  tko__mutex_unlock(&pool->gate_mu);
}

int tko__attach(tko_pool *pool, tko__attachment *a) {
  int rc = tko__pool_check(pool);
  if (rc) return rc;
  if (!a || !a->close) return -EINVAL;
  tko__mutex_lock(&pool->gate_mu);
  rc = get_state(pool) == TKO__RUNNING ? 0 : -ESHUTDOWN;
  if (rc == 0) {
    a->resolved = false;
    a->prev = NULL;
    a->next = pool->attached;
    if (a->next) a->next->prev = a;
    pool->attached = a;
  }
  tko__mutex_unlock(&pool->gate_mu);
  return rc;
}

static bool not_resolving(void *pool) { return ((tko_pool *)pool)->resolving == NULL; }

void tko__detach(tko_pool *pool, tko__attachment *a) {
  tko__mutex_lock(&pool->gate_mu);
  /* A shutdown may be calling a's close right now: wait for it to return
   * before the owner frees a. */
  while (pool->resolving == a) gate_wait(pool, not_resolving, NULL);
  if (a->prev) a->prev->next = a->next;
  else pool->attached = a->next;
  if (a->next) a->next->prev = a->prev;
  a->prev = a->next = NULL;
  tko__mutex_unlock(&pool->gate_mu);
}

static bool role_free(void *pool) { return !((tko_pool *)pool)->shutter; }

/* The shutter role: one thread at a time advances a shutdown; the others
 * wait for it within their own deadline. */
static int take_role(tko_pool *pool, const struct timespec *deadline) {
  tko__mutex_lock(&pool->gate_mu);
  int rc = gate_wait(pool, role_free, deadline);
  if (rc == 0) pool->shutter = true;
  tko__mutex_unlock(&pool->gate_mu);
  if (rc == 0) role = pool;
  return rc;
}

static void give_role(tko_pool *pool) {
  role = closing_pool = NULL;
  tko__mutex_lock(&pool->gate_mu);
  pool->shutter = false;
  pthread_cond_broadcast(&pool->gate_cv);
  tko__mutex_unlock(&pool->gate_mu);
}

/* Milliseconds left until deadline (NULL: -1, no limit). A deadline too
 * far off for a long of milliseconds (a timeout near LONG_MAX) is none. */
static long ms_left(const struct timespec *deadline) {
  if (!deadline) return -1;
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  long sec = (long)(deadline->tv_sec - now.tv_sec);
  if (sec >= LONG_MAX / 1000 - 1) return -1;
  long ms = sec * 1000 + (deadline->tv_nsec - now.tv_nsec) / 1000000;
  return ms > 0 ? ms : 0;
}

/* Calls close on every unresolved attachment, the newest first (the pool's
 * keyed table is one: the engine names none of them), with gate_mu
 * released around each call; pool->resolving marks the one whose close
 * runs, so that its detach waits for it. A close that fails (its time ran
 * out) ends the loop unresolved, for a later shutdown call to retry, and
 * its error is returned. With nowait each gets 0 ms, once, and counts as
 * resolved whatever it returns. */
static int resolve_attachments(tko_pool *pool, tko_shutdown_mode mode,
                               const struct timespec *deadline, bool nowait) {
  int rc = 0;
  tko__mutex_lock(&pool->gate_mu);
  for (;;) {
    tko__attachment *a = pool->attached;
    while (a && a->resolved) a = a->next;
    if (!a) break;
    pool->resolving = a;
    tko__mutex_unlock(&pool->gate_mu);
    tko__witness_assert_none_held(); /* an attachment's close may call the host's */
    rc = a->close(a, mode, nowait ? 0 : ms_left(deadline));
    tko__mutex_lock(&pool->gate_mu);
    pool->resolving = NULL;
    pthread_cond_broadcast(&pool->gate_cv); /* a detach may wait for it */
    if (rc && !nowait) break;
    a->resolved = true;
    rc = 0;
  }
  tko__mutex_unlock(&pool->gate_mu);
  return rc;
}

/* Takes the queued tasks out a few at a time, outside the lock for the
 * hooks, and cancels or runs them on this thread. */
void tko__empty_queue(tko_pool *pool, bool run) {
  tko__item batch[TKO__GRAB_MAX];
  for (;;) {
    size_t n = 0;
    for (unsigned s = 0; s < pool->nshards && n == 0; s++) {
      tko__shard *sh = &pool->shards[s];
      tko__lock_acquire(&sh->lock);
      tko__shard_drain_locked(pool, sh);
      n = tko__queue_pop(&sh->queue, batch, TKO__GRAB_MAX);
      /* Held tasks started here count as in flight without asking their
       * source: with every worker gone, shutdown starts what is left. */
      if (n == 0 && s == 0) {
        n = tko__queue_pop(&pool->held, batch, TKO__GRAB_MAX);
        if (run) pool->held_running += (unsigned)n; /* each start counts */
        tko__store_relaxed(&pool->held_inflight, pool->held_running); /* under lock */
      }
      tko__refresh_backlog(pool, sh);
      tko__unlock(&sh->lock);
    }
    for (size_t i = 0; i < n; i++) tko__release_room(pool, tko__item_room(&batch[i]));
    if (!n) return;
    for (size_t i = 0; i < n; i++) {
      if (run) {
        tko__add_relaxed(&pool->off_worker_runs, 1); /* relaxed: a statistic only */
        tko__run_item(pool, &pool->caller, &batch[i]);
      } else {
        tko__cancel_item(pool, &batch[i]);
      }
    }
  }
}

/* The seam (seam.h): tests/unit/test_close.c parks the closer between the
 * state's change and the rest of the close. */
#ifdef TKO_TEST_SEAMS
void (*_Atomic tko__test_close_window)(tko_pool *pool);
#endif

static void close_state(tko_pool *pool, int state) {
  tko__mutex_lock(&pool->gate_mu);
  set_state(pool, state);
  tko__mutex_unlock(&pool->gate_mu);
}

/* CLOSING -> DRAINING or CANCELLING: submits and the gate are refused from
 * here on, and everyone who waits is woken. */
static void close_pool(tko_pool *pool, tko_shutdown_mode mode) {
  bool cancel = mode == TKO_CANCEL;
  tko__shard *first = &pool->shards[0];
  /* A paused pool drains or cancels too. A DRAIN resumes it before the
   * state closes the pool, so that a pause by a thread that saw the close
   * (a submit's -ESHUTDOWN, engine.h: tko__pool_refusing) comes after this
   * one and holds the drain (test
   * resume_helpers/a_resume_in_a_drain_wakes_a_paused_group_wait). A CANCEL
   * changes the state first, then resumes. The state is the cancel's one
   * mark for workers: one that cancels what it took (tko__run_or_cancel,
   * run.c) looks at it, so a thread that saw a submit's -ESHUTDOWN and then
   * let a worker go sees no queued task start, and an on_cancel that
   * submits is refused (tests hooks/on_cancel_and_thread_stop_submits_are_refused_during_shutdown
   * and close/a_task_taken_once_a_cancels_state_changed_is_cancelled_and_submits_nothing);
   * a take that sees the pool resumed (its seq_cst load of paused,
   * take.c: drain_for_take) sees the state too, and cancels what it took
   * (test bounded/refused_after_shutdown_whatever_the_policy); a pause
   * after a CANCEL's state holds nothing, since nothing queued will start.
   * No queue lock before the state: a worker may hold one through drain
   * after drain while submitters keep its rings full, and only the state
   * stops them (test close/the_state_changes_while_a_worker_holds_the_queue_lock). */
  if (cancel) close_state(pool, TKO__CANCELLING);
  tko__store_seq(&pool->paused, false);
  if (!cancel) close_state(pool, TKO__DRAINING);
  void (*seam)(tko_pool *) = TKO__SEAM(tko__test_close_window);
  if (seam) seam(pool);
  tko__lock_acquire(&first->lock);
  tko__inbox_close(&pool->inbox);
  tko__rings_close_claims(&pool->rings);
  tko__unlock(&first->lock);
  /* Each shard's rings under its lock (ring.h), then closing: a worker
   * that sees it closed finds every ring closed too. */
  for (unsigned i = 0; i < pool->nshards; i++) {
    tko__lock_acquire(&pool->shards[i].lock);
    tko__rings_close_shard(&pool->rings, i);
    tko__unlock(&pool->shards[i].lock);
  }
  tko__lock_acquire(&first->lock);
  /* seq_cst: worker_sleep re-checks closing after announcing its sleep. */
  tko__store_seq(&pool->closing, true);
  tko__unlock(&first->lock);
  tko__admit_close(pool); /* blocked submitters see closing */
  /* The timer thread, if blocked submitting to a full queue, is woken by
   * closing too; timers close last, in their phase (finish). */
  if (cancel) tko__empty_queue(pool, false);
  tko__idle_wake_all(&pool->idle);
}

/* A DRAIN that timed out, continued as a CANCEL: what is still queued goes
 * to on_cancel, and tasks workers had taken are cancelled, not started. */
static void escalate(tko_pool *pool) {
  close_state(pool, TKO__CANCELLING);
  tko__empty_queue(pool, false);
  tko__idle_wake_all(&pool->idle);
}

int tko__phase_add(tko_pool *pool, const tko__phase *phase) {
  TKO__INVARIANT(phase->number < TKO__PHASE_COUNT);
  _Atomic(const tko__phase *) *slot = &pool->phases[phase->number];
  /* Relaxed: only "already registered" is read here; a slot goes from NULL
   * to its record once, under gate_mu, where the pass reads it. */
  if (tko__load_relaxed(slot) == phase) return 0;
  int rc = 0;
  tko__mutex_lock(&pool->gate_mu);
  if (tko__load_relaxed(slot) != phase) {
    TKO__INVARIANT(tko__load_relaxed(slot) == NULL); /* one phase per number */
    if (phase->number < pool->phase_next) rc = -ESHUTDOWN; /* the pass went past it */
    else tko__store_relaxed(slot, phase);
  }
  tko__mutex_unlock(&pool->gate_mu);
  return rc;
}

/* The owner kinds: an owned task runs as the host's task (no start, and
 * nothing to tell once done), and its cancel goes to its owner alone. */
static void owner_done(const tko__item *item, int status) {
  (void)item;
  (void)status;
}

static void owner_cancelled(const tko__item *item) {
  tko__task_owner *owner = (tko__task_owner *)(item->ctx & ~TKO__CTX_TAGS);
  owner->cancelled(owner, item->arg);
}

static const tko__task_kind owner_kind = {
    .done = owner_done, .cancelled = owner_cancelled, .own_cancel = true};
static const tko__task_kind internal_owner_kind = {
    .done = owner_done, .cancelled = owner_cancelled, .own_cancel = true, .internal = true};

void tko__owner_init(tko__task_owner *owner, void (*cancelled)(tko__task_owner *owner, void *arg),
                     bool internal) {
  *owner = (tko__task_owner){.kind = internal ? &internal_owner_kind : &owner_kind,
                             .cancelled = cancelled};
}

/* The held source (kind.h): here beside the phases, its other registration,
 * and out of shard.c, so that the shard drain keeps tko__refresh_backlog
 * inline. */
void tko__source_add(tko_pool *pool, const tko__source *src) {
  /* Acquire: a submitter that finds src here queues its task after the
   * store, so a worker that takes the task reads src. */
  if (tko__load_acquire(&pool->held_source) == src) return;
  tko__shard *first = &pool->shards[0]; /* the held queue's */
  tko__lock_acquire(&first->lock);
  TKO__INVARIANT(tko__load_relaxed(&pool->held_source) == NULL ||
                 tko__load_relaxed(&pool->held_source) == src); /* one source per pool */
  tko__store_release(&pool->held_source, src);
  tko__unlock(&first->lock);
}

bool tko__held_may_start(const tko_pool *pool) {
  const tko__source *src = tko__load_relaxed(&pool->held_source); /* under the lock */
  return src->may_start(pool, pool->held_running);
}

const tko__queue *tko__held_refresh(tko_pool *pool) {
  size_t waiting = pool->held.len > 0;
  /* Seq_cst, under the lock: pairs with tko__nothing_left's seq_cst load,
   * by which a closing worker decides to exit (a relaxed store is outside
   * the single order that load reads from). Stored only on a change. */
  if (tko__load_relaxed(&pool->held_waiting) != waiting)
    tko__store_seq(&pool->held_waiting, waiting);
  return waiting && tko__held_may_start(pool) ? &pool->held : NULL;
}

void tko__held_release(tko_pool *pool) {
  tko__shard *first = &pool->shards[0]; /* the held queue's */
  tko__lock_acquire(&first->lock);
  TKO__INVARIANT(pool->held_running > 0);
  pool->held_running--;
  /* seq_cst: the completer's half of the Dekker pair with async_quiesce
   * (async.c), stored before the finish's tko__notify_idle loads
   * idle_waiters; the quiescer adds itself there before it loads this. */
  tko__store_seq(&pool->held_inflight, pool->held_running); /* under lock */
  tko__refresh_backlog(pool, first);
  tko__unlock(&first->lock);
  if (tko__runnable_seq(pool)) tko__signal_work(pool);
  /* Closing: sleeping workers may now have nothing left and can exit. */
  if (tko__load_seq(&pool->closing) && tko__nothing_left(pool)) tko__idle_wake_all(&pool->idle);
}

/* Calls each registered phase's close in number order, from the first
 * whose close has not yet returned 0, with gate_mu released around each
 * call; a close that times out ends the pass, for the next shutdown call
 * to continue from it. */
static int close_phases(tko_pool *pool, const struct timespec *deadline) {
  int rc = 0;
  tko__mutex_lock(&pool->gate_mu);
  while (pool->phase_next < TKO__PHASE_COUNT) {
    const tko__phase *p = tko__load_relaxed(&pool->phases[pool->phase_next]); /* under gate_mu */
    if (p && p->close) {
      tko__mutex_unlock(&pool->gate_mu);
      tko__witness_assert_none_held(); /* a close may call the host's on_cancel */
      rc = p->close(pool, deadline);
      tko__mutex_lock(&pool->gate_mu);
      if (rc) break;
    }
    pool->phase_next++;
  }
  tko__mutex_unlock(&pool->gate_mu);
  return rc;
}

/* A CANCEL's step, once the pool refuses submits: each registered phase's
 * cancel, in number order. Relaxed: a phase's record is static, and its
 * slot goes from NULL to it once (tko__phase_add). */
static void cancel_phases(tko_pool *pool) {
  tko__witness_assert_none_held(); /* a cancel calls the host's on_cancel */
  for (unsigned i = 0; i < TKO__PHASE_COUNT; i++) {
    const tko__phase *p = tko__load_relaxed(&pool->phases[i]);
    if (p && p->cancel) p->cancel(pool);
  }
}

void tko__phases_fini(tko_pool *pool) {
  /* No lock: the pool is stopped, every registration since refused
   * (phase_next is past the last number), and a fini may take gate_mu (the
   * keyed table's detach). */
  for (unsigned i = 0; i < TKO__PHASE_COUNT; i++) {
    const tko__phase *p = tko__load_relaxed(&pool->phases[i]);
    if (p && p->fini) p->fini(pool);
  }
}

static bool quiet(void *p) {
  tko_pool *pool = p;
  /* Acquire: pairs with the leaves' release. */
  return tko__load_acquire(&pool->gate) < GATE_ONE && pool->threads == 0;
}

/* DRAINING or CANCELLING -> STOPPED, once nobody is left inside. */
static int finish(tko_pool *pool, const struct timespec *deadline) {
  tko__mutex_lock(&pool->gate_mu);
  int rc = gate_wait(pool, quiet, deadline);
  tko__mutex_unlock(&pool->gate_mu);
  if (rc) return rc;
  /* Every worker is at its end: these joins return at once. */
  /* Every basic slot: a grow (tko_pool_resize) may have used any, and it
   * left the gate before the wait above ended. */
  for (unsigned i = 0; i < pool->elastic_base; i++) {
    tko__worker *w = &pool->slots[i];
    if (w->has_thread) pthread_join(w->thread, NULL);
    w->has_thread = false;
  }
  tko__elastic_close_and_join(pool);
  /* With every worker gone, anything still queued (an elastic-only pool
   * whose spawn failed) is run or cancelled here, so nothing is lost. */
  tko__empty_queue(pool, get_state(pool) == TKO__DRAINING);
  /* Then the features, in their phases' order (lifecycle.h: in-flight
   * async tasks complete, as running ones did; the timers close last). */
  rc = close_phases(pool, deadline);
  if (rc) return rc;
  tko__mutex_lock(&pool->gate_mu);
  set_state(pool, TKO__STOPPED);
  tko__mutex_unlock(&pool->gate_mu);
  tko__mutex_lock(&pool->idle_mu);
  pthread_cond_broadcast(&pool->idle_cv);
  tko__mutex_unlock(&pool->idle_mu);
  return 0;
}

/* Moves the pool as far towards STOPPED as the deadline allows; the caller
 * holds the shutter role. */
static int advance(tko_pool *pool, tko_shutdown_mode mode, const struct timespec *deadline) {
  int state = get_state(pool);
  if (state == TKO__STOPPED) return 0;
  bool nowait = mode == TKO_CANCEL_NOWAIT;
  if (nowait) mode = TKO_CANCEL;
  if (state == TKO__RUNNING) {
    tko__mutex_lock(&pool->gate_mu);
    set_state(pool, TKO__CLOSING);
    tko__mutex_unlock(&pool->gate_mu);
    state = TKO__CLOSING;
  }
  if (state == TKO__CLOSING) {
    int rc = resolve_attachments(pool, mode, deadline, nowait);
    if (rc) return rc;
    closing_pool = pool;
    close_pool(pool, mode);
    /* Test keyed/an_on_cancel_of_a_cancelled_keyed_task_cannot_submit. */
    if (mode == TKO_CANCEL) cancel_phases(pool);
  } else {
    closing_pool = pool;
    if (mode == TKO_CANCEL && state == TKO__DRAINING) {
      escalate(pool);
      /* Test keyed/a_cancel_after_a_timed_out_drain_cancels_the_queued_keyed_tasks. */
      cancel_phases(pool);
    }
  }
  return nowait ? 0 : finish(pool, deadline);
}

int tko_pool_shutdown_timed(tko_pool *pool, tko_shutdown_mode mode, long timeout_ms) {
  int rc = tko__pool_check(pool);
  if (rc) return rc;
  if (mode != TKO_DRAIN && mode != TKO_CANCEL && mode != TKO_CANCEL_NOWAIT) return -EINVAL;
  if (timeout_ms < -1) return -EINVAL;
  if (tko__current_pool == pool || role == pool || gate_held(pool)) return -EDEADLK;
  struct timespec at, *deadline = NULL;
  if (timeout_ms >= 0) {
    tko__deadline_after(&at, timeout_ms);
    deadline = &at;
  }
  rc = take_role(pool, deadline);
  if (rc) return rc;
  rc = advance(pool, mode, deadline);
  give_role(pool);
  return rc;
}

int tko_pool_shutdown(tko_pool *pool, tko_shutdown_mode mode) {
  return tko_pool_shutdown_timed(pool, mode, -1);
}

/* Whether anything still holds the pool (tko_pool_destroy's -EBUSY): the
 * pool's own attachments do not, their phase's fini destroys them. */
bool tko__attached(tko_pool *pool) {
  tko__mutex_lock(&pool->gate_mu);
  bool any = false;
  for (tko__attachment *a = pool->attached; a && !any; a = a->next) any = !a->pool_owned;
  tko__mutex_unlock(&pool->gate_mu);
  return any;
}

bool tko__in_role(const tko_pool *pool) { return role == pool; }
