/* SPDX-License-Identifier: MIT */
/* The completion queue: a bounded MPMC ring of completions by value plus a
 * readiness descriptor (see taskorch/completion.h).
 *
 * The ring is Vyukov's bounded MPMC queue: each slot carries a sequence
 * number. A slot at position pos is free for a poster when seq == pos, and
 * holds a completion for a drainer when seq == pos + 1. Posters claim a
 * position by CAS on tail, write the completion, then publish it by storing
 * seq = pos + 1 (release); drainers claim by CAS on head, copy it out, then
 * free the slot for the next lap by storing seq = pos + capacity (release).
 * The CAS on each end gives every position to exactly one poster and one
 * drainer, so each accepted completion is delivered exactly once. A poster
 * that finds its slot not yet freed from the last lap (seq < pos) reports
 * the ring full.
 *
 * Why the descriptor cannot stay quiet while a completion waits (libuv's
 * uv_async_send uses the same flag): `signalled` says the descriptor has
 * been (or is being) made readable since the last drain began.
 *   poster:  publish the slot; if exchange(signalled, 1) was 0, signal fd.
 *   drainer: clear fd; exchange(signalled, 0); take until empty.
 * Both exchanges are RMWs on one word, so they are totally ordered. If a
 * poster's exchange comes after the drainer's, it read the drainer's 0 and
 * signals the descriptor after the drainer cleared it: the loop will come
 * back. If it comes before, the drainer's exchange reads a value from the
 * release sequence that the poster's exchange is part of, so it
 * synchronizes with it and the drainer sees the published slot. A slot the
 * drainer cannot reach yet (an earlier position claimed, not yet
 * published) is the same case for that earlier poster, whose exchange
 * follows its own publish: either it signals, or the drain sees its slot and
 * then this one. The descriptor may thus be readable with nothing left (a
 * completion another drain took, or a signal whose completion this drain
 * already took); a drain then finds nothing, which is harmless.
 *
 * Platform layer only (prim.h, atomics.h, mem.h): the queue knows nothing
 * of pools, so any thread may post. */
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "atomics.h"
#include "mem.h"
#include "prim.h"
#include "taskorch/completion.h"

typedef struct cq_slot {
  atomic_size_t seq; /* see the essay: pos free, pos + 1 full */
  tko_completion c;
} cq_slot;

struct tko_cq {
  /* Posters and drainers each write their own line. */
  TKO_CACHE_ALIGNED atomic_size_t tail; /* next position to post */
  TKO_CACHE_ALIGNED atomic_size_t head; /* next position to drain */
  TKO_CACHE_ALIGNED atomic_uint signalled;
  /* I: set at create. */
  TKO_CACHE_ALIGNED cq_slot *slots;
  size_t mask; /* capacity - 1, capacity a power of two */
  int fds[2];  /* tko__wakefd_open */
  const tko_allocator *alloc;
};

#define CQ_DEFAULT_CAPACITY 1024u

int tko_cq_create(tko_cq **out, size_t capacity, const tko_allocator *allocator) {
  if (!out) return -EINVAL;
  *out = NULL;
  if (capacity > TKO_MAX_CQ_CAPACITY || !tko__allocator_valid(allocator)) return -EINVAL;
  if (capacity == 0) capacity = CQ_DEFAULT_CAPACITY;
  size_t cap = 2; /* the sequence scheme needs two slots at least */
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
  for (size_t i = 0; i < cap; i++) atomic_init(&cq->slots[i].seq, i);
  atomic_init(&cq->tail, 0);
  atomic_init(&cq->head, 0);
  atomic_init(&cq->signalled, 0);
  *out = cq;
  return 0;
}

int tko_cq_fd(const tko_cq *cq) { return cq ? cq->fds[0] : -EINVAL; }

int tko_cq_post(tko_cq *cq, uint64_t id, int status, void *user) {
  if (!cq) return -EINVAL;
  size_t pos = tko__load_relaxed(&cq->tail);
  cq_slot *s;
  for (;;) {
    s = &cq->slots[pos & cq->mask];
    /* Acquire: pairs with the release in take_one that freed this slot, so
     * the drainer's copy-out happens before this overwrite. */
    size_t seq = tko__load_acquire(&s->seq);
    intptr_t dif = (intptr_t)(seq - pos);
    if (dif == 0) {
      if (tko__cas_seq(&cq->tail, &pos, pos + 1)) break; /* reloads pos on failure */
    } else if (dif < 0) {
      return -EAGAIN; /* last lap's completion not taken yet: full */
    } else {
      pos = tko__load_relaxed(&cq->tail); /* another poster took pos */
    }
  }
  s->c = (tko_completion){.id = id, .status = status, .user = user};
  /* Release: pairs with the acquire in take_one, which then sees c. */
  tko__store_release(&s->seq, pos + 1);
  /* seq_cst RMW after the publish: the essay's poster step. */
  if (tko__exchange_seq(&cq->signalled, 1) == 0) tko__wakefd_signal(cq->fds);
  return 0;
}

/* Takes the oldest published completion, if any. */
static bool take_one(tko_cq *cq, tko_completion *out) {
  size_t pos = tko__load_relaxed(&cq->head);
  cq_slot *s;
  for (;;) {
    s = &cq->slots[pos & cq->mask];
    /* Acquire: pairs with the release in tko_cq_post that published c. */
    size_t seq = tko__load_acquire(&s->seq);
    intptr_t dif = (intptr_t)(seq - (pos + 1));
    if (dif == 0) {
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
  tko__store_release(&s->seq, pos + cq->mask + 1);
  return true;
}

/* The essay's drainer step, before taking. */
static void drain_begin(tko_cq *cq) {
  tko__wakefd_clear(cq->fds);
  (void)tko__exchange_seq(&cq->signalled, 0);
}

/* A drain that stopped at its limit leaves the rest for the loop's next
 * round: the descriptor must say so. */
static void drain_end(tko_cq *cq, size_t n, size_t max) {
  if (n == max && tko__exchange_seq(&cq->signalled, 1) == 0) tko__wakefd_signal(cq->fds);
}

long tko_cq_drain(tko_cq *cq, tko_cq_fn fn, void *user, size_t max) {
  if (!cq || !fn) return -EINVAL;
  if (max == 0) max = cq->mask + 1;
  drain_begin(cq);
  size_t n = 0;
  tko_completion c;
  while (n < max && take_one(cq, &c)) {
    n++;
    fn(user, &c);
  }
  drain_end(cq, n, max);
  return (long)n;
}

long tko_cq_take(tko_cq *cq, tko_completion *out, size_t max) {
  if (!cq || !out || max == 0) return -EINVAL;
  drain_begin(cq);
  size_t n = 0;
  while (n < max && take_one(cq, &out[n])) n++;
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
