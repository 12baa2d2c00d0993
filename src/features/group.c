/* SPDX-License-Identifier: MIT */
/* Task groups: a caller-owned counter of pending members with a condition
 * variable to wait on.
 *
 * Lifetime: a waiter may free the group as soon as tko_group_wait returns,
 * so a finishing member does all its work on the group - decrement,
 * broadcast - inside the group's mutex, and the waiter reads "pending == 0"
 * under that same mutex: once the waiter has seen it, the member has let go.
 *
 * Helping: a pool worker that waits on a group, of any pool, runs its own
 * pool's tasks instead of blocking: first the group's queued members,
 * newest first, where no heavier task is queued (a member goes before the
 * tasks of its weight, never before a heavier one); then the rest of the
 * batch it took (a member may be there, where no other worker can reach
 * it); then any queued task. So a task can
 * wait for tasks it submitted even on a one-worker pool; a fork-join tree
 * nests its waits only as deep as the tree, since each wait runs its own
 * children before anything else; and two pools whose tasks wait on each
 * other's groups keep running, since each worker runs its own pool's work.
 *
 * A helper that finds nothing to run sleeps on a parker of its own (help.c),
 * so that two events can wake it without a shared lock: new work in the
 * helper's pool (help.c), and the group's end, which unparks every helper
 * the group lists (each lists itself for its whole wait, under g->mu, and
 * the last member unparks them under that mutex, so a listed helper is
 * alive while it is unparked). A parker keeps a wake-up that comes before
 * the park, so none is lost between a helper's last look and its sleep.
 *
 * Members: a group is a task kind (kind.h: tko__task_kind). A member's
 * ctx points to the group, whose record starts with two kinds: its own, for
 * plain members, and the async feature's, for async members (async.c runs
 * and finishes those, and reports each end here: tko__group_finished). */
#include <errno.h>
#include <string.h>
#include <time.h>

#include "engine.h"
#include "invariant.h"
#include "kind.h"
#include "wake.h"

#define GROUP_MAGIC 0x7461736bu

typedef struct tko__group {
  /* First (tko__item_kind): [0] member_kind, set at init; [1] the kind of
   * async members, set under mu by the first async member's submit, before
   * any async member is queued, and never changed after (read unlocked). */
  const tko__task_kind *kinds[2];
  tko__mutex mu; /* guards every field below and the wait on cv */
  pthread_cond_t cv;
  uint64_t pending;
  int status;         /* first failure, or 0 */
  tko_pool *pool;     /* set by the first member */
  struct group_helper *helpers; /* the helping waits on this group */
  /* Plain members submitted and neither started nor cancelled: a hint
   * (relaxed) that tells a helping wait whether to look for one in the
   * queues, so a wait whose members all run elsewhere does not scan a
   * long backlog at each step. */
  atomic_uint_fast64_t unstarted;
  uint32_t magic;
  unsigned fork_gen; /* I: tko__fork_generation() at init */
} tko__group;

_Static_assert(sizeof(tko__group) <= sizeof(tko_group), "tko_group too small");
_Static_assert(_Alignof(tko__group) <= _Alignof(tko_group), "tko_group misaligned");

static const tko__task_kind member_kind; /* below: the kind of plain members */

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
  if (tko__mutex_init(&g->mu, TKO__RANK_GROUP)) {
    pthread_cond_destroy(&g->cv);
    return -ENOMEM;
  }
  tko__fork_watch();
  g->kinds[0] = &member_kind;
  g->fork_gen = tko__fork_generation();
  g->magic = GROUP_MAGIC;
  return 0;
}

int tko_group_destroy(tko_group *group) {
  tko__group *g = get(group);
  if (!g) return -EINVAL;
  if (copied(g)) return 0; /* the copy is left alone, as a pool's is */
  tko__mutex_lock(&g->mu);
  uint64_t pending = g->pending;
  tko__mutex_unlock(&g->mu);
  if (pending) return -EBUSY;
  g->magic = 0;
  tko__mutex_destroy(&g->mu);
  pthread_cond_destroy(&g->cv);
  return 0;
}

/* A helping wait on a group (help_until_done), on the waiting thread's
 * stack. */
typedef struct group_helper {
  tko__helper h;
  struct group_helper *next; /* the group's helpers: under g->mu */
} group_helper;

/* A member finished (or was cancelled, status -ECANCELED); unstarted: a
 * plain member cancelled before it started. */
