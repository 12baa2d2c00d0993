/* SPDX-License-Identifier: MIT */
/* The weighted priority queue (see queue.h).
 *
 * Why buckets: tasks usually carry a handful of distinct weights, so keeping
 * one FIFO list per weight makes push and pop O(1) for the common case and
 * O(log B) for B distinct weights queued, whatever the number of items; a
 * single heap of items would pay O(log n) cache misses per pop with a million
 * tasks waiting. FIFO order among equal weights falls out of the lists.
 *
 * Memory: items live in one slab grown by doubling (past 512 KiB, with the
 * default allocator, a huge-page mapping that grows without copying:
 * mem.h), and freed slots are reused FIFO (from the slab's start again
 * whenever the queue empties), so a steady stream of tasks allocates
 * nothing. After a burst the pool swaps an empty queue's slab for one of
 * its initial size (tko__queue_swap_slab: tko_pool_trim, or an idle
 * worker's decay in worker.c), so the burst's memory goes back. A bucket that empties stays in the weight table (a burst of one
 * weight usually comes back); empty buckets are purged when the table fills
 * to half, which bounds memory by the distinct weights queued at once and
 * keeps purging amortised O(1) without allocating.
 *
 * Aging (aging_ns > 0) orders items by weight*aging_ns - enq_ns, which is the
 * same order as "weight plus one unit per aging_ns waited" at any instant, so
 * no key ever changes while queued. Within a bucket items are in submit
 * order, hence in key order; a bucket's key is its head's, and the heap is
 * re-sifted only when a head leaves. Ties go to the lower id (FIFO). */
#include "invariant.h"
#include "queue.h"

#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include "heap.h"
#include "mem.h"

#define MIN_TABLE 16u

/* Free buckets are marked with heap_pos == FREE_MARK (never a real
 * position: the heap is far smaller than 2^32 - 2) and chained through head. */
#define FREE_MARK (TKO__NIL - 1)

static void forget_free_slots(tko__queue *q);

static bool bucket_in_table(const tko__bucket *b) { return b->heap_pos != FREE_MARK; }

/* The order's key, before the tie-break on id. 128 bits: a weight times the
 * aging period can overflow 64. __extension__ keeps a host's -Wpedantic
 * quiet, since an embedding host's flags reach these sources. */
__extension__ typedef __int128 order_key;

static order_key item_key(uint64_t aging_ns, const tko__item *it) {
  return aging_ns ? (order_key)it->weight * aging_ns - (order_key)it->enq_ns : it->weight;
}

static bool item_before(uint64_t aging_ns, const tko__item *ia, const tko__item *ib) {
  order_key ka = item_key(aging_ns, ia), kb = item_key(aging_ns, ib);
  return ka != kb ? ka > kb : ia->id < ib->id;
}

static bool bucket_before(const tko__queue *q, uint32_t a, uint32_t b) {
  const tko__bucket *ba = &q->buckets[a], *bb = &q->buckets[b];
  if (!q->aging_ns) return ba->weight > bb->weight; /* weights are distinct */
  return item_before(q->aging_ns, &q->items[ba->head], &q->items[bb->head]);
}

bool tko__queue_outranks(const tko__queue *q, const tko__item *item) {
  if (!q->heap_len) return false;
  const tko__item *top = &q->items[q->buckets[q->heap[0]].head];
  return item_key(q->aging_ns, top) > item_key(q->aging_ns, item);
}

bool tko__queue_top_before(const tko__queue *a, const tko__queue *b) {
  const tko__item *ia = &a->items[a->buckets[a->heap[0]].head];
  const tko__item *ib = &b->items[b->buckets[b->heap[0]].head];
  return item_before(a->aging_ns, ia, ib);
}

static void heap_place(tko__queue *q, uint32_t pos, uint32_t bucket) {
  q->heap[pos] = bucket;
  q->buckets[bucket].heap_pos = pos;
}

/* The bucket heap (heap.h): best head first. */
#define BUCKET_AT(q, pos) ((q)->heap[pos])
#define HEAP_LEN(q) ((q)->heap_len)
TKO__HEAP_DEFINE(heap, tko__queue, uint32_t, BUCKET_AT, heap_place, bucket_before, HEAP_LEN)

