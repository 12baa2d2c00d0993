/* SPDX-License-Identifier: MIT */
/* Task kinds, the interface features use to follow their own tasks
 * through the engine: the tags of tko__item.ctx, tko__task_kind and the
 * accessors that read an item's kind and group, and the group's entry
 * points for its async members. Owned tasks (lifecycle.h's extension
 * interface) are tasks of the two owner kinds (lifecycle.c); attachments
 * and phases are lifecycle.h's too. */
#ifndef TKO_KIND_H
#define TKO_KIND_H

#include "pool.h"

/* Tags in the low bits of tko__item.ctx (TKO__CTX_TAGS, queue.h). */
#define TKO__CTX_GROUP ((uintptr_t)1)
/* A task of the held source (below): it waits in the held queue, and
 * starts only while the source allows one more; its record is its group or
 * its feature's own (TKO__CTX_KIND). */
#define TKO__CTX_HELD ((uintptr_t)2)
/* A task of a kind (below): its record starts with its tko__task_kind. */
#define TKO__CTX_KIND ((uintptr_t)4)
/* A task of a kind that a worker takes alone (the queue's alone_tag): an
 * owned task (lifecycle.h), whose record, its tko__task_owner, starts with
 * its kind as a TKO__CTX_KIND record does. */
#define TKO__CTX_ALONE (TKO__CTX_GROUP | TKO__CTX_KIND)

/* Task kinds: what a feature that follows its own tasks (a group's member,
 * an async task, a periodic timer's firing, a task handle, an owned task:
 * a lane's runner, a keyed runner, a coalescer's sweep) registers with the
 * engine, which knows such a task only by this record, reached through
 * the record the item's ctx points to (tagged TKO__CTX_GROUP, TKO__CTX_KIND
 * or TKO__CTX_ALONE: tko__item_kind). A plain task (ctx 0) has no kind and
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
 *   ended its thread: run.c, tko__finish_started), after the after_run and on_failure hooks;
 * - cancelled: the task will never run, after the on_cancel hook saw it;
 * - dropped (NULL: nothing): a worker took the task from its queue and
 *   will not start it (TKO_CANCEL began), just before the engine cancels
 *   it (cancelled follows): what the take gave it goes back (an async
 *   task's in-flight slot);
 * - own_cancel: the pool's on_cancel hook never sees a cancelled task of
 *   the kind, whose argument only the kind knows (a lane's runner hands
 *   its queued tasks to the lanes' on_cancel): cancelled alone hears of it;
 * - internal: the task is the library's own, not a host task (the keyed
 *   table's runner, whose keyed tasks are the host's): it takes no room in
 *   a bounded queue (only a TKO__CTX_ALONE task may be internal, so that
 *   the room test reads no record for another), runs with no hooks, no
 *   start, done nor task counters, counted only in runners_out and
 *   runners_done, and its cancel counts no task either (cancelled, with
 *   own_cancel, still hears of it).
 * Exactly one of done and cancelled is called, once (with run, only
 * cancelled, and only for a task that never reached run, or that run gave
 * back to the engine to cancel; with internal, only cancelled, for a task
 * that never ran). After it the engine touches neither the
 * item's record nor the kind, so done and cancelled may be the last touch
 * of a record its owner frees at once. */
typedef struct tko__task_kind {
  int (*run)(tko_pool *pool, tko__worker *w, const tko__item *item);
  bool (*start)(const tko__item *item);
  void (*done)(const tko__item *item, int status);
  void (*cancelled)(const tko__item *item);
  void (*dropped)(tko_pool *pool, const tko__item *item);
  bool own_cancel;
  bool internal;
} tko__task_kind;

/* The held source: a feature whose tasks (TKO__CTX_HELD, an async task)
 * wait in the pool's held queue, shard 0's, and start only while it allows
 * one more (async.c: fewer than max_async_inflight in flight). It registers
 * with the pool (tko__source_add) before it queues its first task; the
 * engine then keeps, under shard 0's lock, how many of its tasks are in
 * flight (held_running, mirrored in held_inflight for tko_pool_stats): a
 * take from the held queue, a caller-runs start and shutdown's run of
 * what is left each count one, and the source gives each back once its
 * task ends (tko__held_release). The engine reads the held queue only
 * where it holds a task, so a plain task's take never calls the source.
 * - may_start: under shard 0's lock, with running held tasks in flight:
 *   whether one more may start now. A pure test: it takes no lock and
 *   changes nothing (the engine asks it again at each take and refresh). */
typedef struct tko__source {
  bool (*may_start)(const tko_pool *pool, unsigned running);
} tko__source;

/* lifecycle.c: registers src as pool's held source, once (one source per
 * pool); a later call with src returns at once. */
void tko__source_add(tko_pool *pool, const tko__source *src);
/* lifecycle.c: under shard 0's lock, with a task in the held queue: whether
 * the held source lets one more start now. */
bool tko__held_may_start(const tko_pool *pool);
/* lifecycle.c: under shard 0's lock: stores held_waiting (tko__refresh_backlog);
 * returns the held queue if it holds a task that may start now, else NULL. */
const tko__queue *tko__held_refresh(tko_pool *pool);
/* lifecycle.c: a held task ended (or was dropped) and gives back its count:
 * wakes a worker if held tasks wait for one, and, while the pool closes,
 * the workers sleeping with nothing left. Takes shard 0's lock. */
void tko__held_release(tko_pool *pool);

/* The kind of a task, NULL for a plain one. Its record starts with the
 * kinds of its tasks: the first word for a task without TKO__CTX_HELD, the
 * second for one with it (a group's record holds the kind of its plain
 * members and that of its held members; the held feature's own record,
 * for a task in no group, holds its kind). */
static inline const tko__task_kind *tko__item_kind(const tko__item *item) {
  uintptr_t tag = item->ctx & TKO__CTX_TAGS;
  if (!(tag & TKO__CTX_ALONE)) return NULL;
  const tko__task_kind *const *kinds = (const tko__task_kind *const *)(item->ctx & ~TKO__CTX_TAGS);
  return kinds[(tag & TKO__CTX_HELD) != 0];
}

/* The group an item is a member of, NULL for any other. */
static inline void *tko__item_group(const tko__item *item) {
  return (item->ctx & TKO__CTX_ALONE) == TKO__CTX_GROUP ? (void *)(item->ctx & ~TKO__CTX_TAGS)
                                                        : NULL;
}
/* run.c: the item whose on_cancel hook runs on this thread, if any. */
extern _Thread_local const tko__item *tko__cancelling_item;

/* A task of an internal kind (the keyed table's runners): not a host
 * task. Only a TKO__CTX_ALONE task may be one, so another reads no record. */
static inline bool tko__item_internal(const tko__item *item) {
  return (item->ctx & TKO__CTX_TAGS) == TKO__CTX_ALONE && tko__item_kind(item)->internal;
}

/* Room a queued item holds in a bounded queue: an internal task holds none. */
static inline size_t tko__item_room(const tko__item *item) {
  return !tko__item_internal(item);
}

/* group.c: an async member finished (or was cancelled, status
 * -ECANCELED): its kind's (async.c) report to the group. */
void tko__group_finished(void *group, int status);
/* Submits a member of group: a plain one (async_kind NULL: the group's own
 * kind), or an async task (TKO__CTX_HELD) of async_kind, which the group's
 * record holds for its async members (tko__item_kind). */
int tko__group_submit_ctx(tko_pool *pool, tko_group *group, const tko__task_kind *async_kind,
                          tko_task_fn fn, void *arg, int weight);
#endif
