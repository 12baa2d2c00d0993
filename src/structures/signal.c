/* SPDX-License-Identifier: MIT */
/* The signal idle workers sleep on, and why it loses no wake-up.
 *
 * The cost to avoid is a system call per submit. A submit therefore reads one
 * word, idle.state, which counts workers that are *searching* (awake, about
 * to look at the queue) and workers that are *sleeping* (on the idle list,
 * parked or about to park). It wakes somebody only when nobody is searching
 * and somebody sleeps; a searching worker is bound to look at the queue
 * again, so waking another would be wasted. A woken worker is counted as
 * searching by its waker, before it even runs, so a burst of submits wakes
 * one worker, not one per task; when that worker finds work and stops
 * searching, the worker loop wakes the next sleeper if work remains (the
 * "last searcher wakes one more" rule from Tokio), so parallelism ramps up
 * one worker per task found, without a storm of wake-ups.
 *
 * No lost wake-up. A worker goes to sleep in three steps: (1) it moves itself
 * from searching to sleeping in idle.state with a seq_cst read-modify-write
 * (tko__idle_sleep_prepare), (2) it re-reads, with seq_cst loads, every
 * queue's backlog (shard.c), every submit ring's head and tail, and the shared
 * inbox's head, tail and the slots between them (tko__look_seq), (3) it
 * parks. A submit (1') publishes through its own ring with a seq_cst CAS
 * of that ring's tail (ring.h: tko__ring_publish) - or, through the
 * shared inbox, reserves its position with a seq_cst CAS of the shared
 * tail and then publishes its slot - then (2') loads idle.state seq_cst.
 * All of these are in the single total order of seq_cst operations, so
 * either (1) precedes (1') and the submit sees a sleeper and wakes one, or
 * (1') precedes the re-check in (2), which sees the tail moved and does
 * not sleep for good. The pattern is Dekker's; the pairs are documented
 * where they are used (worker.c: worker_sleep, ring.h, inbox.h:
 * tko__inbox_reserve). A ring has no holes: its CAS is the publish, so
 * the re-check that sees it sees the task. For the shared inbox, what the
 * re-check finds decides: a
 * published task cancels the sleep; a hole (the position reserved, its
 * slot not yet published) makes the worker sleep for TKO__HOLE_POLL_MS
 * and look again. The publish is a release store, so the hole's submitter
 * may read idle.state before its publish is seen and miss this sleeper;
 * and a submitter stopped at the hole must hold back nobody (inbox.h), so
 * no worker waits at one awake. The poll bounds the delay to the hole's
 * own task; a seq_cst publish would make it exact but cost every submit
 * a full fence (docs/PERFORMANCE.md). A worker that stops searching
 * counts a hole as work when it decides whether to wake another
 * (tko__runnable_seq), for the same reason. A task a submit puts straight
 * into the queue (the ring full behind a hole, or a batch larger than the
 * ring) has its claim's seq_cst CAS of the tail and a seq_cst store of
 * its queue's backlog as its (1') (submit.c: claim_locked); a batch
 * larger than a submit ring goes through the ring a ringful at a time
 * under its queue's lock, each with its CAS (submit.c:
 * ring_enqueue_locked). Tasks a worker hands back (a shrink, a recheck:
 * worker.c) have the same seq_cst store of the backlog of the queue they
 * go back to as their (1'), then a seq_cst load of idle.state. Which
 * queue holds the work does not matter to a sleeper: the re-check (2)
 * reads them all, and a woken worker takes from any of them (shard.c). A
 * sweep (a worker draining other queues' rings) moves tasks that were
 * already published, whose publish was the (1') that counted, so it needs
 * no signal of its own: the sweeping worker is awake, and its own re-check
 * before it sleeps reads the backlog it stored.
 *
 * A spawn that fails. When nobody is searching or asleep, a submit starts an
 * elastic worker, which its spawner counts as searching before the thread
 * exists (so that the submits of a burst start one worker, not one each).
 * If the thread cannot be created, that searcher never looks: a submit
 * that saw it (2') skipped its wake, and a worker that went to sleep
 * meanwhile would sleep beside that task. So the spawner takes the count
 * back with a seq_cst RMW (its (1)) and, if it was the last searcher,
 * re-reads the inbox and backlog seq_cst (its (2)) and wakes a sleeper if
 * work waits. The same Dekker argument holds: either the submit's
 * publish precedes the re-read, which sees it, or the submit's load of
 * idle.state follows the RMW and sees no searcher, and wakes or spawns
 * itself. A sleeper that prepared its sleep after the RMW re-checks for
 * work itself. (elastic.c: tko__elastic_spawn.)
 *
 * Wakes are never lost in the parker either: a waker claims a sleeper under
 * idle.mu (unlinking it and moving it from sleeping to searching in one RMW),
 * then leaves a permit in that sleeper's parker. A permit left before the
 * sleeper parks makes the park return at once (futex_wait refuses to sleep
 * when the word is no longer 0). A sleeper that cancels (found work, timed
 * out) takes itself off the list under the same mutex; if it is no longer
 * listed a waker has claimed it, and it consumes the permit that is coming,
 * so permits never pile up and counts never drift.
 *
 * LIFO: wakers take the most recently idle worker, whose cache is warm; the
 * others stay asleep long enough for elastic ones to reach their idle timeout
 * and retire.
 *
 * Lock order: idle.mu is a leaf; nothing else is taken while holding it. */
#include "invariant.h"
#include "tko_signal.h"

#include <errno.h>
#include <time.h>

#include "atomics.h"
#include "witness.h"

