/* SPDX-License-Identifier: MIT */
/* The pool: options, create, wait_idle, pause and resume, destroy, trim,
 * stats (submits are in submit.c, shutdown in lifecycle.c).
 *
 * Accounting that makes wait_idle and stats cheap: a task is submitted
 * (an inbox reservation), then started, finished or cancelled (per-worker or
 * pool counters). Nothing is queued or running exactly when
 * finished + cancelled == submitted; every counter only grows, so reading
 * finished and cancelled first and submitted last can only err towards "not
 * idle yet", never towards a false "idle". */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdalign.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "engine.h"
#include "seam.h"
#include "mem.h"
#include "wake.h"

tko_options tko_basic_options(unsigned workers) {
  tko_options o;
  memset(&o, 0, sizeof o);
  o.workers = workers ? workers : tko__cpu_count();
  o.elastic_idle_ms = 1000;
  o.spin_yields = 8;
  o.initial_capacity = 256;
  o.name = "tko";
  return o;
}

tko_options tko_elastic_options(unsigned workers, unsigned max_elastic, unsigned elastic_idle_ms) {
  tko_options o = tko_basic_options(1);
  o.workers = workers;
  o.max_elastic = max_elastic;
  o.elastic_idle_ms = elastic_idle_ms ? elastic_idle_ms : 1000;
  return o;
}

static int check_options(const tko_options *o) {
  if (o->workers == 0 && o->max_elastic == 0) return -EINVAL;
  if (o->workers > TKO_MAX_WORKERS || o->max_elastic > TKO_MAX_ELASTIC) return -EINVAL;
  if (o->elastic_idle_ms > TKO_MAX_IDLE_MS) return -EINVAL;
  if (o->initial_capacity > TKO_MAX_INITIAL_CAPACITY) return -EINVAL;
  if (o->spin_yields > 1000000u) return -EINVAL;
  if (o->full_policy > TKO_FULL_CALLER_RUNS) return -EINVAL;
  if (o->max_batch > TKO__GRAB_MAX) return -EINVAL;
  if (o->aging_ms > TKO_MAX_IDLE_MS) return -EINVAL;
  if (o->queue_capacity > TKO_MAX_QUEUE_CAPACITY) return -EINVAL;
  if (o->queues > TKO_MAX_QUEUES) return -EINVAL;
  if (!tko__allocator_valid(o->allocator)) return -EINVAL;
  if (o->max_threads && (o->max_threads < o->workers + o->max_elastic ||
                         o->max_threads > TKO_MAX_WORKERS + TKO_MAX_ELASTIC))
    return -EINVAL;
  return 0;
}

/* tko_options.max_threads, 0 resolved: room to grow to 4 threads per CPU. */
static unsigned max_threads(const tko_options *o) {
  if (o->max_threads) return o->max_threads;
  unsigned n = o->workers + o->max_elastic, cpus = tko__cpu_count();
  unsigned lim = TKO_MAX_WORKERS + TKO_MAX_ELASTIC;
  if (cpus > lim / 4) cpus = lim / 4;
  return n > 4 * cpus ? n : 4 * cpus;
}

/* What queues = 0 means: 0, a queue per basic worker; CMake's
 * TKO_DEFAULT_QUEUES may fix a count instead (CI runs the suite once with
 * 1, one queue for the whole pool). */
#ifndef TKO_DEFAULT_QUEUES
#define TKO_DEFAULT_QUEUES 0
#endif

/* tko_options.queues, resolved (shard.c): one queue where order is exact
 * (one worker, no elastic ones) or tasks age (aging compares submit
 * times, which several queues cannot), and never more queues than
 * threads the pool may run at once at create. */
static unsigned shard_count(const tko_options *o) {
  unsigned n = o->queues ? o->queues : TKO_DEFAULT_QUEUES ? TKO_DEFAULT_QUEUES : o->workers;
  if (n == 0) n = 1; /* elastic workers only */
  if (n > TKO_MAX_QUEUES) n = TKO_MAX_QUEUES;
  unsigned threads = o->workers + o->max_elastic;
  if (o->aging_ms || (o->workers == 1 && o->max_elastic == 0)) n = 1;
  return n < threads ? n : threads;
}