static uint32_t hash_weight(int weight, uint32_t cap) {
  uint32_t h = (uint32_t)weight * 0x9E3779B1u;
  return (h ^ (h >> 16)) & (cap - 1);
}

static void table_insert(tko__queue *q, uint32_t bucket) {
  uint32_t i = hash_weight(q->buckets[bucket].weight, q->table_cap);
  while (q->table[i] != TKO__NIL) i = (i + 1) & (q->table_cap - 1);
  q->table[i] = bucket;
  q->table_used++;
}

static uint32_t table_find(const tko__queue *q, int weight) {
  uint32_t i = hash_weight(weight, q->table_cap);
  for (;;) {
    uint32_t b = q->table[i];
    if (b == TKO__NIL || q->buckets[b].weight == weight) return b;
    i = (i + 1) & (q->table_cap - 1);
  }
}

/* Rebuilds the weight table at capacity cap with only the non-empty buckets;
 * the empty ones go back to the free list. */
static int table_rebuild(tko__queue *q, uint32_t cap) {
  if (cap != q->table_cap) {
    uint32_t *t = tko__mem_alloc(q->alloc, (size_t)cap * sizeof *t);
    if (!t) return -ENOMEM;
    tko__mem_free(q->alloc, q->table);
    q->table = t;
    q->table_cap = cap;
  }
  memset(q->table, 0xff, (size_t)cap * sizeof *q->table);
  q->table_used = 0;
  for (uint32_t b = 0; b < q->buckets_used; b++) {
    tko__bucket *bk = &q->buckets[b];
    if (!bucket_in_table(bk)) continue;
    if (bk->heap_pos != TKO__NIL) {
      table_insert(q, b);
    } else {
      bk->heap_pos = FREE_MARK;
      bk->head = q->free_bucket;
      q->free_bucket = b;
      q->free_buckets++;
    }
  }
  q->last_bucket = TKO__NIL;
  return 0;
}

/* Every slot is queued, on the free list or never used yet, so the room
 * left is simply capacity minus queued items. */
static int grow_items(tko__queue *q, size_t need) {
  if ((size_t)q->items_cap - q->len >= need) return 0;
  size_t cap = q->items_cap;
  while (cap - q->len < need) cap *= 2;
  if (cap >= TKO__NIL - 1) return -ENOMEM;
  tko__item *items = tko__mem_array_grow(q->alloc, q->items, (size_t)q->items_cap * sizeof *items,
                                         cap * sizeof *items);
  if (!items) return -ENOMEM;
  q->items = items;
  q->items_cap = (uint32_t)cap;
  /* Relaxed: a statistic; tko_pool_stats reads it without the lock. */
  atomic_store_explicit(&q->slab_bytes, cap * sizeof *items, memory_order_relaxed);
  return 0;
}

/* Makes sure k more buckets can be created without allocating. */
static int reserve_buckets(tko__queue *q, size_t k) {
  if (k > TKO__NIL / 8) return -ENOMEM;
  if ((q->table_used + k) * 2 > q->table_cap) {
    size_t cap = q->table_cap;
    while ((q->heap_len + k) * 4 > cap) cap *= 2;
    if (cap > TKO__NIL / 2) return -ENOMEM;
    int rc = table_rebuild(q, (uint32_t)cap);
    if (rc) return rc;
  }
  if (q->free_buckets + (size_t)(q->buckets_cap - q->buckets_used) >= k) return 0;
  size_t cap = q->buckets_cap;
  while (q->free_buckets + cap - q->buckets_used < k) cap *= 2;
  tko__bucket *b = tko__mem_realloc(q->alloc, q->buckets, cap * sizeof *b);
  if (!b) return -ENOMEM;
  q->buckets = b;
  uint32_t *h = tko__mem_realloc(q->alloc, q->heap, cap * sizeof *h);
  if (!h) return -ENOMEM; /* buckets grew, harmlessly; the next try reuses it */
  q->heap = h;
  q->buckets_cap = (uint32_t)cap;
  return 0;
}

int tko__queue_reserve_buckets(tko__queue *q, size_t k) { return reserve_buckets(q, k); }

bool tko__queue_has_bucket(const tko__queue *q, int weight) {
  return table_find(q, weight) != TKO__NIL;
}

