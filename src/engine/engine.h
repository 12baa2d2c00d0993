/* SPDX-License-Identifier: MIT */
/* The engine's prototypes, file by file, and the small inlines that go
 * with them (the entry check, the calling thread's pool, resize hints,
 * the submitted count): what the engine's files and its features call.
 * The layout they work on is pool.h's, task kinds are kind.h's, the wake
 * path is wake.h's. */
#ifndef TKO_ENGINE_H
#define TKO_ENGINE_H

#include "kind.h"
#include "pool.h"

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

/* shard.c: moves what was submitted to shard sh (its rings; for shard 0
 * the inbox too) into its queues and refreshes its backlog; caller holds
 * sh's lock. */
int tko__shard_drain_locked(tko_pool *pool, tko__shard *sh);
/* The same, taking the copies of a stage made before the lock where they
 * are current (ring.h: the stage); st may be NULL. */
int tko__shard_drain_staged(tko_pool *pool, tko__shard *sh, const tko__ring_stage *st);
/* Fills w's stage from sh's rings without sh's lock, for the drain that
 * follows, and returns it; NULL (nothing staged) for a NULL w, the caller
 * slot (threads share it), no submissions waiting, or a trim running
 * (pool.c waits for w's stage to end before it frees segments). */
const tko__ring_stage *tko__shard_stage(tko_pool *pool, tko__worker *w, const tko__shard *sh);
/* Whether shard sh may hold work: queued, or submitted to it and not yet
 * drained (relaxed loads: a hint; the take decides under its lock). */
bool tko__shard_work_hint(tko_pool *pool, const tko__shard *sh);
/* Drains every shard but except (NULL: every one) whose submissions wait,
 * each under its own lock, one at a time; staged for w (may be NULL). */
void tko__shards_sweep(tko_pool *pool, tko__worker *w, const tko__shard *except);
/* The shard w's take tries first: the one with the heaviest top, w's home
 * on a tie (a hint, read lock-free). */
tko__shard *tko__shard_pick(tko_pool *pool, const tko__worker *w);
/* Whether some shard's top is heavier than weight. */
bool tko__shards_outrank(tko_pool *pool, int weight);
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
/* The shutdown's wake of the submitters waiting for room, after it stored
 * closing (lifecycle.c). */
void tko__admit_close(tko_pool *pool);
/* Test seams (admit.c's essay): tko__test_settle_window is called inside a
 * settle, between marking a worker's give-backs settled and subtracting
 * them (tests/unit/test_admit.c); tko__test_admit_window at each point
 * below (tests/stress/test_stalled_admission.c). NULL outside tests. */
enum tko__admit_point {
  TKO__ADMIT_LEASED,      /* a lease's CAS done, its credits not yet added */
  TKO__ADMIT_TAKING_BACK, /* a ring's credits taken, not yet subtracted */
  TKO__ADMIT_ASLEEP,      /* a waiter counted and looked, about to sleep */
};
#ifdef TKO_TEST_SEAMS
/* lifecycle.c: a closer between the state's change and the rest of its
 * close; a thread about to enter the gate (tko__gate_enter), after any
 * look at the state its caller made. */
extern void (*_Atomic tko__test_close_window)(tko_pool *pool);
extern void (*_Atomic tko__test_gate_window)(tko_pool *pool);
extern void (*_Atomic tko__test_settle_window)(void);
extern void (*_Atomic tko__test_admit_window)(enum tko__admit_point at);
/* shard.c: a worker's stage, its flag set and the trims checked, before it
 * reads a segment; pool.c: a trim that found a worker's stage running and
 * waits for it (tests/unit/test_ring_stage.c). */
extern void (*_Atomic tko__test_stage_window)(void);
extern void (*_Atomic tko__test_trim_waits)(void);
/* worker.c: a worker whose task ended its thread, after the task's own
 * cleanup and before the worker's (tests/unit/test_task_exit.c). */
