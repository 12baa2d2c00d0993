/* SPDX-License-Identifier: MIT */
/* The worker loop and a worker thread's life: take a few tasks, run them,
 * look for more, sleep (take.c takes, run.c runs); the blocking hint; a
 * thread's start, its end, and the replacement of one a task ended.
 *
 * A worker is in one of three states, as counted in idle.state (signal.c):
 * busy (running tasks it took), searching (awake, looking at the queue), or
 * sleeping (in the idle set). */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>

#include "engine.h"
#include "seam.h"
#include "wake.h"

/* ---- a task that ends its thread ------------------------------------
 *
 * pthread_exit from a task unwinds the worker's stack through the cleanup
 * handler tko__run_or_cancel (run.c) pushes around each task (glibc runs it during the
 * forced unwind; the innermost one acts, outer ones see `exiting`). The
 * handler puts the pool right before the thread goes:
 * the tasks the thread had started (the exiting one, and any that were
 * waiting in a helping group wait below it) count as finished with status
 * -ECANCELED, failed; the tasks it had taken and not started go back to
 * the queue; its blocking hint ends; the stop hook runs. A basic worker is
 * then replaced by a new thread on the same slot, which joins the old one
 * (if none can start, the pool has one worker fewer and says so in
 * stats.basic_workers); an elastic worker retires as if idle. A task
 * whose kind ran it (tko__task_kind.run) is its kind's to finish. Not
 * supported: pthread_exit from an async task's start function (its op
 * stays in flight) or from a caller-runs task; and leaving a task by
 * longjmp/siglongjmp in any way (the pool's frames are skipped: its
 * counts and locks are then wrong - taskorch.h). */

/* Starts a thread to take this basic worker's place; false if none could
 * start (then the slot is left to be staffed again by a grow). */
static bool replace_basic(tko_pool *pool, tko__worker *w) {
  w->predecessor = pthread_self();
  w->has_predecessor = true;
  tko__idle_search_begin(&pool->idle); /* the new thread starts searching */
  tko__thread_enter(pool);
  pthread_t t;
  if (tko__thread_create_placed(&t, tko__worker_main, w, &pool->place) == 0) return true; /* it records itself */
  w->has_predecessor = false; /* shutdown, or a grow, joins this thread (w->thread) */
  tko__thread_exit(pool);
  tko__idle_search_end(&pool->idle);
  tko__sub_seq(&pool->basic_alive, 1);
  return false;
}

static void retire_elastic(tko_pool *pool, tko__worker *w) {
  /* As tko__elastic_try_retire: the slot first (release: pairs with
   * claim_slot's acquire), then the count; the next spawn into the slot,
   * or shutdown, joins this thread. */
  tko__store_release(&w->slot_state, TKO__SLOT_RETIRING);
  tko__sub_seq(&pool->elastic_count, 1);
  tko__add_seq(&pool->elastic_retired, 1); /* seq_cst: see tko__elastic_started */
}

#ifdef TKO_TEST_SEAMS
void (*_Atomic tko__test_task_exited_window)(void);
#endif

void tko__task_exited(void *arg) {
  tko__worker *w = arg;
  if (w->exiting) return; /* an inner task's frame did it all */
  w->exiting = true;
  void (*seam)(void) = TKO__SEAM(tko__test_task_exited_window);
  if (seam) seam();
  tko_pool *pool = w->pool;
  const tko_hooks *h = &pool->opts.hooks;
  tko__finish_started(pool, w);
  tko__requeue_taken(pool, w);
  tko__witness_assert_none_held();
  if (h->thread_stop) h->thread_stop(h->user, w->index, w->kind);
  bool unstaffed = w->kind == TKO_WORKER_BASIC && !replace_basic(pool, w);
  if (w->kind != TKO_WORKER_BASIC) retire_elastic(pool, w);
  tko__notify_idle(pool);
  if (tko__runnable_seq(pool)) tko__signal_work(pool);
  /* A basic slot left without a thread is RETIRING, so that a grow
   * (tko_pool_resize) joins this thread and staffs it: marked last, when
   * nothing but the thread's exit is left for that join to wait for. */
  if (unstaffed) tko__resize_vacate(pool, w);
  tko__thread_exit(pool); /* this thread's own count: the last touch */
}

