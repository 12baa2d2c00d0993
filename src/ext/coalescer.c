/* SPDX-License-Identifier: MIT */
/* The coalescer: a dirty set of (key, latest value) and one periodic sweep.
 *
 * Two dirty tables, `active` and `spare`, each a dense entry array (in
 * first-marked order, which is what flush_fn sees) plus an open-addressing
 * index from key to entry. Marks insert into or update `active` under mu.
 * A sweep is run by whoever holds the sweep token (`running`, under mu): it
 * swaps the tables under mu, flushes the old active table with no lock held,
 * clears it (only the slots it used) and gives the token back. Marks made
 * during the flush go to the other table, for the next sweep. The token
 * serializes sweeps, so a sweep that flushes key K ends before the next one
 * that flushes K starts, and the spare table is only ever touched by the
 * token holder. Tables keep their capacity across sweeps: once both have
 * grown to the number of keys dirty at once, marks never allocate.
 *
 * Why no mark is lost: a mark accepted under mu sits in `active` until a
 * token holder swaps it out, and every swap is followed by a flush of what
 * it took. close sets `closed` under mu, so a mark either saw it (and was
 * rejected) or is in a table that the final flush, which takes the token
 * after closing, or a sweep already holding the token, will flush.
 *
 * The timer thread waits on tick_cv with a CLOCK_MONOTONIC deadline. Each
 * tick that finds dirty keys and no sweep queued or running submits one
 * sweep task (mu released around the submit: a bounded pool may run the
 * task at once on this thread). The submit never waits for room, so that
 * close, which joins this thread, works from any thread, a worker of a full
 * blocking pool included. If the pool refuses (shut down, full, out of
 * memory), the timer thread takes the token and sweeps itself. A sweep task that the pool
 * dropped (TKO_CANCEL) leaves `queued` set; tko_coalescer_pool_cancelled
 * clears it, and so does a tick or destroy that finds the pool with nothing
 * queued or running while `queued` is still set (a live sweep task clears
 * it when it starts, before the pool can count it finished).
 *
 * Lock order: mu only, a leaf (witness.h); no lock is held while flush_fn
 * runs or while calling into the pool. The sweep task's last access to the coalescer is the
 * unlock of mu after clearing `running` or `queued`; destroy waits for both
 * under mu before freeing. */
#define _GNU_SOURCE
#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "lifecycle.h"
#include "mem.h"
#include "prim.h"
#include "witness.h"
#include "taskorch/coalescer.h"

typedef struct dirty_set {
  tko_coalesce_entry *entries; /* cap entries, n used, first-marked order */
  size_t *slot_of;             /* index slot of each entry (for clearing) */
  uint32_t *index;             /* mask + 1 slots: 0 = empty, else entry + 1 */
  size_t n, cap, mask;
} dirty_set;

/* A live coalescer's first word; destroy overwrites it before freeing, so a
 * call on a destroyed coalescer (while its memory is still mapped) is
 * caught: -EINVAL, and an assertion in debug builds. */
#define COALESCER_MAGIC 0x434f414cu /* "COAL" */
#define COALESCER_DEAD 0x636f616cu

