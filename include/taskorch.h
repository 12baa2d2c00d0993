/* SPDX-License-Identifier: MIT */
/** @file
 * taskorch: a priority task orchestrator (thread pool) for C11 host programs.
 *
 * One public header. Every function returns 0 or a negative errno value unless
 * documented otherwise; tko_strerror() names each code. When a call fails, the
 * task it was given never runs and no hook is called for it.
 *
 * Thread safety: every function may be called from any thread at any time,
 * concurrently with any other call on the same object, tasks and hooks
 * included, except where its comment says otherwise: tko_pool_destroy (no
 * call on that pool may race with it or follow it), tko_group_init and
 * tko_group_destroy (none on that group), tko_timer_init (not on an armed
 * timer). Calls that wait for the pool say what they return when made from
 * the pool's own tasks. */
#ifndef TASKORCH_H
#define TASKORCH_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** The version of these headers; tko_version_string() gives the library's.
 * ABI policy: before 1.0 each minor release may change the ABI (tko_options
 * and tko_stats are passed by value and grow with new features) and has a
 * soname of its own, libtaskorch.so.0.MINOR; a patch release only adds
 * functions. From 1.0 the soname is the major version. */
#define TKO_VERSION_MAJOR 0
#define TKO_VERSION_MINOR 2          /**< minor version */
#define TKO_VERSION_PATCH 0          /**< patch version */
#define TKO_VERSION_STRING "0.2.0"   /**< the version as a string */
/** Packed as major*10000 + minor*100 + patch, for compile-time comparisons. */
#define TKO_VERSION_NUMBER \
  (TKO_VERSION_MAJOR * 10000 + TKO_VERSION_MINOR * 100 + TKO_VERSION_PATCH)

/** Marks the library's functions: default visibility in a library built
 * with hidden visibility. */
#if defined(_WIN32)
#define TKO_API
#elif defined(__GNUC__)
#define TKO_API __attribute__((visibility("default")))
#else
#define TKO_API
#endif

/** Alignment of the caller-owned opaque types: C11's _Alignas, C++11's
 * alignas (the headers compile as C11 and as C++11 and later). */
#ifdef __cplusplus
#define TKO_ALIGNAS(n) alignas(n)
#else
#define TKO_ALIGNAS(n) _Alignas(n)
#endif

/** Hard limit, checked by tko_pool_create (larger values are -EINVAL). */
#define TKO_MAX_WORKERS 1024u     /**< basic workers */
#define TKO_MAX_QUEUES 64u        /**< tko_options.queues */
#define TKO_MAX_ELASTIC 1024u     /**< elastic workers */
#define TKO_MAX_IDLE_MS 3600000u  /**< elastic idle timeout and aging_ms: one hour */
#define TKO_MAX_CPUS 1024u        /**< CPU numbers in tko_options.cpus: 0..1023 */
#define TKO_MIN_STACK_SIZE ((size_t)64 << 10) /**< smallest tko_options.stack_size */
/** Longest timer delay or period (tko_submit_after / _every): 100 years in
 * ms, so that a deadline in nanoseconds cannot overflow. Larger: -EINVAL. */
#define TKO_MAX_TIMER_MS 3153600000000LL
/** Deepest nesting of helping group waits on one worker (see tko_group_wait). */
#define TKO_MAX_HELP_DEPTH 64u
#define TKO_MAX_QUEUE_CAPACITY ((size_t)1 << 31) /**< tko_options.queue_capacity: 2^31 tasks */
#define TKO_MAX_INITIAL_CAPACITY ((size_t)1 << 30) /**< tko_options.initial_capacity: 2^30 slots */

typedef struct tko_pool tko_pool; /**< opaque */

/** A task: returns 0 on success; any other value is a failure status that is
 * counted in tko_stats.failed and passed to the on_failure hook. In C++ a
 * task must not throw: on a worker thread a throw ends in std::terminate,
 * so wrap the body in try/catch and return non-zero, which on_failure
 * reports.
 * @details Leaving a task other than by returning: pthread_exit from a task
 * on a worker is supported - the task counts as completed and failed (status
 * -ECANCELED for its group; no after_run or on_failure hook), the tasks
 * that worker had taken go back to the queue, its thread_stop hook runs,
 * and a basic worker is replaced by a new thread (an elastic one retires),
 * so waits, stats and shutdown stay right. So is it from a keyed task or
 * a lane table's task (taskorch/lanes.h) on a worker: the tasks its lane's
 * visit had taken and not started go back to the head of the lane, in
 * order, and the lane goes on with a new runner - or, where the lane's
 * table is closed (the pool's shutdown closes it) or the pool refuses
 * that runner (shutting down, or a full queue), the ending thread runs
 * no more of them and the lane's queued tasks go to on_cancel. So is it
 * from a coalescer's flush function in a sweep on a worker
 * (taskorch/coalescer.h): the sweep ends as if it had returned, its
 * entries flushed. Not supported (the pool's
 * counts, and with them waits and shutdown, go wrong): pthread_exit from
 * an async task's start function, from a task run on a submitter's
 * thread (TKO_FULL_CALLER_RUNS, a lane tko_lanes_submit_wait runs on its
 * caller, or a lane a destroy drives), thread
 * cancellation, and longjmp or
 * siglongjmp out of any task or hook; a bounded wait (tko_pool_wait_idle,
 * tko_pool_shutdown_timed) then returns -ETIMEDOUT instead of hanging. */
typedef int (*tko_task_fn)(void *arg);

/** How tko_pool_shutdown treats the tasks still queued. */
typedef enum tko_shutdown_mode {
  TKO_DRAIN = 0,        /**< run every queued task, then stop */
  TKO_CANCEL = 1,       /**< hand every queued task to on_cancel, then stop */
  TKO_CANCEL_NOWAIT = 2 /**< close, hand every queued task to on_cancel, and
                           return at once without waiting for running tasks
                           (GLib's immediate free, Java's shutdownNow) */
} tko_shutdown_mode;

/** The kind of a worker thread. */
typedef enum tko_worker_kind {
  TKO_WORKER_BASIC = 0,   /**< lives as long as the pool */
  TKO_WORKER_ELASTIC = 1  /**< spawned under backlog, retired when idle */
} tko_worker_kind;

/** What a task hook is told. Times are in nanoseconds and are measured only
 * when the pool has a before_run, after_run or on_failure hook (else 0). */