bool tko__grouping_add(tko__grouping *g, int weight) {
  if (g->n == TKO__GROUPED_MAX) return false;
  size_t k = 0;
  while (k < g->groups && g->weights[k] != weight) k++;
  if (k == g->groups) {
    if (g->groups == TKO__GROUPS_MAX) return false;
    g->count[g->groups] = 0;
    g->weights[g->groups++] = weight;
  }
  g->group[g->n++] = (uint8_t)k;
  g->count[k]++;
  return true;
}

void tko__grouping_order(const tko__grouping *g, uint16_t *order) {
  uint32_t next[TKO__GROUPS_MAX];
  for (size_t k = 0, at = 0; k < g->groups; at += g->count[k++]) next[k] = (uint32_t)at;
  for (size_t i = 0; i < g->n; i++) order[next[g->group[i]]++] = (uint16_t)i;
}

int tko__queue_init(tko__queue *q, size_t capacity, const tko_allocator *alloc) {
  memset(q, 0, sizeof *q);
  q->alloc = alloc;
  if (capacity < 16) capacity = 16;
  if (capacity >= TKO__NIL / 2) return -EINVAL;
  q->items_cap = q->initial_cap = (uint32_t)capacity;
  q->free_head = q->free_tail = TKO__NIL;
  q->free_bucket = TKO__NIL;
  q->last_bucket = TKO__NIL;
  q->buckets_cap = 8;
  q->items = tko__mem_array_alloc(alloc, capacity * sizeof *q->items);
  q->buckets = tko__mem_alloc(alloc, q->buckets_cap * sizeof *q->buckets);
  q->heap = tko__mem_alloc(alloc, q->buckets_cap * sizeof *q->heap);
  q->table_cap = MIN_TABLE;
  q->table = tko__mem_alloc(alloc, MIN_TABLE * sizeof *q->table);
  if (!q->items || !q->buckets || !q->heap || !q->table) {
    tko__queue_fini(q);
    return -ENOMEM;
  }
  memset(q->table, 0xff, MIN_TABLE * sizeof *q->table);
  atomic_init(&q->slab_bytes, capacity * sizeof *q->items);
  return 0;
}

void tko__queue_fini(tko__queue *q) {
  if (q->items) tko__mem_array_free(q->alloc, q->items, (size_t)q->items_cap * sizeof *q->items);
  tko__mem_free(q->alloc, q->buckets);
  tko__mem_free(q->alloc, q->heap);
  tko__mem_free(q->alloc, q->table);
  memset(q, 0, sizeof *q);
}

size_t tko__queue_initial_bytes(const tko__queue *q) {
  return (size_t)q->initial_cap * sizeof *q->items;
}

bool tko__queue_oversized(const tko__queue *q) {
  /* Relaxed: a hint; the swap decides under the caller's lock. */
  return atomic_load_explicit(&q->slab_bytes, memory_order_relaxed) > tko__queue_initial_bytes(q);
}

bool tko__queue_swap_slab(tko__queue *q, void **fresh, size_t *bytes) {
  if (q->len || q->items_cap <= q->initial_cap) return false;
  void *old = q->items;
  *bytes = (size_t)q->items_cap * sizeof *q->items;
  q->items = *fresh;
  q->items_cap = q->initial_cap;
  forget_free_slots(q); /* already so when it emptied; said again here */
  /* Relaxed: a statistic (see grow_items). */
  atomic_store_explicit(&q->slab_bytes, tko__queue_initial_bytes(q), memory_order_relaxed);
  *fresh = old;
  return true;
}

int tko__queue_reserve(tko__queue *q, size_t n) {
  if (n > (size_t)TKO__NIL / 2 - q->len) return -ENOMEM;
  return grow_items(q, n);
}

static uint32_t take_slot(tko__queue *q) {
  uint32_t i = q->free_head;
  if (i != TKO__NIL) {
    q->free_head = q->items[i].next;
    if (q->free_head == TKO__NIL) q->free_tail = TKO__NIL;
    return i;
  }
  return q->items_used++;
}

/* A new, empty bucket for weight, entered in the table; room for it was
 * reserved. */
static uint32_t new_bucket(tko__queue *q, int weight) {
  uint32_t b = q->free_bucket;
  if (b != TKO__NIL) {
    q->free_bucket = q->buckets[b].head;
    q->free_buckets--;
  } else {
    b = q->buckets_used++;
  }
  q->buckets[b] = (tko__bucket){.weight = weight, .head = TKO__NIL, .tail = TKO__NIL,
                                .heap_pos = TKO__NIL, .returned = 0};
  table_insert(q, b);
  return b;
}

