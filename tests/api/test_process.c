/* SPDX-License-Identifier: MIT */
/* Process-level behaviour: fork(), signals and scheduling attributes.
 *
 * fork(): a child gets a copy of the pool without its threads. Every call on
 * that copy returns -ECHILD except tko_pool_destroy, which frees the copy
 * without touching its threads or locks; new pools work in the child. The
 * children report through their exit status (one bit per failed check), so
 * no assertion machinery runs in them, and alarm() turns a hang in a child
 * into a failure instead of a stuck suite.
 *
 * Signals: every thread the pool starts (basic and elastic workers, the
 * timer thread) blocks asynchronous signals, so the host's handlers run on
 * the host's threads; synchronous faults (SIGSEGV, SIGBUS, SIGFPE, SIGILL)
 * stay deliverable; creating a pool leaves the caller's mask alone.
 *
 * Scheduling: workers run SCHED_OTHER even when the thread that created the
 * pool, or the submitter that made an elastic worker start, runs SCHED_BATCH
 * or SCHED_IDLE (a GLib bug class: pool threads inheriting whatever the
 * spawning thread had).
 *
 * ThreadSanitizer does not support fork() in a process that has threads
 * (the child may deadlock in the runtime, and starting threads after such a
 * fork is refused), so the fork tests are reported as skipped under TSan;
 * under ASan only the busy-parent fork test is (see TP_FORK_BUSY_SKIP).
 * The plain build runs them all. */
#define _GNU_SOURCE
#include <dirent.h>
#include <execinfo.h>
#include <errno.h>
#include <linux/capability.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "taskorch.h"
#include "taskorch/coalescer.h"
#include "taskorch/lanes.h"
#include "tko_test.h"
#include "tko_test_fault.h"
#include "tko_test_feature.h"
#include "tko_test_sync.h"

#if defined(__SANITIZE_THREAD__)
#define TP_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TP_TSAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define TP_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TP_ASAN 1
#endif
#endif
/* Forking a process whose pool threads exist is unsupported under TSan:
 * every fork test is skipped there. Under ASan the child of a *busy*
 * parent can hang in ASan's own allocator when a parent thread held its
 * lock at the fork (seen in CI: the child killed by its 30 s alarm), so the
 * test that forks while producers flood the pool is skipped there too; the
 * tests that fork a quiet parent run under ASan, but their child starts no
 * threads of its own there (child_checks). */
#if defined(TP_TSAN)
#define TP_FORK_SKIP 1
#endif
#if defined(TP_TSAN) || defined(TP_ASAN)
#define TP_FORK_BUSY_SKIP 1
#endif

static int nop_async(tko_async *op, void *arg) {
  (void)op;
  (void)arg;
  return 1;
}

/* ---- fork ----------------------------------------------------------------------- */

/* Runs in the child: every call on the parent's pool is refused, destroy
 * frees the copy, a new pool works. Returns a bit mask of failed checks. */
static int child_checks(tko_pool *parent) {
  int bad = 0;
  static tft_token tok[8];
  memset(tok, 0, sizeof tok);
  tko_task batch[2] = {{tft_run, &tok[0], 0}, {tft_run, &tok[1], 0}};
  tko_group g;
  if (tko_submit(parent, tft_run, &tok[0], 0) != -ECHILD) bad |= 1 << 0;
  if (tko_submit_batch(parent, batch, 2) != -ECHILD) bad |= 1 << 1;
  if (tko_submit_timed(parent, tft_run, &tok[0], 0, 0) != -ECHILD) bad |= 1 << 2;
  if (tko_pool_wait_idle(parent, -1) != -ECHILD || tko_pool_wait_idle(parent, 0) != -ECHILD)
    bad |= 1 << 3;
  if (tko_pool_shutdown(parent, TKO_DRAIN) != -ECHILD ||
      tko_pool_shutdown(parent, TKO_CANCEL) != -ECHILD)
    bad |= 1 << 4;
  if (tko_pool_pause(parent) != -ECHILD || tko_pool_resume(parent) != -ECHILD) bad |= 1 << 5;
  if (tko_pool_resize(parent, 2, 0) != -ECHILD) bad |= 1 << 11;
  if (tko_submit_async(parent, nop_async, NULL, 0) != -ECHILD) bad |= 1 << 6;
  if (tko_group_init(&g) != 0 || tko_group_submit(parent, &g, tft_run, &tok[0], 0) != -ECHILD ||
      tko_group_pending(&g) != 0 || tko_group_destroy(&g) != 0)
    bad |= 1 << 7;
  tko_stats s;
  tko_pool_stats(parent, &s); /* a snapshot of the copy: harmless */
  if (tko_pool_destroy(parent) != 0) bad |= 1 << 8;
#ifdef TP_ASAN
  /* A new pool's threads in the child of a multi-threaded parent can hang
   * in ASan's own allocator (an attack saw it in 3 of 6 runs; this test
   * once, its child killed by the alarm): the plain build checks it. */
  return bad;
#endif
  /* A new pool in the child. */
  tko_options o = tko_elastic_options(2, 2, 10);
  tko_pool *p;
  if (tko_pool_create(&p, &o) != 0) return bad | 1 << 9;
  for (int i = 2; i < 8; i++) {
    if (tko_submit(p, tft_run, &tok[i], i) != 0) bad |= 1 << 9;
  }
  if (tko_pool_wait_idle(p, -1) != 0 || tko_pool_destroy(p) != 0) bad |= 1 << 9;
  for (int i = 2; i < 8; i++)
    if (atomic_load(&tok[i].runs) != 1) bad |= 1 << 9;
  for (int i = 0; i < 2; i++)
    if (atomic_load(&tok[i].runs) != 0) bad |= 1 << 10; /* refused ones never run */
  return bad;
}

