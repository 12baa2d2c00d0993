/* SPDX-License-Identifier: MIT */
/* Attack scenes for bounded pools (queue_capacity > 0) under each full
 * policy, through the public API only: more submitter threads than the
 * pool has submit rings, mixing plain, timed, batch, handle, keyed and
 * lane-table submits, meet concurrent shutdowns of every mode (and timed
 * ones), pause/resume togglers, resizers and wait_idle callers while tasks
 * hold their workers until released. Every task has a slot of its own that
 * records whether its submit was accepted and whether it ran or reached
 * on_cancel; the test thread checks that each accepted task did exactly one
 * of those, each refused one neither, every return code is one the docs
 * allow, the stats add up, and that once idle a bounded queue takes exactly
 * queue_capacity tasks again. Failures seen on other threads are recorded
 * and asserted by the test thread. A watchdog turns a hang into an abort. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <taskorch.h>
#include <taskorch/lanes.h>

#include "tko_test.h"
#include "tko_test_sync.h"

/* More than the pool's 64 submit rings, under every build. */
#define NSUB 70
#define SLOTS_PER_SUB 160
#define CAP 8

/* ---- watchdog ----------------------------------------------------------- */

typedef struct watchdog {
  pthread_t t;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool done;
  const char *what;
  long ms;
} watchdog;

static void *watchdog_main(void *arg) {
  watchdog *w = arg;
  struct timespec dl;
  tt_deadline(&dl, w->ms);
  pthread_mutex_lock(&w->mu);
  int rc = 0;
  while (!w->done && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&w->cv, &w->mu, &dl);
  bool done = w->done;
  pthread_mutex_unlock(&w->mu);
  if (!done) {
    fprintf(stderr, "WATCHDOG: scene '%s' did not finish within %ld ms: hang\n", w->what, w->ms);
    abort();
  }
  return NULL;
}

static void watchdog_start(watchdog *w, const char *what) {
  pthread_mutex_init(&w->mu, NULL);
  pthread_cond_init(&w->cv, NULL);
  w->done = false;
  w->what = what;
  w->ms = TT_SCALE(120000L, 300000L);
  cr_assert_eq(pthread_create(&w->t, NULL, watchdog_main, w), 0);
}

static void watchdog_stop(watchdog *w) {
  pthread_mutex_lock(&w->mu);
  w->done = true;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
  pthread_join(w->t, NULL);
  pthread_cond_destroy(&w->cv);
  pthread_mutex_destroy(&w->mu);
}

/* ---- the ledger: one slot per task ------------------------------------- */

typedef struct ledger ledger;

typedef struct slot {
  atomic_int ran, cancelled, accepted, refused, explicit_cancel;
  ledger *L;
  tko_handle h;
} slot;

struct ledger {
  slot *slots;
  size_t nslots;
  atomic_size_t next;
  atomic_int hold;
  tt_gate gate;
  tt_count started;
  pthread_t driver;
  atomic_int on_driver;
  atomic_int bad; /* first failure seen off the test thread */
  char bad_msg[256];
  pthread_mutex_t bad_mu;
};

static void ledger_init(ledger *L, size_t n) {
  memset(L, 0, sizeof *L);
  L->slots = calloc(n, sizeof *L->slots);
  cr_assert_not_null(L->slots);
  L->nslots = n;
  for (size_t i = 0; i < n; i++) L->slots[i].L = L;
  pthread_mutex_init(&L->gate.mu, NULL);
  pthread_cond_init(&L->gate.cv, NULL);
  L->gate.open = false;
  tt_count_init(&L->started);
  pthread_mutex_init(&L->bad_mu, NULL);
  L->driver = pthread_self();
}

static void ledger_fini(ledger *L) {
  free(L->slots);
  tt_count_fini(&L->started);
  pthread_cond_destroy(&L->gate.cv);
  pthread_mutex_destroy(&L->gate.mu);
  pthread_mutex_destroy(&L->bad_mu);
}

static void ledger_fail(ledger *L, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void ledger_fail(ledger *L, const char *fmt, ...) {
  pthread_mutex_lock(&L->bad_mu);
  if (!atomic_load(&L->bad)) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(L->bad_msg, sizeof L->bad_msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "FAILURE: %s\n", L->bad_msg);
    atomic_store(&L->bad, 1);
  }
  pthread_mutex_unlock(&L->bad_mu);
}

/* Holds every task that starts (except on the test thread) until released. */
static void ledger_hold(ledger *L) {
  pthread_mutex_lock(&L->gate.mu);
  L->gate.open = false;
  pthread_mutex_unlock(&L->gate.mu);
  atomic_store(&L->hold, 1);
}

static void ledger_release(ledger *L) {
  atomic_store(&L->hold, 0);
  tt_gate_open(&L->gate);
}

static slot *slot_take(ledger *L, size_t n) {
  size_t i = atomic_fetch_add(&L->next, n);
  if (i + n > L->nslots) return NULL;
  return &L->slots[i];
}

static int slot_fn(void *arg) {
  slot *s = arg;
  ledger *L = s->L;
  int prev = atomic_fetch_add(&s->ran, 1);
  if (prev != 0) ledger_fail(L, "slot %td ran twice", s - L->slots);
  if (atomic_load(&s->cancelled)) ledger_fail(L, "slot %td ran after on_cancel", s - L->slots);
  tt_count_add(&L->started, 1);
  if (pthread_equal(pthread_self(), L->driver)) atomic_fetch_add(&L->on_driver, 1);
  else if (atomic_load(&L->hold)) tt_gate_wait(&L->gate);
  return 0;
}

static void slot_cancelled(slot *s) {
  ledger *L = s->L;
  int prev = atomic_fetch_add(&s->cancelled, 1);
  if (prev != 0) ledger_fail(L, "slot %td reached on_cancel twice", s - L->slots);
  if (atomic_load(&s->ran)) ledger_fail(L, "slot %td reached on_cancel after it ran", s - L->slots);
}

static void pool_on_cancel(void *user, const tko_task_info *t) {
  (void)user;
  slot_cancelled(t->arg);
}

static void lanes_on_cancel(void *user, const tko_lane_task *t) {
  (void)user;
  slot_cancelled(t->arg);
}

static void mark(slot *s, size_t n, bool accepted) {
  for (size_t i = 0; i < n; i++) atomic_store(accepted ? &s[i].accepted : &s[i].refused, 1);
}

/* Every accepted task ran or reached on_cancel exactly once; every refused
 * one did neither. With drain_only, only explicit handle cancels may reach
 * on_cancel. Returns the number of tasks that ran. */
static long ledger_check(ledger *L, bool drain_only) {
  size_t n = atomic_load(&L->next);
  if (n > L->nslots) n = L->nslots;
  long ran = 0, acc_n = 0, ref_n = 0, can_n = 0;
  for (size_t i = 0; i < n; i++) {
    slot *s = &L->slots[i];
    int r = atomic_load(&s->ran), c = atomic_load(&s->cancelled);
    int a = atomic_load(&s->accepted), f = atomic_load(&s->refused);
    cr_assert(!(a && f), "slot %zu both accepted and refused", i);
    if (a) {
      cr_assert_eq(r + c, 1, "accepted slot %zu: ran %d, cancelled %d", i, r, c);
      if (drain_only && c)
        cr_assert(atomic_load(&s->explicit_cancel),
                  "slot %zu reached on_cancel in a drain without a cancel call", i);
    } else {
      cr_assert_eq(r + c, 0, "refused/unsubmitted slot %zu: ran %d, cancelled %d", i, r, c);
    }
    ran += r;
    acc_n += a;
    ref_n += f;
    can_n += c;
  }
  if (getenv("TKO_ATTACK_VERBOSE"))
    fprintf(stderr, "ledger: %zu slots, %ld accepted, %ld refused, %ld ran, %ld cancelled\n", n,
            acc_n, ref_n, ran, can_n);
  cr_assert_not(atomic_load(&L->bad), "%s", L->bad_msg);
  return ran;
}

/* ---- a scene: a bounded pool, a lane table, submitters, helpers --------- */

typedef enum op {
  OP_SUBMIT,
  OP_TIMED,
  OP_BATCH,
  OP_HANDLE,
  OP_KEYED,
  OP_LANES,
  OP_LANES_WAIT,
  OP_N
} op;