/* The clock reads a batch's rechecks make: the first before its second
 * task, then one per TKO__CLOCK_STRIDE_NS of work as the tasks since the
 * last read ran. Why not one per task: a flood of empty tasks of four
 * weights pays it on most tasks (`benchmarks/ab_probe.sh A B 30
 * probe_flood batch reused 1` shows it). */
static void clock_from_take(tko__worker *w, uint64_t now) {
  w->looked_ns = w->clocked_ns = now;
  w->unclocked = 0;
  w->clock_stride = 1;
}

int tko_blocking_begin(void) {
  tko__worker *w = tko__current_worker;
  if (!w) return -EPERM;
  tko_pool *pool = w->pool;
  if (tko__pool_forked(pool)) return -ECHILD; /* a copy of a worker, in a child */
  if (w->blocking_depth++ > 0) return 0; /* nested: already counted */
  tko__add_relaxed(&pool->blocking, 1);
  /* This worker stops taking work for a while: if work is waiting and
   * nobody is idle, wake or start another worker now. */
  if (tko__runnable_seq(pool)) tko__signal_work(pool);
  return 0;
}

int tko_blocking_end(void) {
  tko__worker *w = tko__current_worker;
  if (!w) return -EPERM;
  if (tko__pool_forked(w->pool)) return -ECHILD;
  unsigned base = w->task ? w->task->blocking_base : 0;
  if (w->blocking_depth <= base) return -EPERM; /* no begin of this task's */
  if (--w->blocking_depth == 0) tko__sub_relaxed(&w->pool->blocking, 1);
  return 0;
}

/* Sizes this worker's next take from how long its last batch of n tasks
 * ran: about TKO__BATCH_BUDGET_NS of work, within 1..max_batch. Why: a
 * take is a visit to the queue lock and the queue's lines, so short tasks
 * want big takes (up to 64 empty tasks per take rather than 16:
 * `probe_flood submit 4`, 4 producers and 2 workers, shows it); but a task
 * taken is out of the
 * queue, and a later task with a higher weight waits behind the rest of
 * the batch, so long tasks want small ones - this bounds that wait by time
 * rather than by count. A preempted batch looks slow and shrinks the next
 * take; the cap then doubles back, one batch at a time. */
static void size_next_take(tko_pool *pool, tko__worker *w, size_t n, uint64_t ns) {
  size_t max = pool->opts.max_batch, cap;
  uint64_t per_task = ns / n;
  /* Judge the take the cap would allow, not the one just made: n is often
   * smaller than the cap (a short queue), and 9 us tasks taken one at a
   * time must not let the cap double up to 64 x 9 us. */
  if (per_task * 2 * w->batch_cap <= TKO__BATCH_BUDGET_NS) cap = 2 * w->batch_cap;
  else cap = per_task ? TKO__BATCH_BUDGET_NS / per_task : max;
  w->batch_cap = cap < 1 ? 1 : cap > max ? max : cap;
}

/* Searching: yield the core a few times (on a machine with fewer cores than
 * threads, a pause loop would steal the producer's core) before sleeping.
 * The loads are hints; take_batch decides under the lock. */
static bool spin_for_work(tko_pool *pool) {
  for (unsigned i = 0; i < pool->opts.spin_yields; i++) {
    if (tko__has_work_hint(pool) && !tko__load_relaxed(&pool->paused)) return true;
    if (tko__load_relaxed(&pool->closing) && tko__nothing_left(pool)) return true;
    sched_yield();
  }
  return false;
}

enum sleep_result { WOKEN, RETIRE };

/* How a work loop ended: the pool closed, the worker retired (an elastic
 * one, idle or above a lowered max_elastic), or a basic worker left after a
 * shrink. */
