/* SPDX-License-Identifier: MIT */
/* libFuzzer harness for the whole public API, driven from two threads.
 *
 * Input: one header byte (the completion queue's size), then two op
 * streams separated by SEP; two threads run them at once (with
 * FUZZ_API_SEQUENTIAL=1 in the environment, one after the other, to tell a
 * race from a plain bug). Each op is one byte that picks it (`enum op`),
 * one byte for the pool slot, then its own arguments (see make_seeds.py).
 * The ops reach every public call of taskorch.h, taskorch/lanes.h,
 * taskorch/coalescer.h and taskorch/completion.h: pools created with fuzzed
 * options (hooks, bounded queues under each full policy, aging, an async
 * limit, placement, an allocator that fails chosen calls, invalid values);
 * single, timed, batch, keyed, group, handle and async submits; one-shot and
 * periodic timers and their cancel; task handles' cancel, wait (with a
 * short limit) and status; pause and resume; waits; the blocking
 * hint; stats and trim; shutdown in every mode, untimed and with a
 * deadline; destroy (also while lanes or a coalescer are attached); lane
 * tables; coalescers; the completion queue; errors and invalid arguments.
 *
 * Calls that can block are made, not steered around. The main thread
 * plays the host's part in unblocking them: when neither stream has
 * finished an op for a few ticks it resumes every pool and completes the
 * async tasks held in flight (a blocked submit, an untimed wait or
 * shutdown then returns). It is also the watchdog: an op that takes longer
 * than FUZZ_API_BOUND_MS (default 15 s) is a finding (abort).
 *
 * The shadow model (tokens, one per task) checks, besides "no crash, no
 * sanitizer report, no hang":
 * - exactly once: every accepted task runs or reaches on_cancel exactly
 *   once; a refused one never does; a periodic timer's argument reaches
 *   on_cancel at most once; every accepted completion is delivered once;
 * - order, where the pool promises it (one worker, no elastic ones, no
 *   caller-runs): per submitting thread, tasks of equal weight start in
 *   submit order; tasks a thread submitted into a pool it had paused, with
 *   no resume in between, start by weight (descending), then submit order
 *   (unless the pool's allocator fails: see accepted());
 * - keyed tasks (tko_submit_keyed, tko_lanes_submit): per key, no two run
 *   at once, and one thread's tasks start in its submit order;
 * - the coalescer: a sweep flushes distinct keys, a key's values follow its
 *   marks, and the last value flushed is the last mark;
 * - stats stay within the options and, once a pool is quiet,
 *   completed + cancelled == submitted with nothing queued or running;
 * - a task handle: once its task has ended (a wait returned 0, its status
 *   is no longer -EINPROGRESS, or its pool is gone), the status says what
 *   happened - -ECANCELED exactly when the task reached on_cancel and never
 *   ran, else what the task returned - and a cancel that returned 0 ended
 *   it cancelled; a cancel that said -EBUSY (started) never did;
 * - every call returns one of its documented results.
 *
 * Locks of the harness (never held by tasks or hooks): a slot's rwlock
 * (read: any call on the pool or its lanes/coalescer; write: create and
 * destroy of those), then a group's or a timer's mutex, a handle's rwlock
 * (write: its submit; read: cancel, wait, status, which the library lets
 * threads call at once), or the slot's pause mutex; a thread holds at most
 * one slot lock. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "taskorch.h"
#include "taskorch/coalescer.h"
#include "taskorch/completion.h"
#include "taskorch/lanes.h"

#define NPOOLS 3
#define NTOKENS 4096
#define NGROUPS 4
#define NTIMERS 8
#define NHANDLES 6
#define NHELD 256
#define NKEYS 5     /* keys of keyed and lane tasks */
#define NCOKEYS 16  /* coalescer keys */
#define NPOSTS 512  /* completions one stream posts */
#define MAX_OPS 160 /* per stream */
#define TICK_MS 2   /* the main thread's period */
#define STALL_TICKS 2
static const uint8_t SEP[4] = {0xb5, 0x5b, 0x5b, 0xb5};
#define POST_TOKEN (UINT64_C(1) << 63) /* a completion posted by a task */

#define CHECK(cond)                                                                     \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      fprintf(stderr, "fuzz_api: check failed at line %d: %s\n", __LINE__, #cond);      \
      abort();                                                                          \
    }                                                                                   \
  } while (0)

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- input reader ------------------------------------------------------------- */

typedef struct input {
  const uint8_t *p;
  size_t n;
} input;

static uint8_t u8(input *in) {
  if (!in->n) return 0;
  in->n--;
  return *in->p++;
}

static uint32_t u32(input *in) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) v = v << 8 | u8(in);
  return v;
}

static int weight(input *in) {
  uint8_t b = u8(in);
  switch (b % 8) {
    case 0: return INT_MAX;
    case 1: return INT_MIN;
    case 2: return (int)u32(in);
    default: return (int)(b % 16) - 8;
  }
}

/* ---- streams: the two op threads ------------------------------------------------ */

typedef struct stream {
  int id;
  input in;
  uint32_t seq;                /* submit order of this stream's tasks, from 1 */
  uint32_t post_seq, mark_seq; /* its completions and coalescer marks */
  /* Pause windows: after this stream paused pool i, with the pool's epoch
   * then win_epoch[i], its submits are in window win_id[i] while the epoch
   * stays the same (no resume or shutdown since). */
  bool win_open[NPOOLS];
  unsigned win_epoch[NPOOLS];
  uint32_t win_id[NPOOLS];
  _Atomic uint64_t op_start; /* watchdog: when the current op began, 0 = none */
  const char *_Atomic op_name;
  atomic_uint ops; /* ops finished: the main thread's progress gauge */
  pthread_t th;
} stream;

static stream streams[2];
static _Thread_local stream *cur; /* the stream this thread runs, NULL for others */
static atomic_uint next_window;

/* ---- tokens: one per task ------------------------------------------------------- */

enum kind { K_PLAIN, K_FAIL, K_NESTED, K_SELF, K_BLOCKING, K_SPIN, K_POST, NKINDS };
enum table { T_NONE, T_KEYED, T_LANES };

typedef struct token {
  atomic_int runs, cancels;
  atomic_bool accepted;
  bool periodic;   /* a periodic timer's task: runs any number of times */
  bool maybe_lost; /* async on a failing allocator: may fail to start */
  bool ordered;    /* submitted where the pool promises order (see top) */
  bool by_weight;  /* in a pause window of a pool without aging */
  int kind, status, slot, weight;
  int thread;      /* submitting stream, -1 for tasks and hooks */
  uint32_t seq;    /* submit order within its stream */
  uint32_t window; /* pause window, 0 = none */
  uint32_t gen;    /* incarnation of its pool slot */
  int table, key;  /* keyed tasks: which table (enum table), which key */
  atomic_ullong run_at;        /* run clock at its first start */
  atomic_int posted, delivered; /* K_POST: completions accepted, delivered */
} token;

static token tokens[NTOKENS];
static atomic_int next_token;
static atomic_ullong run_clock;

/* ---- pools ------------------------------------------------------------------------ */

typedef struct fail_alloc {
  atomic_long calls;
  uint64_t mask; /* call k (0..63) fails when bit k is set; later calls never */
  atomic_long live;
  tko_allocator al;
} fail_alloc;

typedef struct slot {
  pthread_rwlock_t lk;  /* see the top: read for calls, write for create/destroy */
  pthread_mutex_t pm;   /* pause, resume and epoch (a leaf lock) */
  tko_pool *_Atomic pool;
  atomic_uint gen;      /* incarnation: +1 at every create */
  tko_options o;        /* wr */
  bool failing;         /* wr: the allocator fails some calls */
  bool ordered;         /* wr: one worker, no elastic, no caller-runs */
  atomic_bool closing;  /* a shutdown was called */
  atomic_bool auto_complete; /* async tasks complete at once (under held_mu) */
  atomic_int timers_armed;
  atomic_int shutting;    /* shutdown calls of the streams under way */
  atomic_uint shutdowns;  /* shutdown calls of the streams begun */
  unsigned epoch;       /* pm: resumes and shutdowns begun */
  tko_lanes *lanes;     /* wr */
  unsigned nlanes;      /* its table size */
  tko_coalescer *co;    /* wr */
  uint64_t co_marked[2][NCOKEYS];      /* per stream, last accepted mark */
  uint32_t co_flushed_seq[2][NCOKEYS]; /* per stream, last seq flushed */
  _Atomic uint64_t co_flushed[NCOKEYS]; /* last value flushed */
  fail_alloc fa;
  char name[16];
} slot;

static slot slots[NPOOLS];

/* Per key, to check exclusion and per-stream order of keyed tasks. */
typedef struct keyed_state {
  atomic_int inflight;
  uint32_t last[2]; /* seq of the last task of each stream that started */
} keyed_state;

static keyed_state keyed[NPOOLS][2][NKEYS];

/* Async tasks held in flight until the input, or the rescuer, completes them. */
static pthread_mutex_t held_mu = PTHREAD_MUTEX_INITIALIZER; /* protects held, nheld */
static struct held {
  tko_async *op;
  int slot;
} held[NHELD];
static int nheld;

/* The completion queue, made before the streams start, destroyed after. */
static tko_cq *cq;
static atomic_uchar posted[2][NPOSTS];
static atomic_uchar delivered[2][NPOSTS];

static void *fa_alloc(void *ctx, size_t size) {
  fail_alloc *f = ctx;
  long k = atomic_fetch_add(&f->calls, 1);
  if (k < 64 && (f->mask >> k & 1)) return NULL;
  void *p = malloc(size ? size : 1);
  if (p) atomic_fetch_add(&f->live, 1);
  return p;
}

static void *fa_realloc(void *ctx, void *ptr, size_t size) {
  fail_alloc *f = ctx;
  long k = atomic_fetch_add(&f->calls, 1);
  if (k < 64 && (f->mask >> k & 1)) return NULL;
  void *p = realloc(ptr, size ? size : 1);
  if (p && !ptr) atomic_fetch_add(&f->live, 1);
  return p;
}

static void fa_free(void *ctx, void *ptr) {
  fail_alloc *f = ctx;
  if (!ptr) return;
  atomic_fetch_sub(&f->live, 1);
  free(ptr);
}

static token *token_new(int kind, int slot) {
  int i = atomic_fetch_add(&next_token, 1);
  if (i >= NTOKENS) return NULL;
  token *t = &tokens[i];
  t->kind = kind;
  t->slot = slot;
  t->gen = atomic_load(&slots[slot].gen);
  t->thread = cur ? cur->id : -1;
  t->seq = cur ? ++cur->seq : 0;
  return t;
}

