/* SPDX-License-Identifier: MIT */
/* The weighted priority queue: task items stored by value in one slab,
 * threaded into one FIFO list per distinct weight ("bucket"); a small binary
 * heap orders the non-empty buckets. Not thread-safe: the pool's queue lock
 * guards it. */
#ifndef TKO_QUEUE_H
#define TKO_QUEUE_H
/* Layering: extensions (lanes, coalescer) use the public API and the
 * platform layer only; CMake compiles them with TKO_EXTENSION. */
#ifdef TKO_EXTENSION
#error "an extension includes an engine or data-structure header"
#endif

#include <limits.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "taskorch.h"

/* The low bits of tko__item.ctx that tag what its record is (records are
 * 8-byte aligned); kind.h names the tags. */
#define TKO__CTX_TAGS ((uintptr_t)7)

/* One queued task, by value. */
typedef struct tko__item {
  tko_task_fn fn;
  void *arg;
  uintptr_t ctx;    /* 0, or a group / kind record tagged in its low bits */
  uint64_t id;      /* submit order; also the FIFO tie-break */
  uint64_t enq_ns;  /* submit time, when the pool measures times or ages */
  int weight;
  uint32_t next;    /* slab link: next in its bucket, or next free slot */
} tko__item;

typedef struct tko__bucket {
  int weight;
  uint32_t head, tail;  /* slab indices; head == TKO__NIL when empty */
  uint32_t heap_pos;    /* index in the heap, or TKO__NIL when not in it */
  /* The first `returned` items were pushed back (tko__queue_push_ordered);
   * every item after them came in by tko__queue_push. */
  uint32_t returned;
} tko__bucket;

#define TKO__NIL UINT32_MAX

typedef struct tko__queue {
  tko__item *items;       /* the slab */
  uint32_t items_cap, items_used; /* used: high-water mark of slots handed out */
  /* Free slots, reused FIFO: slots then cycle through the slab in the order
   * they were filled, so producer writes and worker reads stream through
   * memory sequentially and the hardware prefetcher hides the cross-core
   * transfer (LIFO reuse made every write a fresh cache miss). */
  uint32_t free_head, free_tail;
  size_t len;             /* items queued */

  tko__bucket *buckets;
  uint32_t buckets_cap, buckets_used, free_bucket; /* free list through head */
  uint32_t free_buckets;  /* length of that free list */
  uint32_t *heap;         /* bucket indices, highest priority first */
  uint32_t heap_len;

  uint32_t *table;        /* weight -> bucket, open addressing; TKO__NIL = empty */
  uint32_t table_cap;     /* a power of two */
  uint32_t table_used;    /* buckets in the table, empty ones included */
  uint32_t last_bucket;   /* the bucket the last push used: the common case */

  atomic_size_t slab_bytes; /* items_cap * item size, for lock-free stats */
  uint32_t initial_cap;     /* items_cap at init: what a trim goes back to */
  uint64_t aging_ns;      /* 0 = off; else one weight unit per aging_ns waited */
  /* Items whose ctx's low three bits equal this (0 = none) are popped
   * only alone: first in a pop, which then ends; a pop that already holds
   * items stops before one (the pool's owned tasks: lane runners,
   * coalescer sweeps; lifecycle.h says why). */
  uintptr_t alone_tag;
  const tko_allocator *alloc;
} tko__queue;

/* Grouping a big move by weight (the inbox's and the rings' drains): the
 * queue hands out slab slots in push order, so tasks pushed in submit
 * order interleave their weights and a worker popping one weight touches
 * a new cache line per task (a dependent load, each a miss once a deep
 * backlog is out of cache). Pushed weight by weight - in submit order
 * within each weight, which is all FIFO needs - each weight's tasks sit
 * side by side and pops stream (`probe_flood batch reused` with four
 * interleaved weights shows it). Only for a handful of weights, moves of
 * TKO__GROUPED_MIN to TKO__GROUPED_MAX tasks, and after a big move that
 * looked mixed: a tally pass on every drain is a cost bench_peers'
 * single-weight 4-producer case shows. */
enum { TKO__GROUPS_MAX = 8, TKO__GROUPED_MIN = 256, TKO__GROUPED_MAX = 1024 };

typedef struct tko__grouping {
  int weights[TKO__GROUPS_MAX];
  uint32_t count[TKO__GROUPS_MAX];
  uint8_t group[TKO__GROUPED_MAX];
  size_t groups, n;
} tko__grouping;

