/* SPDX-License-Identifier: MIT */
/* Submit rings: each submitting thread's own inbox. The shared inbox
 * (inbox.h) has one tail that every submit CASes: on many cores each task
 * then moves that line between cores once, which caps the pool whatever
 * the core count (benchmarks/MODEL.md, audit_sharing). Here a
 * thread claims a ring of its own on its first submit to a pool and keeps
 * it; a submit writes its slots and publishes them with one CAS on its own
 * ring's tail, a line no other submitter writes. The queue lock's holder
 * moves every ring's published tasks into the weighted queue, as it moves
 * the shared inbox's (tko__rings_drain).
 *
 * One producer, one consumer: only the owner writes slots and advances the
 * tail (a shutdown only sets its closed bit); only the lock holder reads
 * slots and advances head. Nothing is visible before the tail's CAS, so a
 * submitter stopped anywhere in a submit (preempted, in a debugger) holds
 * back no task but its own: there are no holes, and it holds no lock.
 *
 * A ring is never full: it is a chain of segments of TKO__RING_CAPACITY
 * slots. The owner that reaches the end of its segment links the next one
 * (a segment the drains gave back, or a new allocation) before it
 * publishes a position in it; the lock holder follows the link once it
 * has moved the whole segment, and gives that segment back to the owner
 * as a spare. A backlog in a ring thus costs memory like a backlog in the
 * queue: kept for the next burst (a steady state allocates nothing), and
 * given back by a trim (tko__rings_trim). A submitter never waits for
 * room or takes the queue lock to make it
 * (tests/stress/test_stalled_submit.c).
 *
 * Order: a ring moves in position order, so one thread's tasks stay FIFO
 * within a weight. Tasks of different threads are moved ring by ring, so
 * equal weights from different threads start in no promised order, even
 * when one submit returned before the other began. A pool made with one
 * worker and no elastic ones, whose order is exact, therefore keeps the
 * shared inbox for every submit (rings off): its tail orders them all,
 * and one worker is that pool's bottleneck, not the tail.
 *
 * Ids: a ring's task has id TKO__RING_ID | index << 52 | position + 1:
 * unique in the pool, increasing per thread, consecutive in a batch.
 * Inbox ids stay below 2^62 and side tasks' have the top bit.
 *
 * Claims: at most TKO__RINGS_MAX rings per pool, allocated on first use
 * (not per task) and kept until destroy. A ring's owner is a token, the
 * address of a thread-local variable: a thread that starts after another
 * ended may get the same address, and with it the ring (its tasks were all
 * published or never visible): it reads the owner's fields (wseg) after an
 * acquire load of the tail, whose last publish released them. Threads past
 * the limit use the shared inbox. */
#ifndef TKO_RING_H
#define TKO_RING_H
#ifdef TKO_EXTENSION
#error "an extension includes an engine or data-structure header"
#endif

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "atomics.h"
#include "queue.h"
#include "taskorch.h"
#include "witness.h"

#define TKO__RING_CAPACITY 1024u /* slots per segment (40 bytes each) */
#define TKO__RINGS_MAX 64u
#define TKO__RING_CLOSED ((uint64_t)1 << 63)
#define TKO__RING_ID ((uint64_t)1 << 62)
#define TKO__RING_ID_SHIFT 52

/* Payload fields (atomics.h: tko__load_payload): a stage may read a slot
 * while its owner rewrites it. */
typedef struct tko__ring_slot {
  _Atomic(tko_task_fn) fn;
  _Atomic(void *) arg;
  atomic_uintptr_t ctx;
  atomic_uint_fast64_t enq_ns;
  atomic_int weight;
} tko__ring_slot;

/* A segment: positions [base, base + TKO__RING_CAPACITY). */
typedef struct tko__ring_seg {
  /* The next segment: written by the owner before it publishes a position
   * there (the tail's CAS orders it for the drain); while the segment is
   * spare, the next spare. */
  _Atomic(struct tko__ring_seg *) next;
  /* Written by the owner as it links the segment; relaxed everywhere: a
   * stage may read it while the owner relinks the segment. */
  atomic_uint_fast64_t base;
  void *raw; /* the allocation (the segment is aligned inside it) */
  TKO_CACHE_ALIGNED tko__ring_slot slots[TKO__RING_CAPACITY];
} tko__ring_seg;

