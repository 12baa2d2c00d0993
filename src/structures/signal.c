/* SPDX-License-Identifier: MIT */
/* The signal idle workers sleep on, and why it loses no wake-up.
 *
 * The cost to avoid is a system call per submit. A submit therefore reads one
 * word, idle.state, which counts workers that are *searching* (awake, about
 * to look at the queue) and workers that are *sleeping* (in the idle set,
 * parked or about to park). It wakes somebody only when nobody is searching
 * and somebody sleeps; a searching worker is bound to look at the queue
 * again, so waking another would be wasted. A woken worker is counted as
 * searching by its waker right after the unpark, before it even runs (or
 * by itself, if it runs first: see below), so a burst of submits wakes
 * one worker, not one per task; when that worker finds work and stops
 * searching, the worker loop wakes the next sleeper if work remains (the
 * "last searcher wakes one more" rule from Tokio), so parallelism ramps up
 * one worker per task found, without a storm of wake-ups.
 *
 * No lost wake-up. A worker goes to sleep in three steps: (1) it moves itself
 * from searching to sleeping in idle.state with a seq_cst read-modify-write
 * (tko__idle_sleep_prepare), (2) it re-reads, with seq_cst loads, every
 * queue's backlog (wake.h: tko__backlog_seq), every submit ring's head and
 * tail, and the shared inbox's head, tail and the slots between them
 * (tko__look_seq), (3) it parks. A submit (1') publishes through its own
 * ring with a seq_cst CAS of that ring's tail (ring.h: tko__ring_publish)
 * - or, through the shared inbox, reserves its position with a seq_cst CAS
 * of the shared tail and then publishes its slot - then (2') loads
 * idle.state seq_cst.
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
 * into the queue (the shared inbox full behind a hole, or a batch larger
 * than the inbox) has its claim's seq_cst CAS of the inbox's tail and a
 * seq_cst store of its queue's backlog as its (1') (submit.c:
 * claim_locked); a batch of any size in a submit ring is one publish, one
 * CAS. Tasks a worker hands back (a shrink, a recheck:
 * take.c) have the same seq_cst store of the backlog of the queue they
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
 * The idle set. Who sleeps is a bitmap, one bit per worker slot
 * (idle.asleep, 64 slots a word), that no lock guards, so that a waker
 * stopped anywhere (preempted, or in a debugger) holds back nobody but the
 * one sleeper it claimed, and a worker going to sleep waits for nobody. A
 * sleeper sets only its own bit; a bit is cleared by exactly one party,
 * whose atomic AND finds it set: a waker, which thereby claims that
 * sleeper, or the sleeper itself, cancelling. A claim is one fetch_and on
 * one bit, so there is no ABA: the bit cannot be set again until its
 * sleeper has consumed the claim's permit, and a lost race leaves the
 * other bits alone.
 *
 * Going to sleep (tko__idle_sleep_prepare) is one seq_cst RMW of
 * idle.state, searching to sleeping, then a seq_cst fetch_or of the bit:
 * the count first, so that a waker, which lowers the count only after it
 * claimed the bit, never takes it below zero. The fetch_or is step (1) of
 * the Dekker pairs above: a waker's scan of the set is seq_cst loads after
 * its (2'), so either it sees the bit, or its scan precedes the fetch_or
 * and the sleeper's re-check (2) sees the work. A waker that finds the
 * count raised and no bit yet (the sleeper between its two RMWs) wakes
 * nobody, for the same reason. A shrink's or a shutdown's wake_all is the
 * same pair: its seq_cst store of the target (or of closing) precedes its
 * claim of the whole set, so a sleeper it missed reads the store in its
 * re-check.
 *
 * Waking (tko__idle_wake_one) claims the lowest set bit: basic workers
 * (the lower slots) before elastic ones, which then stay asleep long
 * enough to reach their idle timeout and retire. The waker leaves a permit
 * in the sleeper's parker; a permit left before the sleeper parks makes
 * the park return at once (futex_wait refuses to sleep when the word is no
 * longer 0). A sleeper that cancels (it found work in its re-check, or
 * timed out) clears its own bit: if the bit was already clear, a waker
 * claimed it, and it waits for that waker's permit and consumes it, so
 * permits never pile up and counts never drift.
 *
 * Who counts the woken worker as searching. The waker, after its unpark,
 * so that a burst of submits wakes one worker, not one per task; but a
 * waker stopped between its claim and its unpark must not leave a
 * searcher that never looks, or every submit after it would count on that
 * searcher and wake nobody. So whichever comes first does it: the waker
 * after its unpark, or the woken sleeper as soon as it has the permit.
 * The sleeper's turn word settles it with one CAS each, from OPEN to
 * WAKER (the waker's, which then moves the count and stores DONE) or to
 * DONE (the sleeper's, which then moves the count itself); a sleeper that
 * finds WAKER waits the two instructions until DONE, so that its own
 * search_end never comes before the waker's count. A count that comes
 * late loses no wake-up: a submit that saw it and skipped its wake counts
 * on the decrement this worker makes when it stops searching, which its
 * re-check follows (the pairs above). The word carries
 * the sleep's round, read by the waker right after its claim, so that a
 * waker late with its CAS cannot count a later sleep of the same worker.
 * Until then the claimed sleeper counts as sleeping with no bit set: a
 * submit that sees it finds no bit to claim, and signal_work goes on as
 * if nobody slept (an elastic spawn, where the pool has them).
 *
 * What a stopped waker holds back: before its claim, nothing; after it,
 * the one sleeper it claimed (still counted sleeping, so no submit counts
 * on it); after its unpark, nothing but, for two instructions, that
 * sleeper's return from its sleep.
 *
 * Lock order: no lock is taken here; a parker's fallback mutex (no futex)
 * is a leaf. */
