/* SPDX-License-Identifier: MIT */
/* The pool's internal layout, shared by the engine's files (pool.c,
 * lifecycle.c, submit.c, worker.c, elastic.c, resize.c, shard.c, admit.c)
 * and its features (group.c, timer.c, async.c, keyed.c, handle.c); the
 * extensions (the lane_*.c files, coalescer.c) never include it.
 *
 * The lifecycle - the pool's states, the gate that blocked submitters and
 * caller-runs tasks pass, attachments (tko__attach / tko__detach: an
 * object holding a pool registers a close callback that shutdown resolves,
 * and tko_pool_destroy is -EBUSY while any remains) and phases
 * (tko__phase_add: a feature registers the close and fini that shutdown
 * and destroy call in number order) - is declared and explained in
 * lifecycle.h, which needs nothing of this layout.
 *
 * Lock ranks: witness.h orders every lock of the library in one place,
 * with each lock's role, and checks the order in debug and sanitizer
 * builds; every mutex below is a tko__mutex, bound to its rank where
 * pool.c initialises it, and taken through witness.h's wrappers.
 * Outermost first: spawn_mu, the queue lock, help_mu; every other lock
 * (gate_mu, space_mu, idle_mu, timer_mu, async_mu, a group's mu,
 * the parkers' fallback mutexes) is a leaf. No lock is held while a task,
 * a hook, an attachment's close callback or a phase's close or fini runs; shutdown holds no lock
 * while it waits (the shutter role, under gate_mu, serialises shutdown
 * calls instead).
 *
 * Field markers (here and in the library's other files): "I:" marks a
 * field set at create or init, before another thread can see the object,
 * and never written after, so it is read without a lock. Every other
 * shared field says in words what guards it: the lock by name ("guarded
 * by spawn_mu", "under shard 0's lock"), "owner only" for a worker slot's
 * own thread, or, for an atomic, the order it needs and what it pairs
 * with. */
#ifndef TKO_INTERNAL_H
#define TKO_INTERNAL_H
/* Layering: extensions (lanes, coalescer) use the public API and the
 * platform layer only; CMake compiles them with TKO_EXTENSION. */
#ifdef TKO_EXTENSION
#error "an extension includes an engine or data-structure header"
#endif

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "atomics.h"
#include "inbox.h"
#include "lifecycle.h"
#include "lock.h"
#include "queue.h"
#include "ring.h"
#include "tko_signal.h"
#include "taskorch.h"

/* The most tasks a worker takes per visit to the queue (max_batch's upper
 * bound), the default, and the work a take aims to hold: a worker sizes its
 * takes so that a batch lasts about TKO__BATCH_BUDGET_NS, judging by its
 * last batch (worker.c). */
#define TKO__GRAB_MAX 64u
#define TKO__BATCH_DEFAULT 64u
#define TKO__BATCH_START 16u
#define TKO__BATCH_BUDGET_NS 20000u
/* tko_options.recheck_us's default: five batch budgets, so that rechecks
 * add at most one visit to the queue lock per five batches. And the work
 * between two of a worker's clock reads in a batch (worker.c:
 * recheck_hands_back): a microsecond, so that a read is a few percent of
 * it at most. */
#define TKO__RECHECK_DEFAULT_US 100u
#define TKO__CLOCK_STRIDE_NS 1000u

/* tko__worker.swept_ns when a worker's next take sweeps whatever the time
 * (a new worker, one that found nothing). */
#define TKO__SWEEP_DUE UINT64_MAX

/* A take of fewer tasks than this is followed by a yield (worker.c). */
#define TKO__SMALL_TAKE 4u

/* Inbox slots per pool (40 bytes each). */
#define TKO__INBOX_CAPACITY 1024u

/* A task a worker runs (worker.c: run_or_cancel), on the worker's stack. */
typedef struct tko__task_frame {
  const tko__item *item;
  unsigned blocking_base; /* blocking_depth when the task started */
  struct tko__task_frame *outer;
} tko__task_frame;

/* A batch a worker took (worker.c: run_batch), on the worker's stack. */
typedef struct tko__batch_frame {
  const tko__item *items;
  size_t n, next; /* next: the first not yet started */
  struct tko__shard *shard; /* the shard it was taken from */
  struct tko__batch_frame *outer;
} tko__batch_frame;

/* Slot states. Elastic slots: EMPTY, RUNNING, RETIRING (elastic.c).
 * Basic slots (resize.c) also pass through LEAVING: the thread retired
 * after a shrink and runs its stop hook; a grow may hand the slot back. */
enum { TKO__SLOT_EMPTY = 0, TKO__SLOT_RUNNING, TKO__SLOT_RETIRING, TKO__SLOT_LEAVING };

/* One worker thread (or elastic slot). The counters are written only by the
 * thread that owns the slot, so they cost a plain store per task; readers
 * sum them across slots. */
