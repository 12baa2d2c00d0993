/* SPDX-License-Identifier: MIT */
/* Async (completion-based) tasks: the worker starts them, any thread
 * completes them.
 *
 * Records: an in-flight task needs somewhere to keep its id, group and
 * times until completion. Records come from a free list under async_mu and
 * are allocated 64 at a time, in chunks that live until destroy, so op
 * pointers stay valid and steady traffic allocates nothing.
 *
 * Limit: async tasks are the engine's held source (kind.h: tko__source):
 * they wait in the held queue, and a worker takes one only while fewer
 * than max_async_inflight are in flight (async_may_start, asked under the
 * queue lock, where the take is decided; the engine keeps the count). A
 * completion frees a slot (tko__held_release), which wakes a worker if
 * async tasks wait.
 *
 * Kind: an async task is a task kind (kind.h: tko__task_kind) whose
 * run replaces the engine's: it takes a record, runs the start function,
 * and the task finishes at its completion. A task in no group points to
 * lone_task (below); a group's member points to its group, whose record
 * holds async_kind for its async members. The engine names neither.
 *
 * Lifetime: completion runs on a thread the pool does not own, so it
 * counts itself in `completers` and shutdown waits for that count to drop
 * to zero; the decrement is its last touch of the pool. Shutdown and
 * destroy reach this file through its phase (lifecycle.h:
 * TKO__PHASE_ASYNC), registered when the first record is taken. */
#include <errno.h>
#include <sched.h>

#include "engine.h"
#include "invariant.h"
#include "kind.h"
#include "mem.h"

#define CHUNK_RECORDS 64

struct tko_async {
  tko_pool *pool;
  struct tko_async *next_free;
  tko_async_fn fn;
  void *arg;
  uintptr_t ctx;
  uint64_t id, enq_ns, start_ns;
  int weight;
  unsigned worker;
  tko_worker_kind kind;
  atomic_int in_flight; /* 1 from start to completion: catches a double complete */
};

typedef struct chunk {
  struct chunk *next;
  struct tko_async records[CHUNK_RECORDS];
} chunk;

static int async_quiesce(tko_pool *pool, const struct timespec *deadline);
static void async_fini(tko_pool *pool);
static const tko__phase async_phase = {
    .number = TKO__PHASE_ASYNC, .close = async_quiesce, .fini = async_fini};

static struct tko_async *take_record(tko_pool *pool) {
  /* Before the first record, so that shutdown waits for every task in
   * flight and destroy frees the chunks; never refused here, since a start
   * comes before shutdown's phases (they begin once the workers are gone
   * and the queue is empty). */
  if (tko__phase_add(pool, &async_phase)) return NULL;
  tko__mutex_lock(&pool->async_mu);
  struct tko_async *r = pool->async_free;
  if (!r) {
    chunk *c = tko__mem_alloc(pool->opts.allocator, sizeof *c);
    if (c) {
      c->next = pool->async_chunks;
      pool->async_chunks = c;
      for (int i = CHUNK_RECORDS - 1; i >= 0; i--) {
        c->records[i].next_free = pool->async_free;
        atomic_init(&c->records[i].in_flight, 0);
        pool->async_free = &c->records[i];
      }
      r = pool->async_free;
    }
  }
  if (r) pool->async_free = r->next_free;
  tko__mutex_unlock(&pool->async_mu);
  return r;
}

static void give_record(tko_pool *pool, struct tko_async *r) {
  tko__mutex_lock(&pool->async_mu);
  r->next_free = pool->async_free;
  pool->async_free = r;
  tko__mutex_unlock(&pool->async_mu);
}

/* Async functions travel in the task slot and are cast back before the
 * call; C allows the round trip, and going through void (*)(void) tells the
 * compiler it is deliberate. */
#define AS_TASK(fn) ((tko_task_fn)(void (*)(void))(fn))
#define AS_ASYNC(fn) ((tko_async_fn)(void (*)(void))(fn))

static const tko__task_kind async_kind;

/* The record of an async task in no group: tko__item_kind reads the second
 * word of a TKO__CTX_HELD task's record (both hold the kind). Aligned for
 * the ctx tags. */