static bool is_token(const void *p) {
  return p >= (const void *)tokens && p < (const void *)(tokens + NTOKENS);
}

/* A submit of t was accepted: mark it, and put it in the stream's pause
 * window of the pool if the window is still open. */
static void accepted(slot *s, int si, token *t) {
  atomic_store(&t->accepted, true);
  if (!cur || !t->ordered || !cur->win_open[si]) return;
  pthread_mutex_lock(&s->pm);
  bool same = s->epoch == cur->win_epoch[si];
  pthread_mutex_unlock(&s->pm);
  if (!same) {
    cur->win_open[si] = false;
    return;
  }
  t->window = cur->win_id[si];
  /* Not on a failing allocator: a queue that cannot grow runs what it
   * moved before heavier tasks still in their rings (SEMANTICS.md). */
  t->by_weight = s->o.aging_ms == 0 && !s->failing;
}

static void check_submit_rc(const slot *s, int rc) {
  if (rc && rc != -ESHUTDOWN && rc != -EAGAIN && rc != -ETIMEDOUT && rc != -ENOMEM)
    fprintf(stderr, "fuzz_api: submit returned %d (%s)\n", rc, tko_strerror(rc));
  CHECK(rc == 0 || rc == -ESHUTDOWN || rc == -EAGAIN || rc == -ETIMEDOUT ||
        (rc == -ENOMEM && s->failing));
  if (rc == -EAGAIN) CHECK(s->o.queue_capacity > 0);
}

/* True if the calling thread is one of some pool's workers. */
static bool on_worker(void) {
  if (tko_blocking_begin() != 0) return false;
  tko_blocking_end();
  return true;
}

/* Resume and shutdown both end a pause window: they move the epoch, under
 * the pause mutex, before they take effect. */
static void slot_resume(slot *s, tko_pool *p) {
  pthread_mutex_lock(&s->pm);
  s->epoch++;
  CHECK(tko_pool_resume(p) == 0);
  pthread_mutex_unlock(&s->pm);
}

static void slot_pause(slot *s, int si, tko_pool *p) {
  pthread_mutex_lock(&s->pm);
  CHECK(tko_pool_pause(p) == 0);
  if (cur && !atomic_load(&s->closing)) {
    cur->win_open[si] = true;
    cur->win_epoch[si] = s->epoch;
    cur->win_id[si] = atomic_fetch_add(&next_window, 1) + 1;
  }
  pthread_mutex_unlock(&s->pm);
}

static void slot_closing(slot *s) {
  pthread_mutex_lock(&s->pm);
  atomic_store(&s->closing, true);
  s->epoch++;
  pthread_mutex_unlock(&s->pm);
}

/* ---- tasks -------------------------------------------------------------------------- */

static int task_fn(void *arg);

static void turn_on_own_pool(tko_pool *p) {
  CHECK(tko_pool_wait_idle(p, 0) == -EDEADLK);
  CHECK(tko_pool_wait_idle(p, -1) == -EDEADLK);
  CHECK(tko_pool_shutdown(p, TKO_DRAIN) == -EDEADLK);
  CHECK(tko_pool_shutdown(p, TKO_CANCEL) == -EDEADLK);
  CHECK(tko_pool_shutdown_timed(p, TKO_DRAIN, -1) == -EDEADLK);
  CHECK(tko_pool_destroy(p) == -EDEADLK);
}

static int task_body(token *t) {
  slot *s = &slots[t->slot];
  tko_pool *p = atomic_load(&s->pool);
  switch (t->kind) {
    case K_FAIL: return t->status ? t->status : 1;
    case K_NESTED: {
      token *n = token_new(K_PLAIN, t->slot);
      if (!n || !p) break;
      int rc = tko_submit(p, task_fn, n, t->status);
      check_submit_rc(s, rc);
      if (rc == 0) atomic_store(&n->accepted, true);
      break;
    }
    case K_SELF:
      if (p) turn_on_own_pool(p);
      break;
    case K_BLOCKING:
      if (tko_blocking_begin() == 0) {
        sched_yield();
        CHECK(tko_blocking_end() == 0);
      } else {
        CHECK(tko_blocking_end() == -EPERM);
      }
      break;
    case K_SPIN:
      for (volatile int i = 0; i < 200 * (t->status & 15); i++) {
      }
      break;
    case K_POST: {
      int rc = tko_cq_post(cq, POST_TOKEN | (uint64_t)(t - tokens), t->status, t);
      CHECK(rc == 0 || rc == -EAGAIN);
      if (rc == 0) atomic_fetch_add(&t->posted, 1);
      break;
    }
    default: break;
  }
  return 0;
}

static int task_fn(void *arg) {
  token *t = arg;
  unsigned long long at = atomic_fetch_add(&run_clock, 1) + 1;
  if (atomic_fetch_add(&t->runs, 1) == 0) atomic_store(&t->run_at, at);
  /* Nothing of a timer runs after its argument reached on_cancel. */
  if (t->periodic) CHECK(atomic_load(&t->cancels) == 0);
  keyed_state *k = t->table ? &keyed[t->slot][t->table - 1][t->key] : NULL;
  if (k) {
    if (atomic_fetch_add(&k->inflight, 1) != 0) {
      fprintf(stderr, "fuzz_api: two tasks of key %d (table %d) run at once\n", t->key, t->table);
      abort();
    }
    if (t->thread >= 0) {
      if (t->seq <= k->last[t->thread])
        fprintf(stderr, "fuzz_api: key %d (table %d): task %u started after %u\n", t->key,
                t->table, t->seq, k->last[t->thread]);
      CHECK(t->seq > k->last[t->thread]);
      k->last[t->thread] = t->seq;
    }
  }
  int rc = task_body(t);
  if (k) atomic_fetch_sub(&k->inflight, 1);
  return rc;
}

static int async_fn(tko_async *op, void *arg) {
  token *t = arg;
  atomic_fetch_add(&t->runs, 1);
  CHECK(tko_async_arg(op) == arg);
  if (t->kind == K_FAIL) return t->status ? t->status : 1; /* fails to start */
  slot *s = &slots[t->slot];
  pthread_mutex_lock(&held_mu);
  if (!atomic_load(&s->auto_complete) && nheld < NHELD) {
    held[nheld++] = (struct held){op, t->slot};
    pthread_mutex_unlock(&held_mu);
    return 0;
  }
  pthread_mutex_unlock(&held_mu);
  CHECK(tko_async_complete(op, t->status & 1) == 0);
  return 0;
}

/* Completes the held async tasks of slot si (all slots: -1) and, if
 * make_auto, makes that slot's future ones complete at once. */
static void complete_held(int si, bool make_auto) {
  struct held mine[NHELD];
  int n = 0;
  pthread_mutex_lock(&held_mu);
  if (make_auto && si >= 0) atomic_store(&slots[si].auto_complete, true);
  for (int i = 0; i < nheld;) {
    if (si < 0 || held[i].slot == si) {
      mine[n++] = held[i];
      held[i] = held[--nheld];
    } else {
      i++;
    }
  }
  pthread_mutex_unlock(&held_mu);
  for (int i = 0; i < n; i++) CHECK(tko_async_complete(mine[i].op, 0) == 0);
}

/* ---- hooks ------------------------------------------------------------------------------ */

static void on_cancel(void *user, const tko_task_info *info) {
  (void)user;
  if (is_token(info->arg)) {
    atomic_fetch_add(&((token *)info->arg)->cancels, 1);
    return;
  }
  /* Lane runners and sweep tasks never reach here any more; the calls
   * stay harmless for hooks written before that. */
  CHECK(tko_lanes_pool_cancelled(info) == 0);
  CHECK(tko_coalescer_pool_cancelled(info) == 0);
}

static void task_hook(void *user, const tko_task_info *info) {
  slot *s = user;
  tko_pool *p = atomic_load(&s->pool);
  CHECK(info->fn != NULL);
  if (p && on_worker()) CHECK(tko_pool_wait_idle(p, 0) == -EDEADLK);
}

static void thread_hook(void *user, unsigned index, tko_worker_kind kind) {
  slot *s = user;
  CHECK(kind == TKO_WORKER_BASIC || kind == TKO_WORKER_ELASTIC);
  /* Basic workers hold slots [0, workers) here (these pools are never
   * resized); an elastic one may take any elastic slot of the pool's
   * max_threads (tko_pool_resize's reserve), a retiring one's not yet free. */
  CHECK(kind == TKO_WORKER_BASIC ? index < s->o.workers : index < TKO_MAX_WORKERS + TKO_MAX_ELASTIC);
  tko_pool *p = atomic_load(&s->pool);
  if (p) CHECK(tko_pool_wait_idle(p, 0) == -EDEADLK);
}

static void thread_stop_submit(void *user, unsigned index, tko_worker_kind kind) {
  thread_hook(user, index, kind);
  slot *s = user;
  tko_pool *p = atomic_load(&s->pool);
  token *t = p ? token_new(K_PLAIN, (int)(s - slots)) : NULL;
  if (!t) return;
  int rc = tko_submit(p, task_fn, t, 0);
  check_submit_rc(s, rc);
  if (rc == 0) atomic_store(&t->accepted, true);
}

/* ---- lane, coalescer and completion callbacks --------------------------------------------- */

static void lane_cancel(void *user, const tko_lane_task *t) {
  (void)user;
  CHECK(is_token(t->arg));
  atomic_fetch_add(&((token *)t->arg)->cancels, 1);
}

/* Batch mode: the callback runs the tasks itself, oldest first. */
static void lane_batch(void *user, const tko_lane_batch *b) {
  slot *s = user;
  CHECK(b->count >= 1);
  CHECK(b->lane < s->nlanes);
  for (size_t i = 0; i < b->count; i++) task_fn(b->tasks[i].arg);
}

static void co_flush(void *user, const tko_coalesce_entry *e, size_t n) {
  slot *s = user;
  CHECK(n >= 1);
  for (size_t i = 0; i < n; i++) {
    CHECK(e[i].key < NCOKEYS);
    for (size_t j = 0; j < i && j < 16; j++) CHECK(e[j].key != e[i].key);
    unsigned th = (unsigned)(e[i].value >> 32) - 1;
    uint32_t seq = (uint32_t)e[i].value;
    CHECK(th < 2);
    /* Sweeps that flush a key never overlap: this is single-threaded per key. */
    CHECK(seq > s->co_flushed_seq[th][e[i].key]);
    s->co_flushed_seq[th][e[i].key] = seq;
    atomic_store(&s->co_flushed[e[i].key], e[i].value);
  }
}

