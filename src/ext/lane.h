/* SPDX-License-Identifier: MIT */
/* The lane tables' private header (tko_lanes, taskorch/lanes.h): the table
 * and lane layouts and what the lane_*.c files call across. The protocol
 * they keep is lane_runner.c's opening essay. */
#ifndef TKO_LANE_H
#define TKO_LANE_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <assert.h>
#include <errno.h>
#include <stdint.h>

#include "atomics.h"
#include "lifecycle.h"
#include "prim.h"
#include "witness.h"
#include "taskorch/lanes.h"

/* What the pool's keyed table keeps beside each task (keyed_host.h). */
typedef struct lane_meta {
  uint64_t id, enq_ns;
} lane_meta;

/* A tko_lanes_submit_wait caller's record, on its stack (lane_wait.c):
 * listed on its lane, in ticket order, from its task's push until whoever
 * ran it, or handed it to on_cancel, sets state and wakes it. After that
 * store nothing touches the record: its thread may return at once. */
enum { LANE_WAITING = 0, LANE_RAN, LANE_CANCELLED, LANE_SLEEPING };
typedef struct lane_waiter {
  /* LANE_WAITING (LANE_SLEEPING once its caller is about to sleep), then
   * LANE_RAN or LANE_CANCELLED, once. */
  atomic_uint state;
  uint64_t ticket;          /* its task's place in the lane (lane.taken) */
  struct lane_waiter *next; /* under the lane's mu while listed */
} lane_waiter;

/* The fields up to `max_batch` are what a submit_wait that runs an idle
 * lane touches, and what every visit counts: they come first, within the
 * lane's first LANE_HOT_BYTES, so that a lane not in the cache costs one
 * fetch of an aligned pair of lines, not three lines (bench_combining's
 * wait mode, where the documents push the lanes out of the cache). */
typedef struct lane {
  tko__mutex mu;  /* protects every field below */
  bool scheduled; /* a runner for this lane is out */
  bool used;      /* a task was ever given to the lane (stats: lanes_used) */
  unsigned index;
  size_t count, cap; /* cap slots in ring, count queued from head */
  struct tko_lanes *owner;
  uint64_t submitted, completed, failed, visits, max_batch;
  /* The rest: queued tasks, waiters, cancels. */
  lane_waiter *waiters;   /* submit_wait callers, by ticket */
  tko_lane_task *ring;    /* NULL until first use */
  size_t head;
  tko_lane_task *scratch; /* max_drain slots: the batch being run (runner only) */
  lane_meta *meta, *scratch_meta; /* beside ring and scratch: the keyed table only */
  uint64_t cancelled;
  /* Tickets: the task at ring position i has ticket taken + i. taken
   * counts the tasks ever taken from the ring (by a visit, or a cancel);
   * it goes back only when a visit ended by its thread puts its unstarted
   * tasks back (lane_runner.c: visit_exited). */
  uint64_t taken;
  lane_waiter *waiters_last;
} lane;

/* Lanes start on LANE_ALIGN bytes (two cache lines, which the hardware
 * fetches together) and are padded to whole multiples of it, so that the
 * hot fields share one aligned pair and neighbours' mutexes and counters,
 * written by different runners, never share a line. */
#define LANE_ALIGN (2 * TKO_CACHE_LINE)
#define LANE_HOT_BYTES LANE_ALIGN
#define LANE_STRIDE (((sizeof(lane) + LANE_ALIGN - 1) / LANE_ALIGN) * LANE_ALIGN)
_Static_assert(offsetof(lane, max_batch) + sizeof(uint64_t) <= LANE_HOT_BYTES,
               "a lane's hot fields must fit its first aligned pair of lines");

/* A live table's first word; destroy overwrites it before freeing, so a
 * call on a destroyed table (while its memory is still mapped) is caught:
 * -EINVAL, and an assertion in debug builds. */
#define LANES_MAGIC 0x4c414e45u /* "LANE" */
#define LANES_DEAD 0x6c616e65u

struct tko_lanes {
  uint32_t magic;    /* LANES_MAGIC while the table lives */
  unsigned fork_gen; /* tko__fork_generation() at create: a child's copy refuses calls */
  tko_pool *pool;
  bool keyed; /* the pool's own table (tko_submit_keyed): keyed_host.h */
  tko_lane_options opts;
  unsigned mask;       /* lanes - 1 */
  void *raw;           /* allocation holding the lanes */
  unsigned char *base; /* the lanes, aligned to LANE_ALIGN */
  atomic_bool closed;  /* submits fail once set (see tko_lanes_close) */
  /* Padding, not _Alignas: the struct comes from a plain allocator. Every
   * submit writes pending; runners changes once per lane burst. */
  char pad0[TKO_CACHE_LINE];
  atomic_uint_fast64_t pending; /* accepted, not finished or cancelled */
  char pad1[TKO_CACHE_LINE - sizeof(atomic_uint_fast64_t)];
  atomic_uint_fast64_t runners; /* runners out; decremented under idle_mu */
  atomic_uint idle_waiters;     /* wait_idle calls waiting for pending to reach 0 */
  tko__mutex idle_mu;           /* orders the zero-crossings of pending and runners
                                   with their waiters */
  pthread_cond_t idle_cv;       /* broadcast when pending or runners reaches zero */
  /* Held on the pool from create to destroy (lifecycle.h): the pool's
   * destroy is -EBUSY meanwhile, and its shutdown closes the table. */
  tko__attachment attach;
  /* The runners' owner (lifecycle.h): a worker takes a runner alone, and
   * a runner the pool cancels comes back here (tko__lanes_runner_cancelled). */
  tko__task_owner runner_owner;
};