struct tko_coalescer {
  uint32_t magic;    /* COALESCER_MAGIC while it lives */
  unsigned fork_gen; /* tko__fork_generation() at create */
  tko_pool *pool;
  unsigned interval_ms;
  tko_coalesce_flush_fn flush;
  void *user;
  int weight;
  const tko_allocator *alloc;
  tko__mutex mu;          /* protects every field below */
  pthread_cond_t cv;      /* broadcast when running, queued or close_done clears/sets */
  pthread_cond_t tick_cv; /* wakes the timer thread early (stop) */
  dirty_set sets[2];
  dirty_set *active; /* marks go here */
  dirty_set *spare;  /* empty; only the token holder touches it */
  bool closed;       /* marks are rejected */
  bool closing;      /* a close is under way or done */
  bool close_done;   /* the final flush has been run */
  bool stop;         /* the timer thread must exit */
  bool running;      /* the sweep token is held */
  bool queued;       /* a sweep task is in the pool, not yet started */
  bool has_thread;
  pthread_t thread;
  tko_coalesce_stats st; /* all but dirty, which is active->n */
  size_t initial_keys;   /* what the sets shrink back to */
  uint64_t idle_since_ns; /* first tick of a run that found nothing dirty; 0 = busy */
  /* Held on the pool from create to destroy (lifecycle.h): the pool's
   * destroy is -EBUSY meanwhile, so the timer thread, which may submit at
   * any tick, never touches a freed pool. */
  tko__attachment attach;
  /* The sweep task's owner (lifecycle.h): a sweep the pool cancels comes
   * back here (sweep_cancelled), never to the pool's on_cancel. */
  tko__task_owner sweep_owner;
};

/* The coalescer whose flush_fn runs on this thread (for -EDEADLK). */
static _Thread_local tko_coalescer *current_flush;

/* Every entry point's handle check: -EINVAL for NULL or a destroyed
 * coalescer, -ECHILD in a child forked after create (its timer thread
 * stayed in the parent, and its mutex may have been held at the fork). */
static int check(const tko_coalescer *c) {
  if (!c) return -EINVAL;
  assert(c->magic == COALESCER_MAGIC && "tko_coalescer: not a live coalescer (destroyed twice?)");
  if (c->magic != COALESCER_MAGIC) return -EINVAL;
  if (c->fork_gen != tko__fork_generation()) return -ECHILD;
  return 0;
}

static void set_free(const tko_allocator *a, dirty_set *s) {
  tko__mem_free(a, s->entries);
  tko__mem_free(a, s->slot_of);
  tko__mem_free(a, s->index);
  memset(s, 0, sizeof *s);
}

/* Finds key's slot: the one holding it, or the empty slot ending its probe. */
static size_t set_probe(const dirty_set *s, uint64_t key) {
  size_t h = (size_t)tko__mix64(key) & s->mask;
  for (;;) {
    uint32_t e = s->index[h];
    if (!e || s->entries[e - 1].key == key) return h;
    h = (h + 1) & s->mask;
  }
}

/* Resizes to `cap` entries (>= n) and an index twice that, rounded up to a
 * power of two, so the index is at most half full. All or nothing. */
static int set_resize(const tko_allocator *a, dirty_set *s, size_t cap) {
  size_t slots = 2;
  while (slots < cap * 2) {
    if (slots > (SIZE_MAX >> 2) / sizeof(uint32_t)) return -ENOMEM;
    slots <<= 1;
  }
  if (cap > UINT32_MAX - 1 || cap > SIZE_MAX / sizeof(tko_coalesce_entry)) return -ENOMEM;
  tko_coalesce_entry *e = tko__mem_alloc(a, cap * sizeof *e);
  size_t *so = tko__mem_alloc(a, cap * sizeof *so);
  uint32_t *ix = tko__mem_alloc(a, slots * sizeof *ix);
  if (!e || !so || !ix) {
    tko__mem_free(a, e);
    tko__mem_free(a, so);
    tko__mem_free(a, ix);
    return -ENOMEM;
  }
  memset(ix, 0, slots * sizeof *ix);
  if (s->n) memcpy(e, s->entries, s->n * sizeof *e);
  tko__mem_free(a, s->entries);
  tko__mem_free(a, s->slot_of);
  tko__mem_free(a, s->index);
  s->entries = e;
  s->slot_of = so;
  s->index = ix;
  s->cap = cap;
  s->mask = slots - 1;
  for (size_t i = 0; i < s->n; i++) {
    size_t h = set_probe(s, e[i].key);
    ix[h] = (uint32_t)(i + 1);
    so[i] = h;
  }
  return 0;
}