/* One drain or take: per posting stream, completions come in post order. */
typedef struct drain_ctx {
  uint32_t last[2];
} drain_ctx;

static void deliver(void *user, const tko_completion *c) {
  drain_ctx *d = user;
  if (c->id & POST_TOKEN) {
    token *t = c->user;
    CHECK(is_token(t) && (uint64_t)(t - tokens) == (c->id & ~POST_TOKEN));
    CHECK(c->status == t->status);
    atomic_fetch_add(&t->delivered, 1);
    return;
  }
  unsigned th = (unsigned)(c->id >> 32);
  uint32_t seq = (uint32_t)c->id;
  CHECK(th < 2 && seq < NPOSTS);
  CHECK(c->user == &posted[th][seq]);
  CHECK(seq > d->last[th] || (seq == 0 && d->last[th] == 0 && !atomic_load(&delivered[th][0])));
  d->last[th] = seq;
  atomic_fetch_add(&delivered[th][seq], 1);
}

/* ---- stats invariants ------------------------------------------------------------------------ */

/* Whether "idle" stays idle: not with timers armed or a coalescer (they
 * submit on their own), nor with a thread_stop hook that submits while
 * elastic workers may retire. */
static bool stays_quiet(const slot *s) {
  return atomic_load(&s->timers_armed) == 0 && !s->co &&
         !(s->o.hooks.thread_stop == thread_stop_submit && s->o.max_elastic);
}

static void check_stats(slot *s, bool quiet) {
  tko_pool *p = atomic_load(&s->pool);
  tko_stats st;
  memset(&st, 0xab, sizeof st);
  tko_pool_stats(p, &st);
  /* A worker that cancels an async task it had taken (TKO_CANCEL began)
   * counts the cancel before it gives the in-flight slot back, so a quiet
   * pool may show async_inflight 1 for a moment (reported, not fixed here:
   * no public test can hold that window open). Allow it that moment. */
  for (uint64_t t0 = now_ns(); quiet && st.async_inflight && now_ns() - t0 < 2000000000u;) {
    sched_yield();
    tko_pool_stats(p, &st);
  }
  CHECK(st.basic_workers <= s->o.workers);
  CHECK(st.elastic_workers <= s->o.max_elastic);
  CHECK(st.elastic_peak <= s->o.max_elastic);
  CHECK(st.elastic_retired <= st.elastic_spawned);
  CHECK(st.failed <= st.completed);
  CHECK(st.completed + st.cancelled + st.queued + st.running <= st.submitted);
  if (s->o.queue_capacity) CHECK(st.queued <= s->o.queue_capacity);
  if (quiet) {
    if (st.completed + st.cancelled != st.submitted || st.queued || st.running || st.async_inflight)
      fprintf(stderr,
              "fuzz_api: quiet pool: submitted %llu completed %llu cancelled %llu queued %llu "
              "running %llu async_inflight %u\n",
              (unsigned long long)st.submitted, (unsigned long long)st.completed,
              (unsigned long long)st.cancelled, (unsigned long long)st.queued,
              (unsigned long long)st.running, st.async_inflight);
    CHECK(st.completed + st.cancelled == st.submitted);
    CHECK(st.queued == 0);
    CHECK(st.running == 0);
    CHECK(st.async_inflight == 0);
  }
}

/* ---- the program ------------------------------------------------------------------------------ */

enum op {
  OP_CREATE, OP_SUBMIT, OP_SUBMIT_TIMED, OP_BATCH, OP_GROUP_SUBMIT, OP_GROUP_WAIT, OP_GROUP_CANCEL,
  OP_TIMER_AFTER, OP_TIMER_EVERY, OP_TIMER_CANCEL, OP_ASYNC, OP_COMPLETE, OP_PAUSE, OP_RESUME,
  OP_WAIT, OP_WAIT_FOREVER, OP_SHUTDOWN, OP_DESTROY, OP_STATS, OP_LANES, OP_COALESCE, OP_MISC,
  OP_KEYED, OP_CQ, OP_HANDLE, NOPS
};

static const char *const op_names[NOPS] = {
  "create", "submit", "submit_timed", "batch", "group_submit", "group_wait", "group_cancel",
  "timer_after", "timer_every", "timer_cancel", "async", "complete", "pause", "resume",
  "wait", "wait_forever", "shutdown", "destroy", "stats", "lanes", "coalesce", "misc",
  "keyed", "cq", "handle"};

typedef struct group_slot {
  pthread_mutex_t mu; /* protects the rest and serialises calls on g */
  tko_group g;
  bool init;
  int slot; /* pool the members went to, -1 = none yet */
  uint32_t gen;
} group_slot;

static group_slot groups[NGROUPS];

typedef struct timer_slot {
  pthread_mutex_t mu; /* protects the rest and serialises calls on t */
  tko_timer t;
  int slot; /* pool it was last armed on, -1 = never */
  uint32_t gen;
  token *tok;
  bool periodic;
} timer_slot;

static timer_slot timers[NTIMERS];

typedef struct handle_slot {
  pthread_rwlock_t lk; /* write: a submit (re-arms h); read: the other calls on h */
  tko_handle h;
  int slot;            /* lk (write): pool its task went to, -1 = never armed */
  uint32_t gen;
  token *tok;
  atomic_bool cancel_won;   /* a cancel returned 0 */
  atomic_bool cancel_busy;  /* a cancel returned -EBUSY: it had started */
} handle_slot;

static handle_slot handles[NHANDLES];

/* Whether slot si still holds incarnation gen (else its pool is gone, and
 * with it every timer it had armed). */
static bool live(int si, uint32_t gen) {
  return si >= 0 && atomic_load(&slots[si].pool) && atomic_load(&slots[si].gen) == gen;
}

static void create_pool(input *in, int si) {
  slot *s = &slots[si];
  if (atomic_load(&s->pool)) return;
  uint8_t shape = u8(in);
  tko_options o;
  if (shape & 1) {
    unsigned workers = u8(in) % 4, max_elastic = u8(in) % 4, idle = 1 + u8(in) % 20;
    o = tko_elastic_options(workers, max_elastic, idle);
  } else {
    o = tko_basic_options(1 + u8(in) % 3);
  }
  static const size_t caps[] = {0, 1, 16, 17, 64, 300};
  o.initial_capacity = caps[u8(in) % 6];
  static const size_t bounds[] = {0, 0, 0, 1, 2, 8, 64};
  o.queue_capacity = bounds[u8(in) % 7];
  o.full_policy = (tko_full_policy)(u8(in) % 3);
  o.spin_yields = u8(in) % 16;
  uint8_t extra = u8(in);
  o.aging_ms = extra & 1 ? 1 + u8(in) % 10 : 0;
  o.max_async_inflight = extra >> 1 & 3;
  static const unsigned batches[] = {0, 1, 2, 4, 64};
  o.max_batch = batches[(extra >> 3) % 5];
  size_t nlen = u8(in) % 14;
  for (size_t i = 0; i < nlen; i++) s->name[i] = (char)(u8(in) | 1);
  s->name[nlen] = '\0';
  o.name = nlen ? s->name : NULL;
  uint8_t hooks = u8(in);
  o.hooks.user = s;
  o.hooks.on_cancel = on_cancel;
  if (hooks & 1) o.hooks.before_run = task_hook;
  if (hooks & 2) o.hooks.after_run = task_hook;
  if (hooks & 4) o.hooks.on_failure = task_hook;
  if (hooks & 8) o.hooks.thread_start = thread_hook;
  if (hooks & 16) o.hooks.thread_stop = hooks & 32 ? thread_stop_submit : thread_hook;
  memset(&s->fa, 0, sizeof s->fa);
  s->failing = false;
  if (hooks & 64) {
    s->fa.al = (tko_allocator){fa_alloc, fa_realloc, fa_free, &s->fa};
    for (int i = 0; i < 8; i++) s->fa.mask = s->fa.mask << 8 | u8(in);
    s->failing = s->fa.mask != 0;
    o.allocator = &s->fa.al;
  }
  /* Placement: the CPU this thread runs on, a small stack. */
  static unsigned cpu;
  if (hooks & 128) {
    int c = sched_getcpu();
    cpu = c >= 0 ? (unsigned)c : 0;
    o.cpus = &cpu;
    o.ncpus = 1;
    o.stack_size = TKO_MIN_STACK_SIZE;
  }
  /* Now and then an invalid option: refused, nothing created. */
  uint8_t bad = u8(in);
  int expect_einval = 0;
  if (bad == 0xf1) o.workers = TKO_MAX_WORKERS + 1, expect_einval = 1;
  if (bad == 0xf2) o.max_elastic = TKO_MAX_ELASTIC + 1, expect_einval = 1;
  if (bad == 0xf3) o.full_policy = (tko_full_policy)3, expect_einval = 1;
  if (bad == 0xf4) o.elastic_idle_ms = TKO_MAX_IDLE_MS + 1, expect_einval = 1;
  if (bad == 0xf5) o.initial_capacity = ((size_t)1 << 30) + 1, expect_einval = 1;
  if (bad == 0xf6) o.max_batch = 65, expect_einval = 1;
  if (bad == 0xf7) o.stack_size = 4096, expect_einval = 1;
  if (o.workers == 0 && o.max_elastic == 0) expect_einval = 1;
  s->o = o;
  tko_pool *p = (tko_pool *)s; /* create must reset it on failure */
  int rc = tko_pool_create(&p, &o);
  if (expect_einval) {
    CHECK(rc == -EINVAL);
    CHECK(p == NULL);
    return;
  }
  CHECK(rc == 0 || (rc == -ENOMEM && s->failing) || (rc == -EAGAIN && o.stack_size));
  if (rc) {
    CHECK(p == NULL);
    CHECK(atomic_load(&s->fa.live) == 0);
    return;
  }
  s->ordered = o.workers == 1 && o.max_elastic == 0 &&
               !(o.queue_capacity && o.full_policy == TKO_FULL_CALLER_RUNS);
  atomic_store(&s->closing, false);
  atomic_store(&s->timers_armed, 0);
  atomic_store(&s->shutting, 0);
  atomic_store(&s->shutdowns, 0);
  atomic_store(&s->auto_complete, false);
  s->lanes = NULL;
  s->co = NULL;
  atomic_fetch_add(&s->gen, 1);
  atomic_store(&s->pool, p);
}

