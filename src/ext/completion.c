/* SPDX-License-Identifier: MIT */
/* The completion queue: a bounded MPMC ring of completions by value plus a
 * readiness descriptor (see taskorch/completion.h).
 *
 * The ring is Vyukov's bounded MPMC queue: each slot carries a sequence
 * number, counted in half-steps so that a ring of one slot works too. A
 * slot at position pos is free for a poster when seq == 2 pos, and holds a
 * completion for a drainer when seq == 2 pos + 1. Posters claim a position
 * by CAS on tail, write the completion, then publish it by storing
 * seq = 2 pos + 1 (release); drainers claim by CAS on head, copy it out,
 * then free the slot for the next lap by storing seq = 2 (pos + capacity)
 * (release). With whole steps (free pos, full pos + 1, freed pos +
 * capacity) a one-slot ring could not tell "full with pos" from "free for
 * pos + 1". The CAS on each end gives every position to exactly one poster
 * and one drainer, so each accepted completion is delivered exactly once,
 * however many drains run at once. A poster that finds its slot not yet
 * freed from the last lap (seq < 2 pos) reports the ring full.
 *
 * A drain's bound: after its exchange below, a drain reads tail once and
 * takes no position at or past it. Completions posted while it runs -
 * from its own callback or any other thread - wait for a later drain, so a
 * callback that posts cannot keep one drain going.
 *
 * Why the descriptor cannot stay quiet while a completion waits (libuv's
 * uv_async_send uses the same flag): `signalled` says the descriptor has
 * been (or is being) made readable since the last drain began.
 *   poster:  reserve; publish the slot; if exchange(signalled, 1) was 0,
 *            signal fd.
 *   drainer: clear fd; exchange(signalled, 0); end = tail; take in order
 *            while published and below end and under max; if it stopped
 *            at max, signal as a poster does.
 * The exchanges are RMWs on one word and seq_cst, as are the CAS on tail
 * and the drainer's read of it, so all lie in one total order S. Take a
 * completion c at position p, posted by P, and a drain D that does not
 * deliver it. Either D's exchange X_D comes before P's exchange X_P in S,
 * or after.
 *   (a) X_P after X_D. The first exchange after X_D in S reads X_D's 0,
 *       synchronizes with it, and its thread (a poster, or a drain that
 *       stopped at max) then signals: after D's clear. Every exchange
 *       after that one reads 1 until the next drain. So the descriptor is
 *       readable after D, and the loop comes back for c.
 *   (b) X_P before X_D. X_D reads from the release sequence X_P belongs
 *       to, so P's publish happens before D's takes: D sees c's slot.
 *       c lies below D's bound, since P's CAS on tail precedes X_P, so
 *       precedes D's read of tail. D then fails to deliver c only if
 *       another drain did (done), if D stopped at max (it signals: case
 *       (a) for its exchange), or if D stopped at an earlier position q
 *       whose poster H has reserved it and not yet published. Then X_H is
 *       after X_D: were it before, X_D would synchronize with it and D
 *       would see q published. So H, as it publishes, is case (a): the
 *       descriptor becomes readable, and the next drain delivers q, then c.
 * In the last case c waits, with the descriptor quiet, for as long as H
 * is stopped inside its post (preempted, or running a signal handler):
 * delivery keeps reservation order, so no drain can take c before q, and
 * the header says so. Re-arming the descriptor when a drain stops at an
 * unpublished slot would keep it readable instead, but the loop would
 * then spin - wake, drain nothing, wake again - for as long as H is
 * stopped, taking the CPU that H needs to finish; H's own exchange is the
 * cheaper signal and comes exactly when c can be taken. The descriptor may
 * thus be readable with nothing left (a completion another drain took, or
 * a signal whose completion this drain already took); a drain then finds
 * nothing, which is harmless.
 *
 * Platform layer only (prim.h, atomics.h, mem.h): the queue knows nothing
 * of pools, so any thread may post. */
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "atomics.h"
#include "mem.h"
#include "prim.h"
#include "seam.h"
#include "taskorch/completion.h"

typedef struct cq_slot {
  atomic_size_t seq; /* see the essay: 2 pos free, 2 pos + 1 full */
  tko_completion c;
} cq_slot;

struct tko_cq {
  /* Posters and drainers each write their own line. */
  TKO_CACHE_ALIGNED atomic_size_t tail; /* next position to post */
  TKO_CACHE_ALIGNED atomic_size_t head; /* next position to drain */
  TKO_CACHE_ALIGNED atomic_uint signalled;
  /* I: set at create. */
  TKO_CACHE_ALIGNED cq_slot *slots;
  size_t mask; /* capacity - 1, capacity a power of two (1 included) */
  int fds[2];  /* tko__wakefd_open */
  const tko_allocator *alloc;
};

#define CQ_DEFAULT_CAPACITY 1024u

/* A slot's seq when position pos may be posted into, and once it is. */
static size_t free_mark(size_t pos) { return 2 * pos; }
static size_t full_mark(size_t pos) { return 2 * pos + 1; }

int tko_cq_create(tko_cq **out, size_t capacity, const tko_allocator *allocator) {
  if (!out) return -EINVAL;
  *out = NULL;
  if (capacity > TKO_MAX_CQ_CAPACITY || !tko__allocator_valid(allocator)) return -EINVAL;
  if (capacity == 0) capacity = CQ_DEFAULT_CAPACITY;
  size_t cap = 1;
  while (cap < capacity) cap <<= 1;
  tko_cq *cq = tko__mem_alloc(allocator, sizeof *cq);
  if (!cq) return -ENOMEM;
  memset(cq, 0, sizeof *cq);
  cq->alloc = allocator;
  cq->mask = cap - 1;
  cq->slots = tko__mem_alloc(allocator, cap * sizeof *cq->slots);
  int rc = cq->slots ? tko__wakefd_open(cq->fds) : -ENOMEM;
  if (rc) {
    if (cq->slots) tko__mem_free(allocator, cq->slots);
    tko__mem_free(allocator, cq);
    return rc;
  }
  for (size_t i = 0; i < cap; i++) atomic_init(&cq->slots[i].seq, free_mark(i));
  atomic_init(&cq->tail, 0);
  atomic_init(&cq->head, 0);
  atomic_init(&cq->signalled, 0);
  *out = cq;
  return 0;
}

