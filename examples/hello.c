/* SPDX-License-Identifier: MIT */
/* The README's example: a pool, weighted tasks, a group, a clean shutdown. */
#include <stdio.h>
#include <taskorch.h>

static int greet(void *arg) {
  printf("task %s\n", (const char *)arg);
  return 0;
}

int main(void) {
  tko_options opts = tko_elastic_options(2, 4, 500); /* 2 basic + up to 4 elastic */
  tko_pool *pool;
  int rc = tko_pool_create(&pool, &opts);
  if (rc) {
    fprintf(stderr, "tko_pool_create: %s\n", tko_strerror(rc));
    return 1;
  }
  tko_submit(pool, greet, "low", -5);  /* higher weight runs first */
  tko_submit(pool, greet, "high", 10);

  tko_group batch;
  tko_group_init(&batch);
  tko_group_submit(pool, &batch, greet, "in a group", 0);
  tko_group_wait(&batch, -1); /* waits for this group only */
  tko_group_destroy(&batch);

  tko_pool_wait_idle(pool, -1);
  tko_stats st;
  tko_pool_stats(pool, &st);
  printf("completed %llu of %llu\n", (unsigned long long)st.completed,
         (unsigned long long)st.submitted);
  return tko_pool_destroy(pool); /* drains, joins every thread */
}
