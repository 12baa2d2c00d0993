/* SPDX-License-Identifier: MIT */
/* Task groups: a caller-owned counter of pending members with a condition
 * variable to wait on.
 *
 * Lifetime: a waiter may free the group as soon as tko_group_wait returns,
 * so a finishing member does all its work on the group - decrement,
 * broadcast - inside the group's mutex, and the waiter reads "pending == 0"
 * under that same mutex: once the waiter has seen it, the member has let go.
 *
 * Helping: a worker that waits on a group of its own pool runs tasks
 * instead of blocking - the rest of the batch it took first (a member may be
 * there, where no other worker can reach it), then queued ones - so a task
 * can wait for tasks it submitted even on a one-worker pool. It blocks only
 * when nothing is runnable, on the pool's helper condition, which every
 * path that makes work runnable signals (submit, resume, a freed async
 * slot: all through tko__signal_work) and every finished member too. */
#include <errno.h>
#include <string.h>
#include <time.h>

#include "invariant.h"
#include "internal.h"

#define GROUP_MAGIC 0x7461736bu

typedef struct tko__group {
  pthread_mutex_t mu; /* guards every field below and the wait on cv */
  pthread_cond_t cv;
  uint64_t pending;
  int status;         /* first failure, or 0 */
  tko_pool *pool;     /* set by the first member */
  uint32_t magic;
  unsigned fork_gen; /* I: tko__fork_generation() at init */
} tko__group;

_Static_assert(sizeof(tko__group) <= sizeof(tko_group), "tko_group too small");
_Static_assert(_Alignof(tko__group) <= _Alignof(tko_group), "tko_group misaligned");

static tko__group *get(tko_group *group) {
  tko__group *g = (tko__group *)(void *)group;
  return g && g->magic == GROUP_MAGIC ? g : NULL;
}

/* A group made before a fork, in a child: its copy's mutex may have been
 * held by a parent thread at the fork, and then stays locked here, so no
 * call takes it (test process/a_childs_group_calls_never_wait_for_a_parent_thread).
 * The child has one thread, so the copy's fields can be read without it. */
static bool copied(const tko__group *g) { return g->fork_gen != tko__fork_generation(); }

int tko_group_init(tko_group *group) {
  if (!group) return -EINVAL;
  tko__group *g = (tko__group *)(void *)group;
  memset(group, 0, sizeof *group);
  pthread_condattr_t ca;
  if (pthread_condattr_init(&ca)) return -ENOMEM;
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  int rc = pthread_cond_init(&g->cv, &ca);
  pthread_condattr_destroy(&ca);
  if (rc) return -ENOMEM;
  if (pthread_mutex_init(&g->mu, NULL)) {
    pthread_cond_destroy(&g->cv);
    return -ENOMEM;
  }
  tko__fork_watch();
  g->fork_gen = tko__fork_generation();
  g->magic = GROUP_MAGIC;
  return 0;
}

int tko_group_destroy(tko_group *group) {
  tko__group *g = get(group);
  if (!g) return -EINVAL;
  if (copied(g)) return 0; /* the copy is left alone, as a pool's is */
  tko__mutex_lock(&g->mu, TKO__RANK_GROUP);
  uint64_t pending = g->pending;
  tko__mutex_unlock(&g->mu, TKO__RANK_GROUP);
  if (pending) return -EBUSY;
  g->magic = 0;
  pthread_mutex_destroy(&g->mu);
  pthread_cond_destroy(&g->cv);
  return 0;
}

void tko__wake_helpers(tko_pool *pool) {
  tko__mutex_lock(&pool->help_mu, TKO__RANK_HELP);
  pthread_cond_broadcast(&pool->help_cv);
  tko__mutex_unlock(&pool->help_mu, TKO__RANK_HELP);
}

void tko__group_finished(void *group, int status) {
  tko__group *g = group;
  tko__mutex_lock(&g->mu, TKO__RANK_GROUP);
  if (status && !g->status) g->status = status;
  tko_pool *pool = g->pool; /* read now: g may be freed once mu is released */
  TKO__INVARIANT(g->pending > 0); /* each member finishes once */
  if (--g->pending == 0) pthread_cond_broadcast(&g->cv);
  tko__mutex_unlock(&g->mu, TKO__RANK_GROUP);
  /* seq_cst: a helper counts itself, then reads pending under g->mu; we
   * changed pending under g->mu, then look for helpers. */
  if (tko__load_seq(&pool->helpers)) tko__wake_helpers(pool);
}

int tko_group_submit(tko_pool *pool, tko_group *group, tko_task_fn fn, void *arg, int weight) {
  return tko__group_submit_ctx(pool, group, 0, fn, arg, weight);
}