int tko__parker_init(tko__parker *pk) {
  atomic_init(&pk->permit, 0);
#ifndef TKO_HAVE_FUTEX
  if (tko__mutex_init(&pk->mu, TKO__RANK_PARKER)) return -ENOMEM;
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  int rc = pthread_cond_init(&pk->cv, &ca);
  pthread_condattr_destroy(&ca);
  if (rc) {
    tko__mutex_destroy(&pk->mu);
    return -ENOMEM;
  }
#endif
  return 0;
}

void tko__parker_fini(tko__parker *pk) {
#ifndef TKO_HAVE_FUTEX
  pthread_cond_destroy(&pk->cv);
  tko__mutex_destroy(&pk->mu);
#else
  (void)pk;
#endif
}

/* Takes the permit if there is one. Acquire: pairs with the release in
 * tko__parker_unpark, so what the waker wrote before waking is visible. */
static bool take_permit(tko__parker *pk) {
  return atomic_exchange_explicit(&pk->permit, 0, memory_order_acquire) != 0;
}

bool tko__parker_park(tko__parker *pk, uint64_t timeout_ns) {
  uint64_t deadline = timeout_ns == UINT64_MAX ? UINT64_MAX : tko__now_ns() + timeout_ns;
  while (!take_permit(pk)) {
    uint64_t now = deadline == UINT64_MAX ? 0 : tko__now_ns();
    if (deadline != UINT64_MAX && now >= deadline) return false;
    uint64_t left = deadline == UINT64_MAX ? UINT64_MAX : deadline - now;
#ifdef TKO_HAVE_FUTEX
    tko__futex_wait(&pk->permit, 0, left);
#else
    tko__mutex_lock(&pk->mu);
    if (!tko__load_acquire(&pk->permit)) { /* pairs with unpark's release */
      if (left == UINT64_MAX) {
        tko__cond_wait(&pk->cv, &pk->mu);
      } else {
        struct timespec ts;
        uint64_t at = deadline;
        ts.tv_sec = (time_t)(at / 1000000000u);
        ts.tv_nsec = (long)(at % 1000000000u);
        tko__cond_timedwait(&pk->cv, &pk->mu, &ts);
      }
    }
    tko__mutex_unlock(&pk->mu);
#endif
  }
  return true;
}

void tko__parker_unpark(tko__parker *pk) {
  /* Release: pairs with the acquire in take_permit. */
  tko__store_release(&pk->permit, 1);
#ifdef TKO_HAVE_FUTEX
  tko__futex_wake_one(&pk->permit);
#else
  tko__mutex_lock(&pk->mu); /* so the store cannot slip between check and wait */
  pthread_cond_signal(&pk->cv);
  tko__mutex_unlock(&pk->mu);
#endif
}

int tko__idle_init(tko__idle *idle) {
  atomic_init(&idle->state, 0);
  idle->top = NULL;
  return tko__mutex_init(&idle->mu, TKO__RANK_IDLE_LIST) ? -ENOMEM : 0;
}

void tko__idle_fini(tko__idle *idle) { tko__mutex_destroy(&idle->mu); }

void tko__idle_search_begin(tko__idle *idle) { tko__add_seq(&idle->state, TKO__SEARCHING_ONE); }

bool tko__idle_search_end(tko__idle *idle) {
  uint64_t before = tko__sub_seq(&idle->state, TKO__SEARCHING_ONE);
  TKO__INVARIANT(tko__idle_searching(before) > 0); /* a search ends only once begun */
  return tko__idle_searching(before) == 1;
}

static void unlink_sleeper(tko__idle *idle, tko__sleeper *s) {
  if (s->prev) s->prev->next = s->next;
  else idle->top = s->next;
  if (s->next) s->next->prev = s->prev;
  s->prev = s->next = NULL;
  s->listed = false;
}

void tko__idle_sleep_prepare(tko__idle *idle, tko__sleeper *s) {
  tko__mutex_lock(&idle->mu);
  s->prev = NULL;
  s->next = idle->top;
  if (idle->top) idle->top->prev = s;
  idle->top = s;
  s->listed = true;
  /* Step (1) of the essay: seq_cst, ordered before the caller's re-check. */
  tko__add_seq(&idle->state, TKO__SLEEPING_ONE - TKO__SEARCHING_ONE);
  tko__mutex_unlock(&idle->mu);
}

bool tko__idle_sleep_cancel(tko__idle *idle, tko__sleeper *s) {
  tko__mutex_lock(&idle->mu);
  bool was_listed = s->listed;
  if (was_listed) {
    unlink_sleeper(idle, s);
    tko__add_seq(&idle->state, TKO__SEARCHING_ONE - TKO__SLEEPING_ONE);
  }
  tko__mutex_unlock(&idle->mu);
  return was_listed;
}

/* Claims the top sleeper under idle->mu, or returns NULL. */
static tko__sleeper *claim_top(tko__idle *idle) {
  tko__sleeper *s = idle->top;
  if (s) {
    unlink_sleeper(idle, s);
    tko__add_seq(&idle->state, TKO__SEARCHING_ONE - TKO__SLEEPING_ONE);
  }
  return s;
}

bool tko__idle_wake_one(tko__idle *idle) {
  /* Step (2') of the essay: this seq_cst load follows the submitter's seq_cst
   * increment of the queued count. */
  uint64_t st = tko__load_seq(&idle->state);
  if (tko__idle_sleeping(st) == 0) return false;
  tko__mutex_lock(&idle->mu);
  tko__sleeper *s = claim_top(idle);
  tko__mutex_unlock(&idle->mu);
  if (!s) return false;
  tko__parker_unpark(&s->parker);
  return true;
}

void tko__idle_wake_all(tko__idle *idle) {
  for (;;) {
    tko__mutex_lock(&idle->mu);
    tko__sleeper *s = claim_top(idle);
    tko__mutex_unlock(&idle->mu);
    if (!s) return;
    tko__parker_unpark(&s->parker);
  }
}