typedef struct tko__worker {
  TKO_CACHE_ALIGNED atomic_uint_fast64_t started;
  atomic_uint_fast64_t finished; /* stored seq_cst once per batch: see worker.c */
  atomic_uint_fast64_t failed;
  /* Bounded queues (admit.c): room given back by tasks this slot started
   * (owner only), and how much of it was subtracted from room_taken
   * (advanced by CAS, by any thread: a line of its own, so that those
   * CASes leave the counters' line to its owner). Unused in the caller
   * slot. */
  TKO_CACHE_ALIGNED atomic_size_t room_given;
  atomic_size_t room_settled;
  size_t room_chunk; /* give-backs it gathers before it settles; owner only */
  bool room_listed;  /* counted in pool->room_slots; owner only */
  tko_pool *pool;        /* I */
  unsigned index;        /* I */
  unsigned home;         /* I: the shard it takes from first (shard.c) */
  tko_worker_kind kind;  /* I */
  tko__sleeper sleeper;
  pthread_t thread; /* guarded by spawn_mu for elastic slots */
  bool has_thread;  /* started and not yet joined; guarded by spawn_mu for elastic */
  bool spawning;    /* a spawner (elastic) or a grow (basic) owns the slot;
                       guarded by spawn_mu */
  bool stopping;    /* elastic: retired, running its thread_stop hook; guarded
                       by spawn_mu (see claim_slot) */
  unsigned blocking_depth; /* nested tko_blocking_begin calls; owner only */
  /* What this thread is doing, innermost first, in frames on its stack
   * (owner only): the tasks it has started and not finished (more than
   * one while a task helps in a group wait), and the batches it took and
   * is working through (a helping wait takes from the innermost first).
   * Kept so that a task that ends the thread (pthread_exit) leaves the
   * pool's accounting right (worker.c: worker_exited). */
  struct tko__task_frame *task;
  struct tko__batch_frame *batch;
  /* A basic worker's thread that a task ended, to be joined by the thread
   * that replaces it: set by the ending thread before it creates the
   * replacement, read by the replacement (pthread_create orders them). */
  pthread_t predecessor;
  bool has_predecessor;
  bool exiting; /* a task is ending this thread (owner only) */
  size_t batch_cap; /* most tasks the next take may hold; owner only */
  /* The recheck (worker.c), owner only: the time of its last take or look,
   * of its last clock read, the starts since that read, and the starts
   * between two reads. */
  uint64_t looked_ns, clocked_ns;
  uint64_t swept_ns; /* its last sweep of the shards (shard.c), or TKO__SWEEP_DUE:
                        its next take sweeps; owner only */
  size_t unclocked, clock_stride;
  atomic_uint_fast64_t handbacks; /* batches handed back at a recheck; owner only */
  atomic_uint_fast64_t late_inversions; /* starts counted late (count_late); owner only */
  unsigned hole_poll_ms; /* its last sleep beside a hole, 0 if none (worker_sleep); owner only */
  /* Elastic: TKO__SLOT_*. A spawner moves a free slot to RUNNING under
   * spawn_mu; only the slot's own thread moves it to RETIRING, under lock,
   * together with releasing its elastic count. Basic: written and read
   * under spawn_mu only (resize.c). */
  atomic_int slot_state;
} tko__worker;

/* One weighted queue of the pool and its lock (shard.c). */
typedef struct tko__shard {
  TKO_CACHE_ALIGNED tko__lock lock;
  tko__queue queue;
  /* Read lock-free by every worker, written under lock only when they
   * change, on a line of their own: 1 while a worker could take work here
   * now (queued tasks; for shard 0 also async ones with an in-flight slot
   * free), else 0; and, in a pool of several shards, the heaviest weight
   * queued here (INT_MIN: none), which takes and rechecks compare. */
  TKO_CACHE_ALIGNED atomic_size_t backlog;
  atomic_int top;
  /* Where starts count late inversions (pool->count_late): the submit
   * time of the oldest task of the heaviest weight queued here, 0 if
   * none; stored with top. */
  atomic_uint_fast64_t top_since;
  unsigned index; /* I */
} tko__shard;

struct tko_pool {
  /* Submitters write here without a lock (inbox.h): the shared inbox, and
   * each submitting thread's own ring (ring.h). */
  tko__inbox inbox;
  tko__rings rings;

  /* 1 while a submitter whose inbox was full moves it (submit.c:
   * make_room); other submitters then wait for it. Its own line: only
   * touched when the inbox is full. */
  TKO_CACHE_ALIGNED atomic_int room_maker;

  /* The weighted queues (shard.c): [0, nshards), each with its lock; only
   * workers (and a submitter whose ring or inbox is full) take them. The
   * inbox and the async queue belong to shard 0, whose lock guards them. */
  tko__shard *shards; /* I: cache-line aligned inside shards_raw */
  unsigned nshards;   /* I */
  void *shards_raw;
  tko__queue async_queue; /* async tasks waiting for an in-flight slot */
  unsigned async_running; /* async tasks in flight; guarded by shard 0's lock */
  /* 1 while async tasks wait, else 0; stored under shard 0's lock when
   * that changes (tko__refresh_backlog), read lock-free. */
  atomic_size_t async_waiting;
  atomic_bool closing;    /* set under lock at shutdown; read lock-free */
  atomic_bool cancelling; /* TKO_CANCEL in progress */
  atomic_bool paused;     /* tko_pool_pause: no task starts */

  tko__idle idle;

  /* Elastic accounting: the count is reserved with a CAS loop before a
   * thread starts, so it never exceeds max_elastic, and released under lock
   * when one retires, so it never goes negative. */
  TKO_CACHE_ALIGNED atomic_uint elastic_count;
  atomic_uint elastic_peak;
  atomic_uint_fast64_t elastic_spawned, elastic_retired;
  atomic_uint basic_alive;
  /* Set by the first worker that leaves because the pool is closed and
   * drained: nothing can be queued after that, so no spawn is needed, and
   * one would claim a fresh slot while that worker's slot is still held
   * (elastic.c, tko__elastic_spawn). */
  atomic_bool drained;
  /* Guards slot threads (thread, has_thread, spawning), basic slots'
   * states, the resize targets' changes, spawn_closed and spawns_active.
   * Never held while joining or creating a thread. */
  tko__mutex spawn_mu;
  pthread_cond_t spawn_cv; /* spawns_active dropped to 0 */
  bool spawn_closed;
  unsigned spawns_active;