/* Finds weight's bucket (a new one for a weight not queued yet) and makes
 * room for one more item: then the push cannot fail. */
static int bucket_for(tko__queue *q, int weight, uint32_t *out) {
  /* The room test inline: a push on a reserved queue calls nothing. */
  int rc = q->len < q->items_cap ? 0 : grow_items(q, 1);
  if (rc) return rc;
  /* The last push's bucket is the common case; otherwise one table lookup,
   * and a new bucket only for a weight not queued yet. */
  uint32_t b = q->last_bucket;
  if (b == TKO__NIL || q->buckets[b].weight != weight) {
    b = table_find(q, weight);
    if (b == TKO__NIL) {
      rc = reserve_buckets(q, 1); /* may rebuild the table: look up nothing across it */
      if (rc) return rc;
      b = new_bucket(q, weight);
    }
    q->last_bucket = b;
  }
  *out = b;
  return 0;
}

/* Copies *item into a free slot at the tail of bucket b. */
static void append(tko__queue *q, uint32_t b, const tko__item *item) {
  uint32_t slot = take_slot(q);
  tko__item *it = &q->items[slot];
  *it = *item;
  it->next = TKO__NIL;
  tko__bucket *bk = &q->buckets[b];
  if (bk->head == TKO__NIL) {
    bk->head = bk->tail = slot;
    heap_place(q, q->heap_len++, b);
    heap_sift_up(q, q->heap_len - 1);
  } else {
    q->items[bk->tail].next = slot;
    bk->tail = slot;
  }
  q->len++;
}

int tko__queue_push(tko__queue *q, const tko__item *item) {
  uint32_t b;
  int rc = bucket_for(q, item->weight, &b);
  if (rc) return rc;
  append(q, b, item);
  return 0;
}

int tko__queue_push_ordered(tko__queue *q, const tko__item *item) {
  uint32_t b;
  int rc = bucket_for(q, item->weight, &b);
  if (rc) return rc;
  tko__bucket *bk = &q->buckets[b];
  /* Past the pushed-back items that go before it (queue.h): none, usually
   * (it was taken from the head, and is pushed back last-taken first). */
  uint32_t prev = TKO__NIL, cur = bk->head;
  for (uint32_t k = 0; k < bk->returned && cur != TKO__NIL &&
                      item_before(q->aging_ns, &q->items[cur], item);
       k++) {
    prev = cur;
    cur = q->items[cur].next;
  }
  bk->returned++;
  if (cur == TKO__NIL) {
    append(q, b, item);
    return 0;
  }
  uint32_t slot = take_slot(q);
  q->items[slot] = *item;
  q->items[slot].next = cur;
  if (prev != TKO__NIL) {
    q->items[prev].next = slot;
  } else {
    bk->head = slot; /* a new head: with aging its bucket's key rose */
    heap_sift_up(q, bk->heap_pos);
  }
  q->len++;
  return 0;
}

/* The queue just emptied: every slot is free, so hand them out from the
 * start of the slab again instead of in the order they were freed. Pops
 * free slots bucket by bucket, so after a deep queue with several weights
 * the free list zigzags through the slab; reusing it in that order would
 * scatter each bucket further with every burst, until nearly every pop
 * missed the cache (`probe_flood batch reused`, a long-lived pool fed
 * bursts, shows it). */
static void forget_free_slots(tko__queue *q) {
  q->free_head = q->free_tail = TKO__NIL;
  q->items_used = 0;
}

static void free_slot(tko__queue *q, uint32_t slot) {
  q->items[slot].next = TKO__NIL;
  if (q->free_tail != TKO__NIL) q->items[q->free_tail].next = slot;
  else q->free_head = slot;
  q->free_tail = slot;
}

