/* SPDX-License-Identifier: MIT */
/* Helping waits' sleep: a pool worker that waits for something (a group,
 * a handle) runs its pool's tasks meanwhile, and when none is runnable it
 * sleeps here, on a parker of its own (a binary semaphore, tko_signal.h).
 *
 * New work in the pool unparks every helper the pool lists
 * (tko__wake_helpers, from tko__signal_work); what the helper waits for
 * unparks it through a list of its own (the group's helpers). A helper
 * lists itself and counts itself in pool->helpers (seq_cst) before it
 * looks for work a last time: a submit publishes its task, then reads the
 * count (seq_cst, tko__signal_work), so either the look sees the task or
 * the submit sees the helper and unparks it; a parker keeps a wake-up
 * that comes before the park, so none is lost between the look and the
 * sleep. */
#include "engine.h"
#include "wake.h"

void tko__wake_helpers(tko_pool *pool) {
  tko__mutex_lock(&pool->help_mu);
  for (tko__helper *h = pool->help_list; h; h = h->pool_next) tko__parker_unpark(&h->parker);
  tko__mutex_unlock(&pool->help_mu);
}

void tko__helper_sleep(tko_pool *pool, tko__helper *h, uint64_t max_ns,
                       bool (*waiting)(void *arg), void *arg) {
  tko__mutex_lock(&pool->help_mu);
  h->pool_next = pool->help_list;
  pool->help_list = h;
  /* seq_cst: the Dekker pair with tko__signal_work's load, after the
   * work's publication; the look below comes after this increment. */
  tko__add_seq(&pool->helpers, 1);
  tko__mutex_unlock(&pool->help_mu);
  enum tko__look look = tko__look_seq(pool);
  if (look != TKO__LOOK_WORK && waiting(arg)) {
    /* Beside a hole (a publish that may not wake us): a bounded sleep. */
    uint64_t poll = (uint64_t)TKO__HOLE_POLL_MS * 1000000u;
    (void)tko__parker_park(&h->parker, look == TKO__LOOK_HOLE && poll < max_ns ? poll : max_ns);
  }
  tko__mutex_lock(&pool->help_mu);
  tko__helper **p = &pool->help_list;
  while (*p != h) p = &(*p)->pool_next;
  *p = h->pool_next;
  tko__sub_seq(&pool->helpers, 1);
  tko__mutex_unlock(&pool->help_mu);
}