/* Allocates and initialises the shards (nshards set). */
static int shards_init(tko_pool *pool, size_t capacity) {
  const tko_allocator *a = pool->opts.allocator;
  pool->shards = tko__mem_alloc_aligned(a, (size_t)pool->nshards * sizeof *pool->shards,
                                        alignof(tko__shard), &pool->shards_raw);
  if (!pool->shards) return -ENOMEM;
  memset(pool->shards, 0, (size_t)pool->nshards * sizeof *pool->shards);
  /* Spread the first slab over the shards. */
  size_t each = (capacity + pool->nshards - 1) / pool->nshards;
  for (unsigned i = 0; i < pool->nshards; i++) {
    tko__shard *sh = &pool->shards[i];
    tko__lock_init(&sh->lock);
    atomic_init(&sh->backlog, 0);
    atomic_init(&sh->top, INT_MIN);
    atomic_init(&sh->top_since, 0);
    sh->index = i;
    int rc = tko__queue_init(&sh->queue, each, a);
    if (rc) {
      pool->nshards = i; /* free_pool finishes those made */
      return rc;
    }
    sh->queue.aging_ns = (uint64_t)pool->opts.aging_ms * 1000000u;
    sh->queue.alone_tag = TKO__CTX_ALONE; /* a worker takes an owned task alone */
  }
  return 0;
}

static void worker_init(tko__worker *w, tko_pool *pool, unsigned index, tko_worker_kind kind) {
  memset(w, 0, sizeof *w);
  w->pool = pool;
  w->index = index;
  w->kind = kind;
  /* Workers' homes spread over the shards, elastic ones after the basic. */
  unsigned place = kind == TKO_WORKER_BASIC ? index : pool->opts.workers + index;
  w->home = index == UINT32_MAX ? 0 : place % pool->nshards;
  w->swept_ns = TKO__SWEEP_DUE;
  atomic_init(&w->started, 0);
  atomic_init(&w->staging, false);
  atomic_init(&w->finished, 0);
  atomic_init(&w->failed, 0);
  atomic_init(&w->handbacks, 0);
  atomic_init(&w->late_inversions, 0);
  atomic_init(&w->room_given, 0);
  atomic_init(&w->room_settled, 0);
  atomic_init(&w->slot_state, TKO__SLOT_EMPTY);
}

/* Whether the workers stage ring slots before they lock a queue (ring.h:
 * the stage): with rings, and only from TKO__STAGE_MIN_QUEUES queues on.
 * A queue's lock has few takers where there are few queues, so a stage
 * would shorten waits that seldom happen, and its copy is a cost
 * (docs/PERFORMANCE.md: probe_flood's mixed floods on two workers). */
static bool stages(const tko_pool *pool) {
  return !pool->rings.off && pool->nshards >= TKO__STAGE_MIN_QUEUES;
}

static void free_pool(tko_pool *pool) {
  const tko_allocator *a = pool->opts.allocator;
  /* The features first, while the pool is whole and still valid (the
   * keyed table's destroy calls the pool). */
  tko__phases_fini(pool);
  pool->magic = 0; /* see TKO__POOL_MAGIC */
  for (unsigned i = 0; i < pool->nslots; i++) tko__sleeper_fini(&pool->slots[i].sleeper);
  tko__mem_free(a, pool->slots_raw);
  tko__mem_free(a, pool->stages_raw);
  for (unsigned i = 0; pool->shards && i < pool->nshards; i++)
    tko__queue_fini(&pool->shards[i].queue);
  tko__mem_free(a, pool->shards_raw);
  tko__queue_fini(&pool->held);
  tko__mutex_destroy(&pool->async_mu);
  tko__inbox_fini(&pool->inbox, a);
  if (pool->rings.uid) tko__rings_fini(&pool->rings); /* uid: set once initialised */
  tko__mutex_destroy(&pool->spawn_mu);
  pthread_cond_destroy(&pool->spawn_cv);
  tko__mutex_destroy(&pool->keyed_mu);
  tko__mutex_destroy(&pool->help_mu);
  tko__mutex_destroy(&pool->idle_mu);
  pthread_cond_destroy(&pool->idle_cv);
  tko__mutex_destroy(&pool->gate_mu);
  pthread_cond_destroy(&pool->gate_cv);
  tko__mutex_destroy(&pool->timer_mu);
  pthread_cond_destroy(&pool->timer_cv);
  tko__mem_free(a, pool->raw);
}

