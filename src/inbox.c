/* SPDX-License-Identifier: MIT */
/* The inbox's slow parts: setup and moving tasks into the queue. */
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
  in->mask = cap - 1;
  in->slots = tko__mem_alloc(alloc, cap * sizeof *in->slots);
  if (!in->slots) return -ENOMEM;
  for (uint64_t i = 0; i < cap; i++) atomic_init(&in->slots[i].seq, 0);
  return 0;
}

void tko__inbox_fini(tko__inbox *in, const tko_allocator *alloc) {
  tko__mem_free(alloc, in->slots);
  in->slots = NULL;
}

/* A submitter between its reservation and its publish is a few
 * instructions away from done, unless preempted: spin briefly, then yield
 * to it. Acquire: pairs with the release in tko__inbox_publish. */
static const tko__inbox_slot *published(tko__inbox *in, uint64_t pos) {
  const tko__inbox_slot *s = &in->slots[pos & in->mask];
  for (unsigned spins = 0; tko__load_acquire(&s->seq) != pos + 1; spins++)
    tko__wait_step(spins, 64);
  return s;
}

static tko__item item_at(const tko__inbox_slot *s, uint64_t pos) {
  return (tko__item){.fn = s->fn, .arg = s->arg, .ctx = s->ctx, .id = pos + 1,
                     .enq_ns = s->enq_ns, .weight = s->weight};
}

/* Grouping the moved tasks by weight: the queue hands out slab slots in
 * push order, so tasks pushed in submit order interleave their weights
 * and a worker popping one weight touches a new cache line per task (a
 * dependent load, each a miss once a deep backlog is out of cache). Pushed
 * weight by weight - in submit order within each weight, which is all
 * FIFO needs - each weight's tasks sit side by side and pops stream
 * (`probe_flood batch reused`, four interleaved weights, medians of 28-35
 * runs a side: 48-56 -> 40-48 ns/task). Only for a handful of
 * weights and when room was reserved, so that no push can fail halfway
 * through a group; otherwise tasks move in submit order. And only for big
 * moves (a full inbox: that is when a backlog builds) after a big move
 * that looked mixed: a tally pass on every drain cost bench_peers' single-
 * weight 4-producer case ~5 ns/task. */
enum { GROUPS_MAX = 8, GROUPED_MIN = 256, GROUPED_MAX = 1024 };

/* Fills order with offsets from h, grouped by weight; false if the tasks
 * cannot be grouped (too many weights, an async task, too many tasks). */
static bool group_by_weight(tko__inbox *in, uint64_t h, uint64_t t, uintptr_t async_tag,
                            uint16_t *order, size_t *groups_out) {
  if (t - h > GROUPED_MAX) return false;
  int weights[GROUPS_MAX];
  uint32_t count[GROUPS_MAX] = {0};
  uint8_t group[GROUPED_MAX];
  size_t groups = 0;
  for (uint64_t p = h; p != t; p++) {
    const tko__inbox_slot *s = published(in, p);
    if (s->ctx & async_tag) return false;
    size_t g = 0;
    while (g < groups && weights[g] != s->weight) g++;
    if (g == groups) {
      if (groups == GROUPS_MAX) return false;
      weights[groups++] = s->weight;
    }
    group[p - h] = (uint8_t)g;
    count[g]++;
  }
  uint32_t next[GROUPS_MAX];
  for (size_t g = 0, at = 0; g < groups; at += count[g++]) next[g] = (uint32_t)at;
  for (uint64_t i = 0; i < t - h; i++) order[next[group[i]]++] = (uint16_t)i;
  *groups_out = groups;
  return true;
}

int tko__inbox_drain(tko__inbox *in, tko__queue *q, tko__queue *aq, uintptr_t async_tag) {
  uint64_t h = tko__load_relaxed(&in->head); /* only the lock holder writes it */
  uint64_t t = tko__load_seq(&in->tail) & ~TKO__INBOX_CLOSED;
  if (h == t) return 0;
  /* One allocation for the lot when possible; if the queue cannot grow, move
   * what fits in its free slots (pushes below stop at the first failure),
   * so accepted tasks never wait on memory that may not come. */
  bool room = tko__queue_reserve(q, (size_t)(t - h)) == 0;
  uint16_t order[GROUPED_MAX];
  size_t groups = 0;
  bool big = t - h >= GROUPED_MIN;
  /* Tally only when the last big drain was mixed: a stream of one weight
   * then pays nothing for the grouping it never needs. */
  bool tallied = big && in->mixed_weights && room;
  bool grouped = tallied && group_by_weight(in, h, t, async_tag, order, &groups);
  if (grouped && groups > 1 && tko__queue_reserve_buckets(q, groups) == 0) {
    for (uint64_t i = 0; i < t - h; i++) {
      uint64_t pos = h + order[i];
      tko__item item = item_at(&in->slots[pos & in->mask], pos);
      (void)tko__queue_push(q, &item); /* cannot fail: items and buckets reserved */
    }
    /* Release: pairs with the acquire in tko__inbox_reserve. */
    tko__store_release(&in->head, t);
    return 0;
  }
  /* One weight, or more than grouping takes (too many weights, async
   * tasks): stop tallying until a drain looks mixed again, so a pool fed
   * many weights pays the pass on at most every other big drain. */
  if (tallied && (groups == 1 || !grouped)) in->mixed_weights = false;
  int rc = 0;
  /* A cheap sign of interleaved weights: the first and last differ. */
  int first_weight = big ? published(in, h)->weight : 0;
  for (; h != t; h++) {
    tko__item item = item_at(published(in, h), h);
    rc = tko__queue_push(item.ctx & async_tag ? aq : q, &item);
    if (rc) break; /* out of memory: the rest stay in the inbox for later */
  }
  if (big && !tallied && !in->mixed_weights && h == t &&
      in->slots[(t - 1) & in->mask].weight != first_weight)
    in->mixed_weights = true;
  /* Release: pairs with the acquire in tko__inbox_reserve. */
  tko__store_release(&in->head, h);
  return rc;
}
