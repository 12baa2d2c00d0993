#include "tko_test.h"
#include "taskorch.h"
static int inc(void *a) { __atomic_fetch_add((int *)a, 1, __ATOMIC_RELAXED); return 0; }
Test(smoke, runs) {
  tko_pool *p; tko_options o = tko_basic_options(2);
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  int n = 0;
  for (int i = 0; i < 1000; i++) cr_assert_eq(tko_submit(p, inc, &n, i % 5), 0);
  cr_assert_eq(tko_pool_wait_idle(p, -1), 0);
  cr_assert_eq(n, 1000);
  tko_pool_destroy(p);
}