static int init_sync(tko_pool *pool) {
  pthread_condattr_t ca;
  if (pthread_condattr_init(&ca)) return -ENOMEM;
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  int bad =
      tko__mutex_init(&pool->keyed_mu, TKO__RANK_KEYED) |
      tko__mutex_init(&pool->spawn_mu, TKO__RANK_SPAWN) |
      tko__mutex_init(&pool->idle_mu, TKO__RANK_IDLE_WAIT) |
      pthread_cond_init(&pool->idle_cv, &ca) | tko__mutex_init(&pool->gate_mu, TKO__RANK_GATE) |
      pthread_cond_init(&pool->gate_cv, &ca) | tko__mutex_init(&pool->timer_mu, TKO__RANK_TIMER) |
      pthread_cond_init(&pool->timer_cv, &ca) | tko__mutex_init(&pool->async_mu, TKO__RANK_ASYNC) |
      pthread_cond_init(&pool->spawn_cv, &ca) | tko__mutex_init(&pool->help_mu, TKO__RANK_HELP);
  pthread_condattr_destroy(&ca);
  return bad ? -ENOMEM : 0;
}

int tko_pool_create(tko_pool **out, const tko_options *opts) {
  if (!out || !opts) return -EINVAL;
  *out = NULL;
  int rc = check_options(opts);
  tko__thread_place place;
  if (rc == 0) rc = tko__place_init(&place, opts->cpus, opts->ncpus, opts->stack_size);
  if (rc) return rc;
  const tko_allocator *a = opts->allocator;
  /* Cache-line aligned, so that its TKO_CACHE_ALIGNED fields (the inbox's
   * tail, the lock, the room count) start lines of their own. */
  void *raw;
  tko_pool *pool = tko__mem_alloc_aligned(a, sizeof *pool, alignof(tko_pool), &raw);
  if (!pool) return -ENOMEM;
  memset(pool, 0, sizeof *pool);
  pool->raw = raw;
  pool->opts = *opts;
  tko__fork_watch();
  pool->fork_gen = tko__fork_generation();
  pool->creator_nice = tko__thread_nice();
  if (!pool->opts.elastic_idle_ms) pool->opts.elastic_idle_ms = 1000;
  if (!pool->opts.spin_yields) pool->opts.spin_yields = 8;
  if (!pool->opts.max_batch) pool->opts.max_batch = TKO__BATCH_DEFAULT;
  /* Thread names are limited to 15 characters: "<name>-e1023" fits a
   * 9-character prefix, so longer names are cut. */
  snprintf(pool->name, sizeof pool->name, "%s", opts->name ? opts->name : "tko");
  pool->opts.name = NULL; /* the caller's string need not outlive create */
  pool->place = place;
  pool->opts.cpus = NULL; /* nor the caller's CPU list */
  const tko_hooks *h = &opts->hooks;
  pool->timing = h->before_run || h->after_run || h->on_failure;
  /* Slots for every worker a resize may ask for (resize.c), so that none
   * is ever reallocated under a running thread. */
  pool->opts.max_threads = max_threads(opts);
  unsigned cap = pool->opts.max_threads;
  pool->elastic_base = cap < TKO_MAX_WORKERS ? cap : TKO_MAX_WORKERS;
  pool->nslots = pool->elastic_base + (cap < TKO_MAX_ELASTIC ? cap : TKO_MAX_ELASTIC);
  atomic_init(&pool->basic_target, opts->workers);
  atomic_init(&pool->elastic_max, opts->max_elastic);
  atomic_init(&pool->drained, false);
  atomic_init(&pool->weight_ceiling, INT_MIN);
  unsigned recheck_us = opts->recheck_us ? opts->recheck_us : TKO__RECHECK_DEFAULT_US;
  pool->recheck_ns = (uint64_t)recheck_us * 1000u;

  rc = init_sync(pool);
  if (rc == 0) rc = tko__inbox_init(&pool->inbox, TKO__INBOX_CAPACITY, a);
  /* One worker and no elastic ones: exact order, through the shared inbox
   * alone (ring.h). */
  pool->nshards = shard_count(opts);
  if (rc == 0)
    rc = tko__rings_init(&pool->rings, opts->workers == 1 && opts->max_elastic == 0,
                         pool->nshards, a);
  if (rc == 0) rc = shards_init(pool, opts->initial_capacity ? opts->initial_capacity : 256);
  if (rc == 0) rc = tko__queue_init(&pool->held, 16, a);
  pool->held.aging_ns = (uint64_t)opts->aging_ms * 1000000u;
  pool->stamp_enqueue = pool->timing || opts->aging_ms;
  pool->count_late = pool->timing && !opts->aging_ms;
  if (rc == 0) {
    /* Each slot's counters on lines of their own (tko__worker). */
    pool->slots = tko__mem_alloc_aligned(a, (size_t)pool->nslots * sizeof *pool->slots,
                                         alignof(tko__worker), &pool->slots_raw);
    if (!pool->slots) rc = -ENOMEM;
  }
  if (rc == 0 && stages(pool)) {
    /* Not zeroed: a stage's pages are touched only where stages run. */
    pool->stages_raw = tko__mem_alloc(a, (size_t)pool->nslots * sizeof(tko__ring_stage));
    if (!pool->stages_raw) rc = -ENOMEM;
  }
  if (rc) {
    pool->nslots = 0;
    free_pool(pool);
    return rc;
  }
  pool->magic = TKO__POOL_MAGIC;
  /* Slot i's sleeper is bit i of the idle set. */
  tko__idle_init(&pool->idle, &pool->slots[0].sleeper, sizeof *pool->slots, pool->nslots);
  worker_init(&pool->caller, pool, UINT32_MAX, TKO_WORKER_BASIC);
  for (unsigned i = 0; i < pool->nslots; i++) {
    bool basic = i < pool->elastic_base;
    worker_init(&pool->slots[i], pool, basic ? i : i - pool->elastic_base,
                basic ? TKO_WORKER_BASIC : TKO_WORKER_ELASTIC);
    if (pool->stages_raw) pool->slots[i].stage = (tko__ring_stage *)pool->stages_raw + i;
    if (tko__sleeper_init(&pool->slots[i].sleeper, i)) {
      pool->nslots = i;
      free_pool(pool);
      return -ENOMEM;
    }
  }
  for (unsigned i = 0; i < opts->workers; i++) {
    tko__idle_search_begin(&pool->idle); /* each new worker starts searching */
    tko__add_seq(&pool->basic_alive, 1);
    /* Before the thread runs: only spawn_mu's holders read it later. */
    atomic_init(&pool->slots[i].slot_state, TKO__SLOT_RUNNING);
    tko__thread_enter(pool);
    rc = tko__thread_start(pool, &pool->slots[i]);
    if (rc) {
      tko__thread_exit(pool);
      tko__idle_search_end(&pool->idle);
      tko__sub_seq(&pool->basic_alive, 1);
      tko_pool_shutdown(pool, TKO_DRAIN); /* joins those already started */
      free_pool(pool);
      return rc;
    }
  }
  *out = pool;
  return 0;
}