  /* wait_idle: waiters count themselves in idle_waiters, then sleep on
   * idle_cv under idle_mu; workers that find the queue empty broadcast. */
  TKO_CACHE_ALIGNED atomic_uint idle_waiters;
  tko__mutex idle_mu; /* guards nothing but the wait on idle_cv */
  pthread_cond_t idle_cv;

  /* Bounded queues only (admit.c): room taken by admissions (leased
   * credits included), less room given back and settled: never below the
   * room in use. Worker slots [0, room_slots) have given room back. A
   * blocked submitter counts itself in space_waiters, then sleeps on
   * space_cv under space_mu; whoever frees room broadcasts. */
  TKO_CACHE_ALIGNED atomic_size_t room_taken;
  atomic_uint room_slots;
  atomic_uint room_moving; /* settles and take-backs between their two steps */
  /* Read by every give-back (admit.c), written only by waiters: its own
   * line, away from room_taken. */
  TKO_CACHE_ALIGNED atomic_uint space_waiters;
  tko__mutex space_mu; /* guards nothing but the wait on space_cv */
  pthread_cond_t space_cv;
  atomic_uint_fast64_t caller_runs; /* CALLER_RUNS tasks: part of submitted */
  /* Tasks counted as submitted elsewhere (keyed tasks, queued ones) that
   * ran off the workers - a caller-runs submitter, the shutting-down
   * thread: stats.caller_runs adds them; submitted does not. */
  atomic_uint_fast64_t off_worker_runs;
  atomic_uint blocking;             /* workers inside a blocking hint */

  /* Delayed tasks (timer.c). */
  tko__mutex timer_mu;      /* guards the heap, every timer's state, the
                               periodic timers' records (timer_free too)
                               and the timer thread's start and stop */
  pthread_cond_t timer_cv;  /* the timer thread waits here for the earliest deadline */
  struct tko__timer **timers; /* min-heap by deadline */
  uint32_t timers_len, timers_cap;
  pthread_t timer_thread;
  bool timer_started, timer_stop;
  struct tko__firing *timer_free; /* periodic timers' records not in use */

  /* Async records (async.c): handed out from a free list, allocated in
   * chunks that live until destroy, so op pointers stay valid. */
  tko__mutex async_mu; /* guards async_free and async_chunks */
  struct tko_async *async_free;
  void *async_chunks;
  atomic_uint async_inflight; /* async_running, readable lock-free */
  atomic_uint completers;     /* threads inside tko_async_complete */

  /* Workers helping in tko_group_wait with nothing to run list themselves
   * here before they sleep on their own parker; new runnable work
   * (tko__signal_work) unparks every one listed (their group's end unparks
   * them too, through the group). helpers: how many are listed, seq_cst, a
   * Dekker pair with the work's publication. */
  tko__mutex help_mu; /* guards help_list */
  struct tko__helper *help_list; /* helping waits about to sleep (help.c) */
  atomic_uint helpers;

  atomic_uint_fast64_t cancelled;
  /* Lane runners of the pool's keyed table (keyed.c): queued items that
   * are not tasks of the host (their keyed tasks are). Counted before the
   * inbox reservation (runners_out) and once run or cancelled
   * (runners_done), so that wait_idle counts them and stats leave them
   * out. */
  atomic_uint_fast64_t runners_out, runners_done;
  /* Tasks accepted outside the inbox that never reach the queue (a timer
   * handed to on_cancel before its task was queued): part of submitted. */
  atomic_uint_fast64_t side_tasks;
  tko__worker caller; /* counts tasks run on a caller's thread (shutdown) */

  /* The lifecycle (lifecycle.h, lifecycle.c). Off the submit path: only
   * slow paths (a full queue, thread start and exit, shutdown) touch it. */
  tko__mutex gate_mu;      /* guards everything down to phase_next; a leaf */
  pthread_cond_t gate_cv;  /* gate_count or threads reached 0, the shutter
                              role was given back, an attachment's close
                              returned */
  atomic_int state;        /* tko__pool_state; written under gate_mu */
  unsigned gate_count;     /* threads inside the gate */
  unsigned threads;        /* worker threads started and not yet at their end */
  bool shutter;            /* a thread is inside tko_pool_shutdown_timed */
  tko__attachment *attached;  /* list of attachments, newest first */
  tko__attachment *resolving; /* the one whose close runs now, if any */
  /* Registered phases by number (lifecycle.h), each set once under
   * gate_mu, NULL until then; read lock-free only as "already registered"
   * (tko__phase_add) and by destroy. */
  _Atomic(const tko__phase *) phases[TKO__PHASE_COUNT];
  unsigned phase_next; /* the first phase whose close has not returned 0 */