typedef struct tko_task_info {
  uint64_t id;           /**< unique per pool, nonzero; increasing per
                            submitting thread; consecutive within a batch. A
                            pool made with one worker and no elastic ones
                            numbers tko_submit and tko_submit_batch tasks
                            from 1, gap-free, in submit order (one shared
                            inbox); with more workers a submitting thread
                            that holds a submit ring has ids of its own (bit
                            62 set); threads past a pool's 64 rings share
                            the inbox's numbering.
                            A keyed task, like a timer's task that never
                            reached the queue, has an id with the top bit set */
  tko_task_fn fn;         /**< the task's function */
  void *arg;             /**< its argument */
  int weight;            /**< its weight */
  int status;            /**< the task's return value (after_run, on_failure) */
  uint64_t wait_ns;      /**< submit to start */
  uint64_t run_ns;       /**< start to return (after_run, on_failure) */
  unsigned worker;       /**< worker index (on_cancel: UINT32_MAX) */
  tko_worker_kind kind;  /**< kind of that worker */
} tko_task_info;

/** A task hook (tko_hooks): user is tko_hooks.user; task is valid during the call. */
typedef void (*tko_task_hook)(void *user, const tko_task_info *task);
/** A thread hook (tko_hooks): the worker's index and kind. */
typedef void (*tko_thread_hook)(void *user, unsigned index, tko_worker_kind kind);

/** Hooks run on the pool's threads (on_cancel: on the thread that cancels),
 * never under an internal lock, so they may submit. A NULL hook is skipped. */
typedef struct tko_hooks {
  void *user;                    /**< passed to every hook */
  tko_task_hook before_run;      /**< just before a task starts */
  tko_task_hook after_run;       /**< after every task, whatever its status */
  tko_task_hook on_failure;      /**< after a task that returned non-zero */
  tko_task_hook on_cancel;       /**< a queued task dropped by TKO_CANCEL: free its arg here */
  tko_thread_hook thread_start;  /**< first thing a worker thread does */
  tko_thread_hook thread_stop;   /**< last thing a worker thread does (an elastic
                                    worker whose thread_stop submitted work that
                                    nobody else can take starts again, with a
                                    new thread_start) */
} tko_hooks;

/** What a submit does when a bounded queue is full. */
typedef enum tko_full_policy {
  TKO_FULL_BLOCK = 0,       /**< wait for room (tko_submit_timed bounds the wait) */
  TKO_FULL_REJECT = 1,      /**< fail with -EAGAIN */
  TKO_FULL_CALLER_RUNS = 2  /**< run the task on the submitting thread, now */
} tko_full_policy;

/** Optional allocator for the pool's own memory (create, queue growth,
 * destroy). Tasks never allocate. Set all three functions, or none (the C
 * library's); a mix is -EINVAL, since memory from one side must never reach
 * the other's realloc or free. */
typedef struct tko_allocator {
  void *(*alloc)(void *ctx, size_t size);              /**< like malloc */
  void *(*realloc)(void *ctx, void *ptr, size_t size); /**< like realloc */
  void (*free)(void *ctx, void *ptr);                  /**< like free */
  void *ctx;                                           /**< passed to all three */
} tko_allocator;

/** Pool options. Fill them with tko_basic_options or tko_elastic_options, then
 * adjust fields. Zero-filled fields mean the defaults noted beside them.
 * Workers get the default scheduling policy, not their creator's, and the
 * nice value of the thread that created the pool: on Linux a new thread
 * copies its creator's, so an elastic worker started by a submit resets
 * itself to the pool creator's value. Going back to a higher priority (a
 * submitter niced above the pool's creator) needs CAP_SYS_NICE; without it
 * that elastic worker keeps the submitter's value. */
typedef struct tko_options {
  unsigned workers;          /**< basic workers; tko_basic_options(0) = CPU count */
  unsigned max_elastic;      /**< extra workers spawned under backlog; default 0 */
  unsigned elastic_idle_ms;  /**< an elastic worker idle this long retires; 0 = 1000.
                                Also the idle time after which the queue gives
                                a burst's memory back (tko_pool_trim) */
  unsigned spin_yields;      /**< yields a worker makes looking for work before it
                                sleeps; 0 = 8; at most 1,000,000. (A worker whose take came back
                                with fewer than 4 tasks, and fewer than
                                max_batch, also yields once before looking
                                again, so that tasks gather into batches.) */
  unsigned max_batch;        /**< most queued tasks a worker takes at once, 1..64;
                                0 = 64. Within it a worker sizes each take to
                                about 20 us of work, timing its last batch
                                (short tasks: big takes; tasks of 20 us or
                                more: one at a time). Use 1 when tasks wait
                                for each other (a worker never runs a task it
                                took while an earlier one of its batch
                                blocks). */
  size_t initial_capacity;   /**< queue slots allocated up front; 0 = 256; at most
                                TKO_MAX_INITIAL_CAPACITY */
  size_t queue_capacity;     /**< most tasks queued (not started) at once; 0 = no
                                limit; at most TKO_MAX_QUEUE_CAPACITY. Memory is
                                then bounded too. */
  tko_full_policy full_policy; /**< when queue_capacity is reached; default BLOCK */
  unsigned aging_ms;         /**< anti-starvation: a queued task gains one unit of
                                weight per aging_ms waited; 0 = off; at most
                                TKO_MAX_IDLE_MS */
  unsigned max_async_inflight; /**< async tasks started and not completed at
                                  once; the rest stay queued by weight; 0 = no limit */
  const char *name;          /**< thread name prefix, NULL = "tko". Workers are
                                named "<name>-b<i>" (basic) and "<name>-e<i>"
                                (elastic); Linux allows 15 characters, so the
                                prefix is cut to its first 9 (enough for
                                "-e1023"): "inventory-sync" names "inventory-b0".
                                Copied at create. */
  tko_hooks hooks;           /**< hooks; zero-filled = none */
  const tko_allocator *allocator; /**< NULL = malloc/realloc/free */
  /** Thread placement, for every worker thread (basic and elastic; not the
   * timer thread nor a coalescer's). Checked and copied at create. */
  const unsigned *cpus;      /**< CPU affinity: the CPU numbers (0 .. TKO_MAX_CPUS - 1,
                                as sched_getcpu counts them) a worker may run on,
                                ncpus of them; NULL = not set: a worker keeps
                                the mask of the thread that started it (the
                                pool's creator, or for an elastic worker the
                                submitting thread). -EINVAL: ncpus 0 with a
                                list (an empty set), ncpus above 0 with no
                                list, a number out of range, or
                                none of the CPUs the creating thread may use;
                                -ENOTSUP where affinity is not supported (Linux
                                only for now) */
  size_t ncpus;              /**< entries in cpus; duplicates are fine */
  size_t stack_size;         /**< each worker's stack in bytes; 0 = the platform's
                                default (Linux: RLIMIT_STACK, usually 8 MiB).
                                Rounded up to whole pages, and to the platform's
                                PTHREAD_STACK_MIN if that is larger; below
                                TKO_MIN_STACK_SIZE is -EINVAL. Tasks run on it:
                                size it for the deepest task. */
  unsigned max_threads;      /**< most worker threads tko_pool_resize may ask for
                                (basic workers + max_elastic), fixed at create,
                                where a slot is set aside for each; 0 = the
                                larger of workers + max_elastic and 4 per CPU.
                                -EINVAL below workers + max_elastic or above
                                TKO_MAX_WORKERS + TKO_MAX_ELASTIC */
  unsigned recheck_us;       /**< the recheck period of the bounded-inversion
                                contract (tko_submit), in microseconds; 0 = 100.
                                A worker working through a batch it took looks
                                at the queue again before it starts a task
                                lighter than the heaviest weight ever
                                submitted, once this long has passed since its
                                take or its last look; if a heavier task is
                                queued it hands the rest of the batch back
                                (tko_stats.handbacks) and takes again */
  unsigned queues;           /**< weighted queues the pool spreads its tasks
                                over, each with its own lock, 1..TKO_MAX_QUEUES;
                                0 = one per basic worker. Each submitting
                                thread's tasks go to
                                one of them, each worker takes from its own
                                first; a worker takes from another queue when
                                that one holds a heavier task or its own is
                                empty. More queues let more cores submit and
                                take at once; the priority contract across
                                queues is the bounded-inversion one
                                (tko_submit). Cut to workers + max_elastic;
                                1 with aging_ms, and with one worker and no
                                elastic ones. Placement: the k-th thread
                                (from 0) to submit to the pool submits into
                                queue k mod queues (threads past the 64th,
                                and async tasks, into queue 0: a thread's
                                equal-weight async and plain tasks then keep
                                no order between them); basic worker
                                i's own queue is i mod queues, elastic
                                worker j's (workers + j) mod queues */
} tko_options;

