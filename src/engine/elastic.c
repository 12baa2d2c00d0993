/* SPDX-License-Identifier: MIT */
/* Elastic workers: spawned when work is queued and no worker is idle,
 * retired after elastic_idle_ms asleep.
 *
 * Counting: elastic_count is reserved with a CAS loop before a thread is
 * started (so it can never pass max_elastic, however many threads submit at
 * once) and released by the retiring worker. The count never goes negative:
 * only a worker that holds a reservation releases one. max_elastic is
 * elastic_max, which tko_pool_resize may lower below the count: the
 * workers above it then retire as they finish their task (resize.c).
 *
 * No task is stranded by a retirement (think of an elastic-only pool): a
 * submit reserves its task's position (a seq_cst CAS), then reads idle.state and,
 * seeing nobody idle, CASes the count to spawn. The retiring worker releases
 * the count (seq_cst), then re-reads the inbox. Either the submit's CAS sees the
 * released count and spawns, or the worker's re-read sees the reservation and the
 * worker takes its reservation and then its slot back (take_slot_back) and
 * carries on.
 *
 * Threads: elastic slots [elastic_base, nslots), room for the most
 * tko_pool_resize may allow, each holding at most one thread handle. A
 * retiring worker marks its slot RETIRING; the next spawn into that slot
 * joins the old thread first, and shutdown joins whatever is left, so no
 * handle leaks and destroy joins every thread it started. Joins and thread
 * creation happen outside spawn_mu (a retiring thread's stop hook may
 * submit, and so spawn); a slot being spawned into is marked `spawning` so
 * nobody else claims it, and shutdown waits for spawns in flight. */
#include <errno.h>

#include "engine.h"
#include "seam.h"
#include "wake.h"

#ifdef TKO_TEST_SEAMS
void (*_Atomic tko__test_retire_window)(tko_pool *pool);
void (*_Atomic tko__test_spawn_window)(tko_pool *pool, bool created);
#endif

/* A test seam (prim.h, seam.h). */
static void spawn_window(tko_pool *pool, bool created) {
  void (*seam)(tko_pool *, bool) = TKO__SEAM(tko__test_spawn_window);
  if (seam) seam(pool, created);
}

static void raise_peak(tko_pool *pool, unsigned n) {
  unsigned peak = tko__load_relaxed(&pool->elastic_peak);
  /* seq_cst CAS; the peak is a statistic and needs no other ordering. */
  while (peak < n && !tko__cas_seq(&pool->elastic_peak, &peak, n)) {
  }
}

static bool reserve_count(tko_pool *pool) {
  unsigned n = tko__load_relaxed(&pool->elastic_count);
  /* Relaxed: tko_pool_resize may lower the maximum meanwhile; a worker this
   * reservation starts then finds itself above it and retires (resize.c). */
  unsigned max = tko__load_relaxed(&pool->elastic_max);
  /* seq_cst: the submit's side of the essay's pair with
   * tko__elastic_try_retire's release of the count before its re-check;
   * and before tko__elastic_spawn's load of drained, which a worker
   * stored before its count fell (worker.c: tko__worker_main). */
  do {
    if (n >= max) return false;
  } while (!tko__cas_seq(&pool->elastic_count, &n, n + 1));
  return true;
}

/* Claims a slot whose thread is gone or going; caller holds spawn_mu. */
static tko__worker *claim_slot(tko_pool *pool) {
  for (unsigned i = pool->elastic_base; i < pool->nslots; i++) {
    tko__worker *w = &pool->slots[i];
    if (w->spawning) continue; /* its spawner has not recorded the thread yet */
    /* A claimed slot's new thread joins its old one (tko__elastic_spawn),
     * so the spawner waits for no thread. A thread_stop hook may submit and
     * so spawn: it skips its own slot and the slots of other stop hooks,
     * whose new threads could start only once those hooks ended, and takes
     * a slot whose new thread starts at once. */
    if (w == tko__current_worker) continue;
    if (w->stopping && tko__current_worker && tko__current_worker->stopping) continue;
    /* Acquire: pairs with the release of RETIRING (tko__elastic_try_retire;
     * worker.c: retire_elastic), as the CAS's acquire half does. */
    int state = tko__load_acquire(&w->slot_state);
    /* seq_cst CAS: races with a retiring worker taking its slot back. Its
     * acquire half pairs with the release in tko__elastic_try_retire, so the
     * old thread's writes to the slot happen before this spawn reuses it. */
    if (state != TKO__SLOT_RUNNING && tko__cas_seq(&w->slot_state, &state, TKO__SLOT_RUNNING))
      return w;
  }
  return NULL;
}