typedef struct tko__ring {
  /* Positions published (the owner's CAS) and the closed bit (shutdown);
   * read by drains. */
  TKO_CACHE_ALIGNED atomic_uint_fast64_t tail;
  tko__ring_seg *wseg; /* owner only: where it wrote last (or the first) */
  uint64_t waited_in_vain; /* owner only: head when its last wait for room ran out */
  const tko_allocator *alloc; /* I: segments' */
  /* Room in a bounded queue this thread leased and has not spent (admit.c):
   * the owner spends it; a submitter that finds the queue full takes it
   * back. Its own line, so that a take-back leaves the tail's line to its
   * writer. */
  TKO_CACHE_ALIGNED atomic_size_t credits;
  /* Segments the drains gave back, and those the owner took from them and
   * has not used yet: lists through next that the owner or a trim takes
   * whole (exchange: no ABA). */
  TKO_CACHE_ALIGNED _Atomic(tko__ring_seg *) spare;
  _Atomic(tko__ring_seg *) kept;
  atomic_uint segs;       /* segments alive (a gauge) */
  /* The first position not yet moved, and its segment: written by the
   * queue lock holder, rseg before head (release), and read by stages. */
  TKO_CACHE_ALIGNED atomic_uint_fast64_t head;
  _Atomic(tko__ring_seg *) rseg;
  /* The last big drain looked mixed (queue.h: tko__grouping): the lock
   * holder's, beside head, which it writes anyway; a stage reads it as a
   * hint (relaxed). */
  atomic_bool mixed_weights;
  const void *owner; /* written under the set's mu, read by lookups */
  unsigned shard;    /* I: the pool's shard it drains into (index mod shards) */
  uint64_t id_base;  /* I: TKO__RING_ID | index << TKO__RING_ID_SHIFT */
  void *raw;         /* the allocation (the ring is aligned inside it) */
} tko__ring;

typedef struct tko__rings {
  tko__ring *ring[TKO__RINGS_MAX]; /* [0, count) set, each once */
  /* Rings claimed: stored seq_cst after ring[count] is set (its release
   * half pairs with the readers' acquire loads; seq_cst so that a worker's
   * re-check before it sleeps, which loads it seq_cst, sees a ring its
   * submitter claimed before the publish that did not wake it: step (2)
   * of signal.c's essay). */
  atomic_uint count;
  tko__mutex mu;      /* TKO__RANK_RINGS, a leaf: claims and the close */
  bool closed;        /* under mu */
  bool off;           /* I: every submit goes through the shared inbox */
  unsigned shards;    /* I: ring i drains into shard i mod shards */
  uint64_t uid;       /* I: unique per pool ever made in this process */
  const tko_allocator *alloc;
} tko__rings;

int tko__rings_init(tko__rings *rs, bool off, unsigned shards, const tko_allocator *alloc);
void tko__rings_fini(tko__rings *rs);

/* The calling thread's ring in rs, claimed on its first call; NULL when
 * rings are off, every ring is taken, or one could not be allocated (the
 * caller then uses the shared inbox, and keeps to it while this pool is
 * the last one it looked up). */
tko__ring *tko__rings_mine(tko__rings *rs);

/* The owner's segment for position pos, at or after seg (which holds a
 * position at or before pos): following the links, and linking a spare or
 * new segment at the end; NULL if none could be allocated (nothing is
 * lost: linked segments past the tail wait for the next write). */
tko__ring_seg *tko__ring_seg_grow(tko__ring *r, tko__ring_seg *seg, uint64_t pos);
static inline tko__ring_seg *tko__ring_seg_for(tko__ring *r, tko__ring_seg *seg, uint64_t pos) {
  /* Relaxed: the owner wrote it (tko__ring_seg_grow). */
  if (pos - tko__load_relaxed(&seg->base) < TKO__RING_CAPACITY) return seg;
  return tko__ring_seg_grow(r, seg, pos);
}

static inline void tko__ring_write(tko__ring_seg *seg, uint64_t pos, tko_task_fn fn, void *arg,
                                   uintptr_t ctx, int weight, uint64_t enq_ns) {
  tko__ring_slot *s = &seg->slots[pos - tko__load_relaxed(&seg->base)]; /* as above */
  TKO__AUDIT_PLAIN(STORE, s); /* a drain or a stage fetches it */
  tko__store_payload(&s->fn, fn);
  tko__store_payload(&s->arg, arg);
  tko__store_payload(&s->ctx, ctx);
  tko__store_payload(&s->weight, weight);
  tko__store_payload(&s->enq_ns, enq_ns);
}

/* Publishes positions [t, t + n), written before: 0, or -ESHUTDOWN if
 * the ring was closed (nothing published). seq_cst: the submit's step (1')
 * of signal.c's essay, as the shared inbox's reservation is; its release
 * half pairs with the drain's acquire load of the tail. The CAS is weak,
 * and may fail spuriously where it is load-linked/store-conditional: only
 * a failure that shows the closed bit refuses (only the owner moves the
 * tail; a shutdown only sets that bit). */
