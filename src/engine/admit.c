/* SPDX-License-Identifier: MIT */
/* Admission to a bounded queue (queue_capacity > 0): a task takes room
 * before it is queued and gives it back when it starts (or is cancelled),
 * so that at most queue_capacity tasks wait.
 *
 * The count is room_taken: room taken by admissions, less room given back.
 * One shared count that every submit CASed and every start decremented
 * would move its line between cores twice a task, so both sides go to it
 * in chunks, which shrink to single tasks near the bound:
 *
 * - Leases. A submitting thread with a ring (ring.h) takes, with its own
 *   task's room, a share of the room still free, kept in the ring's credits
 *   (a line no other submitter writes) and spent a task at a time.
 * - Settling. A worker counts the room its starts give back on its own
 *   line (tko__worker.room_given) and subtracts it from room_taken once a
 *   chunk has gathered (room_settled says how much was).
 *
 * A chunk is at most 1/(CHUNK_SHARE x its kind's count: rings, or workers)
 * of the room free when it is taken, and at most CHUNK_MAX tasks; below
 * CHUNK_MIN there is none
 * (audit_sharing --capacity shows what that saves). Far from the bound
 * a thread touches room_taken once a chunk; near it chunks are empty and
 * each submit and start moves room_taken itself.
 *
 * Why the bound holds: room_taken is never below the room in use. Leased
 * credits count as taken; a give-back leaves it only when settled, and a
 * settle marks room_settled before it subtracts, so no give-back is
 * subtracted twice.
 *
 * Why a submit is refused, or waits, only for room that tasks waiting, or
 * submits in progress, hold: before it refuses or sleeps it gathers every
 * chunk (gather: it settles every worker slot's give-backs and takes every
 * ring's unspent credits back) and looks again. Room another thread has
 * between the two steps of a settle or a take-back (room_moving counts
 * them: the room is then in neither place) is on its way: a submit that
 * would refuse waits for it instead, asleep, as a blocked submit waits
 * for room; a worker of the pool, which waits for no other thread, counts
 * it as taken. A lease between its CAS and its credits is a submit in
 * progress.
 *
 * Waiting takes no lock: space_seq is an event count. A waiter counts
 * itself in space_waiters, reads space_seq, then looks (gathers, reads
 * room_taken, room_moving, closing), and sleeps on space_seq
 * (tko__word_wait) only while it still holds what it read. Whoever makes
 * room, or ends a move, and sees waiters counted bumps space_seq and wakes
 * them all (wake_space_waiters). No wake-up is lost, by these Dekker pairs
 * (seq_cst both sides): a worker stores its give-back, then loads
 * space_waiters; a lease adds its credits, then loads space_waiters; a
 * settle or a take-back subtracts and leaves room_moving, then loads
 * space_waiters; a shutdown stores closing, then bumps; a waiter
 * increments space_waiters, then reads space_seq and looks, which loads
 * them all. Either the waiter's look sees the room (or the end of the
 * move, or the close), or the other side sees the waiter and bumps
 * space_seq: after the waiter's read, so its sleep returns at once or is
 * woken; before it, and then what came before the bump is seen by the look.
 *
 * What a submitter stopped inside admission (preempted, in a debugger)
 * holds, and whom it holds up (tests/stress/test_stalled_admission.c parks
 * one at each point, tko__test_admit_window and tko__test_settle_window):
 *
 * - Asleep, or between its look and its sleep: no room and no lock; only
 *   its count in the gate, which a shutdown waits for, as for any blocked
 *   submit. Workers that give room back meanwhile see it counted, bump
 *   space_seq and make the wake call (a system call), whether it sleeps or
 *   not; other waiters look for themselves.
 * - Between a lease's CAS and its credits: its lease (at most a chunk),
 *   counted taken and in no ring. Submits that find the queue full
 *   without that room wait or are refused for it; no worker waits.
 * - Between a settle's two steps (its own gather, or as a worker): that
 *   slot's give-backs (at most a chunk); between a take-back's two steps:
 *   one ring's credits (about a lease; each ring is subtracted before the
 *   next is taken). Submits that find the queue full without that room
 *   wait for it, asleep, until the move ends (REJECT and CALLER_RUNS ones
 *   too, rather than refuse); submits that fit do not, nor workers (a
 *   worker's own submit to a full queue is refused, or runs on it, at
 *   once).
 * - Where there is no futex, tko__word_wait's stripe mutex for a few
 *   instructions (futex.c), which a wake of any word on that stripe takes.
 */
#include <errno.h>
#include <stdint.h>

#include "engine.h"
#include "invariant.h"
#include "seam.h"

/* CHUNK_MAX: far from the bound, room_taken takes about 4 RMWs a
 * CHUNK_MAX tasks (leases and settles), and they are most of a bounded
 * pool's contended RMWs; at 128 they put it above the sharing audit's
 * first gate (contended RMWs per task), which CTest's
 * audit_sharing_bounded enforces (benchmarks/MODEL.md). */