static uint64_t sum_finished(tko_pool *pool) {
  /* seq_cst loads: wait_idle's half of the Dekker pair with run_batch's
   * seq_cst publish and tko__notify_idle. */
  uint64_t done = tko__load_seq(&pool->caller.finished);
  for (unsigned i = 0; i < pool->nslots; i++) done += tko__load_seq(&pool->slots[i].finished);
  return done;
}

static bool pool_is_idle(void *p) {
  tko_pool *pool = p;
  /* seq_cst: wait_idle's half of the Dekker pair, as sum_finished's loads:
   * cancelled and runners_done are added seq_cst (run.c: tko__cancel_item,
   * run_runner; take.c: tko__withdraw_owned; timer.c: hand_to_cancel)
   * before tko__notify_idle loads idle_waiters. */
  uint64_t done = sum_finished(pool) + tko__load_seq(&pool->cancelled) +
                  tko__load_seq(&pool->runners_done); /* runners are not tasks */
  return done == tko__submitted(pool);
}

bool tko__pool_is_current(const tko_pool *pool) {
  return tko__current_pool == pool || tko__in_shutdown(pool);
}

int tko_pool_wait_idle(tko_pool *pool, long timeout_ms) {
  int rc = tko__pool_check(pool);
  if (rc) return rc;
  if (timeout_ms < -1) return -EINVAL;
  if (tko__pool_is_current(pool)) return -EDEADLK;
  struct timespec deadline;
  if (timeout_ms >= 0) tko__deadline_after(&deadline, timeout_ms);
  tko__add_seq(&pool->idle_waiters, 1); /* seq_cst: see sum_finished */
  tko__mutex_lock(&pool->idle_mu);
  rc = tko__cond_wait_until(&pool->idle_cv, &pool->idle_mu, timeout_ms < 0 ? NULL : &deadline,
                            pool_is_idle, pool);
  tko__mutex_unlock(&pool->idle_mu);
  tko__sub_seq(&pool->idle_waiters, 1);
  return rc;
}