int tko_cq_fd(const tko_cq *cq) { return cq ? cq->fds[0] : -EINVAL; }

#ifdef TKO_TEST_SEAMS
/* A test seam (tests/unit/test_completion_window.c): called by a post
 * between reserving its slot and publishing it, where a preempted poster
 * holds up every completion reserved after its own. */
void (*_Atomic tko__test_cq_post_window)(void);
/* And by a take between finding a published completion and claiming it,
 * where another drain may claim it first. */
void (*_Atomic tko__test_cq_take_window)(void);
#endif

int tko_cq_post(tko_cq *cq, uint64_t id, int status, void *user) {
  if (!cq) return -EINVAL;
  size_t pos = tko__load_relaxed(&cq->tail);
  cq_slot *s;
  for (;;) {
    s = &cq->slots[pos & cq->mask];
    /* Acquire: pairs with the release in take_one that freed this slot, so
     * the drainer's copy-out happens before this overwrite. */
    size_t seq = tko__load_acquire(&s->seq);
    intptr_t dif = (intptr_t)(seq - free_mark(pos));
    if (dif == 0) {
      if (tko__cas_seq(&cq->tail, &pos, pos + 1)) break; /* reloads pos on failure */
    } else if (dif < 0) {
      return -EAGAIN; /* last lap's completion not taken yet: full */
    } else {
      pos = tko__load_relaxed(&cq->tail); /* another poster took pos */
    }
  }
  void (*window)(void) = TKO__SEAM(tko__test_cq_post_window);
  if (window) window();
  s->c = (tko_completion){.id = id, .status = status, .user = user};
  /* Release: pairs with the acquire in take_one, which then sees c. */
  tko__store_release(&s->seq, full_mark(pos));
  /* seq_cst RMW after the publish: the essay's poster step. */
  if (tko__exchange_seq(&cq->signalled, 1) == 0) tko__wakefd_signal(cq->fds);
  return 0;
}

/* Takes the oldest published completion below end, if any. */
static bool take_one(tko_cq *cq, tko_completion *out, size_t end) {
  size_t pos = tko__load_relaxed(&cq->head);
  cq_slot *s;
  for (;;) {
    /* The drain's bound (the essay); another drain may have taken past it. */
    if ((intptr_t)(end - pos) <= 0) return false;
    s = &cq->slots[pos & cq->mask];
    /* Acquire: pairs with the release in tko_cq_post that published c. */
    size_t seq = tko__load_acquire(&s->seq);
    intptr_t dif = (intptr_t)(seq - full_mark(pos));
    if (dif == 0) {
      void (*window)(void) = TKO__SEAM(tko__test_cq_take_window);
      if (window) window();
      if (tko__cas_seq(&cq->head, &pos, pos + 1)) break;
    } else if (dif < 0) {
      return false; /* empty, or its poster has not published yet */
    } else {
      pos = tko__load_relaxed(&cq->head); /* another drainer took pos */
    }
  }
  *out = s->c;
  /* Release: pairs with the acquire in tko_cq_post; frees the slot for the
   * poster one lap ahead. */
  tko__store_release(&s->seq, free_mark(pos + cq->mask + 1));
  return true;
}

/* The essay's drainer step, before taking: returns the drain's bound. */
static size_t drain_begin(tko_cq *cq) {
  tko__wakefd_clear(cq->fds);
  (void)tko__exchange_seq(&cq->signalled, 0);
  /* seq_cst, after the exchange: a post that reserves at or past this
   * bound exchanges after this drain did, so it signals (the essay). */
  return tko__load_seq(&cq->tail);
}

/* A drain that stopped at its limit leaves the rest for the loop's next
 * round: the descriptor must say so. */
static void drain_end(tko_cq *cq, size_t n, size_t max) {
  if (n == max && tko__exchange_seq(&cq->signalled, 1) == 0) tko__wakefd_signal(cq->fds);
}

long tko_cq_drain(tko_cq *cq, tko_cq_fn fn, void *user, size_t max) {
  if (!cq || !fn) return -EINVAL;
  if (max == 0) max = cq->mask + 1;
  size_t end = drain_begin(cq);
  size_t n = 0;
  tko_completion c;
  while (n < max && take_one(cq, &c, end)) {
    n++;
    fn(user, &c);
  }
  drain_end(cq, n, max);
  return (long)n;
}

long tko_cq_take(tko_cq *cq, tko_completion *out, size_t max) {
  if (!cq || !out || max == 0) return -EINVAL;
  size_t end = drain_begin(cq);
  size_t n = 0;
  while (n < max && take_one(cq, &out[n], end)) n++;
  drain_end(cq, n, max);
  return (long)n;
}

int tko_cq_destroy(tko_cq *cq) {
  if (!cq) return -EINVAL;
  /* Relaxed: no call may race with destroy, so both ends are settled. */
  if (tko__load_relaxed(&cq->head) != tko__load_relaxed(&cq->tail)) return -EBUSY;
  tko__wakefd_close(cq->fds);
  const tko_allocator *a = cq->alloc;
  tko__mem_free(a, cq->slots);
  tko__mem_free(a, cq);
  return 0;
}