/* Forks; the child runs fn(arg) under a 30 s alarm and reports its int
 * result through a pipe. Returns that result, or 0x10000 + the signal that
 * killed the child. */
/* A crash in a child prints its stack (addresses: resolve them with
 * addr2line -e <test binary>) before the child dies of the signal. */
static void child_crash(int sig) {
  void *frames[48];
  int n = backtrace(frames, 48);
  backtrace_symbols_fd(frames, n, 2);
  signal(sig, SIG_DFL);
  raise(sig);
}

static int run_in_child(int (*fn)(void *), void *arg) {
  fflush(NULL);
  int pipefd[2];
  cr_assert_eq(pipe(pipefd), 0);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    close(pipefd[0]);
    void *warm[1];
    backtrace(warm, 1); /* loads libgcc now, not inside a crashed malloc */
    signal(SIGSEGV, child_crash);
    signal(SIGABRT, child_crash);
    alarm(30); /* a hang in the child kills it: a failure, not a stuck suite */
    int r = fn(arg);
    ssize_t w = write(pipefd[1], &r, sizeof r);
    (void)w;
    tt_child_exit(0);
  }
  close(pipefd[1]);
  int r = -1;
  ssize_t got = read(pipefd[0], &r, sizeof r);
  close(pipefd[0]);
  int status = 0;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  if (WIFSIGNALED(status)) return 0x10000 + WTERMSIG(status);
  cr_assert_eq(got, (ssize_t)sizeof r, "the child exited without reporting");
  return r;
}

static int child_on_pool(void *arg) { return child_checks(arg); }

Test(process, forked_child_gets_echild_and_destroys_its_copy) {
#ifdef TP_FORK_SKIP
  cr_skip_test("fork with pool threads under TSan (see the top of the file)");
#endif
  tko_options o = tko_elastic_options(2, 2, 60000);
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  static tft_token tok[100];
  memset(tok, 0, sizeof tok);
  for (int i = 0; i < 50; i++) cr_assert_eq(tko_submit(p, tft_run, &tok[i], 0), 0);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  int r = run_in_child(child_on_pool, p);
  cr_assert_eq(r, 0, "child checks failed: 0x%x", r);
  /* The parent's pool is untouched by the child's destroy. */
  for (int i = 50; i < 100; i++) cr_assert_eq(tko_submit(p, tft_run, &tok[i], 0), 0);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
  for (int i = 0; i < 100; i++) cr_assert_eq(atomic_load(&tok[i].runs), 1);
}

/* Regression, fixed in 8f0737a. It was: tko_pool_destroy in a child frees the copy's buffers
 * without looking at their locks (rightly: a copied lock may be held forever). But if a parent
 * thread was in the middle of changing one of them at the fork - between realloc() and storing the
 * new pointer in grow_items, or between freeing the old weight table and storing the new one in
 * table_rebuild - the copy holds a pointer that is already freed, and the child's destroy frees it
 * again: "double free or corruption (top)" from free_pool -> tko__queue_fini, in about one run in
 * three of this test (plain build; two producers flooding an elastic pool while the test forks 20
 * times). Fix: in the child, free only what a lock holder can never be changing, or check the
 * copied lock words (the queues' locks, timer_mu, async_mu) and leave the buffers they guard alone when
 * one was held at the fork. (The fix: the child's destroy leaves the copy alone.) */
typedef struct busy {
  tko_pool *pool;
  atomic_bool stop;
  atomic_long bad;
} busy;

static void *producer(void *arg) {
  busy *b = arg;
  while (!atomic_load(&b->stop)) {
    int rc = tko_submit(b->pool, tt_nop_fn, NULL, 0);
    if (rc) atomic_store(&b->bad, rc);
    if (tko_pool_wait_idle(b->pool, 0) == -EINVAL) atomic_store(&b->bad, -EINVAL);
  }
  return NULL;
}

static int child_destroy(void *arg) {
  int bad = 0;
  if (tko_submit(arg, tt_nop_fn, NULL, 0) != -ECHILD) bad |= 1;
  if (tko_pool_destroy(arg) != 0) bad |= 2;
  return bad;
}

Test(process, fork_while_the_pool_is_busy_gives_a_child_that_can_destroy_its_copy) {
#ifdef TP_FORK_BUSY_SKIP
  cr_skip_test("fork from a busy parent under a sanitizer (see the top of the file)");
#endif
  tko_options o = tko_elastic_options(1, 2, 1);
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  busy b = {p, false, 0};
  pthread_t t[2];
  for (int i = 0; i < 2; i++) cr_assert_eq(pthread_create(&t[i], NULL, producer, &b), 0);
  for (int i = 0; i < 20; i++) {
    int r = run_in_child(child_destroy, p);
    cr_assert_eq(r, 0, "fork %d: child result 0x%x", i, r);
  }
  atomic_store(&b.stop, true);
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
  cr_assert_eq(atomic_load(&b.bad), 0);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* Regression, fixed in 8f0737a. It was: the timer calls do not check for fork. In a child,
 * tko_submit_after / tko_submit_every on the parent's pool take its timer_mu (copied in whatever
 * state the parent's timer thread had it) and arm the timer in the copy: they return 0 for a task
 * that can never run (the timer thread stayed in the parent), and if the parent had not yet started
 * its timer thread, they start one in the child for the copy, which tko_pool_destroy then frees
 * under that thread's feet. Fix: return -ECHILD from arm() (and from tko_timer_cancel for a forked
 * pool). */