  unsigned magic;    /* TKO__POOL_MAGIC while the pool lives (see tko__pool_check) */
  unsigned fork_gen; /* I: tko__fork_generation() at create */
  int creator_nice;  /* I: the creating thread's nice value: every worker's */
  _Atomic(tko_lanes *) keyed; /* tko_submit_keyed's lane table, made on first use */
  /* The ops that made `keyed` (keyed_host.h), which free it at destroy:
   * set by its maker before the release that publishes it. */
  const struct tko__keyed_ops *keyed_ops;
  tko_options opts;        /* I: defaults resolved */
  tko__thread_place place; /* I: every worker thread's CPUs and stack */
  char name[10];           /* I: the thread-name prefix, cut to 9 */
  bool timing;        /* I: some hook needs wait/run times */
  bool count_late;    /* I: timing and no aging: starts count late inversions
                         (worker.c: count_late) */
  bool stamp_enqueue; /* I: timing or aging: submits read the clock. Kept here, with
                         the read-only options, not read from the queue's
                         aging_ns, whose line the lock holder writes per take */
  /* Live resize (resize.c). The targets are stored by tko_pool_resize
   * under spawn_mu and read lock-free as hints (a worker after each task,
   * a spawner); every decision on them is taken again under spawn_mu.
   * Read-mostly: no task writes this line. */
  atomic_uint basic_target; /* basic workers wanted: slots [0, basic_target) */
  atomic_uint elastic_max;  /* max_elastic now (opts.max_elastic: at create) */
  /* The heaviest weight ever submitted: a worker whose next task of its
   * batch weighs that much starts it without a recheck look (worker.c),
   * since nothing can outrank it. Raised by CAS only when a heavier weight
   * first appears, so this line stays read-mostly. */
  atomic_int weight_ceiling;
  uint64_t recheck_ns;      /* I: opts.recheck_us, 0 resolved, in ns */
  unsigned elastic_base;    /* I: basic slots are [0, elastic_base), elastic
                               ones [elastic_base, nslots); each region holds
                               opts.max_threads, within TKO_MAX_WORKERS /
                               TKO_MAX_ELASTIC */
  unsigned nslots;          /* I */
  tko__worker *slots;       /* I: cache-line aligned inside slots_raw */
  void *slots_raw;
  void *raw; /* I: the pool's own allocation (the pool is aligned inside it) */
};

/* The pool whose worker is the calling thread, if any, and that worker. */
extern _Thread_local tko_pool *tko__current_pool;
extern _Thread_local tko__worker *tko__current_worker;

/* A task or hook of pool running on a thread the pool does not own (a
 * caller-runs task, on_cancel under tko_group_cancel, an async task's
 * after_run on its completer): for its duration the thread counts as the
 * pool's, so waiting on or destroying the pool from there is -EDEADLK. */
static inline tko_pool *tko__enter_pool(tko_pool *pool) {
  tko_pool *prev = tko__current_pool;
  tko__current_pool = pool;
  return prev;
}
static inline void tko__leave_pool(tko_pool *prev) { tko__current_pool = prev; }

/* Tags in the low bits of tko__item.ctx (TKO__CTX_TAGS, queue.h). */
#define TKO__CTX_GROUP ((uintptr_t)1)
/* An async task: it waits in the async queue (the engine's take counts it
 * against max_async_inflight); its record is its group, or the async
 * feature's own (TKO__CTX_KIND). */
#define TKO__CTX_ASYNC ((uintptr_t)2)
/* A task of a kind (below): its record starts with its tko__task_kind. */
#define TKO__CTX_KIND ((uintptr_t)4)
/* An owned task (lifecycle.h): its record is its tko__task_owner. */
#define TKO__CTX_OWNED (TKO__CTX_GROUP | TKO__CTX_KIND)

/* Task kinds: what a feature that follows its own tasks (a group's member,
 * an async task, a periodic timer's firing, a task handle) registers with
 * the engine, which knows such a task only by this record, reached through
 * the record the item's ctx points to (tagged TKO__CTX_GROUP or
 * TKO__CTX_KIND: tko__item_kind). A plain task (ctx 0) has no kind and
 * pays for none of this. The engine calls each callback on the thread that
 * runs or cancels the task, with no pool lock held, before the host's hooks
 * see the outcome counted:
 * - run (NULL: the engine runs the task): the kind runs the task itself,
 *   in place of start, the started count, the hooks, the call and done,
 *   and finishes it itself, counted, once it ends (an async task: its
 *   start function runs here, and it completes later on any thread,
 *   tko_async_complete); returns the task's status so far. A thread that
 *   ends inside run leaves the task to the kind (worker.c: thread exit);
 * - start (NULL: always true): a worker, or the caller in caller-runs, is
 *   about to run the task, its hooks not yet called. False: the task must
 *   not run (its feature withdrew it); the engine cancels it instead, as
 *   it cancels any queued task (on_cancel, then cancelled, counted);
 * - done: the task ran and returned status (-ECANCELED for a task that
 *   ended its thread: worker.c), after the after_run and on_failure hooks;
 * - cancelled: the task will never run, after the on_cancel hook saw it;
 * - dropped (NULL: nothing): a worker took the task from its queue and
 *   will not start it (TKO_CANCEL began), just before the engine cancels
 *   it (cancelled follows): what the take gave it goes back (an async
 *   task's in-flight slot).
 * Exactly one of done and cancelled is called, once (with run, only
 * cancelled, and only for a task that never reached run, or that run gave
 * back to the engine to cancel). After it the engine touches neither the
 * item's record nor the kind, so done and cancelled may be the last touch
 * of a record its owner frees at once. */
typedef struct tko__task_kind {
  int (*run)(tko_pool *pool, tko__worker *w, const tko__item *item);
  bool (*start)(const tko__item *item);
  void (*done)(const tko__item *item, int status);
  void (*cancelled)(const tko__item *item);
  void (*dropped)(tko_pool *pool, const tko__item *item);
} tko__task_kind;

