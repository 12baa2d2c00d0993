/* SPDX-License-Identifier: MIT */
/* taskorch-thpool: C-Thread-Pool's thpool_* API on taskorch's public API.
 *
 * Adapting a job. A C-Thread-Pool job is `void fn(void *arg)`; a taskorch
 * task is `int fn(void *arg)`, and calling one through the other's type is
 * undefined behaviour. So each job is submitted as a trampoline, run_job,
 * whose argument is a small record holding the user's function and argument.
 * taskorch passes one pointer per task and nothing else reaches the task, so
 * the record must live somewhere; it is not allocated per job.
 *
 * Records come in chunks (64, then doubling up to 4096 records per chunk),
 * allocated by thpool_init and when every record is in use, and freed only by
 * thpool_destroy. A pool therefore holds as many records as it ever had jobs
 * queued or starting at once; once it has seen its peak, adding a job
 * allocates nothing.
 *
 * The free list has two halves, so producers and workers never take a lock
 * together:
 *   - `free`, a plain list that add_work pops under free_mu (any number of
 *     threads may add work, jobs included);
 *   - `returned`, a lock-free stack that run_job pushes the record onto as
 *     soon as it has copied the function and argument out, before it calls
 *     the function. Pushing is one CAS; a push is safe against any other push
 *     or grab (there is no pop of a single node, so no ABA).
 * When `free` is empty, add_work takes the whole of `returned` with one
 * exchange, still under free_mu, and only if that is empty too does it
 * allocate a chunk. A record is thus never in two places: it is in `free`, in
 * `returned`, or owned by exactly one queued or starting job.
 *
 * Why no record is reused while in use: the worker reads fn and arg, then
 * pushes with release; the producer that later takes the record does so with
 * an acquire exchange before writing fn and arg, so the worker's reads happen
 * before those writes. The producer's writes reach the worker through
 * tko_submit, whose publication taskorch orders for us.
 *
 * Jobs dropped by thpool_destroy are never run, so their records are never
 * pushed back; they are freed with their chunks, which is why the pool
 * needs no on_cancel hook.
 *
 * Lock order: free_mu is a leaf; nothing else is taken while it is held
 * (tko_submit is called after it is released). */
#include "thpool.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <taskorch.h>

/* Order-named wrappers, so every ordering here can be found with grep. */
#define thpool__load_relaxed(p) atomic_load_explicit((p), memory_order_relaxed)
#define thpool__exchange_acquire(p, v) atomic_exchange_explicit((p), (v), memory_order_acquire)
#define thpool__cas_release(p, expected, desired)                                     \
  atomic_compare_exchange_weak_explicit((p), (expected), (desired), memory_order_release, \
                                        memory_order_relaxed)

#define THPOOL__CACHE_LINE 64
#define THPOOL__FIRST_CHUNK 64
#define THPOOL__MAX_CHUNK 4096

_Static_assert(THPOOL_MAX_THREADS == TKO_MAX_WORKERS + TKO_MAX_ELASTIC,
               "THPOOL_MAX_THREADS must follow taskorch's thread limits");

/* One job: what run_job needs to call the user's function. */
typedef struct thpool__job {
  void (*fn)(void *);
  void *arg;
  struct thpool__job *next; /* link in `free` or `returned` */
  struct thpool_ *owner;    /* set once, when its chunk is made */
} thpool__job;

typedef struct thpool__chunk {
  struct thpool__chunk *next;
  thpool__job jobs[];
} thpool__chunk;

struct thpool_ {
  tko_pool *pool;
  pthread_mutex_t free_mu; /* protects free, chunks and chunk_size */
  thpool__job *free;       /* records ready for add_work */
  thpool__chunk *chunks;   /* every chunk, for destroy */
  size_t chunk_size;       /* records in the next chunk */
  /* Pushed by every worker, once per job: kept off the producers' line. */
  _Alignas(THPOOL__CACHE_LINE) _Atomic(thpool__job *) returned;
};

_Static_assert(offsetof(struct thpool_, returned) % THPOOL__CACHE_LINE == 0,
               "returned must start its own cache line");
_Static_assert(sizeof(struct thpool_) % THPOOL__CACHE_LINE == 0,
               "aligned_alloc needs a size that is a multiple of the alignment");

/* Makes a chunk and puts its records on `free`. Caller holds free_mu (or is
 * thpool_init, before the pool is shared). */
static int grow(struct thpool_ *tp) {
  size_t n = tp->chunk_size;
  thpool__chunk *c = malloc(sizeof *c + n * sizeof c->jobs[0]);
  if (!c) return -ENOMEM;
  for (size_t i = 0; i < n; i++) {
    c->jobs[i].owner = tp;
    c->jobs[i].next = i + 1 < n ? &c->jobs[i + 1] : tp->free;
  }
  tp->free = &c->jobs[0];
  c->next = tp->chunks;
  tp->chunks = c;
  if (tp->chunk_size < THPOOL__MAX_CHUNK) tp->chunk_size *= 2;
  return 0;
}

