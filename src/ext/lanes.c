/* SPDX-License-Identifier: MIT */
/* Keyed serial lanes on the public pool API: a fixed table of lanes, each a
 * FIFO ring of tasks plus at most one runner task in the pool.
 *
 * The protocol, and why no task is lost, run twice, or run concurrently with
 * another of its lane:
 *
 * Each lane has a mutex guarding its ring and a flag, `scheduled`, true
 * exactly while one runner for the lane is out (queued in the pool or
 * running). A submit pushes its task under the lane mutex; if the lane was
 * not scheduled, it sets the flag and submits a runner, still under the
 * mutex, so that if the pool refuses the runner the task (necessarily the
 * only one in the ring, since an unscheduled lane is empty) is popped again
 * and the submit fails cleanly. A runner takes up to max_drain tasks from the
 * head into the lane's scratch array under the mutex, runs them with the
 * mutex released, then takes the mutex again: if the ring is empty it clears
 * `scheduled` (the next submit starts a new runner); otherwise it resubmits
 * itself, with the head's weight, before unlocking. Whoever sees the flag
 * set knows a runner will look at the ring after its push, because the
 * runner only clears the flag under the mutex after seeing the ring empty.
 * At most one runner per lane exists, so the lane's tasks run one at a time,
 * in ring (submit) order, and each runner's unlock happens-before the next
 * runner's lock: each task happens-before the next one.
 *
 * Runners are owned tasks (lifecycle.h, runner_owner): a worker takes one
 * alone, so that two lanes' runners never share a take (the second key
 * would wait behind the first), and one the pool cancels comes back to
 * runner_cancelled.
 *
 * If the pool refuses the resubmission (it is shutting down, or a bounded
 * queue is full and this is its worker), the runner keeps draining on the
 * spot; the pool waits for running tasks, so the lane is finished before
 * shutdown returns. A runner is never submitted under a lane's mutex in a
 * way that lets the pool run it on the spot: the pool would run it through
 * its hooks, the host's code, with the mutex held (a hook's submit to the
 * lane then waited for its own thread). A full queue of a bounded pool
 * makes the first submit keep the runner token, accept its task, unlock,
 * and only then submit the runner (start_unlocked): TKO_FULL_BLOCK waits
 * for room there, and TKO_FULL_CALLER_RUNS runs the runner at once on that
 * thread; the runner sees the thread-local starting_lane and does nothing
 * but say so, and the submitting thread, still owning the lane, locks it
 * and runs its first visit itself - one task, its own - (drive_first). So
 * the mutex is never taken twice by one thread, and still at most one
 * thread drives a lane. The requeue after a visit never runs on the
 * caller (else the submitter would drain its lane for as long as others
 * append): a full queue makes that thread wait for room with the lane
 * unlocked (start_unlocked). A queued runner that the pool cancels is reported through
 * tko_lanes_pool_cancelled, or found by destroy once the pool is idle;
 * either way the one party that clears `scheduled` under the mutex hands
 * the ring's tasks to on_cancel.
 *
 * No thread waits for queue room while holding a lane's mutex: a runner
 * submitted under it uses a zero timeout. When a full TKO_FULL_BLOCK queue
 * refuses the first runner of a lane, the submitting thread keeps the runner
 * token (`scheduled` stays set), accepts its task, unlocks, and only then
 * waits for room (start_unlocked). Submits to that lane meanwhile append and
 * return; the runner, once out, finds their tasks. If the pool refuses even
 * then (shut down meanwhile), that thread drives the lane itself. A thread
 * that waits for room or drives a lane so holds the pool's gate
 * (enter_gate), so the pool's shutdown returns only after it is done.
 *
 * Lifetime: `runners` counts runners out across the table and is decremented
 * only under idle_mu, as the runner's very last access to the table; destroy
 * waits for it to reach zero under idle_mu, so no runner touches freed
 * memory. `pending` counts accepted tasks not yet finished or cancelled;
 * whoever brings it to zero broadcasts under idle_mu (while still holding a
 * runner reference or being the caller), and wait_idle checks it under
 * idle_mu, so no wake-up is lost.
 *
 * The pool's own keyed table (tko_submit_keyed; `keyed`, keyed_host.h)
 * differs in three ways: its tasks are the pool's - counted and given an id
 * when ring_push accepts them (kept in `meta`, beside the ring), run and
 * cancelled through the pool's hooks and counters; their room in a bounded
 * queue is taken before the lane is locked, so no wait for room happens
 * here; and its runners take no room and never run on the submitter, so a
 * runner's submit fails only at shutdown (or for want of memory), and the
 * thread holding the token then drives the lane itself. A caller-runs
 * submit runs only its own task (drive's first visit takes one) and only
 * if the lane was idle (ours is then the only task drive's first visit
 * finds); then it hands the lane to a runner.
 *
 * Lock order (ranked in witness.h): a lane's mu, then the pool's locks (a
 * runner's submit) or idle_mu. No lock is held while a task, the
 * batch callback or on_cancel runs. A runner is submitted under a lane's mu
 * only with a zero timeout (never a wait for room); the pool never calls back
 * into this file while holding its own locks. */
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