enum loop_end { CLOSED, RETIRED, LEFT };

/* Sleeps until woken (counted as searching again) or, for an elastic
 * worker, until idle long enough to retire. */
static enum sleep_result worker_sleep(tko_pool *pool, tko__worker *w) {
  tko__idle_sleep_prepare(&pool->idle, &w->sleeper);
  /* Step (2) of signal.c's essay: seq_cst, after sleep_prepare's RMW; pairs
   * with a submit's reservation CAS (inbox.h). closing is stored seq_cst
   * before shutdown wakes every sleeper. */
  /* A shrink stores its target seq_cst before it wakes every sleeper: a
   * sleeper it missed set its bit after that wake's claim, and reads the
   * new target here (resize.c, signal.c). */
  enum tko__look look = tko__look_seq(pool);
  if (look == TKO__LOOK_WORK || (tko__load_seq(&pool->closing) && tko__nothing_left(pool)) ||
      tko__resize_hint_seq(pool, w)) {
    tko__idle_sleep_cancel(&pool->idle, &w->sleeper); /* searching either way */
    return WOKEN;
  }
  /* Decay: after a burst, a worker that then sleeps elastic_idle_ms
   * without being woken gives the queue's slab back if the pool stayed
   * idle meanwhile: no task was submitted (jemalloc's decay,
   * Go's scavenger; tko_pool_trim does it on demand). This worker's sleep
   * alone says nothing: another worker may have run burst after burst
   * while it slept, and a trim between two bursts makes the next one grow
   * the slab again (pool/steady_state_allocates_nothing_per_task saw it on
   * a loaded machine). Only then does a basic worker sleep with a timeout. */
  bool trim = tko__pool_trimmable(pool);
  uint64_t submitted = trim ? tko__submitted(pool) : 0;
  uint64_t timeout = w->kind == TKO_WORKER_ELASTIC || trim
                         ? (uint64_t)pool->opts.elastic_idle_ms * 1000000u
                         : UINT64_MAX;
  /* Beside a hole: its publish may not wake this worker (inbox.h), so it
   * looks again a moment later; a stopped submitter then costs a look a
   * millisecond, not a spin. */
  unsigned poll_ms = 0;
  if (look == TKO__LOOK_HOLE) {
    poll_ms = w->hole_poll_ms ? 2 * w->hole_poll_ms : TKO__HOLE_POLL_MS;
    if (poll_ms > TKO__HOLE_POLL_MAX_MS) poll_ms = TKO__HOLE_POLL_MAX_MS;
    timeout = poll_ms * 1000000ull;
  }
  w->hole_poll_ms = poll_ms;
  if (tko__idle_sleep(&pool->idle, &w->sleeper, timeout)) {
    w->hole_poll_ms = 0; /* woken by a submit: the next hole starts afresh */
    return WOKEN;
  }
  if (!tko__idle_sleep_cancel(&pool->idle, &w->sleeper)) { /* a waker claimed us */
    w->hole_poll_ms = 0;
    return WOKEN;
  }
  if (look == TKO__LOOK_HOLE) return WOKEN;
  /* searching meanwhile: a submit counts on it */
  if (trim && tko__submitted(pool) == submitted) tko__pool_trim(pool);
  if (w->kind != TKO_WORKER_ELASTIC) return WOKEN;
  return tko__elastic_try_retire(pool, w) ? RETIRE : WOKEN;
}

/* The end of a work loop for a worker that a shrink retired. */
static enum loop_end left(const tko__worker *w) {
  return w->kind == TKO_WORKER_BASIC ? LEFT : RETIRED;
}