void tko__elastic_spawn(tko_pool *pool) {
  if (!reserve_count(pool)) return;
  /* A worker left a closed, drained pool: no spawn is needed any more, and
   * its slot is still held, so one would take a fresh slot (an index past
   * max_elastic: hooks/thread_start_and_stop_once_per_thread saw a sixth
   * thread start during a destroy, under TSan). seq_cst: after the
   * reservation's CAS, so a reservation that saw that worker's count go
   * sees the flag it set first (worker.c). */
  if (tko__load_seq(&pool->drained)) {
    tko__sub_seq(&pool->elastic_count, 1);
    return;
  }
  tko__mutex_lock(&pool->spawn_mu);
  /* A count held means a slot is free: a retiring worker marks its slot
   * before it gives its count back, and takes the count before the slot
   * (take_slot_back). claim_slot still skips some free slots (this
   * thread's own, a stop hook's, one whose spawner is at work); finding
   * none, or spawns closed, this spawn gives its count back. */
  tko__worker *w = pool->spawn_closed ? NULL : claim_slot(pool);
  pthread_t old;
  bool join_old = false;
  if (w) {
    join_old = w->has_thread;
    old = w->thread;
    w->has_thread = false;
    w->spawning = true; /* no other spawner may claim it until we are done */
    pool->spawns_active++;
  }
  tko__mutex_unlock(&pool->spawn_mu);
  if (!w) {
    tko__sub_seq(&pool->elastic_count, 1);
    return;
  }
  /* The old thread may still be running its thread_stop hook, and a hook
   * may wait for anything, a lock this submitter holds included: the new
   * thread joins it (tko__worker_main), never this spawner, so no submit
   * waits for a hook (test elastic/a_submit_never_waits_for_a_stop_hook).
   * The slot is ours (spawning) until the thread starts. */
  w->predecessor = old;
  w->has_predecessor = join_old;
  pthread_t t;
  spawn_window(pool, false);
  int rc = tko__worker_spawn(pool, w, &t);
  if (rc == 0) spawn_window(pool, true);
  tko__mutex_lock(&pool->spawn_mu);
  if (rc == 0) {
    w->thread = t;
    w->has_thread = true;
  } else {
    /* The old thread is still to be joined: by the next spawn into the
     * slot, or by shutdown. */
    w->has_predecessor = false;
    w->thread = old;
    w->has_thread = join_old;
    tko__store_relaxed(&w->slot_state, TKO__SLOT_EMPTY); /* still ours: spawning */
  }
  w->spawning = false;
  if (--pool->spawns_active == 0) pthread_cond_broadcast(&pool->spawn_cv);
  tko__mutex_unlock(&pool->spawn_mu);
  if (rc) tko__sub_seq(&pool->elastic_count, 1);
  /* The new thread counts itself spawned (tko__elastic_started): counted
   * here, after its creation, it could retire first, and a snapshot could
   * read more elastic workers retired than spawned (test
   * retire/elastic_counts_stay_consistent_around_a_spawn). */
}

void tko__elastic_started(tko_pool *pool) {
  raise_peak(pool, tko__load_relaxed(&pool->elastic_count));
  /* seq_cst: before this thread can count itself retired; tko_pool_stats
   * reads retired, then spawned, so it never sees more retired. */
  tko__add_seq(&pool->elastic_spawned, 1);
}