/* What the pool's keyed table keeps beside each task (keyed_host.h). */
typedef struct lane_meta {
  uint64_t id, enq_ns;
} lane_meta;

typedef struct lane {
  tko__mutex mu;          /* protects every field below */
  tko_lane_task *ring;    /* cap slots, count queued from head; NULL until first use */
  tko_lane_task *scratch; /* max_drain slots: the batch being run (runner only) */
  lane_meta *meta, *scratch_meta; /* beside ring and scratch: the keyed table only */
  size_t cap, head, count;
  bool scheduled; /* a runner for this lane is out */
  bool used;      /* a ring was ever allocated (stats: lanes_used; a cancel detaches it) */
  unsigned index;
  struct tko_lanes *owner;
  uint64_t submitted, completed, failed, cancelled, visits, max_batch;
} lane;

/* Lanes are padded to whole cache lines so that neighbours' mutexes and
 * counters, written by different runners, never share a line. */
#define LANE_STRIDE (((sizeof(lane) + TKO_CACHE_LINE - 1) / TKO_CACHE_LINE) * TKO_CACHE_LINE)
_Static_assert(LANE_STRIDE % TKO_CACHE_LINE == 0 && LANE_STRIDE >= sizeof(lane),
               "lanes must start on cache lines");

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
  unsigned char *base; /* cache-line aligned start of the lanes */
  atomic_bool closed;  /* submits fail once set (see tko_lanes_close) */
  /* Padding, not _Alignas: the struct comes from a plain allocator. Every
   * submit writes pending; runners changes once per lane burst. */
  char pad0[TKO_CACHE_LINE];
  atomic_uint_fast64_t pending; /* accepted, not finished or cancelled */
  char pad1[TKO_CACHE_LINE - sizeof(atomic_uint_fast64_t)];
  atomic_uint_fast64_t runners; /* runners out; decremented under idle_mu */
  tko__mutex idle_mu;           /* orders the zero-crossings of pending and runners
                                   with their waiters */
  pthread_cond_t idle_cv;       /* broadcast when pending or runners reaches zero */
  /* Held on the pool from create to destroy (lifecycle.h): the pool's
   * destroy is -EBUSY meanwhile, and its shutdown closes the table. */
  tko__attachment attach;
  /* The runners' owner (lifecycle.h): a worker takes a runner alone, and
   * a runner the pool cancels comes back here (runner_cancelled). */
  tko__task_owner runner_owner;
};

/* The lane table whose batch is running on this thread (for -EDEADLK). */
static _Thread_local tko_lanes *current_lanes;
/* The lane table this thread is destroying: it drives withdrawn lanes to
 * their end instead of requeueing their runners. */
static _Thread_local tko_lanes *destroying;

/* Every entry point's handle check: -EINVAL for NULL or a destroyed table,
 * -ECHILD in a child forked after create (the runners stayed in the
 * parent, and a lane mutex may have been held at the fork). */
static int check(const tko_lanes *l) {
  if (!l) return -EINVAL;
  assert(l->magic == LANES_MAGIC && "tko_lanes: not a live lane table (destroyed twice?)");
  if (l->magic != LANES_MAGIC) return -EINVAL;
  if (l->fork_gen != tko__fork_generation()) return -ECHILD;
  return 0;
}

static lane *lane_at(tko_lanes *l, unsigned i) {
  return (lane *)(l->base + (size_t)i * LANE_STRIDE);
}

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

static void close_table(tko_lanes *l);

static void cancel_lanes(tko_lanes *l);

/* The pool's shutdown resolves the table (lifecycle.h): it closes it, so
 * later submits are -ESHUTDOWN, and waits for nothing. Queued runners then
 * run (DRAIN; one that cannot requeue itself finishes its lane where it
 * runs) or are cancelled by the pool, which hands them back here
 * (runner_cancelled: their lanes' tasks go to on_cancel) (CANCEL); a
 * runner already running finishes its lane. The pool's keyed table, under
 * CANCEL, also cancels the keyed tasks queued behind a running runner: a
 * CANCEL shutdown hands every queued keyed task to the pool's on_cancel. */
static int pool_closing(tko__attachment *a, tko_shutdown_mode mode, long timeout_ms) {
  (void)timeout_ms;
  tko_lanes *l = (tko_lanes *)((char *)a - offsetof(tko_lanes, attach));
  if (l->keyed && mode == TKO_CANCEL) cancel_lanes(l);
  else close_table(l);
  return 0;
}

static int lanes_create(tko_lanes **out, tko_pool *pool, const tko_lane_options *opts, bool keyed);
static void runner_cancelled(tko__task_owner *owner, void *arg);

int tko_lanes_create(tko_lanes **out, tko_pool *pool, const tko_lane_options *opts) {
  return lanes_create(out, pool, opts, false);
}

