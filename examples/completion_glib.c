/* SPDX-License-Identifier: MIT */
/* Results back to a GLib main loop: the pool's after_run hook posts every
 * task's id, status and argument to a completion queue, and a GLib source
 * on the queue's descriptor drains them on the main loop's thread. */
#include <glib-unix.h>
#include <glib.h>
#include <stdatomic.h>
#include <stdio.h>
#include <taskorch.h>

#define TASKS 1000

static tko_cq *cq;
static GMainLoop *main_loop;
static int received, failed, wrong;     /* the main loop's thread only */
static atomic_int post_errors;           /* written by workers */

/* Even arguments succeed, odd ones fail with their own value. */
static int check_parity(void *arg) {
  uintptr_t n = (uintptr_t)arg;
  return n % 2 ? (int)n : 0;
}

/* Runs on a pool worker after every task. The ring holds every task, so
 * the post cannot find it full. */
static void post_result(void *user, const tko_task_info *task) {
  if (tko_cq_post(user, task->id, task->status, task->arg) != 0) atomic_fetch_add(&post_errors, 1);
}

/* Runs on the main loop's thread, inside tko_cq_drain. */
static void on_result(void *user, const tko_completion *c) {
  (void)user;
  if (c->status != check_parity(c->user) || c->id == 0) wrong++;
  if (c->status) failed++;
  received++;
}

static gboolean on_readable(gint fd, GIOCondition cond, gpointer data) {
  (void)fd, (void)cond, (void)data;
  if (tko_cq_drain(cq, on_result, NULL, 0) < 0) wrong++;
  if (received < TASKS && !atomic_load(&post_errors)) return G_SOURCE_CONTINUE;
  g_main_loop_quit(main_loop);
  return G_SOURCE_REMOVE;
}

int main(void) {
  tko_pool *pool;
  int rc = tko_cq_create(&cq, TASKS, NULL);
  if (rc) {
    fprintf(stderr, "tko_cq_create: %s\n", tko_strerror(rc));
    return 1;
  }
  tko_options opts = tko_basic_options(2);
  opts.hooks.after_run = post_result;
  opts.hooks.user = cq;
  rc = tko_pool_create(&pool, &opts);
  if (rc) {
    fprintf(stderr, "tko_pool_create: %s\n", tko_strerror(rc));
    return 1;
  }
  main_loop = g_main_loop_new(NULL, FALSE);
  g_unix_fd_add(tko_cq_fd(cq), G_IO_IN, on_readable, NULL);
  for (uintptr_t i = 0; i < TASKS; i++)
    if (tko_submit(pool, check_parity, (void *)i, 0)) return 1;
  g_main_loop_run(main_loop); /* returns once every result came back */
  g_main_loop_unref(main_loop);
  tko_pool_destroy(pool);
  rc = tko_cq_destroy(cq);
  printf("GLib main loop received %d of %d completions, %d failed, %d wrong, destroy %d\n",
         received, TASKS, failed, wrong, rc);
  wrong += atomic_load(&post_errors);
  return received == TASKS && failed == TASKS / 2 && wrong == 0 && rc == 0 ? 0 : 1;
}