static _Alignas(8) const tko__task_kind *const lone_task[2] = {&async_kind, &async_kind};

/* The async source (kind.h: tko__source): one more async task may start
 * while fewer than max_async_inflight (0: no limit) are in flight. */
static bool async_may_start(const tko_pool *pool, unsigned running) {
  unsigned max = pool->opts.max_async_inflight;
  return !max || running < max;
}

static const tko__source async_source = {.may_start = async_may_start};

/* Registers the async source with pool before its first async task is
 * queued; a bad pool is left to the submit, which refuses it. */
static void add_source(tko_pool *pool) {
  if (tko__pool_check(pool) == 0) tko__source_add(pool, &async_source);
}

int tko_submit_async(tko_pool *pool, tko_async_fn fn, void *arg, int weight) {
  if (!pool || !fn) return -EINVAL;
  add_source(pool);
  uintptr_t ctx = (uintptr_t)lone_task | TKO__CTX_KIND | TKO__CTX_HELD;
  return tko__submit_item(pool, AS_TASK(fn), arg, ctx, weight, -1);
}

int tko_group_submit_async(tko_pool *pool, tko_group *group, tko_async_fn fn, void *arg,
                           int weight) {
  if (!fn) return -EINVAL;
  add_source(pool);
  return tko__group_submit_ctx(pool, group, &async_kind, AS_TASK(fn), arg, weight);
}

/* The group an async task is a member of, NULL for one in no group. */
static void *group_of(uintptr_t ctx) {
  return ctx & TKO__CTX_GROUP ? (void *)(ctx & ~TKO__CTX_TAGS) : NULL;
}

void *tko_async_arg(const tko_async *op) { return op ? op->arg : NULL; }

/* Frees an in-flight slot (the take, or caller-runs, counted one); the
 * engine wakes a worker if async tasks wait for one. */
static void release_slot(tko_pool *pool) {
  tko__held_release(pool);
}

static void finish(struct tko_async *op, int status) {
  tko_pool *pool = op->pool;
  const tko_hooks *h = &pool->opts.hooks;
  tko__worker *c = &pool->caller;
  /* The completer thread runs this task's hooks and still counts it in
   * flight: waiting on the pool from here would wait on itself. */
  tko_pool *prev = tko__enter_pool(pool);
  /* Its hooks run here as the task's own: a wait on its group from them
   * is -EDEADLK (tko__thread_runs). */
  const tko__item self = {.ctx = op->ctx};
  tko__task_frame frame = {.item = &self, .outer = tko__off_worker_task};
  tko__off_worker_task = &frame;
  tko__witness_assert_none_held(); /* the hooks are the host's */
  if (pool->timing) {
    tko_task_info info = {.id = op->id, .fn = AS_TASK(op->fn), .arg = op->arg,
                          .weight = op->weight, .status = status, .worker = op->worker,
                          .kind = op->kind};
    info.wait_ns = op->start_ns > op->enq_ns ? op->start_ns - op->enq_ns : 0;
    info.run_ns = tko__now_ns() - op->start_ns;
    if (h->after_run) h->after_run(h->user, &info);
    if (status && h->on_failure) h->on_failure(h->user, &info);
  }
  tko__off_worker_task = frame.outer;
  tko__leave_pool(prev);
  void *group = group_of(op->ctx);
  give_record(pool, op);
  if (group) tko__group_finished(group, status);
  release_slot(pool);
  if (status) tko__add_seq(&c->failed, 1);
  tko__add_seq(&c->finished, 1); /* seq_cst: before notify_idle's load */
  tko__notify_idle(pool);
}

int tko_async_complete(tko_async *op, int status) {
  if (!op) return -EINVAL;
  tko_pool *pool = op->pool;
  int one = 1;
  if (!pool) return -EALREADY;
  /* A forked child's copy of the op: its task is the parent's, and the
   * copy of the pool's lock may be held for good. */
  if (tko__pool_forked(pool)) return -ECHILD;
  if (!atomic_compare_exchange_strong(&op->in_flight, &one, 0)) return -EALREADY;
  tko__add_seq(&pool->completers, 1);
  finish(op, status);
  /* seq_cst (a release): the last touch of the pool; pairs with
   * async_quiesce's load of completers. */
  tko__sub_seq(&pool->completers, 1);
  return 0;
}