static void destroy_lanes(slot *s) {
  tko_pool *p = atomic_load(&s->pool);
  if (!s->lanes) return;
  /* Documented: on a paused pool with runners queued, destroy waits for a
   * resume by another thread; this thread is the host here. */
  slot_resume(s, p);
  CHECK(tko_lanes_destroy(s->lanes) == 0);
  s->lanes = NULL;
}

static void destroy_coalescer(slot *s) {
  tko_pool *p = atomic_load(&s->pool);
  if (!s->co) return;
  slot_resume(s, p); /* as for lanes */
  CHECK(tko_coalescer_destroy(s->co) == 0);
  s->co = NULL;
  /* The final flush passed every key its last mark. */
  for (int k = 0; k < NCOKEYS; k++) {
    uint64_t m0 = s->co_marked[0][k], m1 = s->co_marked[1][k];
    if (!m0 && !m1) continue;
    uint64_t f = atomic_load(&s->co_flushed[k]);
    if (f != m0 && f != m1)
      fprintf(stderr, "fuzz_api: coalescer key %d: last flushed %llx, last marks %llx %llx\n", k,
              (unsigned long long)f, (unsigned long long)m0, (unsigned long long)m1);
    CHECK(f == m0 || f == m1);
  }
}

/* Destroys the pool of slot si (held for writing): in one of several ways,
 * chosen by how. */
static void destroy_pool(int si, uint8_t how) {
  slot *s = &slots[si];
  tko_pool *p = atomic_load(&s->pool);
  if (!p) return;
  int rc;
  switch (how % 5) {
    case 1: /* a deadline, then cancel what is left without waiting */
    case 2: {
      slot_closing(s);
      tko_shutdown_mode m = how % 5 == 1 ? TKO_DRAIN : TKO_CANCEL;
      rc = tko_pool_shutdown_timed(p, m, (long)(how >> 4 & 3));
      CHECK(rc == 0 || rc == -ETIMEDOUT);
      if (rc) CHECK(tko_pool_shutdown_timed(p, TKO_CANCEL_NOWAIT, (long)(how >> 6)) == 0);
      break;
    }
    case 3: /* destroy while lanes or a coalescer hold the pool */
      if (s->lanes || s->co) {
        slot_closing(s);
        complete_held(si, true); /* destroy's shutdown waits without limit */
        slot_resume(s, p);
        CHECK(tko_pool_destroy(p) == -EBUSY);
      }
      break;
    case 4:
      slot_closing(s);
      CHECK(tko_pool_shutdown_timed(p, TKO_CANCEL_NOWAIT, 0) == 0);
      break;
    default: break;
  }
  destroy_lanes(s);
  destroy_coalescer(s);
  complete_held(si, true); /* the host completes what it holds */
  /* A pause that came after an earlier shutdown call began holds the drain
   * that destroy completes, and the rescuer cannot get in here: resume. */
  slot_resume(s, p);
  slot_closing(s);
  CHECK(tko_pool_destroy(p) == 0);
  atomic_store(&s->pool, NULL);
  CHECK(atomic_load(&s->fa.live) == 0);
  /* Groups of this pool: every member is done. They are destroyed here,
   * because a group remembers its pool (tko_group_cancel on it would touch
   * the freed pool). */
  uint32_t gen = atomic_load(&s->gen);
  for (int i = 0; i < NGROUPS; i++) {
    group_slot *g = &groups[i];
    pthread_mutex_lock(&g->mu);
    if (g->init && g->slot == si && g->gen == gen) {
      CHECK(tko_group_wait(&g->g, 0) == 0);
      CHECK(tko_group_pending(&g->g) == 0);
      CHECK(tko_group_destroy(&g->g) == 0);
      g->init = false;
    }
    pthread_mutex_unlock(&g->mu);
  }
}

static void op_submit(input *in, slot *s, int si, int how) {
  tko_pool *p = atomic_load(&s->pool);
  uint8_t k = u8(in);
  token *t = token_new(k % NKINDS, si);
  if (!t) return;
  t->status = (int)(u8(in) % 5);
  t->weight = weight(in);
  t->ordered = s->ordered;
  int rc;
  if (how == 1) {
    long timeout = (long)(u8(in) % 4) - 1; /* -1 .. 2 ms */
    rc = tko_submit_timed(p, task_fn, t, t->weight, timeout);
    if (rc == -ETIMEDOUT) CHECK(s->o.queue_capacity && s->o.full_policy == TKO_FULL_BLOCK);
  } else {
    rc = tko_submit(p, task_fn, t, t->weight); /* may wait for room, without limit */
    CHECK(rc != -ETIMEDOUT);
  }
  check_submit_rc(s, rc);
  if (rc == 0) accepted(s, si, t);
}

static void op_keyed(input *in, slot *s, int si) {
  tko_pool *p = atomic_load(&s->pool);
  static const int kinds[] = {K_PLAIN, K_FAIL, K_NESTED, K_SPIN, K_POST, K_BLOCKING};
  token *t = token_new(kinds[u8(in) % 6], si);
  if (!t) return;
  t->status = (int)(u8(in) % 5);
  t->table = T_KEYED;
  t->key = u8(in) % NKEYS;
  t->weight = weight(in);
  int rc = tko_submit_keyed(p, (uint64_t)t->key, task_fn, t, t->weight);
  CHECK(rc == 0 || rc == -ESHUTDOWN || rc == -EAGAIN || (rc == -ENOMEM && s->failing));
  if (rc == -EAGAIN) CHECK(s->o.queue_capacity > 0);
  if (rc == 0) atomic_store(&t->accepted, true);
}

static void op_batch(input *in, slot *s, int si) {
  tko_pool *p = atomic_load(&s->pool);
  uint8_t b = u8(in);
  size_t n = b % 40;
  if (b == 0xff) n = 1025 + u8(in) % 200; /* larger than the inbox */
  tko_task tasks[1300];
  token *toks[1300];
  int bad = u8(in) % 8 == 0 ? (int)(u8(in) % (n ? n : 1)) : -1;
  int wbase = (int)(u8(in) % 5);
  for (size_t i = 0; i < n; i++) {
    toks[i] = token_new(K_PLAIN + (int)(i % 3 == 2), si);
    if (!toks[i]) return;
    toks[i]->weight = (int)((i + (size_t)wbase) % 7) - 3;
    toks[i]->ordered = s->ordered;
    tasks[i] = (tko_task){task_fn, toks[i], toks[i]->weight};
  }
  if (n && bad >= 0) tasks[bad].fn = NULL;
  int rc = tko_submit_batch(p, n ? tasks : NULL, n);
  if (n == 0 || bad >= 0) {
    CHECK(rc == -EINVAL);
    return;
  }
  check_submit_rc(s, rc);
  CHECK(rc != -ETIMEDOUT);
  if (rc == -EAGAIN) CHECK(s->o.full_policy == TKO_FULL_REJECT || n > s->o.queue_capacity);
  if (rc == 0)
    for (size_t i = 0; i < n; i++) accepted(s, si, toks[i]);
}

static void op_group(input *in, int op, slot *s, int si) {
  group_slot *g = &groups[u8(in) % NGROUPS];
  tko_pool *p = atomic_load(&s->pool);
  pthread_mutex_lock(&g->mu);
  if (!g->init) {
    CHECK(tko_group_init(&g->g) == 0);
    g->init = true;
    g->slot = -1;
  }
  /* A group bound to another pool is that pool's (this thread holds no
   * lock on it): only a submit, refused, touches it from here. */
  bool mine = g->slot < 0 || (g->slot == si && g->gen == atomic_load(&s->gen));
  switch (op) {
    case OP_GROUP_SUBMIT: {
      bool async = u8(in) & 1;
      token *t = token_new(u8(in) % 2 ? K_FAIL : K_PLAIN, si);
      if (!t) break;
      t->status = 1 + (int)(u8(in) % 3);
      t->maybe_lost = async && s->failing;
      t->weight = weight(in);
      t->ordered = !async && s->ordered;
      bool bound_elsewhere = !mine && tko_group_pending(&g->g) > 0;
      int rc = async ? tko_group_submit_async(p, &g->g, async_fn, t, t->weight)
                     : tko_group_submit(p, &g->g, task_fn, t, t->weight);
      if (bound_elsewhere && rc == -EINVAL) break; /* (its members may also have
                                                       finished meanwhile) */
      check_submit_rc(s, rc);
      if (rc == 0) {
        accepted(s, si, t);
        g->slot = si;
        g->gen = atomic_load(&s->gen);
      }
      break;
    }
    case OP_GROUP_WAIT: {
      if (!mine) break;
      long timeout = (long)(u8(in) % 4) - 1; /* -1 (no limit) .. 2 ms */
      int rc = tko_group_wait(&g->g, timeout);
      CHECK(rc == 0 || (rc == -ETIMEDOUT && timeout >= 0));
      int st = tko_group_status(&g->g);
      CHECK(st == 0 || st == -ECANCELED || st == -ENOMEM || (st >= 1 && st <= 3));
      if (u8(in) % 4 == 0) {
        int d = tko_group_destroy(&g->g); /* -EBUSY, unless the last member just finished */
        CHECK(d == 0 || (d == -EBUSY && rc != 0));
        if (d == 0) g->init = false;
      }
      break;
    }
    case OP_GROUP_CANCEL:
      if (mine) CHECK(tko_group_cancel(&g->g) >= 0);
      break;
  }
  pthread_mutex_unlock(&g->mu);
}

/* The handle's task has ended (a wait returned 0 or its pool is gone):
 * its status matches its token and the cancels' answers. */
static void handle_ended(handle_slot *hs) {
  token *t = hs->tok;
  int st = tko_handle_status(&hs->h);
  CHECK(st != -EINPROGRESS);
  CHECK(tko_handle_wait(&hs->h, 0) == 0);
  if (!t) return;
  int r = atomic_load(&t->runs), c = atomic_load(&t->cancels);
  if (st == -ECANCELED) {
    if (r != 0 || c != 1)
      fprintf(stderr, "fuzz_api: handle ended cancelled, its task ran %d, cancelled %d\n", r, c);
    CHECK(r == 0 && c == 1);
    CHECK(!atomic_load(&hs->cancel_busy));
  } else {
    if (r != 1 || c != 0 || atomic_load(&hs->cancel_won))
      fprintf(stderr, "fuzz_api: handle ended with %d, its task ran %d, cancelled %d%s\n", st, r,
              c, atomic_load(&hs->cancel_won) ? " after a cancel that won" : "");
    CHECK(r == 1 && c == 0 && !atomic_load(&hs->cancel_won));
    CHECK(st == (t->kind == K_FAIL ? (t->status ? t->status : 1) : 0));
  }
}

