/* SPDX-License-Identifier: MIT */
/* A lane's ring of queued tasks (and the keyed table's meta beside it):
 * grown, shrunk, pushed and popped under the lane's mutex. */
#define _GNU_SOURCE
#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "invariant.h"
#include "atomics.h"
#include "keyed_host.h"
#include "lifecycle.h"
#include "mem.h"
#include "prim.h"
#include "witness.h"
#include "taskorch/lanes.h"
#include "lane.h"

/* Moves the ring into a new allocation twice its size, oldest first. */
int tko__lane_ring_grow(tko_lanes *l, lane *ln) {
  const tko_allocator *a = l->opts.allocator;
  size_t ncap = ln->cap ? ln->cap * 2 : l->opts.lane_capacity;
  if (ncap < ln->cap || ncap > SIZE_MAX / sizeof(tko_lane_task)) return -ENOMEM;
  if (!ln->scratch) {
    ln->scratch = tko__mem_alloc(a, (size_t)l->opts.max_drain * sizeof(tko_lane_task));
    if (!ln->scratch) return -ENOMEM;
  }
  if (l->keyed && !ln->scratch_meta) {
    ln->scratch_meta = tko__mem_alloc(a, (size_t)l->opts.max_drain * sizeof(lane_meta));
    if (!ln->scratch_meta) return -ENOMEM;
  }
  tko_lane_task *nr = tko__mem_alloc(a, ncap * sizeof *nr);
  if (!nr) return -ENOMEM;
  lane_meta *nm = NULL;
  if (l->keyed && !(nm = tko__mem_alloc(a, ncap * sizeof *nm))) {
    tko__mem_free(a, nr);
    return -ENOMEM;
  }
  for (size_t i = 0; i < ln->count; i++) {
    nr[i] = ln->ring[(ln->head + i) % ln->cap];
    if (nm) nm[i] = ln->meta[(ln->head + i) % ln->cap];
  }
  tko__mem_free(a, ln->ring);
  tko__mem_free(a, ln->meta);
  ln->ring = nr;
  ln->meta = nm;
  ln->cap = ncap;
  ln->head = 0;
  ln->used = true;
  return 0;
}

/* Takes an empty, oversized ring (tko__lane_ring_oversized) back to its
 * first size. Swaps, under ln->mu, for a fresh ring (and meta); the old
 * ones are left in *old for the caller to free unlocked. Nothing changes
 * if the allocation fails: the big ring serves on. */
void tko__lane_ring_shrink(tko_lanes *l, lane *ln, ring_old *old) {
  *old = (ring_old){NULL, NULL};
  size_t small = l->opts.lane_capacity;
  TKO__INVARIANT(ln->count == 0 && tko__lane_ring_oversized(l, ln));
  const tko_allocator *a = l->opts.allocator;
  tko_lane_task *nr = tko__mem_alloc(a, small * sizeof *nr);
  lane_meta *nm = l->keyed ? tko__mem_alloc(a, small * sizeof *nm) : NULL;
  if (!nr || (l->keyed && !nm)) {
    tko__mem_free(a, nr);
    tko__mem_free(a, nm);
    return;
  }
  *old = (ring_old){ln->ring, ln->meta};
  ln->ring = nr;
  ln->meta = nm;
  ln->cap = small;
  ln->head = 0;
}

void tko__lane_ring_free(tko_lanes *l, const ring_old *old) {
  tko__mem_free(l->opts.allocator, old->ring);
  tko__mem_free(l->opts.allocator, old->meta);
}

/* Under ln->mu: puts scratch[i] back at the ring's head; there is room. */
void tko__lane_ring_unpop(lane *ln, size_t i) {
  ln->head = ln->head ? ln->head - 1 : ln->cap - 1;
  ln->ring[ln->head] = ln->scratch[i];
  if (ln->meta) ln->meta[ln->head] = ln->scratch_meta[i];
  ln->count++;
}

/* Appends a task to ln's ring, under ln->mu: 0, or -ESHUTDOWN (closed),
 * -EAGAIN (max_queued), -ENOMEM with nothing changed. */
int tko__lane_ring_push(tko_lanes *l, lane *ln, uint64_t key, tko_task_fn fn, void *arg,
                        int weight) {
  /* seq_cst: pairs with close's store, then its lock sweep over the lanes:
   * a submit that misses the flag holds a lane mutex that close then waits
   * for, so close returns only after it has finished. */
  if (tko__load_seq(&l->closed)) return -ESHUTDOWN;
  if (l->opts.max_queued && ln->count >= l->opts.max_queued) return -EAGAIN;
  if (ln->count == ln->cap) {
    int rc = tko__lane_ring_grow(l, ln);
    if (rc) return rc;
  }
  size_t tail = ln->head + ln->count;
  if (tail >= ln->cap) tail -= ln->cap;
  ln->ring[tail] = (tko_lane_task){.key = key, .fn = fn, .arg = arg, .weight = weight};
  if (l->keyed) { /* counted by the pool once accepted: its id, its submit time */
    lane_meta *m = &ln->meta[tail];
    m->id = tko__keyed_accept(l->pool, &m->enq_ns);
  }
  ln->count++;
  return 0;
}