/* The kind's run: starts the task on worker w (the caller slot in
 * caller-runs and drain), which took its in-flight slot. */
static int async_run(tko_pool *pool, tko__worker *w, const tko__item *item) {
  const tko_hooks *h = &pool->opts.hooks;
  struct tko_async *op = take_record(pool);
  if (!op) {
    /* No memory for a record: the task cannot start, so it goes to
     * on_cancel (the host frees its argument there) rather than vanish;
     * it never counted as started. tests/stress/test_lifecycle_stress.c
     * found the task that reached neither fn nor on_cancel. */
    release_slot(pool);
    tko__cancel_item(pool, item);
    return -ENOMEM;
  }
  tko__count(pool, w, &w->started);
  *op = (struct tko_async){.pool = pool, .fn = AS_ASYNC(item->fn), .arg = item->arg,
                           .ctx = item->ctx, .id = item->id, .enq_ns = item->enq_ns,
                           .weight = item->weight, .worker = w->index, .kind = w->kind};
  atomic_init(&op->in_flight, 1);
  tko__witness_assert_none_held(); /* the start function and hooks are the host's */
  if (pool->timing) {
    op->start_ns = tko__now_ns();
    if (h->before_run) {
      tko_task_info info = {.id = op->id, .fn = item->fn, .arg = op->arg, .weight = op->weight,
                            .worker = w->index, .kind = w->kind};
      info.wait_ns = op->start_ns > op->enq_ns ? op->start_ns - op->enq_ns : 0;
      h->before_run(h->user, &info);
    }
  }
  int rc = op->fn(op, op->arg);
  if (rc) tko_async_complete(op, rc);
  return rc;
}

/* Cancelled before it started (its slot, if a take counted one, already
 * given back by async_dropped or async_run). */
static void async_cancelled(const tko__item *item) {
  void *group = group_of(item->ctx);
  if (group) tko__group_finished(group, -ECANCELED);
}

/* A worker took the task and will not start it: its in-flight slot goes. */
static void async_dropped(tko_pool *pool, const tko__item *item) {
  (void)item;
  release_slot(pool);
}

/* No done: run finishes the task itself, at its completion (finish). */
static const tko__task_kind async_kind = {
    .run = async_run, .cancelled = async_cancelled, .dropped = async_dropped};

static bool no_async_in_flight(void *pool) {
  /* seq_cst: pairs with tko__held_release's store (lifecycle.c), after
   * this waiter's add to idle_waiters (async_quiesce). */
  return tko__load_seq(&((tko_pool *)pool)->held_inflight) == 0;
}

/* The phase's close (shutdown, the workers gone): waits, within the
 * deadline, for the async tasks in flight to complete, then for their
 * completers to leave. */
static int async_quiesce(tko_pool *pool, const struct timespec *deadline) {
  tko__add_seq(&pool->idle_waiters, 1); /* seq_cst: pairs with finish's notify */
  tko__mutex_lock(&pool->idle_mu);
  int rc = tko__cond_wait_until(&pool->idle_cv, &pool->idle_mu, deadline, no_async_in_flight, pool);
  tko__mutex_unlock(&pool->idle_mu);
  tko__sub_seq(&pool->idle_waiters, 1);
  if (rc) return rc;
  /* A completer past its notify is a few instructions from leaving.
   * seq_cst (an acquire): pairs with tko_async_complete's decrement, its
   * last touch of the pool. */
  while (tko__load_seq(&pool->completers) > 0) sched_yield();
  return 0;
}

/* The phase's fini (destroy): frees the record chunks. */
static void async_fini(tko_pool *pool) {
  for (chunk *c = pool->async_chunks; c;) {
    chunk *next = c->next;
    tko__mem_free(pool->opts.allocator, c);
    c = next;
  }
  pool->async_chunks = NULL;
  pool->async_free = NULL;
}