static inline int tko__ring_publish(tko__ring *r, uint64_t t, uint64_t n) {
  for (uint64_t seen = t; !tko__cas_seq(&r->tail, &seen, t + n); seen = t)
    if (seen & TKO__RING_CLOSED) {
      /* Acquire: a failed CAS loads relaxed; this pairs with the close's
       * seq_cst OR (tko__rings_close_shard), made after the pool's state,
       * which this thread then sees (engine.h: tko__pool_refusing), as the
       * inbox's refusal does (tko__inbox_reserve). */
      (void)tko__load_acquire(&r->tail);
      return -ESHUTDOWN;
    }
  return 0;
}

/* Closing (shutdown), in two steps: tko__rings_close_claims makes rings
 * claimed from now on born closed; tko__rings_close_shard closes the
 * rings of one shard. Publishes after that fail. */
void tko__rings_close_claims(tko__rings *rs);
void tko__rings_close_shard(tko__rings *rs, unsigned shard);

/* The stage: a drain's reads of slots, taken off the queue lock.
 *
 * A drain reads every slot it moves under its shard's lock, and those are
 * lines the slots' owners wrote: the holder fetches them one after another
 * while every other taker of the shard waits (benchmarks/MODEL.md: the
 * third gate of the sharing audit). So a worker about to take from a
 * shard first copies, without the lock, the first published slots of the
 * shard's rings, up to TKO__STAGE_MAX in all, in runs (entries) of
 * consecutive positions within one segment. Under the lock, the drain of
 * a ring takes a run's copies if the ring's head is where the run begins.
 * That is safe because the head moves only under the lock, and a slot is
 * rewritten only after a drain moved the head past its whole segment: an
 * unmoved head means the copied slots still hold what was published
 * there, and the tail's acquire load ordered those writes before the
 * copy. A run that does not begin at the head is dropped; its copies may
 * be torn (the payload atomics make such a read defined). A stage reaches
 * segments through rseg and the links without the lock, so a trim frees
 * no segment while a stage may be reading one (pool.c: tko__pool_trim
 * waits for the workers' stages). */
#define TKO__STAGE_MAX 256u /* slots: 12 KiB of copies a worker (pool.h: stage) */
#define TKO__STAGE_MIN_QUEUES 4u /* pools with fewer queues do not stage (pool.c) */
#define TKO__STAGE_ENTRIES 4u /* runs of copies: a ring's segments, or several rings */
/* Copies of consecutive positions of one ring, within one segment. */
typedef struct tko__stage_entry {
  const tko__ring *ring;
  uint64_t head;     /* the position of its first copy */
  unsigned first, n; /* its copies: item[first, first + n) */
  unsigned groups;   /* 0: in position order; else grouped by weight, as a
                        big drain pushes them (queue.h: tko__grouping) */
} tko__stage_entry;

typedef struct tko__ring_stage {
  unsigned entries, items; /* of at[] and item[] in use */
  tko__stage_entry at[TKO__STAGE_ENTRIES]; /* in ring order, a ring's in position order */
  tko__item item[TKO__STAGE_MAX];
} tko__ring_stage;

/* Fills st from the rings of shard `shard`, no lock held (see above);
 * held_tag as tko__rings_drain's. */
void tko__rings_stage(tko__rings *rs, unsigned shard, uintptr_t held_tag, tko__ring_stage *st);

/* Moves the published tasks of every ring of shard `shard`, in position
 * order, into q (held ones, tagged by held_tag, into hq), taking the
 * copies of st (or NULL) where they are current. Caller holds that
 * shard's lock. Returns 0, or -ENOMEM if a queue could not grow (the rest
 * stay). */
int tko__rings_drain(tko__rings *rs, unsigned shard, tko__queue *q, tko__queue *hq,
                     uintptr_t held_tag, const tko__ring_stage *st);

/* Whether any ring holds a published task not yet moved: seq_cst (a
 * worker about to sleep, step (2) of signal.c's essay), or relaxed (a
 * searching worker's hint). */
bool tko__rings_ready_seq(tko__rings *rs);
bool tko__rings_ready_hint(tko__rings *rs);
/* The relaxed hint for the rings of one shard. */
bool tko__rings_shard_ready_hint(tko__rings *rs, unsigned shard);
/* Frees the spare segments of every empty ring (tko_pool_trim); whether
 * there are any (a relaxed hint). */
void tko__rings_trim(tko__rings *rs);
bool tko__rings_trimmable(const tko__rings *rs);
/* Memory the rings' segments past each one's first hold (stats). */
size_t tko__rings_bytes(const tko__rings *rs);
/* Tasks ever published through the rings (seq_cst loads). */
uint64_t tko__rings_published(tko__rings *rs);

#endif
