/* SPDX-License-Identifier: MIT */
/* A child process for the checks that abort (the lock-order checker, the
 * internal invariants): runs fn there with its standard error captured. */
#ifndef TKO_TEST_CHILD_H
#define TKO_TEST_CHILD_H

#include <stddef.h>
#include <stdlib.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

/* Runs fn in a forked child (which exits 0 if fn returns), stores what it
 * wrote on stderr in out (NUL-terminated, at most cap - 1 bytes) and
 * returns its wait status; -1 if the fork or the pipe failed. */
static inline int tt_run_child(void (*fn)(void), char *out, size_t cap) {
  int fds[2];
  if (pipe(fds)) return -1;
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    dup2(fds[1], STDERR_FILENO);
    fn();
    _exit(0);
  }
  close(fds[1]);
  size_t len = 0;
  for (ssize_t n; len < cap - 1 && (n = read(fds[0], out + len, cap - 1 - len)) > 0;)
    len += (size_t)n;
  out[len] = '\0';
  close(fds[0]);
  int status;
  return waitpid(pid, &status, 0) == pid ? status : -1;
}

#endif