/** Pool statistics: a snapshot, each counter read once, without a lock, so
 * the figures may lag each other but never report the impossible: running
 * is at most what was running at one instant during the call (never more
 * than the threads running tasks - workers, caller-runs submitters -
 * plus async tasks in flight and tasks nested in helping group waits),
 * queued at most what was queued at one instant (and at most
 * queue_capacity on a bounded pool), and completed + cancelled + queued +
 * running never exceeds submitted; elastic_retired never exceeds
 * elastic_spawned, nor elastic_workers their difference or elastic_peak.
 * submitted may read up to one low per keyed lane whose runner is being
 * handed to the pool at that instant (tko_submit_keyed), so with keyed
 * tasks one snapshot's submitted can be one below an earlier one's.
 * When the pool is quiet: submitted = completed + cancelled + queued +
 * running, exactly. */
typedef struct tko_stats {
  uint64_t submitted;        /**< tasks accepted */
  uint64_t completed;        /**< tasks that ran and returned (failed included) */
  uint64_t failed;           /**< of those, returned non-zero */
  uint64_t cancelled;        /**< queued tasks that will never run: handed to
                                on_cancel (shutdown, group cancel, refused
                                timers), or, for the runners of a lane table
                                (taskorch/lanes.h), whose tasks count there,
                                to that table's on_cancel. A lane table's
                                runners also count in submitted and completed */
  uint64_t queued;           /**< accepted, not yet started */
  uint64_t running;          /**< started, not yet returned */
  unsigned basic_workers;    /**< basic worker threads alive */
  unsigned elastic_workers;  /**< elastic worker threads alive */
  unsigned elastic_peak;     /**< most elastic workers alive at once */
  uint64_t elastic_spawned;  /**< elastic workers started, ever */
  uint64_t elastic_retired;  /**< elastic workers retired after idling, ever */
  unsigned blocking;         /**< workers inside tko_blocking_begin/end now */
  uint64_t caller_runs;      /**< tasks run on threads the pool does not own:
                                submitters (CALLER_RUNS, keyed tasks included),
                                the timer thread and the shutting-down thread
                                during a shutdown */
  uint64_t lock_contended;   /**< times a worker or full-inbox submitter waited
                                for the queue lock (a contention gauge) */
  unsigned async_inflight;   /**< async tasks started, not yet completed */
  uint64_t queue_bytes;      /**< memory the queue's item slabs hold: it grows
                                to the largest backlog (past 512 KiB, with the
                                default allocator, a huge-page mapping of its
                                own, not malloc'd) and shrinks back once the
                                pool stays idle, or on tko_pool_trim */
  uint64_t handbacks;        /**< batches a worker handed back to the queue at a
                                recheck (tko_options.recheck_us) because a
                                heavier task was queued */
  uint64_t late_inversions;  /**< late inversions (tko_submit's contract): starts
                                of a task on a worker while a heavier task
                                submitted more than recheck_us earlier was
                                still queued (not taken). Counted only in
                                pools that time their tasks (a before_run,
                                after_run or on_failure hook) and do not age;
                                0 in others. A lower bound, from hints: a
                                start compares each queue's heaviest queued
                                task and that weight's oldest submit, so a
                                heavier task not yet moved from its
                                submitter's ring, or not the oldest of the
                                heaviest weight queued, is not counted; a
                                start racing that task's take may be.
                                Counted causes: a paused pool's taken tasks;
                                a keyed lane's tasks, which a runner starts
                                whatever their weights (a keyed start first
                                moves the submitted tasks into the queue);
                                a worker descheduled between its look and
                                its start. Not counted: an async task held
                                back by max_async_inflight is not queued in
                                this sense (it cannot start), nor is a
                                keyed task waiting in its lane behind its
                                key's earlier tasks */
} tko_stats;

/** Options for a pool of `workers` threads (0 = CPU count), no elastic ones. */
TKO_API tko_options tko_basic_options(unsigned workers);
/** Options for `workers` basic threads (0 is allowed: elastic-only) plus up to
 * `max_elastic` elastic ones that retire after `elastic_idle_ms` idle. */
TKO_API tko_options tko_elastic_options(unsigned workers, unsigned max_elastic,
                                        unsigned elastic_idle_ms);