/* The kind of a task, NULL for a plain or an owned one. Its record starts
 * with the kinds of its tasks: the first word for a task without
 * TKO__CTX_ASYNC, the second for one with it (a group's record holds the
 * kind of its plain members and that of its async members; the async
 * feature's own record, for a task in no group, holds the async kind). */
static inline const tko__task_kind *tko__item_kind(const tko__item *item) {
  uintptr_t tag = item->ctx & TKO__CTX_TAGS;
  if (!(tag & TKO__CTX_OWNED) || tag == TKO__CTX_OWNED) return NULL;
  const tko__task_kind *const *kinds = (const tko__task_kind *const *)(item->ctx & ~TKO__CTX_TAGS);
  return kinds[(tag & TKO__CTX_ASYNC) != 0];
}

/* The group an item is a member of, NULL for any other. */
static inline void *tko__item_group(const tko__item *item) {
  return (item->ctx & TKO__CTX_OWNED) == TKO__CTX_GROUP ? (void *)(item->ctx & ~TKO__CTX_TAGS)
                                                        : NULL;
}
/* worker.c: the item whose on_cancel hook runs on this thread, if any. */
extern _Thread_local const tko__item *tko__cancelling_item;

/* The owner of an owned task, NULL for any other. */
static inline tko__task_owner *tko__item_owner(const tko__item *item) {
  return (item->ctx & TKO__CTX_TAGS) == TKO__CTX_OWNED
             ? (tko__task_owner *)(item->ctx & ~TKO__CTX_TAGS)
             : NULL;
}

/* An internal owner's task (the keyed table's runners): not a host task. */
static inline bool tko__item_internal(const tko__item *item) {
  const tko__task_owner *o = tko__item_owner(item);
  return o && o->internal;
}

/* Room a queued item holds in a bounded queue: an internal task holds none. */
static inline size_t tko__item_room(const tko__item *item) {
  return !tko__item_internal(item);
}

/* group.c: an async member finished (or was cancelled, status
 * -ECANCELED): its kind's (async.c) report to the group. */
void tko__group_finished(void *group, int status);
/* Submits a member of group: a plain one (async_kind NULL: the group's own
 * kind), or an async task (TKO__CTX_ASYNC) of async_kind, which the group's
 * record holds for its async members (tko__item_kind). */
int tko__group_submit_ctx(tko_pool *pool, tko_group *group, const tko__task_kind *async_kind,
                          tko_task_fn fn, void *arg, int weight);

/* shard.c: moves what was submitted to shard sh (its rings; for shard 0
 * the inbox too) into its queues and refreshes its backlog; caller holds
 * sh's lock. */
int tko__shard_drain_locked(tko_pool *pool, tko__shard *sh);
/* Whether shard sh may hold work: queued, or submitted to it and not yet
 * drained (relaxed loads: a hint; the take decides under its lock). */
bool tko__shard_work_hint(tko_pool *pool, const tko__shard *sh);
/* Drains every shard but except (NULL: every one) whose submissions wait,
 * each under its own lock, one at a time. */
void tko__shards_sweep(tko_pool *pool, const tko__shard *except);
/* The shard w's take tries first: the one with the heaviest top, w's home
 * on a tie (a hint, read lock-free). */
tko__shard *tko__shard_pick(tko_pool *pool, const tko__worker *w);
/* Whether some shard's top is heavier than weight. */
bool tko__shards_outrank(tko_pool *pool, int weight);
/* The shard a submitting thread's ring drains into, or shard 0 (the
 * inbox's). */
static inline tko__shard *tko__shard_of_ring(tko_pool *pool, const tko__ring *r) {
  return &pool->shards[r ? r->shard : 0];
}
/* Queues one task carrying ctx (a tagged group or async record); a full
 * bounded queue blocks up to timeout_ms (-1 = no limit). */
int tko__submit_item(tko_pool *pool, tko_task_fn fn, void *arg, uintptr_t ctx, int weight,
                     long timeout_ms);
/* As tko__submit_item with no time limit, storing the task's id in *id
 * before the task can start (a task a full TKO_FULL_CALLER_RUNS queue
 * runs on the caller has none: *id is left as it was). */
int tko__submit_item_id(tko_pool *pool, tko_task_fn fn, void *arg, uintptr_t ctx, int weight,
                        uint64_t *id);
/* admit.c. Gives back room in a bounded queue for n tasks that left it
 * (started, cancelled, or never queued): tko__give_room by worker w, the
 * calling thread's own slot (or the caller slot), in chunks;
 * tko__release_room at once, from any thread. */
void tko__give_room(tko_pool *pool, tko__worker *w, size_t n);
void tko__release_room(tko_pool *pool, size_t n);
/* Takes room for n tasks with no check (a caller-runs keyed task). */
void tko__take_room_unchecked(tko_pool *pool, size_t n);
/* A test seam (tests/unit/test_admit.c): called inside a settle, between
 * marking a worker's give-backs settled and subtracting them. NULL outside
 * tests. */
#ifdef TKO_TEST_SEAMS
extern void (*_Atomic tko__test_settle_window)(void);
#endif
/* Takes room for k tasks by the given full policy (keyed.c): TKO__ADMITTED,
 * TKO__RUN_HERE (caller-runs: no room taken) or a negative errno. *gated:
 * the caller waited inside the gate and calls tko__gate_leave once done
 * with the pool, whatever this returned. */