int tko__group_submit_ctx(tko_pool *pool, tko_group *group, uintptr_t tag, tko_task_fn fn,
                          void *arg, int weight) {
  tko__group *g = get(group);
  if (!pool || !g || !fn) return -EINVAL;
  if (copied(g)) return -ECHILD;
  tko__mutex_lock(&g->mu, TKO__RANK_GROUP);
  /* Bound to a pool only while it has members there; an empty group may
   * move to another pool. */
  if (g->pending > 0 && g->pool != pool) {
    tko__mutex_unlock(&g->mu, TKO__RANK_GROUP);
    return -EINVAL;
  }
  g->pool = pool;
  g->pending++;
  tko__mutex_unlock(&g->mu, TKO__RANK_GROUP);
  int rc = tko__submit_item(pool, fn, arg, (uintptr_t)g | TKO__CTX_GROUP | tag, weight, -1);
  if (rc) {
    tko__mutex_lock(&g->mu, TKO__RANK_GROUP);
    if (--g->pending == 0) {
      g->pool = NULL; /* no member anywhere: not bound to that pool */
      pthread_cond_broadcast(&g->cv);
    }
    tko__mutex_unlock(&g->mu, TKO__RANK_GROUP);
    return rc;
  }
  return 0; /* the submit woke any helper (tko__signal_work) */
}

uint64_t tko_group_pending(tko_group *group) {
  tko__group *g = get(group);
  if (!g) return 0;
  if (copied(g)) return g->pending;
  tko__mutex_lock(&g->mu, TKO__RANK_GROUP);
  uint64_t n = g->pending;
  tko__mutex_unlock(&g->mu, TKO__RANK_GROUP);
  return n;
}

int tko_group_status(tko_group *group) {
  tko__group *g = get(group);
  if (!g) return -EINVAL;
  if (copied(g)) return g->status;
  tko__mutex_lock(&g->mu, TKO__RANK_GROUP);
  int st = g->status;
  tko__mutex_unlock(&g->mu, TKO__RANK_GROUP);
  return st;
}

/* Caller holds g->mu. */
static bool group_done(void *g) { return ((tko__group *)g)->pending == 0; }

/* Waits on pool->help_cv until new work or a finished member, or the
 * deadline; false once the deadline has passed. Caller holds help_mu. */
static bool helper_wait(tko_pool *pool, long timeout_ms, const struct timespec *deadline) {
  if (timeout_ms == 0) return false;
  if (timeout_ms < 0) {
    tko__cond_wait(&pool->help_cv, &pool->help_mu, TKO__RANK_HELP);
    return true;
  }
  return tko__cond_timedwait(&pool->help_cv, &pool->help_mu, TKO__RANK_HELP, deadline) != ETIMEDOUT;
}

/* helper_wait beside a hole (tko__look_seq): for TKO__HOLE_POLL_MS at
 * most, or less if the deadline comes first. */
static bool helper_wait_hole(tko_pool *pool, long timeout_ms, const struct timespec *deadline) {
  if (timeout_ms == 0) return false;
  struct timespec poll;
  tko__deadline_after(&poll, TKO__HOLE_POLL_MS);
  if (timeout_ms > 0 && tko__time_before(deadline, &poll))
    return helper_wait(pool, timeout_ms, deadline);
  (void)tko__cond_timedwait(&pool->help_cv, &pool->help_mu, TKO__RANK_HELP, &poll);
  return true;
}

static uint64_t pending_now(tko__group *g) {
  tko__mutex_lock(&g->mu, TKO__RANK_GROUP);
  uint64_t n = g->pending;
  tko__mutex_unlock(&g->mu, TKO__RANK_GROUP);
  return n;
}

/* How many helping waits are nested on this thread: a waiting task runs a
 * task that waits and runs a task... each level a few stack frames. */
static _Thread_local unsigned help_depth;

static bool deadline_passed(long timeout_ms, const struct timespec *deadline) {
  if (timeout_ms < 0) return false;
  if (timeout_ms == 0) return true;
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now); /* tko__deadline_after's clock */
  return !tko__time_before(&now, deadline);
}

/* A worker of the group's pool waits by running tasks - its own batch's
 * remaining ones first, then queued ones - and sleeps only when nothing is
 * runnable, on the pool's helper condition, which new work and finished
 * members signal. It starts no task once the deadline has passed (a task
 * it started may still run past it: a wait cannot stop a task). */
