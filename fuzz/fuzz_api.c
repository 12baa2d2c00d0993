/* SPDX-License-Identifier: MIT */
/* libFuzzer harness for the public API: the input is a little program that
 * drives up to three pools at once - create with fuzzed options (hooks, a
 * bounded queue, aging, an async limit, an allocator that fails chosen
 * calls), single, timed and batch submits, groups, delayed and periodic
 * timers, async tasks held in flight and completed later, pause and resume,
 * waits with small timeouts, shutdown, destroy, stats, lanes and
 * coalescers, strerror - with fuzzed arguments, invalid ones included.
 *
 * Tasks misbehave too: some fail, some submit more work to their own pool,
 * some turn on their own pool (wait, shutdown, destroy: -EDEADLK), some use
 * the blocking hint; hooks submit or check -EDEADLK.
 *
 * Checked, besides "no crash, no sanitizer report, no hang":
 * - every call returns one of its documented results;
 * - every task accepted (the call returned 0) runs or is cancelled exactly
 *   once; a refused one never runs (tokens, checked once every pool of the
 *   input is gone);
 * - after wait_idle returns 0 on a pool with no timer armed,
 *   completed + cancelled == submitted and nothing is queued or running;
 * - stats stay within the options (elastic workers <= max_elastic, ...).
 *
 * Nothing sleeps: waits have timeouts of a few milliseconds at most, and
 * calls that could block for good (a submit into a full bounded queue of a
 * paused pool, a wait with async tasks held in flight) are not made in
 * those states.
 *
 * Known core bugs (see tests/ and docs/RELIABILITY.md) are steered around
 * unless FUZZ_KNOWN_BUGS is defined: batches larger than the inbox on a pool
 * whose allocator fails, and pool calls from hooks or tasks that run on
 * threads the pool does not own. */
#define _GNU_SOURCE
/* Every core bug this harness found is fixed: walk into all of those paths
 * (the guarded steering below is kept for bisecting old builds). */
#ifndef FUZZ_STEER_AROUND_FIXED_BUGS
#define FUZZ_KNOWN_BUGS 1
#endif

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "taskorch.h"
#include "taskorch/coalescer.h"
#include "taskorch/lanes.h"

#define NPOOLS 3
#define NTOKENS 4096
#define NGROUPS 4
#define NTIMERS 8
#define NHELD 256
#define MAX_OPS 256

#define CHECK(cond)                                                                     \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      fprintf(stderr, "fuzz_api: check failed at line %d: %s\n", __LINE__, #cond);      \
      abort();                                                                          \
    }                                                                                   \
  } while (0)

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

/* ---- tokens: one per task, to prove exactly-once ----------------------------------- */

enum kind { K_PLAIN, K_FAIL, K_NESTED, K_SELF, K_BLOCKING, K_SPIN, NKINDS };

typedef struct token {
  atomic_int runs, cancels;
  atomic_bool accepted;
  bool periodic;     /* a periodic timer's task: runs any number of times */
  bool maybe_lost;   /* async on a failing allocator: may fail to start */
  bool no_check;     /* lane task whose fate the test does not track */
  int kind, status, slot;
} token;

static token tokens[NTOKENS];
static atomic_int next_token;

static token *token_new(int kind, int slot) {
  int i = atomic_fetch_add(&next_token, 1);
  if (i >= NTOKENS) return NULL;
  token *t = &tokens[i];
  t->kind = kind;
  t->slot = slot;
  return t;
}

static bool is_token(const void *p) {
  return p >= (const void *)tokens && p < (const void *)(tokens + NTOKENS);
}

/* ---- pools ----------------------------------------------------------------------- */

typedef struct fail_alloc {
  atomic_long calls;
  uint64_t mask; /* call k (0..63) fails when bit k is set; later calls never */
  atomic_long live;
  tko_allocator al;
} fail_alloc;

