/* SPDX-License-Identifier: MIT */
/* Readiness descriptors (prim.h): the eventfd, or pipe, that a completion
 * queue gives an event loop to watch; apart from the rest of the platform
 * layer because it is the one piece that speaks to the host's loop. */
#define _GNU_SOURCE
#include "prim.h"
#include "seam.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <unistd.h>

#ifdef TKO_HAVE_EVENTFD
#include <sys/eventfd.h>
#endif

#ifdef TKO_TEST_SEAMS
_Atomic int tko__test_wakefd_pipe;
#endif

static int set_nonblock_cloexec(int fd) {
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) return -errno;
  if (fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) return -errno;
  return 0;
}

int tko__wakefd_open(int fds[2]) {
#ifdef TKO_HAVE_EVENTFD
  if (!TKO__SEAM(tko__test_wakefd_pipe)) { /* prim.h, seam.h */
    int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (fd < 0) return -errno;
    fds[0] = fds[1] = fd;
    return 0;
  }
#endif
  if (pipe(fds) < 0) return -errno;
  int rc = set_nonblock_cloexec(fds[0]);
  if (rc == 0) rc = set_nonblock_cloexec(fds[1]);
  if (rc) tko__wakefd_close(fds);
  return rc;
}

/* An eventfd is one descriptor: it takes and gives 8-byte counters. */
static bool is_eventfd(const int fds[2]) { return fds[0] == fds[1]; }

void tko__wakefd_signal(const int fds[2]) {
  uint64_t one = 1;
  /* Only EAGAIN can fail here (an eventfd counter at its maximum, a full
   * pipe), and then the descriptor is readable anyway. */
  ssize_t r = write(fds[1], &one, is_eventfd(fds) ? sizeof one : 1);
  (void)r;
}

void tko__wakefd_clear(const int fds[2]) {
  uint64_t buf[8];
  /* An eventfd resets in one read (EAGAIN if it was 0); a pipe is read
   * until a short read says it is empty. */
  size_t len = is_eventfd(fds) ? sizeof buf[0] : sizeof buf;
  while (read(fds[0], buf, len) == (ssize_t)len && !is_eventfd(fds)) {
  }
}

void tko__wakefd_close(const int fds[2]) {
  close(fds[0]);
  if (!is_eventfd(fds)) close(fds[1]);
}