static int lanes_create(tko_lanes **out, tko_pool *pool, const tko_lane_options *opts, bool keyed) {
  if (!out) return -EINVAL;
  *out = NULL;
  if (!pool) return -EINVAL;
  tko_lane_options o = opts ? *opts : tko_lane_default_options();
  if (o.lanes > TKO_MAX_LANES || o.max_drain > TKO_MAX_LANE_DRAIN) return -EINVAL;
  if (o.lane_capacity > ((size_t)1 << 30)) return -EINVAL;
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
  l->runner_owner = (tko__task_owner){.cancelled = runner_cancelled, .internal = keyed};
  l->opts = o;
  l->mask = o.lanes - 1;
  l->raw = tko__mem_alloc(a, (size_t)o.lanes * LANE_STRIDE + TKO_CACHE_LINE);
  if (!l->raw) {
    tko__mem_free(a, l);
    return -ENOMEM;
  }
  uintptr_t p = ((uintptr_t)l->raw + TKO_CACHE_LINE - 1) & ~(uintptr_t)(TKO_CACHE_LINE - 1);
  l->base = (unsigned char *)p;
  atomic_init(&l->closed, false);
  atomic_init(&l->pending, 0);
  atomic_init(&l->runners, 0);
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
    l->attach.close = pool_closing;
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
  return check(l) == 0 ? (unsigned)(tko__mix64(key) & l->mask) : 0;
}

/* pending -= n; the thread that brings it to zero wakes wait_idle. The
 * caller keeps the table alive (it is a runner still counted, or a caller
 * of the API that destroy may not race with). */
static void pending_sub(tko_lanes *l, uint64_t n) {
  if (!n) return;
  /* seq_cst: the zero-crossing is then broadcast under idle_mu, and
   * wait_idle reads pending under idle_mu: the mutex orders them. */
  uint64_t before = tko__sub_seq(&l->pending, n);
  TKO__INVARIANT(before >= n); /* a task leaves pending once */
  if (before == n) {
    tko__mutex_lock(&l->idle_mu);
    pthread_cond_broadcast(&l->idle_cv);
    tko__mutex_unlock(&l->idle_mu);
  }
}

/* A runner is back (finished, or dropped and disposed of). The table's last
 * access by that runner: destroy may free it as soon as idle_mu is released. */
static void runner_done(tko_lanes *l) {
  tko__mutex_lock(&l->idle_mu);
  uint64_t before = tko__sub_seq(&l->runners, 1);
  TKO__INVARIANT(before > 0); /* a runner token comes back once */
  if (before == 1) pthread_cond_broadcast(&l->idle_cv);
  tko__mutex_unlock(&l->idle_mu);
}