int tko_pool_pause(tko_pool *pool) {
  int rc = tko__pool_check(pool);
  if (rc) return rc;
  /* seq_cst: pairs with drain_for_take's second load of paused (take.c),
   * after its drain: a take whose drain saw a task submitted after this
   * store sees the pause. */
  tko__store_seq(&pool->paused, true);
  return 0;
}

int tko_pool_resume(tko_pool *pool) {
  int rc = tko__pool_check(pool);
  if (rc) return rc;
  /* seq_cst store, then signal_work's seq_cst load of idle.state: a worker
   * that announced its sleep either is seen here and woken, or re-checks
   * paused after this store (worker_sleep). One wake is enough: each worker
   * that finds work wakes the next while work remains. */
  tko__store_seq(&pool->paused, false);
  /* A pause after shutdown began (whose close woke every sleeper) lets
   * workers sleep with tasks queued. One wake would drain those, but the
   * other sleepers must also see "closing, nothing left" and exit, or
   * shutdown waits for them forever: wake them all - and every worker
   * waiting in a group wait, which may have slept while the pool was
   * paused with its group's members queued (else the drain never ends:
   * test resume_helpers/a_resume_in_a_drain_wakes_a_paused_group_wait).
   * seq_cst loads, after the store
   * above: closing pairs with close_pool's store (lifecycle.c), helpers
   * with a helper's increment before its re-check (help.c:
   * tko__helper_sleep). */
  if (tko__load_seq(&pool->closing)) {
    tko__idle_wake_all(&pool->idle);
    if (tko__load_seq(&pool->helpers)) tko__wake_helpers(pool);
  } else if (tko__has_work_seq(pool)) {
    tko__signal_work(pool);
  }
  return 0;
}

int tko_pool_destroy(tko_pool *pool) {
  if (!pool || pool->magic != TKO__POOL_MAGIC) return -EINVAL;
  if (tko__pool_forked(pool)) {
    /* The threads stayed in the parent, and a parent thread may have been
     * in the middle of growing a buffer at the fork (the copy then holds a
     * pointer already freed), so nothing in the copy can be trusted to
     * free: the child's copy is left as is. */
    return 0;
  }
  if (tko__current_pool == pool || tko__in_role(pool)) return -EDEADLK;
  int rc = tko_pool_shutdown(pool, TKO_DRAIN); /* continues one already begun */
  if (rc) return rc;
  if (tko__attached(pool)) return -EBUSY; /* shut down, not freed: see lifecycle.h */
  free_pool(pool);
  return 0;
}

/* Swaps q's slab for one of its initial size if q is empty: the new slab
 * is allocated and the old one freed outside the queue lock (unmapping a
 * burst's slab can take a while). */