typedef struct slot {
  tko_pool *_Atomic pool;
  tko_options o;
  bool paused, shut;
  bool failing;     /* the allocator fails some calls */
  atomic_bool auto_complete; /* async tasks complete at once (under held_mu) */
  int timers_armed; /* timers maybe armed on this pool */
  tko_lanes *lanes;
  tko_coalescer *co;
  fail_alloc fa;
  char name[16];
} slot;

static slot slots[NPOOLS];

/* Async tasks held in flight until the input completes them. */
static pthread_mutex_t held_mu = PTHREAD_MUTEX_INITIALIZER; /* protects held, nheld */
static struct held {
  tko_async *op;
  int slot;
} held[NHELD];
static int nheld;

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

/* Whether a blocking call (a submit that may wait for room) could wait for
 * good: a bounded BLOCK queue on a paused pool. */
static bool may_block_forever(const slot *s) {
  return s->o.queue_capacity && s->o.full_policy == TKO_FULL_BLOCK && s->paused;
}

/* TKO_KNOWN_BUG_async_caller_runs: an async task that a full
 * TKO_FULL_CALLER_RUNS queue runs on the submitting thread gives back an
 * in-flight slot it never took. Steered around unless FUZZ_KNOWN_BUGS. */
static bool async_allowed(const slot *s) {
#ifndef FUZZ_KNOWN_BUGS
  if (s->o.queue_capacity && s->o.full_policy == TKO_FULL_CALLER_RUNS) return false;
#endif
  return !may_block_forever(s);
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

/* ---- tasks -------------------------------------------------------------------------- */

static int task_fn(void *arg);

static void turn_on_own_pool(tko_pool *p) {
  CHECK(tko_pool_wait_idle(p, 0) == -EDEADLK);
  CHECK(tko_pool_wait_idle(p, -1) == -EDEADLK);
  CHECK(tko_pool_shutdown(p, TKO_DRAIN) == -EDEADLK);
  CHECK(tko_pool_shutdown(p, TKO_CANCEL) == -EDEADLK);
  CHECK(tko_pool_destroy(p) == -EDEADLK);
}

static int task_fn(void *arg) {
  token *t = arg;
  atomic_fetch_add(&t->runs, 1);
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
      /* Only on a worker: a task run on the submitting thread (caller-runs)
       * or on the timer thread is not refused (a known core bug). */
#ifndef FUZZ_KNOWN_BUGS
      if (p && on_worker()) turn_on_own_pool(p);
#else
      if (p) turn_on_own_pool(p);
#endif
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
    default: break;
  }
  return 0;
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
  /* A lane runner or a coalescer sweep dropped by TKO_CANCEL. */
  if (tko_lanes_pool_cancelled(info)) return;
  if (tko_coalescer_pool_cancelled(info)) return;
}

static void task_hook(void *user, const tko_task_info *info) {
  slot *s = user;
  tko_pool *p = atomic_load(&s->pool);
  CHECK(info->fn != NULL);
  if (!p) return;
  /* A hook on a worker of this pool may not wait on it. Hooks of async
   * tasks run on the completing thread, which may not be the pool's: only
   * check on workers (the other case is a known core bug). */
  if (on_worker()) CHECK(tko_pool_wait_idle(p, 0) == -EDEADLK);
}