/** Creates a pool and starts its basic workers; a failed create leaves no
 * thread and leaks nothing.
 * @details -EINVAL: NULL, no workers at all, a value over
 * its TKO_MAX_*, or bad placement (cpus, stack_size); -ENOTSUP: cpus where
 * affinity is not supported; -ENOMEM; -EAGAIN: a thread could not be
 * started (a stack_size the system cannot give included). */
TKO_API int tko_pool_create(tko_pool **out, const tko_options *opts);

/** Queues fn(arg): higher weight starts first, equal weights of one
 * submitting thread are taken in submit order, and once this call has
 * returned no worker starts a lighter task more than recheck_us later while
 * this one is still queued (not taken). Safe from any thread, tasks and
 * hooks included.
 * @details Higher weight runs first over the whole int range.
 * Equal weights: one thread's tasks are taken in submit order, and a
 * worker starts the tasks it took in the order it took them; so with one
 * worker they start in submit order, and with more a task may start
 * before an earlier one of its thread that another worker took (a batch
 * of longer tasks, or a worker descheduled: milliseconds are possible;
 * max_batch 1 narrows it to the moment between a take and its start).
 * Tasks a worker hands back untouched (a recheck that found a heavier
 * task, a shrink that retires it) go back to their places in the queue
 * and are taken again, maybe by a worker that has meanwhile started later
 * tasks of their thread: that worker then starts them after those.
 * In a pool made
 * with one worker and no elastic ones, tasks of different threads
 * whose submits are ordered (one returned before the other began) also
 * start in that order; overlapping submits may go either way. With more
 * workers, each
 * submitting thread has its own submit ring, and equal-weight tasks of
 * different threads start in no promised order. A submitter stopped
 * inside its submit (preempted, in a debugger) delays only its own task:
 * it holds no lock. A ring never fills (it grows by segments of 1024); a
 * submit that finds 1024 of its thread's tasks not yet moved by the
 * workers first waits for them up to 1 ms, holding nothing (not on a
 * paused pool, nor in a task of the pool). The exception: without a ring
 * (one worker, or past 64 threads), a submit that finds the shared inbox
 * full moves it into the queue under the queue's lock, and stopped there
 * it holds every worker and submit that needs that lock. Safe from
 * any thread, tasks and hooks included. -EINVAL: NULL pool or fn;
 * -ESHUTDOWN: the pool is draining or cancelling (shutdown past its
 * CLOSING step, during which attached objects resolve their work and
 * submits are still accepted: see tko_pool_shutdown); -ENOMEM: the queue
 * could not grow.
 * A worker may take a few queued tasks at once (up to max_batch, fewer when
 * the queue is short or its tasks are long: about 20 us of work), so a task
 * submitted later with a higher weight can run after tasks that a worker had
 * already taken - and, with one queue (tko_options.queues 1), only those:
 * each take first moves every submitted task into the queue and takes the
 * heaviest (several queues: below). The inversion is bounded in
 * time: once this call has returned, no worker starts a lighter task more
 * than recheck_us (tko_options; 100 us by default) later while this one is
 * still in the queue, because a worker looks at the queue again before
 * such a start once recheck_us has passed since its take or its last look,
 * and hands the rest of its batch back if a heavier task waits
 * (tko_stats.handbacks counts those); so does a worker that helps inside
 * tko_group_wait. It reads the clock for that before the second task of a
 * batch, then about once per microsecond of work, judging by how long its
 * tasks since the last reading ran: so add to recheck_us the tasks a
 * worker starts between two readings - about a microsecond of them, or one
 * task when tasks run longer, plus the length of one that ran much longer
 * than those before it. In the queue means not yet taken: a task a worker has
 * taken waits only for the tasks that worker took before it, none of them
 * lighter, while other workers go on with lighter ones. Not bounded so: an
 * async task held back by max_async_inflight; a worker descheduled between
 * its look and its start (late by that long); a paused pool, where a
 * worker may still start what it took (tko_pool_pause); a queue that
 * could not grow while the allocator failed, whose worker takes from what
 * it moved, heavier tasks left in their submitters' rings starting once
 * there is room (nothing accepted waits for memory); and the tasks of
 * a keyed lane (tko_submit_keyed, taskorch/lanes.h), whose runner is one
 * task of the pool that runs up to max_drain of its lane's tasks whatever
 * their weights.
 * With several queues (tko_options.queues) a take moves only its own
 * queue's submissions and compares the other queues' heaviest tasks; a
 * worker moves every queue's submissions at a take once recheck_us has
 * passed since it last did (judged by its last clock reading, so add the
 * batch it ran last) and at every look: the bound above holds across
 * queues with that addition. */
TKO_API int tko_submit(tko_pool *pool, tko_task_fn fn, void *arg, int weight);

/** tko_submit that waits at most timeout_ms for room in a full bounded
 * TKO_FULL_BLOCK queue, then fails with -ETIMEDOUT.
 * @details Bounded queues (queue_capacity > 0): with TKO_FULL_BLOCK a
 * submit waits for room; tko_submit_timed waits at most timeout_ms (-1 =
 * no limit) and then fails with -ETIMEDOUT. With TKO_FULL_REJECT a full
 * queue gives -EAGAIN. With TKO_FULL_CALLER_RUNS the task runs at once on
 * the submitting thread (hooks see id 0 and worker UINT32_MAX) and the submit
 * returns 0.
 * A task of the pool never blocks on its own full queue, on a worker or
 * run on the thread that submitted it: it gets -EAGAIN.
 * A batch larger than queue_capacity can never be queued: -EAGAIN, or with
 * CALLER_RUNS it runs on the caller.
 * Shutdown wakes blocked submitters with -ESHUTDOWN. On an unbounded pool
 * tko_submit_timed is tko_submit. -EINVAL: timeout_ms below -1, or as
 * tko_submit. */
TKO_API int tko_submit_timed(tko_pool *pool, tko_task_fn fn, void *arg, int weight,
                             long timeout_ms);

/** Blocking hint, called from inside a task: the calling worker is about to
 * block (I/O, a lock, a sleep), so queued work gets an elastic worker at
 * once (within max_elastic).
 * @details If work is queued and no worker is idle, the
 * pool starts an elastic worker at once (within max_elastic) instead of
 * waiting for more backlog; it retires as usual when idle. Calls nest;
 * tko_blocking_end marks the end; stats.blocking counts workers, not calls.
 * A region belongs to the task that began it: a task that returns inside it
 * ends it then, and tko_blocking_end without a begin of the same task is
 * refused. -EPERM when not called from a pool's worker thread (or, for end,
 * without a matching begin); -ECHILD in a child forked from a worker. */