typedef struct scene {
  tko_pool *p;
  tko_lanes *lanes;
  ledger L;
  tko_full_policy pol;
  unsigned workers;
  long budget;          /* calls per submitter (0: until shut down) */
  atomic_int stop_aux;  /* ends the pauser, resizer and waiters */
  tt_count accepted;    /* tasks accepted, all submitters */
  tt_count eshutdown;   /* -ESHUTDOWN returns seen */
  tt_count subs_done;
} scene;

typedef struct sub {
  scene *S;
  int idx;
  pthread_t t;
} sub;

static const char *op_name(int o) {
  static const char *n[] = {"submit", "timed", "batch", "handle", "keyed", "lanes", "lanes_wait"};
  return n[o];
}

static bool rc_allowed(scene *S, int o, int rc, long timeout) {
  if (rc == 0 || rc == -ESHUTDOWN) return true;
  if (rc == -EAGAIN) return S->pol == TKO_FULL_REJECT;
  if (rc == -ETIMEDOUT) return o == OP_TIMED && S->pol == TKO_FULL_BLOCK && timeout >= 0;
  if (rc == -ECANCELED) return o == OP_LANES_WAIT;
  return false;
}

static void *sub_main(void *arg) {
  sub *u = arg;
  scene *S = u->S;
  ledger *L = &S->L;
  bool shut = false;
  int after_shut = 0, shut_op = -1;
  uint64_t rng = 0x9E3779B97F4A7C15ull ^ (uint64_t)(u->idx + 1) * 0x100000001B3ull;
  for (long call = 0; S->budget == 0 || call < S->budget; call++) {
    if (shut && after_shut++ >= OP_N) break;
    int o = shut ? (after_shut - 1) % OP_N : (int)(tt_rand(&rng) % OP_N);
    if (!S->lanes && (o == OP_LANES || o == OP_LANES_WAIT)) o = OP_SUBMIT;
    size_t n = o == OP_BATCH ? 1 + tt_rand(&rng) % 4 : 1;
    slot *s = slot_take(L, n);
    if (!s) break;
    int w = (int)(tt_rand(&rng) % 3) - 1;
    long timeout = 0;
    uint64_t key = (uint64_t)u->idx % 7;
    int rc;
    switch (o) {
    case OP_SUBMIT: rc = tko_submit(S->p, slot_fn, s, w); break;
    case OP_TIMED: {
      static const long tos[] = {0, 1, 20, -1};
      timeout = tos[tt_rand(&rng) % 4];
      rc = tko_submit_timed(S->p, slot_fn, s, w, timeout);
      break;
    }
    case OP_BATCH: {
      tko_task t[4];
      for (size_t i = 0; i < n; i++) t[i] = (tko_task){slot_fn, &s[i], w};
      rc = tko_submit_batch(S->p, t, n);
      break;
    }
    case OP_HANDLE: {
      rc = tko_submit_handle(S->p, &s->h, slot_fn, s, w);
      if (rc == 0) {
        atomic_store(&s->explicit_cancel, 1); /* may reach on_cancel even in a drain */
        int c = tko_handle_cancel(&s->h);
        if (c != 0 && c != -EBUSY)
          ledger_fail(L, "tko_handle_cancel: %s", tko_err_name(c));
      }
      break;
    }
    case OP_KEYED: rc = tko_submit_keyed(S->p, key, slot_fn, s, w); break;
    case OP_LANES: rc = tko_lanes_submit(S->lanes, key, slot_fn, s, w); break;
    default: rc = tko_lanes_submit_wait(S->lanes, key, slot_fn, s, w); break;
    }
    if (!rc_allowed(S, o, rc, timeout))
      ledger_fail(L, "sub %d: %s returned %s (policy %d)", u->idx, op_name(o), tko_err_name(rc),
                  (int)S->pol);
    if (shut && rc != -ESHUTDOWN)
      ledger_fail(L,
                  "sub %d: %s returned %s (task ran %d, on caller %d) after %s returned "
                  "-ESHUTDOWN (policy %d)",
                  u->idx, op_name(o), tko_err_name(rc), atomic_load(&s->ran),
                  rc == 0 && atomic_load(&s->ran) == 1, op_name(shut_op), (int)S->pol);
    if (o == OP_LANES_WAIT && rc == 0 && atomic_load(&s->ran) != 1)
      ledger_fail(L, "sub %d: lanes_submit_wait returned 0 before its task ran", u->idx);
    if (o == OP_LANES_WAIT && rc == -ECANCELED && atomic_load(&s->cancelled) != 1)
      ledger_fail(L, "sub %d: lanes_submit_wait returned -ECANCELED before on_cancel", u->idx);
    bool acc = rc == 0 || rc == -ECANCELED;
    mark(s, n, acc);
    if (acc) tt_count_add(&S->accepted, (long)n);
    if (rc == -ESHUTDOWN) {
      tt_count_add(&S->eshutdown, 1);
      if (o <= OP_HANDLE && !shut) {
        shut = true;
        shut_op = o;
      }
    }
    if (rc == -EAGAIN || rc == -ETIMEDOUT) sched_yield();
  }
  tt_count_add(&S->subs_done, 1);
  return NULL;
}

static void *pauser_main(void *arg) {
  scene *S = arg;
  while (!atomic_load(&S->stop_aux)) {
    int a = tko_pool_pause(S->p), b;
    sched_yield();
    b = tko_pool_resume(S->p);
    if (a || b) ledger_fail(&S->L, "pause/resume: %s %s", tko_err_name(a), tko_err_name(b));
    sched_yield();
  }
  int rc = tko_pool_resume(S->p);
  if (rc) ledger_fail(&S->L, "final resume: %s", tko_err_name(rc));
  return NULL;
}

static void *resizer_main(void *arg) {
  scene *S = arg;
  unsigned k = 0;
  while (!atomic_load(&S->stop_aux)) {
    int rc = tko_pool_resize(S->p, 1 + k++ % 3, 0);
    if (rc != 0 && rc != -ESHUTDOWN) ledger_fail(&S->L, "resize: %s", tko_err_name(rc));
    sched_yield();
  }
  return NULL;
}

static void *waiter_main(void *arg) {
  scene *S = arg;
  while (!atomic_load(&S->stop_aux)) {
    int rc = tko_pool_wait_idle(S->p, 2);
    if (rc != 0 && rc != -ETIMEDOUT) ledger_fail(&S->L, "wait_idle: %s", tko_err_name(rc));
  }
  return NULL;
}

typedef struct aux {
  pthread_t pauser, resizer, waiter[2];
  bool has_pauser, has_resizer;
} aux;

static void aux_start(scene *S, aux *x, bool pauser, bool resizer) {
  x->has_pauser = pauser;
  x->has_resizer = resizer;
  if (pauser) cr_assert_eq(pthread_create(&x->pauser, NULL, pauser_main, S), 0);
  if (resizer) cr_assert_eq(pthread_create(&x->resizer, NULL, resizer_main, S), 0);
  for (int i = 0; i < 2; i++) cr_assert_eq(pthread_create(&x->waiter[i], NULL, waiter_main, S), 0);
}

static void aux_stop(scene *S, aux *x) {
  atomic_store(&S->stop_aux, 1);
  if (x->has_pauser) pthread_join(x->pauser, NULL);
  if (x->has_resizer) pthread_join(x->resizer, NULL);
  for (int i = 0; i < 2; i++) pthread_join(x->waiter[i], NULL);
}

/* max_batch 0: the pool's default. */
static void scene_init_batch(scene *S, tko_full_policy pol, unsigned workers, bool lanes,
                             unsigned max_batch) {
  memset(S, 0, sizeof *S);
  ledger_init(&S->L, (size_t)NSUB * SLOTS_PER_SUB + 48000);
  S->pol = pol;
  S->workers = workers;
  tt_count_init(&S->accepted);
  tt_count_init(&S->eshutdown);
  tt_count_init(&S->subs_done);
  tko_options o = tko_basic_options(workers);
  o.queue_capacity = CAP;
  o.full_policy = pol;
  o.hooks.on_cancel = pool_on_cancel;
  o.hooks.user = &S->L;
  if (max_batch) o.max_batch = max_batch;
  cr_assert_eq(tko_pool_create(&S->p, &o), 0);
  if (lanes) {
    tko_lane_options lo = tko_lane_default_options();
    lo.lanes = 4;
    lo.max_drain = 3;
    lo.on_cancel = lanes_on_cancel;
    cr_assert_eq(tko_lanes_create(&S->lanes, S->p, &lo), 0);
  }
}