static int help_until_done(tko__group *g, tko_pool *pool, tko__worker *self, long timeout_ms,
                           const struct timespec *deadline) {
  while (pending_now(g) > 0) {
    if (deadline_passed(timeout_ms, deadline)) return -ETIMEDOUT;
    if (tko__help_one(pool, self)) continue;
    tko__mutex_lock(&pool->help_mu, TKO__RANK_HELP);
    tko__add_seq(&pool->helpers, 1); /* seq_cst: see tko__group_finished */
    bool timed_out = false;
    enum tko__look look = tko__look_seq(pool);
    if (pending_now(g) > 0 && look == TKO__LOOK_HOLE) /* its publish may not wake us */
      timed_out = !helper_wait_hole(pool, timeout_ms, deadline);
    else if (pending_now(g) > 0 && look == TKO__LOOK_NOTHING)
      timed_out = !helper_wait(pool, timeout_ms, deadline);
    tko__sub_seq(&pool->helpers, 1);
    tko__mutex_unlock(&pool->help_mu, TKO__RANK_HELP);
    if (timed_out && pending_now(g) > 0) return -ETIMEDOUT;
  }
  return 0;
}

/* Whether the calling thread is itself a pending member of g: inside the
 * on_cancel hook of a member being cancelled, or running a member (a task,
 * its hooks, or a task nested in a helping wait below it). Such a wait
 * could only end at its deadline (with no timeout, never), so it is
 * -EDEADLK, as every other self-wait from a hook is. */
static bool waits_on_itself(const tko__group *g) {
  if (tko__cancelling_item && tko__item_group(tko__cancelling_item) == g) return true;
  const tko__worker *w = tko__current_worker;
  for (const tko__task_frame *f = w ? w->task : NULL; f; f = f->outer)
    if (tko__item_group(f->item) == g) return true;
  return false;
}

int tko_group_wait(tko_group *group, long timeout_ms) {
  tko__group *g = get(group);
  if (!g || timeout_ms < -1) return -EINVAL;
  if (copied(g)) return g->pending ? -ECHILD : 0;
  struct timespec deadline;
  if (timeout_ms >= 0) tko__deadline_after(&deadline, timeout_ms);
  tko__worker *self = tko__current_worker;
  tko__mutex_lock(&g->mu, TKO__RANK_GROUP);
  /* g->pool is only meaningful (and its pool only alive) while members
   * are pending. None pending: done now, whatever is submitted next. (A
   * worker that went on to the blocking wait below while a member came in
   * meanwhile waited for a member only it could run: on a one-worker pool,
   * until its deadline; group/a_helping_wait_races_member_submits.) */
  if (!g->pending) {
    tko__mutex_unlock(&g->mu, TKO__RANK_GROUP);
    return 0;
  }
  tko_pool *pool = g->pool;
  tko__mutex_unlock(&g->mu, TKO__RANK_GROUP);
  if (waits_on_itself(g)) return -EDEADLK;
  /* A forked child's copy: the members live in the parent; running them
   * here would run them twice, and nothing here can finish them. */
  if (tko__pool_forked(pool)) return -ECHILD;
  if (self && self->pool == pool) {
    /* Too deep: another level could overflow the stack, and waiting
     * without helping could wait on a task queued behind this one. */
    if (help_depth >= TKO_MAX_HELP_DEPTH) return pending_now(g) ? -EDEADLK : 0;
    help_depth++;
    /* The pool read under g->mu above: a submit to the group rewrites g->pool
     * (with the same pool while members are pending) under that mutex, so
     * a re-read here would race with it (test
     * group/a_helping_wait_races_member_submits, under TSan). */
    int rc = help_until_done(g, pool, self, timeout_ms, &deadline);
    help_depth--;
    return rc;
  }
  tko__mutex_lock(&g->mu, TKO__RANK_GROUP);
  int rc = tko__cond_wait_until(&g->cv, &g->mu, TKO__RANK_GROUP, timeout_ms < 0 ? NULL : &deadline,
                                group_done, g);
  tko__mutex_unlock(&g->mu, TKO__RANK_GROUP);
  return rc;
}

long tko_group_cancel(tko_group *group) {
  tko__group *g = get(group);
  if (!g) return -EINVAL;
  if (copied(g)) return g->pending ? -ECHILD : 0;
  tko__mutex_lock(&g->mu, TKO__RANK_GROUP);
  /* With no member pending the pool may be gone: nothing to cancel there. */
  tko_pool *pool = g->pending ? g->pool : NULL;
  tko__mutex_unlock(&g->mu, TKO__RANK_GROUP);
  if (!pool) return 0;
  if (tko__pool_forked(pool)) return -ECHILD; /* its queue is the parent's */
  long total = 0;
  tko__item batch[TKO__GRAB_MAX];
  size_t n;
  while ((n = tko__take_queued(pool, (uintptr_t)g | TKO__CTX_GROUP, batch, TKO__GRAB_MAX))) {
    for (size_t i = 0; i < n; i++) tko__cancel_item(pool, &batch[i]);
    total += (long)n;
  }
  return total;
}