enum { CHUNK_SHARE = 4, CHUNK_MIN = 8, CHUNK_MAX = 512 };

/* A chunk's size when free room is left: see the essay. Below CHUNK_MIN,
 * none: a chunk of a task or two would cost its own line's RMWs on top of
 * the shared one's, and be taken back by every full submit (near the
 * bound: audit_sharing --capacity 4096). */
static size_t chunk_size(size_t free, unsigned sharers) {
  size_t chunk = free / (CHUNK_SHARE * (size_t)(sharers ? sharers : 1));
  if (chunk < CHUNK_MIN) return 0;
  return chunk < CHUNK_MAX ? chunk : CHUNK_MAX;
}

/* Room came free, or a move ended: bumps the event count and wakes the
 * submitters waiting, if any are counted. seq_cst load: after the room was
 * given back (or the move ended), the other half of the waiter's Dekker
 * pair with its increment of space_waiters (see the essay). seq_cst bump:
 * pairs with the waiter's read of space_seq before its look. */
static void wake_space_waiters(tko_pool *pool) {
  if (tko__load_seq(&pool->space_waiters)) {
    tko__add_seq(&pool->space_seq, 1);
    tko__word_wake_all(&pool->space_seq);
  }
}

void tko__admit_close(tko_pool *pool) {
  /* seq_cst: after the caller's store of closing, which a waiter that read
   * space_seq before this bump sees in its look (see the essay). */
  tko__add_seq(&pool->space_seq, 1);
  tko__word_wake_all(&pool->space_seq);
}

/* Whether submitters wait for room. seq_cst: after a give-back's store,
 * the other half of the waiter's Dekker pair (see the essay); before it,
 * a hint. */
static bool space_awaited(tko_pool *pool) { return tko__load_seq(&pool->space_waiters) != 0; }

/* The seams (seam.h): tests/unit/test_admit.c parks a worker between a
 * settle's mark and its subtraction, tests/stress/test_stalled_admission.c
 * a submitter there and at each point of tko__admit_point. */
#ifdef TKO_TEST_SEAMS
void (*_Atomic tko__test_settle_window)(void);
void (*_Atomic tko__test_admit_window)(enum tko__admit_point at);
#endif

static void admit_seam(enum tko__admit_point at) {
  void (*seam)(enum tko__admit_point) = TKO__SEAM(tko__test_admit_window);
  if (seam) seam(at);
}

/* Subtracts w's give-backs not yet settled from room_taken; returns how
 * many. Any thread may: room_settled is advanced by CAS, before the
 * subtraction (see the essay), and room_moving counts the settle from
 * before its mark to after its subtraction, so that a submit about to
 * refuse can tell room on its way back (tko__admit); its end wakes the
 * waiters, who may wait for it. */
static size_t settle(tko_pool *pool, tko__worker *w) {
  size_t given = tko__load_seq(&w->room_given); /* seq_cst: a waiter's gather */
  size_t settled = tko__load_relaxed(&w->room_settled);
  if (settled >= given) return 0;
  tko__add_seq(&pool->room_moving, 1);
  size_t back = 0;
  while (settled < given) {
    if (tko__cas_seq(&w->room_settled, &settled, given)) {
      void (*seam)(void) = TKO__SEAM(tko__test_settle_window);
      if (seam) seam();
      back = given - settled;
      /* seq_cst: the room's half of the Dekker pair with wait_for_room's
       * increment of space_waiters and its load of room_taken (the essay);
       * before wake_space_waiters' load. */
      size_t before = tko__sub_seq(&pool->room_taken, back);
      TKO__INVARIANT(before >= back); /* each give-back settled once */
      (void)before;
      break;
    }
  }
  tko__sub_seq(&pool->room_moving, 1); /* seq_cst: before the wake's load (see the essay) */
  wake_space_waiters(pool);
  return back;
}

/* The workers that give room back, for chunk_size: relaxed, a hint. */
static unsigned workers_now(tko_pool *pool) {
  return tko__load_relaxed(&pool->basic_alive) + tko__load_relaxed(&pool->elastic_count);
}

/* The chunk to gather after room_taken read used. */
static size_t next_chunk(tko_pool *pool, size_t used) {
  size_t cap = pool->opts.queue_capacity;
  return chunk_size(used < cap ? cap - used : 0, workers_now(pool));
}

/* Gives n tasks' room straight back to room_taken and wakes the waiters;
 * returns the room still taken. */
static size_t give_back_now(tko_pool *pool, size_t n) {
  /* seq_cst: as settle's subtraction, then wake_space_waiters' load. */
  size_t before = tko__sub_seq(&pool->room_taken, n);
  TKO__INVARIANT(before >= n); /* room given back once per task that took it */
  wake_space_waiters(pool);
  return before - n;
}