/* Whether the handle's task may still be unfinished and its pool is not
 * slot si's current one (held for reading by the caller): its pool may be
 * destroyed at any moment, so only status may be read. */
static bool handle_foreign(const handle_slot *hs, int si) {
  if (hs->slot < 0 || (hs->slot == si && hs->gen == atomic_load(&slots[si].gen))) return false;
  return live(hs->slot, hs->gen);
}

static void op_handle(input *in, slot *s, int si) {
  handle_slot *hs = &handles[u8(in) % NHANDLES];
  tko_pool *p = atomic_load(&s->pool);
  uint8_t what = u8(in) % 4;
  if (what == 0) { /* submit: re-arms a handle whose task has ended */
    CHECK(pthread_rwlock_wrlock(&hs->lk) == 0);
    /* Its task ended, the handle may go to any pool; status alone touches
     * nothing but the handle, whichever pool it was on. */
    bool busy = hs->slot >= 0 && tko_handle_status(&hs->h) == -EINPROGRESS;
    if (hs->slot >= 0 && !busy) handle_ended(hs);
    token *t = busy ? NULL : token_new(u8(in) % NKINDS, si);
    if (t) {
      t->status = (int)(u8(in) % 5);
      t->weight = weight(in);
      t->ordered = s->ordered;
      int rc = tko_submit_handle(p, &hs->h, task_fn, t, t->weight);
      CHECK(rc != -ETIMEDOUT);
      check_submit_rc(s, rc);
      if (rc == 0) {
        accepted(s, si, t);
        hs->slot = si;
        hs->gen = atomic_load(&s->gen);
        hs->tok = t;
        atomic_store(&hs->cancel_won, false);
        atomic_store(&hs->cancel_busy, false);
      } else {
        /* Refused: never armed; what it held before is gone. */
        CHECK(tko_handle_status(&hs->h) == -EINVAL && tko_handle_id(&hs->h) == 0);
        hs->slot = -1;
        hs->tok = NULL;
      }
    }
    CHECK(pthread_rwlock_unlock(&hs->lk) == 0);
    return;
  }
  CHECK(pthread_rwlock_rdlock(&hs->lk) == 0);
  if (hs->slot < 0) {
    CHECK(tko_handle_status(&hs->h) == -EINVAL);
  } else if (handle_foreign(hs, si)) {
    int st = tko_handle_status(&hs->h); /* touches only the handle */
    CHECK(st == -EINPROGRESS || st == -ECANCELED || (st >= 0 && st <= 4));
  } else if (hs->slot != si || hs->gen != atomic_load(&s->gen)) {
    handle_ended(hs); /* its pool is gone, and with it every task it had */
  } else if (what == 1) {
    int rc = tko_handle_cancel(&hs->h);
    CHECK(rc == 0 || rc == -EBUSY || rc == -EALREADY);
    int st = tko_handle_status(&hs->h);
    if (rc == 0) atomic_store(&hs->cancel_won, true);
    if (rc == -EBUSY) atomic_store(&hs->cancel_busy, true);
    if (rc == -EBUSY) CHECK(st != -ECANCELED);
    if (rc == -EALREADY) CHECK(st == -ECANCELED || st == -EINPROGRESS);
  } else if (what == 2) {
    long timeout = (long)(u8(in) % 3); /* 0 .. 2 ms: a paused pool may hold it */
    int rc = tko_handle_wait(&hs->h, timeout);
    CHECK(rc == 0 || rc == -ETIMEDOUT);
    if (rc == 0) handle_ended(hs);
  } else {
    int st = tko_handle_status(&hs->h);
    CHECK(st == -EINPROGRESS || st == -ECANCELED || (st >= 0 && st <= 4));
    if (st != -EINPROGRESS) handle_ended(hs);
  }
  CHECK(pthread_rwlock_unlock(&hs->lk) == 0);
}

/* Counts a host cancel (tko_timer_cancel returned 0) of timer ts. */
static void timer_cancelled(timer_slot *ts, int rc) {
  CHECK(rc == 0 || rc == -ENOENT);
  if (rc == 0 && ts->tok && !ts->periodic) atomic_fetch_add(&ts->tok->cancels, 1);
  if (rc == 0) ts->tok = NULL;
}

static void op_timer(input *in, int op, slot *s, int si) {
  timer_slot *ts = &timers[u8(in) % NTIMERS];
  tko_pool *p = atomic_load(&s->pool);
  pthread_mutex_lock(&ts->mu);
  bool here = ts->slot == si && ts->gen == atomic_load(&s->gen);
  if (op == OP_TIMER_CANCEL) {
    if (here) timer_cancelled(ts, tko_timer_cancel(&ts->t));
    pthread_mutex_unlock(&ts->mu);
    return;
  }
  /* Armed, maybe, on another live pool: that pool's; leave it. */
  if (!here && live(ts->slot, ts->gen)) {
    pthread_mutex_unlock(&ts->mu);
    return;
  }
  bool periodic = op == OP_TIMER_EVERY;
  long ms = (long)(u8(in) % 6);
  uint8_t odd = u8(in);
  if (odd == 0xee) ms -= 2;                 /* -2 .. 5: negative delays are refused */
  if (odd == 0xef) ms = TKO_MAX_TIMER_MS + 1; /* too long: refused */
  if (here && u8(in) & 1) timer_cancelled(ts, tko_timer_cancel(&ts->t)); /* re-arm */
  token *t = token_new(K_PLAIN + u8(in) % 3, si);
  if (!t) {
    pthread_mutex_unlock(&ts->mu);
    return;
  }
  t->periodic = periodic;
  t->weight = weight(in);
  int rc = periodic ? tko_submit_every(p, &ts->t, ms, task_fn, t, t->weight)
                    : tko_submit_after(p, &ts->t, ms, task_fn, t, t->weight);
  if (ms < 0 || (periodic && ms == 0) || ms > TKO_MAX_TIMER_MS) {
    CHECK(rc == -EINVAL);
  } else {
    CHECK(rc == 0 || (rc == -EBUSY && here) || rc == -ESHUTDOWN || rc == -EAGAIN ||
          (rc == -ENOMEM && s->failing));
  }
  if (rc == 0) {
    atomic_store(&t->accepted, true);
    ts->slot = si;
    ts->gen = atomic_load(&s->gen);
    ts->tok = t;
    ts->periodic = periodic;
    atomic_fetch_add(&s->timers_armed, 1);
  }
  pthread_mutex_unlock(&ts->mu);
}

static void op_async(input *in, slot *s, int si) {
  tko_pool *p = atomic_load(&s->pool);
  token *t = token_new(u8(in) % 4 == 0 ? K_FAIL : K_PLAIN, si);
  if (!t) return;
  t->status = (int)(u8(in) % 3);
  t->maybe_lost = s->failing;
  int rc = tko_submit_async(p, async_fn, t, weight(in));
  check_submit_rc(s, rc);
  if (rc == 0) atomic_store(&t->accepted, true);
}

/* Lane ops; what % 7 == 0 (create) and 6 (destroy) run with the slot held
 * for writing. */
static void op_lanes(input *in, uint8_t what, slot *s, int si) {
  tko_pool *p = atomic_load(&s->pool);
  switch (what % 7) {
    case 0: {
      if (s->lanes) return;
      tko_lane_options lo = tko_lane_default_options();
      uint8_t a = u8(in);
      lo.lanes = a % 9;
      lo.max_drain = u8(in) % 5;
      lo.lane_capacity = u8(in) % 4;
      lo.max_queued = a & 0x80 ? 4 : 0;
      lo.on_cancel = a & 0x40 ? NULL : lane_cancel;
      lo.user = s;
      if (a & 0x20) lo.batch = lane_batch;
      lo.allocator = s->o.allocator;
      if (!lo.on_cancel) lo.on_cancel = lane_cancel; /* dropped tasks must be counted */
      int rc = tko_lanes_create(&s->lanes, p, &lo);
      /* A lane table holds its pool: none on a pool whose shutdown began. */
      CHECK(rc == 0 || (rc == -ENOMEM && s->failing) || (rc == -ESHUTDOWN && atomic_load(&s->closing)));
      if (rc) {
        s->lanes = NULL;
        return;
      }
      unsigned n = lo.lanes ? lo.lanes : 256;
      s->nlanes = 1;
      while (s->nlanes < n) s->nlanes <<= 1;
      return;
    }
    case 1:
    case 2: {
      if (!s->lanes) return;
      token *t = token_new(u8(in) % 2 ? K_FAIL : K_NESTED, si);
      if (!t) return;
      t->table = T_LANES;
      t->key = u8(in) % NKEYS;
      t->weight = weight(in);
      unsigned idx = tko_lanes_index(s->lanes, (uint64_t)t->key);
      CHECK(idx < s->nlanes && idx == tko_lanes_index(s->lanes, (uint64_t)t->key));
      int rc = tko_lanes_submit(s->lanes, (uint64_t)t->key, task_fn, t, t->weight);
      CHECK(rc == 0 || rc == -ESHUTDOWN || rc == -EAGAIN || (rc == -ENOMEM && s->failing));
      if (rc == 0) atomic_store(&t->accepted, true);
      return;
    }
    case 3:
      if (s->lanes) {
        long timeout = (long)(u8(in) % 4) - 1;
        int rc = tko_lanes_wait_idle(s->lanes, timeout);
        CHECK(rc == 0 || (rc == -ETIMEDOUT && timeout >= 0));
        tko_lane_stats ls;
        tko_lanes_stats(s->lanes, &ls);
        CHECK(ls.completed + ls.cancelled + ls.queued <= ls.submitted);
        CHECK(ls.lanes_used <= s->nlanes);
      }
      return;
    case 4:
    case 5:
      if (s->lanes) CHECK((what % 7 == 4 ? tko_lanes_cancel(s->lanes) : tko_lanes_close(s->lanes)) == 0);
      return;
    case 6: destroy_lanes(s); return;
  }
}

/* Coalescer ops; what % 6 == 0 (create) and 5 (destroy) run with the slot
 * held for writing. */
