/* SPDX-License-Identifier: MIT */
/* The inbox's slow parts: setup and moving tasks into the queue. */
#include "invariant.h"
#include "inbox.h"


#include "lock.h"
#include "mem.h"

int tko__inbox_init(tko__inbox *in, uint32_t capacity, const tko_allocator *alloc) {
  uint64_t cap = 16;
  while (cap < capacity) cap *= 2;
  atomic_init(&in->tail, 0);
  atomic_init(&in->head, 0);
  atomic_init(&in->head_seen, 0);
  in->mixed_weights = false;
  in->claim_begin = in->claim_end = 0;
  in->mask = cap - 1;
  in->slots = tko__mem_alloc(alloc, cap * sizeof *in->slots);
  if (!in->slots) return -ENOMEM;
  for (uint64_t i = 0; i < cap; i++) {
    atomic_init(&in->slots[i].seq, 0);
    atomic_init(&in->slots[i].lead, 0);
  }
  return 0;
}

void tko__inbox_fini(tko__inbox *in, const tko_allocator *alloc) {
  tko__mem_free(alloc, in->slots);
  in->slots = NULL;
}

#ifdef TKO_TEST_SEAMS
void (*_Atomic tko__test_publish_window)(uint64_t pos, bool published);
#endif

/* What a slot's seq holds once position p is done without head passing it. */
static uint64_t done_mark(uint64_t p) { return (p + 1) | TKO__INBOX_MOVED; }

/* Whether the leader of a batch lies at lead and has been moved: head
 * passed it (then its slot may hold a later task), or it is marked done. */
static bool lead_moved(tko__inbox *in, uint64_t lead, uint64_t head) {
  return lead < head || tko__load_relaxed(&in->slots[lead & in->mask].seq) == done_mark(lead);
}

/* The slot of position pos if its task may move now, else NULL (a hole:
 * reserved, not yet published; a follower whose leader has not been moved;
 * or done already). head: the first position not yet done with, as the
 * caller has advanced it. Acquire: pairs with the releases in
 * tko__inbox_publish and tko__inbox_publish_batch. */
static const tko__inbox_slot *published(tko__inbox *in, uint64_t pos, uint64_t head) {
  const tko__inbox_slot *s = &in->slots[pos & in->mask];
  uint64_t v = tko__load_acquire(&s->seq);
  if (v == pos + 1) return s;
  if (v != ((pos + 1) | TKO__INBOX_FOLLOWER)) return NULL;
  return lead_moved(in, pos - tko__load_relaxed(&s->lead), head) ? s : NULL;
}

bool tko__inbox_ready(tko__inbox *in) {
  /* head first: then head <= t. seq_cst all: signal.c's essay, step (2). */
  uint64_t h = tko__load_seq(&in->head);
  uint64_t t = tko__load_seq(&in->tail) & ~TKO__INBOX_CLOSED;
  /* Past head + capacity there are only claims, never a slot to move. */
  uint64_t end = t - h > in->mask ? h + in->mask + 1 : t;
  /* Newest first: in the common case the last reservation is published. */
  for (uint64_t p = end; p != h;) {
    p--;
    const tko__inbox_slot *s = &in->slots[p & in->mask];
    uint64_t v = tko__load_seq(&s->seq);
    if (v == p + 1) return true;
    /* A follower whose leader moved: only after a drain that ran out of
     * memory between them. */
    if (v == ((p + 1) | TKO__INBOX_FOLLOWER) &&
        lead_moved(in, p - tko__load_relaxed(&s->lead), h))
      return true;
  }
  return false;
}

static tko__item item_at(const tko__inbox_slot *s, uint64_t pos) {
  return (tko__item){.fn = s->fn, .arg = s->arg, .ctx = s->ctx, .id = pos + 1,
                     .enq_ns = s->enq_ns, .weight = s->weight};
}

/* Fills order with offsets from h, grouped by weight (queue.h:
 * tko__grouping); false if the tasks cannot be grouped (too many weights,
 * a held task, too many tasks, a slot not published). */
static bool group_by_weight(tko__inbox *in, uint64_t h, uint64_t t, uintptr_t held_tag,
                            uint16_t *order, size_t *groups_out) {
  tko__grouping g; /* 1 KiB: not zeroed, started */
  tko__grouping_start(&g);
  for (uint64_t p = h; p != t; p++) {
    /* head at p: a follower's leader in [h, p) was found published above,
     * and moves in this pass, before it. */
    const tko__inbox_slot *s = published(in, p, p);
    if (!s || s->ctx & held_tag || !tko__grouping_add(&g, s->weight)) return false;
  }
  tko__grouping_order(&g, order);
  *groups_out = g.groups;
  return true;
}

/* Head passes position p, whose slot is then free until head passes p +
 * capacity. If a claim holds that position (past the ring until now), it
 * is done: mark it so in the slot, for the drains that reach it. */
static void pass(tko__inbox *in, uint64_t p) {
  uint64_t q = p + in->mask + 1;
  if (q < in->claim_end) tko__store_relaxed(&in->slots[p & in->mask].seq, done_mark(q));
}

/* Advances h over positions done with, up to t: marked moved, or in the
 * last claim (skipped whole). */
