/* SPDX-License-Identifier: MIT */
/* The inbox: a bounded multi-producer ring that submitters write tasks into
 * without taking the queue lock. Workers, holding the queue lock, move what
 * has been published into the weighted queue before they pick the best
 * task, so priority order is exact among everything submitted so far.
 *
 * Why: with one lock for submit and take, a worker holding the lock while it
 * copies a batch of cold items made the producer wait for it; on a 2-core
 * machine that was most of the cost per task. Here a submit is one CAS on
 * the tail, a 40-byte store into the next slot (sequential, so prefetched)
 * and a release store; the lock is the workers' business.
 *
 * Positions: tail counts reservations (its top bit marks the inbox closed),
 * head counts slots moved out. A slot is published when its seq equals its
 * position + 1; a reservation is only made when tail - head < capacity, so
 * the slot it names has already been moved out. A task's id is its position
 * + 1: unique, gap-free and in submit order. */
#ifndef TKO_INBOX_H
#define TKO_INBOX_H
/* Layering: extensions (lanes, coalescer) use the public API and the
 * platform layer only; CMake compiles them with TKO_EXTENSION. */
#ifdef TKO_EXTENSION
#error "an extension includes an engine or data-structure header"
#endif

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>

#include "atomics.h"
#include "queue.h"
#include "taskorch.h"

#define TKO__INBOX_CLOSED ((uint64_t)1 << 63)

typedef struct tko__inbox_slot {
  atomic_uint_fast64_t seq; /* position + 1 once published */
  tko_task_fn fn;
  void *arg;
  uintptr_t ctx;
  uint64_t enq_ns;
  int weight;
} tko__inbox_slot;

typedef struct tko__inbox {
  /* Written by every submitter; read by workers once per visit. */
  TKO_CACHE_ALIGNED atomic_uint_fast64_t tail;
  /* A head value some submitter read (never ahead of head): the room check
   * reads this, on the line it writes anyway, and reads head's line (which
   * every drain writes) only when the ring looks full. */
  atomic_uint_fast64_t head_seen;
  /* Written by the queue lock's holder only; read by submitters for room. */
  TKO_CACHE_ALIGNED atomic_uint_fast64_t head;
  TKO_CACHE_ALIGNED tko__inbox_slot *slots;
  uint64_t mask; /* capacity - 1; capacity is a power of two */
  /* The last big drain saw several weights (inbox.c); the drainer's, under
   * the queue lock, and written only when it changes, since submitters
   * read this line on every publish. */
  bool mixed_weights;
} tko__inbox;

int tko__inbox_init(tko__inbox *in, uint32_t capacity, const tko_allocator *alloc);
void tko__inbox_fini(tko__inbox *in, const tko_allocator *alloc);

/* Reserves n consecutive positions (n <= capacity); -EAGAIN when there is
 * not room for all (the caller moves tasks out and retries), -ESHUTDOWN when
 * closed. */
static inline int tko__inbox_reserve(tko__inbox *in, uint64_t n, uint64_t *pos) {
  /* The room check below reads this line and the CAS then writes it: with
   * several submitters it is usually another core's (4 producers, 2
   * workers, 12 alternating bench_peers runs a side: median ~95 -> ~90
   * ns/task). */
  tko__prefetch_for_write(&in->tail);
  uint64_t t = tko__load_relaxed(&in->tail);
  for (;;) {
    if (t & TKO__INBOX_CLOSED) return -ESHUTDOWN;
    /* Acquire, both: pairs with the release in tko__inbox_drain (directly,
     * or through the submitter whose release store of head_seen passed it
     * on), so the slots' previous tasks have been copied out before this
     * reservation reuses them. */
    uint64_t h = tko__load_acquire(&in->head_seen);
    if (t + n - h > in->mask + 1) {
      h = tko__load_acquire(&in->head);
      tko__store_release(&in->head_seen, h); /* a racing store may lower it: harmless */
      if (t + n - h > in->mask + 1) return -EAGAIN;
    }
    /* seq_cst: step (1') of signal.c's essay: the reservation is what a
     * worker about to sleep re-checks. */
    if (tko__cas_seq(&in->tail, &t, t + n)) break;
  }
  *pos = t;
  return 0;
}

static inline void tko__inbox_publish(tko__inbox *in, uint64_t pos, tko_task_fn fn, void *arg,
                                      uintptr_t ctx, int weight, uint64_t enq_ns) {
  tko__inbox_slot *s = &in->slots[pos & in->mask];
  s->fn = fn;
  s->arg = arg;
  s->ctx = ctx;
  s->weight = weight;
  s->enq_ns = enq_ns;
  /* Release: pairs with the acquire in tko__inbox_drain. */
  tko__store_release(&s->seq, pos + 1);
}

/* Reservations so far (the submitted count), with the closed bit masked. */
static inline uint64_t tko__inbox_reserved(tko__inbox *in) {
  return tko__load_seq(&in->tail) & ~TKO__INBOX_CLOSED;
}

/* True if some reservation has not been moved out yet. seq_cst: step (2)
 * of signal.c's essay when a worker re-checks before sleeping. */
static inline bool tko__inbox_pending(tko__inbox *in) {
  return (tko__load_seq(&in->tail) & ~TKO__INBOX_CLOSED) != tko__load_seq(&in->head);
}

/* Closes the inbox: reservations after this fail with -ESHUTDOWN; those made
 * before it are published by their submitters and drained as usual. */
static inline void tko__inbox_close(tko__inbox *in) {
  atomic_fetch_or_explicit(&in->tail, TKO__INBOX_CLOSED, memory_order_seq_cst);
}

/* Moves published tasks, in position order, into q (async ones, tagged by
 * async_tag in ctx, into aq). Caller holds the queue lock. Waits (yielding)
 * for a submitter that reserved but has not yet published. Returns 0, or
 * -ENOMEM if a queue could not grow (the rest stay). */
int tko__inbox_drain(tko__inbox *in, tko__queue *q, tko__queue *aq, uintptr_t async_tag);

#endif
