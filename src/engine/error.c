/* SPDX-License-Identifier: MIT */
/* Error names and descriptions, and the run-time version. */
#include <errno.h>
#include <stddef.h>

#include "taskorch.h"

/* Every code the public API returns (as -code), its name and description:
 * one table for tko_err_name and tko_strerror. */
static const struct tko_error {
  int code;
  const char *name;
  const char *text;
} tko_errors[] = {
  {EINVAL, "EINVAL", "invalid argument (NULL pointer, bad mode, or a value out of range)"},
  {ENOMEM, "ENOMEM", "out of memory (the pool's allocator failed)"},
  {EAGAIN, "EAGAIN", "resource temporarily unavailable (queue full or thread not started)"},
  {ETIMEDOUT, "ETIMEDOUT", "timed out before the condition was met"},
  {ESHUTDOWN, "ESHUTDOWN", "the pool is shut down or shutting down"},
  {EDEADLK, "EDEADLK", "would deadlock: called from the pool's own thread"},
  {ECANCELED, "ECANCELED", "the task was cancelled"},
  {EBUSY, "EBUSY", "busy: the object is still in use"},
  {ENOENT, "ENOENT", "not found (the timer is not armed)"},
  {EPERM, "EPERM", "not permitted: must be called from a pool's worker thread"},
  {EALREADY, "EALREADY", "already done: the async task was completed, or the task cancelled, before"},
  {EINPROGRESS, "EINPROGRESS", "in progress: the task is queued or running"},
  {ECHILD, "ECHILD", "the pool was created before fork(): unusable in the child process"},
  {EMFILE, "EMFILE", "no file descriptor left in this process"},
  {ENFILE, "ENFILE", "no file descriptor left in the system"},
  {ENOTSUP, "ENOTSUP", "not supported on this platform"},
};

static const struct tko_error *find_error(int err) {
  for (size_t i = 0; i < sizeof tko_errors / sizeof tko_errors[0]; i++)
    if (-tko_errors[i].code == err) return &tko_errors[i];
  return NULL;
}

const char *tko_strerror(int err) {
  if (err == 0) return "success";
  const struct tko_error *e = find_error(err);
  return e ? e->text : "unknown taskorch error";
}

const char *tko_err_name(int err) {
  if (err == 0) return "OK";
  const struct tko_error *e = find_error(err);
  return e ? e->name : "UNKNOWN";
}

const char *tko_version_string(void) { return TKO_VERSION_STRING; }

unsigned tko_version_number(void) { return TKO_VERSION_NUMBER; }
