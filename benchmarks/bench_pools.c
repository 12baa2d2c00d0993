/* SPDX-License-Identifier: MIT */
/* The pools under comparison behind one interface: see bench_pools.h for
 * the fairness rules. Each pool's code sits in its own #ifdef block, so a
 * peer that was not found at build time simply reports -ENOTSUP. */
#define _GNU_SOURCE
#include "bench_pools.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_common.h"

#ifdef BENCH_HAVE_GLIB
#include <glib.h>
#endif
#ifdef BENCH_HAVE_THPOOL
#include <thpool.h>
#endif

struct bp_pool {
  bp_kind kind;
  const bp_task *task;
  unsigned threads;
  tko_pool *tko;
#ifdef BENCH_HAVE_GLIB
  GThreadPool *glib;
#endif
#ifdef BENCH_HAVE_THPOOL
  threadpool thpool;
#endif
};

struct bp_producer {
  bp_pool *pool;
#ifdef BENCH_HAVE_LIBUV
  uv_loop_t loop;
  uv_work_t *reqs; /* caller-owned requests, allocated before timing */
  size_t cap, next, done;
#endif
};

bool bp_available(bp_kind kind) {
  switch (kind) {
  case BP_TASKORCH: return true;
  case BP_GLIB:
#ifdef BENCH_HAVE_GLIB
    return true;
#else
    return false;
#endif
  case BP_THPOOL:
#ifdef BENCH_HAVE_THPOOL
    return true;
#else
    return false;
#endif
  case BP_LIBUV:
#ifdef BENCH_HAVE_LIBUV
    return true;
#else
    return false;
#endif
  default: return false;
  }
}

const char *bp_name(bp_kind kind) {
  static const char *names[BP_KINDS] = {"taskorch", "GLib GThreadPool", "C-Thread-Pool",
                                        "libuv uv_queue_work"};
  return kind < BP_KINDS ? names[kind] : "?";
}

const char *bp_short_name(bp_kind kind) {
  static const char *names[BP_KINDS] = {"taskorch", "glib", "thpool", "libuv"};
  return kind < BP_KINDS ? names[kind] : "?";
}

bool bp_parse_list(const char *list, bool enabled[BP_KINDS], const char **why) {
  for (int k = 0; k < BP_KINDS; k++)
    enabled[k] = false;
  const char *p = list;
  while (*p) {
    size_t len = strcspn(p, ",");
    int k = 0;
    while (k < BP_KINDS && !(strlen(bp_short_name((bp_kind)k)) == len &&
                             !strncmp(bp_short_name((bp_kind)k), p, len)))
      k++;
    if (k == BP_KINDS) {
      *why = "unknown pool name (known: taskorch, glib, thpool, libuv)";
      return false;
    }
    enabled[k] = bp_available((bp_kind)k);
    p += len;
    if (*p == ',') p++;
  }
  return true;
}

#ifdef BENCH_HAVE_THPOOL
/* C-Thread-Pool keeps its keep-alive flag in a global: one pool at a time. */
static bool thpool_in_use;
#endif

#ifdef BENCH_HAVE_LIBUV
/* libuv sizes its global thread pool once per process. */
static unsigned uv_threads_in_use;

static void uv_noop_work(uv_work_t *req) {
  (void)req;
}
static void uv_count_done(uv_work_t *req, int status) {
  (void)status;
  bp_producer *pr = req->loop->data;
  pr->done++;
}

/* Starts libuv's thread pool (it is created on first use) so that the timed
 * runs do not pay for thread creation, which the other pools do in create. */
