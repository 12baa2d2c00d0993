/* SPDX-License-Identifier: MIT */
/* Submit rings' slow parts: claiming one, closing them, moving their tasks
 * into the queue, and the looks workers take (ring.h). */
#include "ring.h"

#include <stdalign.h>
#include <string.h>

#include "invariant.h"
#include "lock.h"
#include "mem.h"
#include "witness.h"

/* The calling thread's token (its address) and its last lookup: one pool
 * at a time; a thread alternating between pools scans their rings. */
typedef struct ring_cache {
  const tko__rings *rs;
  uint64_t uid;
  tko__ring *ring;
} ring_cache;
static _Thread_local ring_cache cache;

static atomic_uint_fast64_t next_uid;

int tko__rings_init(tko__rings *rs, bool off, unsigned shards, const tko_allocator *alloc) {
  memset(rs->ring, 0, sizeof rs->ring);
  atomic_init(&rs->count, 0);
  rs->closed = false;
  rs->off = off;
  rs->shards = shards;
  rs->alloc = alloc;
  if (tko__mutex_init(&rs->mu, TKO__RANK_RINGS)) return -ENOMEM;
  rs->uid = atomic_fetch_add_explicit(&next_uid, 1, memory_order_relaxed) + 1; /* never 0 */
  return 0;
}

static tko__ring_seg *seg_new(const tko_allocator *alloc) {
  void *raw;
  tko__ring_seg *seg =
      tko__mem_alloc_aligned(alloc, sizeof(tko__ring_seg), alignof(tko__ring_seg), &raw);
  if (seg) seg->raw = raw;
  return seg;
}

static void segs_free(const tko_allocator *alloc, tko__ring_seg *seg) {
  while (seg) {
    tko__ring_seg *next = tko__load_relaxed(&seg->next);
    tko__mem_free(alloc, seg->raw);
    seg = next;
  }
}

/* Every segment: the chain from the drain's, the spares. */
static void ring_free(tko__ring *r) {
  segs_free(r->alloc, tko__load_relaxed(&r->rseg)); /* relaxed: no other thread is left */
  segs_free(r->alloc, tko__load_relaxed(&r->kept));
  segs_free(r->alloc, tko__load_relaxed(&r->spare));
  tko__mem_free(r->alloc, r->raw);
}

void tko__rings_fini(tko__rings *rs) {
  unsigned n = atomic_load_explicit(&rs->count, memory_order_relaxed);
  for (unsigned i = 0; i < n; i++) ring_free(rs->ring[i]);
  tko__mutex_destroy(&rs->mu);
}

static tko__ring *ring_new(tko__rings *rs, unsigned index) {
  void *raw;
  tko__ring *r = tko__mem_alloc_aligned(rs->alloc, sizeof(tko__ring), alignof(tko__ring), &raw);
  if (!r) return NULL;
  tko__ring_seg *seg = seg_new(rs->alloc);
  if (!seg) {
    tko__mem_free(rs->alloc, raw);
    return NULL;
  }
  atomic_init(&seg->next, NULL);
  atomic_init(&seg->base, 0);
  atomic_init(&r->tail, rs->closed ? TKO__RING_CLOSED : 0);
  atomic_init(&r->head, 0);
  atomic_init(&r->credits, 0);
  atomic_init(&r->spare, NULL);
  atomic_init(&r->segs, 1);
  r->wseg = seg;
  atomic_init(&r->rseg, seg);
  r->waited_in_vain = UINT64_MAX;
  atomic_init(&r->kept, NULL);
  r->alloc = rs->alloc;
  atomic_init(&r->mixed_weights, false);
  r->owner = &cache;
  r->shard = index % rs->shards;
  r->id_base = TKO__RING_ID | (uint64_t)index << TKO__RING_ID_SHIFT;
  r->raw = raw;
  return r;
}

/* The slow lookup: a ring this thread owns already (another pool was
 * looked up meanwhile), or a new one. */