size_t tko__queue_pop(tko__queue *q, tko__item *out, size_t max) {
  size_t n = 0;
  while (n < max && q->heap_len > 0) {
    uint32_t b = q->heap[0];
    tko__bucket *bk = &q->buckets[b];
    uint32_t slot = bk->head;
    bool alone = q->alone_tag && (q->items[slot].ctx & TKO__CTX_TAGS) == q->alone_tag;
    if (alone && n) break; /* the next pop's, by itself */
    out[n++] = q->items[slot];
    bk->head = q->items[slot].next;
    if (bk->returned) bk->returned--;
    free_slot(q, slot);
    if (bk->head == TKO__NIL) {
      bk->tail = TKO__NIL;
      bk->heap_pos = TKO__NIL;
      if (--q->heap_len > 0) {
        heap_place(q, 0, q->heap[q->heap_len]);
        heap_sift_down(q, 0);
      }
    } else if (q->aging_ns) {
      heap_sift_down(q, 0);
    }
    if (alone) break;
  }
  TKO__INVARIANT(q->len >= n);
  q->len -= n;
  if (q->len == 0) forget_free_slots(q);
  return n;
}

/* Takes bucket b out of the heap (it emptied). */
static void heap_remove(tko__queue *q, uint32_t b) {
  uint32_t pos = q->buckets[b].heap_pos;
  q->buckets[b].heap_pos = TKO__NIL;
  heap_remove_at(q, pos);
}

/* Unlinks matching items from one bucket; returns how many it moved. */
static size_t remove_from_bucket(tko__queue *q, uint32_t b, uintptr_t ctx, tko__item *out,
                                 size_t max) {
  tko__bucket *bk = &q->buckets[b];
  uint32_t prev = TKO__NIL, returned = bk->returned;
  size_t n = 0;
  for (uint32_t slot = bk->head, pos = 0; slot != TKO__NIL && n < max; pos++) {
    uint32_t next = q->items[slot].next;
    if (q->items[slot].ctx == ctx) {
      if (pos < returned) bk->returned--; /* one of the pushed-back ones */
      out[n++] = q->items[slot];
      if (prev == TKO__NIL) bk->head = next;
      else q->items[prev].next = next;
      if (bk->tail == slot) bk->tail = prev;
      free_slot(q, slot);
    } else {
      prev = slot;
    }
    slot = next;
  }
  return n;
}

bool tko__queue_remove_newest_top(tko__queue *q, uintptr_t ctx, tko__item *out) {
  if (!q->heap_len) return false;
  uint32_t b = q->heap[0], best = TKO__NIL, best_prev = TKO__NIL, best_pos = 0, prev = TKO__NIL;
  for (uint32_t slot = q->buckets[b].head, pos = 0; slot != TKO__NIL;
       prev = slot, slot = q->items[slot].next, pos++) {
    const tko__item *it = &q->items[slot];
    if (it->ctx != ctx || (best != TKO__NIL && it->id < q->items[best].id)) continue;
    best = slot;
    best_prev = prev;
    best_pos = pos;
  }
  if (best == TKO__NIL) return false;
  uint32_t best_b = b;
  tko__bucket *bk = &q->buckets[best_b];
  *out = q->items[best];
  if (best_pos < bk->returned) bk->returned--; /* one of the pushed-back ones */
  if (best_prev == TKO__NIL) bk->head = q->items[best].next;
  else q->items[best_prev].next = q->items[best].next;
  if (bk->tail == best) bk->tail = best_prev;
  free_slot(q, best);
  if (bk->head == TKO__NIL) heap_remove(q, best_b);
  else if (best_prev == TKO__NIL && q->aging_ns) heap_sift_down(q, bk->heap_pos);
  TKO__INVARIANT(q->len > 0);
  if (--q->len == 0) forget_free_slots(q);
  return true;
}

size_t tko__queue_remove_ctx(tko__queue *q, uintptr_t ctx, tko__item *out, size_t max) {
  size_t n = 0;
  /* Removing reshapes the heap under the scan, so rescan until a pass finds
   * nothing; cancelling is rare and O(queued) anyway. */
  for (bool again = true; again && n < max;) {
    again = false;
    for (uint32_t h = 0; h < q->heap_len && n < max; h++) {
      uint32_t b = q->heap[h];
      uint32_t old_head = q->buckets[b].head;
      size_t got = remove_from_bucket(q, b, ctx, out + n, max - n);
      if (!got) continue;
      n += got;
      again = true;
      if (q->buckets[b].head == TKO__NIL) heap_remove(q, b);
      else if (q->buckets[b].head != old_head && q->aging_ns) heap_sift_down(q, q->buckets[b].heap_pos);
    }
  }
  q->len -= n;
  if (q->len == 0) forget_free_slots(q);
  return n;
}