static tko_timer parent_timer; /* armed in the parent for the second child */
static bool parent_timer_armed;

static int child_timer(void *arg) {
  tko_timer t;
  tko_timer_init(&t);
  int bad = 0;
  if (tko_submit_after(arg, &t, 0, tt_nop_fn, NULL, 0) != -ECHILD) bad |= 1;
  if (parent_timer_armed && tko_timer_cancel(&parent_timer) != -ECHILD) bad |= 4;
  if (tko_pool_destroy(arg) != 0) bad |= 2;
  return bad;
}

Test(process, timer_calls_in_a_forked_child_get_echild) {
#ifdef TP_FORK_SKIP
  cr_skip_test("fork with pool threads under TSan (see the top of the file)");
#endif
  tko_options o = tko_basic_options(1);
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  int r = run_in_child(child_timer, p); /* no timer thread yet in the parent */
  cr_assert_eq(r, 0, "child result 0x%x", r);
  tko_timer_init(&parent_timer);
  cr_assert_eq(tko_submit_after(p, &parent_timer, 3600000, tt_nop_fn, NULL, 0), 0); /* starts it */
  parent_timer_armed = true;
  r = run_in_child(child_timer, p);
  cr_assert_eq(r, 0, "child result 0x%x", r);
  cr_assert_eq(tko_timer_cancel(&parent_timer), 0, "the child's cancel reached the parent's timer");
  parent_timer_armed = false;
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* Issue 14, defect 13 (groups): in a child, tko_group_wait on a group with
 * members queued in the parent's pool ran them there (from a task: the
 * helping path; they ran twice, once per process) or waited for them
 * forever, and tko_group_cancel returned 3, cancelling the copies. Both
 * return -ECHILD now and touch nothing; the parent's members run once. */
typedef struct fork_group {
  tko_group g;
  tft_token tok[3];
  tko_handle h; /* a handle queued beside the members: the same rule */
  tft_token htok;
  tko_group empty; /* made before the fork, no member */
  tko_pool *pool;
  int child_result;
} fork_group;

static int child_group(void *arg) {
  fork_group *f = arg;
  int bad = 0;
  if (tko_group_wait(&f->g, 0) != -ECHILD) bad |= 1;
  if (tko_group_cancel(&f->g) != -ECHILD) bad |= 2;
  if (tko_group_wait(&f->g, -1) != -ECHILD) bad |= 4;
  if (tko_group_pending(&f->g) != 3) bad |= 8;
  for (int i = 0; i < 3; i++)
    if (atomic_load(&f->tok[i].runs) || atomic_load(&f->tok[i].cancels)) bad |= 16;
  if (tko_handle_cancel(&f->h) != -ECHILD) bad |= 32;
  if (tko_handle_wait(&f->h, 0) != -ECHILD || tko_handle_wait(&f->h, -1) != -ECHILD) bad |= 64;
  if (tko_handle_status(&f->h) != -EINPROGRESS) bad |= 128;
  if (atomic_load(&f->htok.runs) || atomic_load(&f->htok.cancels)) bad |= 256;
  if (tko_group_submit(f->pool, &f->g, tft_run, &f->tok[0], 0) != -ECHILD) bad |= 512;
  if (tko_group_status(&f->g) != 0) bad |= 1024;
  /* A copy with nothing pending is done; its cancel has nothing to do. */
  if (tko_group_wait(&f->empty, -1) != 0 || tko_group_cancel(&f->empty) != 0) bad |= 2048;
  /* Destroy leaves the copies alone (their mutexes may be held for good). */
  if (tko_group_destroy(&f->g) != 0 || tko_group_destroy(&f->empty) != 0) bad |= 4096;
  return bad;
}

/* run_in_child without assertions, for a pool task: -1 if fork failed. */
static int fork_from_task(int (*fn)(void *), void *arg) {
  int pipefd[2];
  if (pipe(pipefd)) return -1;
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    close(pipefd[0]);
    alarm(30);
    int r = fn(arg);
    ssize_t w = write(pipefd[1], &r, sizeof r);
    (void)w;
    tt_child_exit(0);
  }
  close(pipefd[1]);
  int r = -1;
  if (read(pipefd[0], &r, sizeof r) != (ssize_t)sizeof r) r = -1;
  close(pipefd[0]);
  int status = 0;
  if (waitpid(pid, &status, 0) != pid || WIFSIGNALED(status)) r = -1;
  return r;
}

static int forking_task(void *arg) {
  fork_group *f = arg;
  f->child_result = fork_from_task(child_group, f);
  return 0;
}