static tko__ring *find_or_claim(tko__rings *rs) {
  unsigned n = tko__load_acquire(&rs->count); /* pairs with the store below */
  for (unsigned i = 0; i < n; i++)
    if (rs->ring[i]->owner == &cache) return rs->ring[i];
  tko__ring *r = NULL;
  tko__mutex_lock(&rs->mu);
  n = tko__load_relaxed(&rs->count); /* written under mu */
  if (n < TKO__RINGS_MAX) {
    r = ring_new(rs, n);
    if (r) {
      rs->ring[n] = r;
      /* seq_cst: the ring's fields before its count (find_or_claim, the
       * drain and the hint load it acquire), and in the total order before
       * this thread's first publish (tko__rings_ready_seq). */
      tko__store_seq(&rs->count, n + 1);
    }
  }
  tko__mutex_unlock(&rs->mu);
  return r;
}

tko__ring *tko__rings_mine(tko__rings *rs) {
  if (rs->off) return NULL;
  if (cache.rs == rs && cache.uid == rs->uid) return cache.ring;
  tko__ring *r = find_or_claim(rs);
  /* Kept even when no ring was had (every ring taken, or no memory): the
   * thread then stays on the shared inbox, so its tasks never go by two
   * paths, whose drains would not keep them in order. */
  cache = (ring_cache){.rs = rs, .uid = rs->uid, .ring = r};
  return r;
}

void tko__rings_close_claims(tko__rings *rs) {
  tko__mutex_lock(&rs->mu);
  rs->closed = true;
  tko__mutex_unlock(&rs->mu);
}

void tko__rings_close_shard(tko__rings *rs, unsigned shard) {
  tko__mutex_lock(&rs->mu);
  unsigned n = tko__load_relaxed(&rs->count); /* written under mu */
  /* seq_cst (a release): pairs with ring_enqueue's acquire load of the
   * tail (submit.c) and tko__ring_publish's on a refusal, so a submit
   * refused there sees the pool's state (engine.h: tko__pool_refusing). */
  for (unsigned i = shard; i < n; i += rs->shards)
    atomic_fetch_or_explicit(&rs->ring[i]->tail, TKO__RING_CLOSED, memory_order_seq_cst);
  tko__mutex_unlock(&rs->mu);
}

/* Pushes seg onto the ring's spare list. Release: pairs with the acquire
 * exchange of the owner (seg_take) or a trim that takes the list, so the
 * segment's last reads are done before it is rewritten or freed. A push
 * reads no segment but its own, so a list taken and refilled meanwhile
 * only fails the CAS (no ABA). */
static void spare_push(tko__ring *r, tko__ring_seg *seg) {
  tko__ring_seg *top = tko__load_relaxed(&r->spare);
  do
    tko__store_relaxed(&seg->next, top);
  while (!atomic_compare_exchange_weak_explicit(&r->spare, &top, seg, memory_order_release,
                                                memory_order_relaxed));
}

static tko__ring_seg *seg_new_counted(tko__ring *r) {
  tko__ring_seg *seg = seg_new(r->alloc);
  /* Relaxed: a gauge (tko__rings_bytes). */
  if (seg) atomic_fetch_add_explicit(&r->segs, 1, memory_order_relaxed);
  return seg;
}

/* The owner's next segment, for position pos: a spare, or a new one. The
 * owner takes the drains' spares whole and keeps the rest in kept, which
 * a trim may also take whole: each side reads only segments it took by
 * exchange. */
static tko__ring_seg *seg_take(tko__ring *r, uint64_t pos) {
  /* Acquire, both: pairs with spare_push's release, or with the owner's
   * own release store below (a trim took nothing between). */
  tko__ring_seg *seg = atomic_exchange_explicit(&r->kept, NULL, memory_order_acquire);
  if (!seg) seg = atomic_exchange_explicit(&r->spare, NULL, memory_order_acquire);
  if (seg) {
    /* Release: pairs with a trim's acquire exchange of kept. */
    atomic_store_explicit(&r->kept, tko__load_relaxed(&seg->next), memory_order_release);
  } else if (!(seg = seg_new_counted(r))) {
    return NULL;
  }
  /* A backlog of B tasks spans B / capacity + 1 segments at most, by
   * where it starts: with that many, a ring holds a backlog it held
   * before again wherever it starts, without an allocation (a steady
   * state allocates nothing). Relaxed loads: head is a hint (an older one
   * only asks for more); segs is written by this thread and a trim,
   * which frees only spares. */
  uint64_t backlog = pos + 1 - tko__load_relaxed(&r->head);
  while (tko__load_relaxed(&r->segs) < backlog / TKO__RING_CAPACITY + 2) {
    tko__ring_seg *extra = seg_new_counted(r);
    if (!extra) break;
    spare_push(r, extra);
  }
  return seg;
}