void tko__give_room(tko_pool *pool, tko__worker *w, size_t n) {
  if (!pool->opts.queue_capacity || !n) return;
  if (w == &pool->caller) {
    tko__release_room(pool, n);
    return;
  }
  size_t given = tko__load_relaxed(&w->room_given) + n; /* owner only */
  bool pending = tko__load_relaxed(&w->room_settled) != given - n;
  if (!pending && (!w->room_chunk || space_awaited(pool))) {
    /* Near the bound, or submitters wait, and nothing gathered: straight
     * to room_taken, as one shared count did. */
    w->room_chunk = next_chunk(pool, give_back_now(pool, n));
    return;
  }
  if (!w->room_listed) { /* this slot's first chunk: gather visits it from now */
    unsigned want = (unsigned)(w - pool->slots) + 1, seen = tko__load_relaxed(&pool->room_slots);
    /* seq_cst: before the store of room_given below; pairs with gather's
     * load of room_slots, so a waiter's gather visits this slot. */
    while (seen < want && !tko__cas_seq(&pool->room_slots, &seen, want)) {
    }
    w->room_listed = true;
  }
  tko__store_seq(&w->room_given, given); /* seq_cst: a Dekker pair (see the essay) */
  /* Waiters counted after this load look for themselves (their gather
   * settles this slot); counted before it, they are woken by the settle. */
  if (space_awaited(pool) || given - tko__load_relaxed(&w->room_settled) >= w->room_chunk) {
    (void)settle(pool, w);
    w->room_chunk = next_chunk(pool, tko__load_relaxed(&pool->room_taken)); /* relaxed: a hint */
  }
}

void tko__release_room(tko_pool *pool, size_t n) {
  if (pool->opts.queue_capacity && n) (void)give_back_now(pool, n);
}

void tko__take_room_unchecked(tko_pool *pool, size_t n) {
  tko__add_seq(&pool->room_taken, n); /* seq_cst: as try_take's CAS */
}

/* Takes ring r's unspent credits back to room_taken; returns how many.
 * One ring at a time, so that a thread stopped between the two steps
 * holds one ring's credits at most; room_moving counts the move, and its
 * end wakes the waiters, as a settle's (see the essay). */
static size_t take_back(tko_pool *pool, tko__ring *r) {
  /* seq_cst, both: the move is counted before the credits go, so a
   * gather whose seq_cst load of credits finds them gone then sees the
   * count in its seq_cst load of room_moving (tko__admit, wait_for_room). */
  tko__add_seq(&pool->room_moving, 1);
  size_t credits = tko__exchange_seq(&r->credits, 0);
  admit_seam(TKO__ADMIT_TAKING_BACK);
  /* seq_cst: as settle's subtraction. */
  if (credits) tko__sub_seq(&pool->room_taken, credits);
  tko__sub_seq(&pool->room_moving, 1); /* seq_cst: before the wake's load (see the essay) */
  wake_space_waiters(pool);
  return credits;
}

/* Settles every worker slot and takes every ring's unspent credits back;
 * returns the room that came back. */
static size_t gather(tko_pool *pool) {
  size_t back = 0;
  /* seq_cst: pairs with tko__give_room's CAS of room_slots, made before
   * its store of room_given: a slot whose give-back this waiter must see
   * is listed. */
  unsigned slots = tko__load_seq(&pool->room_slots);
  for (unsigned i = 0; i < slots; i++) back += settle(pool, &pool->slots[i]);
  /* seq_cst: a waiter's half of the lease's Dekker pair takes in a ring
   * claimed just before its lease (the claim's store is seq_cst). */
  unsigned rings = tko__load_seq(&pool->rings.count);
  for (unsigned i = 0; i < rings; i++) {
    tko__ring *r = pool->rings.ring[i];
    if (tko__load_seq(&r->credits)) back += take_back(pool, r);
  }
  return back;
}

/* Spends k of ring r's credits, if it holds that many. Relaxed: a count
 * only; the owner's spend and a reclaim meet in the RMWs' order on this
 * word. */
static bool spend_credits(tko__ring *r, size_t k) {
  size_t c = tko__load_relaxed(&r->credits);
  while (c >= k)
    if (tko__cas_relaxed(&r->credits, &c, c - k)) return true;
  return false;
}

/* Takes room for k tasks: from the calling thread's credits, else from
 * room_taken, with a lease if the thread has a ring. */