static void group_calls_in_a_forked_child(bool from_task) {
  tko_options o = tko_basic_options(1);
  o.max_batch = 1; /* the forking task's worker takes nothing else */
  o.hooks.on_cancel = tft_on_cancel;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  static fork_group f;
  memset(&f, 0, sizeof f);
  f.child_result = -2;
  f.pool = p;
  cr_assert_eq(tko_group_init(&f.g), 0);
  cr_assert_eq(tko_group_init(&f.empty), 0);
  cr_assert_eq(tko_pool_pause(p), 0);
  if (from_task) cr_assert_eq(tko_submit(p, forking_task, &f, 10), 0);
  for (int i = 0; i < 3; i++) cr_assert_eq(tko_group_submit(p, &f.g, tft_run, &f.tok[i], 0), 0);
  cr_assert_eq(tko_submit_handle(p, &f.h, tft_run, &f.htok, 0), 0);
  if (!from_task) f.child_result = run_in_child(child_group, &f);
  cr_assert_eq(tko_pool_resume(p), 0);
  cr_assert_eq(tko_group_wait(&f.g, TT_LONG_MS), 0);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  cr_assert_eq(f.child_result, 0, "child result 0x%x", f.child_result);
  for (int i = 0; i < 3; i++) {
    cr_assert_eq(atomic_load(&f.tok[i].runs), 1);
    cr_assert_eq(atomic_load(&f.tok[i].cancels), 0);
  }
  cr_assert_eq(tko_handle_wait(&f.h, TT_LONG_MS), 0);
  cr_assert_eq(tko_handle_status(&f.h), 0, "the parent's handle ran there");
  cr_assert_eq(atomic_load(&f.htok.runs), 1);
  cr_assert_eq(tko_group_destroy(&f.empty), 0);
  cr_assert_eq(tko_group_destroy(&f.g), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

Test(process, regression_group_calls_in_a_forked_child_get_echild) {
#ifdef TP_FORK_SKIP
  return; /* fork with threads under a sanitizer: see the top of the file */
#endif
  group_calls_in_a_forked_child(false);
}

Test(process, regression_group_wait_in_a_child_forked_by_a_task_gets_echild) {
#ifdef TP_FORK_SKIP
  return; /* fork with threads under a sanitizer: see the top of the file */
#endif
  group_calls_in_a_forked_child(true);
}

/* The attack on fork: a child's group call took the group's mutex, which a
 * parent thread could hold at the fork (the copy then stays locked): a
 * child's group wait, submit or cancel hung in about 1 fork in 60 while a
 * parent thread used the group. A parent thread here takes the mutex in a
 * loop (pending, status) while the test forks; every child calls every
 * group call under a short alarm. Before the fix about 1 child in 60 hung. */
enum { GROUP_FORKS = 300 };
static tko_group hammered;
static atomic_bool hammer_stop;

static void *hammer_group(void *arg) {
  (void)arg;
  while (!atomic_load(&hammer_stop)) {
    (void)tko_group_pending(&hammered);
    (void)tko_group_status(&hammered);
  }
  return NULL;
}

static int child_group_calls(tko_pool *parent) {
  static tft_token tok;
  int bad = 0;
  if (tko_group_pending(&hammered) != 1) bad |= 1;
  if (tko_group_status(&hammered) != 0) bad |= 2;
  if (tko_group_wait(&hammered, 0) != -ECHILD || tko_group_wait(&hammered, 100) != -ECHILD)
    bad |= 4;
  if (tko_group_cancel(&hammered) != -ECHILD) bad |= 8;
  if (tko_group_submit(parent, &hammered, tft_run, &tok, 0) != -ECHILD) bad |= 16;
  if (tko_group_destroy(&hammered) != 0) bad |= 32; /* leaves the copy alone */
  return bad;
}

Test(process, a_childs_group_calls_never_wait_for_a_parent_thread) {
#ifdef TP_FORK_BUSY_SKIP
  return; /* fork beside busy threads under a sanitizer: see the top of the file */
#endif
  tko_options o = tko_basic_options(1);
  o.hooks.on_cancel = tft_on_cancel;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  cr_assert_eq(tko_pool_pause(p), 0); /* the member stays pending */
  static tft_token member;
  memset(&member, 0, sizeof member);
  cr_assert_eq(tko_group_init(&hammered), 0);
  cr_assert_eq(tko_group_submit(p, &hammered, tft_run, &member, 0), 0);
  atomic_store(&hammer_stop, false);
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, hammer_group, NULL), 0);
  int hung = 0, failed = 0;
  for (int i = 0; i < GROUP_FORKS && hung + failed < 3; i++) { /* a broken build stops early */
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
      alarm(2); /* a child stuck on the copied mutex dies of it */
      _exit(child_group_calls(p));
    }
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    if (WIFSIGNALED(status)) hung++;
    else if (WEXITSTATUS(status)) failed++;
  }
  atomic_store(&hammer_stop, true);
  pthread_join(t, NULL);
  cr_assert_eq(hung, 0, "%d of %d children hung in a group call", hung, GROUP_FORKS);
  cr_assert_eq(failed, 0, "%d of %d children got other codes", failed, GROUP_FORKS);
  cr_assert_eq(tko_pool_resume(p), 0);
  cr_assert_eq(tko_group_wait(&hammered, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&member.runs), 1);
  cr_assert_eq(tko_group_destroy(&hammered), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* The attack on fork: tko_async_complete in a child completed the copy of
 * the parent's in-flight task (returning 0), or hung in the copy of the
 * pool's lock. The task is the parent's: -ECHILD, and the parent's own
 * completion still counts. */
static tko_async *held_op;
static tt_count held_started = TT_COUNT_INIT;

static int hold_async(tko_async *op, void *arg) {
  (void)arg;
  held_op = op;
  tt_count_add(&held_started, 1);
  return 0;
}

static int child_completes(void *arg) {
  (void)arg;
  return tko_async_complete(held_op, 0) == -ECHILD ? 0 : 1;
}

Test(process, async_complete_in_a_forked_child_gets_echild) {
#ifdef TP_FORK_SKIP
  return; /* fork with threads under a sanitizer: see the top of the file */
#endif
  tko_options o = tko_basic_options(1);
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  tt_count_init(&held_started);
  cr_assert_eq(tko_submit_async(p, hold_async, NULL, 0), 0);
  cr_assert(tt_count_wait_geq(&held_started, 1));
  cr_assert_eq(run_in_child(child_completes, NULL), 0);
  cr_assert_eq(tko_async_complete(held_op, 0), 0, "the child's call completed the parent's task");
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  tko_stats s;
  tko_pool_stats(p, &s);
  cr_assert_eq(s.completed, 1);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* Issue 14, defect 13 (lanes): in a child, the lane table's calls reached
 * the parent's copy: destroy waited for a runner that only exists in the
 * parent, for good. Now every call on a lane table or coalescer made before
 * the fork is -ECHILD, and destroy returns 0 leaving the copy alone, as the
 * pool's does. The parent's table has a runner out (its worker held). */
typedef struct fork_ext {
  tko_lanes *l;
  tko_coalescer *c;
} fork_ext;

static void fork_flush(void *user, const tko_coalesce_entry *e, size_t n) {
  (void)user;
  (void)e;
  (void)n;
}

static int child_ext(void *arg) {
  fork_ext *x = arg;
  int bad = 0;
  if (tko_lanes_submit(x->l, 1, tt_nop_fn, NULL, 0) != -ECHILD) bad |= 1 << 0;
  if (tko_lanes_wait_idle(x->l, -1) != -ECHILD) bad |= 1 << 1;
  if (tko_lanes_close(x->l) != -ECHILD || tko_lanes_cancel(x->l) != -ECHILD) bad |= 1 << 2;
  if (tko_lanes_destroy(x->l) != 0) bad |= 1 << 3;
  if (tko_coalescer_mark(x->c, 1, 1) != -ECHILD || tko_coalescer_flush(x->c) != -ECHILD) bad |= 1 << 4;
  if (tko_coalescer_close(x->c) != -ECHILD) bad |= 1 << 5;
  /* A snapshot of a copy reads zeros: its locks may be held for good. */
  tko_lane_stats ls;
  memset(&ls, 0xff, sizeof ls);
  tko_lanes_stats(x->l, &ls);
  if (ls.submitted || ls.completed || ls.cancelled) bad |= 1 << 7;
  tko_coalesce_stats cs;
  memset(&cs, 0xff, sizeof cs);
  tko_coalescer_stats(x->c, &cs);
  if (cs.marks || cs.sweeps || cs.dirty) bad |= 1 << 8;
  if (tko_coalescer_destroy(x->c) != 0) bad |= 1 << 6;
  return bad;
}

Test(process, lanes_and_coalescer_calls_in_a_forked_child_get_echild) {
#ifdef TP_FORK_SKIP
  return; /* fork with threads under a sanitizer: see the top of the file */
#endif
  tko_options o = tko_basic_options(1);
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  static tt_pin pin = TT_PIN_INIT;
  fork_ext x;
  cr_assert_eq(tko_lanes_create(&x.l, p, NULL), 0);
  cr_assert_eq(tko_coalescer_create(&x.c, p, 1000, fork_flush, NULL, NULL), 0);
  cr_assert_eq(tko_lanes_submit(x.l, 1, tt_pin_fn, &pin, 0), 0);
  cr_assert(tt_count_wait_geq(&pin.started, 1));
  cr_assert_eq(tko_lanes_submit(x.l, 1, tt_nop_fn, NULL, 0), 0); /* queued behind */
  int r = run_in_child(child_ext, &x);
  cr_assert_eq(r, 0, "child result 0x%x", r);
  tt_gate_open(&pin.gate);
  cr_assert_eq(tko_lanes_destroy(x.l), 0);
  cr_assert_eq(tko_coalescer_destroy(x.c), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* ---- signals ------------------------------------------------------------------------ */

static const int async_signals[] = {SIGUSR1, SIGUSR2, SIGTERM, SIGINT, SIGHUP,
                                    SIGALRM, SIGCHLD, SIGPIPE, SIGQUIT, SIGWINCH};
static const int sync_signals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL};
#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

typedef struct mask_probe {
  atomic_int checked, bad_blocked, bad_sync;
  tt_count done;
} mask_probe;

static int mask_fn(void *arg) {
  mask_probe *m = arg;
  sigset_t set;
  pthread_sigmask(SIG_BLOCK, NULL, &set);
  for (size_t i = 0; i < NELEM(async_signals); i++)
    if (!sigismember(&set, async_signals[i])) atomic_store(&m->bad_blocked, async_signals[i]);
  for (size_t i = 0; i < NELEM(sync_signals); i++)
    if (sigismember(&set, sync_signals[i])) atomic_store(&m->bad_sync, sync_signals[i]);
  atomic_fetch_add(&m->checked, 1);
  tt_count_add(&m->done, 1);
  return 0;
}

/* SigBlk of thread tid from /proc, or 0 if unreadable. */
static unsigned long long proc_sigblk(const char *tid) {
  char path[300], line[256];
  snprintf(path, sizeof path, "/proc/self/task/%s/status", tid);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  unsigned long long v = 0;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "SigBlk: %llx", &v) == 1) break;
  fclose(f);
  return v;
}

/* For every thread whose name starts with prefix: checks its mask in /proc.
 * Returns how many threads it checked; *bad gets a signal not blocked. */
static int check_threads_named(const char *prefix, int *bad) {
  DIR *d = opendir("/proc/self/task");
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    char path[300], name[64] = {0};
    snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    if (!fgets(name, sizeof name, f)) name[0] = '\0';
    fclose(f);
    if (strncmp(name, prefix, strlen(prefix)) != 0) continue;
    unsigned long long blk = proc_sigblk(e->d_name);
    for (size_t i = 0; i < NELEM(async_signals); i++)
      if (!(blk & (1ull << (async_signals[i] - 1)))) *bad = async_signals[i];
    for (size_t i = 0; i < NELEM(sync_signals); i++)
      if (blk & (1ull << (sync_signals[i] - 1))) *bad = -sync_signals[i];
    n++;
  }
  closedir(d);
  return n;
}