tko__ring_seg *tko__ring_seg_grow(tko__ring *r, tko__ring_seg *seg, uint64_t pos) {
  /* Relaxed, base: the owner's own writes (ring.h: tko__ring_seg). */
  while (pos - tko__load_relaxed(&seg->base) >= TKO__RING_CAPACITY) {
    /* Relaxed: the owner wrote it (a link past the tail, from a write that
     * found no memory further on). */
    tko__ring_seg *next = tko__load_relaxed(&seg->next);
    if (!next) {
      if (!(next = seg_take(r, pos))) return NULL;
      tko__store_relaxed(&next->next, NULL);
      tko__store_relaxed(&next->base, tko__load_relaxed(&seg->base) + TKO__RING_CAPACITY);
      /* Relaxed: the tail's CAS that publishes a position in next orders
       * this store before the drain's acquire load of the tail. */
      tko__store_relaxed(&seg->next, next);
    }
    seg = next;
  }
  return seg;
}

/* A published slot, of position pos, as a queue item. */
static tko__item item_of(const tko__ring *r, const tko__ring_slot *s, uint64_t pos) {
  TKO__AUDIT_PLAIN(LOAD, s);
  return (tko__item){.fn = tko__load_payload(&s->fn),
                     .arg = tko__load_payload(&s->arg),
                     .ctx = tko__load_payload(&s->ctx),
                     .id = r->id_base | (pos + 1),
                     .enq_ns = tko__load_payload(&s->enq_ns),
                     .weight = tko__load_payload(&s->weight)};
}

/* Fills order with offsets into slots[0, n) grouped by weight (queue.h:
 * tko__grouping); false if a held task is among them or they carry too
 * many weights. */
static bool group_by_weight(const tko__ring_slot *slots, size_t n, uintptr_t held_tag,
                            uint16_t *order, size_t *groups) {
  tko__grouping g; /* 1 KiB: not zeroed, started */
  tko__grouping_start(&g);
  for (size_t i = 0; i < n; i++) {
    const tko__ring_slot *s = &slots[i];
    if (tko__load_payload(&s->ctx) & held_tag ||
        !tko__grouping_add(&g, tko__load_payload(&s->weight)))
      return false;
  }
  tko__grouping_order(&g, order);
  *groups = g.groups;
  return true;
}

/* Moves positions [h, t), whose slots start at slots, into the queues
 * (see ring_drain), grouped by weight if `big` (the whole drain is a big
 * move); returns where it stopped. */
static uint64_t drain_seg(tko__ring *r, const tko__ring_slot *slots, uint64_t h, uint64_t t,
                          bool big, tko__queue *q, tko__queue *hq, uintptr_t held_tag, int *rc) {
  const uint64_t from = h;
  /* If the queue cannot grow, the pushes below stop at the first failure. */
  bool room = tko__queue_reserve(q, (size_t)(t - h)) == 0;
  /* Relaxed, mixed_weights: the lock holder's (a stage only reads it). */
  if (big && room && tko__load_relaxed(&r->mixed_weights)) {
    uint16_t order[TKO__GROUPED_MAX];
    size_t groups = 0;
    if (group_by_weight(slots, (size_t)(t - h), held_tag, order, &groups) && groups > 1 &&
        tko__queue_reserve_buckets(q, groups) == 0) {
      for (uint64_t i = 0; i < t - h; i++) {
        tko__item item = item_of(r, &slots[order[i]], h + order[i]);
        (void)tko__queue_push(q, &item); /* cannot fail: items and buckets reserved */
      }
      return t;
    }
    /* One weight, or not groupable: tally again once mixed. */
    tko__store_relaxed(&r->mixed_weights, false);
  }
  int first_weight = tko__load_payload(&slots[0].weight), last_weight = first_weight;
  for (; h != t; h++) {
    tko__item item = item_of(r, &slots[h - from], h);
    *rc = tko__queue_push(item.ctx & held_tag ? hq : q, &item);
    if (*rc) break;
    last_weight = item.weight;
  }
  /* A cheap sign of interleaved weights: the first and last moved differ. */
  if (big && *rc == 0 && last_weight != first_weight) tko__store_relaxed(&r->mixed_weights, true);
  return h;
}