static inline lane *lane_at(tko_lanes *l, unsigned i) {
  return (lane *)(l->base + (size_t)i * LANE_STRIDE);
}

/* The rings a shrink or a cancel detached from a lane under its mutex, for
 * the caller to free with the lane unlocked (tko__lane_ring_free). */
typedef struct ring_old {
  tko_lane_task *ring;
  lane_meta *meta;
} ring_old;

/* Inline: on every submit and every task. */

/* Every entry point's handle check: -EINVAL for NULL or a destroyed table,
 * -ECHILD in a child forked after create (the runners stayed in the
 * parent, and a lane mutex may have been held at the fork). */
static inline int tko__lanes_check(const tko_lanes *l) {
  if (!l) return -EINVAL;
  assert(l->magic == LANES_MAGIC && "tko_lanes: not a live lane table (destroyed twice?)");
  if (l->magic != LANES_MAGIC) return -EINVAL;
  if (l->fork_gen != tko__fork_generation()) return -ECHILD;
  return 0;
}

/* Pops the ring's head into *t and, for the keyed table, *m. Under ln->mu,
 * count > 0. */
static inline void tko__lane_ring_pop(lane *ln, tko_lane_task *t, lane_meta *m) {
  *t = ln->ring[ln->head];
  if (ln->meta) *m = ln->meta[ln->head];
  ln->head = ln->head + 1 == ln->cap ? 0 : ln->head + 1;
  ln->count--;
}

/* A ring that drained empty after a burst grew it past this many times its
 * first size goes back to that size (tko__lane_ring_shrink), so that a
 * burst's memory does not stay with the table (bench_alloc's burst table
 * shows it). Only then, so that a lane that keeps a few tasks queued
 * allocates nothing per burst. */
enum { LANE_SHRINK_FACTOR = 4 };

/* Under ln->mu: whether an empty ln's ring is one to shrink. Inline: each
 * runner that gives its lane back asks (bench_combining's wait mode). */
static inline bool tko__lane_ring_oversized(const tko_lanes *l, const lane *ln) {
  return ln->cap / LANE_SHRINK_FACTOR > l->opts.lane_capacity;
}

/* lane_table.c: the table and its counters. */

int tko__lanes_create(tko_lanes **out, tko_pool *pool, const tko_lane_options *opts, bool keyed);
/* pending -= n, waking wait_idle at zero. */
void tko__lanes_pending_sub(tko_lanes *l, uint64_t n);
/* A runner is back: the table's last access by that runner. */
void tko__lanes_runner_done(tko_lanes *l);

/* lane_ring.c: a lane's ring, under its mutex. */

int tko__lane_ring_grow(tko_lanes *l, lane *ln);
void tko__lane_ring_shrink(tko_lanes *l, lane *ln, ring_old *old);
void tko__lane_ring_free(tko_lanes *l, const ring_old *old);
void tko__lane_ring_unpop(lane *ln, size_t i);
int tko__lane_ring_push(tko_lanes *l, lane *ln, uint64_t key, tko_task_fn fn, void *arg,
                        int weight);

/* lane_runner.c: the runner protocol. */

int tko__lane_submit_runner(tko_lanes *l, lane *ln, int weight, long timeout_ms,
                            bool may_run_here);
/* Drives the lane: entered with ln->mu held by the owner of the runner
 * token; returns with it released and the token handed on or given back. */
void tko__lane_drive(tko_lanes *l, lane *ln);
void tko__lane_cancel_task(tko_lanes *l, const tko_lane_task *t, const lane_meta *m);
void tko__lanes_runner_cancelled(tko__task_owner *owner, void *arg);
bool tko__lanes_in_own_task(tko_lanes *l);
bool tko__lanes_drive_withdrawn(tko_lanes *l);
/* Hands every task queued on ln to on_cancel (close, cancel, a runner the
 * pool dropped). */
bool tko__lane_cancel(tko_lanes *l, lane *ln, bool unschedule);

/* True while this thread runs a task, a batch or on_cancel of l, however
 * deep other tables' run nested inside it. */
bool tko__lanes_in_batch(tko_lanes *l);
/* A submit_wait that found its lane idle and took its runner token runs
 * its task `own` (never queued) and then the lane here, at most `most`
 * tasks in all (lane_runner.c); with ln->mu released, inside the pool's
 * gate when gated. */
void tko__lane_run_here(tko_lanes *l, lane *ln, tko_lane_task *own, size_t most, bool gated);

/* lane_wait.c: submit_wait's waiters, under ln->mu except _end. */

/* Resolves the waiters with tickets below end: their tasks ran. */
void tko__lane_waiters_ran(lane *ln, uint64_t end);
/* Unlists the waiters with tickets in [from, end) and returns them, for
 * tko__lane_waiters_end once their tasks went to on_cancel. */
lane_waiter *tko__lane_waiters_take(lane *ln, uint64_t from, uint64_t end);
/* Sets each unlisted waiter's state and wakes it; no lock needed. */
void tko__lane_waiters_end(lane_waiter *w, unsigned state);

/* lane_close.c: close, cancel, wait, destroy and stats. */
int tko__lanes_pool_closing(tko__attachment *a, tko_shutdown_mode mode, long timeout_ms);

#endif
