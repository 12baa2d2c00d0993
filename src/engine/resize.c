/* SPDX-License-Identifier: MIT */
/* Resizing a live pool: tko_pool_resize sets the number of basic workers
 * and max_elastic; growing starts threads at once, shrinking retires
 * workers as they finish their current task.
 *
 * Slots. Create allocates max_threads basic slots and as many elastic ones
 * (each region within TKO_MAX_WORKERS / TKO_MAX_ELASTIC), so no slot a
 * thread points into ever moves. Basic worker i owns slot i; the pool wants
 * slots [0, basic_target) staffed. A basic slot is RUNNING (a thread works
 * there, or is being started by a grow: `spawning`), LEAVING (its thread
 * retired for a shrink and runs its stop hook), RETIRING (its thread has
 * ended or is ending and waits to be joined) or EMPTY (never started, or its
 * start failed). States change under spawn_mu only.
 *
 * Shrinking. Workers retire themselves: each compares, lock-free, its index
 * with basic_target (elastic: elastic_count with elastic_max) before every
 * take and after every task of a batch it took (tko__resize_hint), and
 * decides under spawn_mu (tko__resize_retire), so that two elastic workers
 * never both retire for one place and a grow never races a decision. The
 * rest of its batch goes back to the queue where it was taken from
 * (take.c: tko__requeue_taken), so nothing is lost or reordered. Sleepers are
 * woken so that they look too: a shrink stores its target seq_cst, then
 * wakes every sleeper in the idle set; a worker whose bit that wake missed
 * set it after the wake's claim, and re-reads the target before it parks
 * (worker.c: worker_sleep), so none sleeps past it (signal.c).
 *
 * Growing. Under spawn_mu, for each slot below the target that has no
 * working thread: a LEAVING one is handed back (its thread, after its stop
 * hook, finds RUNNING in tko__resize_left and carries on, with a new
 * thread_start); a RETIRING or EMPTY one is marked RUNNING and `spawning`,
 * and outside the lock its old thread is joined (it has passed its last
 * decision: what is left of it takes only gate_mu) and a new one started.
 * The target is re-read under the lock for each slot, so a shrink that
 * comes in meanwhile stops the grow. A raised max_elastic spawns at once
 * when work waits and nobody is idle (tko__signal_work).
 *
 * Nothing is stranded. A worker that retires while counted as searching
 * ends its search and, if it was the last searcher, re-reads for work and
 * passes it on (worker.c: work_loop's end), the Dekker pair of signal.c;
 * one that hands back tasks stores its backlog seq_cst
 * (tko__publish_backlog_seq, take.c) before it signals them. Work a
 * basic worker leaves always has a taker: basic_target 0 only comes with
 * max_elastic > 0, and tko__signal_work spawns then.
 *
 * Shutdown. A resize holds the lifecycle gate (lifecycle.h) while it
 * starts or joins threads, so shutdown waits for it before joining every
 * slot, and from DRAINING on the gate refuses it; it also refuses itself
 * from CLOSING on (-ESHUTDOWN once shutdown began). A leaving thread counts
 * in the pool's threads until its end, like any worker.
 *
 * Locks (ranked in witness.h): spawn_mu, gate_mu as a leaf (the wake-ups
 * take none); no lock is held while joining or creating a thread. */
#include <errno.h>

#include "engine.h"
#include "wake.h"

bool tko__resize_retire(tko_pool *pool, tko__worker *w) {
  /* Once shutdown has closed the pool, a shrink no longer retires anyone:
   * the workers drain together and end as shutdown ends them. A worker that
   * retired then would hand its batch back after the others may have left,
   * and shutdown would run those tasks on its own thread, past a timed
   * call's deadline (test
   * resize/a_drain_after_a_shrink_runs_every_task_on_a_worker). seq_cst:
   * as worker_sleep's read of closing. */
  if (tko__load_seq(&pool->closing)) return false;
  bool retire = false;
  tko__mutex_lock(&pool->spawn_mu);
  if (w->kind == TKO_WORKER_BASIC) {
    retire = w->index >= tko__load_relaxed(&pool->basic_target); /* stored under spawn_mu */
    if (retire) {
      tko__store_relaxed(&w->slot_state, TKO__SLOT_LEAVING); /* under spawn_mu */
      tko__sub_seq(&pool->basic_alive, 1);
    }
  } else {
    /* Count first, then the slot, both under spawn_mu: a spawner that
     * reserved the released count claims a slot under spawn_mu, so it finds
     * this one RETIRING (the order elastic.c's try_retire keeps without the
     * lock). The release pairs with claim_slot's acquire. */
    unsigned n = tko__load_relaxed(&pool->elastic_count);
    while (n > tko__load_relaxed(&pool->elastic_max) &&
           !(retire = tko__cas_seq(&pool->elastic_count, &n, n - 1))) {
    }
    if (retire) {
      tko__store_release(&w->slot_state, TKO__SLOT_RETIRING);
      tko__add_seq(&pool->elastic_retired, 1); /* seq_cst: see tko__elastic_started */
    }
  }
  tko__mutex_unlock(&pool->spawn_mu);
  return retire;
}

