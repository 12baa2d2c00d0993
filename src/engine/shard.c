/* SPDX-License-Identifier: MIT */
/* Shards: the pool's weighted queues, each with its own lock
 * (tko_options.queues). With one, every take and every drain meet at
 * one lock and one queue, whose lines the previous holder wrote: on many
 * cores that serialises the pool (benchmarks/MODEL.md, the sharing audit's
 * third gate). With several, a submitting thread's ring drains into one
 * shard (ring i into shard i mod the count; the shared inbox and the
 * held queue into shard 0), and each worker takes from its home shard
 * first, so that threads on different shards share no line in the steady
 * state.
 *
 * The priority contract across shards (taskorch.h, tko_submit) is the
 * bounded-inversion one: each shard publishes the heaviest weight queued
 * in it (top, stored under its lock when it changes). A take goes to the
 * shard with the heaviest top, its home on a tie; with nothing at home it
 * takes half of another shard's backlog. Tasks not yet drained from
 * another shard's rings have no top: a worker sweeps - drains every other
 * shard with submissions waiting - at a take once recheck_ns has passed
 * since its last sweep, and at every recheck look (take.c). So once a
 * submit has returned, a worker starts a lighter task at most about
 * recheck_ns (plus the batch it already took) later while that task is
 * still queued. Within one shard the order is the single queue's.
 *
 * What several shards give up in order: a thread's held tasks go through
 * the inbox into shard 0 (the held queue is shard 0's) while its other
 * tasks go through its ring, so equal-weight held and plain tasks of one
 * thread keep no order between them; and a thread that used the inbox
 * (its ring claim failed for want of memory) and later gets a ring of
 * another shard may see its newer tasks taken before its older ones still
 * in the inbox. */
#include "engine.h"
#include "seam.h"
#include "wake.h"

int tko__shard_drain_locked(tko_pool *pool, tko__shard *sh) {
  return tko__shard_drain_staged(pool, sh, NULL);
}

int tko__shard_drain_staged(tko_pool *pool, tko__shard *sh, const tko__ring_stage *st) {
  int rc = 0;
  /* Not past an inbox that could not move everything: a thread whose ring
   * came after a failed claim has older tasks there (ring.c). */
  if (sh->index == 0)
    rc = tko__inbox_drain(&pool->inbox, &sh->queue, &pool->held, TKO__CTX_HELD);
  /* Held tasks only come through the inbox where there are several
   * shards (submit.c), so other shards' rings never hold one. */
  if (rc == 0)
    rc = tko__rings_drain(&pool->rings, sh->index, &sh->queue, &pool->held, TKO__CTX_HELD, st);
  tko__refresh_backlog(pool, sh);
  return rc;
}

#ifdef TKO_TEST_SEAMS
void (*_Atomic tko__test_stage_window)(void);
#endif

const tko__ring_stage *tko__shard_stage(tko_pool *pool, tko__worker *w, const tko__shard *sh) {
  tko__ring_stage *st = w ? w->stage : NULL;
  if (!st || !tko__rings_shard_ready_hint(&pool->rings, sh->index)) return NULL;
  /* seq_cst, the flag's store and the load of trims: a Dekker pair with
   * tko__pool_trim's increment of trims and its load of the flag. Either
   * this stage sees the trim and reads no segment, or the trim sees the
   * flag and waits for its release store below, after the last read. */
  tko__store_seq(&w->staging, true);
  bool trimming = tko__load_seq(&pool->trims);
  if (!trimming) {
    void (*seam)(void) = TKO__SEAM(tko__test_stage_window);
    if (seam) seam();
    tko__rings_stage(&pool->rings, sh->index, TKO__CTX_HELD, st);
  }
  tko__store_release(&w->staging, false);
  return trimming ? NULL : st;
}

/* Whether submissions wait to be drained into sh (a hint). */
static bool submissions_hint(tko_pool *pool, const tko__shard *sh) {
  return tko__rings_shard_ready_hint(&pool->rings, sh->index) ||
         (sh->index == 0 && tko__inbox_ready_hint(&pool->inbox));
}

bool tko__shard_work_hint(tko_pool *pool, const tko__shard *sh) {
  return tko__load_relaxed(&sh->backlog) > 0 || submissions_hint(pool, sh);
}

void tko__shards_sweep(tko_pool *pool, tko__worker *w, const tko__shard *except) {
  for (unsigned i = 0; i < pool->nshards; i++) {
    tko__shard *sh = &pool->shards[i];
    if (sh == except || !submissions_hint(pool, sh)) continue;
    const tko__ring_stage *st = tko__shard_stage(pool, w, sh); /* before the lock */
    tko__lock_acquire(&sh->lock);
    tko__shard_drain_staged(pool, sh, st);
    tko__unlock(&sh->lock);
  }
}

tko__shard *tko__shard_pick(tko_pool *pool, const tko__worker *w) {
  tko__shard *pick = &pool->shards[w->home];
  /* Acquire, each: pairs with tko__refresh_backlog's release store. */
  int best = tko__load_acquire(&pick->top);
  for (unsigned i = 0; i < pool->nshards; i++) {
    tko__shard *sh = &pool->shards[i];
    int top = tko__load_acquire(&sh->top);
    if (top > best) {
      best = top;
      pick = sh;
    }
  }
  return pick;
}

bool tko__shards_outrank(tko_pool *pool, int weight) {
  for (unsigned i = 0; i < pool->nshards; i++)
    if (tko__load_acquire(&pool->shards[i].top) > weight) return true; /* as in pick */
  return false;
}
