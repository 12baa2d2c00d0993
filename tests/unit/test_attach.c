/* SPDX-License-Identifier: MIT */
/* Unit tests for attachments (src/lifecycle.h): shutdown calls an
 * attachment's close with its mode until it returns 0, reporting
 * -ETIMEDOUT meanwhile while the pool still accepts submits (CLOSING); a
 * pool with an attachment cannot be freed (-EBUSY) and refuses new ones
 * once its shutdown began; after detach, destroy frees it. */
#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "lifecycle.h"
#include "taskorch.h"
#include "tko_test.h"

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
