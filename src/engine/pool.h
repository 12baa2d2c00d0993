/* SPDX-License-Identifier: MIT */
/* The pool's layout: struct tko_pool, its worker slots (tko__worker) and
 * weighted queues (tko__shard), the frames a worker keeps on its stack,
 * and the constants that size them. Shared by the engine's files and its
 * features (through engine.h, kind.h, wake.h); the extensions (the lane_*.c files,
 * coalescer.c) never include it.
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
 * Outermost first: keyed_mu, spawn_mu, the queue lock, help_mu; every other lock
 * (gate_mu, idle_mu, timer_mu, async_mu, a group's mu,
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
#ifndef TKO_POOL_H
#define TKO_POOL_H
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
 * between two of a worker's clock reads in a batch (take.c:
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

/* A task a worker runs (run.c: tko__run_or_cancel), on the worker's stack. */
typedef struct tko__task_frame {
  const tko__item *item;
  /* The item's kind, read when the task started: once the task ran, its
   * owner's record (which holds the kind) may be gone - an owner may let
   * its destroy go on from inside the task, and a task that ends its
   * thread unwinds through such a step before tko__task_exited runs. */
  const struct tko__task_kind *kind;
  unsigned blocking_base; /* blocking_depth when the task started */
  struct tko__task_frame *outer;
} tko__task_frame;

/* A batch a worker took (take.c: tko__run_batch), on the worker's stack. */
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
  atomic_uint_fast64_t finished; /* stored seq_cst once per batch: see take.c */
  atomic_uint_fast64_t failed;
  atomic_bool staging; /* copying ring slots without a lock (shard.c: tko__shard_stage) */
  /* Where it copies them, between a stage and the drain that follows it
   * (never across a task): in pool->stages_raw; NULL in the caller slot,
   * and in a pool that does not stage (pool.c: stages). */
  tko__ring_stage *stage;
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
   * pool's accounting right (worker.c: tko__task_exited). */
  struct tko__task_frame *task;
  struct tko__batch_frame *batch;
  /* The slot's previous thread, to be joined by the thread that takes the
   * slot: a basic worker's that a task ended (set by the ending thread
   * before it creates the replacement), or a retired elastic worker's (set
   * by the spawner); read by the new thread (pthread_create orders them). */
  pthread_t predecessor;
  bool has_predecessor;
  bool exiting; /* a task is ending this thread (owner only) */
  size_t batch_cap; /* most tasks the next take may hold; owner only */
  /* The recheck (take.c), owner only: the time of its last take or look,
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

struct tko__source; /* kind.h */

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
  tko__queue held;       /* the held source's tasks waiting to start (kind.h) */
  unsigned held_running; /* held tasks in flight; guarded by shard 0's lock */
  /* The held source (kind.h: tko__source), NULL until it registers: set
   * once, a release store (tko__source_add); read under shard 0's lock,
   * only where the held queue holds a task, which its submitter queued
   * after it saw the source registered. */
  _Atomic(const struct tko__source *) held_source;
  /* 1 while held tasks wait, else 0; stored under shard 0's lock when
   * that changes (tko__refresh_backlog), read lock-free. */
  atomic_size_t held_waiting;
  /* tko__pool_trim calls in progress (an idle worker's decay, a host's
   * call): tko_pool_trim waits them out, so memory another trim took is
   * freed, and counted so, once it returns. */
  atomic_uint trims;
  atomic_bool closing;    /* set under lock at shutdown; read lock-free */
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
   * blocked submitter counts itself in space_waiters, reads space_seq,
   * looks, and sleeps on space_seq (an event count: tko__word_wait);
   * whoever frees room and sees waiters bumps it and wakes them. */
  TKO_CACHE_ALIGNED atomic_size_t room_taken;
  atomic_uint room_slots;
  atomic_uint room_moving; /* settles and take-backs between their two steps */
  /* Read by every give-back (admit.c), written only by waiters, and
   * space_seq only while waiters are counted: their own line, away from
   * room_taken. */
  TKO_CACHE_ALIGNED atomic_uint space_waiters;
  atomic_uint space_seq; /* A: the waiters' event count (admit.c) */
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
  atomic_uint held_inflight; /* held_running, readable lock-free */
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
  pthread_cond_t gate_cv;  /* the gate's count or threads reached 0, the shutter
                              role was given back, an attachment's close
                              returned */
  atomic_uint gate;        /* threads inside the gate, in steps of 2, | 1 once
                              closed (lifecycle.c); lock-free while open */
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
  /* tko__pool_state (lifecycle.h), written under gate_mu at each of its
   * four changes; beside magic, on the line every submit reads, since
   * every submit looks at it (tko__pool_refusing). */
  atomic_int state;
  int creator_nice;  /* I: the creating thread's nice value: every worker's */
  /* tko_submit_keyed's lane table, made on first use under keyed_mu;
   * read without it by an acquire load that pairs with the release store
   * that publishes it (keyed.c: keyed_table). */
  _Atomic(tko_lanes *) keyed;
  tko__mutex keyed_mu; /* one thread at a time makes `keyed` */
  /* The ops that made `keyed` (keyed_host.h), which free it at destroy:
   * set by its maker before the release that publishes it. */
  const struct tko__keyed_ops *keyed_ops;
  tko_options opts;        /* I: defaults resolved */
  tko__thread_place place; /* I: every worker thread's CPUs and stack */
  char name[10];           /* I: the thread-name prefix, cut to 9 */
  bool timing;        /* I: some hook needs wait/run times */
  bool count_late;    /* I: timing and no aging: starts count late inversions
                         (run.c: count_late) */
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
   * batch weighs that much starts it without a recheck look (take.c),
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
  void *stages_raw;         /* I: the slots' stages (tko__worker.stage) */
  void *raw; /* I: the pool's own allocation (the pool is aligned inside it) */
};

/* A live pool carries this in magic; free_pool clears it before the memory
 * goes back, so a second destroy or a call after destroy is caught while
 * the memory is still mapped and not reused (best effort: a freed block
 * the allocator has handed out again may hold anything). */
#define TKO__POOL_MAGIC 0x706f6b74u /* "tkop" */

#endif