extern void (*_Atomic tko__test_task_exited_window)(void);
#endif
/* Takes room for k tasks by the given full policy (keyed.c): TKO__ADMITTED,
 * TKO__RUN_HERE (caller-runs: no room taken, never gated) or a negative
 * errno. *gated: the caller waited inside the gate and calls
 * tko__gate_leave once done with the pool, whatever this returned. */
enum { TKO__ADMITTED = 0, TKO__RUN_HERE = 1 };
int tko__admit(tko_pool *pool, size_t k, long timeout_ms, tko_full_policy policy, bool *gated);
/* A test seam (tests/stress/test_stalled_submit.c): called where a submit
 * finds a segment's worth in its ring, before it waits for room (submit.c:
 * wait_for_room). NULL outside tests. */
#ifdef TKO_TEST_SEAMS
extern void (*_Atomic tko__test_full_ring_window)(tko_pool *pool);
#endif
/* The submit time to stamp on a task: only when the pool measures times
 * or ages tasks. */
uint64_t tko__enqueue_time(tko_pool *pool);
/* Tasks ever accepted: inbox reservations, ring publishes, tasks run by
 * callers and side tasks. seq_cst loads, read after the finished and
 * cancelled counts (pool.c: pool_is_idle): a task counted there was
 * counted here first (submit.c: run_on_caller's add; tko__side_task's). */
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

/* run.c */
/* Bumps one of w's counters: a plain store for the owning worker, an RMW
 * for the shared caller slot. */
void tko__count(tko_pool *pool, tko__worker *w, atomic_uint_fast64_t *c);
/* Owner-only counter bump: only this worker writes the slot, so no RMW is
 * needed. The store is a release (a plain store on x86): a waiter whose
 * load reads it - wait_idle, a stats reader - then also sees everything the
 * task wrote. The seq_cst publish at the end of each batch is what makes
 * wait_idle's wake-up race-free (see tko__run_batch). */
static inline void tko__count_own(atomic_uint_fast64_t *c) {
  tko__store_release(c, tko__load_relaxed(c) + 1);
}
/* Publishes the finished count seq_cst: one half of wait_idle's Dekker
 * pair (see tko__notify_idle). */
static inline void tko__publish_finished(tko__worker *w) {
  tko__store_seq(&w->finished, tko__load_relaxed(&w->finished));
}
/* Runs one task with hooks and counting, on the calling thread. */
int tko__run_item(tko_pool *pool, tko__worker *w, const tko__item *item);
/* The tasks this thread runs in a pool's caller slot off that pool's
 * workers (a caller-runs task, a closed pool's timer task, an async task's
 * hooks in its completion), innermost first, in frames on its stack. */
extern _Thread_local tko__task_frame *tko__off_worker_task;
/* Whether this thread is inside the task or hooks of an item is(item,
 * what) accepts: in its on_cancel, running it on a worker (a task nested
 * in a helping wait below it included), or off the workers. A wait on what
 * such a task is part of could only end at its deadline: -EDEADLK. */
bool tko__thread_runs(bool (*is)(const tko__item *item, const void *what), const void *what);
/* Starts one task worker w took, or cancels it once TKO_CANCEL began. */
void tko__run_or_cancel(tko_pool *pool, tko__worker *w, const tko__item *item);
/* Counts the tasks w had started as finished (status -ECANCELED, failed)
 * and ends its blocking hint: its thread is ending (worker.c). */
void tko__finish_started(tko_pool *pool, tko__worker *w);
void tko__cancel_item(tko_pool *pool, const tko__item *item);
void tko__notify_idle(tko_pool *pool);

/* take.c */
/* Takes up to max tasks for worker w; *from: the shard they came from. */
size_t tko__take_batch(tko_pool *pool, tko__worker *w, tko__item *batch, size_t max,
                       tko__shard **from, bool helping);
/* How tko__run_batch ended. */
enum tko__batch_end { TKO__RAN_ALL, TKO__HANDED_BACK, TKO__RETIRED_MIDWAY };
/* Runs a batch worker w took from shard from (top: taken by the work
 * loop itself, no task of this thread below it). */