static void thread_hook(void *user, unsigned index, tko_worker_kind kind) {
  slot *s = user;
  CHECK(kind == TKO_WORKER_BASIC || kind == TKO_WORKER_ELASTIC);
  CHECK(kind == TKO_WORKER_BASIC ? index < s->o.workers : index < s->o.max_elastic);
  tko_pool *p = atomic_load(&s->pool);
  if (!p) return;
  CHECK(tko_pool_wait_idle(p, 0) == -EDEADLK);
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

/* ---- lane and coalescer callbacks ---------------------------------------------------------- */

static void lane_cancel(void *user, const tko_lane_task *t) {
  (void)user;
  if (is_token(t->arg)) atomic_fetch_add(&((token *)t->arg)->cancels, 1);
}

static void co_flush(void *user, const tko_coalesce_entry *e, size_t n) {
  (void)user;
  CHECK(n >= 1);
  for (size_t i = 1; i < n && i < 8; i++) CHECK(e[i].key != e[0].key);
}

/* ---- stats invariants ------------------------------------------------------------------------ */

/* Whether "idle" stays idle: not with timers armed or a coalescer (they
 * submit on their own), nor with a thread_stop hook that submits while
 * elastic workers may retire. */
static bool stays_quiet(const slot *s) {
  return s->timers_armed == 0 && !s->co &&
         !(s->o.hooks.thread_stop == thread_stop_submit && s->o.max_elastic);
}

static void check_stats(slot *s, bool quiet) {
  tko_pool *p = atomic_load(&s->pool);
  tko_stats st;
  memset(&st, 0xab, sizeof st);
  tko_pool_stats(p, &st);
  CHECK(st.basic_workers <= s->o.workers);
  CHECK(st.elastic_workers <= s->o.max_elastic);
  CHECK(st.elastic_peak <= s->o.max_elastic);
  CHECK(st.elastic_retired <= st.elastic_spawned);
  if (quiet) {
    CHECK(st.completed + st.cancelled == st.submitted);
    CHECK(st.queued == 0);
    CHECK(st.running == 0);
    CHECK(st.failed <= st.completed);
    CHECK(st.async_inflight == 0);
  }
}

/* ---- the program ------------------------------------------------------------------------------ */

enum op {
  OP_CREATE, OP_SUBMIT, OP_SUBMIT_TIMED, OP_BATCH, OP_GROUP_SUBMIT, OP_GROUP_WAIT, OP_GROUP_CANCEL,
  OP_TIMER_AFTER, OP_TIMER_EVERY, OP_TIMER_CANCEL, OP_ASYNC, OP_COMPLETE, OP_PAUSE, OP_RESUME,
  OP_WAIT, OP_WAIT_FOREVER, OP_SHUTDOWN, OP_DESTROY, OP_STATS, OP_LANES, OP_COALESCE, OP_MISC,
  NOPS
};

typedef struct group_slot {
  tko_group g;
  bool init;
  int slot; /* pool the members went to, -1 = none yet */
  bool cancelled;
} group_slot;

static group_slot groups[NGROUPS];

typedef struct timer_slot {
  tko_timer t;
  int slot; /* pool it was last armed on, -1 = never */
  token *tok;
  bool periodic;
} timer_slot;

static timer_slot timers[NTIMERS];

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
#ifndef FUZZ_KNOWN_BUGS
  /* TKO_KNOWN_BUG_retiring_hook_self_join: a retiring elastic worker whose
   * thread_stop hook submits leaks its thread; thousands of runs would
   * exhaust the process's threads. */
  if (o.max_elastic && o.hooks.thread_stop == thread_stop_submit) o.hooks.thread_stop = thread_hook;
#endif
  memset(&s->fa, 0, sizeof s->fa);
  s->failing = false;
  if (hooks & 64) {
    s->fa.al = (tko_allocator){fa_alloc, fa_realloc, fa_free, &s->fa};
    for (int i = 0; i < 8; i++) s->fa.mask = s->fa.mask << 8 | u8(in);
    s->failing = s->fa.mask != 0;
    o.allocator = &s->fa.al;
  }
  /* Now and then an invalid option: refused, nothing created. */
  uint8_t bad = u8(in);
  int expect_einval = 0;
  if (bad == 0xf1) o.workers = TKO_MAX_WORKERS + 1, expect_einval = 1;
  if (bad == 0xf2) o.max_elastic = TKO_MAX_ELASTIC + 1, expect_einval = 1;
  if (bad == 0xf3) o.full_policy = (tko_full_policy)3, expect_einval = 1;
  if (bad == 0xf4) o.elastic_idle_ms = TKO_MAX_IDLE_MS + 1, expect_einval = 1;
  if (bad == 0xf5) o.initial_capacity = ((size_t)1 << 30) + 1, expect_einval = 1;
  if (o.workers == 0 && o.max_elastic == 0) expect_einval = 1;
  s->o = o;
  tko_pool *p = (tko_pool *)s; /* create must reset it on failure */
  int rc = tko_pool_create(&p, &o);
  if (expect_einval) {
    CHECK(rc == -EINVAL);
    CHECK(p == NULL);
    return;
  }
  CHECK(rc == 0 || (rc == -ENOMEM && s->failing));
  if (rc) {
    CHECK(p == NULL);
    CHECK(atomic_load(&s->fa.live) == 0);
    return;
  }
  s->paused = s->shut = false;
  s->timers_armed = 0;
  /* A bounded BLOCK pool completes async tasks at once, so that no room is
   * held by async tasks waiting for an in-flight slot a held task has. */
  atomic_store(&s->auto_complete, o.queue_capacity && o.full_policy == TKO_FULL_BLOCK);
  atomic_store(&s->pool, p);
}