Test(process, pool_threads_block_asynchronous_signals) {
  /* The creating thread blocks nothing; the pool must not change that. */
  sigset_t empty, before, after;
  sigemptyset(&empty);
  pthread_sigmask(SIG_SETMASK, &empty, &before);
  tko_options o = tko_elastic_options(1, 1, 60000);
  o.name = "tkosig";
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  pthread_sigmask(SIG_BLOCK, NULL, &after);
  for (size_t i = 0; i < NELEM(async_signals); i++)
    cr_assert_not(sigismember(&after, async_signals[i]), "create changed the caller's mask");

  /* Basic worker, from inside a task. */
  mask_probe m;
  memset(&m, 0, sizeof m);
  tt_count_init(&m.done);
  cr_assert_eq(tko_submit(p, mask_fn, &m, 0), 0);
  cr_assert(tt_count_wait_geq(&m.done, 1));
  /* Elastic worker, spawned by this (unblocked) thread's submit. */
  tt_pin pn = TT_PIN_INIT;
  cr_assert_eq(tko_submit(p, tt_pin_fn, &pn, 0), 0);
  cr_assert(tt_count_wait_geq(&pn.started, 1));
  cr_assert_eq(tko_submit(p, mask_fn, &m, 0), 0);
  cr_assert(tt_count_wait_geq(&m.done, 2));
  tko_stats s;
  tko_pool_stats(p, &s);
  cr_assert_eq(s.elastic_workers, 1, "the second probe needed the elastic worker");
  /* The timer thread. */
  tko_timer t;
  tko_timer_init(&t);
  cr_assert_eq(tko_submit_after(p, &t, 3600000, tt_nop_fn, NULL, 0), 0);
  cr_assert_eq(atomic_load(&m.bad_blocked), 0, "signal %d reaches a worker",
               atomic_load(&m.bad_blocked));
  cr_assert_eq(atomic_load(&m.bad_sync), 0, "synchronous signal %d blocked",
               atomic_load(&m.bad_sync));
  /* tkosig-b0, tkosig-e0, tkosig-t. Each thread names itself when it
   * starts, so the timer thread's name may lag its start: re-read /proc
   * (the kernel's view, like tt_wait_thread_count_leq) until all three show. */
  int bad = 0, named = 0;
  uint64_t until = tt_now_ns() + 10ull * 1000000000u;
  while ((named = check_threads_named("tkosig-", &bad)) < 3 && tt_now_ns() < until) sched_yield();
  cr_assert_eq(named, 3);
  cr_assert_eq(bad, 0, "a pool thread leaves signal %d unblocked (negative: blocks it)", bad);

  pthread_sigmask(SIG_SETMASK, &before, NULL);
  tt_gate_open(&pn.gate);
  cr_assert_eq(tko_pool_destroy(p), 0);
  tt_count_fini(&m.done);
}