static void scene_init(scene *S, tko_full_policy pol, unsigned workers, bool lanes) {
  scene_init_batch(S, pol, workers, lanes, 0);
}

static void scene_fini(scene *S) {
  tt_count_fini(&S->accepted);
  tt_count_fini(&S->eshutdown);
  tt_count_fini(&S->subs_done);
  ledger_fini(&S->L);
}

static void subs_start(scene *S, sub *u) {
  for (int i = 0; i < NSUB; i++) {
    u[i] = (sub){S, i, 0};
    cr_assert_eq(pthread_create(&u[i].t, NULL, sub_main, &u[i]), 0);
  }
}

static void subs_join(sub *u) {
  for (int i = 0; i < NSUB; i++) pthread_join(u[i].t, NULL);
}

/* Quiet pool: the stats add up. */
static void stats_add_up(scene *S) {
  tko_stats st;
  tko_pool_stats(S->p, &st);
  cr_assert_eq(st.queued, 0);
  cr_assert_eq(st.running, 0);
  cr_assert_eq(st.submitted, st.completed + st.cancelled,
               "submitted %llu, completed %llu, cancelled %llu", (unsigned long long)st.submitted,
               (unsigned long long)st.completed, (unsigned long long)st.cancelled);
}

/* ---- shutdown scenes ---------------------------------------------------- */

enum { SD_DRAIN, SD_CANCEL, SD_NOWAIT, SD_TIMED, SD_MIXED };

typedef struct shutter {
  scene *S;
  int mode; /* tko_shutdown_mode, or -1: timed DRAIN loop, -2: timed CANCEL loop */
  int rc;
  pthread_t t;
} shutter;

static void *shutter_main(void *arg) {
  shutter *h = arg;
  if (h->mode >= 0) {
    h->rc = tko_pool_shutdown(h->S->p, (tko_shutdown_mode)h->mode);
  } else {
    tko_shutdown_mode m = h->mode == -1 ? TKO_DRAIN : TKO_CANCEL;
    do h->rc = tko_pool_shutdown_timed(h->S->p, m, 5);
    while (h->rc == -ETIMEDOUT);
  }
  return NULL;
}

static void shutdown_scene(tko_full_policy pol, unsigned workers, int sd, bool pauser,
                           bool resizer) {
  static scene S;
  static sub u[NSUB];
  watchdog wd;
  watchdog_start(&wd, "shutdown_scene");
  scene_init(&S, pol, workers, true);
  ledger_hold(&S.L);
  aux x;
  aux_start(&S, &x, pauser, resizer);
  subs_start(&S, u);
  /* The queue is full (or the submitters are stuck in held caller-runs). */
  cr_assert(tt_count_wait_geq(&S.accepted, CAP), "the queue never filled");

  shutter sh[4];
  int nsh = 0;
  switch (sd) {
  case SD_DRAIN:
    for (int i = 0; i < 3; i++) sh[nsh++] = (shutter){&S, TKO_DRAIN, 1, 0};
    break;
  case SD_CANCEL:
    for (int i = 0; i < 3; i++) sh[nsh++] = (shutter){&S, TKO_CANCEL, 1, 0};
    break;
  case SD_NOWAIT:
    sh[nsh++] = (shutter){&S, TKO_CANCEL_NOWAIT, 1, 0};
    sh[nsh++] = (shutter){&S, TKO_DRAIN, 1, 0};
    break;
  case SD_TIMED: {
    /* Tasks are held: a drain cannot finish. */
    int rc = tko_pool_shutdown_timed(S.p, TKO_DRAIN, 0);
    cr_assert_eq(rc, -ETIMEDOUT, "timed drain with held tasks: %s", tko_err_name(rc));
    sh[nsh++] = (shutter){&S, -2, 1, 0};
    sh[nsh++] = (shutter){&S, -1, 1, 0};
    break;
  }
  default:
    sh[nsh++] = (shutter){&S, TKO_DRAIN, 1, 0};
    sh[nsh++] = (shutter){&S, TKO_CANCEL, 1, 0};
    sh[nsh++] = (shutter){&S, -1, 1, 0};
    sh[nsh++] = (shutter){&S, TKO_CANCEL_NOWAIT, 1, 0};
    break;
  }
  for (int i = 0; i < nsh; i++) cr_assert_eq(pthread_create(&sh[i].t, NULL, shutter_main, &sh[i]), 0);
  /* Let the shutdown meet the held tasks for a moment (not asserted). */
  (void)tt_count_wait_geq_within(&S.eshutdown, 1, 200);
  ledger_release(&S.L);
  for (int i = 0; i < nsh; i++) {
    pthread_join(sh[i].t, NULL);
    cr_assert_eq(sh[i].rc, 0, "shutdown (mode %d) returned %s", sh[i].mode, tko_err_name(sh[i].rc));
  }
  /* A later call in either mode returns 0 at once. */
  cr_assert_eq(tko_pool_shutdown(S.p, TKO_CANCEL), 0);
  cr_assert_eq(tko_pool_shutdown_timed(S.p, TKO_DRAIN, 0), 0);
  subs_join(u);
  aux_stop(&S, &x);
  cr_assert_eq(tko_submit(S.p, slot_fn, NULL, 0), -ESHUTDOWN);
  cr_assert_eq(tko_pool_wait_idle(S.p, 0), 0);
  stats_add_up(&S);
  cr_assert_eq(tko_lanes_destroy(S.lanes), 0);
  cr_assert_eq(tko_pool_destroy(S.p), 0);
  ledger_check(&S.L, sd == SD_DRAIN);
  scene_fini(&S);
  watchdog_stop(&wd);
}

