/* SPDX-License-Identifier: MIT */
/* The inbox: a bounded multi-producer ring that submitters write tasks into
 * without taking a queue lock. It serves pools of one worker and no elastic
 * ones (its one tail orders every submit) and the threads past a pool's
 * submit rings (ring.h). Workers, holding shard 0's lock, move what has
 * been published into that shard's weighted queue before they pick the
 * best task, so priority order there is exact among everything published
 * so far.
 *
 * Why: with one lock for submit and take, the producer would wait for a
 * worker holding the lock while it copies a batch of cold items. Here a
 * submit is one CAS on the tail (signal.c: step (1')), a 40-byte store
 * into the next slot (sequential, so prefetched) and a release store of
 * its seq; the lock is the workers' business.
 *
 * Positions: tail counts positions handed out (its top bit marks the inbox
 * closed), head is the first position not yet done with. A slot is
 * published when its seq equals its position + 1. A reservation is only
 * made when tail - head < capacity, so the slot it names is free: every
 * earlier position that used it is done.
 *
 * A submitter stopped between its reservation and its publish (preempted,
 * or in a debugger) holds back nobody else's tasks. A drain moves every
 * published slot it sees and skips the holes; a slot it moves past a hole
 * is marked done in its seq (TKO__INBOX_MOVED), and head advances only over
 * the contiguous run of done positions, so the stopped reservation keeps
 * just its own slot. When head, stuck at such a hole, leaves no room, a
 * submitter does not wait either: under the queue lock it claims its
 * positions on the tail past the ring and puts its tasks straight into the
 * weighted queue (tko__inbox_claim). Positions from head + capacity up to
 * tail can only be such claims: a reservation is always below head +
 * capacity. The lock holder marks each one done as head's window reaches
 * it (or jumps over the last claim whole).
 *
 * Ids: a task's id is its position + 1, claims included: unique, gap-free
 * and in the order positions were handed out. Order: a drain moves, in
 * position order, the published slots below the tail it read; a submit that
 * returned before another submit began published before that one took its
 * position, and so is moved no later than it (same drain, lower position,
 * or an earlier drain); a claim drains first. So tasks of one submitting
 * thread stay FIFO within a weight, and so do tasks whose submits are
 * ordered by happens-before. A batch becomes movable at once, when its
 * first slot is published (tko__inbox_publish_batch), so a drain that
 * skips one of its slots as a hole cannot move a later one of it. A
 * stopped submitter's task is ordered only
 * from its publish on: tasks submitted after its reservation may run
 * before it. */
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
/* A slot's seq once the drain moved it past a hole, or once its position,
 * claimed past the ring, came inside head's window: never position + 1. */
#define TKO__INBOX_MOVED ((uint64_t)1 << 63)
/* A batch's slots after its first (its leader) carry this bit in seq once
 * written: they count as published only once the leader has been moved
 * (tko__inbox_publish_batch). */
#define TKO__INBOX_FOLLOWER ((uint64_t)1 << 62)
/* tko__inbox_claim: the ring has room for the tasks; reserve instead. */
#define TKO__INBOX_ROOM 1

typedef struct tko__inbox_slot {
  atomic_uint_fast64_t seq; /* position + 1 once published (| TKO__INBOX_FOLLOWER) */
  tko_task_fn fn;
  void *arg;
  uintptr_t ctx;
  uint64_t enq_ns;
  int weight;
  /* A follower's distance back to its batch's leader. Atomic (relaxed):
   * tko__inbox_ready reads it without the lock, and the slot may be
   * reused meanwhile (its seq then no longer matches, and the value is
   * ignored). */
  _Atomic uint32_t lead;
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
  /* The last claim past the ring, [claim_begin, claim_end): the queue
   * lock holder's, written only by a claim. */
  uint64_t claim_begin, claim_end;
} tko__inbox;

int tko__inbox_init(tko__inbox *in, uint32_t capacity, const tko_allocator *alloc);
void tko__inbox_fini(tko__inbox *in, const tko_allocator *alloc);

/* Test seam: when set, a submit calls it between its reservation and its
 * publish (published false), and again between its publish and its
 * wake-up (published true), with the first position it reserved (a test
 * parks a submitter there). NULL outside tests: one relaxed load of a
 * line nobody writes. */
#ifdef TKO_TEST_SEAMS
extern void (*_Atomic tko__test_publish_window)(uint64_t pos, bool published);
#endif

/* Reserves n consecutive positions (n <= capacity); -EAGAIN when there is
 * not room for all (the caller moves tasks out and retries, or claims),
 * -ESHUTDOWN when closed. */
static inline int tko__inbox_reserve(tko__inbox *in, uint64_t n, uint64_t *pos) {
  /* The room check below reads this line and the CAS then writes it: with
   * several submitters it is usually another core's (bench_peers'
   * 4-producer row shows the prefetch's worth). */
  tko__prefetch_for_write(&in->tail);
  uint64_t t = tko__load_relaxed(&in->tail);
  for (;;) {
    if (t & TKO__INBOX_CLOSED) {
      /* Acquire: the close's seq_cst OR came after the pool's state
       * (engine.h: tko__pool_refusing), which this thread then sees. */
      (void)tko__load_acquire(&in->tail);
      return -ESHUTDOWN;
    }
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
    /* seq_cst: step (1') of signal.c's essay (a worker about to sleep
     * re-reads the tail); and a drain that reads this tail then also sees
     * every publish that happened before this reservation - the FIFO
     * argument above. */
    if (tko__cas_seq(&in->tail, &t, t + n)) break;
  }
  *pos = t;
  return 0;
}

