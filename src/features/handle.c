/* SPDX-License-Identifier: MIT */
/* Task handles: a caller-owned record of one task, to cancel it, wait for
 * it and read its outcome. A handle is a task kind (kind.h:
 * tko__task_kind): the engine knows it only through the kind's callbacks,
 * reached from the item's ctx, which points to the handle.
 *
 * States, in one atomic word (state), with a WAITERS bit beside them:
 *
 *   QUEUED ---start---> RUNNING ---done---> DONE
 *     |
 *     +---cancel---> CANCELLING ---cancelled---> CANCELLED
 *     +---cancelled (shutdown, a requeue that failed) ---> CANCELLED
 *
 * Cancel and start cannot both win: each is a CAS from QUEUED on the same
 * word, so exactly one of them moves it on. A start that loses (the word
 * says CANCELLING) refuses the task, and the engine cancels it where it
 * stands, on that thread (run.c: tko__run_item). A cancel that wins then
 * takes the item out of the queues (tko__take_queued, under each queue's
 * lock) and, if it found it, cancels it itself; if not, a worker holds it
 * in a batch it took and has not started, and that worker's start meets
 * CANCELLING. The item is in one place at a time - a queue, or one
 * worker's batch, moved between them only under the queue's lock - so
 * exactly one thread cancels it, once: on_cancel sees it once, and
 * cancelled runs once. Shutdown cancels a queued item without a start
 * (QUEUED or CANCELLING to CANCELLED); it too holds the only copy.
 *
 * Why a wait cannot miss the end: a waiter that reads an unfinished word
 * sets WAITERS in it by CAS, and sleeps only while the word still holds
 * that value (tko__word_wait: a futex's check-and-sleep, or its fallback's
 * check under a mutex that the waker takes). The end is an exchange of the
 * word for DONE or CANCELLED; it returns the word it replaced, so it sees
 * WAITERS exactly when some waiter's CAS came before it, and then wakes
 * every waiter. A waiter whose CAS comes after it fails the CAS (the word
 * changed) and reads the end; one whose CAS came before sleeps only on the
 * old value, which the word no longer holds, or is woken. The RMWs of one
 * word are totally ordered, so there is no third case. Start and cancel
 * carry WAITERS over in their CAS; neither wakes anyone (a waiter waits for
 * the end).
 *
 * A worker of the handle's pool that waits helps instead (wait_on_worker):
 * it runs the task itself while it is queued, or else other queued tasks
 * of its pool, and sleeps on a parker of its own (help.c), listed in the
 * pool, so that new work there wakes it too. It lists itself before it
 * sets WAITERS, so an end that sees WAITERS finds it listed and unparks
 * the pool's helpers (tko__wake_helpers) after its exchange; an end that
 * comes before the CAS makes the CAS fail, and the helper reads the end.
 *
 * Lifetime: the end's exchange is the library's last write to the handle,
 * and its wake is by address only (tko__word_wake_all reads and writes
 * nothing there), so a waiter that read DONE or CANCELLED may free the
 * handle at once. done stores status before the exchange; a waiter's or
 * status reader's acquire load of the final word pairs with the exchange's
 * release. A cancel reads everything it needs (pool, ctx) before its CAS:
 * once it has won, the worker that holds the item may finish the handle at
 * any moment, so the cancel touches the handle no more unless it took the
 * item itself (and then cancelled, the end, is its own last touch). */
#include <errno.h>
#include <string.h>

#include "engine.h"
#include "kind.h"

#define HANDLE_MAGIC 0x68646c65u /* "hdle" */

enum {
  QUEUED = 1,
  RUNNING,
  CANCELLING,
  DONE,
  CANCELLED,
  STATE_MASK = 0xff,
  WAITERS = 0x100, /* a waiter may sleep on the word: the end wakes it */
};

typedef struct tko__handle {
  const tko__task_kind *kind; /* I: handle_kind, first (tko__item_kind) */
  /* The state machine above. Every change is an RMW; loads that decide
   * are acquire (pairs with the end's release). */
  atomic_uint state;
  int status;     /* the task's return value: written by done before the end */
  uint64_t id;    /* I: the task's id, stored by the submit before it can start */
  tko_pool *pool; /* I */
  uint32_t magic; /* I: HANDLE_MAGIC once armed */
} tko__handle;

_Static_assert(sizeof(tko__handle) <= sizeof(tko_handle), "tko_handle too small");
_Static_assert(_Alignof(tko__handle) <= _Alignof(tko_handle), "tko_handle misaligned");
_Static_assert(sizeof(tko_handle) <= 64, "tko_handle: at most 64 bytes");

static tko__handle *of_item(const tko__item *item) {
  return (tko__handle *)(item->ctx & ~TKO__CTX_TAGS);
}

