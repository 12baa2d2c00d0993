/* The inbox's slow parts: setup and moving tasks into the queue. */
#include "inbox.h"

#include <sched.h>

#include "lock.h"
#include "mem.h"

int tko__inbox_init(tko__inbox *in, uint32_t capacity, const tko_allocator *alloc) {
  uint64_t cap = 16;
  while (cap < capacity) cap *= 2;
  atomic_init(&in->tail, 0);
  atomic_init(&in->head, 0);
  atomic_init(&in->head_seen, 0);
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

int tko__inbox_drain(tko__inbox *in, tko__queue *q, tko__queue *aq, uintptr_t async_tag) {
  uint64_t h = tko__load_relaxed(&in->head); /* only the lock holder writes it */
  uint64_t t = tko__load_seq(&in->tail) & ~TKO__INBOX_CLOSED;
  if (h == t) return 0;
  /* One allocation for the lot when possible; if the queue cannot grow, move
   * what fits in its free slots (pushes below stop at the first failure),
   * so accepted tasks never wait on memory that may not come. */
  (void)tko__queue_reserve(q, (size_t)(t - h));
  int rc = 0;
  for (; h != t; h++) {
    tko__inbox_slot *s = &in->slots[h & in->mask];
    /* Acquire: pairs with the release in tko__inbox_publish. A submitter
     * between its reservation and its publish is a few instructions away
     * from done, unless preempted: spin briefly, then yield to it. */
    for (unsigned spins = 0; tko__load_acquire(&s->seq) != h + 1; spins++) {
      if (spins < 64) tko__cpu_relax();
      else sched_yield();
    }
    tko__item item = {.fn = s->fn, .arg = s->arg, .ctx = s->ctx, .id = h + 1, .enq_ns = s->enq_ns,
                      .weight = s->weight};
    rc = tko__queue_push(item.ctx & async_tag ? aq : q, &item);
    if (rc) break; /* out of memory: the rest stay in the inbox for later */
  }
  /* Release: pairs with the acquire in tko__inbox_reserve. */
  tko__store_release(&in->head, h);
  return rc;
}