static void destroy_extras(slot *s) {
  tko_pool *p = atomic_load(&s->pool);
  if (s->paused) { /* lanes and coalescers wait for their tasks to run */
    CHECK(tko_pool_resume(p) == 0);
    s->paused = false;
  }
  if (s->lanes) {
    CHECK(tko_lanes_destroy(s->lanes) == 0);
    s->lanes = NULL;
  }
  if (s->co) {
    CHECK(tko_coalescer_destroy(s->co) == 0);
    s->co = NULL;
  }
}

static void destroy_pool(int si) {
  slot *s = &slots[si];
  tko_pool *p = atomic_load(&s->pool);
  if (!p) return;
  complete_held(si, true);
  destroy_extras(s);
  CHECK(tko_pool_destroy(p) == 0);
  atomic_store(&s->pool, NULL);
  CHECK(atomic_load(&s->fa.live) == 0);
  for (int i = 0; i < NTIMERS; i++)
    if (timers[i].slot == si) timers[i].slot = -1; /* disarmed by shutdown */
  /* Groups of this pool: every member is done. They are destroyed here,
   * because a group remembers its pool (tko_group_cancel on it would touch
   * the freed pool). */
  for (int i = 0; i < NGROUPS; i++)
    if (groups[i].init && groups[i].slot == si) {
      CHECK(tko_group_wait(&groups[i].g, 0) == 0);
      CHECK(tko_group_pending(&groups[i].g) == 0);
      CHECK(tko_group_destroy(&groups[i].g) == 0);
      groups[i].init = false;
    }
}

static void op_submit(input *in, slot *s, int si, int how) {
  tko_pool *p = atomic_load(&s->pool);
  uint8_t k = u8(in);
  token *t = token_new(k % NKINDS, si);
  if (!t) return;
  t->status = (int)(u8(in) % 5);
  int w = weight(in);
  int rc;
  if (how == 1 || may_block_forever(s)) {
    long timeout = (long)(u8(in) % 4) - 1; /* -1 .. 2 ms */
    if (may_block_forever(s) && timeout < 0) timeout = 0;
    rc = tko_submit_timed(p, task_fn, t, w, timeout);
  } else {
    rc = tko_submit(p, task_fn, t, w);
  }
  check_submit_rc(s, rc);
  if (rc == -ETIMEDOUT) CHECK(s->o.queue_capacity && s->o.full_policy == TKO_FULL_BLOCK);
  if (rc == 0) atomic_store(&t->accepted, true);
}

static void op_batch(input *in, slot *s, int si) {
  tko_pool *p = atomic_load(&s->pool);
  if (may_block_forever(s)) return;
  uint8_t b = u8(in);
  size_t n = b % 40;
  if (b == 0xff) n = 1025 + u8(in) % 200; /* larger than the inbox */
#ifndef FUZZ_KNOWN_BUGS
  if (n > 1024 && s->failing) n = 1024; /* TKO_KNOWN_BUG_big_batch_enomem */
#endif
  static tko_task tasks[1300];
  static token *toks[1300];
  int bad = u8(in) % 8 == 0 ? (int)(u8(in) % (n ? n : 1)) : -1;
  for (size_t i = 0; i < n; i++) {
    toks[i] = token_new(K_PLAIN + (int)(i % 3 == 2), si);
    if (!toks[i]) return;
    tasks[i] = (tko_task){task_fn, toks[i], (int)(i % 7) - 3};
  }
  if (n && bad >= 0) tasks[bad].fn = NULL;
  int rc = tko_submit_batch(p, n ? tasks : NULL, n);
  if (n == 0 || bad >= 0) {
    CHECK(rc == -EINVAL);
    return;
  }
  check_submit_rc(s, rc);
  if (rc == -EAGAIN) CHECK(s->o.full_policy == TKO_FULL_REJECT || n > s->o.queue_capacity);
  if (rc == 0)
    for (size_t i = 0; i < n; i++) atomic_store(&toks[i]->accepted, true);
}