static bool try_take(tko_pool *pool, size_t k) {
  tko__ring *r = tko__rings_mine(&pool->rings);
  if (r && spend_credits(r, k)) return true;
  size_t cap = pool->opts.queue_capacity, lease;
  size_t taken = tko__load_relaxed(&pool->room_taken); /* the CAS checks it */
  do {
    if (taken + k > cap) return false;
    lease = r ? chunk_size(cap - taken - k, tko__load_relaxed(&pool->rings.count)) : 0;
  } while (!tko__cas_seq(&pool->room_taken, &taken, taken + k + lease));
  if (lease) {
    admit_seam(TKO__ADMIT_LEASED);
    tko__add_seq(&r->credits, lease); /* seq_cst: a Dekker pair (see the essay) */
    wake_space_waiters(pool);
  }
  return true;
}

/* Sleeps until k tasks may fit (0: look again), or, until_moved, until no
 * room is on its way (0), or the pool closes (-ESHUTDOWN) or the deadline
 * (tko__now_ns; UINT64_MAX: none) passes (-ETIMEDOUT). Holds nothing while
 * it sleeps, nor before: the event count of the essay. */
static int wait_for_room(tko_pool *pool, size_t k, bool until_moved, uint64_t deadline) {
  int rc = 0;
  tko__add_seq(&pool->space_waiters, 1); /* seq_cst: the waiter's half of the Dekker pairs */
  for (;;) {
    /* seq_cst: read before the look; pairs with the bump in
     * wake_space_waiters and tko__admit_close (see the essay). */
    unsigned seq = tko__load_seq(&pool->space_seq);
    (void)gather(pool); /* what comes back wakes the other waiters too */
    /* seq_cst, the three: the waiter's half of the Dekker pairs (the
     * essay) with the subtractions of room_taken and room_moving before
     * wake_space_waiters' load, and with close_pool's store of closing
     * (lifecycle.c) before tko__admit_close's bump. */
    if (tko__load_seq(&pool->room_taken) + k <= pool->opts.queue_capacity) break;
    if (until_moved && !tko__load_seq(&pool->room_moving)) break;
    if (tko__load_seq(&pool->closing) || tko__pool_refusing(pool)) {
      rc = -ESHUTDOWN;
      break;
    }
    uint64_t now = deadline == UINT64_MAX ? 0 : tko__now_ns();
    if (now >= deadline) {
      rc = -ETIMEDOUT;
      break;
    }
    admit_seam(TKO__ADMIT_ASLEEP);
    tko__word_wait(&pool->space_seq, seq, deadline == UINT64_MAX ? UINT64_MAX : deadline - now);
  }
  tko__sub_seq(&pool->space_waiters, 1);
  return rc;
}

int tko__admit(tko_pool *pool, size_t k, long timeout_ms, tko_full_policy policy, bool *gated) {
  *gated = false;
  if (!pool->opts.queue_capacity) return TKO__ADMITTED;
  /* Closed: -ESHUTDOWN before any other answer, a refusal for want of
   * room or a run on the caller included (engine.h: tko__pool_refusing). */
  if (tko__pool_refusing(pool)) return -ESHUTDOWN; /* even a batch that never fits */
  if (k > pool->opts.queue_capacity) /* could never fit */
    return policy == TKO_FULL_CALLER_RUNS ? TKO__RUN_HERE : -EAGAIN;
  uint64_t deadline = UINT64_MAX; /* none; a timeout past ~290 years is none too */
  if (timeout_ms >= 0 && (uint64_t)timeout_ms < UINT64_MAX / 4000000u)
    deadline = tko__now_ns() + (uint64_t)timeout_ms * 1000000u;
  while (!try_take(pool, k)) {
    if (gather(pool)) continue;
    /* Room another thread is settling or taking back is on its way: wait
     * for it (asleep; the move's end wakes us) rather than refuse. A
     * worker of the pool waits for nothing, neither room its own queue's
     * tasks hold nor another thread's move. seq_cst: after the gather. */
    bool moving = tko__load_seq(&pool->room_moving) != 0;
    bool worker = tko__current_pool == pool;
    if (!moving || worker) {
      if (try_take(pool, k)) break;
      if (tko__load_relaxed(&pool->closing)) return -ESHUTDOWN;
      switch (policy) {
      case TKO_FULL_REJECT: return -EAGAIN;
      case TKO_FULL_CALLER_RUNS:
        /* It waited for a move before: out of the gate again, since the
         * caller runs the task in a gate entry of its own (engine.h). */
        if (*gated) tko__gate_leave(pool);
        *gated = false;
        return TKO__RUN_HERE;
      default: break;
      }
      if (worker) return -EAGAIN; /* a worker must not wait on itself */
    }
    if (!*gated) {
      int rc = tko__gate_enter(pool);
      if (rc) return rc;
      *gated = true;
    }
    bool blocks = policy == TKO_FULL_BLOCK;
    int rc = wait_for_room(pool, k, moving && !blocks, blocks ? deadline : UINT64_MAX);
    if (rc) return rc;
  }
  return TKO__ADMITTED;
}