static void uv_warm_up(unsigned threads) {
  uv_loop_t loop;
  uv_loop_init(&loop);
  uv_work_t *reqs = calloc(threads, sizeof *reqs);
  if (!reqs) bench_die("out of memory");
  for (unsigned i = 0; i < threads; i++)
    uv_queue_work(&loop, &reqs[i], uv_noop_work, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  uv_loop_close(&loop);
  free(reqs);
}
#endif

int bp_pool_create(bp_pool **out, bp_kind kind, const bp_task *task, unsigned threads,
                   const tko_options *tko_opts) {
  *out = NULL;
  if (!bp_available(kind)) return -ENOTSUP;
  if (!task || threads == 0) return -EINVAL;
  bp_pool *p = calloc(1, sizeof *p);
  if (!p) return -ENOMEM;
  p->kind = kind;
  p->task = task;
  p->threads = threads;
  int rc = 0;
  switch (kind) {
  case BP_TASKORCH: {
    tko_options o = tko_opts ? *tko_opts : tko_basic_options(threads);
    rc = tko_pool_create(&p->tko, &o);
    break;
  }
  case BP_GLIB:
#ifdef BENCH_HAVE_GLIB
    /* Exclusive: all `threads` start now and serve only this pool, like the
     * other pools' fixed workers (a shared pool would start them lazily). */
    p->glib = g_thread_pool_new(task->glib, NULL, (gint)threads, TRUE, NULL);
    if (!p->glib) rc = -EAGAIN;
#endif
    break;
  case BP_THPOOL:
#ifdef BENCH_HAVE_THPOOL
    if (thpool_in_use) {
      rc = -EBUSY;
      break;
    }
    p->thpool = thpool_init((int)threads);
    if (!p->thpool)
      rc = -EAGAIN;
    else
      thpool_in_use = true;
#endif
    break;
  case BP_LIBUV:
#ifdef BENCH_HAVE_LIBUV
    if (uv_threads_in_use && uv_threads_in_use != threads) {
      rc = -EBUSY;
      break;
    }
    if (!uv_threads_in_use) {
      char n[16];
      snprintf(n, sizeof n, "%u", threads);
      setenv("UV_THREADPOOL_SIZE", n, 1);
      uv_threads_in_use = threads;
      uv_warm_up(threads);
    }
#endif
    break;
  default: rc = -EINVAL;
  }
  if (rc) {
    free(p);
    return rc;
  }
  /* Let every new thread reach its sleep before anyone starts a clock. */
  bench_wait_others_asleep(500);
  *out = p;
  return 0;
}

tko_pool *bp_pool_tko(bp_pool *pool) {
  return pool ? pool->tko : NULL;
}

bp_producer *bp_producer_open(bp_pool *pool, size_t max_tasks) {
  bp_producer *pr = calloc(1, sizeof *pr);
  if (!pr) bench_die("out of memory");
  pr->pool = pool;
#ifdef BENCH_HAVE_LIBUV
  if (pool->kind == BP_LIBUV) {
    if (uv_loop_init(&pr->loop) != 0) bench_die("uv_loop_init failed");
    pr->loop.data = pr;
    pr->cap = max_tasks;
    pr->reqs = calloc(max_tasks ? max_tasks : 1, sizeof *pr->reqs);
    if (!pr->reqs) bench_die("out of memory for %zu libuv requests", max_tasks);
    /* Touch the requests now so page faults stay out of the timed run, as
     * the other pools' queues are warm once created. */
    memset(pr->reqs, 0, (max_tasks ? max_tasks : 1) * sizeof *pr->reqs);
  }
#else
  (void)max_tasks;
#endif
  return pr;
}

int bp_submit(bp_producer *pr, void *arg) {
  return bp_submit_weighted(pr, arg, 0);
}

int bp_submit_weighted(bp_producer *pr, void *arg, int weight) {
  if (!arg) return -EINVAL;
  bp_pool *p = pr->pool;
  switch (p->kind) {
  case BP_TASKORCH: return tko_submit(p->tko, p->task->tko, arg, weight);
#ifdef BENCH_HAVE_GLIB
  case BP_GLIB: return g_thread_pool_push(p->glib, arg, NULL) ? 0 : -EAGAIN;
#endif
#ifdef BENCH_HAVE_THPOOL
  case BP_THPOOL: return thpool_add_work(p->thpool, p->task->thpool, arg) == 0 ? 0 : -ENOMEM;
#endif
#ifdef BENCH_HAVE_LIBUV
  case BP_LIBUV: {
    if (pr->next == pr->cap) return -ENOSPC;
    uv_work_t *req = &pr->reqs[pr->next++];
    req->data = arg;
    return uv_queue_work(&pr->loop, req, p->task->uv, uv_count_done);
  }
#endif
  default: return -ENOTSUP;
  }
}

void bp_producer_finish(bp_producer *pr) {
#ifdef BENCH_HAVE_LIBUV
  if (pr->pool->kind == BP_LIBUV) {
    /* Returns when no request is active: every after-work callback ran. */
    uv_run(&pr->loop, UV_RUN_DEFAULT);
    if (pr->done != pr->next) bench_die("libuv: %zu of %zu requests completed", pr->done, pr->next);
    pr->next = pr->done = 0;
  }
#else
  (void)pr;
#endif
}

void bp_producer_close(bp_producer *pr) {
  if (!pr) return;
#ifdef BENCH_HAVE_LIBUV
  if (pr->pool->kind == BP_LIBUV) {
    uv_run(&pr->loop, UV_RUN_DEFAULT);
    uv_loop_close(&pr->loop);
    free(pr->reqs);
  }
#endif
  free(pr);
}

void bp_pool_wait(bp_pool *p) {
  switch (p->kind) {
  case BP_TASKORCH: tko_pool_wait_idle(p->tko, -1); break;
#ifdef BENCH_HAVE_GLIB
  case BP_GLIB:
    /* GThreadPool has no wait-for-idle call; freeing without `immediate`
     * and with `wait_` returns once the queue is empty and no task runs. */
    if (p->glib) g_thread_pool_free(p->glib, FALSE, TRUE);
    p->glib = NULL;
    break;
#endif
#ifdef BENCH_HAVE_THPOOL
  case BP_THPOOL: thpool_wait(p->thpool); break;
#endif
  default: /* libuv: each producer's bp_producer_finish already waited */ break;
  }
}

void bp_pool_destroy(bp_pool *p) {
  if (!p) return;
  switch (p->kind) {
  case BP_TASKORCH: tko_pool_destroy(p->tko); break;
#ifdef BENCH_HAVE_GLIB
  case BP_GLIB:
    if (p->glib) g_thread_pool_free(p->glib, FALSE, TRUE);
    break;
#endif
#ifdef BENCH_HAVE_THPOOL
  case BP_THPOOL:
    thpool_destroy(p->thpool);
    thpool_in_use = false;
    break;
#endif
  default: break;
  }
  free(p);
}

/* ---- the libuv child process ------------------------------------------------ */

struct bp_remote {
  pid_t pid;
  int to_child, from_child;
};

typedef struct remote_request {
  int case_id, run;
  size_t cap;
} remote_request;

static bool read_full(int fd, void *buf, size_t n) {
  char *p = buf;
  while (n) {
    ssize_t r = read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= (size_t)r;
  }
  return true;
}

static bool write_full(int fd, const void *buf, size_t n) {
  const char *p = buf;
  while (n) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= (size_t)w;
  }
  return true;
}