static void trim_queue(tko_pool *pool, tko__shard *sh, tko__queue *q) {
  if (!tko__queue_oversized(q)) return;
  const tko_allocator *a = pool->opts.allocator;
  size_t bytes = tko__queue_initial_bytes(q);
  void *slab = tko__mem_array_alloc(a, bytes);
  if (!slab) return; /* no memory to shrink into: keep the big one */
  tko__lock_acquire(&sh->lock);
  tko__shard_drain_locked(pool, sh);
  tko__queue_swap_slab(q, &slab, &bytes); /* slab: the old one, or the unused new one */
  tko__unlock(&sh->lock);
  tko__mem_array_free(a, slab, bytes);
}

#ifdef TKO_TEST_SEAMS
void (*_Atomic tko__test_trim_waits)(void);
#endif

void tko__pool_trim(tko_pool *pool) {
  tko__add_seq(&pool->trims, 1);
  for (unsigned i = 0; i < pool->nshards; i++)
    trim_queue(pool, &pool->shards[i], &pool->shards[i].queue);
  trim_queue(pool, &pool->shards[0], &pool->held);
  /* The rings' spares only while nothing is queued, as the slabs: a
   * backlog will want them again soon. Not while a worker's stage may read
   * a segment (shard.c: tko__shard_stage; the Dekker pair with trims,
   * incremented above; acquire, so its reads come before the frees). */
  if (!tko__has_work_hint(pool)) {
    for (unsigned i = 0; i < pool->nslots; i++)
      for (unsigned step = 0; tko__load_seq(&pool->slots[i].staging); step++) {
        void (*seam)(void) = TKO__SEAM(tko__test_trim_waits);
        if (seam && step == 0) seam();
        tko__wait_step(step, 32);
      }
    tko__rings_trim(&pool->rings);
  }
  /* Release: pairs with tko_pool_trim's acquire load, so a host that waited
   * this trim out sees the memory it gave back counted. */
  atomic_fetch_sub_explicit(&pool->trims, 1, memory_order_release);
}

bool tko__pool_trimmable(const tko_pool *pool) {
  for (unsigned i = 0; i < pool->nshards; i++)
    if (tko__queue_oversized(&pool->shards[i].queue)) return true;
  return tko__queue_oversized(&pool->held) || tko__rings_trimmable(&pool->rings);
}

int tko_pool_trim(tko_pool *pool) {
  int rc = tko__pool_check(pool);
  if (rc) return rc;
  tko__pool_trim(pool);
  /* An idle worker's trim may hold segments it took from the rings and
   * has not freed yet (a trim takes a ring's spares whole): wait it out.
   * Acquire: pairs with the release in tko__pool_trim. */
  for (unsigned step = 0; tko__load_acquire(&pool->trims); step++) tko__wait_step(step, 32);
  return 0;
}

/* Sums one counter over the caller slot and every worker slot. Acquire
 * loads: each pairs with tko__count_own's release (engine.h), so a caller that
 * sees a task counted also sees what it wrote, and no later load of the
 * snapshot is satisfied before these. */
static uint64_t sum_slots(tko_pool *pool, size_t offset) {
  uint64_t n = tko__load_acquire((atomic_uint_fast64_t *)((char *)&pool->caller + offset));
  for (unsigned i = 0; i < pool->nslots; i++)
    n += tko__load_acquire((atomic_uint_fast64_t *)((char *)&pool->slots[i] + offset));
  return n;
}

/* Tasks of the host ever accepted: every submission but the keyed table's
 * runners. A runner is counted out before its inbox reservation, and out
 * is read after: a runner never counts as a task, though one being queued
 * may be subtracted a moment before its reservation is (a lag of at most
 * one per lane). */
static uint64_t tasks_submitted(tko_pool *pool) {
  uint64_t all = tko__submitted(pool); /* seq_cst loads */
  uint64_t runners = tko__load_seq(&pool->runners_out);
  return all > runners ? all - runners : 0;
}