/* Takes and runs work until the pool closes or the worker retires. */
static enum loop_end work_loop(tko_pool *pool, tko__worker *w) {
  bool searching = true; /* the spawner (or a resurrection) counted it searching */
  enum loop_end end = CLOSED;
  w->batch_cap = pool->opts.max_batch < TKO__BATCH_START ? pool->opts.max_batch : TKO__BATCH_START;
  tko__item batch[TKO__GRAB_MAX];
  for (;;) {
    if (tko__resize_hint(pool, w) && tko__resize_retire(pool, w)) {
      end = left(w);
      break;
    }
    size_t cap = w->batch_cap;
    tko__shard *from;
    size_t n = tko__take_batch(pool, w, batch, cap, &from, false);
    if (n) {
      /* The last searcher to find work wakes (or spawns) the next worker if
       * work remains, so parallelism ramps up one worker at a time. */
      if (searching) {
        searching = false;
        if (tko__idle_search_end(&pool->idle) && tko__runnable_seq(pool))
          tko__signal_work(pool);
      }
      /* Two clock reads a take, skipped where the cap
       * cannot move and a batch holds one task (max_batch 1: the
       * C-Thread-Pool layer's job per take). The first is also the time of
       * the recheck's first look: the take's drain, a moment before. */
      if (pool->opts.max_batch > 1) {
        uint64_t t0 = tko__now_ns();
        clock_from_take(w, t0);
        enum tko__batch_end how = tko__run_batch(pool, w, batch, n, from, true);
        if (how == TKO__RETIRED_MIDWAY) {
          end = left(w);
          break;
        }
        /* A batch cut short says little about its tasks' length (and its
         * recheck read the clock). The reading is the next take's time
         * too (pick_for_take): after a long task, the time of the take
         * before it would skip the look at the other shards that a heavy
         * task submitted meanwhile is waiting for (test
         * queues/a_take_after_a_long_task_looks_at_every_queue). */
        if (how == TKO__RAN_ALL) {
          uint64_t t1 = tko__now_ns();
          size_next_take(pool, w, n, t1 - t0);
          w->clocked_ns = t1;
        }
      } else {
        tko__run_batch(pool, w, batch, n, from, true); /* one task: it never stops early */
      }
      /* A small take means this worker is right behind the submitters:
       * polling again at once would pull the inbox's lines away from the
       * producer every few tasks (its next CAS then waits for them). Yield
       * once instead, so that tasks pile up a little and the next take
       * gets a batch (bench_peers' 1-producer, 2-worker empty-task row on 2
       * cores shows it); a worker alone on its core is back at once.
       * It yields as a searcher, so a submit meanwhile counts on it rather
       * than waking or spawning another worker. A take as large as
       * the cap allows is not small: with max_batch 1 (the C-Thread-Pool
       * layer) a yield per task would multiply the cost of a job
       * (bench_thpool_compat shows it). */
      if (n < TKO__SMALL_TAKE && n < cap) {
        searching = true;
        tko__idle_search_begin(&pool->idle);
        sched_yield();
      }
      continue;
    }
    /* Exit once closed and nothing is left; a reservation made just before
     * the close is still pending in the inbox and is taken first. Acquire:
     * pairs with close_pool's seq_cst store of closing (lifecycle.c), made
     * after it closed the inbox and every ring, which this worker then
     * finds closed. */
    if (tko__load_acquire(&pool->closing) && tko__nothing_left(pool)) break;
    tko__notify_idle(pool);
    if (!searching) {
      searching = true;
      tko__idle_search_begin(&pool->idle);
    }
    if (spin_for_work(pool)) continue;
    if (worker_sleep(pool, w) == RETIRE) {
      searching = false; /* try_retire ended the search */
      end = RETIRED;
      break;
    }
  }
  /* A worker that retires while searching may be what a submit counted on
   * (it skipped its wake-up): as the last searcher it re-reads for work,
   * seq_cst after its seq_cst RMW, and passes it on (signal.c's Dekker
   * pair). A closed pool's leftovers are shutdown's. */
  if (searching && tko__idle_search_end(&pool->idle) && end != CLOSED && tko__runnable_seq(pool))
    tko__signal_work(pool);
  return end;
}