static int set_mark(const tko_allocator *a, dirty_set *s, uint64_t key, uint64_t value) {
  size_t h = set_probe(s, key);
  if (s->index[h]) {
    s->entries[s->index[h] - 1].value = value; /* latest value wins */
    return 0;
  }
  if (s->n == s->cap) {
    if (s->cap > SIZE_MAX / 2) return -ENOMEM;
    int rc = set_resize(a, s, s->cap * 2);
    if (rc) return rc;
    h = set_probe(s, key);
  }
  s->entries[s->n] = (tko_coalesce_entry){.key = key, .value = value};
  s->index[h] = (uint32_t)(s->n + 1);
  s->slot_of[s->n] = h;
  s->n++;
  return 0;
}

/* Empties the set in O(entries), keeping its capacity. */
static void set_clear(dirty_set *s) {
  for (size_t i = 0; i < s->n; i++)
    s->index[s->slot_of[i]] = 0;
  s->n = 0;
}

/* A sweep's flush of n entries of s, on its way. */
typedef struct flushing {
  tko_coalescer *c, *outer; /* outer: current_flush before it */
  dirty_set *s;
  size_t n;
} flushing;

/* The end of a sweep, flush_fn returned or its thread ended: clears s,
 * counts the sweep and gives the token back (the last access to c by a
 * sweep task). */
static void end_sweep(flushing *f) {
  tko_coalescer *c = f->c;
  current_flush = f->outer;
  set_clear(f->s);
  tko__mutex_lock(&c->mu);
  if (f->n) {
    c->st.sweeps++;
    c->st.flushed += f->n;
    if (f->n > c->st.max_sweep) c->st.max_sweep = f->n;
  }
  c->running = false;
  pthread_cond_broadcast(&c->cv);
  tko__mutex_unlock(&c->mu);
}

/* A flush_fn that ends its thread on a worker (pthread_exit; taskorch.h:
 * a task may) unwinds through the sweep: its entries were handed over, so
 * the sweep ends as if flush_fn had returned, and the next sweep, flush
 * and close find the token (tests/api/test_attack_ext.c:
 * flush_fn_ending_its_worker_with_pthread_exit). */
static void sweep_exited(void *arg) { end_sweep(arg); }

/* Sweeps: called by the token holder with mu released; returns the token. */
static void sweep(tko_coalescer *c) {
  tko__mutex_lock(&c->mu);
  dirty_set *s = c->active;
  c->active = c->spare;
  c->spare = s;
  tko__mutex_unlock(&c->mu);
  flushing f = {.c = c, .outer = current_flush, .s = s, .n = s->n};
  if (f.n) {
    current_flush = c;
    tko__witness_assert_none_held(); /* the host's flush */
    /* A cleanup attribute (coalescer.c is built with -fexceptions). */
    pthread_cleanup_push(sweep_exited, &f);
    c->flush(c->user, s->entries, f.n);
    pthread_cleanup_pop(0);
  }
  end_sweep(&f);
}

/* Takes the sweep token; mu held (released while waiting). */
static void take_token(tko_coalescer *c) {
  while (c->running)
    tko__cond_wait(&c->cv, &c->mu);
  c->running = true;
}

static void sweep_cancelled(tko__task_owner *owner, void *arg);

static int sweep_task(void *arg) {
  tko_coalescer *c = arg;
  tko__mutex_lock(&c->mu);
  c->queued = false;
  if (c->running) { /* a flush is under way on another thread: it covers us */
    pthread_cond_broadcast(&c->cv);
    tko__mutex_unlock(&c->mu);
    return 0;
  }
  c->running = true;
  tko__mutex_unlock(&c->mu);
  sweep(c);
  return 0;
}

/* With mu held and `queued` set: if the pool has nothing queued or running,
 * the queued sweep task was dropped (a live one clears `queued` when it
 * starts, before the pool can count it finished, and the pool's idle check
 * errs only towards "busy"), so clear it. Releases mu meanwhile. */