/* Pushes a stage's copies e (items from `items`) of positions from h, the
 * ring's head: all of them when they are grouped (room reserved first,
 * or none: grouped copies are not in position order, and the slots still
 * hold them), else up to a push that fails (*rc). Returns the new head. */
static uint64_t push_staged(const tko__stage_entry *e, const tko__item *items, uint64_t h,
                            tko__queue *q, tko__queue *hq, uintptr_t held_tag, int *rc) {
  if (e->groups) {
    /* Grouped only without held tasks (stage_copy): all go to q. */
    if (tko__queue_reserve(q, e->n) || tko__queue_reserve_buckets(q, e->groups)) return h;
    for (unsigned i = 0; i < e->n; i++) {
      tko__item item = items[i];
      (void)tko__queue_push(q, &item); /* cannot fail: items and buckets reserved */
    }
    return h + e->n;
  }
  for (unsigned i = 0; i < e->n; i++) {
    tko__item item = items[i];
    if ((*rc = tko__queue_push(item.ctx & held_tag ? hq : q, &item))) break;
    h++;
  }
  return h;
}

/* Moves r's published tasks (tko__rings_drain), first st's copies of them
 * (entries from *k on, which it moves past) as long as each begins at the
 * head. */
static int ring_drain(tko__ring *r, tko__queue *q, tko__queue *hq, uintptr_t held_tag,
                      const tko__ring_stage *st, unsigned *k) {
  uint64_t h = tko__load_relaxed(&r->head); /* only the lock holder writes it */
  /* seq_cst: its acquire half pairs with the owner's publish, so its
   * slots and links are written; and in the total order after a take's
   * seq_cst load of paused (take.c: drain_for_take), so a take that saw a
   * resume moves every publish made before it, as the inbox's drain does.
   * A plain load on x86, as an acquire one. */
  uint64_t t = tko__load_seq(&r->tail) & ~TKO__RING_CLOSED;
  TKO__INVARIANT(t - h < (uint64_t)1 << 62); /* head never passes the tail */
  int rc = 0;
  /* Big by the whole drain, whose first part a stage may have copied. */
  bool big = t - h >= TKO__GROUPED_MIN;
  for (; st && *k < st->entries && st->at[*k].ring == r; ++*k) {
    const tko__stage_entry *e = &st->at[*k];
    if (e->head != h || rc) continue; /* stale (ring.h: the stage), or after a failure */
    TKO__INVARIANT(e->n <= t - h);
    h = push_staged(e, &st->item[e->first], h, q, hq, held_tag, &rc);
  }
  for (;;) {
    /* Relaxed, rseg and base: this lock holder's, or ordered by the
     * tail's acquire load above. */
    tko__ring_seg *seg = tko__load_relaxed(&r->rseg);
    uint64_t base = tko__load_relaxed(&seg->base);
    /* Past its end, with the next segment linked: a position there is
     * published (h < t), or the copies took h into it, and the segment
     * goes back to the owner at once, as a drain from the slots does. */
    if (h - base > TKO__RING_CAPACITY || (h - base == TKO__RING_CAPACITY && h != t)) {
      tko__ring_seg *next = tko__load_relaxed(&seg->next);
      TKO__INVARIANT(next && tko__load_relaxed(&next->base) == base + TKO__RING_CAPACITY);
      /* Relaxed: the head's release store below publishes it to stages. */
      tko__store_relaxed(&r->rseg, next);
      spare_push(r, seg); /* back to the owner */
      continue;
    }
    if (h == t || rc) break;
    uint64_t end = base + TKO__RING_CAPACITY;
    h = drain_seg(r, &seg->slots[h - base], h, t - base < TKO__RING_CAPACITY ? t : end, big, q,
                  hq, held_tag, &rc);
  }
  /* Release: pairs with the re-check's seq_cst load (tko__rings_ready_seq),
   * so the tail it loads next is at least the one this drain moved to; and
   * with a stage's acquire load, so the rseg it loads next is the head's
   * segment or a later one. */
  tko__store_release(&r->head, h);
  return rc;
}