static uint64_t settle(tko__inbox *in, uint64_t h, uint64_t t) {
  while (h != t) {
    if (h >= in->claim_begin && h < in->claim_end) {
      h = in->claim_end; /* its positions inside the window are marked; none is used */
    } else if (tko__load_relaxed(&in->slots[h & in->mask].seq) == done_mark(h)) {
      pass(in, h);
      h++;
    } else {
      break; /* a hole */
    }
  }
  return h;
}

int tko__inbox_drain(tko__inbox *in, tko__queue *q, tko__queue *hq, uintptr_t held_tag) {
  uint64_t h = tko__load_relaxed(&in->head); /* only the lock holder writes it */
  /* seq_cst: pairs with tko__inbox_reserve's CAS (inbox.h), so the
   * publishes made before a reservation read here are seen; and after
   * drain_for_take's seq_cst load of paused (take.c), so a take that saw a
   * resume sees every reservation made before it. */
  uint64_t t = tko__load_seq(&in->tail) & ~TKO__INBOX_CLOSED;
  TKO__INVARIANT(t - h <= ((uint64_t)1 << 62)); /* head never passes the tail */
  if (h == t) return 0;
  /* Slots lie below head + capacity; past it there are only claims. */
  uint64_t end = t - h > in->mask ? h + in->mask + 1 : t;
  /* One allocation for the lot when possible; if the queue cannot grow, move
   * what fits in its free slots (pushes below stop at the first failure),
   * so accepted tasks never wait on memory that may not come. */
  bool room = tko__queue_reserve(q, (size_t)(end - h)) == 0;
  uint16_t order[TKO__GROUPED_MAX];
  size_t groups = 0;
  bool big = end - h >= TKO__GROUPED_MIN;
  /* Tally only when the last big drain was mixed: a stream of one weight
   * then pays nothing for the grouping it never needs. Not with a claim
   * ahead (then end == t: all slots). */
  bool tallied = big && in->mixed_weights && room && in->claim_end <= h;
  bool grouped = tallied && group_by_weight(in, h, end, held_tag, order, &groups);
  if (grouped && groups > 1 && tko__queue_reserve_buckets(q, groups) == 0) {
    for (uint64_t i = 0; i < end - h; i++) {
      uint64_t pos = h + order[i];
      tko__item item = item_at(&in->slots[pos & in->mask], pos);
      (void)tko__queue_push(q, &item); /* cannot fail: items and buckets reserved */
    }
    /* Release: pairs with the acquire in tko__inbox_reserve. */
    tko__store_release(&in->head, end);
    return 0;
  }
  /* One weight, or more than grouping takes (too many weights, held
   * tasks, a hole): stop tallying until a drain looks mixed again, so a
   * pool fed many weights pays the pass on at most every other big drain. */
  if (tallied && (groups == 1 || !grouped)) in->mixed_weights = false;
  int rc = 0;
  /* A cheap sign of interleaved weights: the first and last moved differ. */
  int first_weight = 0, last_weight = 0;
  size_t moved = 0;
  for (uint64_t p = h; p != end; p++) {
    const tko__inbox_slot *s = published(in, p, h);
    if (!s) continue; /* a hole (workers poll beside it), or done already */
    tko__item item = item_at(s, p);
    rc = tko__queue_push(item.ctx & held_tag ? hq : q, &item);
    if (rc) break; /* out of memory: the rest stay in the inbox for later */
    if (!moved++) first_weight = item.weight;
    last_weight = item.weight;
    if (p == h) {
      pass(in, h++); /* the common case: no hole before it */
    } else {
      /* Past a hole: marked, so no later drain moves it again. Relaxed:
       * the slot's next reservation follows head's release below. */
      tko__store_relaxed(&in->slots[p & in->mask].seq, done_mark(p));
    }
  }
  h = settle(in, h, t);
  if (big && !tallied && !in->mixed_weights && rc == 0 && last_weight != first_weight)
    in->mixed_weights = true;
  /* Release: pairs with the acquire in tko__inbox_reserve. */
  tko__store_release(&in->head, h);
  return rc;
}

int tko__inbox_claim(tko__inbox *in, uint64_t n, uint64_t *pos) {
  uint64_t h = tko__load_relaxed(&in->head); /* only the lock holder writes it */
  uint64_t cap = in->mask + 1;
  uint64_t t = tko__load_relaxed(&in->tail);
  do {
    if (t & TKO__INBOX_CLOSED) {
      (void)tko__load_acquire(&in->tail); /* as tko__inbox_reserve's */
      return -ESHUTDOWN;
    }
    if (n <= cap && t + n - h <= cap) return TKO__INBOX_ROOM;
    /* seq_cst: as a reservation's (tko__inbox_reserve). */
  } while (!tko__cas_seq(&in->tail, &t, t + n));
  *pos = t;
  if (h == t) {
    /* Nothing before it is left: head jumps over it (a big batch, most
     * often). Release: pairs with the acquire in tko__inbox_reserve. */
    tko__store_release(&in->head, t + n);
    return 0;
  }
  /* Behind a hole. The positions inside head's window are marked done in
   * their slots, free until head passes them; the others as head's window
   * reaches them (pass). */
  in->claim_begin = t;
  in->claim_end = t + n;
  for (uint64_t p = t; p != t + n && p - h < cap; p++)
    tko__store_relaxed(&in->slots[p & in->mask].seq, done_mark(p));
  return 0;
}