static thpool__job *take_record(struct thpool_ *tp) {
  pthread_mutex_lock(&tp->free_mu);
  if (!tp->free) {
    /* Acquire: pairs with the release in give_back, so the worker that
     * last used each of these records is done reading it. */
    tp->free = thpool__exchange_acquire(&tp->returned, NULL);
    if (!tp->free) grow(tp); /* on failure free stays NULL */
  }
  thpool__job *job = tp->free;
  if (job) tp->free = job->next;
  pthread_mutex_unlock(&tp->free_mu);
  return job;
}

/* For a record whose job was never queued. */
static void put_record(struct thpool_ *tp, thpool__job *job) {
  pthread_mutex_lock(&tp->free_mu);
  job->next = tp->free;
  tp->free = job;
  pthread_mutex_unlock(&tp->free_mu);
}

static void give_back(struct thpool_ *tp, thpool__job *job) {
  thpool__job *head = thpool__load_relaxed(&tp->returned);
  do {
    job->next = head;
    /* Release: pairs with the acquire in take_record; orders this worker's
     * reads of fn and arg (and the write of next) before the record's reuse. */
  } while (!thpool__cas_release(&tp->returned, &head, job));
}

static int run_job(void *p) {
  thpool__job *job = p;
  void (*fn)(void *) = job->fn;
  void *arg = job->arg;
  give_back(job->owner, job); /* the record is free from here on */
  fn(arg);
  return 0;
}

threadpool thpool_init(int num_threads) {
  if (num_threads < 1 || num_threads > THPOOL_MAX_THREADS) return NULL;
  unsigned n = (unsigned)num_threads;
  /* Past taskorch's basic-worker limit the rest are elastic workers with the
   * longest idle time allowed, the nearest thing to fixed threads. */
  tko_options opts = n <= TKO_MAX_WORKERS
                         ? tko_basic_options(n)
                         : tko_elastic_options(TKO_MAX_WORKERS, n - TKO_MAX_WORKERS,
                                               TKO_MAX_IDLE_MS);
  opts.name = "thpool";
  /* C-Thread-Pool hands each job to a free thread; a worker holding a batch
   * could sit on a job that an earlier one waits for. */
  opts.max_batch = 1;

  struct thpool_ *tp = aligned_alloc(THPOOL__CACHE_LINE, sizeof *tp);
  if (!tp) return NULL;
  tp->pool = NULL;
  tp->free = NULL;
  tp->chunks = NULL;
  tp->chunk_size = THPOOL__FIRST_CHUNK;
  atomic_init(&tp->returned, NULL);
  if (pthread_mutex_init(&tp->free_mu, NULL)) {
    free(tp);
    return NULL;
  }
  if (grow(tp) == 0 && tko_pool_create(&tp->pool, &opts) == 0) return tp;
  free(tp->chunks);
  pthread_mutex_destroy(&tp->free_mu);
  free(tp);
  return NULL;
}

int thpool_add_work_weighted(threadpool tp, void (*function_p)(void *), void *arg_p,
                             int weight) {
  if (!tp || !function_p) return -1;
  thpool__job *job = take_record(tp);
  if (!job) return -1;
  job->fn = function_p;
  job->arg = arg_p;
  if (tko_submit(tp->pool, run_job, job, weight) != 0) {
    put_record(tp, job); /* never queued, so never run */
    return -1;
  }
  return 0;
}

int thpool_add_work(threadpool tp, void (*function_p)(void *), void *arg_p) {
  return thpool_add_work_weighted(tp, function_p, arg_p, 0);
}

void thpool_wait(threadpool tp) {
  /* -EDEADLK from one of the pool's own jobs: return rather than wait for
   * ourselves. */
  if (tp) tko_pool_wait_idle(tp->pool, -1);
}

void thpool_pause(threadpool tp) {
  if (tp) tko_pool_pause(tp->pool);
}

void thpool_resume(threadpool tp) {
  if (tp) tko_pool_resume(tp->pool);
}

void thpool_destroy(threadpool tp) {
  if (!tp) return;
  /* TKO_CANCEL: running jobs finish, queued ones are dropped unrun, every
   * thread is joined. From one of the pool's own jobs this is -EDEADLK and
   * nothing happens. */
  if (tko_pool_shutdown(tp->pool, TKO_CANCEL) != 0) return;
  tko_pool_destroy(tp->pool);
  for (thpool__chunk *c = tp->chunks, *next; c; c = next) {
    next = c->next;
    free(c);
  }
  pthread_mutex_destroy(&tp->free_mu);
  free(tp);
}

int thpool_num_threads_working(threadpool tp) {
  if (!tp) return -1;
  tko_stats s;
  tko_pool_stats(tp->pool, &s);
  return s.running > INT_MAX ? INT_MAX : (int)s.running;
}

struct tko_pool *thpool_taskorch_pool(threadpool tp) {
  return tp ? tp->pool : NULL;
}