/* A process-directed signal, with the only other thread blocking it too:
 * if any pool thread accepted it, the kernel would deliver it there at
 * once; it stays pending instead. Run in a child process, whose only
 * threads are the test's and the pool's (the test runner has threads of
 * its own that may take the signal). */
static int signal_child(void *arg) {
  (void)arg;
  int bad = 0;
  sigset_t usr1, pending;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  /* Default action: a thread that accepts the signal kills the child at
   * once (the kernel decides when the signal is sent), so there is no race
   * with a thread that would take it a little later. */
  signal(SIGUSR1, SIG_DFL);
  pthread_sigmask(SIG_UNBLOCK, &usr1, NULL); /* the pool's threads start from this */
  tko_options o = tko_elastic_options(1, 1, 60000);
  tko_pool *p;
  if (tko_pool_create(&p, &o)) return 1;
  tt_pin pn = TT_PIN_INIT;
  tko_submit(p, tt_pin_fn, &pn, 0);
  tt_count_wait_geq(&pn.started, 1);
  tko_submit(p, tt_pin_fn, &pn, 0); /* the elastic worker */
  tt_count_wait_geq(&pn.started, 2);
  tko_timer t;
  tko_timer_init(&t);
  tko_submit_after(p, &t, 3600000, tt_nop_fn, NULL, 0); /* the timer thread */
  if (tt_thread_count() != 4) bad |= 2; /* this one, two workers, the timer */
  pthread_sigmask(SIG_BLOCK, &usr1, NULL);
  kill(getpid(), SIGUSR1);
  sigpending(&pending);
  if (!sigismember(&pending, SIGUSR1)) bad |= 4; /* a pool thread took it */
  int sig = 0;
  if (sigismember(&pending, SIGUSR1) && (sigwait(&usr1, &sig) || sig != SIGUSR1)) bad |= 8;
  tt_gate_open(&pn.gate);
  if (tko_pool_destroy(p)) bad |= 16;
  return bad;
}

Test(process, a_process_directed_signal_reaches_no_pool_thread) {
#ifdef TP_FORK_SKIP
  cr_skip_test("fork with pool threads under TSan (see the top of the file)");
#endif
  int r = run_in_child(signal_child, NULL);
  cr_assert_eq(r, 0, "child result 0x%x (0x1000a: a pool thread took SIGUSR1)", r);
}