void *tko__worker_main(void *arg) {
  tko__worker *w = arg;
  tko_pool *pool = w->pool;
  const tko_hooks *h = &pool->opts.hooks;
  tko__current_pool = pool;
  tko__current_worker = w;
  if (w->has_predecessor) { /* the slot's previous thread: a task ended it, or it retired */
    pthread_join(w->predecessor, NULL);
    w->has_predecessor = false;
    /* A basic replacement records itself, before its thread_exit, which
     * shutdown waits for; an elastic spawner records the new thread. */
    if (w->kind == TKO_WORKER_BASIC) w->thread = pthread_self();
  }
  w->exiting = false; /* a previous thread of this slot is joined: ours now */
  char name[32];
  snprintf(name, sizeof name, "%s-%c%u", pool->name,
           w->kind == TKO_WORKER_BASIC ? 'b' : 'e', w->index);
  tko__thread_set_name(name);
  /* A new thread copies its creator's nice value whatever the attributes
   * say, and an elastic worker's creator is whichever thread submitted:
   * take the pool creator's value instead (best effort: going back up to a
   * higher priority needs CAP_SYS_NICE). */
  tko__thread_set_nice(pool->creator_nice);
  if (w->kind == TKO_WORKER_ELASTIC) tko__elastic_started(pool);
  tko__witness_assert_none_held();
  if (h->thread_start) h->thread_start(h->user, w->index, w->kind);
  enum loop_end end;
restart:
  end = work_loop(pool, w);
  if (end == CLOSED) {
    /* seq_cst, before the count falls: a spawner whose reservation sees
     * the lower count then sees the flag (tko__elastic_spawn). */
    tko__store_seq(&pool->drained, true);
    if (w->kind == TKO_WORKER_BASIC) tko__sub_seq(&pool->basic_alive, 1);
    else tko__sub_seq(&pool->elastic_count, 1);
  }
  tko__notify_idle(pool);
  bool retired = end == RETIRED;
  bool stop_hook_spawns = retired && h->thread_stop; /* it may submit, and so spawn */
  if (stop_hook_spawns) tko__elastic_set_stopping(pool, w, true);
  tko__witness_assert_none_held();
  if (h->thread_stop) h->thread_stop(h->user, w->index, w->kind);
  if (stop_hook_spawns) tko__elastic_set_stopping(pool, w, false);
  /* Start over when the stop hook left work no one else may pick up
   * (elastic), or a grow handed this basic slot back meanwhile. */
  if ((stop_hook_spawns && tko__elastic_resurrect(pool, w)) ||
      (end == LEFT && tko__resize_left(pool, w))) {
    tko__witness_assert_none_held();
    if (h->thread_start) h->thread_start(h->user, w->index, w->kind);
    tko__idle_search_begin(&pool->idle);
    goto restart;
  }
  tko__thread_exit(pool); /* the last touch of the pool: shutdown may now join */
  return NULL;
}

int tko__worker_spawn(tko_pool *pool, tko__worker *w, pthread_t *t) {
  tko__idle_search_begin(&pool->idle); /* the new worker starts searching */
  tko__thread_enter(pool);
  int rc = tko__thread_create_placed(t, tko__worker_main, w, &pool->place);
  if (rc == 0) return 0;
  tko__thread_exit(pool);
  /* The worker that will not come was counted as searching, and a submit
   * meanwhile may have skipped its wake-up on that account: stop counting
   * it and, if it was the last searcher and work waits, wake a sleeper in
   * its place (signal.c: "A spawn that fails"). Only a wake, never another
   * spawn: creation may keep failing. */
  if (tko__idle_search_end(&pool->idle) && tko__runnable_seq(pool))
    tko__idle_wake_one(&pool->idle);
  return rc;
}

int tko__thread_start(tko_pool *pool, tko__worker *w) {
  pthread_t t;
  int rc = tko__thread_create_placed(&t, tko__worker_main, w, &pool->place);
  if (rc) return rc;
  w->thread = t;
  w->has_thread = true;
  return 0;
}
