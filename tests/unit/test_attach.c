/* SPDX-License-Identifier: MIT */
/* Unit tests for attachments (src/engine/lifecycle.h): shutdown calls an
 * attachment's close with its mode until it returns 0, reporting
 * -ETIMEDOUT meanwhile while the pool still accepts submits (CLOSING); a
 * pool with an attachment cannot be freed (-EBUSY) and refuses new ones
 * once its shutdown began; after detach, destroy frees it; a detach waits
 * for a close that shutdown is calling. */
#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "lifecycle.h"
#include "taskorch.h"
#include "tko_test.h"
#include "tko_test_feature.h"

typedef struct fake {
  tko__attachment a; /* first: close gets &a */
  atomic_int calls, ready;
  atomic_int mode;
  long last_timeout;
} fake;

static int fake_close(tko__attachment *a, tko_shutdown_mode mode, long timeout_ms) {
  fake *f = (fake *)a;
  atomic_fetch_add(&f->calls, 1);
  atomic_store(&f->mode, (int)mode);
  f->last_timeout = timeout_ms;
  return atomic_load(&f->ready) ? 0 : -ETIMEDOUT;
}

static int nop(void *arg) {
  (void)arg;
  return 0;
}

Test(attach, shutdown_resolves_attachments_and_destroy_is_ebusy_until_detached) {
  tko_options o = tko_basic_options(1);
  tko_pool *pool = NULL;
  cr_assert_eq(tko_pool_create(&pool, &o), 0);
  fake f = {.a = {.close = fake_close}};
  cr_assert_eq(tko__attach(pool, &f.a), 0);
  tko__attachment bad = {.close = NULL};
  cr_assert_eq(tko__attach(pool, &bad), -EINVAL);
  cr_assert_eq(tko__attach(pool, NULL), -EINVAL);
  fake orphan = {.a = {.close = fake_close}};
  cr_assert_eq(tko__attach(NULL, &orphan.a), -EINVAL);

  /* Unresolved: the shutdown times out, the pool still takes work. */
  cr_assert_eq(tko_pool_shutdown_timed(pool, TKO_DRAIN, 0), -ETIMEDOUT);
  cr_assert_eq(atomic_load(&f.calls), 1);
  cr_assert_eq(atomic_load(&f.mode), TKO_DRAIN);
  cr_assert_eq(f.last_timeout, 0);
  cr_assert_eq(tko_submit(pool, nop, NULL, 0), 0);
  fake late = {.a = {.close = fake_close}};
  cr_assert_eq(tko__attach(pool, &late.a), -ESHUTDOWN);

  /* Resolved: the shutdown completes and never asks again. */
  atomic_store(&f.ready, 1);
  cr_assert_eq(tko_pool_shutdown_timed(pool, TKO_DRAIN, -1), 0);
  cr_assert_eq(atomic_load(&f.calls), 2);
  cr_assert_eq(f.last_timeout, -1);
  cr_assert_eq(tko_submit(pool, nop, NULL, 0), -ESHUTDOWN);
  tko_stats s;
  tko_pool_stats(pool, &s);
  cr_assert_eq(s.completed, 1);

  /* Still attached: destroy refuses and frees nothing. */
  cr_assert_eq(tko_pool_destroy(pool), -EBUSY);
  cr_assert_eq(atomic_load(&f.calls), 2);
  tko__detach(pool, &f.a);
  cr_assert_eq(tko_pool_destroy(pool), 0);
}

Test(attach, cancel_nowait_calls_close_once_with_cancel_and_no_wait) {
  tko_options o = tko_basic_options(1);
  tko_pool *pool = NULL;
  cr_assert_eq(tko_pool_create(&pool, &o), 0);
  fake f = {.a = {.close = fake_close}};
  cr_assert_eq(tko__attach(pool, &f.a), 0);
  cr_assert_eq(tko_pool_shutdown_timed(pool, TKO_CANCEL_NOWAIT, -1), 0);
  cr_assert_eq(atomic_load(&f.calls), 1);
  cr_assert_eq(atomic_load(&f.mode), TKO_CANCEL);
  cr_assert_eq(f.last_timeout, 0);
  cr_assert_eq(tko_submit(pool, nop, NULL, 0), -ESHUTDOWN);
  tko__detach(pool, &f.a);
  cr_assert_eq(tko_pool_destroy(pool), 0);
  cr_assert_eq(atomic_load(&f.calls), 1);
}

/* An attachment whose close blocks until the test lets it return. */
typedef struct slow {
  tko__attachment a; /* first: close gets &a */
  tt_gate in_close, release;
  atomic_bool returned; /* close is about to return */
  tko_pool *pool;
  bool returned_at_detach; /* what the detaching thread saw */
} slow;

static int slow_close(tko__attachment *a, tko_shutdown_mode mode, long timeout_ms) {
  (void)mode;
  (void)timeout_ms;
  slow *s = (slow *)a;
  tt_gate_open(&s->in_close);
  tt_gate_wait(&s->release);
  atomic_store(&s->returned, true);
  return 0;
}

static int shut_down(void *arg) { return tko_pool_shutdown(((slow *)arg)->pool, TKO_DRAIN); }

static int detach_it(void *arg) {
  slow *s = arg;
  tko__detach(s->pool, &s->a);
  s->returned_at_detach = atomic_load(&s->returned);
  return 0;
}

/* The owner of an attachment frees it after tko__detach: a detach must not
 * return while shutdown is still inside the attachment's close. The close
 * is held until the detaching thread is asleep (in detach's wait) or done,
 * so a detach that does not wait returns while close still runs. */
Test(attach, detach_waits_for_a_close_in_progress) {
  tko_options o = tko_basic_options(1);
  slow s = {.a = {.close = slow_close}, .in_close = TT_GATE_INIT, .release = TT_GATE_INIT};
  cr_assert_eq(tko_pool_create(&s.pool, &o), 0);
  cr_assert_eq(tko__attach(s.pool, &s.a), 0);
  tf_thread shutter, detacher;
  cr_assert_eq(tf_thread_start(&shutter, shut_down, &s), 0);
  cr_assert(tt_gate_wait(&s.in_close));
  cr_assert_eq(tf_thread_start(&detacher, detach_it, &s), 0);
  for (;;) {
    char st = tf_thread_state(detacher.tid);
    if (st == 'S' || st == 'D' || tf_thread_is_done(&detacher)) break;
    sched_yield();
  }
  tt_gate_open(&s.release);
  int rc = -1;
  cr_assert(tf_thread_join_within(&detacher, TT_LONG_MS, &rc));
  cr_assert(s.returned_at_detach, "tko__detach returned while close was still running");
  cr_assert(tf_thread_join_within(&shutter, TT_LONG_MS, &rc));
  cr_assert_eq(rc, 0);
  cr_assert_eq(tko_pool_destroy(s.pool), 0);
}