static void op_coalesce(input *in, uint8_t what, slot *s) {
  tko_pool *p = atomic_load(&s->pool);
  switch (what % 6) {
    case 0: {
      if (s->co) return;
      tko_coalesce_options co = {.allocator = s->o.allocator};
      co.initial_keys = u8(in) % 5;
      co.weight = weight(in);
      unsigned interval = u8(in) % 4;
      memset(s->co_marked, 0, sizeof s->co_marked);
      memset(s->co_flushed_seq, 0, sizeof s->co_flushed_seq);
      for (int k = 0; k < NCOKEYS; k++) atomic_store(&s->co_flushed[k], 0);
      int rc = tko_coalescer_create(&s->co, p, interval, co_flush, s, &co);
      CHECK(rc == 0 || (rc == -ENOMEM && s->failing) || (rc == -ESHUTDOWN && atomic_load(&s->closing)) ||
            rc == -EAGAIN);
      if (rc) s->co = NULL;
      return;
    }
    case 1:
    case 2:
      if (s->co && cur) {
        uint64_t key = u8(in) % NCOKEYS;
        uint64_t v = (uint64_t)(cur->id + 1) << 32 | ++cur->mark_seq;
        int rc = tko_coalescer_mark(s->co, key, v);
        CHECK(rc == 0 || rc == -ESHUTDOWN || (rc == -ENOMEM && s->failing));
        if (rc == 0) s->co_marked[cur->id][key] = v;
      }
      return;
    case 3:
      if (s->co) {
        tko_coalesce_stats st;
        tko_coalescer_stats(s->co, &st);
        CHECK(st.sweeps <= st.marks);
        CHECK(st.flushed <= st.marks);
        CHECK(tko_coalescer_flush(s->co) == 0);
      }
      return;
    case 4:
      if (s->co) CHECK(tko_coalescer_close(s->co) == 0);
      return;
    case 5: destroy_coalescer(s); return;
  }
}

/* CANCEL_NOWAIT returned -ETIMEDOUT: only allowed while another stream's
 * shutdown of the pool held the shutter role. */
static void mode_nowait_timed_out(slot *s, bool others, unsigned begun) {
  if (others || atomic_load(&s->shutting) > 1 || atomic_load(&s->shutdowns) != begun) return;
  fprintf(stderr, "fuzz_api: TKO_CANCEL_NOWAIT timed out with no other shutdown under way\n");
  abort();
}

/* Shutdown in every mode, untimed or with a deadline, held async tasks and
 * all: nothing is completed first. */
static void op_shutdown(input *in, slot *s, int si) {
  tko_pool *p = atomic_load(&s->pool);
  uint8_t m = u8(in);
  if (m % 9 == 8) {
    CHECK(tko_pool_shutdown(p, (tko_shutdown_mode)9) == -EINVAL);
    CHECK(tko_pool_shutdown_timed(p, (tko_shutdown_mode)-1, 0) == -EINVAL);
    CHECK(tko_pool_shutdown_timed(p, TKO_DRAIN, -2) == -EINVAL);
    return;
  }
  tko_shutdown_mode mode = (tko_shutdown_mode)(m % 3);
  int timed = m / 3 % 3; /* 0: tko_pool_shutdown; 1, 2: a deadline */
  slot_closing(s);
  /* Whether another stream's shutdown of this pool overlaps this one: a
   * call waits for the one that holds the shutter role, so then even
   * CANCEL_NOWAIT may time out (see the report in docs/TESTING.md). */
  bool others = atomic_fetch_add(&s->shutting, 1) > 0;
  unsigned begun = atomic_fetch_add(&s->shutdowns, 1) + 1;
  int rc;
  if (!timed) {
    rc = tko_pool_shutdown(p, mode); /* may wait for held async tasks: the rescuer completes them */
    CHECK(rc == 0);
  } else {
    long timeout = timed == 1 ? 0 : (long)(u8(in) % 4);
    rc = tko_pool_shutdown_timed(p, mode, timeout);
    if (rc == -ETIMEDOUT && mode == TKO_CANCEL_NOWAIT) mode_nowait_timed_out(s, others, begun);
    CHECK(rc == 0 || rc == -ETIMEDOUT);
    if (rc == -ETIMEDOUT) {
      uint8_t next = u8(in) % 3;
      if (next == 1) rc = tko_pool_shutdown_timed(p, TKO_CANCEL_NOWAIT, 0);
      if (next == 2) rc = tko_pool_shutdown_timed(p, TKO_CANCEL, -1);
      if (next == 1 && rc == -ETIMEDOUT) mode_nowait_timed_out(s, others, begun);
      CHECK(next == 0 || rc == 0 || (next == 1 && rc == -ETIMEDOUT));
      if (next && rc == 0) mode = next == 1 ? TKO_CANCEL_NOWAIT : TKO_CANCEL;
    }
  }
  atomic_fetch_sub(&s->shutting, 1);
  if (rc == 0 && mode != TKO_CANCEL_NOWAIT) {
    atomic_store(&s->timers_armed, 0);
    check_stats(s, true); /* nothing runs after shutdown has returned */
  }
  if (rc == 0 || rc == -ETIMEDOUT) {
    token *t = token_new(K_PLAIN, si);
    /* A call that timed out may have left the pool CLOSING (its attached
     * objects still resolving, or another stream's call holding the shutter
     * role before its close): submits are still accepted there, and the
     * shutdown that goes on runs or cancels them. */
    int sub = t ? tko_submit(p, task_fn, t, 0) : -ESHUTDOWN;
    if (sub != -ESHUTDOWN && (rc == 0 || sub != 0))
      fprintf(stderr, "fuzz_api: a submit after a shutdown that gave %d returned %d (%s)\n", rc, sub,
              tko_strerror(sub));
    if (rc == 0)
      CHECK(sub == -ESHUTDOWN);
    else
      check_submit_rc(s, sub); /* a CLOSING pool: as any submit (a full ring may need memory) */
    if (t && sub == 0) accepted(s, si, t);
  }
}

static void op_cq(input *in) {
  uint8_t what = u8(in);
  drain_ctx d = {{0, 0}};
  switch (what % 5) {
    case 0:
    case 1: {
      if (!cur || cur->post_seq >= NPOSTS) return;
      uint32_t seq = cur->post_seq++;
      int rc = tko_cq_post(cq, (uint64_t)cur->id << 32 | seq, (int)(what >> 3), &posted[cur->id][seq]);
      CHECK(rc == 0 || rc == -EAGAIN);
      if (rc == 0) atomic_store(&posted[cur->id][seq], 1);
      return;
    }
    case 2: {
      long n = tko_cq_drain(cq, deliver, &d, u8(in) % 4);
      CHECK(n >= 0);
      return;
    }
    case 3: {
      tko_completion out[4];
      size_t max = 1 + u8(in) % 4;
      long n = tko_cq_take(cq, out, max);
      CHECK(n >= 0 && (size_t)n <= max);
      for (long i = 0; i < n; i++) deliver(&d, &out[i]);
      return;
    }
    case 4: {
      struct pollfd pf = {.fd = tko_cq_fd(cq), .events = POLLIN};
      CHECK(pf.fd >= 0);
      CHECK(poll(&pf, 1, 0) >= 0);
      return;
    }
  }
}

static int resize_count(void *arg) {
  atomic_fetch_add((atomic_int *)arg, 1);
  return 0;
}