static tko__handle *get(const tko_handle *handle) {
  tko__handle *h = (tko__handle *)(void *)handle;
  return h && h->magic == HANDLE_MAGIC ? h : NULL;
}

static uintptr_t ctx_of(const tko__handle *h) {
  return (uintptr_t)h | TKO__CTX_KIND;
}

static bool finished(unsigned s) {
  return (s & STATE_MASK) == DONE || (s & STATE_MASK) == CANCELLED;
}

/* Moves the word from QUEUED to to, keeping WAITERS; false if it was not
 * QUEUED. The first try expects the word as the submit left it (QUEUED, no
 * waiters), so a start with nobody waiting is one RMW and no load; a failed
 * CAS hands back the word it read, and the loop goes on from that.
 * Acq_rel. Release: a cancel's reads of the handle (its pool) stay before
 * its win, after which the task may end and the owner reuse the handle at
 * once; the owner's acquire load of the final word, later than this RMW in
 * the word's order, pairs with it. Acquire: the winner's later accesses to
 * the handle stay after the RMW that allowed them. */
static bool claim(tko__handle *h, unsigned to) {
  unsigned s = QUEUED;
  do {
    if (tko__cas_acq_rel(&h->state, &s, to | (s & WAITERS))) return true;
  } while ((s & STATE_MASK) == QUEUED);
  return false;
}

/* The end: the handle's last write (see the essay). Release: pairs with
 * the acquire loads of status and wait, so status is seen with it. */
static void end(tko__handle *h, unsigned final) {
  atomic_uint *word = &h->state;
  tko_pool *pool = h->pool; /* read before the end: h may be gone after it */
  unsigned old = tko__exchange_acq_rel(word, final);
  if (old & WAITERS) {
    tko__word_wake_all(word); /* by address: h may be gone */
    /* A waiter that helps in this pool sleeps on its own parker, listed
     * in the pool before it set WAITERS (wait_on_worker). The pool is
     * alive: the end runs on one of its threads or in a call on it. */
    tko__wake_helpers(pool);
  }
}

static bool handle_start(const tko__item *item) {
  return claim(of_item(item), RUNNING);
}

static void handle_done(const tko__item *item, int status) {
  tko__handle *h = of_item(item);
  h->status = status;
  end(h, DONE);
}

static void handle_cancelled(const tko__item *item) {
  end(of_item(item), CANCELLED);
}

static const tko__task_kind handle_kind = {
    .start = handle_start, .done = handle_done, .cancelled = handle_cancelled};

int tko_submit_handle(tko_pool *pool, tko_handle *handle, tko_task_fn fn, void *arg, int weight) {
  if (!handle || !fn) return -EINVAL;
  tko__handle *h = (tko__handle *)(void *)handle;
  /* Armed before the submit publishes the task: from then on a worker may
   * start it (and end it) at any moment. Only the fields read before the
   * end are stored here: the submit stores id before the publish, and done
   * stores status before the end, so neither is written twice. */
  h->kind = &handle_kind;
  h->pool = pool;
  h->magic = HANDLE_MAGIC;
  atomic_init(&h->state, QUEUED);
  int rc = tko__submit_item_id(pool, fn, arg, ctx_of(h), weight, &h->id);
  if (rc) h->magic = 0; /* never queued: no callback ran, nothing refers to it */
  return rc;
}

uint64_t tko_handle_id(const tko_handle *handle) {
  const tko__handle *h = get(handle);
  return h ? h->id : 0;
}

int tko_handle_status(const tko_handle *handle) {
  tko__handle *h = get(handle);
  if (!h) return -EINVAL;
  unsigned s = tko__load_acquire(&h->state); /* pairs with end's release */
  if ((s & STATE_MASK) == DONE) return h->status;
  return (s & STATE_MASK) == CANCELLED ? -ECANCELED : -EINPROGRESS;
}

int tko_handle_cancel(tko_handle *handle) {
  tko__handle *h = get(handle);
  if (!h) return -EINVAL;
  tko_pool *pool = h->pool;
  uintptr_t ctx = ctx_of(h);
  if (tko__pool_forked(pool)) return -ECHILD; /* its queue is the parent's */
  if (!claim(h, CANCELLING)) {
    unsigned s = tko__load_acquire(&h->state) & STATE_MASK;
    return s == CANCELLING || s == CANCELLED ? -EALREADY : -EBUSY;
  }
  /* Won: h may end on another thread from here on (see the essay). */
  tko__item item;
  if (tko__take_queued(pool, ctx, &item, 1)) tko__cancel_item(pool, &item);
  return 0;
}