/* Publishes one reserved slot. A release store, not seq_cst: the
 * reservation's CAS was the submit's step (1') (signal.c), and a worker
 * that sees this slot still unpublished does not rely on this submit to
 * wake it (it polls beside the hole). A seq_cst store here cost plain
 * submits a fence each (`benchmarks/ab_peers.sh` shows the cost). */
static inline void tko__inbox_publish(tko__inbox *in, uint64_t pos, tko_task_fn fn, void *arg,
                                      uintptr_t ctx, int weight, uint64_t enq_ns) {
  tko__inbox_slot *s = &in->slots[pos & in->mask];
  s->fn = fn;
  s->arg = arg;
  s->ctx = ctx;
  s->weight = weight;
  s->enq_ns = enq_ns;
  tko__store_relaxed(&s->lead, 0);
  tko__store_release(&s->seq, pos + 1); /* pairs with the acquire in tko__inbox_drain */
}

/* Publishes a batch of n reserved slots from pos so that no drain moves a
 * later one before an earlier one: the followers (pos + 1 on) first,
 * marked TKO__INBOX_FOLLOWER, then the leader, whose publish makes the
 * batch movable. Published one by one, a drain that read slot k still
 * empty, skipped it as a hole and then read slot k + 1 published moved
 * k + 1 first (tests: inbox_order/concurrent_batches_keep_each_threads_order).
 * Release, each: pairs with the drain's acquire loads of seq. */
static inline void tko__inbox_publish_batch(tko__inbox *in, uint64_t pos, const tko_task *tasks,
                                            size_t n, uintptr_t ctx, uint64_t enq_ns) {
  for (size_t i = n; i-- > 0;) {
    tko__inbox_slot *s = &in->slots[(pos + i) & in->mask];
    s->fn = tasks[i].fn;
    s->arg = tasks[i].arg;
    s->ctx = ctx;
    s->weight = tasks[i].weight;
    s->enq_ns = enq_ns;
    tko__store_relaxed(&s->lead, (uint32_t)i);
    tko__store_release(&s->seq, (pos + i + 1) | (i ? TKO__INBOX_FOLLOWER : 0));
  }
}

/* Positions handed out so far (the submitted count), closed bit masked.
 * seq_cst, as the reservation's CAS (tko__inbox_reserve): read after the
 * finished counts (pool.c: pool_is_idle), so a task seen finished is seen
 * reserved. */
static inline uint64_t tko__inbox_reserved(tko__inbox *in) {
  return tko__load_seq(&in->tail) & ~TKO__INBOX_CLOSED;
}

/* True if some published task waits to be moved (a worker about to sleep
 * asks: tko__look_seq). A reservation not yet published does not count.
 * Reads up to a ring's worth of slots while a hole holds head. */
bool tko__inbox_ready(tko__inbox *in);

/* A searching worker's hint (relaxed): the newest reservation is published
 * and head is behind it. tko__inbox_ready decides before a sleep. */
static inline bool tko__inbox_ready_hint(tko__inbox *in) {
  uint64_t t = tko__load_relaxed(&in->tail) & ~TKO__INBOX_CLOSED;
  return t != tko__load_relaxed(&in->head) &&
         (tko__load_relaxed(&in->slots[(t - 1) & in->mask].seq) & ~TKO__INBOX_FOLLOWER) == t;
}

/* True when every position handed out is done with: none reserved and
 * unpublished, none published and unmoved (seq_cst: shutdown's "nothing
 * left" - a reservation made before the close is still to come). */
static inline bool tko__inbox_settled(tko__inbox *in) {
  return (tko__load_seq(&in->tail) & ~TKO__INBOX_CLOSED) == tko__load_seq(&in->head);
}

/* Closes the inbox: reservations after this fail with -ESHUTDOWN; those made
 * before it are published by their submitters and drained as usual. */
static inline void tko__inbox_close(tko__inbox *in) {
  /* seq_cst (a release): pairs with the acquire loads of a refused
   * reservation or claim (tko__inbox_reserve; inbox.c: tko__inbox_claim),
   * which then see the pool's state (engine.h: tko__pool_refusing). */
  atomic_fetch_or_explicit(&in->tail, TKO__INBOX_CLOSED, memory_order_seq_cst);
}

/* Moves the published tasks it finds, in position order, into q (held
 * ones, tagged by held_tag in ctx, into hq), skipping reservations not yet
 * published; never waits. Caller holds the queue lock. Returns 0, or
 * -ENOMEM if a queue could not grow (the rest stay). */
int tko__inbox_drain(tko__inbox *in, tko__queue *q, tko__queue *hq, uintptr_t held_tag);

/* Whether n more positions fit in the ring now (a hint for the queue lock's
 * holder, which alone moves head). */
static inline bool tko__inbox_has_room(tko__inbox *in, uint64_t n) {
  uint64_t t = tko__load_relaxed(&in->tail) & ~TKO__INBOX_CLOSED;
  return n <= in->mask + 1 && t + n - tko__load_relaxed(&in->head) <= in->mask + 1;
}

/* For a submit that finds no room: claims n positions on the tail past the
 * ring, for tasks the caller puts straight into the queue (ids pos + 1 on).
 * Caller holds the queue lock and drained just before. Returns 0,
 * TKO__INBOX_ROOM when n fits in the ring now (reserve instead), or
 * -ESHUTDOWN. */
int tko__inbox_claim(tko__inbox *in, uint64_t n, uint64_t *pos);

#endif