enum { TKO__ADMITTED = 0, TKO__RUN_HERE = 1 };
int tko__admit(tko_pool *pool, size_t k, long timeout_ms, tko_full_policy policy, bool *gated);
/* The submit time to stamp on a task: only when the pool measures times
 * or ages tasks. */
uint64_t tko__enqueue_time(tko_pool *pool);
/* Tasks ever accepted: inbox reservations, ring publishes, tasks run by
 * callers and side tasks. */
static inline uint64_t tko__submitted(tko_pool *pool) {
  return tko__inbox_reserved(&pool->inbox) + tko__rings_published(&pool->rings) +
         tko__load_seq(&pool->caller_runs) + tko__load_seq(&pool->side_tasks);
}
/* Counts a side task as submitted and returns its id, unique in the pool:
 * ids of queued tasks are below 2^63 (inbox positions below 2^62, ring
 * ids with bit 62: ring.h); these have the top bit set. seq_cst: submitted before it can count as cancelled. */
static inline uint64_t tko__side_task(tko_pool *pool) {
  return ((uint64_t)1 << 63) | (tko__add_seq(&pool->side_tasks, 1) + 1);
}

/* worker.c */
void *tko__worker_main(void *arg);
/* Bumps one of w's counters: a plain store for the owning worker, an RMW
 * for the shared caller slot. */
void tko__count(tko_pool *pool, tko__worker *w, atomic_uint_fast64_t *c);
int tko__thread_start(tko_pool *pool, tko__worker *w);
/* Runs one task with hooks and counting, on the calling thread. */
int tko__run_item(tko_pool *pool, tko__worker *w, const tko__item *item);
/* Takes up to max queued tasks whose ctx is ctx (or ctx | TKO__CTX_ASYNC in
 * the async queue) out of the pool, wherever they are queued, their room
 * given back; returns how many (0: none left). O(queued). */
size_t tko__take_queued(tko_pool *pool, uintptr_t ctx, tko__item *out, size_t max);
/* Takes the queued task whose ctx is ctx (not an async one) out of the
 * queue and runs it on worker w, the calling thread, wherever its weight
 * places it (a wait on that one task: tko_handle_wait); false if it is not
 * queued or the pool is paused. O(queued). */
bool tko__run_queued(tko_pool *pool, tko__worker *w, uintptr_t ctx);
/* Whether worker w took a task whose ctx is ctx and has not started it
 * (it is in one of w's batches). */
bool tko__holds_taken(const tko__worker *w, uintptr_t ctx);
void tko__cancel_item(tko_pool *pool, const tko__item *item);
/* Takes the newest queued task whose ctx is ctx (a member of the group a
 * helping wait waits for) and runs it on worker w; false if none is queued
 * or the pool is paused. */
bool tko__help_member(tko_pool *pool, tko__worker *w, uintptr_t ctx);
/* Takes one queued task and runs it on worker w (a helping group wait);
 * false if none could be taken. */
bool tko__help_one(tko_pool *pool, tko__worker *w);
void tko__notify_idle(tko_pool *pool);

/* Shutdown and destroy reach async tasks, timers and the keyed table
 * through the phases they register (lifecycle.h: tko__phase). */

/* elastic.c */
void tko__elastic_spawn(tko_pool *pool);
bool tko__elastic_try_retire(tko_pool *pool, tko__worker *w);
/* After a retired worker's thread_stop hook: if work is waiting (the hook
 * may have submitted it, and no spawn can reuse the caller's own slot),
 * takes the slot and a count back so this thread carries on. */
bool tko__elastic_resurrect(tko_pool *pool, tko__worker *w);
/* A new elastic thread (or a resurrected one) counts itself spawned and
 * raises the peak, before it can retire. */
void tko__elastic_started(tko_pool *pool);
/* Marks a retired worker's thread as running (or done with) its stop hook. */
void tko__elastic_set_stopping(tko_pool *pool, tko__worker *w, bool stopping);
void tko__elastic_close_and_join(tko_pool *pool);
/* Starts a thread for slot w, counted as searching and in the lifecycle's
 * threads before it exists; on failure takes both back (waking a sleeper
 * in its place if work waits) and returns the error. */
int tko__worker_spawn(tko_pool *pool, tko__worker *w, pthread_t *t);

/* resize.c. Whether worker w is above the pool's size (a basic worker at or
 * past basic_target, or an elastic one while more run than elastic_max): a
 * lock-free hint, read after each task and before each take; relaxed, the
 * decision is tko__resize_retire's. */
static inline bool tko__resize_hint(tko_pool *pool, const tko__worker *w) {
  if (w->kind == TKO_WORKER_BASIC) return w->index >= tko__load_relaxed(&pool->basic_target);
  return tko__load_relaxed(&pool->elastic_count) > tko__load_relaxed(&pool->elastic_max);
}
/* The same with seq_cst loads, for a worker about to sleep: its re-check
 * after sleep_prepare, the other half of a shrink's seq_cst stores before
 * it wakes every sleeper (resize.c, signal.c). */
static inline bool tko__resize_hint_seq(tko_pool *pool, const tko__worker *w) {
  if (w->kind == TKO_WORKER_BASIC) return w->index >= tko__load_seq(&pool->basic_target);
  return tko__load_seq(&pool->elastic_count) > tko__load_seq(&pool->elastic_max);
}
/* Decides under spawn_mu whether w retires for a shrink, and if so gives up
 * its place (a basic slot becomes LEAVING, an elastic worker releases its
 * count and slot as an idle one does). */