int tko__rings_drain(tko__rings *rs, unsigned shard, tko__queue *q, tko__queue *hq,
                     uintptr_t held_tag, const tko__ring_stage *st) {
  unsigned n = tko__load_acquire(&rs->count); /* pairs with find_or_claim's store */
  unsigned k = 0; /* st's next entry: they follow the rings' order */
  for (unsigned i = shard; i < n; i += rs->shards) {
    int rc = ring_drain(rs->ring[i], q, hq, held_tag, st, &k);
    if (rc) return rc;
  }
  return 0;
}

/* Copies positions [h, h + n) of r, whose slots start at slots, into out:
 * grouped by weight where a drain would group them (a big move - by the
 * ring's whole backlog - the ring looking mixed, no held task among
 * them), else in position order. Returns the groups, 0 for position
 * order. */
static unsigned stage_copy(const tko__ring *r, const tko__ring_slot *slots, uint64_t h, size_t n,
                           bool big, uintptr_t held_tag, tko__item *out) {
  uint16_t order[TKO__STAGE_MAX];
  size_t groups = 0;
  /* Relaxed: a hint (a stale one only groups or not). */
  if (big && tko__load_relaxed(&r->mixed_weights) &&
      group_by_weight(slots, n, held_tag, order, &groups) && groups > 1) {
    for (size_t i = 0; i < n; i++) out[i] = item_of(r, &slots[order[i]], h + order[i]);
    return (unsigned)groups;
  }
  for (size_t i = 0; i < n; i++) out[i] = item_of(r, &slots[i], h + i);
  return 0;
}

void tko__rings_stage(tko__rings *rs, unsigned shard, uintptr_t held_tag, tko__ring_stage *st) {
  st->entries = st->items = 0;
  unsigned n = tko__load_acquire(&rs->count); /* pairs with find_or_claim's store */
  for (unsigned i = shard; i < n; i += rs->shards) {
    tko__ring *r = rs->ring[i];
    /* Acquire: pairs with ring_drain's release store, so rseg below is
     * h's segment or a later one. */
    uint64_t h = tko__load_acquire(&r->head);
    /* Acquire: pairs with the owner's publish, so the slots below t, and
     * the links to their segments, are written. Loaded after h: t >= h. */
    uint64_t t = tko__load_acquire(&r->tail) & ~TKO__RING_CLOSED;
    bool big = t - h >= TKO__GROUPED_MIN;
    /* Relaxed, rseg, base and the links: a segment other than h's (a
     * drain moved on) fails the checks below, and an unmoved head is
     * checked again under the lock. Every segment a stage reaches stays
     * allocated while it runs (pool.c: a trim waits for it). */
    const tko__ring_seg *seg = tko__load_relaxed(&r->rseg);
    uint64_t base = tko__load_relaxed(&seg->base);
    /* One entry per segment: grouped copies stay within one. */
    for (uint64_t p = h; p != t;) {
      if (st->entries == TKO__STAGE_ENTRIES || st->items == TKO__STAGE_MAX) return;
      if (p - base >= TKO__RING_CAPACITY) { /* into the next segment, linked before p's publish */
        if (!(seg = tko__load_relaxed(&seg->next))) break;
        base = tko__load_relaxed(&seg->base);
        if (p - base >= TKO__RING_CAPACITY) break; /* a drain moved on meanwhile */
      }
      uint64_t stop = t, room = TKO__STAGE_MAX - st->items;
      if (stop - p > room) stop = p + room;
      if (stop - base > TKO__RING_CAPACITY) stop = base + TKO__RING_CAPACITY;
      unsigned first = st->items, m = (unsigned)(stop - p);
      unsigned groups = stage_copy(r, &seg->slots[p - base], p, m, big, held_tag, &st->item[first]);
      st->items += m;
      st->at[st->entries++] =
          (tko__stage_entry){.ring = r, .head = p, .first = first, .n = m, .groups = groups};
      p = stop;
    }
  }
}

