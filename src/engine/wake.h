/* SPDX-License-Identifier: MIT */
/* The wake path's inlines: how a queue's backlog is stored and published,
 * what a worker about to sleep (or one deciding whether to wake another)
 * finds, and tko__signal_work, which wakes a helper, a sleeper or an
 * elastic spawn after new work is queued (signal.c's essay). */
#ifndef TKO_WAKE_H
#define TKO_WAKE_H

#include "engine.h"

/* Refreshes sh's backlog (and, for shard 0, held_waiting) and top;
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
  /* The queue whose best task is the shard's top: shard 0's held queue
   * when its source may start one and it holds a heavier task (else a
   * heavy held task would wait for every other shard's lighter tasks,
   * their tops beating shard 0's empty queue). */
  const tko__queue *best = &sh->queue;
  /* The held queue's part is out of line (lifecycle.c), so that this stays
   * small: a pool with no held task pays two loads for it. */
  if (sh->index == 0 && (pool->held.len || tko__load_relaxed(&pool->held_waiting))) {
    const tko__queue *held = tko__held_refresh(pool);
    if (held) {
      work = 1;
      if (tko__queue_top_weight(held) > tko__queue_top_weight(&sh->queue)) best = held;
    }
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

/* Shutdown may let workers go: nothing queued anywhere, held tasks included. */
static inline bool tko__nothing_left(tko_pool *pool) {
  /* Holes count: a reservation made before the close and not yet
   * published is still to come (inbox.h). */
  return !tko__has_work_seq(pool) && tko__load_seq(&pool->held_waiting) == 0;
}

/* Called after new work is queued: wakes the workers waiting in a helping
 * group wait, if any; then, unless a worker is searching, wakes a sleeper,
 * or, if none sleeps, starts an elastic worker where the pool may have
 * them. */
static inline void tko__signal_work(tko_pool *pool) {
  /* seq_cst, after the work was published: pairs with the helper's
   * increment of helpers before its re-check (help.c: tko__helper_sleep). */
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