static void check_dropped(tko_coalescer *c) {
  tko__mutex_unlock(&c->mu);
  bool idle = tko_pool_wait_idle(c->pool, 0) == 0;
  tko__mutex_lock(&c->mu);
  if (idle && c->queued) {
    c->queued = false;
    pthread_cond_broadcast(&c->cv);
  }
}

static void add_ms(struct timespec *ts, unsigned ms) {
  ts->tv_sec += ms / 1000;
  ts->tv_nsec += (long)(ms % 1000) * 1000000L;
  if (ts->tv_nsec >= 1000000000L) {
    ts->tv_sec++;
    ts->tv_nsec -= 1000000000L;
  }
}

/* Memory back after a burst (the queue does the same, see
 * tko_pool_trim): once ticks have found nothing dirty for IDLE_SHRINK_MS
 * of clock time (ticks come late on a loaded machine, so they are not
 * counted), or for one tick if the interval is longer, both sets go back to
 * initial_keys. Called by the timer thread with mu held; with nothing
 * dirty and no sweep queued or running, nobody else touches the sets. A
 * failed allocation keeps the larger set (set_resize is all or nothing).
 * tests/api/test_coalescer.c: coalescer/tables_shrink_back_after_a_burst. */
#define IDLE_SHRINK_MS 1000u

static void shrink_when_idle(tko_coalescer *c) {
  uint64_t now = tko__now_ns();
  if (!c->idle_since_ns) {
    c->idle_since_ns = now;
    if (c->interval_ms < IDLE_SHRINK_MS) return;
  } else if (now - c->idle_since_ns < (uint64_t)IDLE_SHRINK_MS * 1000000u) {
    return;
  }
  if (c->queued || c->running) return;
  for (int i = 0; i < 2; i++)
    if (c->sets[i].cap > c->initial_keys) set_resize(c->alloc, &c->sets[i], c->initial_keys);
}

static void *timer_main(void *arg) {
  tko_coalescer *c = arg;
  tko__thread_set_name("tko-coalesce");
  struct timespec next, now;
  clock_gettime(CLOCK_MONOTONIC, &next);
  add_ms(&next, c->interval_ms);
  tko__mutex_lock(&c->mu);
  while (!c->stop) {
    if (tko__cond_timedwait(&c->tick_cv, &c->mu, &next) != ETIMEDOUT) continue;
    /* Due. The next tick keeps the cadence, skipping ticks already missed. */
    clock_gettime(CLOCK_MONOTONIC, &now);
    add_ms(&next, c->interval_ms);
    if (tko__time_before(&next, &now)) {
      next = now;
      add_ms(&next, c->interval_ms);
    }
    if (c->active->n == 0) {
      shrink_when_idle(c);
      continue;
    }
    c->idle_since_ns = 0;
    if (c->queued && !c->running) check_dropped(c);
    if (c->queued || c->running) {
      c->st.skipped_ticks++;
      continue;
    }
    c->queued = true;
    tko__mutex_unlock(&c->mu);
    /* Never waits for room in a full TKO_FULL_BLOCK queue (timeout 0): the
     * thread that drains that queue may be the one closing this coalescer,
     * which joins this thread. A full queue is a refusal like any other. */
    int rc = tko__submit_owned(c->pool, &c->sweep_owner, sweep_task, c, c->weight, 0, true);
    tko__mutex_lock(&c->mu);
    if (rc == 0) continue;
    /* The pool refused (shut down, full, out of memory): sweep here. */
    c->queued = false;
    pthread_cond_broadcast(&c->cv);
    if (c->running) continue;
    c->running = true;
    c->st.inline_sweeps++;
    tko__mutex_unlock(&c->mu);
    sweep(c);
    tko__mutex_lock(&c->mu);
  }
  tko__mutex_unlock(&c->mu);
  return NULL;
}

/* The pool's shutdown resolves the coalescer (lifecycle.h) at once: a sweep
 * task still queued runs (DRAIN) or is cancelled by the pool, which tells
 * the coalescer; after the pool closes, the timer thread sweeps itself. */