TKO_API int tko_blocking_begin(void);
/** Ends the blocking region begun by tko_blocking_begin (see there). */
TKO_API int tko_blocking_end(void);

/** One task for tko_submit_batch. */
typedef struct tko_task {
  tko_task_fn fn; /**< the task's function */
  void *arg;      /**< its argument */
  int weight;     /**< its weight */
} tko_task;

/** Queues n tasks at once: one reservation and one wake-up for the batch.
 * All or nothing: on error none is queued. Ids are consecutive, in array
 * order.
 * @details -EINVAL: NULL pool or tasks, a NULL fn, or n == 0; -ESHUTDOWN;
 * -ENOMEM; -EAGAIN: a bounded queue has no room for all n (reject policy). */
TKO_API int tko_submit_batch(tko_pool *pool, const tko_task *tasks, size_t n);

/** Task groups: wait for a set of tasks, or for one. A group is caller-owned
 * storage (stack or heap); tko_group_init it, submit members into it, wait,
 * then tko_group_destroy it once nothing is pending. The members pending at
 * once must all be in one pool (an empty group may be reused with another).
 * A group of one is the handle for a single task.
 * fork(): in a child, a group initialized before the fork is the
 * parent's (a parent thread may have held its mutex at the fork): no call
 * on it waits - tko_group_pending and tko_group_status read the copy,
 * tko_group_wait and tko_group_cancel return -ECHILD while members are
 * pending (0 otherwise), tko_group_submit returns -ECHILD, and
 * tko_group_destroy returns 0 and leaves the copy alone. Initialize new
 * groups in the child. */
typedef struct tko_group {
  TKO_ALIGNAS(16) unsigned char opaque[160]; /**< private */
} tko_group;

/** Makes a group ready for members. -ENOMEM when its mutex or condition
 * variable cannot be made. No other call on the group may race with it. */
TKO_API int tko_group_init(tko_group *group);
/** Frees a group's mutex and condition variable: -EBUSY (and nothing freed)
 * while members are still pending. No other call on the group may race with
 * it. */
TKO_API int tko_group_destroy(tko_group *group);
/** tko_submit, counted in group. -EINVAL also when group already has members
 * in another pool. */
TKO_API int tko_group_submit(tko_pool *pool, tko_group *group, tko_task_fn fn, void *arg,
                             int weight);
/** Blocks until every member has finished or been cancelled, or until
 * timeout_ms passes (-1 = no limit, 0 = just check): 0 or -ETIMEDOUT
 * (-EINVAL: NULL group or timeout_ms below -1). A pool task that waits, on a group of any pool, runs its own pool's queued
 * tasks meanwhile, by weight, the group's own members before other tasks
 * of their weight (newest first).
 * @details So waiting from inside a pool cannot deadlock it, two pools whose
 * tasks wait on each other's groups keep running, and a fork-join tree
 * (each task waits for the children it submitted) nests its waits only as
 * deep as the tree. The waiting worker starts no task once timeout_ms has
 * passed (0: none at all), though one it started may run past the
 * deadline. Such helping
 * waits nest (a task run by a waiting worker waits in turn) at most
 * TKO_MAX_HELP_DEPTH deep on one worker: deeper, the wait runs nothing and
 * returns -EDEADLK at once if members are pending (waiting without helping
 * could wait for a task queued behind this one; another level could
 * overflow the stack). -ECHILD in a forked child while members are pending
 * (they belong to the parent's pool). -EDEADLK at once when the calling
 * thread is itself a pending member: a member's task or one of its hooks,
 * or on_cancel for a member being cancelled (the wait could only end at
 * its deadline). Any number of threads may wait on one
 * group at once; each returns when the group is done or its own timeout
 * passes. */
TKO_API int tko_group_wait(tko_group *group, long timeout_ms);
/** Members submitted and not yet finished or cancelled. */
TKO_API uint64_t tko_group_pending(tko_group *group);
/** The first non-zero status a member returned (-ECANCELED for a cancelled
 * member), or 0 if all succeeded so far. Final once tko_group_wait is 0. */
TKO_API int tko_group_status(tko_group *group);
/** Cancels the members still queued, not those a worker has started or
 * taken, and returns how many it cancelled.
 * @details Each goes to the pool's on_cancel hook and counts as finished for
 * the group with status -ECANCELED. Returns how many were cancelled (>= 0)
 * or a negative errno (-ECHILD in a forked child while members are pending:
 * the queue is the parent's). */
TKO_API long tko_group_cancel(tko_group *group);

/** A task handle: caller-owned storage for one task, to cancel it, wait
 * for it and read its outcome, with nothing allocated and no init or
 * destroy call. tko_submit_handle fills it; it must then stay valid until
 * the task has finished or been cancelled (tko_handle_status no longer
 * -EINPROGRESS, or tko_handle_wait returned 0), and the library never
 * touches it after that.
 * @details A handle may be submitted again once its task has ended. Any
 * number of threads may wait on, cancel or read one handle at once, once
 * tko_submit_handle has returned. */
typedef struct tko_handle {
  TKO_ALIGNAS(8) unsigned char opaque[48]; /**< private */
} tko_handle;

/** tko_submit, with *handle filled for the task (no set-up needed
 * beforehand): the same errors, and on error the task never runs, no
 * callback runs for it and the handle is not armed.
 * @details The hooks see the task's fn, arg and id as for tko_submit. A
 * task that a full TKO_FULL_CALLER_RUNS queue runs on the caller has ended
 * when this returns, and its id is 0 (as its hooks see it). */
TKO_API int tko_submit_handle(tko_pool *pool, tko_handle *handle, tko_task_fn fn, void *arg,
                              int weight);
/** The task's id: the tko_task_info.id that the pool's hooks see for it (0
 * for a handle not armed). */
TKO_API uint64_t tko_handle_id(const tko_handle *handle);
/** Cancels the task if it has not started: 0 means it never runs, and the
 * pool's on_cancel hook sees it once, as any cancelled task (counted in
 * stats.cancelled; its status becomes -ECANCELED).
 * @details -EBUSY: it already started (it runs to its end) or finished;
 * -EALREADY: it was cancelled already; -EINVAL: a handle not armed;
 * -ECHILD in a forked child. A task still queued is cancelled on this
 * thread before this returns; one a worker had already taken with others
 * (not started) is cancelled by that worker when it reaches it, so its
 * on_cancel may run just after this returns, and its status stays
 * -EINPROGRESS until then. Cancel and the task's start cannot both
 * succeed: exactly one of "it ran" and "it reached on_cancel" happens. */