/* The elastic figures, consistent with each other: retired is read
 * before spawned (each thread counts itself spawned before it can retire:
 * tko__elastic_started), so retired never exceeds spawned; the count
 * includes reservations whose thread has not started (or never will), so
 * the workers reported are at most spawned - retired, and the peak at
 * least those. */
static void elastic_snapshot(tko_pool *pool, tko_stats *out) {
  out->elastic_retired = tko__load_seq(&pool->elastic_retired);
  out->elastic_spawned = tko__load_seq(&pool->elastic_spawned);
  uint64_t alive = out->elastic_spawned - out->elastic_retired;
  unsigned count = tko__load_relaxed(&pool->elastic_count);
  out->elastic_workers = count < alive ? count : (unsigned)alive;
  out->elastic_peak = tko__load_relaxed(&pool->elastic_peak);
  if (out->elastic_peak < out->elastic_workers) out->elastic_peak = out->elastic_workers;
}

/* A snapshot that never reports the impossible (running above the
 * workers, queued above the capacity, a sum above submitted): every
 * counter only grows, a task is counted submitted before started (or
 * cancelled) and started before finished, so the counts are read in that
 * order - submitted, then every slot's started, then every finished and
 * cancelled, then submitted again for the report. completed is the
 * finished count cut to the started count read before it (a task that
 * started and finished between the two reads is still queued in this
 * snapshot, not also completed: tests/api/test_stats.c's sum check).
 * running (started - completed) is then at most what was running at the
 * instant the last started was read, and queued (the first submitted -
 * started - cancelled) at most what was queued at the first read: each may
 * lag, neither over-counts, and submitted is never below the others' sum
 * (started + cancelled <= the second submitted read; the keyed table's
 * runners, left out, may make it lag for a moment: then it is raised to
 * the sum). A bounded
 * pool's queued is also clamped to queue_capacity (a task leaves the
 * bound a moment before it counts as started). */
void tko_pool_stats(tko_pool *pool, tko_stats *out) {
  if (!pool || !out) return;
  memset(out, 0, sizeof *out);
  if (pool->magic != TKO__POOL_MAGIC) return; /* destroyed: see tko_pool_destroy */
  uint64_t submitted = tasks_submitted(pool);
  uint64_t started = sum_slots(pool, offsetof(tko__worker, started));
  uint64_t finished = sum_slots(pool, offsetof(tko__worker, finished));
  uint64_t failed = sum_slots(pool, offsetof(tko__worker, failed));
  out->cancelled = tko__load_seq(&pool->cancelled);
  out->completed = finished < started ? finished : started;
  out->failed = failed < out->completed ? failed : out->completed;
  out->running = started - out->completed;
  uint64_t gone = started + out->cancelled;
  out->queued = submitted > gone ? submitted - gone : 0;
  size_t cap = pool->opts.queue_capacity;
  if (cap && out->queued > cap) out->queued = cap;
  out->submitted = tasks_submitted(pool);
  uint64_t seen = out->completed + out->cancelled + out->running + out->queued;
  if (out->submitted < seen) out->submitted = seen;
  out->basic_workers = tko__load_relaxed(&pool->basic_alive);
  elastic_snapshot(pool, out);
  out->blocking = tko__load_relaxed(&pool->blocking);
  out->caller_runs =
      tko__load_relaxed(&pool->caller_runs) + tko__load_relaxed(&pool->off_worker_runs);
  out->lock_contended = 0;
  out->queue_bytes = tko__load_relaxed(&pool->held.slab_bytes);
  for (unsigned i = 0; i < pool->nshards; i++) { /* relaxed: statistics */
    out->lock_contended += tko__load_relaxed(&pool->shards[i].lock.contended);
    out->queue_bytes += tko__load_relaxed(&pool->shards[i].queue.slab_bytes);
  }
  out->queue_bytes += tko__rings_bytes(&pool->rings);
  out->async_inflight = tko__load_relaxed(&pool->held_inflight);
  out->handbacks = sum_slots(pool, offsetof(tko__worker, handbacks));
  out->late_inversions = sum_slots(pool, offsetof(tko__worker, late_inversions));
}