static int pool_closing(tko__attachment *a, tko_shutdown_mode mode, long timeout_ms) {
  (void)a;
  (void)mode;
  (void)timeout_ms;
  return 0;
}

int tko_coalescer_create(tko_coalescer **out, tko_pool *pool, unsigned interval_ms,
                         tko_coalesce_flush_fn flush, void *user,
                         const tko_coalesce_options *opts) {
  if (!out) return -EINVAL;
  *out = NULL;
  if (!pool || !flush || interval_ms > TKO_MAX_COALESCE_INTERVAL_MS) return -EINVAL;
  tko_coalesce_options o;
  memset(&o, 0, sizeof o);
  if (opts) o = *opts;
  if (o.initial_keys > TKO_MAX_COALESCE_KEYS) return -EINVAL;
  if (!tko__allocator_valid(o.allocator)) return -EINVAL;
  if (!o.initial_keys) o.initial_keys = 64;
  const tko_allocator *a = o.allocator;
  tko_coalescer *c = tko__mem_alloc(a, sizeof *c);
  if (!c) return -ENOMEM;
  memset(c, 0, sizeof *c);
  c->magic = COALESCER_MAGIC;
  c->fork_gen = tko__fork_generation();
  c->pool = pool;
  c->interval_ms = interval_ms;
  c->flush = flush;
  c->user = user;
  c->weight = o.weight;
  c->alloc = a;
  c->initial_keys = o.initial_keys;
  c->active = &c->sets[0];
  c->spare = &c->sets[1];
  int rc = set_resize(a, &c->sets[0], o.initial_keys);
  if (!rc) rc = set_resize(a, &c->sets[1], o.initial_keys);
  pthread_condattr_t ca;
  bool sync_ok = false;
  if (!rc && !pthread_condattr_init(&ca)) {
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    if (!tko__mutex_init(&c->mu, TKO__RANK_COALESCER)) {
      if (!pthread_cond_init(&c->cv, NULL)) {
        if (!pthread_cond_init(&c->tick_cv, &ca))
          sync_ok = true;
        else
          pthread_cond_destroy(&c->cv);
      }
      if (!sync_ok) tko__mutex_destroy(&c->mu);
    }
    pthread_condattr_destroy(&ca);
    if (!sync_ok) rc = -ENOMEM;
  }
  bool attached = false;
  if (!rc) {
    c->attach.close = pool_closing;
    tko__owner_init(&c->sweep_owner, sweep_cancelled, false);
    rc = tko__attach(pool, &c->attach); /* -ESHUTDOWN once the pool's shutdown began */
    attached = rc == 0;
  }
  if (!rc && interval_ms) {
    /* A pool-style thread: default scheduling, asynchronous signals blocked,
     * and the thread-creation test seam applies. */
    if (tko__thread_create(&c->thread, timer_main, c))
      rc = -EAGAIN;
    else
      c->has_thread = true;
  }
  if (rc) {
    if (attached) tko__detach(pool, &c->attach);
    if (sync_ok) {
      pthread_cond_destroy(&c->tick_cv);
      pthread_cond_destroy(&c->cv);
      tko__mutex_destroy(&c->mu);
    }
    set_free(a, &c->sets[0]);
    set_free(a, &c->sets[1]);
    tko__mem_free(a, c);
    return rc;
  }
  *out = c;
  return 0;
}

int tko_coalescer_mark(tko_coalescer *c, uint64_t key, uint64_t value) {
  int bad = check(c);
  if (bad) return bad;
  tko__mutex_lock(&c->mu);
  int rc;
  if (c->closed) {
    c->st.rejected++;
    rc = -ESHUTDOWN;
  } else {
    rc = set_mark(c->alloc, c->active, key, value);
    if (!rc) c->st.marks++;
  }
  tko__mutex_unlock(&c->mu);
  return rc;
}