static _Noreturn void remote_serve(int in, int out, bp_remote_fn fn) {
  remote_request rq;
  while (read_full(in, &rq, sizeof rq)) {
    double *vals = calloc(rq.cap ? rq.cap : 1, sizeof *vals);
    size_t n = vals ? fn(rq.case_id, rq.run, vals, rq.cap) : 0;
    if (n > rq.cap) n = rq.cap;
    if (!write_full(out, &n, sizeof n) || !write_full(out, vals, n * sizeof *vals)) break;
    free(vals);
  }
  /* _exit: the parent owns stdout's buffer and the leak check. */
  _exit(0);
}

bp_remote *bp_remote_start(bp_remote_fn fn) {
  int down[2], up[2];
  if (pipe(down) != 0) return NULL;
  if (pipe(up) != 0) {
    close(down[0]);
    close(down[1]);
    return NULL;
  }
  /* A dead child must show up as a failed call, not kill us with SIGPIPE. */
  signal(SIGPIPE, SIG_IGN);
  /* Anything still buffered would otherwise be printed twice. */
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) {
    close(down[0]);
    close(down[1]);
    close(up[0]);
    close(up[1]);
    return NULL;
  }
  if (pid == 0) {
    close(down[1]);
    close(up[0]);
    remote_serve(down[0], up[1], fn);
  }
  close(down[0]);
  close(up[1]);
  bp_remote *r = calloc(1, sizeof *r);
  if (!r) bench_die("out of memory");
  r->pid = pid;
  r->to_child = down[1];
  r->from_child = up[0];
  return r;
}

size_t bp_remote_call(bp_remote *r, int case_id, int run, double *out, size_t cap) {
  if (!r || r->pid <= 0) return 0;
  remote_request rq = {case_id, run, cap};
  size_t n;
  if (!write_full(r->to_child, &rq, sizeof rq) || !read_full(r->from_child, &n, sizeof n) ||
      n > cap || !read_full(r->from_child, out, n * sizeof *out)) {
    /* The child died: stop asking it. */
    close(r->to_child);
    close(r->from_child);
    waitpid(r->pid, NULL, 0);
    r->pid = -1;
    return 0;
  }
  return n;
}

int bp_remote_stop(bp_remote *r) {
  if (!r) return 0;
  int status = 0;
  if (r->pid > 0) {
    close(r->to_child); /* EOF ends the child's loop */
    close(r->from_child);
    if (waitpid(r->pid, &status, 0) < 0) status = -1;
  }
  free(r);
  if (status == -1) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status)
                           : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}
