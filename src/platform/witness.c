/* SPDX-License-Identifier: MIT */
/* The lock-order checker of witness.h: each thread's held ranks, checked
 * at every acquisition, release and condition wait. Compiled only with
 * TKO_LOCK_ORDER_CHECK. */
#include "witness.h"
#include "seam.h"

#ifdef TKO_LOCK_ORDER_CHECK
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#ifdef TKO_TEST_SEAMS
_Atomic(tko__witness_fn) tko__test_witness_hook;
#endif

/* Deeper than any nesting the rules allow (one lock of each non-leaf rank
 * and a leaf); a thread that holds more has broken them. */
#define HELD_MAX 16

/* The ranks this thread holds, in the order it took them. */
static _Thread_local struct {
  unsigned n;
  tko__rank rank[HELD_MAX];
} held;

static const char *const names[TKO__RANK_COUNT] = {
    [TKO__RANK_NONE] = "no lock",
    [TKO__RANK_KEYED] = "keyed_mu",
    [TKO__RANK_LANE] = "a lane's mu (lane.h)",
    [TKO__RANK_SPAWN] = "spawn_mu",
    [TKO__RANK_QUEUE] = "the queue lock",
    [TKO__RANK_HELP] = "help_mu",
    [TKO__RANK_GROUP] = "a group's mu (group.c)",
    [TKO__RANK_GATE] = "gate_mu",
    [TKO__RANK_IDLE_WAIT] = "idle_mu",
    [TKO__RANK_TIMER] = "timer_mu",
    [TKO__RANK_TIMER_GRACE] = "the timers' grace_mu (timer.c)",
    [TKO__RANK_ASYNC] = "async_mu",
    [TKO__RANK_PARKER] = "a parker's mu (signal.c)",
    [TKO__RANK_LANES_IDLE] = "the lanes' idle_mu (lane.h)",
    [TKO__RANK_COALESCER] = "a coalescer's mu (coalescer.c)",
    [TKO__RANK_RINGS] = "the submit rings' mu (ring.c)",
    [TKO__RANK_WORD_WAIT] = "a word wait's stripe mu (futex.c)",
};

const char *tko__rank_name(tko__rank r) {
  return r < TKO__RANK_COUNT && names[r] ? names[r] : "an unknown rank";
}

static void violation(int what, tko__rank had, tko__rank r) {
  tko__witness_fn hook = TKO__SEAM(tko__test_witness_hook); /* witness.h, seam.h */
  if (hook) {
    hook(what, had, r);
    return;
  }
  fprintf(stderr, "taskorch: lock order violation (see src/platform/witness.h): a thread ");
  if (what == TKO__WITNESS_HOST_UNDER_LOCK)
    fprintf(stderr, "runs the host's code while holding %s (rank %d)\n", tko__rank_name(had),
            (int)had);
  else if (what == TKO__WITNESS_NOT_HELD)
    fprintf(stderr, "releases or waits with %s (rank %d), which it does not hold\n",
            tko__rank_name(r), (int)r);
  else
    fprintf(stderr, "%s %s (rank %d) while holding %s (rank %d)\n",
            what == TKO__WITNESS_ORDER ? "takes" : "waits with", tko__rank_name(r), (int)r,
            tko__rank_name(had), (int)had);
  abort();
}

/* The highest rank this thread holds, TKO__RANK_NONE if none: the last
 * one taken, since ranks are taken in increasing order and releasing one
 * keeps the rest in order (after a violation a test's seam goes on from,
 * the order no longer holds, and neither does the report's "held"). */
static tko__rank highest_held(void) { return held.n ? held.rank[held.n - 1] : TKO__RANK_NONE; }

void tko__witness_acquire(tko__rank r) {
  tko__rank top = highest_held();
  if (top >= r || top >= TKO__RANK_LEAF) violation(TKO__WITNESS_ORDER, top, r);
  if (held.n < HELD_MAX) held.rank[held.n++] = r; /* more: reported above */
}

void tko__witness_release(tko__rank r) {
  /* Locks need not be released in the order they were taken. */
  for (unsigned i = held.n; i-- > 0;) {
    if (held.rank[i] != r) continue;
    for (unsigned j = i + 1; j < held.n; j++) held.rank[j - 1] = held.rank[j];
    held.n--;
    return;
  }
  violation(TKO__WITNESS_NOT_HELD, TKO__RANK_NONE, r);
}

void tko__witness_wait(tko__rank r) {
  bool holds = false;
  for (unsigned i = 0; i < held.n; i++) {
    if (held.rank[i] == r) holds = true;
    else violation(TKO__WITNESS_WAIT_HOLDING, held.rank[i], r);
  }
  if (!holds) violation(TKO__WITNESS_NOT_HELD, TKO__RANK_NONE, r);
}

void tko__witness_assert_none_held(void) {
  if (held.n) violation(TKO__WITNESS_HOST_UNDER_LOCK, highest_held(), TKO__RANK_NONE);
}
#endif