static void op_misc(input *in) {
  uint8_t what = u8(in);
  switch (what % 8) {
    case 0: {
      /* Any int, INT_MIN included: negate as unsigned (negating INT_MIN as
       * an int is undefined, which UBSan reported here). */
      int e = (int)(0u - u32(in));
      const char *m = tko_strerror(e);
      CHECK(m && strlen(m) < 200);
      CHECK(tko_strerror(0) != NULL);
      CHECK(tko_err_name(e) != NULL && strcmp(tko_err_name(0), "OK") == 0);
      break;
    }
    case 1: /* NULL and invalid arguments */
      CHECK(tko_submit(NULL, task_fn, NULL, 0) == -EINVAL);
      CHECK(tko_submit_keyed(NULL, 0, task_fn, NULL, 0) == -EINVAL);
      CHECK(tko_pool_wait_idle(NULL, 0) == -EINVAL);
      CHECK(tko_pool_shutdown(NULL, TKO_DRAIN) == -EINVAL);
      CHECK(tko_pool_shutdown_timed(NULL, TKO_CANCEL_NOWAIT, 0) == -EINVAL);
      CHECK(tko_pool_destroy(NULL) == -EINVAL);
      CHECK(tko_pool_pause(NULL) == -EINVAL);
      CHECK(tko_pool_resume(NULL) == -EINVAL);
      CHECK(tko_pool_trim(NULL) == -EINVAL);
      CHECK(tko_submit_batch(NULL, NULL, 1) == -EINVAL);
      CHECK(tko_pool_create(NULL, NULL) == -EINVAL);
      tko_pool_stats(NULL, NULL);
      CHECK(tko_blocking_begin() == -EPERM);
      CHECK(tko_blocking_end() == -EPERM);
      CHECK(tko_async_complete(NULL, 0) == -EINVAL);
      CHECK(tko_timer_cancel(NULL) == -EINVAL);
      CHECK(tko_group_wait(NULL, 0) == -EINVAL);
      CHECK(tko_lanes_create(NULL, NULL, NULL) == -EINVAL);
      CHECK(tko_lanes_submit(NULL, 0, task_fn, NULL, 0) == -EINVAL);
      CHECK(tko_lanes_wait_idle(NULL, 0) == -EINVAL);
      CHECK(tko_lanes_close(NULL) == -EINVAL);
      CHECK(tko_lanes_cancel(NULL) == -EINVAL);
      CHECK(tko_lanes_destroy(NULL) == -EINVAL);
      CHECK(tko_lanes_pool_cancelled(NULL) == 0);
      tko_lanes_stats(NULL, NULL);
      CHECK(tko_coalescer_create(NULL, NULL, 0, NULL, NULL, NULL) == -EINVAL);
      CHECK(tko_coalescer_mark(NULL, 0, 0) == -EINVAL);
      CHECK(tko_coalescer_flush(NULL) == -EINVAL);
      CHECK(tko_coalescer_close(NULL) == -EINVAL);
      CHECK(tko_coalescer_destroy(NULL) == -EINVAL);
      CHECK(tko_coalescer_pool_cancelled(NULL) == 0);
      tko_coalescer_stats(NULL, NULL);
      CHECK(tko_cq_create(NULL, 0, NULL) == -EINVAL);
      CHECK(tko_cq_fd(NULL) == -EINVAL);
      CHECK(tko_cq_post(NULL, 0, 0, NULL) == -EINVAL);
      CHECK(tko_cq_drain(NULL, deliver, NULL, 0) == -EINVAL);
      CHECK(tko_cq_drain(cq, NULL, NULL, 0) == -EINVAL);
      CHECK(tko_cq_take(cq, NULL, 1) == -EINVAL);
      CHECK(tko_cq_destroy(NULL) == -EINVAL);
      break;
    case 2: {
      tko_group zero;
      memset(&zero, 0, sizeof zero); /* never initialised */
      CHECK(tko_group_wait(&zero, 0) == -EINVAL);
      CHECK(tko_group_destroy(&zero) == -EINVAL);
      CHECK(tko_group_cancel(&zero) == -EINVAL);
      CHECK(tko_group_pending(&zero) == 0);
      break;
    }
    case 3:
      CHECK(strcmp(tko_version_string(), TKO_VERSION_STRING) == 0);
      CHECK(tko_version_number() == TKO_VERSION_NUMBER);
      break;
    case 4: { /* complete a held async task now */
      struct held h = {NULL, -1};
      pthread_mutex_lock(&held_mu);
      if (nheld) {
        int i = (int)(u8(in) % (unsigned)nheld);
        h = held[i];
        held[i] = held[--nheld];
      }
      pthread_mutex_unlock(&held_mu);
      if (h.op) CHECK(tko_async_complete(h.op, (int)(u8(in) % 3)) == 0);
      break;
    }
    case 5: {
      tko_options o = tko_basic_options(u8(in) % 2);
      CHECK(o.workers >= 1);
      unsigned w = u8(in) % 3, m = u8(in) % 3, idle = u8(in);
      tko_options e = tko_elastic_options(w, m, idle);
      CHECK(e.elastic_idle_ms >= 1);
      tko_lane_options lo = tko_lane_default_options();
      CHECK(lo.lanes == 256 && lo.max_drain == 32);
      break;
    }
    case 6: { /* a completion queue of a fuzzed size, made and freed here */
      static const size_t caps[] = {0, 1, 3, TKO_MAX_CQ_CAPACITY + 1};
      size_t c = caps[u8(in) % 4];
      tko_cq *q;
      int rc = tko_cq_create(&q, c, NULL);
      if (c > TKO_MAX_CQ_CAPACITY) {
        CHECK(rc == -EINVAL);
        break;
      }
      CHECK(rc == 0 || rc == -EMFILE || rc == -ENFILE);
      if (rc) break;
      CHECK(tko_cq_post(q, 7, 0, NULL) == 0);
      CHECK(tko_cq_destroy(q) == -EBUSY);
      tko_completion out;
      CHECK(tko_cq_take(q, &out, 1) == 1 && out.id == 7);
      CHECK(tko_cq_destroy(q) == 0);
      break;
    }
    case 7: { /* tko_pool_resize on a pool of its own, between submits */
      tko_options o = tko_elastic_options(1 + u8(in) % 2, u8(in) % 2, 1);
      o.max_threads = 4;
      tko_pool *p;
      if (tko_pool_create(&p, &o)) break;
      atomic_int ran = 0;
      int accepted = 0;
      for (int round = 0; round < 3; round++) {
        for (int i = u8(in) % 8; i > 0; i--) accepted += tko_submit(p, resize_count, &ran, 0) == 0;
        unsigned b = u8(in) % 4, e = u8(in) % 3;
        int rc = tko_pool_resize(p, b, e);
        CHECK(b + e == 0 || b + e > 4 ? rc == -EINVAL : rc == 0 || rc == -EAGAIN);
      }
      CHECK(tko_pool_wait_idle(p, -1) == 0); /* never both 0: someone runs them */
      CHECK(atomic_load(&ran) == accepted);
      CHECK(tko_pool_destroy(p) == 0);
      CHECK(tko_pool_resize(NULL, 1, 0) == -EINVAL);
      break;
    }
  }
}

static void op_stats(input *in, slot *s) {
  tko_pool *p = atomic_load(&s->pool);
  uint8_t what = u8(in);
  check_stats(s, false);
  if (what & 1) CHECK(tko_pool_trim(p) == 0);
  if (s->lanes) {
    tko_lane_stats ls;
    tko_lanes_stats(s->lanes, &ls);
    CHECK(ls.completed + ls.cancelled + ls.queued <= ls.submitted);
  }
}

/* Ops run with a pool there (create: without; misc and cq need none), for FUZZ_API_REACH=1: printed
 * at exit, so that `fuzz_api -runs=0 fuzz/corpus_api` shows what the seeds
 * reach. */
static atomic_uint reached[NOPS];

static void print_reach(void) {
  for (int i = 0; i < NOPS; i++) fprintf(stderr, "fuzz_api: op %-13s reached %u times\n", op_names[i], atomic_load(&reached[i]));
}

/* Runs one op with slot si held for reading (or writing: create, destroy). */
static void run_op_locked(stream *st, int op, int si) {
  input *in = &st->in;
  slot *s = &slots[si];
  tko_pool *p = atomic_load(&s->pool);
  if (op == OP_GROUP_WAIT || op == OP_GROUP_CANCEL) {
    op_group(in, op, s, si);
    return;
  }
  if (op == OP_TIMER_CANCEL) {
    op_timer(in, op, s, si);
    return;
  }
  if (!p) return;
  switch (op) {
    case OP_SUBMIT: op_submit(in, s, si, 0); break;
    case OP_SUBMIT_TIMED: op_submit(in, s, si, 1); break;
    case OP_BATCH: op_batch(in, s, si); break;
    case OP_GROUP_SUBMIT: op_group(in, op, s, si); break;
    case OP_TIMER_AFTER:
    case OP_TIMER_EVERY: op_timer(in, op, s, si); break;
    case OP_ASYNC: op_async(in, s, si); break;
    case OP_COMPLETE: complete_held(si, false); break;
    case OP_PAUSE: slot_pause(s, si, p); break;
    case OP_RESUME: slot_resume(s, p); break;
    case OP_WAIT: {
      int rc = tko_pool_wait_idle(p, (long)(u8(in) % 3));
      CHECK(rc == 0 || rc == -ETIMEDOUT);
      check_stats(s, false);
      break;
    }
    case OP_WAIT_FOREVER:
      /* Paused, or async tasks held: the rescuer resumes and completes. */
      CHECK(tko_pool_wait_idle(p, -1) == 0);
      check_stats(s, false);
      break;
    case OP_SHUTDOWN: op_shutdown(in, s, si); break;
    case OP_STATS: op_stats(in, s); break;
    case OP_KEYED: op_keyed(in, s, si); break;
    case OP_HANDLE: op_handle(in, s, si); break;
    default: break;
  }
}

static void run_op(stream *st) {
  input *in = &st->in;
  int op = u8(in) % NOPS;
  int si = u8(in) % NPOOLS;
  slot *s = &slots[si];
  atomic_store(&st->op_name, op_names[op]);
  atomic_store(&st->op_start, now_ns());
  bool there = op == OP_MISC || op == OP_CQ || (op == OP_CREATE) == !atomic_load(&s->pool);
  if (op == OP_MISC) {
    op_misc(in);
  } else if (op == OP_CQ) {
    op_cq(in);
  } else if (op == OP_CREATE || op == OP_DESTROY || op == OP_LANES || op == OP_COALESCE) {
    uint8_t what = op == OP_CREATE ? 0 : u8(in);
    bool excl = op == OP_CREATE || op == OP_DESTROY || (op == OP_LANES && what % 7 % 6 == 0) ||
                (op == OP_COALESCE && what % 6 % 5 == 0);
    if (excl) CHECK(pthread_rwlock_wrlock(&s->lk) == 0);
    else CHECK(pthread_rwlock_rdlock(&s->lk) == 0);
    if (op == OP_CREATE) create_pool(in, si);
    else if (op == OP_DESTROY) destroy_pool(si, what);
    else if (atomic_load(&s->pool) && op == OP_LANES) op_lanes(in, what, s, si);
    else if (atomic_load(&s->pool)) op_coalesce(in, what, s);
    CHECK(pthread_rwlock_unlock(&s->lk) == 0);
  } else {
    CHECK(pthread_rwlock_rdlock(&s->lk) == 0);
    run_op_locked(st, op, si);
    CHECK(pthread_rwlock_unlock(&s->lk) == 0);
  }
  atomic_store(&st->op_start, 0);
  atomic_fetch_add(&st->ops, 1);
  if (there) atomic_fetch_add(&reached[op], 1);
}

/* ---- the two streams, the rescuer and the watchdog --------------------------------------- */

static pthread_mutex_t run_mu = PTHREAD_MUTEX_INITIALIZER; /* protects done, torn */
static pthread_cond_t run_cv = PTHREAD_COND_INITIALIZER;
static int done;   /* streams that ran all their ops */
static bool torn;  /* teardown finished */
static bool sequential;

static void wait_done(int v) {
  pthread_mutex_lock(&run_mu);
  while (done < v) pthread_cond_wait(&run_cv, &run_mu);
  pthread_mutex_unlock(&run_mu);
}

/* After both streams: every pool, group, timer and the completion queue
 * are taken down, single-threaded, and the quiet invariants checked. */
static void teardown(stream *st) {
  atomic_store(&st->op_name, "teardown");
  atomic_store(&st->op_start, now_ns());
  for (int si = 0; si < NPOOLS; si++) {
    slot *s = &slots[si];
    CHECK(pthread_rwlock_wrlock(&s->lk) == 0);
    tko_pool *p = atomic_load(&s->pool);
    if (p) {
      complete_held(si, true);
      slot_resume(s, p);
      if (s->lanes) CHECK(tko_lanes_wait_idle(s->lanes, -1) == 0);
      CHECK(tko_pool_wait_idle(p, -1) == 0);
      if (stays_quiet(s)) check_stats(s, true);
      destroy_pool(si, 0);
    }
    CHECK(pthread_rwlock_unlock(&s->lk) == 0);
  }
  CHECK(nheld == 0);
  for (int i = 0; i < NGROUPS; i++) {
    if (!groups[i].init) continue;
    CHECK(tko_group_wait(&groups[i].g, 0) == 0);
    CHECK(tko_group_destroy(&groups[i].g) == 0);
    groups[i].init = false;
  }
  /* Every pool is gone: every armed handle's task has ended. */
  for (int i = 0; i < NHANDLES; i++)
    if (handles[i].slot >= 0) handle_ended(&handles[i]);
  /* Shutdown disarmed every timer. */
  for (int i = 0; i < NTIMERS; i++) CHECK(tko_timer_cancel(&timers[i].t) == -ENOENT);
  /* The completion queue: drain it; readable after a post; -EBUSY while full. */
  drain_ctx d = {{0, 0}};
  while (tko_cq_drain(cq, deliver, &d, 0) > 0) memset(&d, 0, sizeof d);
  if (tko_cq_post(cq, 1, 0, NULL) == 0) {
    struct pollfd pf = {.fd = tko_cq_fd(cq), .events = POLLIN};
    CHECK(poll(&pf, 1, 0) == 1);
    CHECK(tko_cq_destroy(cq) == -EBUSY);
    tko_completion c;
    CHECK(tko_cq_take(cq, &c, 1) == 1 && c.id == 1 && c.user == NULL);
  }
  CHECK(tko_cq_destroy(cq) == 0);
  cq = NULL;
  atomic_store(&st->op_start, 0);
}