static void member_finished(tko__group *g, int status, bool unstarted) {
  if (unstarted) tko__sub_relaxed(&g->unstarted, 1);
  tko__mutex_lock(&g->mu);
  if (status && !g->status) g->status = status;
  TKO__INVARIANT(g->pending > 0); /* each member finishes once */
  if (--g->pending == 0) {
    pthread_cond_broadcast(&g->cv);
    /* Under g->mu: a helper leaves the list under it before it returns. */
    for (group_helper *gh = g->helpers; gh; gh = gh->next) tko__parker_unpark(&gh->h.parker);
  }
  tko__mutex_unlock(&g->mu);
}

void tko__group_finished(void *group, int status) { member_finished(group, status, false); }

static tko__group *member_group(const tko__item *item) {
  return (tko__group *)(item->ctx & ~TKO__CTX_TAGS);
}

/* A plain member starts: it is no longer queued. */
static bool member_starts(const tko__item *item) {
  tko__sub_relaxed(&member_group(item)->unstarted, 1);
  return true;
}

static void member_done(const tko__item *item, int status) {
  member_finished(member_group(item), status, false);
}

static void member_cancelled(const tko__item *item) {
  member_finished(member_group(item), -ECANCELED, true);
}

/* The kind of a group's plain members. */
static const tko__task_kind member_kind = {
    .start = member_starts, .done = member_done, .cancelled = member_cancelled};

int tko_group_submit(tko_pool *pool, tko_group *group, tko_task_fn fn, void *arg, int weight) {
  return tko__group_submit_ctx(pool, group, NULL, fn, arg, weight);
}

int tko__group_submit_ctx(tko_pool *pool, tko_group *group, const tko__task_kind *async_kind,
                          tko_task_fn fn, void *arg, int weight) {
  tko__group *g = get(group);
  if (!pool || !g || !fn) return -EINVAL;
  if (copied(g)) return -ECHILD;
  tko__mutex_lock(&g->mu);
  /* Bound to a pool only while it has members there; an empty group may
   * move to another pool. */
  if (g->pending > 0 && g->pool != pool) {
    tko__mutex_unlock(&g->mu);
    return -EINVAL;
  }
  g->pool = pool;
  g->pending++;
  if (async_kind && !g->kinds[1]) g->kinds[1] = async_kind; /* one kind: async.c's */
  tko__mutex_unlock(&g->mu);
  uintptr_t tag = async_kind ? TKO__CTX_HELD : 0;
  if (!tag) tko__add_relaxed(&g->unstarted, 1); /* before the member can start */
  int rc = tko__submit_item(pool, fn, arg, (uintptr_t)g | TKO__CTX_GROUP | tag, weight, -1);
  if (rc) {
    if (!tag) tko__sub_relaxed(&g->unstarted, 1);
    tko__mutex_lock(&g->mu);
    if (--g->pending == 0) {
      g->pool = NULL; /* no member anywhere: not bound to that pool */
      pthread_cond_broadcast(&g->cv);
    }
    tko__mutex_unlock(&g->mu);
    return rc;
  }
  return 0; /* the submit woke any helper (tko__signal_work) */
}

uint64_t tko_group_pending(tko_group *group) {
  tko__group *g = get(group);
  if (!g) return 0;
  if (copied(g)) return g->pending;
  tko__mutex_lock(&g->mu);
  uint64_t n = g->pending;
  tko__mutex_unlock(&g->mu);
  return n;
}

int tko_group_status(tko_group *group) {
  tko__group *g = get(group);
  if (!g) return -EINVAL;
  if (copied(g)) return g->status;
  tko__mutex_lock(&g->mu);
  int st = g->status;
  tko__mutex_unlock(&g->mu);
  return st;
}

/* Caller holds g->mu. */
static bool group_done(void *g) { return ((tko__group *)g)->pending == 0; }

static uint64_t pending_now(tko__group *g) {
  tko__mutex_lock(&g->mu);
  uint64_t n = g->pending;
  tko__mutex_unlock(&g->mu);
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

/* How long a helper may sleep: until the deadline (UINT64_MAX: none). */
static uint64_t sleep_ns(long timeout_ms, const struct timespec *deadline) {
  if (timeout_ms < 0) return UINT64_MAX;
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now); /* tko__deadline_after's clock */
  if (!tko__time_before(&now, deadline)) return 0;
  return (uint64_t)(deadline->tv_sec - now.tv_sec) * 1000000000u +
         (uint64_t)(deadline->tv_nsec - now.tv_nsec);
}

static bool members_pending(void *g) { return pending_now(g) > 0; }