static void op_group(input *in, int op, int si) {
  group_slot *g = &groups[u8(in) % NGROUPS];
  if (!g->init) {
    CHECK(tko_group_init(&g->g) == 0);
    g->init = true;
    g->slot = -1;
    g->cancelled = false;
  }
  slot *s = &slots[si];
  tko_pool *p = atomic_load(&s->pool);
  switch (op) {
    case OP_GROUP_SUBMIT: {
      if (!p || may_block_forever(s)) return;
      bool async = (u8(in) & 1) && async_allowed(s);
      token *t = token_new(u8(in) % 2 ? K_FAIL : K_PLAIN, si);
      if (!t) return;
      t->status = 1 + (int)(u8(in) % 3);
      t->maybe_lost = async && s->failing;
      /* Members pending at once share one pool; an empty group may move. */
      bool bound_elsewhere = g->slot >= 0 && g->slot != si && tko_group_pending(&g->g) > 0;
      int rc = async ? tko_group_submit_async(p, &g->g, async_fn, t, weight(in))
                     : tko_group_submit(p, &g->g, task_fn, t, weight(in));
      if (bound_elsewhere && rc == -EINVAL) return; /* (its members may also have
                                                        finished meanwhile) */
      check_submit_rc(s, rc);
      if (rc == 0) atomic_store(&t->accepted, true);
#ifdef FUZZ_KNOWN_BUGS
      if (rc == 0) g->slot = si;
#else
      /* TKO_KNOWN_BUG_group_bound_by_failed_submit: the group is bound to
       * the pool even when the submit fails. */
      g->slot = si;
#endif
      break;
    }
    case OP_GROUP_WAIT: {
      int rc = tko_group_wait(&g->g, (long)(u8(in) % 3));
      CHECK(rc == 0 || rc == -ETIMEDOUT);
      int st = tko_group_status(&g->g);
      CHECK(st == 0 || st == -ECANCELED || st == -ENOMEM || (st >= 1 && st <= 3));
      if (rc == 0 && u8(in) % 4 == 0) {
        CHECK(tko_group_destroy(&g->g) == 0);
        g->init = false;
      } else if (rc != 0 && u8(in) % 4 == 0) {
        int d = tko_group_destroy(&g->g); /* -EBUSY, unless the last member just finished */
        CHECK(d == -EBUSY || d == 0);
        if (d == 0) g->init = false;
      }
      break;
    }
    case OP_GROUP_CANCEL: {
      long n = tko_group_cancel(&g->g);
      CHECK(n >= 0);
      break;
    }
  }
}