/* A retiring worker that saw work come in takes its count and then its
 * slot back. Count first: a slot is RUNNING only while someone holds a
 * count for it, so a spawner that holds a count always finds a slot it may
 * claim. (Slot first would let a spawner that had just taken the last
 * count find the slot briefly RUNNING and give up, while the worker,
 * finding no count, gave its slot up too, stranding the task; test_elastic
 * has a racing-retirement case.) If the
 * count is taken, its holder - a live worker or a spawner, who will find
 * this slot - runs the work; if a spawner claimed the slot meanwhile, its
 * new thread does. */
static bool take_slot_back(tko_pool *pool, tko__worker *w) {
  if (!reserve_count(pool)) return false;
  int state = TKO__SLOT_RETIRING;
  /* seq_cst CAS: races with a spawner claiming this slot (then its new
   * thread takes the work and joins this one). */
  if (tko__cas_seq(&w->slot_state, &state, TKO__SLOT_RUNNING)) return true;
  tko__sub_seq(&pool->elastic_count, 1);
  return false;
}

bool tko__elastic_try_retire(tko_pool *pool, tko__worker *w) {
  /* Stop searching before looking, so a submit from now on spawns. */
  tko__idle_search_end(&pool->idle);
  tko__lock_acquire(&pool->shards[0].lock); /* closing's writer's */
  bool idle = !tko__runnable_seq(pool) && !tko__load_relaxed(&pool->closing);
  tko__unlock(&pool->shards[0].lock);
  if (!idle) {
    tko__idle_search_begin(&pool->idle);
    return false;
  }
  /* Free the slot before the count: a spawner whose CAS reads the released
   * count then finds the slot free (release here, acquire in claim_slot). */
  tko__store_release(&w->slot_state, TKO__SLOT_RETIRING);
  /* The window the re-check below covers: after the last look, with the
   * slot freed and the count still held, a submit finds nobody idle and
   * no count to spawn with. */
  void (*seam)(tko_pool *) = TKO__SEAM(tko__test_retire_window); /* prim.h, seam.h */
  if (seam) seam(pool);
  tko__sub_seq(&pool->elastic_count, 1);
  /* The re-check of the essay above: seq_cst, after the count's release. */
  if (tko__runnable_seq(pool) && take_slot_back(pool, w)) {
    tko__idle_search_begin(&pool->idle);
    return false;
  }
  tko__add_seq(&pool->elastic_retired, 1); /* seq_cst: see tko__elastic_started */
  return true;
}

bool tko__elastic_resurrect(tko_pool *pool, tko__worker *w) {
  if (!tko__runnable_seq(pool) || !take_slot_back(pool, w)) return false;
  tko__elastic_started(pool); /* a new start, as far as counts go */
  return true;
}

void tko__elastic_set_stopping(tko_pool *pool, tko__worker *w, bool stopping) {
  tko__mutex_lock(&pool->spawn_mu);
  w->stopping = stopping;
  tko__mutex_unlock(&pool->spawn_mu);
}

void tko__elastic_close_and_join(tko_pool *pool) {
  tko__mutex_lock(&pool->spawn_mu);
  pool->spawn_closed = true;
  while (pool->spawns_active) tko__cond_wait(&pool->spawn_cv, &pool->spawn_mu);
  for (unsigned i = pool->elastic_base; i < pool->nslots; i++) {
    tko__worker *w = &pool->slots[i];
    bool join = w->has_thread;
    pthread_t t = w->thread;
    w->has_thread = false;
    tko__store_relaxed(&w->slot_state, TKO__SLOT_EMPTY);
    if (!join) continue;
    /* Join without the lock: a worker still draining may try to spawn,
     * find spawn_closed, and must not block on spawn_mu meanwhile. */
    tko__mutex_unlock(&pool->spawn_mu);
    pthread_join(t, NULL);
    tko__mutex_lock(&pool->spawn_mu);
  }
  tko__mutex_unlock(&pool->spawn_mu);
}