/* 0 once the group is done, -ETIMEDOUT once the deadline has passed with
 * members pending, each after taking h off the group's list in the same
 * hold of g->mu that read the count (the last member unparks the listed
 * helpers under it, and a group seen done may be freed at once, so after
 * this nobody touches h and we touch g no more); 1 to go on waiting. */
static int leave_if_done(tko__group *g, group_helper *gh, long timeout_ms,
                         const struct timespec *deadline) {
  bool expired = deadline_passed(timeout_ms, deadline);
  tko__mutex_lock(&g->mu);
  int rc = g->pending == 0 ? 0 : expired ? -ETIMEDOUT : 1;
  if (rc <= 0) {
    group_helper **p = &g->helpers;
    while (*p != gh) p = &(*p)->next;
    *p = gh->next;
  }
  tko__mutex_unlock(&g->mu);
  return rc;
}

/* A pool worker waits by running its own pool's tasks - the group's queued
 * members first, newest first, when the group is of its pool; then its own
 * batch's remaining ones; then any queued one - and sleeps only when
 * nothing is runnable. It starts no task once the deadline has passed (a
 * task it started may still run past it: a wait cannot stop a task). */
static int help_until_done(tko__group *g, tko_pool *group_pool, tko__worker *self,
                           long timeout_ms, const struct timespec *deadline) {
  tko_pool *pool = self->pool;
  uintptr_t members = group_pool == pool ? (uintptr_t)g | TKO__CTX_GROUP : 0;
  group_helper gh = {.next = NULL};
  if (tko__parker_init(&gh.h.parker)) return -ENOMEM;
  tko__mutex_lock(&g->mu);
  gh.next = g->helpers;
  g->helpers = &gh;
  tko__mutex_unlock(&g->mu);
  int rc;
  while ((rc = leave_if_done(g, &gh, timeout_ms, deadline)) > 0) {
    if (members && tko__load_relaxed(&g->unstarted) && tko__help_member(pool, self, members))
      continue;
    if (tko__help_one(pool, self)) continue;
    tko__helper_sleep(pool, &gh.h, sleep_ns(timeout_ms, deadline), members_pending, g);
  }
  tko__parker_fini(&gh.h.parker);
  return rc;
}

static bool member_of(const tko__item *item, const void *g) { return tko__item_group(item) == g; }

/* Whether the calling thread is itself a pending member of g: inside the
 * on_cancel hook of a member being cancelled, or running a member (a task,
 * its hooks, or a task nested in a helping wait below it), on a worker or
 * off the workers (caller-runs, an async member's completion). Such a wait
 * could only end at its deadline (with no timeout, never), so it is
 * -EDEADLK, as every other self-wait from a hook is. */
static bool waits_on_itself(const tko__group *g) { return tko__thread_runs(member_of, g); }

int tko_group_wait(tko_group *group, long timeout_ms) {
  tko__group *g = get(group);
  if (!g || timeout_ms < -1) return -EINVAL;
  if (copied(g)) return g->pending ? -ECHILD : 0;
  struct timespec deadline;
  if (timeout_ms >= 0) tko__deadline_after(&deadline, timeout_ms);
  tko__worker *self = tko__current_worker;
  tko__mutex_lock(&g->mu);
  /* g->pool is only meaningful (and its pool only alive) while members
   * are pending. None pending: done now, whatever is submitted next. (A
   * worker that went on to the blocking wait below while a member came in
   * meanwhile waited for a member only it could run: on a one-worker pool,
   * until its deadline; group/a_helping_wait_races_member_submits.) */
  if (!g->pending) {
    tko__mutex_unlock(&g->mu);
    return 0;
  }
  tko_pool *pool = g->pool;
  tko__mutex_unlock(&g->mu);
  if (waits_on_itself(g)) return -EDEADLK;
  /* A forked child's copy: the members live in the parent; running them
   * here would run them twice, and nothing here can finish them. */
  if (tko__pool_forked(pool)) return -ECHILD;
  if (self && !tko__pool_forked(self->pool)) {
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
  tko__mutex_lock(&g->mu);
  int rc = tko__cond_wait_until(&g->cv, &g->mu, timeout_ms < 0 ? NULL : &deadline, group_done, g);
  tko__mutex_unlock(&g->mu);
  return rc;
}

long tko_group_cancel(tko_group *group) {
  tko__group *g = get(group);
  if (!g) return -EINVAL;
  if (copied(g)) return g->pending ? -ECHILD : 0;
  tko__mutex_lock(&g->mu);
  /* With no member pending the pool may be gone: nothing to cancel there. */
  tko_pool *pool = g->pending ? g->pool : NULL;
  tko__mutex_unlock(&g->mu);
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