static void op_timer(input *in, int op, slot *s, int si) {
  timer_slot *ts = &timers[u8(in) % NTIMERS];
  tko_pool *p = atomic_load(&s->pool);
  if (op == OP_TIMER_CANCEL) {
    if (ts->slot < 0) return; /* never armed, or its pool is gone */
    int rc = tko_timer_cancel(&ts->t);
    CHECK(rc == 0 || rc == -ENOENT);
    if (rc == 0 && ts->tok && !ts->periodic) atomic_fetch_add(&ts->tok->cancels, 1);
    return;
  }
  if (!p) return;
  bool periodic = op == OP_TIMER_EVERY;
  long ms = (long)(u8(in) % 6);
  if (u8(in) == 0xee) ms -= 2; /* -2 .. 5: negative delays are refused */
  token *t = token_new(K_PLAIN + u8(in) % 3, si);
  if (!t) return;
  t->periodic = periodic;
  if (ts->slot >= 0 && ts->slot != si) {
    /* Armed (maybe) on another pool: re-arming it must wait for it to be
     * disarmed there; cancel it first. */
    int rc = tko_timer_cancel(&ts->t);
    CHECK(rc == 0 || rc == -ENOENT);
    if (rc == 0 && ts->tok && !ts->periodic) atomic_fetch_add(&ts->tok->cancels, 1);
  }
  int rc = periodic ? tko_submit_every(p, &ts->t, ms, task_fn, t, weight(in))
                    : tko_submit_after(p, &ts->t, ms, task_fn, t, weight(in));
  if (ms < 0 || (periodic && ms == 0)) {
    CHECK(rc == -EINVAL);
    return;
  }
  CHECK(rc == 0 || rc == -EBUSY || rc == -ESHUTDOWN || (rc == -ENOMEM && s->failing));
  if (rc == 0) {
    atomic_store(&t->accepted, true);
    ts->slot = si;
    ts->tok = t;
    ts->periodic = periodic;
    s->timers_armed++;
  }
}

static void op_lanes(input *in, slot *s, int si) {
  tko_pool *p = atomic_load(&s->pool);
  uint8_t what = u8(in);
  switch (what % 6) {
    case 0:
      if (s->lanes) return;
      {
        tko_lane_options lo = tko_lane_default_options();
        lo.lanes = u8(in) % 9;
        lo.max_drain = u8(in) % 5;
        lo.lane_capacity = u8(in) % 4;
        lo.max_queued = u8(in) % 3 == 0 ? 4 : 0;
        lo.on_cancel = lane_cancel;
        lo.allocator = s->o.allocator;
        int rc = tko_lanes_create(&s->lanes, p, &lo);
        /* A lane table holds its pool: none on a pool already shut down. */
        CHECK(rc == 0 || (rc == -ENOMEM && s->failing) || (rc == -ESHUTDOWN && s->shut));
        if (rc) s->lanes = NULL;
      }
      return;
    case 1:
    case 2: {
      if (!s->lanes || may_block_forever(s)) return;
      token *t = token_new(K_PLAIN + u8(in) % 2, si);
      if (!t) return;
      uint64_t key = u8(in) % 5;
      int w = weight(in);
      int rc = tko_lanes_submit(s->lanes, key, task_fn, t, w);
      CHECK(rc == 0 || rc == -ESHUTDOWN || rc == -EAGAIN || (rc == -ENOMEM && s->failing));
      if (rc == 0) atomic_store(&t->accepted, true);
      return;
    }
    case 3:
      if (s->lanes) {
        int rc = tko_lanes_wait_idle(s->lanes, (long)(u8(in) % 3));
        CHECK(rc == 0 || rc == -ETIMEDOUT);
        tko_lane_stats ls;
        tko_lanes_stats(s->lanes, &ls);
        CHECK(ls.completed + ls.cancelled + ls.queued <= ls.submitted);
      }
      return;
    case 4:
      if (s->lanes) CHECK((u8(in) & 1 ? tko_lanes_cancel(s->lanes) : tko_lanes_close(s->lanes)) == 0);
      return;
    case 5:
      if (s->lanes) {
        if (s->paused) {
          CHECK(tko_pool_resume(p) == 0);
          s->paused = false;
        }
        CHECK(tko_lanes_destroy(s->lanes) == 0);
        s->lanes = NULL;
      }
      return;
  }
}

