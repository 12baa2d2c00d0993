/* SPDX-License-Identifier: MIT */
/** @file
 * taskorch completion queue: results handed back to the host's event loop.
 *
 * libuv runs a work request's after_work_cb on the loop thread; GLib
 * sources, libdispatch and Java futures hand completions back the same way.
 * A completion queue does that for taskorch: a task (or a hook, or any other
 * thread) posts a completion - an id, a status and a user pointer, copied by
 * value into a bounded ring allocated at create, so posting never allocates
 * - and the host's loop watches one file descriptor that becomes readable
 * when completions are waiting, then drains them on its own thread.
 *
 * Watching the descriptor: an epoll loop adds tko_cq_fd with EPOLLIN (level-
 * or edge-triggered), libuv starts a uv_poll on it with UV_READABLE, GLib
 * adds it with g_unix_fd_add(fd, G_IO_IN, ...). On Linux it is an eventfd;
 * elsewhere the read end of a pipe. Either way: never read or write it
 * yourself; tko_cq_drain / tko_cq_take clear it.
 *
 * Readability, the contract a loop relies on:
 * - After a post returns 0, the descriptor is readable until a drain or
 *   take that starts after that post has begun; such a drain delivers the
 *   completion or leaves the descriptor readable (no completion is left
 *   queued with the descriptor quiet). One exception: a completion queued
 *   behind a post still in progress (its poster between taking a slot and
 *   filling it, say preempted) cannot be delivered before that one; a
 *   drain meanwhile takes neither and may leave the descriptor quiet, and
 *   the earlier post makes it readable as it returns. (So a loop never
 *   spins on completions it cannot take yet.)
 * - It may be readable with nothing to take (a completion another drain
 *   took first): a drain then returns 0. Such a wake-up is harmless.
 * - One write per burst: only the first post after a drain touches the
 *   descriptor (later ones see it already signalled), so posting costs a
 *   system call only when the loop has caught up.
 *
 * Delivery: every completion accepted (post returned 0) is delivered
 * exactly once, by one drain or take, in the order the posts reserved
 * their slots (the order of their posts for a single posting thread).
 *
 * A full ring: tko_cq_post never blocks; it returns -EAGAIN and the
 * completion is not queued (the poster keeps its user pointer). Size the
 * ring for the most completions that can wait between two drains - for
 * completions posted by a pool's tasks, the pool's queue_capacity plus its
 * workers is enough when the loop drains before it submits more.
 *
 * Threads: post is safe from any number of threads at once (tasks, hooks,
 * foreign threads, the loop itself). Drain and take are safe from any
 * thread, concurrently too (each completion goes to exactly one of them),
 * but are meant for the loop's thread. Create and destroy must not race
 * with any other call on the same queue. */
#ifndef TASKORCH_COMPLETION_H
#define TASKORCH_COMPLETION_H

#include <taskorch.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TKO_MAX_CQ_CAPACITY ((size_t)1 << 24) /**< ring slots limit */

typedef struct tko_cq tko_cq; /**< opaque */

/** One completion, by value. The library never looks inside user. */
typedef struct tko_completion {
  uint64_t id;  /**< the poster's: a request number, a task id, ... */
  int status;   /**< the poster's: 0 = success, by convention */
  void *user;   /**< the poster's: the request's state, a result, ... */
} tko_completion;

/** Receives one completion during tko_cq_drain, on the draining thread. It
 * may post to this queue (those completions wait for a later drain, not
 * this one), not destroy it. */
typedef void (*tko_cq_fn)(void *user, const tko_completion *c);

/** Creates a queue of `capacity` slots (0 = 1024), rounded up to a power of
 * two and allocated now, so that no post allocates.
 * @details Allocated with `allocator` (NULL = malloc/free), plus its descriptor
 * (close-on-exec, non-blocking). -EINVAL: NULL out, capacity over
 * TKO_MAX_CQ_CAPACITY, or a partial allocator; -ENOMEM; -EMFILE / -ENFILE: no
 * descriptor left. */
TKO_API int tko_cq_create(tko_cq **out, size_t capacity, const tko_allocator *allocator);

/** The descriptor to watch for readability (see above): >= 0, valid until
 * tko_cq_destroy; -EINVAL for NULL. */
TKO_API int tko_cq_fd(const tko_cq *cq);

/** Queues one completion and, if the loop has caught up, makes the
 * descriptor readable. Never blocks, never allocates. Safe from any thread.
 * @details -EINVAL: NULL cq; -EAGAIN: the ring is full (nothing queued). */
TKO_API int tko_cq_post(tko_cq *cq, uint64_t id, int status, void *user);

/** Delivers up to `max` of the completions queued when it began (0 = the
 * ring's capacity) to fn, oldest first, each exactly once, and returns how
 * many.
 * @details Clears the descriptor first. A completion posted while it runs,
 * by fn or another thread, waits for a later drain, so a callback that
 * posts again cannot keep one drain going. If it stopped at max, the
 * descriptor is made readable again so the loop comes back for the rest.
 * Returns how many were delivered (>= 0), or -EINVAL for NULL cq or fn. Safe
 * from any thread (see above). */
TKO_API long tko_cq_drain(tko_cq *cq, tko_cq_fn fn, void *user, size_t max);

/** tko_cq_drain's twin that copies up to max (>= 1) completions into out
 * instead of calling a function. -EINVAL: NULL cq or out, or max == 0. */
TKO_API long tko_cq_take(tko_cq *cq, tko_completion *out, size_t max);

/** Closes the descriptor and frees the queue; -EBUSY, freeing nothing,
 * while completions are still queued.
 * @details Call it once every poster is done (for tasks of a pool: after
 * tko_pool_shutdown returned). -EBUSY, freeing nothing, while completions are
 * still queued: drain them first, since their user pointers may own memory.
 * -EINVAL for NULL. */
TKO_API int tko_cq_destroy(tko_cq *cq);

#ifdef __cplusplus
}
#endif
#endif /* TASKORCH_COMPLETION_H */
