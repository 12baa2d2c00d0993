/* Submitting: single tasks and batches go through the lock-free inbox
 * (inbox.h); only a full inbox, or a batch larger than it, takes the queue
 * lock to move tasks along. */
#include <errno.h>

#include "internal.h"

int tko__pool_drain_locked(tko_pool *pool) {
  int rc = tko__inbox_drain(&pool->inbox, &pool->queue);
  tko__store_relaxed(&pool->backlog, pool->queue.len); /* under lock */
  return rc;
}

/* The inbox is full: move it into the queue ourselves (workers are busy). */
static int make_room(tko_pool *pool) {
  tko__lock_acquire(&pool->lock);
  int rc = tko__pool_drain_locked(pool);
  tko__unlock(&pool->lock);
  return rc;
}

static uint64_t enqueue_time(tko_pool *pool) {
  return pool->timing || pool->queue.aging_ns ? tko__now_ns() : 0;
}

int tko__submit_item(tko_pool *pool, tko_task_fn fn, void *arg, uintptr_t ctx, int weight) {
  uint64_t enq_ns = enqueue_time(pool);
  uint64_t pos;
  int rc;
  while ((rc = tko__inbox_reserve(&pool->inbox, 1, &pos)) == -EAGAIN) {
    rc = make_room(pool);
    if (rc) return rc;
  }
  if (rc) return rc;
  tko__inbox_publish(&pool->inbox, pos, fn, arg, ctx, weight, enq_ns);
  tko__signal_work(pool);
  return 0;
}

int tko_submit(tko_pool *pool, tko_task_fn fn, void *arg, int weight) {
  if (!pool || !fn) return -EINVAL;
  return tko__submit_item(pool, fn, arg, 0, weight);
}

/* A batch larger than the inbox goes straight into the queue, under the
 * lock, once the inbox is empty: its positions are claimed on the inbox
 * tail (so ids stay gap-free and in order) and consumed at once. */
static int submit_big_batch(tko_pool *pool, const tko_task *tasks, size_t n, uint64_t enq_ns) {
  tko__inbox *in = &pool->inbox;
  tko__lock_acquire(&pool->lock);
  int rc = tko__queue_reserve(&pool->queue, n);
  if (rc == 0) rc = tko__queue_reserve_buckets(&pool->queue, n);
  uint64_t t = 0;
  while (rc == 0) {
    rc = tko__pool_drain_locked(pool);
    if (rc) break;
    t = tko__load_seq(&in->tail);
    if (t & TKO__INBOX_CLOSED) {
      rc = -ESHUTDOWN;
      break;
    }
    /* Submitters that find the inbox "full" (tail moved, head not yet) wait
     * for the lock in make_room, after this batch. */
    if (t == tko__load_relaxed(&in->head) && tko__cas_seq(&in->tail, &t, t + n)) break;
  }
  if (rc == 0) {
    for (size_t i = 0; i < n; i++) {
      tko__item item = {.fn = tasks[i].fn, .arg = tasks[i].arg, .id = t + i + 1,
                        .enq_ns = enq_ns, .weight = tasks[i].weight};
      tko__queue_push(&pool->queue, &item); /* cannot fail: reserved above */
    }
    /* Release: pairs with the acquire in tko__inbox_reserve. */
    tko__store_release(&in->head, t + n);
    tko__store_relaxed(&pool->backlog, pool->queue.len); /* under lock */
  }
  tko__unlock(&pool->lock);
  return rc;
}

int tko_submit_batch(tko_pool *pool, const tko_task *tasks, size_t n) {
  if (!pool || !tasks || n == 0) return -EINVAL;
  for (size_t i = 0; i < n; i++)
    if (!tasks[i].fn) return -EINVAL;
  uint64_t enq_ns = enqueue_time(pool);
  tko__inbox *in = &pool->inbox;
  int rc;
  if (n > in->mask + 1) {
    rc = submit_big_batch(pool, tasks, n, enq_ns);
  } else {
    uint64_t pos;
    while ((rc = tko__inbox_reserve(in, n, &pos)) == -EAGAIN) {
      rc = make_room(pool);
      if (rc) return rc;
    }
    if (rc == 0)
      for (size_t i = 0; i < n; i++)
        tko__inbox_publish(in, pos + i, tasks[i].fn, tasks[i].arg, 0, tasks[i].weight, enq_ns);
  }
  if (rc == 0) tko__signal_work(pool); /* one wake; each woken worker wakes the next */
  return rc;
}