/* Sleeps while the word is still s (WAITERS set in it first), at most ns. */
static void sleep_on(tko__handle *h, unsigned s, uint64_t ns) {
  if (!(s & WAITERS)) {
    /* Relaxed: the word's own order decides (the essay); a failed CAS
     * (the word changed, or a spurious failure) sends the caller to look
     * again. */
    if (!tko__cas_relaxed(&h->state, &s, s | WAITERS)) return;
    s |= WAITERS;
  }
  tko__word_wait(&h->state, s, ns);
}

/* Nanoseconds to the deadline (UINT64_MAX: none), 0 once it has passed. */
static uint64_t left_ns(long timeout_ms, uint64_t deadline) {
  if (timeout_ms < 0) return UINT64_MAX;
  uint64_t now = tko__now_ns();
  return now < deadline ? deadline - now : 0;
}

/* How many waits from a worker that run their task are nested on this
 * thread (a task run by a wait waits in turn...), each a few frames. */
static _Thread_local unsigned run_depth;

/* A helper may sleep while the task is unfinished and WAITERS is set in the
 * word (by this CAS, once listed in the pool: see the essay); false sends
 * it to look again. */
static bool unfinished(void *arg) {
  tko__handle *h = arg;
  unsigned s = tko__load_acquire(&h->state); /* pairs with end's release */
  if (finished(s)) return false;
  /* Acq_rel: the listing before it is seen by an end that reads WAITERS. */
  return (s & WAITERS) || tko__cas_acq_rel(&h->state, &s, s | WAITERS);
}

/* A wait on a worker of the task's own pool, which helps: while the task
 * is queued it takes it out and runs it here (so a task may wait for one
 * it submitted on a one-worker pool), while this worker's own batch holds
 * it it runs the batch on to it, and otherwise it runs other queued tasks
 * of the pool, as a helping group wait does; it sleeps only when nothing
 * is runnable. */
static int wait_on_worker(tko__handle *h, tko__worker *w, long timeout_ms, uint64_t deadline) {
  uintptr_t ctx = ctx_of(h);
  tko__helper me;
  if (tko__parker_init(&me.parker)) return -ENOMEM;
  int rc = 0;
  for (;;) {
    unsigned s = tko__load_acquire(&h->state); /* pairs with end's release */
    if (finished(s)) break;
    uint64_t ns = left_ns(timeout_ms, deadline);
    if (ns == 0) {
      rc = -ETIMEDOUT;
      break;
    }
    run_depth++;
    bool ran = ((s & STATE_MASK) == QUEUED && tko__run_queued(h->pool, w, ctx)) ||
               tko__help_one(h->pool, w); /* its own batch first: the task may be there */
    run_depth--;
    if (!ran) tko__helper_sleep(h->pool, &me, ns, unfinished, h);
  }
  tko__parker_fini(&me.parker);
  return rc;
}

static bool is_task(const tko__item *item, const void *ctx) {
  return item->ctx == *(const uintptr_t *)ctx;
}

/* Whether the calling thread is the handle's task: running it (or a task
 * nested in a wait below it), on a worker or on the submitting thread
 * (caller-runs), or in on_cancel for it. */
static bool waits_on_itself(const tko__handle *h) {
  uintptr_t ctx = ctx_of(h);
  return tko__thread_runs(is_task, &ctx);
}

int tko_handle_wait(tko_handle *handle, long timeout_ms) {
  tko__handle *h = get(handle);
  if (!h || timeout_ms < -1) return -EINVAL;
  if (finished(tko__load_acquire(&h->state))) return 0; /* pairs with end's release */
  if (tko__pool_forked(h->pool)) return -ECHILD;        /* it ends in the parent */
  if (waits_on_itself(h)) return -EDEADLK;
  /* A timeout too long for the clock's nanoseconds waits without a limit
   * (about 292 years: no deadline a caller can tell from none). */
  if (timeout_ms > (long)((UINT64_MAX - tko__now_ns()) / 1000000u) - 1) timeout_ms = -1;
  uint64_t deadline = timeout_ms < 0 ? 0 : tko__now_ns() + (uint64_t)timeout_ms * 1000000u;
  tko__worker *w = tko__current_worker;
  if (w && w->pool == h->pool && !tko__pool_forked(w->pool)) {
    /* Too deep: another level could overflow the stack. */
    if (run_depth >= TKO_MAX_HELP_DEPTH) return -EDEADLK;
    return wait_on_worker(h, w, timeout_ms, deadline);
  }
  for (;;) {
    unsigned s = tko__load_acquire(&h->state); /* pairs with end's release */
    if (finished(s)) return 0;
    uint64_t ns = left_ns(timeout_ms, deadline);
    if (ns == 0) return -ETIMEDOUT;
    sleep_on(h, s, ns);
  }
}