/* Moves the ring into a new allocation twice its size, oldest first. */
static int ring_grow(tko_lanes *l, lane *ln) {
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

/* A ring that drained empty after a burst grew it past SHRINK_FACTOR times
 * its first size goes back to that size, so that a burst's memory does not
 * stay with the table (bench_alloc's burst table shows it). Only then, so that a
 * lane that keeps a few tasks queued allocates nothing per burst. Swaps,
 * under ln->mu with the ring empty, for a fresh ring (and meta); the old
 * ones are left in *old for the caller to free unlocked. Nothing changes
 * if the allocation fails: the big ring serves on. */
enum { SHRINK_FACTOR = 4 };

typedef struct ring_old {
  tko_lane_task *ring;
  lane_meta *meta;
} ring_old;

static void ring_shrink(tko_lanes *l, lane *ln, ring_old *old) {
  *old = (ring_old){NULL, NULL};
  size_t small = l->opts.lane_capacity;
  if (ln->count || ln->cap / SHRINK_FACTOR <= small) return;
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

static void ring_free(tko_lanes *l, const ring_old *old) {
  tko__mem_free(l->opts.allocator, old->ring);
  tko__mem_free(l->opts.allocator, old->meta);
}

static int lane_runner(void *arg);

/* Pops the ring's head into *t and, for the keyed table, *m. Under ln->mu,
 * count > 0. */
static void ring_pop(lane *ln, tko_lane_task *t, lane_meta *m) {
  *t = ln->ring[ln->head];
  if (ln->meta) *m = ln->meta[ln->head];
  ln->head = ln->head + 1 == ln->cap ? 0 : ln->head + 1;
  ln->count--;
}

/* Set while this thread submits ln's runner, so that a runner the pool
 * runs at once on this very thread (TKO_FULL_CALLER_RUNS) can tell: it then
 * only reports that it ran, and the submitting thread, which holds ln->mu
 * and the runner token, drives the lane itself. */
static _Thread_local lane *starting_lane;
static _Thread_local bool caller_ran;

/* Submits ln's runner; runner token owned. Returns 0 when the runner is out
 * in the pool (the token goes with it), 1 when the pool ran it on this
 * thread and the caller still owns the token, or a negative errno (the
 * caller still owns the token). Under ln->mu it must not wait for room
 * (timeout_ms 0: a full TKO_FULL_BLOCK queue is -ETIMEDOUT, or -EAGAIN on a
 * worker of the pool): a lane task or any other submit to this lane could
 * then be the one that has to take the lock to free room. Only a submit
 * that has released ln->mu waits (timeout_ms -1). With may_run_here false,
 * a full TKO_FULL_CALLER_RUNS queue is treated as a blocking one. */
static int submit_runner(tko_lanes *l, lane *ln, int weight, long timeout_ms, bool may_run_here) {
  lane *saved = starting_lane;
  bool saved_ran = caller_ran;
  starting_lane = ln;
  caller_ran = false;
  /* The keyed table's owner is internal: its runner never waits nor runs here. */
  int rc = tko__submit_owned(l->pool, &l->runner_owner, lane_runner, ln, weight, timeout_ms,
                             may_run_here);
  bool ran = caller_ran;
  starting_lane = saved;
  caller_ran = saved_ran;
  if (rc) return rc;
  return ran ? 1 : 0;
}

/* A visit: the tasks a runner took from its lane's head into scratch, run
 * with no lock held. */
typedef struct visit {
  tko_lanes *l, *outer_lanes; /* outer_lanes: current_lanes before it */
  lane *ln;
  size_t n, next; /* next: the task running, then n */
  uint64_t failed;
} visit;

static void run_visit(visit *v) {
  tko_lanes *l = v->l;
  lane *ln = v->ln;
  tko__witness_assert_none_held(); /* the host's code follows */
  current_lanes = l;
  if (l->opts.batch) {
    tko_lane_batch b = {.lane = ln->index, .count = v->n, .tasks = ln->scratch};
    v->next = v->n - 1; /* one call runs them all */
    l->opts.batch(l->opts.user, &b);
  } else if (l->keyed) { /* the pool runs them as its tasks: hooks, stats */
    for (v->next = 0; v->next < v->n; v->next++)
      if (tko__keyed_run(l->pool, &ln->scratch[v->next], ln->scratch_meta[v->next].id,
                         ln->scratch_meta[v->next].enq_ns))
        v->failed++;
  } else {
    for (v->next = 0; v->next < v->n; v->next++)
      if (ln->scratch[v->next].fn(ln->scratch[v->next].arg)) v->failed++;
  }
  v->next = v->n;
  current_lanes = v->outer_lanes;
}

/* Under ln->mu: the lane's figures after n of a visit's tasks ran. */
static void count_visit(tko_lanes *l, lane *ln, size_t n, uint64_t failed) {
  if (!n) return;
  ln->visits++;
  ln->completed += n;
  ln->failed += failed;
  if (n > ln->max_batch) ln->max_batch = n;
  pending_sub(l, n); /* lane mu, then idle_mu: the documented order */
}

static void start_unlocked(tko_lanes *l, lane *ln, int weight, bool may_run_here);
static bool hand_on(tko_lanes *l, lane *ln);
static bool lane_cancel(tko_lanes *l, lane *ln, bool unschedule);
static void visit_exited(void *arg);

/* One visit: entered with ln->mu held by the owner of the runner token;
 * takes at most `most` tasks from the head, runs them with the lane
 * unlocked, and returns with the mutex held and the visit counted. */
static void visit_once(tko_lanes *l, lane *ln, size_t most) {
  size_t n = ln->count < most ? ln->count : most;
  for (size_t i = 0; i < n; i++)
    ring_pop(ln, &ln->scratch[i], ln->scratch_meta ? &ln->scratch_meta[i] : NULL);
  tko__mutex_unlock(&ln->mu);
  visit v = {l, current_lanes, ln, n, 0, 0};
  if (n) {
    /* A cleanup attribute (lanes.c is built with -fexceptions): a few
     * stores a visit. */
    pthread_cleanup_push(visit_exited, &v);
    run_visit(&v);
    pthread_cleanup_pop(0);
  }
  tko__mutex_lock(&ln->mu);
  count_visit(l, ln, n, v.failed);
}

/* After a visit, ln->mu held by the token's owner: hands the token on, or
 * drives the lane on here while it must (hand_on); returns with the mutex
 * released. */
static void hand_on_or_drive(tko_lanes *l, lane *ln) {
  while (!hand_on(l, ln)) visit_once(l, ln, l->opts.max_drain);
}

/* Drives the lane: entered with ln->mu held by the owner of the runner
 * token; returns with the mutex released and the token either passed to a
 * new runner in the pool or given back (scheduled cleared, runner_done).
 * The first visit takes at most `first` tasks, later ones max_drain. */
static void drive_first(tko_lanes *l, lane *ln, size_t first) {
  visit_once(l, ln, first);
  hand_on_or_drive(l, ln);
}

static void drive(tko_lanes *l, lane *ln) { drive_first(l, ln, l->opts.max_drain); }

/* Under ln->mu, owning the runner token, after a visit: gives the token
 * back when the lane is empty, or passes it to a new runner, and returns
 * true with the mutex released; false, still holding it, when this thread
 * has to drive the lane on. */
static bool hand_on(tko_lanes *l, lane *ln) {
  if (ln->count == 0) {
    ln->scheduled = false;
    ring_old old;
    ring_shrink(l, ln, &old);
    tko__mutex_unlock(&ln->mu);
    ring_free(l, &old); /* before runner_done: the table is still ours */
    runner_done(l);
    return true;
  }
  /* More queued: give the worker back to the pool's ordering, ranked by
   * the new head. The new runner inherits this one's count in runners.
   * Never run here again: a caller-runs submitter runs one visit at most
   * (else it would drain its lane for as long as others append). */
  /* Destroy drives the lane to its end, and so does a runner of a closed
   * table, where it runs: nothing can append to the lane any more, and a
   * destroy waiting for its runners must not wait on a pool that may be
   * paused. close_table sets `closed`, then takes
   * every lane's mu: a requeue decided here before the flag was set is
   * queued before close returns, so destroy withdraws it. */
  if (destroying == l || tko__load_seq(&l->closed)) return false;
  int weight = ln->ring[ln->head].weight;
  int rc = submit_runner(l, ln, weight, 0, false);
  if (rc == 0) {
    tko__mutex_unlock(&ln->mu);
    return true;
  }
  if (rc == -ETIMEDOUT) {
    /* A full queue, on a thread that may wait for room (a caller-runs
     * submitter, not a worker): wait with the lane unlocked. */
    tko__mutex_unlock(&ln->mu);
    start_unlocked(l, ln, weight, false);
    return true;
  }
  /* The pool refused (shutting down, or full and this is its worker):
   * keep draining here, still owning the lane. */
  return false;
}

/* ---- a task that ends its thread --------------------------------------
 *
 * pthread_exit from a lane's task (or its batch callback) unwinds through
 * the visit running it. Its handler leaves the lane as a visit's end does,
 * so that the lane's later tasks still run and waits and destroy end:
 * the ended task counts as run and failed (the pool's own rule for a task
 * that ends its thread: taskorch.h), the visit's tasks it did not start go
 * back to the head of the ring in their order (on_cancel only when the
 * ring cannot grow to take them), and the token goes on to a new runner
 * (hand_on). The ending thread runs no more tasks: unwinding, it cannot
 * take another exit, nor a helping wait's work. So where a visit's end
 * would drive the lane on this thread - its table closed, or the pool
 * refusing a runner (shutting down, or a full queue) - the lane's queued
 * tasks go to on_cancel instead (lane_cancel; taskorch.h says so). Then
 * the pool's handler ends the runner, as it does any of its tasks that
 * ends its thread (worker.c: tko__task_exited); a keyed task first counts
 * itself in the pool (keyed.c). */

/* Hands a task taken from the ring to on_cancel; no lock held. */
static void cancel_task(tko_lanes *l, const tko_lane_task *t, const lane_meta *m) {
  tko__witness_assert_none_held(); /* the host's on_cancel follows */
  if (l->keyed) { /* the pool's on_cancel, with the task's id */
    tko__keyed_cancel(l->pool, t, m->id, m->enq_ns);
  } else if (l->opts.on_cancel) {
    /* As in a batch: waiting on or destroying these lanes from on_cancel
     * would wait for this very call, so it is -EDEADLK. */
    tko_lanes *saved = current_lanes;
    current_lanes = l;
    l->opts.on_cancel(l->opts.user, t);
    current_lanes = saved;
  }
}

/* Under ln->mu: puts scratch[i] back at the ring's head; there is room. */
static void ring_unpop(lane *ln, size_t i) {
  ln->head = ln->head ? ln->head - 1 : ln->cap - 1;
  ln->ring[ln->head] = ln->scratch[i];
  if (ln->meta) ln->meta[ln->head] = ln->scratch_meta[i];
  ln->count++;
}

static void visit_exited(void *arg) {
  visit *v = arg;
  tko_lanes *l = v->l;
  lane *ln = v->ln;
  current_lanes = v->outer_lanes;
  size_t ran = v->next + 1, back = v->n - ran;
  tko__mutex_lock(&ln->mu);
  while (ln->cap - ln->count < back && ring_grow(l, ln) == 0) {
  }
  bool room = ln->cap - ln->count >= back;
  if (room)
    for (size_t i = v->n; i-- > ran;) ring_unpop(ln, i);
  count_visit(l, ln, ran, v->failed + 1);
  if (!room) { /* out of memory: the visit's scratch is still this thread's */
    tko__mutex_unlock(&ln->mu);
    for (size_t i = ran; i < v->n; i++)
      cancel_task(l, &ln->scratch[i], ln->scratch_meta ? &ln->scratch_meta[i] : NULL);
    tko__mutex_lock(&ln->mu);
    ln->cancelled += back;
    pending_sub(l, back);
  }
  while (!hand_on(l, ln)) { /* tasks appended meanwhile: hand_on again */
    tko__mutex_unlock(&ln->mu);
    lane_cancel(l, ln, false);
    tko__mutex_lock(&ln->mu);
  }
}

static int lane_runner(void *arg) {
  lane *ln = arg;
  if (starting_lane == ln) {
    /* Run at once by the pool on the submitting thread, which owns the
     * token with the lane unlocked (start_unlocked): the first visit - one
     * task, the submitter's own - runs here, inside the pool's run of the
     * runner, so the pool counts it running; the submitter hands on. */
    caller_ran = true;
    tko__mutex_lock(&ln->mu);
    visit_once(ln->owner, ln, 1);
    tko__mutex_unlock(&ln->mu);
    return 0;
  }
  tko__mutex_lock(&ln->mu);
  drive(ln->owner, ln);
  return 0;
}

/* Starts ln's runner with the lane unlocked, waiting for room; the caller
 * owns the runner token and its task is accepted. With may_run_here, a
 * full TKO_FULL_CALLER_RUNS queue makes the pool run the runner here at
 * once, through its hooks - host code, so the lane must be unlocked - and
 * the runner runs the lane's first visit there: one task, its own (the
 * lane was idle when it was accepted, and nothing takes from a lane whose
 * token this thread holds but a cancel), never what others appended
 * meanwhile, which this thread then hands to a runner in the pool. If the
 * pool refuses (shut down meanwhile), this thread drives the lane itself,
 * as a runner whose requeue was refused does, so the accepted tasks still
 * run. */
static void start_unlocked(tko_lanes *l, lane *ln, int weight, bool may_run_here) {
  int rc = submit_runner(l, ln, weight, -1, may_run_here);
  if (rc == 0) return;
  tko__mutex_lock(&ln->mu);
  if (rc == 1) hand_on_or_drive(l, ln); /* the runner ran the first visit */
  else drive_first(l, ln, l->opts.max_drain);
}

/* A submit that will drive its lane, or wait for room for its runner, on
 * its own thread enters the pool's gate (lifecycle.h) first, so that the
 * pool's shutdown waits for it to leave: it never returns while this thread
 * still runs tasks of the lane (a coalescer's thread blocked in a lane
 * submit on a full queue, say; tests lane_tables/shutdown_waits_for_*).
 * Called under ln->mu after ring_push accepted a task: the table
 * was open, so close_table, which the pool's shutdown runs before it closes
 * the gate, has yet to take this mutex, and the entry succeeds. Returns
 * whether it did (a caller then leaves). */
static bool enter_gate(tko_lanes *l) { return tko__gate_enter(l->pool) == 0; }

/* Appends a task to ln's ring, under ln->mu: 0, or -ESHUTDOWN (closed),
 * -EAGAIN (max_queued), -ENOMEM with nothing changed. */
static int ring_push(tko_lanes *l, lane *ln, uint64_t key, tko_task_fn fn, void *arg, int weight) {
  /* seq_cst: pairs with close's store, then its lock sweep over the lanes:
   * a submit that misses the flag holds a lane mutex that close then waits
   * for, so close returns only after it has finished. */
  if (tko__load_seq(&l->closed)) return -ESHUTDOWN;
  if (l->opts.max_queued && ln->count >= l->opts.max_queued) return -EAGAIN;
  if (ln->count == ln->cap) {
    int rc = ring_grow(l, ln);
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

int tko_lanes_submit(tko_lanes *l, uint64_t key, tko_task_fn fn, void *arg, int weight) {
  int bad = check(l);
  if (bad) return bad;
  if (!fn && !l->opts.batch) return -EINVAL;
  lane *ln = lane_at(l, (unsigned)(tko__mix64(key) & l->mask));
  tko__mutex_lock(&ln->mu);
  int rc = ring_push(l, ln, key, fn, arg, weight);
  if (rc) {
    tko__mutex_unlock(&ln->mu);
    return rc;
  }
  if (!ln->scheduled) {
    /* Relaxed: destroy reads runners only after close_table has taken this
     * lane's mutex, and the decrement comes after a later lock of ln->mu. */
    tko__add_relaxed(&l->runners, 1);
    ln->scheduled = true;
    /* Under the lock the pool must never run the runner here: it would run
     * it through its hooks, the host's code, with ln->mu held. */
    int started = submit_runner(l, ln, weight, 0, false);
    if (started == -ETIMEDOUT || (started == -EAGAIN && tko__pool_caller_runs(l->pool))) {
      /* A full queue that this thread waits for (TKO_FULL_BLOCK) or runs
       * the lane on (TKO_FULL_CALLER_RUNS; on a worker of the pool, where
       * a wait would be -EAGAIN): accept the task and go on with the lane
       * unlocked. Others append behind it meanwhile (they see
       * `scheduled`); the runner, once out, finds them all. */
      tko__add_relaxed(&l->pending, 1); /* relaxed: see below */
      ln->submitted++;
      bool gated = enter_gate(l);
      tko__mutex_unlock(&ln->mu);
      start_unlocked(l, ln, weight, true);
      if (gated) tko__gate_leave(l->pool);
      return 0;
    }
    if (started < 0) {
      /* The lane was unscheduled, hence empty, and we held its mutex
       * throughout: ours is the only task, and no one has seen it. */
      ln->count--;
      ln->scheduled = false;
      tko__sub_relaxed(&l->runners, 1);
      tko__mutex_unlock(&ln->mu);
      return started;
    }
  }
  /* Relaxed: every decrement of this unit comes after a lock of ln->mu that
   * follows this point; zero is only acted on under idle_mu. */
  tko__add_relaxed(&l->pending, 1);
  ln->submitted++;
  tko__mutex_unlock(&ln->mu);
  return 0;
}

/* The pool's keyed table: tasks accepted here are the pool's (counted,
 * with an id) once ring_push returns 0, so they must run or be cancelled;
 * the runner, which takes no room, is refused only at shutdown or for want
 * of memory, and this thread then drives the lane itself, as a runner
 * whose requeue was refused does. */
int tko__lanes_submit_keyed(tko_lanes *l, uint64_t key, tko_task_fn fn, void *arg, int weight,
                            bool run_here) {
  lane *ln = lane_at(l, (unsigned)(tko__mix64(key) & l->mask));
  tko__mutex_lock(&ln->mu);
  if (run_here && ln->scheduled) { /* earlier tasks of the lane come first */
    tko__mutex_unlock(&ln->mu);
    return TKO__LANE_BUSY;
  }
  int rc = ring_push(l, ln, key, fn, arg, weight);
  if (rc) {
    tko__mutex_unlock(&ln->mu);
    return rc;
  }
  tko__add_relaxed(&l->pending, 1); /* relaxed: see tko_lanes_submit */
  ln->submitted++;
  if (ln->scheduled) {
    tko__mutex_unlock(&ln->mu);
    return 0;
  }
  tko__add_relaxed(&l->runners, 1); /* relaxed: see tko_lanes_submit */
  ln->scheduled = true;
  /* Caller-runs: the lane was idle, so ours is its only task: drive's first
   * visit runs it here, then hands the lane to the pool (a runner, refused
   * only at shutdown), whatever others queued meanwhile. */
  if (run_here || submit_runner(l, ln, weight, 0, false) != 0) drive(l, ln);
  else tko__mutex_unlock(&ln->mu);
  return 0;
}

int tko__lanes_create_keyed(tko_lanes **out, tko_pool *pool, const tko_allocator *alloc) {
  tko_lane_options o = tko_lane_default_options();
  o.allocator = alloc;
  return lanes_create(out, pool, &o, true);
}

/* Hands every task queued on ln to on_cancel. The whole ring is detached
 * under the mutex at once (the lane starts a new one at its next push,
 * ring_grow), then its tasks go to on_cancel in order with the lane
 * unlocked. So a runner in the middle of a visit finds the lane empty when
 * it looks again and takes nothing more: per key, the tasks that ran are a
 * prefix and the cancelled ones the rest, never a task run after an
 * earlier one was cancelled. If `unschedule`, the lane's runner was dropped
 * by the pool and this caller owns its runner count: it clears the flag
 * and returns the count. Returns whether it did. */
static bool lane_cancel(tko_lanes *l, lane *ln, bool unschedule) {
  tko__mutex_lock(&ln->mu);
  bool owned = unschedule && ln->scheduled;
  if (owned) ln->scheduled = false;
  size_t n = ln->count, head = ln->head, cap = ln->cap;
  ring_old gone = {NULL, NULL};
  if (n) {
    gone = (ring_old){ln->ring, ln->meta};
    ln->ring = NULL;
    ln->meta = NULL;
    ln->cap = ln->head = ln->count = 0;
    ln->cancelled += n;
  }
  tko__mutex_unlock(&ln->mu);
  for (size_t i = 0, at = head; i < n; i++, at = at + 1 == cap ? 0 : at + 1)
    cancel_task(l, &gone.ring[at], gone.meta ? &gone.meta[at] : NULL);
  ring_free(l, &gone);
  pending_sub(l, n);
  if (owned) runner_done(l);
  return owned;
}

/* Waits, under no lock, for every submit that passed the closed check. */
static void close_table(tko_lanes *l) {
  tko__store_seq(&l->closed, true); /* seq_cst: see tko_lanes_submit */
  for (unsigned i = 0; i <= l->mask; i++) {
    lane *ln = lane_at(l, i);
    tko__mutex_lock(&ln->mu);
    tko__mutex_unlock(&ln->mu);
  }
}

int tko_lanes_close(tko_lanes *l) {
  int bad = check(l);
  if (bad) return bad;
  close_table(l);
  return 0;
}

static void cancel_lanes(tko_lanes *l) {
  close_table(l);
  for (unsigned i = 0; i <= l->mask; i++)
    lane_cancel(l, lane_at(l, i), false);
}

int tko_lanes_cancel(tko_lanes *l) {
  int bad = check(l);
  if (bad) return bad;
  cancel_lanes(l);
  return 0;
}

/* A runner the pool cancelled (its owner's callback, lifecycle.h). */
static void runner_cancelled(tko__task_owner *owner, void *arg) {
  (void)owner;
  lane *ln = arg;
  lane_cancel(ln->owner, ln, true);
}

int tko_lanes_pool_cancelled(const tko_task_info *task) {
  if (!task || task->fn != lane_runner || !task->arg) return 0;
  lane *ln = task->arg;
  if (check(ln->owner)) return 0;
  lane_cancel(ln->owner, ln, true);
  return 1;
}

/* True when the calling thread runs a task of the pool (the pool's own
 * wait_idle says so with -EDEADLK) or a batch of these lanes. */
static bool in_own_task(tko_lanes *l) {
  return current_lanes == l || tko_pool_wait_idle(l->pool, 0) == -EDEADLK;
}

static bool nothing_pending(void *l) { return tko__load_seq(&((tko_lanes *)l)->pending) == 0; }

int tko_lanes_wait_idle(tko_lanes *l, long timeout_ms) {
  int bad = check(l);
  if (bad) return bad;
  if (timeout_ms < -1) return -EINVAL;
  if (in_own_task(l)) return -EDEADLK;
  struct timespec deadline;
  if (timeout_ms >= 0) tko__deadline_after(&deadline, timeout_ms);
  tko__mutex_lock(&l->idle_mu);
  int rc = tko__cond_wait_until(&l->idle_cv, &l->idle_mu,
                                timeout_ms < 0 ? NULL : &deadline, nothing_pending, l);
  tko__mutex_unlock(&l->idle_mu);
  return rc;
}

/* Takes this table's queued runners back from the pool and drives their
 * lanes to the end on this thread (each withdrawn runner's token is ours).
 * Returns whether it found any. */
static bool drive_withdrawn(tko_lanes *l) {
  void *args[32];
  size_t n, total = 0;
  tko_lanes *saved = destroying;
  destroying = l;
  while ((n = tko__withdraw_owned(l->pool, &l->runner_owner, args, 32))) {
    for (size_t i = 0; i < n; i++) {
      lane *ln = args[i];
      tko__mutex_lock(&ln->mu);
      drive(l, ln);
    }
    total += n;
  }
  destroying = saved;
  return total;
}

/* Destroy drains: runners queued in the pool are withdrawn and their lanes
 * driven here, so that a paused pool, which would not run them until it is
 * resumed, cannot hold destroy; runners already
 * running on workers finish their lanes there (the table is closed: they
 * do not requeue), each waking this thread as it counts itself out. */
int tko_lanes_destroy(tko_lanes *l) {
  int bad = check(l);
  if (bad == -ECHILD) return 0; /* a forked child's copy: left alone, as the pool's */
  if (bad) return bad;
  if (in_own_task(l)) return -EDEADLK;
  close_table(l);
  for (;;) {
    drive_withdrawn(l);
    tko__mutex_lock(&l->idle_mu);
    if (tko__load_seq(&l->runners) == 0) break;
    /* Runners are out. If the pool has nothing queued or running, they
     * cannot be live: a live runner is queued or running, or has already
     * counted itself out (the pool's idle check errs only towards "busy").
     * Then the pool dropped them: dispose of their lanes here. */
    tko__mutex_unlock(&l->idle_mu);
    bool pool_idle = tko_pool_wait_idle(l->pool, 0) == 0;
    if (pool_idle && tko__load_seq(&l->runners) != 0) {
      for (unsigned i = 0; i <= l->mask; i++)
        lane_cancel(l, lane_at(l, i), true);
    }
    tko__mutex_lock(&l->idle_mu);
    if (!pool_idle && tko__load_seq(&l->runners) != 0)
      tko__cond_wait(&l->idle_cv, &l->idle_mu);
    tko__mutex_unlock(&l->idle_mu);
  }
  tko__mutex_unlock(&l->idle_mu);
  /* Detached first: a shutdown of the pool resolving the table right now
   * (its close callback takes every lane's mu) is waited for before the
   * mutexes go (test attack_lanes2/destroy_races_shutdown_of_a_paused_pool,
   * under TSan). The pool may be freed from here on. */
  tko__detach(l->pool, &l->attach);
  const tko_allocator *a = l->opts.allocator;
  for (unsigned i = 0; i <= l->mask; i++) {
    lane *ln = lane_at(l, i);
    tko__mutex_destroy(&ln->mu);
    tko__mem_free(a, ln->ring);
    tko__mem_free(a, ln->scratch);
    tko__mem_free(a, ln->meta);
    tko__mem_free(a, ln->scratch_meta);
  }
  tko__mutex_destroy(&l->idle_mu);
  pthread_cond_destroy(&l->idle_cv);
  l->magic = LANES_DEAD;
  tko__mem_free(a, l->raw);
  tko__mem_free(a, l);
  return 0;
}

void tko_lanes_stats(tko_lanes *l, tko_lane_stats *out) {
  if (!l || !out) return;
  memset(out, 0, sizeof *out);
  if (check(l)) return;
  for (unsigned i = 0; i <= l->mask; i++) {
    lane *ln = lane_at(l, i);
    tko__mutex_lock(&ln->mu);
    out->submitted += ln->submitted;
    out->completed += ln->completed;
    out->failed += ln->failed;
    out->cancelled += ln->cancelled;
    out->queued += ln->count;
    out->visits += ln->visits;
    if (ln->max_batch > out->max_batch) out->max_batch = ln->max_batch;
    if (ln->used) out->lanes_used++;
    tko__mutex_unlock(&ln->mu);
  }
}
