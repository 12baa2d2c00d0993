/* The pool's internal layout, shared by pool.c, worker.c and elastic.c.
 *
 * Lock order (outermost first): shutdown_mu > spawn_mu > lock > idle.mu;
 * idle_mu is taken alone. No lock is held while a task or a hook runs. */
#ifndef TKO_INTERNAL_H
#define TKO_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "atomics.h"
#include "lock.h"
#include "queue.h"
#include "signal.h"
#include "taskorch.h"

/* The most tasks a worker takes per visit to the queue. */
#define TKO__GRAB_MAX 16u

/* Elastic slot states. */
enum { TKO__SLOT_EMPTY = 0, TKO__SLOT_RUNNING, TKO__SLOT_RETIRING };

/* One worker thread (or elastic slot). The counters are written only by the
 * thread that owns the slot, so they cost a plain store per task; readers
 * sum them across slots. */
typedef struct tko__worker {
  TKO_CACHE_ALIGNED atomic_uint_fast64_t started;
  atomic_uint_fast64_t finished; /* stored seq_cst once per batch: see worker.c */
  atomic_uint_fast64_t failed;
  tko_pool *pool;
  unsigned index;
  tko_worker_kind kind;
  tko__sleeper sleeper;
  pthread_t thread; /* guarded by spawn_mu for elastic slots */
  bool has_thread;  /* started and not yet joined; guarded by spawn_mu for elastic */
  /* Elastic: TKO__SLOT_*. A spawner moves a free slot to RUNNING under
   * spawn_mu; only the slot's own thread moves it to RETIRING, under lock,
   * together with releasing its elastic count. */
  atomic_int slot_state;
} tko__worker;

struct tko_pool {
  /* Submit-side state, guarded by lock. */
  TKO_CACHE_ALIGNED tko__lock lock;
  tko__queue queue;
  uint64_t next_id;              /* ids handed out: the submitted count */
  atomic_bool closing;           /* set under lock; read lock-free by workers */
  atomic_bool cancelling;        /* TKO_CANCEL in progress */

  /* The queued count mirrored outside the lock for the sleep/submit check
   * (signal.c's essay) and for searching workers; its own line so spinners
   * do not steal the lock's. */
  TKO_CACHE_ALIGNED atomic_size_t queued;
  atomic_uint_fast64_t submitted; /* == next_id, readable without the lock */

  tko__idle idle;

  /* Elastic accounting: the count is reserved with a CAS loop before a
   * thread starts, so it never exceeds max_elastic, and released under lock
   * when one retires, so it never goes negative. */
  TKO_CACHE_ALIGNED atomic_uint elastic_count;
  atomic_uint elastic_peak;
  atomic_uint_fast64_t elastic_spawned, elastic_retired;
  atomic_uint basic_alive;
  /* Guards slot threads and spawn_closed; held across a whole spawn (join of
   * the slot's retired thread, then create). Submit paths only trylock it:
   * a spawn already in progress brings a searching worker anyway, and a
   * retiring worker's thread_stop hook may submit while a spawner joins it. */
  pthread_mutex_t spawn_mu;
  bool spawn_closed;

  /* wait_idle: waiters count themselves in idle_waiters, then sleep on
   * idle_cv under idle_mu; workers that find the queue empty broadcast. */
  TKO_CACHE_ALIGNED atomic_uint idle_waiters;
  pthread_mutex_t idle_mu; /* guards nothing but the wait on idle_cv */
  pthread_cond_t idle_cv;

  atomic_uint_fast64_t cancelled;
  tko__worker caller; /* counts tasks run on a caller's thread (shutdown) */

  pthread_mutex_t shutdown_mu; /* serialises shutdown; guards shut_down */
  bool shut_down;

  tko_options opts;
  char name[10];
  bool timing;     /* some hook needs wait/run times */
  unsigned nslots; /* workers + max_elastic */
  tko__worker *slots;
};

/* The pool whose worker is the calling thread, if any. */
extern _Thread_local tko_pool *tko__current_pool;

/* worker.c */
void *tko__worker_main(void *arg);
int tko__thread_start(tko_pool *pool, tko__worker *w);
/* Runs one task with hooks and counting, on the calling thread. */
int tko__run_item(tko_pool *pool, tko__worker *w, const tko__item *item);
void tko__cancel_item(tko_pool *pool, const tko__item *item);
void tko__notify_idle(tko_pool *pool);

/* elastic.c */
void tko__elastic_spawn(tko_pool *pool);
bool tko__elastic_try_retire(tko_pool *pool, tko__worker *w);
void tko__elastic_close_and_join(tko_pool *pool);

/* Called after new work is queued: wakes a sleeper if nobody is searching,
 * or starts an elastic worker if every worker is busy. */
static inline void tko__signal_work(tko_pool *pool) {
  /* seq_cst: step (2') of signal.c's essay, after the queued increment. */
  uint64_t st = tko__load_seq(&pool->idle.state);
  if (tko__idle_searching(st) > 0) return;
  if (tko__idle_sleeping(st) > 0 && tko__idle_wake_one(&pool->idle)) return;
  if (pool->opts.max_elastic) tko__elastic_spawn(pool);
}

#endif