int tko_coalescer_flush(tko_coalescer *c) {
  int bad = check(c);
  if (bad) return bad;
  if (current_flush == c) return -EDEADLK;
  tko__mutex_lock(&c->mu);
  take_token(c);
  tko__mutex_unlock(&c->mu);
  sweep(c);
  return 0;
}

int tko_coalescer_close(tko_coalescer *c) {
  int bad = check(c);
  if (bad) return bad;
  if (current_flush == c) return -EDEADLK;
  tko__mutex_lock(&c->mu);
  c->closed = true;
  if (c->closing) { /* another close runs the final flush: wait for it */
    while (!c->close_done)
      tko__cond_wait(&c->cv, &c->mu);
    tko__mutex_unlock(&c->mu);
    return 0;
  }
  c->closing = true;
  c->stop = true;
  pthread_cond_signal(&c->tick_cv);
  tko__mutex_unlock(&c->mu);
  if (c->has_thread) pthread_join(c->thread, NULL);
  tko__mutex_lock(&c->mu);
  take_token(c);
  tko__mutex_unlock(&c->mu);
  sweep(c); /* the final flush: every accepted mark is in a table by now */
  tko__mutex_lock(&c->mu);
  c->close_done = true;
  pthread_cond_broadcast(&c->cv);
  tko__mutex_unlock(&c->mu);
  return 0;
}

static void sweep_dropped(tko_coalescer *c);

int tko_coalescer_destroy(tko_coalescer *c) {
  int bad = check(c);
  if (bad == -ECHILD) return 0; /* a forked child's copy: left alone, as the pool's */
  if (bad) return bad;
  if (current_flush == c) return -EDEADLK;
  if (tko_pool_wait_idle(c->pool, 0) == -EDEADLK) return -EDEADLK;
  tko_coalescer_close(c);
  /* A sweep task still queued has nothing left to flush (close's final
   * flush came after every mark): take it back rather than wait for the
   * pool to run it, which a paused pool would not. */
  void *sweep_arg;
  if (tko__withdraw_owned(c->pool, &c->sweep_owner, &sweep_arg, 1)) sweep_dropped(c);
  tko__mutex_lock(&c->mu);
  while (c->queued || c->running) {
    if (c->queued && !c->running) {
      check_dropped(c);
      if (!c->queued) continue;
    }
    tko__cond_wait(&c->cv, &c->mu);
  }
  tko__mutex_unlock(&c->mu);
  /* Detached first: a shutdown of the pool resolving the coalescer right
   * now (its close callback waits on cv) is waited for before the mutex
   * and conditions go. The pool may be freed from here on. */
  tko__detach(c->pool, &c->attach);
  pthread_cond_destroy(&c->tick_cv);
  pthread_cond_destroy(&c->cv);
  tko__mutex_destroy(&c->mu);
  set_free(c->alloc, &c->sets[0]);
  set_free(c->alloc, &c->sets[1]);
  c->magic = COALESCER_DEAD;
  tko__mem_free(c->alloc, c);
  return 0;
}

/* A queued sweep the pool dropped: the next tick or destroy may go on. */
static void sweep_dropped(tko_coalescer *c) {
  tko__mutex_lock(&c->mu);
  c->queued = false;
  pthread_cond_broadcast(&c->cv);
  tko__mutex_unlock(&c->mu);
}

static void sweep_cancelled(tko__task_owner *owner, void *arg) {
  (void)owner;
  sweep_dropped(arg);
}

int tko_coalescer_pool_cancelled(const tko_task_info *task) {
  if (!task || task->fn != sweep_task || !task->arg) return 0;
  tko_coalescer *c = task->arg;
  if (check(c)) return 0;
  sweep_dropped(c);
  return 1;
}

void tko_coalescer_stats(tko_coalescer *c, tko_coalesce_stats *out) {
  if (!c || !out) return;
  if (check(c)) {
    memset(out, 0, sizeof *out);
    return;
  }
  tko__mutex_lock(&c->mu);
  *out = c->st;
  out->dirty = c->active->n;
  tko__mutex_unlock(&c->mu);
}