TKO_API int tko_handle_cancel(tko_handle *handle);
/** Blocks until the task has finished or been cancelled, or until
 * timeout_ms passes (-1 = no limit, 0 = just check): 0 or -ETIMEDOUT. A
 * worker of the task's pool that waits helps: it runs the task itself while
 * it is queued, and other queued tasks of the pool meanwhile, so a task may
 * wait for one it submitted, even on a one-worker pool.
 * @details Once this returns 0 the library no longer touches the handle:
 * the caller may free it. From such a worker, a task that worker took with
 * others and has not started is reached by running that batch on to it; a
 * task in another worker's batch is waited for while other queued tasks
 * run; while the pool is paused nothing is run. Such waits nest at most
 * TKO_MAX_HELP_DEPTH deep on one worker: deeper, -EDEADLK at once. A worker
 * of another pool waits without running anything. -EDEADLK at once
 * when the caller is the task itself (or a task nested in a wait inside
 * it) or on_cancel for it; -EINVAL: a handle not armed or timeout_ms below
 * -1; -ECHILD in a forked child while the task has not ended. */
TKO_API int tko_handle_wait(tko_handle *handle, long timeout_ms);
/** -EINPROGRESS while the task is queued or running (or being cancelled),
 * -ECANCELED once cancelled, else the value the task returned (-EINVAL: a
 * handle not armed). */
TKO_API int tko_handle_status(const tko_handle *handle);

/** Delayed and periodic tasks. A timer is caller-owned storage that must
 * stay valid while armed (until it fires, for a one-shot timer, or until
 * tko_timer_cancel returns). One deadline heap and one timer thread per pool
 * (started on first use) serve every timer; nothing is allocated per timer
 * beyond the heap's geometric growth (and a small record per periodic
 * timer, reused). When a timer is due its task is submitted with its weight
 * and runs like any other. A periodic timer has at most one firing queued
 * or running: while one is, its periods are skipped.
 * A firing the queue refuses (a full TKO_FULL_REJECT queue, no memory): a
 * one-shot timer's task goes to on_cancel once and the timer is disarmed
 * (tko_timer_cancel then returns -ENOENT); a periodic timer skips that
 * period, nothing goes to on_cancel, and it fires again at the next.
 * A firing on a full TKO_FULL_BLOCK queue waits for room on the timer
 * thread, and every timer of the pool waits with it (on a full
 * TKO_FULL_CALLER_RUNS queue the timer thread runs the task itself, and
 * the timers wait while it runs): so a small bounded queue filled with
 * async tasks that only a timer completes holds every timer until
 * shutdown.
 * A timer is a task from the moment it is armed: if it ends in on_cancel
 * without its task having been queued (refused, or armed at shutdown), it
 * counts in stats.submitted and stats.cancelled, and on_cancel gets an id
 * unique in the pool (such ids have the top bit set).
 * Shutdown closes the timers last: until the queue is drained or cancelled
 * and in-flight async tasks have completed, timers keep firing and a task
 * that comes due runs on the timer thread (it counts in stats.caller_runs),
 * since it may be what completes an async task shutdown waits for. Then
 * each timer still armed goes to on_cancel, exactly once: a periodic one
 * after its last run (if shutdown cancelled its queued firing, that was its
 * on_cancel, and the timer ended with it). Nothing of a timer runs after
 * its argument reached on_cancel.
 * -EINVAL: NULL argument, a negative delay, or a delay or period over
 * TKO_MAX_TIMER_MS (refused rather than wrapped: a longer one once fired at
 * once, or every millisecond); -EBUSY: the timer is armed;
 * -ESHUTDOWN; -ENOMEM; -EAGAIN: the timer thread could not start. */
typedef struct tko_timer {
  TKO_ALIGNAS(16) unsigned char opaque[64]; /**< private */
} tko_timer;

/** Makes a timer ready to arm (zero-filling it does the same). */
TKO_API void tko_timer_init(tko_timer *timer);
/** Submits fn(arg) with weight once delay_ms (>= 0) has passed; errors
 * above.
 * @details Arming is accepted during a pool's shutdown until it closes the
 * timers, its last step: while tko_submit already returns -ESHUTDOWN, a
 * timer armed now still counts, a task that comes due before the close
 * runs on the timer thread (stats.caller_runs), and one still armed then
 * goes to on_cancel. Arming after the close is -ESHUTDOWN. */
TKO_API int tko_submit_after(tko_pool *pool, tko_timer *timer, long delay_ms, tko_task_fn fn,
                             void *arg, int weight);
/** Submits fn every period_ms (> 0), first after one period, until
 * cancelled. Deadlines advance by whole periods from the first (no drift);
 * if the timer thread falls behind, missed deadlines are skipped, not
 * submitted in a burst. */
TKO_API int tko_submit_every(tko_pool *pool, tko_timer *timer, long period_ms, tko_task_fn fn,
                             void *arg, int weight);
/** Disarms a timer: 0 if it was armed (a one-shot task will not be
 * submitted; a periodic one stops), -ENOENT if it was not armed (already
 * fired, cancelled, or never armed).
 * @details Safe from any thread, tasks included, racing the pool's
 * shutdown or destroy (a destroy waits for a cancel that found the timer
 * armed), and after the pool is destroyed (shutdown disarms every timer). A
 * periodic timer may still run the one firing that was queued or running
 * when the cancel came: that firing is an ordinary task, which runs, or
 * goes to on_cancel if a TKO_CANCEL shutdown drops it; the timer itself
 * never goes to on_cancel after a successful cancel. */
TKO_API int tko_timer_cancel(tko_timer *timer);

/** Async (completion-based) tasks. fn starts some work and returns 0; the
 * task stays running until tko_async_complete(op, status) is called, from
 * any thread, exactly once. If fn returns non-zero, the task completes at
 * once with that status and fn must not complete op itself. In-flight async
 * tasks count as running for wait_idle, stats, groups and the after_run /
 * on_failure hooks (run_ns spans start to completion); max_async_inflight
 * bounds how many are in flight, the rest waiting queued by weight (an
 * async task run by TKO_FULL_CALLER_RUNS starts at once, past the limit).
 * An async task the pool cannot start for want of memory (the record it
 * keeps while in flight) goes to on_cancel instead, counted in
 * stats.cancelled (its group sees -ECANCELED).
 * Shutdown, in either mode, waits for in-flight async tasks to complete;
 * timers keep firing meanwhile (see the timers), so a timer's task that
 * completes an async task still runs. Anything else that would complete one
 * is the host's: another thread, or its on_cancel for a cancelled task. */