#include "invariant.h"
#include "tko_signal.h"

#include <errno.h>
#include <sched.h>
#include <time.h>

#include "atomics.h"
#include "seam.h"
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

int tko__sleeper_init(tko__sleeper *s, unsigned bit) {
  s->bit = bit;
  atomic_init(&s->turn, TKO__TURN_DONE);
  return tko__parker_init(&s->parker);
}

void tko__sleeper_fini(tko__sleeper *s) { tko__parker_fini(&s->parker); }

void tko__idle_init(tko__idle *idle, tko__sleeper *first, size_t stride, unsigned n) {
  TKO__INVARIANT(n <= TKO__IDLE_BITS);
  atomic_init(&idle->state, 0);
  for (unsigned i = 0; i < TKO__IDLE_WORDS; i++) atomic_init(&idle->asleep[i], 0);
  idle->nwords = (n + 63) / 64;
  idle->first = first;
  idle->stride = stride;
}

void tko__idle_search_begin(tko__idle *idle) { tko__add_seq(&idle->state, TKO__SEARCHING_ONE); }

bool tko__idle_search_end(tko__idle *idle) {
  /* seq_cst: as step (1) of the essay. A submit whose (2') load saw this
   * searcher skipped its wake; the caller's seq_cst re-check
   * (tko__runnable_seq) after this decrement sees that submit's work. */
  uint64_t before = tko__sub_seq(&idle->state, TKO__SEARCHING_ONE);
  TKO__INVARIANT(tko__idle_searching(before) > 0); /* a search ends only once begun */
  return tko__idle_searching(before) == 1;
}

static tko__sleeper *sleeper_at(tko__idle *idle, unsigned bit) {
  return (tko__sleeper *)((char *)idle->first + (size_t)bit * idle->stride);
}

static uint64_t mask_of(const tko__sleeper *s) { return (uint64_t)1 << (s->bit % 64); }

/* A claimed sleeper moves from sleeping to searching. */
static void count_searching(tko__idle *idle) {
  tko__add_seq(&idle->state, TKO__SEARCHING_ONE - TKO__SLEEPING_ONE);
}

/* A strong CAS: true if *p held expected and now holds desired. */
static bool turn_cas(atomic_uint_fast64_t *p, uint64_t expected, uint64_t desired) {
  uint64_t seen = expected;
  while (!tko__cas_seq(p, &seen, desired))
    if (seen != expected) return false;
  return true;
}

void tko__idle_sleep_prepare(tko__idle *idle, tko__sleeper *s) {
  /* Owner only until the fetch_or below publishes it (seq_cst, a release):
   * a waker reads it after its claim. */
  uint64_t round = (tko__load_relaxed(&s->turn) >> 2) + 1;
  tko__store_relaxed(&s->turn, round << 2 | TKO__TURN_OPEN);
  tko__add_seq(&idle->state, TKO__SLEEPING_ONE - TKO__SEARCHING_ONE);
  /* Step (1) of the essay: seq_cst, ordered before the caller's re-check. */
  tko__or_seq(&idle->asleep[s->bit / 64], mask_of(s));
}

/* The sleeper's half of the count, once it holds the permit: counts itself
 * searching unless its waker got there first, then waits for that waker's
 * count to land. */
