/* SPDX-License-Identifier: MIT */
/* Error descriptions and the run-time version. */
#include <errno.h>

#include "taskorch.h"

const char *tko_strerror(int err) {
  switch (err) {
  case 0: return "success";
  case -EINVAL: return "invalid argument (NULL pointer, bad mode, or a value out of range)";
  case -ENOMEM: return "out of memory (the pool's allocator failed)";
  case -EAGAIN: return "resource temporarily unavailable (queue full or thread not started)";
  case -ETIMEDOUT: return "timed out before the condition was met";
  case -ESHUTDOWN: return "the pool is shut down or shutting down";
  case -EDEADLK: return "would deadlock: called from the pool's own thread";
  case -ECANCELED: return "the task was cancelled";
  case -EBUSY: return "busy: the object is still in use";
  case -ENOENT: return "not found (the timer is not armed)";
  case -EPERM: return "not permitted: must be called from a pool's worker thread";
  case -EALREADY: return "already done: the async task was completed before";
  case -ECHILD: return "the pool was created before fork(): unusable in the child process";
  case -EMFILE: return "no file descriptor left in this process";
  case -ENFILE: return "no file descriptor left in the system";
  case -ENOTSUP: return "not supported on this platform";
  default: return "unknown taskorch error";
  }
}

const char *tko_version_string(void) { return TKO_VERSION_STRING; }

unsigned tko_version_number(void) { return TKO_VERSION_NUMBER; }
