/* SPDX-License-Identifier: MIT */
/* The completion queue's windows, where a thread stopped (parked by a test
 * seam, as a preempted thread would be) meets the others.
 *
 * A poster stopped between reserving its slot and publishing it
 * (tko__test_cq_post_window) holds up every completion reserved after its
 * own: delivery keeps reservation order. A drain in that window takes
 * nothing and leaves the descriptor quiet (the loop is not woken for what
 * it cannot take yet); the moment that post returns, with no other post or
 * drain, the descriptor is readable and one drain delivers both, in order. */
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <taskorch/completion.h>

#include "prim.h"
#include "tko_test.h"
#include "tko_test_sync.h"

extern void (*_Atomic tko__test_cq_post_window)(void);
extern void (*_Atomic tko__test_cq_take_window)(void);

static _Thread_local bool is_poster;
static atomic_bool parked, released;

/* Parks the poster thread only; the test thread's own post passes. */
static void park_the_poster(void) {
  if (!is_poster) return;
  atomic_store(&parked, true);
  while (!atomic_load(&released)) sched_yield();
}

static void *post_one(void *cq) {
  is_poster = true;
  return (void *)(intptr_t)tko_cq_post(cq, 1, 0, NULL);
}

static bool readable(tko_cq *cq, int timeout_ms) {
  struct pollfd p = {.fd = tko_cq_fd(cq), .events = POLLIN};
  return poll(&p, 1, timeout_ms) == 1 && (p.revents & POLLIN);
}

/* The scene, on an eventfd or (pipe) on the pipe that stands in for one. */
static void post_in_progress(bool pipe) {
  atomic_store(&parked, false);
  atomic_store(&released, false);
  atomic_store(&tko__test_wakefd_pipe, pipe);
  tko_cq *cq = NULL;
  cr_assert_eq(tko_cq_create(&cq, 8, NULL), 0);
  atomic_store(&tko__test_wakefd_pipe, 0);
  atomic_store(&tko__test_cq_post_window, park_the_poster);
  pthread_t poster;
  cr_assert_eq(pthread_create(&poster, NULL, post_one, cq), 0);
  while (!atomic_load(&parked)) sched_yield(); /* the post reaches its window: certain */
  /* Reserved after the parked one's slot, published at once. */
  cr_assert_eq(tko_cq_post(cq, 2, 0, NULL), 0);
  tko_completion c[8];
  cr_assert_eq(tko_cq_take(cq, c, 8), 0, "a drain took past an unpublished slot");
  bool quiet = !readable(cq, 0);
  atomic_store(&released, true);
  void *rc;
  cr_assert_eq(pthread_join(poster, &rc), 0);
  atomic_store(&tko__test_cq_post_window, NULL);
  cr_assert_eq((intptr_t)rc, 0);
  cr_assert(quiet, "woken for nothing it could take");
  cr_assert(readable(cq, (int)TT_LONG_MS), "the parked post returned and the descriptor stayed quiet");
  cr_assert_eq(tko_cq_take(cq, c, 8), 2);
  cr_assert_eq(c[0].id, 1);
  cr_assert_eq(c[1].id, 2);
  cr_assert_not(readable(cq, 0));
  cr_assert_eq(tko_cq_destroy(cq), 0);
}

Test(completion_window, a_completion_behind_a_post_in_progress_is_signalled_when_that_post_returns) {
  post_in_progress(false);
}

Test(completion_window, on_a_pipe_a_completion_behind_a_post_in_progress_is_signalled_too) {
  post_in_progress(true);
}

/* A drain stopped between finding a published completion and claiming it
 * (tko__test_cq_take_window) while another drain takes that completion:
 * the stopped one, resumed, finds it gone and delivers nothing. Each
 * completion is delivered exactly once. */
static tko_cq *raced_cq;
static void *take_parked(void *out) {
  is_poster = true; /* the seam parks this thread, as it parks a poster */
  return (void *)(intptr_t)tko_cq_take(raced_cq, out, 8);
}

Test(completion_window, a_drain_that_finds_its_completion_taken_by_another_delivers_it_not_again) {
  atomic_store(&parked, false);
  atomic_store(&released, false);
  cr_assert_eq(tko_cq_create(&raced_cq, 8, NULL), 0);
  cr_assert_eq(tko_cq_post(raced_cq, 1, 0, NULL), 0);
  atomic_store(&tko__test_cq_take_window, park_the_poster);
  static tko_completion theirs[8], mine[8];
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, take_parked, theirs), 0);
  while (!atomic_load(&parked)) sched_yield(); /* it found id 1 and stopped: certain */
  long n = tko_cq_take(raced_cq, mine, 8);
  atomic_store(&released, true);
  void *rc;
  cr_assert_eq(pthread_join(t, &rc), 0);
  atomic_store(&tko__test_cq_take_window, NULL);
  cr_assert_eq(n, 1);
  cr_assert_eq(mine[0].id, 1);
  cr_assert_eq((intptr_t)rc, 0, "the resumed drain delivered the completion a second time");
  cr_assert_eq(tko_cq_take(raced_cq, mine, 8), 0);
  cr_assert_eq(tko_cq_destroy(raced_cq), 0);
}