static void *stream_main(void *arg) {
  stream *st = arg;
  cur = st;
  if (st->id == 1 && sequential) wait_done(1);
  for (int ops = 0; st->in.n && ops < MAX_OPS; ops++) run_op(st);
  pthread_mutex_lock(&run_mu);
  done++;
  pthread_cond_broadcast(&run_cv);
  pthread_mutex_unlock(&run_mu);
  if (st->id == 0) {
    wait_done(2);
    teardown(st);
    pthread_mutex_lock(&run_mu);
    torn = true;
    pthread_cond_broadcast(&run_cv);
    pthread_mutex_unlock(&run_mu);
  }
  return NULL;
}

/* The host's part in unblocking calls: resume every pool, complete every
 * held async task. */
static void rescue(void) {
  complete_held(-1, false);
  for (int si = 0; si < NPOOLS; si++) {
    slot *s = &slots[si];
    if (pthread_rwlock_tryrdlock(&s->lk) != 0) continue; /* destroying: needs no help */
    tko_pool *p = atomic_load(&s->pool);
    if (p) slot_resume(s, p);
    pthread_rwlock_unlock(&s->lk);
  }
}

static uint64_t bound_ns(void) {
  static uint64_t b;
  if (!b) {
    const char *e = getenv("FUZZ_API_BOUND_MS");
    b = (uint64_t)(e && atol(e) > 0 ? atol(e) : 15000) * 1000000u;
  }
  return b;
}

static void watch(void) {
  for (int i = 0; i < 2; i++) {
    uint64_t t0 = atomic_load(&streams[i].op_start);
    if (t0 && now_ns() - t0 > bound_ns()) {
      fprintf(stderr, "fuzz_api: stream %d: op '%s' has run for over %llu ms\n", i,
              atomic_load(&streams[i].op_name), (unsigned long long)(bound_ns() / 1000000u));
      abort();
    }
  }
}

static void supervise(void) {
  unsigned last = UINT_MAX, stalled = 0;
  pthread_mutex_lock(&run_mu);
  while (!torn) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += TICK_MS * 1000000L;
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&run_cv, &run_mu, &ts);
    if (torn) break;
    pthread_mutex_unlock(&run_mu);
    watch();
    unsigned done = atomic_load(&streams[0].ops) + atomic_load(&streams[1].ops);
    stalled = done == last ? stalled + 1 : 0;
    last = done;
    if (stalled >= STALL_TICKS) rescue();
    pthread_mutex_lock(&run_mu);
  }
  pthread_mutex_unlock(&run_mu);
}

/* ---- the final checks ---------------------------------------------------------------------- */

static int cmp_fifo(const void *a, const void *b) {
  const token *x = *(token *const *)a, *y = *(token *const *)b;
  if (x->slot != y->slot) return x->slot < y->slot ? -1 : 1;
  if (x->gen != y->gen) return x->gen < y->gen ? -1 : 1;
  if (x->thread != y->thread) return x->thread < y->thread ? -1 : 1;
  if (x->weight != y->weight) return x->weight < y->weight ? -1 : 1;
  return x->seq < y->seq ? -1 : x->seq > y->seq;
}

static int cmp_window(const void *a, const void *b) {
  const token *x = *(token *const *)a, *y = *(token *const *)b;
  if (x->window != y->window) return x->window < y->window ? -1 : 1;
  if (x->weight != y->weight) return x->weight > y->weight ? -1 : 1; /* heaviest first */
  return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* Sorted by what the pool promises; every neighbour pair in one class must
 * have started in that order. */
static void check_sorted(token **v, int n, int (*cmp)(const void *, const void *), bool window,
                         const char *what) {
  qsort(v, (size_t)n, sizeof *v, cmp);
  for (int i = 1; i < n; i++) {
    token *a = v[i - 1], *b = v[i];
    bool same = window ? a->window == b->window
                       : a->slot == b->slot && a->gen == b->gen && a->thread == b->thread &&
                             a->weight == b->weight;
    if (!same || atomic_load(&a->run_at) < atomic_load(&b->run_at)) continue;
    fprintf(stderr,
            "fuzz_api: %s broken in pool %d: task seq %u (weight %d) started at %llu, after seq %u "
            "(weight %d) at %llu\n",
            what, a->slot, a->seq, a->weight, (unsigned long long)atomic_load(&a->run_at), b->seq,
            b->weight, (unsigned long long)atomic_load(&b->run_at));
    abort();
  }
}

static void check_order(void) {
  static token *v[NTOKENS];
  int n = atomic_load(&next_token), m = 0;
  if (n > NTOKENS) n = NTOKENS;
  for (int i = 0; i < n; i++) {
    token *t = &tokens[i];
    if (t->ordered && t->thread >= 0 && atomic_load(&t->accepted) && atomic_load(&t->runs))
      v[m++] = t;
  }
  check_sorted(v, m, cmp_fifo, false, "FIFO within a weight");
  int w = 0;
  for (int i = 0; i < m; i++)
    if (v[i]->window && v[i]->by_weight) v[w++] = v[i];
  check_sorted(v, w, cmp_window, true, "weight order of tasks queued while paused");
}

static void check_tokens(void) {
  int n = atomic_load(&next_token);
  if (n > NTOKENS) n = NTOKENS;
  for (int i = 0; i < n; i++) {
    token *t = &tokens[i];
    int r = atomic_load(&t->runs), c = atomic_load(&t->cancels);
    CHECK(atomic_load(&t->delivered) == atomic_load(&t->posted));
    if (t->periodic) {
      /* Each firing is a task; the argument reaches on_cancel at most once. */
      CHECK(c <= 1);
      if (!atomic_load(&t->accepted)) CHECK(r + c == 0);
      continue;
    }
    if (!atomic_load(&t->accepted)) {
      if (r + c != 0) fprintf(stderr, "fuzz_api: refused token %d ran %d cancelled %d\n", i, r, c);
      CHECK(r + c == 0);
    } else if (t->maybe_lost) {
      CHECK(r + c <= 1);
    } else {
      if (r + c != 1)
        fprintf(stderr, "fuzz_api: token %d (kind %d, table %d) ran %d, cancelled %d\n", i,
                t->kind, t->table, r, c);
      CHECK(r + c == 1);
    }
  }
  for (int th = 0; th < 2; th++)
    for (int i = 0; i < NPOSTS; i++) CHECK(atomic_load(&delivered[th][i]) == atomic_load(&posted[th][i]));
}

static void reset(void) {
  memset(tokens, 0, sizeof tokens);
  atomic_store(&next_token, 0);
  for (int i = 0; i < NPOOLS; i++) {
    slot *s = &slots[i];
    static bool once;
    if (!once) {
      pthread_rwlockattr_t a;
      pthread_rwlockattr_init(&a);
      /* Readers go first even while a writer waits: the rescuer must be
       * able to resume a pool a blocked reader waits on. */
      pthread_rwlockattr_setkind_np(&a, PTHREAD_RWLOCK_PREFER_READER_NP);
      for (int j = 0; j < NPOOLS; j++) {
        pthread_rwlock_init(&slots[j].lk, &a);
        pthread_mutex_init(&slots[j].pm, NULL);
      }
      for (int j = 0; j < NGROUPS; j++) pthread_mutex_init(&groups[j].mu, NULL);
      for (int j = 0; j < NTIMERS; j++) pthread_mutex_init(&timers[j].mu, NULL);
      for (int j = 0; j < NHANDLES; j++) pthread_rwlock_init(&handles[j].lk, NULL);
      pthread_rwlockattr_destroy(&a);
      once = true;
    }
    atomic_store(&s->pool, NULL);
    s->lanes = NULL;
    s->co = NULL;
    s->epoch = 0;
  }
  memset(keyed, 0, sizeof keyed);
  memset(posted, 0, sizeof posted);
  memset(delivered, 0, sizeof delivered);
  for (int i = 0; i < NGROUPS; i++) groups[i].init = false;
  for (int i = 0; i < NTIMERS; i++) {
    tko_timer_init(&timers[i].t);
    timers[i].slot = -1;
    timers[i].tok = NULL;
  }
  for (int i = 0; i < NHANDLES; i++) {
    memset(&handles[i].h, 0, sizeof handles[i].h);
    handles[i].slot = -1;
    handles[i].tok = NULL;
  }
  nheld = 0;
  done = 0;
  torn = false;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static int init;
  if (!init) {
    const char *e = getenv("FUZZ_API_SEQUENTIAL");
    sequential = e && *e == '1';
    e = getenv("FUZZ_API_REACH");
    if (e && *e == '1') atexit(print_reach);
    init = 1;
  }
  reset();
  uint8_t hdr = size ? data[0] : 0;
  const uint8_t *p = size ? data + 1 : data;
  size_t n = size ? size - 1 : 0;
  const uint8_t *sep = memmem(p, n, SEP, sizeof SEP);
  size_t n0 = sep ? (size_t)(sep - p) : n;
  for (int i = 0; i < 2; i++) {
    stream *st = &streams[i];
    memset(st, 0, sizeof *st);
    st->id = i;
    st->in = i == 0 ? (input){p, n0} : (input){sep ? sep + sizeof SEP : p + n, sep ? n - n0 - sizeof SEP : 0};
  }
  static const size_t cq_caps[] = {0, 1, 2, 8, 64};
  CHECK(tko_cq_create(&cq, cq_caps[hdr % 5], NULL) == 0);
  for (int i = 0; i < 2; i++) CHECK(pthread_create(&streams[i].th, NULL, stream_main, &streams[i]) == 0);
  supervise();
  for (int i = 0; i < 2; i++) CHECK(pthread_join(streams[i].th, NULL) == 0);
  check_tokens();
  check_order();
  return 0;
}