bool tko__rings_ready_seq(tko__rings *rs) {
  unsigned n = tko__load_seq(&rs->count); /* pairs with find_or_claim's seq_cst store */
  for (unsigned i = 0; i < n; i++) {
    tko__ring *r = rs->ring[i];
    /* head first: a drain between the loads can only make it look ready. */
    uint64_t h = tko__load_seq(&r->head);
    if ((tko__load_seq(&r->tail) & ~TKO__RING_CLOSED) != h) return true;
  }
  return false;
}

/* Rings first, first + stride, ...: whether one holds a published task
 * not yet moved (relaxed loads). */
static bool ready_hint(tko__rings *rs, unsigned first, unsigned stride) {
  unsigned n = tko__load_acquire(&rs->count); /* pairs with find_or_claim's store */
  for (unsigned i = first; i < n; i += stride) {
    tko__ring *r = rs->ring[i];
    uint64_t h = tko__load_relaxed(&r->head);
    if ((tko__load_relaxed(&r->tail) & ~TKO__RING_CLOSED) != h) return true;
  }
  return false;
}

bool tko__rings_ready_hint(tko__rings *rs) { return ready_hint(rs, 0, 1); }

bool tko__rings_shard_ready_hint(tko__rings *rs, unsigned shard) {
  return ready_hint(rs, shard, rs->shards);
}

void tko__rings_trim(tko__rings *rs) {
  unsigned n = tko__load_acquire(&rs->count); /* pairs with find_or_claim's store */
  for (unsigned i = 0; i < n; i++) {
    tko__ring *r = rs->ring[i];
    /* Only an empty ring's (relaxed: a hint, like the queue's "nothing
     * queued"): a backlog will want its spares again soon. */
    if ((tko__load_relaxed(&r->tail) & ~TKO__RING_CLOSED) != tko__load_relaxed(&r->head))
      continue;
    /* Acquire: pairs with spare_push's release and seg_take's store. */
    tko__ring_seg *lists[2] = {atomic_exchange_explicit(&r->spare, NULL, memory_order_acquire),
                               atomic_exchange_explicit(&r->kept, NULL, memory_order_acquire)};
    for (int l = 0; l < 2; l++)
      for (tko__ring_seg *seg = lists[l], *next; seg; seg = next) {
        next = tko__load_relaxed(&seg->next);
        /* The gauge first: memory seen back means stats see it back. */
        atomic_fetch_sub_explicit(&r->segs, 1, memory_order_relaxed);
        tko__mem_free(r->alloc, seg->raw);
      }
  }
}

size_t tko__rings_bytes(const tko__rings *rs) {
  unsigned n = tko__load_acquire(&rs->count); /* pairs with find_or_claim's store */
  size_t segs = 0;
  for (unsigned i = 0; i < n; i++) segs += tko__load_relaxed(&rs->ring[i]->segs) - 1;
  return segs * sizeof(tko__ring_seg);
}

bool tko__rings_trimmable(const tko__rings *rs) {
  unsigned n = tko__load_acquire(&rs->count); /* pairs with find_or_claim's store */
  for (unsigned i = 0; i < n; i++)
    if (tko__load_relaxed(&rs->ring[i]->spare) || tko__load_relaxed(&rs->ring[i]->kept))
      return true;
  return false;
}

uint64_t tko__rings_published(tko__rings *rs) {
  unsigned n = tko__load_acquire(&rs->count); /* pairs with find_or_claim's store */
  uint64_t sum = 0;
  /* seq_cst, as tko__ring_publish's CAS (ring.h): the submitted count,
   * read after the finished counts (pool.c: pool_is_idle). */
  for (unsigned i = 0; i < n; i++)
    sum += tko__load_seq(&rs->ring[i]->tail) & ~TKO__RING_CLOSED;
  return sum;
}