static inline void tko__grouping_start(tko__grouping *g) { g->groups = g->n = 0; }
/* Tallies the next item's weight (after tko__grouping_start); false
 * once there are more than TKO__GROUPS_MAX weights or TKO__GROUPED_MAX
 * items. */
bool tko__grouping_add(tko__grouping *g, int weight);
/* Fills order[0, n) with the items' indices, grouped by weight (in the
 * order the weights were first seen), in index order within each. */
void tko__grouping_order(const tko__grouping *g, uint16_t *order);

int tko__queue_init(tko__queue *q, size_t capacity, const tko_allocator *alloc);
void tko__queue_fini(tko__queue *q);
/* Makes room for n more items, so that the next n pushes cannot fail. */
int tko__queue_reserve(tko__queue *q, size_t n);
/* Makes room for k more distinct weights, so that pushes cannot fail for
 * want of a bucket (batch submit's all-or-nothing). */
int tko__queue_reserve_buckets(tko__queue *q, size_t k);
/* Whether weight has a bucket (queued items, or an empty bucket kept for
 * it): a push of that weight then needs none. */
bool tko__queue_has_bucket(const tko__queue *q, int weight);
/* Copies *item in. -ENOMEM (queue unchanged) if it could not grow. */
int tko__queue_push(tko__queue *q, const tko__item *item);
/* Copies *item in at its place by priority and id among the items of its
 * weight that were pushed back too, rather than at the tail: a task taken
 * and handed back (a worker that retires with part of its batch, or whose
 * recheck found a heavier task) goes back where it was. It never passes an
 * item that came in by tko__queue_push: one from its own submitting thread
 * came after it (it was taken from the head), and one from another thread
 * has no promised order with it; so the scan is at most as long as the
 * pushed-back items at the head of its weight, however deep the queue.
 * -ENOMEM (queue unchanged) if it could not grow. */
int tko__queue_push_ordered(tko__queue *q, const tko__item *item);
/* Moves up to max items, highest priority first, into out; returns how
 * many. An alone_tag item is only ever popped by itself. */
size_t tko__queue_pop(tko__queue *q, tko__item *out, size_t max);
/* True if q holds an item of higher priority than *item by weight (or by
 * its aged weight, with aging), not merely by id: a task that a take would
 * pick before *item even if *item were queued with its own id. */
bool tko__queue_outranks(const tko__queue *q, const tko__item *item);
/* The weight of q's highest-priority bucket, INT_MIN when q is empty (by
 * weight alone: a pool of several shards never ages). */
static inline int tko__queue_top_weight(const tko__queue *q) {
  return q->heap_len ? q->buckets[q->heap[0]].weight : INT_MIN;
}
/* The submit time of the oldest item of q's highest-priority bucket (its
 * head: a bucket is FIFO, and items pushed back go to its head in their
 * order), 0 when q is empty. */
static inline uint64_t tko__queue_top_enq_ns(const tko__queue *q) {
  return q->heap_len ? q->items[q->buckets[q->heap[0]].head].enq_ns : 0;
}
/* True if a's highest-priority item goes before b's; both non-empty. */
bool tko__queue_top_before(const tko__queue *a, const tko__queue *b);
/* Trimming (giving a burst's memory back): whether the slab is larger than
 * at init (a lock-free hint), and, while the queue is empty, a swap of the
 * slab for *fresh, a new one of initial_cap items: true and *fresh, *bytes
 * then hold the old slab and its size, for the caller to free outside its
 * lock; false, with nothing changed, if the queue holds items or is no
 * larger than at init. */
bool tko__queue_oversized(const tko__queue *q);
size_t tko__queue_initial_bytes(const tko__queue *q);
bool tko__queue_swap_slab(tko__queue *q, void **fresh, size_t *bytes);
/* Moves up to max items whose ctx equals ctx into out, wherever they are
 * queued (cancelling a group); returns how many. O(queued). */
size_t tko__queue_remove_ctx(tko__queue *q, uintptr_t ctx, tko__item *out, size_t max);
/* Moves the item with ctx and the largest id (the newest of a submitting
 * thread's) from the bucket that pops next into *out; false if that
 * bucket holds none. O(that bucket). */
bool tko__queue_remove_newest_top(tko__queue *q, uintptr_t ctx, tko__item *out);

#endif