typedef struct tko_async tko_async; /**< an in-flight task, owned by the pool */
/** An async task's start: returns 0 and completes op later, or non-zero to
 * complete at once with that status. */
typedef int (*tko_async_fn)(tko_async *op, void *arg);

/** Queues an async task; errors as tko_submit. */
TKO_API int tko_submit_async(tko_pool *pool, tko_async_fn fn, void *arg, int weight);
/** An async member of a group. */
TKO_API int tko_group_submit_async(tko_pool *pool, tko_group *group, tko_async_fn fn, void *arg,
                                   int weight);
/** Completes op with status (0 = success). Call it exactly once per async
 * task, from any thread.
 * @details -EINVAL: NULL; -EALREADY: op is
 * not in flight (completed twice - op may then already belong to another
 * task, so that is a caller bug the pool catches only at best); -ECHILD in
 * a forked child (the task is the parent's pool's). */
TKO_API int tko_async_complete(tko_async *op, int status);
/** The arg the async task was submitted with. */
TKO_API void *tko_async_arg(const tko_async *op);

/** Blocks, without polling, until nothing is queued or running (in-flight
 * async tasks count as running), or until timeout_ms passes (-1 = no
 * limit, 0 = just check).
 * @details -ETIMEDOUT on timeout;
 * -EDEADLK when called from one of this pool's tasks; -EINVAL for NULL or
 * timeout_ms below -1. */
TKO_API int tko_pool_wait_idle(tko_pool *pool, long timeout_ms);

/** Stops the pool: TKO_DRAIN runs every queued task, TKO_CANCEL hands each
 * to on_cancel exactly once; either way it returns 0 once every running
 * task returned and every thread was joined. Idempotent.
 * @details Its lifecycle: RUNNING, then (at the first shutdown call)
 * CLOSING while attached objects resolve their work (lane tables and the
 * keyed lanes close), then DRAINING or CANCELLING: submits fail with -ESHUTDOWN,
 * submitters blocked on a full queue are woken with -ESHUTDOWN, TKO_DRAIN
 * runs every queued task and TKO_CANCEL hands each queued task to
 * on_cancel; then STOPPED once every running task returned - those on
 * workers, async tasks in flight, and caller-runs tasks on submitters'
 * threads - every submitter blocked in the pool left it, and every worker
 * was joined. tko_pool_shutdown waits for all that without limit and
 * returns 0. Idempotent: a later call, in either mode, returns 0 once the
 * pool is stopped; concurrent calls wait for the one that is working.
 * -EDEADLK, doing nothing, when called from one of this pool's tasks or
 * hooks; -EINVAL for NULL, a bad mode, or a destroyed pool. */
TKO_API int tko_pool_shutdown(tko_pool *pool, tko_shutdown_mode mode);

/** tko_pool_shutdown with a deadline: waits at most timeout_ms (-1 = no
 * limit, 0 = do not wait) and returns -ETIMEDOUT while something still runs;
 * the pool stays closed and a later call continues. -EINVAL: timeout_ms
 * below -1, or as tko_pool_shutdown.
 * @details Something still running means tasks, blocked submitters, or
 * attached objects draining. The shutdown
 * stays under way - the pool never reopens - and a later call (either
 * function, or destroy) continues from where it stopped; a TKO_CANCEL call
 * after a timed-out TKO_DRAIN cancels what is still queued. With
 * TKO_CANCEL_NOWAIT it closes the pool, cancels what is queued (on_cancel
 * runs on this thread) and returns 0 at once, whatever still runs (shutdown
 * calls take turns: while another thread's call is under way, this one
 * first waits for it, within timeout_ms, like any call - pass 0 to get
 * -ETIMEDOUT at once rather than wait; a submit racing with the call may
 * still be accepted and its task still queued when the call returns: that
 * task goes to on_cancel later, at the latest in tko_pool_destroy);
 * tko_pool_destroy then waits for the running tasks before it frees the
 * pool (bound that wait with another timed call first). No shutdown waits
 * forever for a task that can no longer complete unless the caller asked
 * for no limit. */
TKO_API int tko_pool_shutdown_timed(tko_pool *pool, tko_shutdown_mode mode, long timeout_ms);

/** Pauses the pool: no queued task starts until tko_pool_resume; running
 * tasks finish, and submits are still accepted.
 * @details A worker that had taken a few tasks just before the pause may
 * still start those. wait_idle
 * counts queued tasks, so on a paused pool with work queued it returns only
 * by timeout or after a resume. Shutdown resumes a paused pool first: DRAIN
 * runs what is queued, CANCEL cancels it; a pause that comes after shutdown
 * began holds the drain until a resume. Both calls are idempotent and may
 * be made from any thread, tasks included, racing with each other and with
 * submits: the pool ends paused or not as the last call to take effect
 * says. -EINVAL for NULL. */
TKO_API int tko_pool_pause(tko_pool *pool);
/** Resumes a paused pool (see tko_pool_pause). */
TKO_API int tko_pool_resume(tko_pool *pool);

/* fork(): a child process gets a copy of the pool without its threads. In
 * the child every call on such a pool returns -ECHILD, except
 * tko_pool_destroy, which returns 0 and leaves the copy alone (a parent
 * thread may have been mid-update at the fork, so its memory cannot be
 * freed safely). Create new pools in the child instead. */

/** Completes the pool's shutdown (TKO_DRAIN if none began), joins every
 * thread it started, then frees the pool.
 * @details Shuts down with TKO_DRAIN if not yet shut down (or completes a
 * shutdown under way, in its mode, without limit). Returns 0;
 * -EDEADLK (freeing nothing) when called from one of this pool's own
 * threads, tasks or hooks; -EBUSY when objects attached to the pool (a
 * tko_lanes or tko_coalescer created on it) still exist: the pool is then
 * shut down but not freed, and a call after destroying them frees it.
 * Handles carry a magic number that destroy clears: a second destroy, or
 * any call on a destroyed pool, returns -EINVAL (tko_pool_stats leaves *out
 * zeroed; with a NULL pool it does nothing) as long as the freed memory was not handed out again - a
 * best-effort catch of a host bug, not a licence. -EINVAL for NULL. */