/* Core bug: the coalescer's timer thread (coalescer.c, tko_coalescer_create)
 * is started with a plain pthread_create, not tko__thread_create, so it
 * inherits the creating thread's signal mask (often: nothing blocked) and
 * scheduling attributes, and it does not name itself. A host's SIGINT or
 * SIGTERM handler may then run on it. It also escapes the thread-creation
 * test seam. Fix: start it with tko__thread_create (and name it). */
static int list_tids(long *tids, int max) {
  DIR *d = opendir("/proc/self/task");
  if (!d) return 0;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL && n < max)
    if (e->d_name[0] != '.') tids[n++] = atol(e->d_name);
  closedir(d);
  return n;
}

/* The one-letter state of thread tid ('R', 'S', ...), 0 if unreadable. */
static char thread_state(long tid) {
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/self/task/%ld/stat", tid);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  char *p = strrchr(buf, ')');
  return p && p[1] == ' ' ? p[2] : 0;
}

static void noop_flush(void *user, const tko_coalesce_entry *e, size_t n) {
  (void)user;
  (void)e;
  (void)n;
}

Test(process, the_coalescer_thread_blocks_asynchronous_signals) {
  sigset_t empty, before;
  sigemptyset(&empty);
  pthread_sigmask(SIG_SETMASK, &empty, &before);
  tko_options o = tko_basic_options(1);
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  long old[256], now[256];
  int nold = list_tids(old, 256);
  tko_coalescer *c;
  cr_assert_eq(tko_coalescer_create(&c, p, 1000, noop_flush, NULL, NULL), 0);
  int nnow = list_tids(now, 256);
  int checked = 0;
  for (int i = 0; i < nnow; i++) {
    bool seen = false;
    for (int k = 0; k < nold && !seen; k++) seen = now[i] == old[k];
    if (seen) continue;
    char tid[32];
    snprintf(tid, sizeof tid, "%ld", now[i]);
    /* glibc starts a thread with every signal blocked and sets its real
     * mask as it starts running: read the mask once it sleeps on its
     * interval (the kernel's view; no fixed wait). */
    uint64_t until = tt_now_ns() + 10ull * 1000000000u;
    char st = 0;
    while ((st = thread_state(now[i])) != 'S' && st != 0 && tt_now_ns() < until) sched_yield();
    unsigned long long blk = proc_sigblk(tid);
    for (size_t s = 0; s < NELEM(async_signals); s++)
      cr_assert(blk & (1ull << (async_signals[s] - 1)), "the coalescer thread takes signal %d",
                async_signals[s]);
    checked++;
  }
  cr_assert_eq(checked, 1);
  cr_assert_eq(tko_coalescer_destroy(c), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
  pthread_sigmask(SIG_SETMASK, &before, NULL);
}

/* ---- scheduling policy --------------------------------------------------------------- */

typedef struct sched_probe {
  int policy[2]; /* [kind]: what a task saw on a basic / elastic worker */
  int nice[2];
  tt_count done;
  tt_gate hold; /* each probe keeps its worker until the test opens this */
} sched_probe;

static _Thread_local tko_worker_kind tl_kind;

static void note_kind(void *user, const tko_task_info *t) {
  (void)user;
  tl_kind = t->kind;
}

static int sched_fn(void *arg) {
  sched_probe *s = arg;
  s->policy[tl_kind] = sched_getscheduler(0);
  s->nice[tl_kind] = getpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid));
  tt_count_add(&s->done, 1);
  tt_gate_wait(&s->hold);
  return 0;
}

typedef struct sched_case {
  int policy;       /* of the creating and submitting thread */
  int nice_delta;   /* added to its nice value */
  bool drop_nice_cap; /* drop CAP_SYS_NICE in that thread first */
  int create_rc;
  sched_probe probe;
  int own_policy;   /* what that thread ended up with */
} sched_case;

static bool set_cap_sys_nice(bool keep) {
  struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct d[2];
  if (syscall(SYS_capget, &h, d)) return false;
  if (!keep) {
    d[0].effective &= ~(1u << CAP_SYS_NICE);
    d[0].permitted &= ~(1u << CAP_SYS_NICE);
    if (syscall(SYS_capset, &h, d)) return false;
  }
  return true;
}

static bool have_cap_sys_nice(void) {
  struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct d[2];
  if (syscall(SYS_capget, &h, d)) return false;
  return d[0].effective & (1u << CAP_SYS_NICE);
}

/* Runs on a thread of its own: takes the case's policy and nice, creates an
 * elastic pool of one basic and one elastic worker, and probes both kinds:
 * the first probe holds whichever worker took it, so the second runs on the
 * other one (the elastic one is started by this thread's submit). */
static void *sched_thread(void *arg) {
  sched_case *c = arg;
  if (c->drop_nice_cap) set_cap_sys_nice(false);
  struct sched_param sp = {0};
  sched_setscheduler(0, c->policy, &sp);
  c->own_policy = sched_getscheduler(0);
  id_t tid = (id_t)syscall(SYS_gettid);
  setpriority(PRIO_PROCESS, tid, getpriority(PRIO_PROCESS, tid) + c->nice_delta);
  tko_options o = tko_elastic_options(1, 1, 60000);
  o.hooks.before_run = note_kind;
  tko_pool *p;
  c->create_rc = tko_pool_create(&p, &o);
  if (c->create_rc) return NULL;
  tt_count_init(&c->probe.done);
  c->probe.policy[0] = c->probe.policy[1] = -2;
  c->probe.hold = (tt_gate)TT_GATE_INIT;
  tko_submit(p, sched_fn, &c->probe, 0);
  tt_count_wait_geq(&c->probe.done, 1);
  tko_submit(p, sched_fn, &c->probe, 0); /* the other worker */
  tt_count_wait_geq(&c->probe.done, 2);
  tt_gate_open(&c->probe.hold);
  tko_pool_destroy(p);
  tt_count_fini(&c->probe.done);
  return NULL;
}

