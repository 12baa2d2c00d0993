/* Elastic workers: spawned when work is queued and no worker is idle,
 * retired after elastic_idle_ms asleep.
 *
 * Counting: elastic_count is reserved with a CAS loop before a thread is
 * started (so it can never pass max_elastic, however many threads submit at
 * once) and released by the retiring worker under the queue lock, after it
 * has seen the queue empty; a submit pushes under the same lock and reads the
 * count after unlocking, so either the retiring worker sees the new task and
 * stays, or the submit sees the released count and can spawn a replacement.
 * The count never goes negative: only a worker that holds a reservation
 * releases one.
 *
 * Threads: max_elastic slots, each holding at most one thread handle. A
 * retiring worker marks its slot RETIRING; the next spawn into that slot
 * joins the old thread first, and shutdown joins whatever is left, so no
 * handle leaks and destroy joins every thread it started. */
#include <errno.h>

#include "internal.h"

static void raise_peak(tko_pool *pool, unsigned n) {
  unsigned peak = tko__load_relaxed(&pool->elastic_peak);
  /* seq_cst CAS; the peak is a statistic and needs no other ordering. */
  while (peak < n && !tko__cas_seq(&pool->elastic_peak, &peak, n)) {
  }
}

static tko__worker *free_slot(tko_pool *pool) {
  for (unsigned i = pool->opts.workers; i < pool->nslots; i++) {
    tko__worker *w = &pool->slots[i];
    /* Acquire: pairs with the release in try_retire, so the old thread's
     * writes to the slot happen before this spawn reuses it. */
    if (tko__load_acquire(&w->slot_state) != TKO__SLOT_RUNNING) return w;
  }
  return NULL;
}

void tko__elastic_spawn(tko_pool *pool) {
  unsigned n = tko__load_relaxed(&pool->elastic_count);
  do {
    if (n >= pool->opts.max_elastic) return;
  } while (!tko__cas_seq(&pool->elastic_count, &n, n + 1));

  if (pthread_mutex_trylock(&pool->spawn_mu) != 0) {
    tko__sub_seq(&pool->elastic_count, 1);
    return;
  }
  /* Every RUNNING slot holds a reservation and ours is not among them, so a
   * free slot exists. */
  tko__worker *w = pool->spawn_closed ? NULL : free_slot(pool);
  int rc = -ESHUTDOWN;
  if (w) {
    if (w->has_thread) {
      pthread_join(w->thread, NULL);
      w->has_thread = false;
    }
    tko__store_relaxed(&w->slot_state, TKO__SLOT_RUNNING); /* under spawn_mu */
    tko__idle_search_begin(&pool->idle); /* the new worker starts searching */
    rc = tko__thread_start(pool, w);
    if (rc) {
      tko__idle_search_end(&pool->idle);
      tko__store_relaxed(&w->slot_state, TKO__SLOT_EMPTY);
    }
  }
  pthread_mutex_unlock(&pool->spawn_mu);
  if (rc) {
    tko__sub_seq(&pool->elastic_count, 1);
    return;
  }
  tko__add_relaxed(&pool->elastic_spawned, 1);
  raise_peak(pool, n + 1);
}

bool tko__elastic_try_retire(tko_pool *pool, tko__worker *w) {
  /* Stop searching before looking: a submit that then finds nobody
   * searching or sleeping spawns (or this worker sees its task). */
  tko__idle_search_end(&pool->idle);
  tko__lock_acquire(&pool->lock);
  bool retire = pool->queue.len == 0 && !tko__load_relaxed(&pool->closing);
  if (retire) {
    /* Mark the slot free before releasing the count: a spawner whose CAS
     * reads the released count then also sees the slot free (the release
     * RMW below orders this store before it; free_slot's acquire pairs). */
    tko__store_release(&w->slot_state, TKO__SLOT_RETIRING);
    tko__sub_seq(&pool->elastic_count, 1);
    tko__add_relaxed(&pool->elastic_retired, 1);
  }
  tko__unlock(&pool->lock);
  if (!retire) tko__idle_search_begin(&pool->idle);
  return retire;
}

void tko__elastic_close_and_join(tko_pool *pool) {
  pthread_mutex_lock(&pool->spawn_mu);
  pool->spawn_closed = true;
  for (unsigned i = pool->opts.workers; i < pool->nslots; i++) {
    tko__worker *w = &pool->slots[i];
    if (w->has_thread) {
      pthread_join(w->thread, NULL);
      w->has_thread = false;
    }
    tko__store_relaxed(&w->slot_state, TKO__SLOT_EMPTY);
  }
  pthread_mutex_unlock(&pool->spawn_mu);
}