static void op_coalesce(input *in, slot *s) {
  tko_pool *p = atomic_load(&s->pool);
  uint8_t what = u8(in);
  switch (what % 5) {
    case 0:
      if (s->co) return;
      {
        tko_coalesce_options co = {.allocator = s->o.allocator};
        co.initial_keys = u8(in) % 5;
        co.weight = weight(in);
        unsigned interval = u8(in) % 4;
        int rc = tko_coalescer_create(&s->co, p, interval, co_flush, NULL, &co);
        CHECK(rc == 0 || (rc == -ENOMEM && s->failing) || (rc == -ESHUTDOWN && s->shut));
        if (rc) s->co = NULL;
      }
      return;
    case 1:
    case 2:
      if (s->co) {
        uint64_t key = u8(in) % 16;
        int rc = tko_coalescer_mark(s->co, key, u32(in));
        CHECK(rc == 0 || rc == -ESHUTDOWN || (rc == -ENOMEM && s->failing));
      }
      return;
    case 3:
      if (s->co) {
        tko_coalesce_stats st;
        tko_coalescer_stats(s->co, &st);
        CHECK(st.sweeps <= st.marks + 1);
        CHECK(tko_coalescer_flush(s->co) == 0);
      }
      return;
    case 4:
      if (s->co) {
        if (s->paused) { /* the sweep task must be able to run */
          CHECK(tko_pool_resume(p) == 0);
          s->paused = false;
        }
        CHECK(tko_coalescer_destroy(s->co) == 0);
        s->co = NULL;
      }
      return;
  }
}

static void op_misc(input *in) {
  uint8_t what = u8(in);
  switch (what % 6) {
    case 0: {
      /* Any int, INT_MIN included: negate as unsigned (negating INT_MIN as
       * an int is undefined, which UBSan reported here). */
      const char *m = tko_strerror((int)(0u - u32(in)));
      CHECK(m && strlen(m) < 200);
      CHECK(tko_strerror(0) != NULL);
      break;
    }
    case 1: /* NULL and invalid arguments */
      CHECK(tko_submit(NULL, task_fn, NULL, 0) == -EINVAL);
      CHECK(tko_pool_wait_idle(NULL, 0) == -EINVAL);
      CHECK(tko_pool_shutdown(NULL, TKO_DRAIN) == -EINVAL);
      CHECK(tko_pool_destroy(NULL) == -EINVAL);
      CHECK(tko_pool_pause(NULL) == -EINVAL);
      CHECK(tko_submit_batch(NULL, NULL, 1) == -EINVAL);
      CHECK(tko_pool_create(NULL, NULL) == -EINVAL);
      tko_pool_stats(NULL, NULL);
      CHECK(tko_blocking_begin() == -EPERM);
      CHECK(tko_async_complete(NULL, 0) == -EINVAL);
      CHECK(tko_timer_cancel(NULL) == -EINVAL);
      CHECK(tko_group_wait(NULL, 0) == -EINVAL);
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
      break;
    }
  }
}