enum tko__batch_end tko__run_batch(tko_pool *pool, tko__worker *w, const tko__item *batch,
                                   size_t n, tko__shard *from, bool top);
/* Puts the tasks w took and has not started back in the queue; one the
 * queue cannot take back (no memory) is cancelled. */
void tko__requeue_taken(tko_pool *pool, tko__worker *w);
/* Takes up to max queued tasks whose ctx is ctx (or ctx | TKO__CTX_HELD in
 * the held queue) out of the pool, wherever they are queued, their room
 * given back; returns how many (0: none left). O(queued). */
size_t tko__take_queued(tko_pool *pool, uintptr_t ctx, tko__item *out, size_t max);
/* Takes the queued task whose ctx is ctx (not a held one) out of the
 * queue and runs it on worker w, the calling thread, wherever its weight
 * places it (a wait on that one task: tko_handle_wait); false if it is not
 * queued or the pool is paused. O(queued). */
bool tko__run_queued(tko_pool *pool, tko__worker *w, uintptr_t ctx);
/* Whether worker w took a task whose ctx is ctx and has not started it
 * (it is in one of w's batches). */
bool tko__holds_taken(const tko__worker *w, uintptr_t ctx);
/* Takes the newest queued task whose ctx is ctx (a member of the group a
 * helping wait waits for) and runs it on worker w; false if none is queued
 * or the pool is paused. */
bool tko__help_member(tko_pool *pool, tko__worker *w, uintptr_t ctx);
/* Takes one queued task and runs it on worker w (a helping group wait);
 * false if none could be taken. */
bool tko__help_one(tko_pool *pool, tko__worker *w);

/* worker.c */
void *tko__worker_main(void *arg);
int tko__thread_start(tko_pool *pool, tko__worker *w);
/* The cleanup handler around each task a worker runs: a task that ends
 * its thread (pthread_exit) unwinds through it (arg: the worker). */
void tko__task_exited(void *arg);

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

/* True in a child process forked after the pool was created: its threads
 * do not exist there, so every call refuses with -ECHILD. */
static inline bool tko__pool_forked(const tko_pool *pool) {
  return pool->fork_gen != tko__fork_generation();
}

/* The entry check of the pool's calls: -EINVAL for NULL or a pool that is
 * not (or no longer) a live pool, -ECHILD in a forked child, else 0. It
 * reads two words of the read-mostly part of the pool, no shared line. */
static inline int tko__pool_check(const tko_pool *pool) {
  if (!pool || pool->magic != TKO__POOL_MAGIC) return -EINVAL;
  return tko__pool_forked(pool) ? -ECHILD : 0;
}

/* Whether the pool refuses submits (-ESHUTDOWN): closed, DRAINING or later.
 * The state is the first of the close's marks (lifecycle.c: close_pool sets
 * it, then the gate's bit, the rings' and the inbox's, then closing), and
 * every submit looks at it before it can be accepted, refused for want of
 * room or run on its caller (enqueue, tko__admit). So once a thread saw
 * -ESHUTDOWN, from any of those marks, every later submit of it, or of a
 * thread it told, is -ESHUTDOWN too: the pool never seems to reopen.
 * Relaxed: a thread that saw the state sees it again (coherence); one that
 * saw a later mark acquired it, and with it the state's store. */
static inline bool tko__pool_refusing(const tko_pool *pool) {
  return tko__load_relaxed(&pool->state) >= TKO__DRAINING;
}

/* Whether a CANCEL changed the state (the first of its marks). Relaxed, as
 * tko__pool_refusing. */
static inline bool tko__pool_cancel_began(const tko_pool *pool) {
  return tko__load_relaxed(&pool->state) == TKO__CANCELLING;
}

/* Whether the pool's shutdown has begun (CLOSING or later), for the calls
 * that refuse from its first step: keyed submits, before they ask for room.
 * Relaxed, as tko__pool_refusing. */
static inline bool tko__pool_shutting_down(const tko_pool *pool) {
  return tko__load_relaxed(&pool->state) != TKO__RUNNING;
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

#endif