TKO_API int tko_pool_destroy(tko_pool *pool);

/** Gives memory back after a burst: while nothing is queued, the queue's
 * item slab shrinks back to initial_capacity; the submitting threads'
 * rings free the segments a burst grew them by and the workers moved.
 * @details A slab that grew past 512 KiB with the default allocator is
 * unmapped. The pool also does this by
 * itself, once it has stayed idle for elastic_idle_ms (default 1 s) after
 * a burst: a worker that sleeps that long unwoken trims. With tasks queued
 * nothing can be given back and the call does nothing. stats.queue_bytes
 * shows the result. 0, -EINVAL, -ECHILD. */
TKO_API int tko_pool_trim(tko_pool *pool);

/** Resizes a running pool to basic_workers basic workers and max_elastic
 * elastic ones at most; growing starts the new workers before it returns,
 * and shrinking loses no task. Safe from any thread.
 * @details The sizes mean what create's options mean. The call is for hosts
 * that retune from their configuration at run time (GLib's
 * g_thread_pool_set_max_threads, Java's setCorePoolSize). Growing starts
 * the new basic workers before it returns (stats.basic_workers counts them
 * at once); a raised max_elastic lets elastic workers start under backlog,
 * at once if work waits now. Shrinking returns at once: each worker above
 * the new size retires as it finishes the task it is running - a sleeping
 * one at once - and the tasks it had taken and not started go back to the
 * queue where they were, so nothing is lost and they are taken again in
 * their order (another worker may have started later tasks of their
 * thread meanwhile: tko_submit); until then
 * stats may count more workers than asked (stats.elastic_workers above
 * max_elastic included), and each such worker starts at most one more
 * task. Its thread_stop hook runs, and a later grow or shutdown joins its
 * thread. Once the pool's shutdown has closed it, workers no longer retire
 * for a shrink: they drain (or cancel) together, so every task still runs
 * on a worker. Safe from any thread, concurrently with any call (another
 * resize: the last to take effect wins), tasks and hooks of the pool
 * included. 0; -EINVAL: NULL or destroyed pool, basic_workers and
 * max_elastic both 0, one above TKO_MAX_WORKERS / TKO_MAX_ELASTIC, or
 * their sum above tko_options.max_threads; -ESHUTDOWN once the pool's
 * shutdown has begun; -ECHILD in a forked child; -EAGAIN when a new thread
 * could not start (the others stay started and stats.basic_workers says
 * how many run: call again to retry). */
TKO_API int tko_pool_resize(tko_pool *pool, unsigned basic_workers, unsigned max_elastic);

/** Fills *out with a snapshot. Does nothing when either pointer is NULL. */
TKO_API void tko_pool_stats(tko_pool *pool, tko_stats *out);

/** A static, one-line description of a negative errno value (or 0). */
TKO_API const char *tko_strerror(int err);
/** The symbolic name of a negative errno value the API returns, for logs:
 * "EINVAL" for -EINVAL, "OK" for 0, "UNKNOWN" for any other value (positive
 * values included). A static string. */
TKO_API const char *tko_err_name(int err);

/** The library's version at run time, e.g. "0.1.0", and as TKO_VERSION_NUMBER. */
TKO_API const char *tko_version_string(void);
/** The library's version at run time as TKO_VERSION_NUMBER would give it. */
TKO_API unsigned tko_version_number(void);

#ifdef __cplusplus
}
#endif

/* Keyed serial lanes, the coalescer and the completion queue: their own
 * headers, always there. */
#include <taskorch/coalescer.h>
#include <taskorch/completion.h>
#include <taskorch/lanes.h>

#ifdef __cplusplus
extern "C" {
#endif
/** Queues fn(arg) on the pool's default lane table: tasks with the same key
 * run one at a time in submit order, different keys in parallel, and each
 * accepted task runs or reaches on_cancel exactly once.
 * @details The table is created on first use with
 * tko_lane_default_options. A worker never takes
 * two keys' runners at once, so a key whose runner waits is never held
 * behind another key by a worker's take; see taskorch/lanes.h for the table
 * and its collision rule.
 * A keyed task is a task of the pool like any other: before_run, after_run
 * and on_failure see its fn, arg and id (nonzero, unique in the pool, top
 * bit set), never the library's lane runner; stats count it in submitted,
 * queued (while it waits in its lane), running, completed, failed and
 * cancelled, and the runners not at all.
 * Weights: a lane competes with the pool's other tasks through its runner,
 * which carries the weight of the task at the lane's head and runs up to
 * max_drain of the lane's tasks whatever their weights (taskorch/lanes.h);
 * tko_submit's recheck bound applies to the runner, not to the tasks it
 * runs.
 * Bounded pools: a keyed task holds room in queue_capacity from its submit
 * until it starts, and the full policy applies before its lane is locked:
 * TKO_FULL_BLOCK waits for room (a task of the pool gets -EAGAIN),
 * TKO_FULL_REJECT fails with -EAGAIN, and TKO_FULL_CALLER_RUNS runs the
 * task at once on the submitting thread if its key's lane has nothing
 * queued or running - that task only: tasks others queue on the lane
 * meanwhile go to the pool - or else, since the lane's earlier tasks must
 * run first, waits for room as TKO_FULL_BLOCK does. (Keys that hash to one
 * lane share it, as taskorch/lanes.h explains: a key with nothing queued
 * can wait behind another key of its lane.)
 * Shutdown refuses keyed submits (-ESHUTDOWN) from the moment it begins
 * (its CLOSING step included), before the full policy applies: never
 * -EAGAIN or a wait for room then. DRAIN runs the queued keyed tasks (a
 * paused pool is resumed first); CANCEL hands each to the pool's on_cancel
 * with its id, once the pool refuses every submit (an on_cancel's submit
 * is -ESHUTDOWN), and counts it in stats.cancelled - a runner already
 * running starts none from then on, as a worker starts no task it had
 * taken; on_cancel counts as
 * the pool's own thread (its wait, shutdown or destroy of the pool is
 * -EDEADLK).
 * -EINVAL, -ESHUTDOWN, -EAGAIN, -ENOMEM. */
TKO_API int tko_submit_keyed(tko_pool *pool, uint64_t key, tko_task_fn fn, void *arg, int weight);
#ifdef __cplusplus
}
#endif
#endif /* TASKORCH_H */