bool tko__resize_retire(tko_pool *pool, tko__worker *w);
/* A basic worker that left after a shrink has run its stop hook: true if a
 * grow handed its slot back meanwhile (it carries on), else its slot is
 * RETIRING and the thread ends. */
bool tko__resize_left(tko_pool *pool, tko__worker *w);
/* A basic slot whose thread ends with no replacement (worker.c: a task's
 * pthread_exit, and no thread could start) becomes RETIRING: a grow joins
 * that thread and starts another. */
void tko__resize_vacate(tko_pool *pool, tko__worker *w);

/* Refreshes sh's backlog (and, for shard 0, async_waiting) and top;
 * caller holds sh's lock. Each backlog is read only as "any" (tko__look_seq,
 * tko__nothing_left), so it is stored only when that changes: a flood's
 * takes then leave its line alone, which they stored once a take, the
 * audit's worst line (audit_sharing). Relaxed, under the lock (its only
 * writers); the sleep protocol's seq_cst point is tko__publish_backlog_seq
 * (signal.c). top is kept only where there is more than one shard: a
 * release store, read with acquire loads by workers choosing a shard
 * (shard.c), which then decide under that shard's lock. */
static inline void tko__refresh_backlog(tko_pool *pool, tko__shard *sh) {
  size_t work = sh->queue.len > 0;
  /* The queue whose best task is the shard's top: shard 0's async queue
   * when it may start one and holds a heavier task (else a heavy async
   * task would wait for every other shard's lighter tasks, their tops
   * beating shard 0's empty queue). */
  const tko__queue *best = &sh->queue;
  if (sh->index == 0) {
    unsigned max = pool->opts.max_async_inflight;
    size_t runnable_async = !max || pool->async_running < max ? pool->async_queue.len : 0;
    work |= runnable_async > 0;
    if (runnable_async &&
        tko__queue_top_weight(&pool->async_queue) > tko__queue_top_weight(&sh->queue))
      best = &pool->async_queue;
    size_t waiting = pool->async_queue.len > 0;
    if (tko__load_relaxed(&pool->async_waiting) != waiting)
      tko__store_relaxed(&pool->async_waiting, waiting);
  }
  if (tko__load_relaxed(&sh->backlog) != work) tko__store_relaxed(&sh->backlog, work);
  if (pool->nshards > 1 || pool->count_late) {
    int top = tko__queue_top_weight(best);
    if (tko__load_relaxed(&sh->top) != top) tko__store_release(&sh->top, top);
  }
  if (pool->count_late) {
    uint64_t since = tko__queue_top_enq_ns(best);
    if (tko__load_relaxed(&sh->top_since) != since) tko__store_relaxed(&sh->top_since, since);
  }
}

/* Caller holds sh's lock and has queued tasks that a sleeper may not have
 * been told of (a submitter's move, a worker's hand-back): a seq_cst store
 * of backlog (the value just stored, under the lock) is step (1') of
 * signal.c's essay, as a slot's publish is; the caller then wakes a worker
 * (tko__runnable_seq, tko__signal_work). */
static inline void tko__publish_backlog_seq(tko__shard *sh) {
  tko__store_seq(&sh->backlog, tko__load_relaxed(&sh->backlog));
}

/* Whether any shard's backlog says work waits: seq_cst loads (step (2) of
 * signal.c's essay), or relaxed ones (a hint). */
static inline bool tko__backlog_seq(tko_pool *pool) {
  for (unsigned i = 0; i < pool->nshards; i++)
    if (tko__load_seq(&pool->shards[i].backlog) > 0) return true;
  return false;
}
static inline bool tko__backlog_hint(tko_pool *pool) {
  for (unsigned i = 0; i < pool->nshards; i++)
    if (tko__load_relaxed(&pool->shards[i].backlog) > 0) return true;
  return false;
}

/* True in a child process forked after the pool was created: its threads
 * do not exist there, so every call refuses with -ECHILD. */
static inline bool tko__pool_forked(const tko_pool *pool) {
  return pool->fork_gen != tko__fork_generation();
}

/* A live pool carries this in magic; free_pool clears it before the memory
 * goes back, so a second destroy or a call after destroy is caught while
 * the memory is still mapped and not reused (best effort: a freed block
 * the allocator has handed out again may hold anything). */
#define TKO__POOL_MAGIC 0x706f6b74u /* "tkop" */

/* The entry check of the pool's calls: -EINVAL for NULL or a pool that is
 * not (or no longer) a live pool, -ECHILD in a forked child, else 0. It
 * reads two words of the read-mostly part of the pool, no shared line. */
static inline int tko__pool_check(const tko_pool *pool) {
  if (!pool || pool->magic != TKO__POOL_MAGIC) return -EINVAL;
  return tko__pool_forked(pool) ? -ECHILD : 0;
}

/* lifecycle.c: a worker thread is about to start (before creating it) or
 * has reached its end (its last touch of the pool, before it returns);
 * shutdown waits for the count to reach zero before it joins. */
void tko__thread_enter(tko_pool *pool);
void tko__thread_exit(tko_pool *pool);
/* Whether the calling thread is inside shutdown or destroy of pool (its
 * waits would wait on themselves). */
bool tko__in_shutdown(const tko_pool *pool);
/* Whether the calling thread holds pool's shutter role (its shutdown or
 * destroy would wait on itself). */
bool tko__in_role(const tko_pool *pool);
/* Whether any attachment other than the pool's own is still registered
 * (destroy's -EBUSY). */