static void run_sched_case(sched_case *c) {
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, sched_thread, c), 0);
  pthread_join(t, NULL);
}

static void expect_sched_other(int policy, int nice_delta) {
  sched_case c = {.policy = policy, .nice_delta = nice_delta};
  run_sched_case(&c);
  cr_assert_eq(c.own_policy, policy, "the test thread could not take policy %d", policy);
  cr_assert_eq(c.create_rc, 0);
  cr_assert_eq(c.probe.policy[TKO_WORKER_BASIC], SCHED_OTHER, "basic worker: policy %d",
               c.probe.policy[TKO_WORKER_BASIC]);
  cr_assert_eq(c.probe.policy[TKO_WORKER_ELASTIC], SCHED_OTHER, "elastic worker: policy %d",
               c.probe.policy[TKO_WORKER_ELASTIC]);
}

Test(process, workers_run_sched_other_whatever_the_creator_runs) {
  expect_sched_other(SCHED_BATCH, 0);
  expect_sched_other(SCHED_BATCH, 3);
  /* Leaving SCHED_IDLE needs CAP_SYS_NICE (or RLIMIT_NICE); without it the
   * workers keep the creator's policy: see the next test. */
  if (have_cap_sys_nice()) expect_sched_other(SCHED_IDLE, 0);
}

/* Regression, fixed in 8f0737a. It was: tko__thread_create asks for PTHREAD_EXPLICIT_SCHED with
 * SCHED_OTHER. glibc then moves the new thread out of the creator's policy with sched_setscheduler
 * before it runs, and the kernel refuses to move a thread out of SCHED_IDLE without CAP_SYS_NICE
 * (or a permissive RLIMIT_NICE), so pthread_create fails with EPERM. An unprivileged host thread
 * running SCHED_IDLE therefore cannot create a pool (-EAGAIN), and its submits silently never start
 * elastic workers. Fix: on EPERM, retry with PTHREAD_INHERIT_SCHED (or let a pool thread do the
 * spawning). */
Test(process, an_unprivileged_sched_idle_thread_can_create_a_pool) {
  sched_case c = {.policy = SCHED_IDLE, .drop_nice_cap = true};
  run_sched_case(&c);
  cr_assert_eq(c.own_policy, SCHED_IDLE);
  cr_assert_eq(c.create_rc, 0, "create from SCHED_IDLE without CAP_SYS_NICE: %d", c.create_rc);
}

/* Regression (the priority half of the GLib bug class), fixed: each worker
 * now resets itself to the pool creator's nice value. It was: on Linux the nice
 * value belongs to the thread, and a new thread copies its creator's
 * whatever the pthread attributes say, so each worker takes the nice value
 * of whichever thread started it. An elastic worker started by a submit
 * from a thread at nice +5 runs at +5 (so does every basic worker of a pool
 * created at +3; that one is arguably the creator's choice). Lowering it
 * again needs CAP_SYS_NICE, so the worker cannot simply reset it; spawning
 * elastic workers from a pool thread (a basic worker or a spawner thread)
 * would keep every worker at the creator's value. */
typedef struct nice_submit {
  tko_pool *pool;
  sched_probe *probe;
} nice_submit;

static void *niced_submitter(void *arg) {
  nice_submit *n = arg;
  id_t tid = (id_t)syscall(SYS_gettid);
  setpriority(PRIO_PROCESS, tid, getpriority(PRIO_PROCESS, tid) + 5);
  tko_submit(n->pool, sched_fn, n->probe, 0); /* spawns the elastic worker */
  return NULL;
}

Test(process, elastic_workers_do_not_inherit_the_submitters_nice_value) {
  /* Going back from the submitter's +5 to the creator's value needs
   * CAP_SYS_NICE (taskorch.h says so); as an unprivileged user there is
   * nothing to check. CI runs as root. */
  if (geteuid() != 0) cr_skip_test("needs CAP_SYS_NICE (root) to go back up to the creator's value");
  int base = getpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid));
  tko_options o = tko_elastic_options(1, 1, 60000);
  o.hooks.before_run = note_kind;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  tt_pin pn = TT_PIN_INIT;
  cr_assert_eq(tko_submit(p, tt_pin_fn, &pn, 0), 0);
  cr_assert(tt_count_wait_geq(&pn.started, 1));
  sched_probe probe;
  memset(&probe, 0, sizeof probe);
  probe.nice[1] = -100;
  tt_count_init(&probe.done);
  probe.hold = (tt_gate)TT_GATE_INIT;
  nice_submit n = {p, &probe};
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, niced_submitter, &n), 0);
  pthread_join(t, NULL);
  cr_assert(tt_count_wait_geq(&probe.done, 1));
  tt_gate_open(&probe.hold);
  tt_gate_open(&pn.gate);
  cr_assert_eq(tko_pool_destroy(p), 0);
  cr_assert_eq(probe.nice[TKO_WORKER_ELASTIC], base,
               "elastic worker at nice %d, pool's creator at %d", probe.nice[TKO_WORKER_ELASTIC],
               base);
  tt_count_fini(&probe.done);
}