bool tko__resize_left(tko_pool *pool, tko__worker *w) {
  tko__mutex_lock(&pool->spawn_mu);
  bool back = tko__load_relaxed(&w->slot_state) == TKO__SLOT_RUNNING; /* under spawn_mu */
  if (!back) tko__store_relaxed(&w->slot_state, TKO__SLOT_RETIRING);
  tko__mutex_unlock(&pool->spawn_mu);
  return back;
}

void tko__resize_vacate(tko_pool *pool, tko__worker *w) {
  tko__mutex_lock(&pool->spawn_mu);
  tko__store_relaxed(&w->slot_state, TKO__SLOT_RETIRING); /* under spawn_mu */
  tko__mutex_unlock(&pool->spawn_mu);
}

enum grow_step { GROW_DONE, GROW_NEXT, GROW_AGAIN };

/* Staffs basic slot i if it is below the target and has no working thread:
 * GROW_DONE once i reaches the target (or a start failed: *rc), GROW_NEXT
 * when the slot is staffed, GROW_AGAIN after starting a thread there: its
 * thread may already have retired for a shrink that came in meanwhile, and
 * a grow that came after that skipped the slot while it was `spawning`, so
 * the slot is looked at again against the target of now. */
static enum grow_step grow_slot(tko_pool *pool, unsigned i, int *rc) {
  tko__worker *w = &pool->slots[i];
  tko__mutex_lock(&pool->spawn_mu);
  if (i >= tko__load_relaxed(&pool->basic_target)) { /* stored under spawn_mu */
    tko__mutex_unlock(&pool->spawn_mu);
    return GROW_DONE;
  }
  int state = tko__load_relaxed(&w->slot_state); /* under spawn_mu, as every store */
  bool start = !w->spawning && (state == TKO__SLOT_RETIRING || state == TKO__SLOT_EMPTY);
  bool join = start && w->has_thread;
  pthread_t old = w->thread;
  if (state == TKO__SLOT_LEAVING || start) {
    tko__store_relaxed(&w->slot_state, TKO__SLOT_RUNNING);
    tko__add_seq(&pool->basic_alive, 1);
  }
  if (start) {
    w->has_thread = false;
    w->spawning = true; /* no other grow may start or join it meanwhile */
  }
  tko__mutex_unlock(&pool->spawn_mu);
  if (!start) return GROW_NEXT;
  if (join) pthread_join(old, NULL);
  pthread_t t;
  int err = tko__worker_spawn(pool, w, &t);
  tko__mutex_lock(&pool->spawn_mu);
  if (err == 0) {
    w->thread = t;
    w->has_thread = true;
  } else {
    tko__store_relaxed(&w->slot_state, TKO__SLOT_EMPTY); /* under spawn_mu */
    tko__sub_seq(&pool->basic_alive, 1);
    *rc = err; /* -EAGAIN, as create's */
  }
  w->spawning = false;
  tko__mutex_unlock(&pool->spawn_mu);
  return err ? GROW_DONE : GROW_AGAIN;
}

int tko_pool_resize(tko_pool *pool, unsigned basic_workers, unsigned max_elastic) {
  int rc = tko__pool_check(pool);
  if (rc) return rc;
  if ((basic_workers == 0 && max_elastic == 0) || basic_workers > TKO_MAX_WORKERS ||
      max_elastic > TKO_MAX_ELASTIC || basic_workers + max_elastic > pool->opts.max_threads)
    return -EINVAL;
  rc = tko__gate_enter(pool);
  if (rc) return rc;
  /* Relaxed: a shutdown this load misses waits for this resize, which
   * entered the gate while it was open, before it joins the workers
   * (lifecycle.h). */
  if (tko__load_relaxed(&pool->state) != TKO__RUNNING) {
    tko__gate_leave(pool);
    return -ESHUTDOWN;
  }
  tko__mutex_lock(&pool->spawn_mu);
  bool shrink = basic_workers < tko__load_relaxed(&pool->basic_target) ||
                max_elastic < tko__load_relaxed(&pool->elastic_max);
  /* seq_cst stores, read relaxed by the hints: the decisions re-read them
   * under spawn_mu, and sleepers seq_cst after their sleep_prepare (see
   * above). */
  tko__store_seq(&pool->basic_target, basic_workers);
  tko__store_seq(&pool->elastic_max, max_elastic);
  tko__mutex_unlock(&pool->spawn_mu);
  enum grow_step step;
  for (unsigned i = 0; (step = grow_slot(pool, i, &rc)) != GROW_DONE;)
    if (step == GROW_NEXT) i++;
  if (shrink) tko__idle_wake_all(&pool->idle);
  if (tko__runnable_seq(pool)) tko__signal_work(pool);
  tko__gate_leave(pool);
  return rc;
}
