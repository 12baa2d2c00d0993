/* SPDX-License-Identifier: MIT */
/* The waiters of a lane (lane.h: lane_waiter): tko_lanes_submit_wait's
 * callers, each listed on its task's lane in ticket order, and resolved
 * once: by the visit that ran its task (tko__lane_waiters_ran) or by the
 * cancel that handed it to on_cancel. The protocol is lane_wait.c's; the
 * runner (lane_runner.c) and the cancel resolve waiters through these,
 * under the lane's mutex for the list. */
#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>

#include "atomics.h"
#include "prim.h"
#include "taskorch/lanes.h"
#include "lane.h"

lane_waiter *tko__lane_waiters_take(lane *ln, uint64_t from, uint64_t end) {
  lane_waiter **at = &ln->waiters, *before = NULL;
  while (*at && (*at)->ticket < from) {
    before = *at;
    at = &(*at)->next;
  }
  lane_waiter *first = *at, *last = NULL;
  for (lane_waiter *w = first; w && w->ticket < end; w = w->next) last = w;
  if (!last) return NULL;
  *at = last->next;
  if (ln->waiters_last == last) ln->waiters_last = before;
  last->next = NULL;
  return first;
}

void tko__lane_waiters_end(lane_waiter *w, unsigned state) {
  while (w) {
    lane_waiter *next = w->next; /* read first: the exchange frees the record */
    /* Release: pairs with the caller's acquire in tko_lanes_submit_wait;
     * what the task (or on_cancel) did happens-before the caller returns.
     * Only a caller that said it sleeps is woken (a system call). */
    unsigned was = tko__exchange_acq_rel(&w->state, state);
    if (was == LANE_SLEEPING) tko__word_wake_all(&w->state);
    w = next;
  }
}

void tko__lane_waiters_ran(lane *ln, uint64_t end) {
  if (!ln->waiters) return; /* the common case: nobody waits on this lane */
  tko__lane_waiters_end(tko__lane_waiters_take(ln, 0, end), LANE_RAN);
}