#define SHUTDOWN_TESTS(pname, pol)                                                         \
  Test(attack_bounded, pname##_drain_two_workers) { shutdown_scene(pol, 2, SD_DRAIN, false, false); } \
  Test(attack_bounded, pname##_cancel_two_workers) { shutdown_scene(pol, 2, SD_CANCEL, false, false); } \
  Test(attack_bounded, pname##_nowait_then_drain) { shutdown_scene(pol, 2, SD_NOWAIT, false, false); } \
  Test(attack_bounded, pname##_timed_drain_then_cancel) { shutdown_scene(pol, 2, SD_TIMED, false, false); } \
  Test(attack_bounded, pname##_mixed_concurrent_shutdowns) { shutdown_scene(pol, 2, SD_MIXED, false, false); } \
  Test(attack_bounded, pname##_drain_one_worker_paused) { shutdown_scene(pol, 1, SD_DRAIN, true, false); } \
  Test(attack_bounded, pname##_cancel_one_worker_paused) { shutdown_scene(pol, 1, SD_CANCEL, true, false); } \
  Test(attack_bounded, pname##_drain_resized_and_paused) { shutdown_scene(pol, 2, SD_DRAIN, true, true); } \
  Test(attack_bounded, pname##_mixed_resized_and_paused) { shutdown_scene(pol, 2, SD_MIXED, true, true); }

SHUTDOWN_TESTS(block, TKO_FULL_BLOCK)
SHUTDOWN_TESTS(reject, TKO_FULL_REJECT)
SHUTDOWN_TESTS(caller_runs, TKO_FULL_CALLER_RUNS)

/* ---- room accounting after churn ---------------------------------------- */

/* All workers held, then exactly CAP tasks fit, and the next one meets the
 * full policy. `batch`: the CAP tasks go in as one batch. */
static void room_check(scene *S, bool batch) {
  ledger *L = &S->L;
  long before = tt_count_get(&L->started);
  ledger_hold(L);
  slot *pins = slot_take(L, S->workers);
  cr_assert_not_null(pins);
  for (unsigned i = 0; i < S->workers; i++) {
    cr_assert_eq(tko_submit(S->p, slot_fn, &pins[i], 0), 0);
    mark(&pins[i], 1, true);
  }
  cr_assert(tt_count_wait_geq(&L->started, before + S->workers), "workers never took the pins");
  int driver_runs = atomic_load(&L->on_driver);
  slot *s = slot_take(L, CAP + 2);
  cr_assert_not_null(s);
  if (batch) {
    tko_task t[CAP];
    for (int i = 0; i < CAP; i++) t[i] = (tko_task){slot_fn, &s[i], 0};
    int rc = tko_submit_batch(S->p, t, CAP);
    cr_assert_eq(rc, 0, "a full batch of queue_capacity after idle: %s", tko_err_name(rc));
    mark(s, CAP, true);
  } else {
    for (int i = 0; i < CAP; i++) {
      int rc = tko_submit_timed(S->p, slot_fn, &s[i], 0, TT_LONG_MS);
      cr_assert_eq(rc, 0, "task %d of queue_capacity after idle: %s", i, tko_err_name(rc));
      mark(&s[i], 1, true);
    }
  }
  cr_assert_eq(atomic_load(&L->on_driver), driver_runs, "room was missing: a task ran on the caller");
  tko_stats st;
  tko_pool_stats(S->p, &st);
  cr_assert_eq(st.queued, CAP);
  int rc;
  switch (S->pol) {
  case TKO_FULL_REJECT:
    rc = tko_submit(S->p, slot_fn, &s[CAP], 0);
    cr_assert_eq(rc, -EAGAIN, "one past capacity: %s", tko_err_name(rc));
    mark(&s[CAP], 1, false);
    rc = tko_submit_keyed(S->p, 3, slot_fn, &s[CAP + 1], 0);
    cr_assert_eq(rc, -EAGAIN, "keyed one past capacity: %s", tko_err_name(rc));
    mark(&s[CAP + 1], 1, false);
    break;
  case TKO_FULL_BLOCK:
    rc = tko_submit_timed(S->p, slot_fn, &s[CAP], 0, 0);
    cr_assert_eq(rc, -ETIMEDOUT, "one past capacity: %s", tko_err_name(rc));
    mark(&s[CAP], 1, false);
    rc = tko_submit_timed(S->p, slot_fn, &s[CAP + 1], 0, 1);
    cr_assert_eq(rc, -ETIMEDOUT, "one past capacity: %s", tko_err_name(rc));
    mark(&s[CAP + 1], 1, false);
    break;
  default:
    rc = tko_submit(S->p, slot_fn, &s[CAP], 0);
    cr_assert_eq(rc, 0);
    mark(&s[CAP], 1, true);
    cr_assert_eq(atomic_load(&s[CAP].ran), 1, "one past capacity did not run on the caller");
    rc = tko_submit_keyed(S->p, 12345, slot_fn, &s[CAP + 1], 0);
    cr_assert_eq(rc, 0);
    mark(&s[CAP + 1], 1, true);
    cr_assert_eq(atomic_load(&s[CAP + 1].ran), 1, "keyed one past capacity did not run on the caller");
    break;
  }
  ledger_release(L);
  cr_assert_eq(tko_pool_wait_idle(S->p, TT_LONG_MS), 0);
}

static void room_scene(tko_full_policy pol, unsigned workers, bool pauser, bool resizer) {
  static scene S;
  static sub u[NSUB];
  watchdog wd;
  watchdog_start(&wd, "room_scene");
  scene_init(&S, pol, workers, true);
  S.budget = TT_SCALE(60, 25);
  aux x;
  aux_start(&S, &x, pauser, resizer);
  subs_start(&S, u);
  subs_join(u);
  aux_stop(&S, &x);
  if (resizer) {
    cr_assert_eq(tko_pool_resize(S.p, workers, 0), 0);
    /* A shrink retires workers as they finish: wait for the count to settle. */
    uint64_t end = tt_now_ns() + (uint64_t)TT_LONG_MS * 1000000u;
    tko_stats st;
    do {
      tko_pool_stats(S.p, &st);
      if (st.basic_workers == workers) break;
      sched_yield();
    } while (tt_now_ns() < end);
    cr_assert_eq(st.basic_workers, workers);
  }
  cr_assert_eq(tko_lanes_wait_idle(S.lanes, TT_LONG_MS), 0);
  cr_assert_eq(tko_pool_wait_idle(S.p, TT_LONG_MS), 0);
  stats_add_up(&S);
  ledger_check(&S.L, true);
  room_check(&S, false);
  room_check(&S, true);
  room_check(&S, false);
  cr_assert_eq(tko_lanes_destroy(S.lanes), 0);
  cr_assert_eq(tko_pool_destroy(S.p), 0);
  ledger_check(&S.L, true);
  scene_fini(&S);
  watchdog_stop(&wd);
}

Test(attack_bounded, room_block_after_churn) { room_scene(TKO_FULL_BLOCK, 2, false, false); }
Test(attack_bounded, room_reject_after_churn) { room_scene(TKO_FULL_REJECT, 2, false, false); }
Test(attack_bounded, room_caller_runs_after_churn) { room_scene(TKO_FULL_CALLER_RUNS, 2, false, false); }
Test(attack_bounded, room_block_after_churn_paused_resized) { room_scene(TKO_FULL_BLOCK, 2, true, true); }
Test(attack_bounded, room_reject_after_churn_paused_resized) { room_scene(TKO_FULL_REJECT, 2, true, true); }
Test(attack_bounded, room_caller_runs_after_churn_paused_resized) {
  room_scene(TKO_FULL_CALLER_RUNS, 2, true, true);
}
Test(attack_bounded, room_block_one_worker_paused) { room_scene(TKO_FULL_BLOCK, 1, true, false); }
Test(attack_bounded, room_reject_one_worker_paused) { room_scene(TKO_FULL_REJECT, 1, true, false); }

/* ---- submitters held for room while the pool is resized ------------------ */

/* One worker held; NSUB threads block for room; growing the pool while they
 * wait lets them in; shrinking back loses nothing. One task per take: a
 * worker's take of several would hold them behind its held task, and
 * taken tasks keep their room until they start, so the grown workers
 * could find fewer than one each. */
Test(attack_bounded, blocked_submitters_get_in_when_the_pool_grows) {
  static scene S;
  static sub u[NSUB];
  watchdog wd;
  watchdog_start(&wd, "grow");
  scene_init_batch(&S, TKO_FULL_BLOCK, 1, false, 1);
  S.budget = 4;
  ledger_hold(&S.L);
  subs_start(&S, u);
  cr_assert(tt_count_wait_geq(&S.accepted, CAP + 1), "the queue never filled");
  cr_assert(tt_count_wait_geq(&S.L.started, 1));
  cr_assert_eq(tko_pool_resize(S.p, 4, 0), 0);
  /* The new workers each take a task (and hold it): room for more. */
  cr_assert(tt_count_wait_geq(&S.L.started, 4), "grown workers did not start queued tasks");
  cr_assert(tt_count_wait_geq(&S.accepted, CAP + 4), "blocked submitters did not get the room");
  cr_assert_eq(tko_pool_resize(S.p, 1, 0), 0);
  ledger_release(&S.L);
  subs_join(u);
  cr_assert_eq(tko_pool_wait_idle(S.p, TT_LONG_MS), 0);
  stats_add_up(&S);
  long ran = ledger_check(&S.L, true);
  tko_stats st;
  tko_pool_stats(S.p, &st);
  cr_assert_eq(st.completed, (uint64_t)ran);
  S.workers = 1;
  uint64_t end = tt_now_ns() + (uint64_t)TT_LONG_MS * 1000000u;
  do {
    tko_pool_stats(S.p, &st);
    if (st.basic_workers == 1) break;
    sched_yield();
  } while (tt_now_ns() < end);
  cr_assert_eq(st.basic_workers, 1);
  room_check(&S, true);
  cr_assert_eq(tko_pool_destroy(S.p), 0);
  ledger_check(&S.L, true);
  scene_fini(&S);
  watchdog_stop(&wd);
}

/* ---- tasks submitting to their own full pool ---------------------------- */

typedef struct inner {
  scene *S;
  slot *s;     /* 8 slots */
  int rc[6];
  uint64_t wait_key; /* on another lane than key 1 */
  tt_count ready;
  tt_gate go;
  tt_count done;
} inner;

static inner g_in;

static int depth_fn(void *arg);

typedef struct deep {
  ledger *L;
  scene *S;
  int depth;
  atomic_int max;
} deep;
static deep g_deep;

static int depth_fn(void *arg) {
  deep *d = arg;
  int my = ++d->depth;
  if (my > atomic_load(&d->max)) atomic_store(&d->max, my);
  if (my < 20) {
    int rc = tko_submit(d->S->p, depth_fn, d, 0);
    if (rc != 0) ledger_fail(d->L, "caller-runs recursion at depth %d: %s", my, tko_err_name(rc));
  }
  d->depth--;
  return 0;
}

static int spawner_fn(void *arg) {
  inner *in = arg;
  scene *S = in->S;
  tt_count_add(&in->ready, 1);
  tt_gate_wait(&in->go);
  slot *s = in->s;
  tko_task t[2] = {{slot_fn, &s[2], 0}, {slot_fn, &s[3], 0}};
  in->rc[0] = tko_submit(S->p, slot_fn, &s[0], 0);
  in->rc[1] = tko_submit_timed(S->p, slot_fn, &s[1], 0, 1000);
  in->rc[2] = tko_submit_batch(S->p, t, 2);
  in->rc[3] = tko_submit_keyed(S->p, 77, slot_fn, &s[4], 0);
  in->rc[4] = tko_lanes_submit(S->lanes, 1, slot_fn, &s[5], 0);
  in->rc[5] = tko_lanes_submit_wait(S->lanes, in->wait_key, slot_fn, &s[6], 0);
  if (S->pol == TKO_FULL_CALLER_RUNS) (void)depth_fn(&g_deep);
  tt_count_add(&in->done, 1);
  return 0;
}

static void own_pool_scene(tko_full_policy pol) {
  static scene S;
  watchdog wd;
  watchdog_start(&wd, "own_pool");
  scene_init(&S, pol, 1, true);
  memset(&g_in, 0, sizeof g_in);
  memset(&g_deep, 0, sizeof g_deep);
  g_deep.L = &S.L;
  g_deep.S = &S;
  g_in.S = &S;
  g_in.s = slot_take(&S.L, 8);
  g_in.wait_key = 2;
  while (tko_lanes_index(S.lanes, g_in.wait_key) == tko_lanes_index(S.lanes, 1)) g_in.wait_key++;
  tt_count_init(&g_in.ready);
  tt_count_init(&g_in.done);
  pthread_mutex_init(&g_in.go.mu, NULL);
  pthread_cond_init(&g_in.go.cv, NULL);
  cr_assert_eq(tko_submit(S.p, spawner_fn, &g_in, 0), 0);
  cr_assert(tt_count_wait_geq(&g_in.ready, 1));
  /* Fill the queue behind the spawner, which holds the only worker. */
  slot *f = slot_take(&S.L, CAP);
  tko_task t[CAP];
  for (int i = 0; i < CAP; i++) t[i] = (tko_task){slot_fn, &f[i], 0};
  cr_assert_eq(tko_submit_batch(S.p, t, CAP), 0);
  mark(f, CAP, true);
  tt_gate_open(&g_in.go);
  cr_assert(tt_count_wait_geq(&g_in.done, 1), "a task submitting to its own full pool hangs");
  slot *s = g_in.s;
  size_t n_of[6] = {1, 1, 2, 1, 1, 1};
  slot *first[6] = {&s[0], &s[1], &s[2], &s[4], &s[5], &s[6]};
  for (int i = 0; i < 6; i++) {
    int rc = g_in.rc[i];
    int want;
    if (i == 5) want = 0; /* an idle lane runs on its caller */
    else if (pol == TKO_FULL_CALLER_RUNS) want = 0;
    else want = -EAGAIN;
    cr_assert_eq(rc, want, "policy %d, call %d from a task on its full pool: %s (want %s)", (int)pol,
                 i, tko_err_name(rc), tko_err_name(want));
    mark(first[i], n_of[i], rc == 0);
    if (rc == 0 && (pol == TKO_FULL_CALLER_RUNS || i == 5))
      for (size_t k = 0; k < n_of[i]; k++)
        cr_assert_eq(atomic_load(&first[i][k].ran), 1, "call %d: task did not run on the caller", i);
  }
  if (pol == TKO_FULL_CALLER_RUNS) cr_assert_eq(atomic_load(&g_deep.max), 20);
  cr_assert_eq(tko_lanes_wait_idle(S.lanes, TT_LONG_MS), 0);
  cr_assert_eq(tko_pool_wait_idle(S.p, TT_LONG_MS), 0);
  stats_add_up(&S);
  ledger_check(&S.L, true);
  S.workers = 1;
  room_check(&S, true);
  cr_assert_eq(tko_lanes_destroy(S.lanes), 0);
  cr_assert_eq(tko_pool_destroy(S.p), 0);
  ledger_check(&S.L, true);
  scene_fini(&S);
  watchdog_stop(&wd);
}

Test(attack_bounded, own_full_pool_block) { own_pool_scene(TKO_FULL_BLOCK); }
Test(attack_bounded, own_full_pool_reject) { own_pool_scene(TKO_FULL_REJECT); }
Test(attack_bounded, own_full_pool_caller_runs) { own_pool_scene(TKO_FULL_CALLER_RUNS); }

/* ---- one worker: exact submit order and gap-free ids -------------------- */

#define ORD_PER 24

typedef struct ord_rec {
  int thread, seq;
  atomic_ullong id;
  uint64_t begin_ns, end_ns; /* the submit call that accepted it */
} ord_rec;

typedef struct ord {
  tko_pool *p;
  tko_full_policy pol;
  ord_rec rec[NSUB][ORD_PER];
  pthread_mutex_t mu;
  int log_thread[NSUB * ORD_PER];
  int log_seq[NSUB * ORD_PER];
  uint64_t log_id[NSUB * ORD_PER];
  ord_rec *log_rec[NSUB * ORD_PER];
  int nlog;
  atomic_int accepted;
  atomic_int bad;
  bool use_timed;
  char msg[200];
} ord;

static ord g_ord;

static void ord_before(void *user, const tko_task_info *t) {
  (void)user;
  ord_rec *r = t->arg;
  atomic_store(&r->id, t->id);
}

static int ord_fn(void *arg) {
  ord_rec *r = arg;
  pthread_mutex_lock(&g_ord.mu);
  int i = g_ord.nlog++;
  g_ord.log_thread[i] = r->thread;
  g_ord.log_seq[i] = r->seq;
  g_ord.log_id[i] = atomic_load(&r->id);
  g_ord.log_rec[i] = r;
  pthread_mutex_unlock(&g_ord.mu);
  return 0;
}

static void *ord_sub(void *arg) {
  int me = (int)(intptr_t)arg;
  uint64_t rng = 12345u + (uint64_t)me;
  int seq = 0;
  while (seq < ORD_PER) {
    int o = (int)(tt_rand(&rng) % 3);
    if (o == 1 && !g_ord.use_timed) o = 0;
    int n = o == 2 ? (ORD_PER - seq < 3 ? ORD_PER - seq : 3) : 1;
    uint64_t b = tt_now_ns();
    for (int k = 0; k < n; k++) g_ord.rec[me][seq + k] = (ord_rec){me, seq + k, 0, b, 0};
    int rc;
    if (o == 0) rc = tko_submit(g_ord.p, ord_fn, &g_ord.rec[me][seq], 0);
    else if (o == 1) rc = tko_submit_timed(g_ord.p, ord_fn, &g_ord.rec[me][seq], 0, 1);
    else {
      tko_task t[3];
      for (int k = 0; k < n; k++) t[k] = (tko_task){ord_fn, &g_ord.rec[me][seq + k], 0};
      rc = tko_submit_batch(g_ord.p, t, (size_t)n);
    }
    if (rc == 0) {
      uint64_t e = tt_now_ns();
      for (int k = 0; k < n; k++) g_ord.rec[me][seq + k].end_ns = e;
      seq += n;
      atomic_fetch_add(&g_ord.accepted, n);
    } else if (rc == -EAGAIN || rc == -ETIMEDOUT) {
      bool ok = rc == -EAGAIN ? g_ord.pol == TKO_FULL_REJECT : (g_ord.pol == TKO_FULL_BLOCK && o == 1);
      if (!ok && !atomic_exchange(&g_ord.bad, 1))
        snprintf(g_ord.msg, sizeof g_ord.msg, "op %d returned %s", o, tko_err_name(rc));
      sched_yield();
    } else {
      if (!atomic_exchange(&g_ord.bad, 1))
        snprintf(g_ord.msg, sizeof g_ord.msg, "op %d returned %s", o, tko_err_name(rc));
      break;
    }
  }
  return NULL;
}

static void *ord_pauser(void *arg) {
  atomic_int *stop = arg;
  while (!atomic_load(stop)) {
    tko_pool_pause(g_ord.p);
    sched_yield();
    tko_pool_resume(g_ord.p);
    sched_yield();
  }
  tko_pool_resume(g_ord.p);
  return NULL;
}

static void one_worker_order(tko_full_policy pol, bool pause, bool timed) {
  watchdog wd;
  watchdog_start(&wd, "one_worker_order");
  memset(&g_ord, 0, sizeof g_ord);
  pthread_mutex_init(&g_ord.mu, NULL);
  g_ord.pol = pol;
  g_ord.use_timed = timed;
  tko_options o = tko_basic_options(1);
  o.queue_capacity = 4;
  o.full_policy = pol;
  o.hooks.before_run = ord_before;
  cr_assert_eq(tko_pool_create(&g_ord.p, &o), 0);
  static pthread_t t[NSUB];
  pthread_t pt;
  atomic_int stop = 0;
  if (pause) cr_assert_eq(pthread_create(&pt, NULL, ord_pauser, &stop), 0);
  for (int i = 0; i < NSUB; i++)
    cr_assert_eq(pthread_create(&t[i], NULL, ord_sub, (void *)(intptr_t)i), 0);
  for (int i = 0; i < NSUB; i++) pthread_join(t[i], NULL);
  atomic_store(&stop, 1);
  if (pause) pthread_join(pt, NULL);
  cr_assert_eq(tko_pool_wait_idle(g_ord.p, TT_LONG_MS), 0);
  cr_assert_not(atomic_load(&g_ord.bad), "%s", g_ord.msg);
  int n = g_ord.nlog;
  cr_assert_eq(n, NSUB * ORD_PER);
  int last[NSUB];
  for (int i = 0; i < NSUB; i++) last[i] = -1;
  for (int i = 0; i < n; i++) {
    int th = g_ord.log_thread[i];
    cr_assert_eq(g_ord.log_seq[i], last[th] + 1, "thread %d: seq %d started after %d", th,
                 g_ord.log_seq[i], last[th]);
    last[th] = g_ord.log_seq[i];
  }
  /* Submits ordered in time (one returned before the other began) start in
   * that order on a one-worker pool. */
  int ordered_inversions = 0;
  for (int j = 1; j < n; j++)
    for (int i = 0; i < j; i++)
      if (g_ord.log_rec[j]->end_ns < g_ord.log_rec[i]->begin_ns) {
        if (!ordered_inversions++)
          fprintf(stderr,
                  "one worker: thread %d's task (id %llu) started before thread %d's (id %llu) "
                  "whose submit began %llu ns after the first's returned\n",
                  g_ord.log_rec[i]->thread, (unsigned long long)g_ord.log_id[i],
                  g_ord.log_rec[j]->thread, (unsigned long long)g_ord.log_id[j],
                  (unsigned long long)(g_ord.log_rec[i]->begin_ns - g_ord.log_rec[j]->end_ns));
      }
  cr_assert_eq(ordered_inversions, 0, "one worker: %d ordered submits started out of order",
               ordered_inversions);
  /* Overlapping submits of different threads may start in either order
   * (taskorch.h), so start order need not be id order; the ids are
   * gap-free. */
  uint64_t maxid = 0;
  for (int i = 0; i < n; i++)
    if (g_ord.log_id[i] > maxid) maxid = g_ord.log_id[i];
  cr_assert_eq(maxid, (uint64_t)n,
               "one-worker ids are not gap-free: %d tasks, largest id %llu (%llu ids skipped)", n,
               (unsigned long long)maxid, (unsigned long long)(maxid - (uint64_t)n));
  tko_stats st;
  tko_pool_stats(g_ord.p, &st);
  cr_assert_eq(st.submitted, (uint64_t)n);
  cr_assert_eq(st.completed, (uint64_t)n);
  cr_assert_eq(tko_pool_destroy(g_ord.p), 0);
  pthread_mutex_destroy(&g_ord.mu);
  watchdog_stop(&wd);
}

Test(attack_bounded, one_worker_block_keeps_order_and_gap_free_ids) {
  one_worker_order(TKO_FULL_BLOCK, false, false);
}
Test(attack_bounded, one_worker_reject_keeps_order_and_gap_free_ids) {
  one_worker_order(TKO_FULL_REJECT, false, false);
}
Test(attack_bounded, one_worker_block_paused_keeps_order_and_gap_free_ids) {
  one_worker_order(TKO_FULL_BLOCK, true, false);
}
Test(attack_bounded, one_worker_reject_paused_keeps_order_and_gap_free_ids) {
  one_worker_order(TKO_FULL_REJECT, true, false);
}
/* tko_submit_timed is not named in the gap-free clause: timed-out submits
 * are mixed in here. */
Test(attack_bounded, one_worker_block_with_timed_submits_keeps_order_and_gap_free_ids) {
  one_worker_order(TKO_FULL_BLOCK, false, true);
}
Test(attack_bounded, one_worker_reject_with_timed_submits_keeps_order_and_gap_free_ids) {
  one_worker_order(TKO_FULL_REJECT, true, true);
}

/* ---- a timed drain that times out while keyed tasks resolve ------------- */

/* The only worker is held; a keyed task waits in its lane; a timed drain
 * with no wait times out. Whatever a plain submit then returns, an accepted
 * task runs exactly once, and keyed submits are refused. */
Test(attack_bounded, timed_drain_timing_out_during_keyed_resolution) {
  static scene S;
  watchdog wd;
  watchdog_start(&wd, "timed_drain_keyed");
  scene_init(&S, TKO_FULL_BLOCK, 1, false);
  ledger_hold(&S.L);
  slot *s = slot_take(&S.L, 4);
  cr_assert_eq(tko_submit(S.p, slot_fn, &s[0], 0), 0);
  mark(&s[0], 1, true);
  cr_assert(tt_count_wait_geq(&S.L.started, 1));
  cr_assert_eq(tko_submit_keyed(S.p, 5, slot_fn, &s[1], 0), 0);
  mark(&s[1], 1, true);
  cr_assert_eq(tko_pool_shutdown_timed(S.p, TKO_DRAIN, 0), -ETIMEDOUT);
  int rc = tko_submit(S.p, slot_fn, &s[2], 0);
  cr_assert(rc == 0 || rc == -ESHUTDOWN, "%s", tko_err_name(rc));
  if (rc != 0) fprintf(stderr, "note: plain submit after a timed-out drain: %s\n", tko_err_name(rc));
  else fprintf(stderr, "note: plain submit after a timed-out drain was ACCEPTED\n");
  mark(&s[2], 1, rc == 0);
  cr_assert_eq(tko_submit_keyed(S.p, 6, slot_fn, &s[3], 0), -ESHUTDOWN);
  mark(&s[3], 1, false);
  ledger_release(&S.L);
  cr_assert_eq(tko_pool_shutdown(S.p, TKO_DRAIN), 0);
  stats_add_up(&S);
  cr_assert_eq(tko_pool_destroy(S.p), 0);
  ledger_check(&S.L, true);
  scene_fini(&S);
  watchdog_stop(&wd);
}

/* ---- return codes while a shutdown is under way ------------------------- */

typedef struct bg_shutdown {
  tko_pool *p;
  tko_shutdown_mode mode;
  int rc;
  pthread_t t;
} bg_shutdown;

static void *bg_shutdown_main(void *arg) {
  bg_shutdown *b = arg;
  b->rc = tko_pool_shutdown(b->p, b->mode);
  return NULL;
}

/* CLOSING: the only worker is held and a lane table's runner fills the
 * one-slot queue, so the shutdown waits for the table to drain, and plain
 * submits are still accepted (tko_submit: -ESHUTDOWN only past CLOSING).
 * On a full CALLER_RUNS queue an accepted task runs on the caller. Every
 * plain call made there returns the same thing. */
Test(attack_bounded, closing_caller_runs_plain_submits_agree) {
  static scene S;
  watchdog wd;
  watchdog_start(&wd, "closing_caller_runs");
  scene_init(&S, TKO_FULL_CALLER_RUNS, 1, false);
  S.pol = TKO_FULL_CALLER_RUNS;
  tko_options o = tko_basic_options(1);
  (void)o;
  tko_lane_options lo = tko_lane_default_options();
  lo.lanes = 4;
  lo.on_cancel = lanes_on_cancel;
  cr_assert_eq(tko_lanes_create(&S.lanes, S.p, &lo), 0);
  ledger_hold(&S.L);
  slot *s = slot_take(&S.L, 64);
  /* The worker is held by a plain task; a lane's runner waits in the
   * queue, so the table has work to resolve when the shutdown begins. */
  cr_assert_eq(tko_submit(S.p, slot_fn, &s[0], 0), 0);
  mark(&s[0], 1, true);
  cr_assert(tt_count_wait_geq(&S.L.started, 1));
  cr_assert_eq(tko_lanes_submit(S.lanes, 7, slot_fn, &s[62], 0), 0);
  mark(&s[62], 1, true);
  cr_assert_eq(tko_lanes_submit(S.lanes, 7, slot_fn, &s[63], 0), 0);
  mark(&s[63], 1, true);
  /* Fill the queue but for one slot (the runner holds one). */
  for (int i = 1; i < CAP - 1; i++) {
    cr_assert_eq(tko_submit(S.p, slot_fn, &s[i], 0), 0);
    mark(&s[i], 1, true);
    cr_assert_eq(atomic_load(&s[i].ran), 0);
  }
  bg_shutdown b = {S.p, TKO_DRAIN, 1, 0};
  cr_assert_eq(pthread_create(&b.t, NULL, bg_shutdown_main, &b), 0);
  /* Wait until the shutdown has begun (resize is -ESHUTDOWN from then on). */
  int k = CAP + 1, rc;
  uint64_t end = tt_now_ns() + (uint64_t)TT_LONG_MS * 1000000u;
  while ((rc = tko_pool_resize(S.p, 1, 0)) == 0 && tt_now_ns() < end) sched_yield();
  cr_assert_eq(rc, -ESHUTDOWN);
  rc = tko_submit_keyed(S.p, 99, slot_fn, &s[k], 0);
  mark(&s[k], 1, rc == 0);
  k++;
  cr_assert_eq(rc, -ESHUTDOWN, "keyed submit once shutdown began: %s", tko_err_name(rc));
  /* If the shutdown runs the lane itself (held), it is still resolving. */
  bool lane_started = tt_count_wait_geq_within(&S.L.started, 2, 300);
  fprintf(stderr, "closing/caller_runs: lane task started during the shutdown: %d\n", lane_started);
  int r_room = tko_submit(S.p, slot_fn, &s[k], 0);
  mark(&s[k], 1, r_room == 0);
  k++;
  int r_submit = tko_submit(S.p, slot_fn, &s[k], 0);
  mark(&s[k], 1, r_submit == 0);
  k++;
  tko_task t1 = {slot_fn, &s[k], 0};
  int r_batch = tko_submit_batch(S.p, &t1, 1);
  mark(&s[k], 1, r_batch == 0);
  k++;
  int r_timed = tko_submit_timed(S.p, slot_fn, &s[k], 0, 0);
  mark(&s[k], 1, r_timed == 0);
  k++;
  int r_submit2 = tko_submit(S.p, slot_fn, &s[k], 0);
  mark(&s[k], 1, r_submit2 == 0);
  k++;
  fprintf(stderr, "closing/caller_runs: with room %s; full: submit %s, batch %s, timed %s, submit %s\n",
          tko_err_name(r_room), tko_err_name(r_submit), tko_err_name(r_batch), tko_err_name(r_timed),
          tko_err_name(r_submit2));
  ledger_release(&S.L);
  pthread_join(b.t, NULL);
  cr_assert_eq(b.rc, 0);
  stats_add_up(&S);
  cr_assert_eq(tko_lanes_destroy(S.lanes), 0);
  cr_assert_eq(tko_pool_destroy(S.p), 0);
  ledger_check(&S.L, true);
  cr_assert(r_room == r_submit && r_submit == r_batch && r_batch == r_timed && r_timed == r_submit2,
            "plain submits disagree in one state: %s %s %s %s %s", tko_err_name(r_room),
            tko_err_name(r_submit),
            tko_err_name(r_batch), tko_err_name(r_timed), tko_err_name(r_submit2));
  scene_fini(&S);
  watchdog_stop(&wd);
}

/* DRAINING with a full queue the held worker cannot empty: once a plain
 * submit returned -ESHUTDOWN, every later plain submit does too, whatever
 * the policy (the pool never reopens). */
static void draining_full(tko_full_policy pol) {
  static scene S;
  watchdog wd;
  watchdog_start(&wd, "draining_full");
  scene_init(&S, pol, 1, false);
  ledger_hold(&S.L);
  slot *s = slot_take(&S.L, 4096);
  cr_assert_eq(tko_submit(S.p, slot_fn, &s[0], 0), 0);
  mark(&s[0], 1, true);
  cr_assert(tt_count_wait_geq(&S.L.started, 1));
  tko_task t[CAP];
  for (int i = 0; i < CAP; i++) t[i] = (tko_task){slot_fn, &s[1 + i], 0};
  cr_assert_eq(tko_submit_batch(S.p, t, CAP), 0);
  mark(&s[1], CAP, true);
  bg_shutdown b = {S.p, TKO_DRAIN, 1, 0};
  cr_assert_eq(pthread_create(&b.t, NULL, bg_shutdown_main, &b), 0);
  size_t k = 1 + CAP;
  int rc = 0, first_shut = -1, bad = 0, badrc = 0, badop = -1;
  uint64_t end = tt_now_ns() + (uint64_t)TT_LONG_MS * 1000000u;
  while ((rc = tko_pool_resize(S.p, 1, 0)) == 0 && tt_now_ns() < end) sched_yield();
  cr_assert_eq(rc, -ESHUTDOWN);
  for (int i = 0; k + 4 < 4096 && tt_now_ns() < end; i++) {
    int o = i % 3;
    if (o == 0) rc = tko_submit(S.p, slot_fn, &s[k], 0);
    else if (o == 1) rc = tko_submit_timed(S.p, slot_fn, &s[k], 0, 0);
    else {
      tko_task t2[2] = {{slot_fn, &s[k], 0}, {slot_fn, &s[k + 1], 0}};
      rc = tko_submit_batch(S.p, t2, 2);
      mark(&s[k + 1], 1, rc == 0);
      k++;
    }
    mark(&s[k], 1, rc == 0);
    k++;
    if (rc == -ESHUTDOWN && first_shut < 0) first_shut = i;
    if (first_shut >= 0 && rc != -ESHUTDOWN && !bad) {
      bad = 1;
      badrc = rc;
      badop = o;
    }
    if (first_shut >= 0 && i > first_shut + 300) break;
    if (pol == TKO_FULL_CALLER_RUNS && rc == 0) continue;
    sched_yield();
  }
  ledger_release(&S.L);
  pthread_join(b.t, NULL);
  cr_assert_eq(b.rc, 0);
  stats_add_up(&S);
  cr_assert_eq(tko_pool_destroy(S.p), 0);
  ledger_check(&S.L, true);
  (void)badrc;
  (void)badop;
  cr_assert(first_shut >= 0, "no plain submit saw -ESHUTDOWN during the drain");
  if (bad)
    fprintf(stderr, "draining_full: policy %d: op %d returned %s after a plain submit returned -ESHUTDOWN\n",
            (int)pol, badop, tko_err_name(badrc));
  cr_assert_not(bad, "policy %d: op %d returned %s after a plain submit returned -ESHUTDOWN",
                (int)pol, badop, tko_err_name(badrc));
  scene_fini(&S);
  watchdog_stop(&wd);
}

Test(attack_bounded, draining_full_block_stays_shut) { draining_full(TKO_FULL_BLOCK); }
Test(attack_bounded, draining_full_reject_stays_shut) { draining_full(TKO_FULL_REJECT); }
Test(attack_bounded, draining_full_caller_runs_stays_shut) { draining_full(TKO_FULL_CALLER_RUNS); }

/* ---- a caller-run refused, then a queued submit accepted ----------------- */

/* Submitters alternate a batch larger than queue_capacity (which runs on
 * the caller on a CALLER_RUNS pool) and single submits, while a drain
 * begins. Shutdown moves one way: once any plain submit of a thread
 * returned -ESHUTDOWN, none of its later plain submits may be accepted. */
typedef struct race {
  tko_pool *p;
  ledger *L;
  tko_full_policy pol;
  atomic_int go;
  atomic_int violations;
  char msg[200];
  tt_count accepted;
  tt_count done;
} race;

static const char *race_op_name(int o) {
  static const char *n[] = {"batch", "submit", "timed submit (0 ms)"};
  return n[o];
}

static void *race_sub(void *arg) {
  race *r = arg;
  bool shut = false;
  int shut_op = -1, after = 0;
  while (!atomic_load(&r->go)) sched_yield();
  for (int i = 0; i < 600 && after < 30; i++) {
    int o = i % 3;
    if (r->pol == TKO_FULL_BLOCK && o == 0) o = 2;
    /* Over capacity on CALLER_RUNS (runs on the caller); a full batch on
     * REJECT (an over-capacity one is -EAGAIN even once shut down: see
     * over_capacity_batch_after_shutdown). */
    size_t n = o == 0 ? (r->pol == TKO_FULL_CALLER_RUNS ? CAP + 1 : CAP) : 1;
    slot *s = slot_take(r->L, n);
    if (!s) break;
    int rc;
    if (o == 1) rc = tko_submit(r->p, slot_fn, s, 0);
    else if (o == 2) rc = tko_submit_timed(r->p, slot_fn, s, 0, 0);
    else {
      tko_task t[CAP + 1];
      for (size_t k = 0; k < n; k++) t[k] = (tko_task){slot_fn, &s[k], 0};
      rc = tko_submit_batch(r->p, t, n);
    }
    mark(s, n, rc == 0);
    if (rc == 0) tt_count_add(&r->accepted, 1);
    bool ok = rc == 0 || rc == -ESHUTDOWN ||
              (rc == -EAGAIN && r->pol == TKO_FULL_REJECT) ||
              (rc == -ETIMEDOUT && r->pol == TKO_FULL_BLOCK && o == 2);
    if (!ok) ledger_fail(r->L, "%s: %s", race_op_name(o), tko_err_name(rc));
    if (shut && rc != -ESHUTDOWN && !atomic_exchange(&r->violations, 1))
      snprintf(r->msg, sizeof r->msg, "%s returned %s (task ran %d) after %s returned -ESHUTDOWN",
               race_op_name(o), tko_err_name(rc), atomic_load(&s->ran), race_op_name(shut_op));
    if (rc == -ESHUTDOWN && !shut) {
      shut = true;
      shut_op = o;
    }
    if (shut) after++;
    if (rc != 0) sched_yield();
  }
  tt_count_add(&r->done, 1);
  return NULL;
}

static bool race_once(tko_full_policy pol, bool lanes, unsigned workers, int *violations) {
  static scene S;
  scene_init(&S, pol, workers, lanes);
  race r;
  memset(&r, 0, sizeof r);
  r.p = S.p;
  r.L = &S.L;
  r.pol = pol;
  tt_count_init(&r.accepted);
  tt_count_init(&r.done);
  enum { NR = 8 };
  pthread_t t[NR];
  for (int i = 0; i < NR; i++) cr_assert_eq(pthread_create(&t[i], NULL, race_sub, &r), 0);
  atomic_store(&r.go, 1);
  /* Shut down once the submitters are busy (or, on a starved worker, done). */
  uint64_t end = tt_now_ns() + (uint64_t)TT_LONG_MS * 1000000u;
  while (!tt_count_wait_geq_within(&r.accepted, 40, 10) && tt_count_get(&r.done) < NR &&
         tt_now_ns() < end) {
  }
  cr_assert_eq(tko_pool_shutdown(S.p, TKO_DRAIN), 0);
  for (int i = 0; i < NR; i++) pthread_join(t[i], NULL);
  stats_add_up(&S);
  if (S.lanes) cr_assert_eq(tko_lanes_destroy(S.lanes), 0);
  cr_assert_eq(tko_pool_destroy(S.p), 0);
  ledger_check(&S.L, true);
  if (atomic_load(&r.violations)) {
    (*violations)++;
    fprintf(stderr, "race (policy %d, lanes %d, workers %u): %s\n", (int)pol, lanes, workers, r.msg);
  }
  tt_count_fini(&r.accepted);
  tt_count_fini(&r.done);
  scene_fini(&S);
  return true;
}

static void refusal_is_final(tko_full_policy pol, bool lanes, unsigned workers) {
  watchdog wd;
  watchdog_start(&wd, "refusal_is_final");
  int v = 0, rounds = TT_SCALE(40, 10);
  for (int i = 0; i < rounds; i++) race_once(pol, lanes, workers, &v);
  watchdog_stop(&wd);
  cr_assert_eq(v, 0, "%d of %d rounds: a plain submit returned other than -ESHUTDOWN after one returned it",
               v, rounds);
}

Test(attack_bounded, caller_runs_refusal_is_final_one_worker) {
  refusal_is_final(TKO_FULL_CALLER_RUNS, false, 1);
}
Test(attack_bounded, caller_runs_refusal_is_final_with_rings_and_a_lane_table) {
  refusal_is_final(TKO_FULL_CALLER_RUNS, true, 2);
}
Test(attack_bounded, reject_refusal_is_final_one_worker) { refusal_is_final(TKO_FULL_REJECT, false, 1); }
Test(attack_bounded, reject_refusal_is_final_with_rings_and_a_lane_table) {
  refusal_is_final(TKO_FULL_REJECT, true, 2);
}
Test(attack_bounded, block_refusal_is_final_one_worker) { refusal_is_final(TKO_FULL_BLOCK, false, 1); }
Test(attack_bounded, block_refusal_is_final_with_rings_and_a_lane_table) {
  refusal_is_final(TKO_FULL_BLOCK, true, 2);
}

/* Once the pool is shut down every submit is -ESHUTDOWN, whatever the
 * policy: a batch larger than queue_capacity included, and on CALLER_RUNS
 * it must not run on the caller. */
static void over_capacity_batch_after_shutdown(tko_full_policy pol) {
  static scene S;
  scene_init(&S, pol, 1, false);
  cr_assert_eq(tko_pool_shutdown(S.p, TKO_DRAIN), 0);
  slot *s = slot_take(&S.L, CAP + 1);
  tko_task t[CAP + 1];
  for (int k = 0; k < CAP + 1; k++) t[k] = (tko_task){slot_fn, &s[k], 0};
  int rc = tko_submit_batch(S.p, t, CAP + 1);
  mark(s, CAP + 1, rc == 0);
  int ran = atomic_load(&s[0].ran);
  stats_add_up(&S);
  cr_assert_eq(tko_pool_destroy(S.p), 0);
  ledger_check(&S.L, true);
  cr_assert_eq(ran, 0, "policy %d: an over-capacity batch ran after shutdown", (int)pol);
  cr_assert_eq(rc, -ESHUTDOWN, "policy %d: an over-capacity batch after shutdown: %s", (int)pol,
               tko_err_name(rc));
  scene_fini(&S);
}

Test(attack_bounded, over_capacity_batch_after_shutdown_block) {
  over_capacity_batch_after_shutdown(TKO_FULL_BLOCK);
}
Test(attack_bounded, over_capacity_batch_after_shutdown_reject) {
  over_capacity_batch_after_shutdown(TKO_FULL_REJECT);
}
Test(attack_bounded, over_capacity_batch_after_shutdown_caller_runs) {
  over_capacity_batch_after_shutdown(TKO_FULL_CALLER_RUNS);
}
