/* SPDX-License-Identifier: MIT */
/* Lane tables (taskorch/lanes.h): options, create, and the counters that
 * wait_idle and destroy wait on (lane_runner.c's essay: Lifetime). */
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

tko_lane_options tko_lane_default_options(void) {
  tko_lane_options o;
  memset(&o, 0, sizeof o);
  o.lanes = 256;
  o.max_drain = 32;
  o.lane_capacity = 16;
  return o;
}

static unsigned round_pow2(unsigned v) {
  unsigned p = 1;
  while (p < v)
    p <<= 1;
  return p;
}

int tko_lanes_create(tko_lanes **out, tko_pool *pool, const tko_lane_options *opts) {
  return tko__lanes_create(out, pool, opts, false);
}

int tko__lanes_create(tko_lanes **out, tko_pool *pool, const tko_lane_options *opts, bool keyed) {
  if (!out) return -EINVAL;
  *out = NULL;
  if (!pool) return -EINVAL;
  tko_lane_options o = opts ? *opts : tko_lane_default_options();
  if (o.lanes > TKO_MAX_LANES || o.max_drain > TKO_MAX_LANE_DRAIN) return -EINVAL;
  if (o.lane_capacity > TKO_MAX_LANE_CAPACITY) return -EINVAL;
  if (!tko__allocator_valid(o.allocator)) return -EINVAL;
  if (!o.lanes) o.lanes = 256;
  if (!o.max_drain) o.max_drain = 32;
  if (!o.lane_capacity) o.lane_capacity = 16;
  o.lanes = round_pow2(o.lanes);
  const tko_allocator *a = o.allocator;
  tko_lanes *l = tko__mem_alloc(a, sizeof *l);
  if (!l) return -ENOMEM;
  memset(l, 0, sizeof *l);
  l->magic = LANES_MAGIC;
  l->fork_gen = tko__fork_generation();
  l->pool = pool;
  l->keyed = keyed;
  tko__owner_init(&l->runner_owner, tko__lanes_runner_cancelled, keyed);
  l->opts = o;
  l->mask = o.lanes - 1;
  l->raw = tko__mem_alloc(a, (size_t)o.lanes * LANE_STRIDE + LANE_ALIGN);
  if (!l->raw) {
    tko__mem_free(a, l);
    return -ENOMEM;
  }
  uintptr_t p = ((uintptr_t)l->raw + LANE_ALIGN - 1) & ~(uintptr_t)(LANE_ALIGN - 1);
  l->base = (unsigned char *)p;
  atomic_init(&l->closed, false);
  atomic_init(&l->pending, 0);
  atomic_init(&l->runners, 0);
  atomic_init(&l->idle_waiters, 0);
  pthread_condattr_t ca;
  int bad = pthread_condattr_init(&ca);
  if (!bad) {
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    bad = pthread_cond_init(&l->idle_cv, &ca);
    pthread_condattr_destroy(&ca);
  }
  if (!bad && tko__mutex_init(&l->idle_mu, TKO__RANK_LANES_IDLE)) {
    pthread_cond_destroy(&l->idle_cv);
    bad = 1;
  }
  unsigned made = 0;
  for (; !bad && made < o.lanes; made++) {
    lane *ln = lane_at(l, made);
    memset(ln, 0, sizeof *ln);
    ln->index = made;
    ln->owner = l;
    if (tko__mutex_init(&ln->mu, TKO__RANK_LANE)) bad = 1;
  }
  int rc = bad ? -ENOMEM : 0;
  if (!bad) {
    l->attach.close = tko__lanes_pool_closing;
    l->attach.pool_owned = keyed; /* the keyed table: the pool's phase destroys it */
    rc = tko__attach(pool, &l->attach); /* -ESHUTDOWN once the pool's shutdown began */
    if (rc) made++; /* every lane's mutex was made */
  }
  if (rc) {
    for (unsigned i = 0; i + 1 < made; i++)
      tko__mutex_destroy(&lane_at(l, i)->mu);
    if (made) {
      tko__mutex_destroy(&l->idle_mu);
      pthread_cond_destroy(&l->idle_cv);
    }
    tko__mem_free(a, l->raw);
    tko__mem_free(a, l);
    return rc;
  }
  *out = l;
  return 0;
}

unsigned tko_lanes_index(const tko_lanes *l, uint64_t key) {
  return tko__lanes_check(l) == 0 ? (unsigned)(tko__mix64(key) & l->mask) : 0;
}

/* pending -= n; the thread that brings it to zero wakes wait_idle. The
 * caller keeps the table alive (it is a runner still counted, or a caller
 * of the API that destroy may not race with). */
void tko__lanes_pending_sub(tko_lanes *l, uint64_t n) {
  if (!n) return;
  /* Seq_cst, both: the decrement then the load of idle_waiters here, and
   * wait_idle's increment of idle_waiters then its load of pending, under
   * idle_mu (Dekker). Either wait_idle sees zero, or this thread sees it
   * counted and broadcasts under idle_mu, which wait_idle holds from its
   * look to its sleep; with no waiter, no lock is taken. */
  uint64_t before = tko__sub_seq(&l->pending, n);
  TKO__INVARIANT(before >= n); /* a task leaves pending once */
  if (before == n && tko__load_seq(&l->idle_waiters)) {
    tko__mutex_lock(&l->idle_mu);
    pthread_cond_broadcast(&l->idle_cv);
    tko__mutex_unlock(&l->idle_mu);
  }
}

/* A runner is back (finished, or dropped and disposed of). The table's last
 * access by that runner: destroy may free it as soon as idle_mu is released. */
void tko__lanes_runner_done(tko_lanes *l) {
  tko__mutex_lock(&l->idle_mu);
  uint64_t before = tko__sub_seq(&l->runners, 1);
  TKO__INVARIANT(before > 0); /* a runner token comes back once */
  if (before == 1) pthread_cond_broadcast(&l->idle_cv);
  tko__mutex_unlock(&l->idle_mu);
}