static void run_op(input *in) {
  uint8_t op = u8(in) % NOPS;
  int si = u8(in) % NPOOLS;
  slot *s = &slots[si];
  tko_pool *p = atomic_load(&s->pool);
  if (op == OP_CREATE) {
    create_pool(in, si);
    return;
  }
  if (op == OP_MISC) {
    op_misc(in);
    return;
  }
  if (op == OP_GROUP_WAIT || op == OP_GROUP_CANCEL || op == OP_TIMER_CANCEL) {
    if (op == OP_TIMER_CANCEL) op_timer(in, op, s, si);
    else op_group(in, op, si);
    return;
  }
  if (!p) return;
  switch (op) {
    case OP_SUBMIT: op_submit(in, s, si, 0); break;
    case OP_SUBMIT_TIMED: op_submit(in, s, si, 1); break;
    case OP_BATCH: op_batch(in, s, si); break;
    case OP_GROUP_SUBMIT: op_group(in, op, si); break;
    case OP_TIMER_AFTER:
    case OP_TIMER_EVERY: op_timer(in, op, s, si); break;
    case OP_ASYNC: {
      if (!async_allowed(s)) break;
      token *t = token_new(u8(in) % 4 == 0 ? K_FAIL : K_PLAIN, si);
      if (!t) break;
      t->status = (int)(u8(in) % 3);
      t->maybe_lost = s->failing;
      int rc = tko_submit_async(p, async_fn, t, weight(in));
      check_submit_rc(s, rc);
      if (rc == 0) atomic_store(&t->accepted, true);
      break;
    }
    case OP_COMPLETE: complete_held(si, false); break;
    case OP_PAUSE:
      CHECK(tko_pool_pause(p) == 0);
      if (!s->shut) s->paused = true;
      break;
    case OP_RESUME:
      CHECK(tko_pool_resume(p) == 0);
      s->paused = false;
      break;
    case OP_WAIT: {
      int rc = tko_pool_wait_idle(p, (long)(u8(in) % 3));
      CHECK(rc == 0 || rc == -ETIMEDOUT);
      check_stats(s, false);
      break;
    }
    case OP_WAIT_FOREVER:
      /* Safe only when nothing can keep the pool busy for good. */
      if (s->paused) break;
      complete_held(si, true);
      CHECK(tko_pool_wait_idle(p, -1) == 0);
      check_stats(s, stays_quiet(s));
      break;
    case OP_SHUTDOWN: {
      uint8_t m = u8(in);
      complete_held(si, true);
#ifndef FUZZ_KNOWN_BUGS
      /* TKO_KNOWN_BUG_timer_blocked_shutdown: the timer thread may be stuck
       * submitting into the full queue of this paused pool. */
      if (may_block_forever(s) && m % 5 != 4) {
        CHECK(tko_pool_resume(p) == 0);
        s->paused = false;
      }
#endif
      tko_shutdown_mode mode = m % 5 == 4 ? (tko_shutdown_mode)9 : (tko_shutdown_mode)(m & 1);
      int rc = tko_pool_shutdown(p, mode);
      if (m % 5 == 4) {
        CHECK(rc == -EINVAL);
        break;
      }
      CHECK(rc == 0);
      s->shut = true;
      s->paused = false;
      s->timers_armed = 0;
      check_stats(s, true); /* nothing runs after shutdown has returned */
      token *t = token_new(K_PLAIN, si);
      if (t) CHECK(tko_submit(p, task_fn, t, 0) == -ESHUTDOWN);
      break;
    }
    case OP_DESTROY: destroy_pool(si); break;
    case OP_STATS: check_stats(s, false); break;
    case OP_LANES: op_lanes(in, s, si); break;
    case OP_COALESCE: op_coalesce(in, s); break;
    default: break;
  }
}

static void check_tokens(void) {
  int n = atomic_load(&next_token);
  if (n > NTOKENS) n = NTOKENS;
  for (int i = 0; i < n; i++) {
    token *t = &tokens[i];
    int r = atomic_load(&t->runs), c = atomic_load(&t->cancels);
    if (t->periodic) continue; /* each firing is a task: runs or is cancelled */
    if (!atomic_load(&t->accepted)) {
      if (r + c != 0) fprintf(stderr, "fuzz_api: refused token %d ran %d cancelled %d\n", i, r, c);
      CHECK(r + c == 0);
    } else if (t->maybe_lost) {
      CHECK(r + c <= 1);
    } else {
      if (r + c != 1)
        fprintf(stderr, "fuzz_api: token %d (kind %d) ran %d, cancelled %d\n", i, t->kind, r, c);
      CHECK(r + c == 1);
    }
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  input in = {data, size};
  memset(tokens, 0, sizeof tokens);
  atomic_store(&next_token, 0);
  memset(slots, 0, sizeof slots);
  for (int i = 0; i < NGROUPS; i++) groups[i].init = false;
  for (int i = 0; i < NTIMERS; i++) {
    tko_timer_init(&timers[i].t);
    timers[i].slot = -1;
    timers[i].tok = NULL;
  }
  nheld = 0;
  for (int ops = 0; in.n && ops < MAX_OPS; ops++) run_op(&in);
  for (int i = 0; i < NPOOLS; i++) destroy_pool(i);
  CHECK(nheld == 0);
  for (int i = 0; i < NGROUPS; i++) {
    if (!groups[i].init) continue;
    CHECK(tko_group_wait(&groups[i].g, 0) == 0);
    CHECK(tko_group_destroy(&groups[i].g) == 0);
    groups[i].init = false;
  }
  check_tokens();
  return 0;
}