static void woken(tko__idle *idle, tko__sleeper *s) {
  uint64_t round = tko__load_relaxed(&s->turn) >> 2; /* only this thread changes the round */
  if (turn_cas(&s->turn, round << 2 | TKO__TURN_OPEN, round << 2 | TKO__TURN_DONE)) {
    count_searching(idle);
    return;
  }
  /* Acquire: pairs with the waker's release of DONE, after its count. */
  while (tko__load_acquire(&s->turn) != (round << 2 | TKO__TURN_DONE)) sched_yield();
}

bool tko__idle_sleep(tko__idle *idle, tko__sleeper *s, uint64_t timeout_ns) {
  if (!tko__parker_park(&s->parker, timeout_ns)) return false;
  woken(idle, s);
  return true;
}

bool tko__idle_sleep_cancel(tko__idle *idle, tko__sleeper *s) {
  uint64_t before = tko__and_seq(&idle->asleep[s->bit / 64], ~mask_of(s));
  if (before & mask_of(s)) { /* nobody claimed it: no permit is coming */
    uint64_t round = tko__load_relaxed(&s->turn) >> 2;
    tko__store_relaxed(&s->turn, round << 2 | TKO__TURN_DONE); /* owner only: unclaimed */
    count_searching(idle);
    return true;
  }
  tko__parker_park(&s->parker, UINT64_MAX); /* a waker claimed it */
  woken(idle, s);
  return false;
}

/* The waker's half, after its claim: turn is what it read right after the
 * claim (the round it claimed). Unparks, then counts the sleeper searching
 * unless the sleeper already did. */
static void wake(tko__idle *idle, tko__sleeper *s, uint64_t turn) {
  tko__parker_unpark(&s->parker);
  uint64_t round = turn & ~(uint64_t)3;
  if (turn_cas(&s->turn, round | TKO__TURN_OPEN, round | TKO__TURN_WAKER)) {
    count_searching(idle);
    /* Release: pairs with the sleeper's acquire in woken. */
    tko__store_release(&s->turn, round | TKO__TURN_DONE);
  }
}

#ifdef TKO_TEST_SEAMS
void (*_Atomic tko__test_wake_window)(enum tko__wake_point at);
#endif

/* Claims the lowest set bit, or returns NULL. */
static tko__sleeper *claim_one(tko__idle *idle, uint64_t *turn) {
  void (*seam)(enum tko__wake_point) = TKO__SEAM(tko__test_wake_window); /* tko_signal.h */
  for (unsigned w = 0; w < idle->nwords; w++) {
    /* seq_cst: the scan is after the caller's (2') (see the essay). */
    uint64_t bits = tko__load_seq(&idle->asleep[w]);
    while (bits) {
      uint64_t mask = bits & -bits;
      if (seam) seam(TKO__WAKE_SCANNED);
      uint64_t before = tko__and_seq(&idle->asleep[w], ~mask);
      if (before & mask) {
        tko__sleeper *s = sleeper_at(idle, w * 64 + (unsigned)__builtin_ctzll(mask));
        /* Relaxed: the claim's seq_cst RMW read the fetch_or that
         * published it, and the sleeper cannot start another round before
         * this waker's permit. */
        *turn = tko__load_relaxed(&s->turn);
        return s;
      }
      bits = before & ~mask; /* another waker (or its cancel) took that one */
    }
  }
  return NULL;
}

bool tko__idle_wake_one(tko__idle *idle) {
  /* Step (2') of the essay: this seq_cst load follows the submitter's
   * publish. */
  uint64_t st = tko__load_seq(&idle->state);
  if (tko__idle_sleeping(st) == 0) return false;
  void (*seam)(enum tko__wake_point) = TKO__SEAM(tko__test_wake_window); /* tko_signal.h */
  if (seam) seam(TKO__WAKE_DECIDED);
  uint64_t turn;
  tko__sleeper *s = claim_one(idle, &turn);
  if (!s) return false;
  if (seam) seam(TKO__WAKE_CLAIMED);
  wake(idle, s, turn);
  return true;
}

void tko__idle_wake_all(tko__idle *idle) {
  for (unsigned w = 0; w < idle->nwords; w++) {
    /* seq_cst: after the caller's store of closing or of a target. */
    uint64_t bits = tko__exchange_seq(&idle->asleep[w], 0);
    while (bits) {
      uint64_t mask = bits & -bits;
      bits &= ~mask;
      tko__sleeper *s = sleeper_at(idle, w * 64 + (unsigned)__builtin_ctzll(mask));
      wake(idle, s, tko__load_relaxed(&s->turn)); /* relaxed: as in claim_one */
    }
  }
}
