/* SPDX-License-Identifier: MIT */
/* Results back to a libuv loop: each pool task posts its result to a
 * completion queue, and a uv_poll on the queue's descriptor drains the
 * results on the loop's thread (what uv_queue_work's after_work_cb does). */
#include <stdio.h>
#include <taskorch.h>
#include <uv.h>

#define REQUESTS 1000

typedef struct request {
  long input, result;
} request;

static request requests[REQUESTS];
static tko_cq *cq;
static uv_poll_t watcher;
static int received, wrong;

/* Runs on a pool worker. The ring holds every request, so the post cannot
 * find it full; a host with more requests in flight than slots would
 * retry or fail the request on -EAGAIN. */
static int square(void *arg) {
  request *r = arg;
  r->result = r->input * r->input;
  return tko_cq_post(cq, (uint64_t)r->input, 0, r);
}

/* Runs on the loop's thread, inside tko_cq_drain. */
static void on_result(void *user, const tko_completion *c) {
  (void)user;
  const request *r = c->user;
  if (c->status != 0 || r->result != (long)c->id * (long)c->id) wrong++;
  received++;
}

static void on_readable(uv_poll_t *handle, int status, int events) {
  (void)events;
  if (status < 0 || tko_cq_drain(cq, on_result, NULL, 0) < 0) wrong++;
  if (received == REQUESTS || status < 0) uv_close((uv_handle_t *)handle, NULL);
}

int main(void) {
  uv_loop_t *loop = uv_default_loop();
  tko_options opts = tko_basic_options(2);
  tko_pool *pool;
  int rc = tko_cq_create(&cq, REQUESTS, NULL);
  if (rc == 0) rc = tko_pool_create(&pool, &opts);
  if (rc) {
    fprintf(stderr, "create: %s\n", tko_strerror(rc));
    return 1;
  }
  uv_poll_init(loop, &watcher, tko_cq_fd(cq));
  uv_poll_start(&watcher, UV_READABLE, on_readable);
  for (int i = 0; i < REQUESTS; i++) {
    requests[i].input = i;
    if (tko_submit(pool, square, &requests[i], 0)) return 1;
  }
  uv_run(loop, UV_RUN_DEFAULT); /* returns once the watcher is closed */
  tko_pool_destroy(pool);
  rc = tko_cq_destroy(cq); /* everything was drained: 0 */
  uv_loop_close(loop);
  printf("libuv loop received %d of %d completions, %d wrong, destroy %d\n", received, REQUESTS,
         wrong, rc);
  return received == REQUESTS && wrong == 0 && rc == 0 ? 0 : 1;
}