bool tko__attached(tko_pool *pool);
/* Calls every registered phase's fini in number order (destroy, the pool
 * stopped, nothing else touching it). */
void tko__phases_fini(tko_pool *pool);
/* Takes queued tasks out and cancels them, or (run) runs them on the
 * calling thread. */
void tko__empty_queue(tko_pool *pool, bool run);

/* pool.c: gives the queues' slabs back down to their initial size when
 * nothing is queued (tko_pool_trim, and an idle worker's decay); whether
 * there is anything to give back (a lock-free hint). */
void tko__pool_trim(tko_pool *pool);
bool tko__pool_trimmable(const tko_pool *pool);

/* What a worker about to sleep, or one deciding whether to wake another,
 * finds (seq_cst loads: step (2) of signal.c's essay): work it can take
 * (queued, or published in the inbox), only a hole (a position reserved
 * and not yet published: its task is on its way, but its submitter may
 * have been stopped there, inbox.h), or nothing. Not paused. */
enum tko__look { TKO__LOOK_NOTHING, TKO__LOOK_HOLE, TKO__LOOK_WORK };
static inline enum tko__look tko__look_seq(tko_pool *pool) {
  if (tko__load_seq(&pool->paused)) return TKO__LOOK_NOTHING; /* resume wakes all */
  /* backlog first: while a hole holds head, the inbox's check reads slots. */
  if (tko__backlog_seq(pool) || tko__rings_ready_seq(&pool->rings) ||
      tko__inbox_ready(&pool->inbox))
    return TKO__LOOK_WORK;
  return tko__inbox_settled(&pool->inbox) ? TKO__LOOK_NOTHING : TKO__LOOK_HOLE;
}

/* How long a worker sleeps beside a hole before it looks again: the
 * hole's publish is a release store, so its submitter's wake-up may miss
 * a worker that saw the slot empty (signal.c). A worker doubles it for
 * each look in a row that finds the same state, up to
 * TKO__HOLE_POLL_MAX_MS, so that a submitter stopped for long costs a
 * few looks, not one a millisecond (test_stalled_submit's stay_asleep
 * checks that workers beside a hole use little CPU). */
#define TKO__HOLE_POLL_MS 1
#define TKO__HOLE_POLL_MAX_MS 16

/* Whether any task is queued or on its way: in the queue, or at a
 * position of the inbox not yet done with (published, or a hole). The
 * seq_cst form counts holes as work (tko__look_seq); the relaxed form is
 * a searching worker's hint of published work (take_batch decides under
 * the lock). */
static inline bool tko__has_work_seq(tko_pool *pool) {
  return tko__backlog_seq(pool) || !tko__inbox_settled(&pool->inbox) ||
         tko__rings_ready_seq(&pool->rings);
}
static inline bool tko__has_work_hint(tko_pool *pool) {
  return tko__inbox_ready_hint(&pool->inbox) || tko__backlog_hint(pool) ||
         tko__rings_ready_hint(&pool->rings);
}

/* Work that may start now or is on its way (a hole counts: see
 * tko__look_seq), and the pool is not paused: a worker that stops
 * searching wakes another if so. seq_cst (pairs with tko_pool_resume's
 * store, and with the reservation's CAS). */
static inline bool tko__runnable_seq(tko_pool *pool) {
  return tko__look_seq(pool) != TKO__LOOK_NOTHING;
}

/* Shutdown may let workers go: nothing queued anywhere, async included. */
static inline bool tko__nothing_left(tko_pool *pool) {
  /* Holes count: a reservation made before the close and not yet
   * published is still to come (inbox.h). */
  return !tko__has_work_seq(pool) && tko__load_seq(&pool->async_waiting) == 0;
}

/* help.c: a helping wait's sleep, on the waiting thread's stack. */
typedef struct tko__helper {
  tko__parker parker;             /* the wait sleeps here */
  struct tko__helper *pool_next;  /* the pool's sleeping helpers: under help_mu */
} tko__helper;
/* Unparks every helper the pool lists (new work is runnable). */
void tko__wake_helpers(tko_pool *pool);
/* Sleeps on h's parker, listed in the pool, for at most max_ns
 * (UINT64_MAX: no limit), unless work is runnable in pool or waiting(arg)
 * says the wait is over; whoever ends the wait unparks h. */
void tko__helper_sleep(tko_pool *pool, tko__helper *h, uint64_t max_ns,
                       bool (*waiting)(void *arg), void *arg);

/* Called after new work is queued: wakes the workers waiting in a helping
 * group wait, if any; then, unless a worker is searching, wakes a sleeper,
 * or, if none sleeps, starts an elastic worker where the pool may have
 * them. */
static inline void tko__signal_work(tko_pool *pool) {
  /* seq_cst, after the work was published: pairs with the helper's
   * increment of helpers before its re-check (group.c). */
  if (tko__load_seq(&pool->helpers)) tko__wake_helpers(pool);
  /* seq_cst: step (2') of signal.c's essay, after the reservation. */
  uint64_t st = tko__load_seq(&pool->idle.state);
  if (tko__idle_searching(st) > 0) return;
  if (tko__idle_sleeping(st) > 0 && tko__idle_wake_one(&pool->idle)) return;
  /* Relaxed: a hint (tko_pool_resize may change it); the spawn's own
   * reservation re-reads it. */
  if (tko__load_relaxed(&pool->elastic_max)) tko__elastic_spawn(pool);
}

#endif
