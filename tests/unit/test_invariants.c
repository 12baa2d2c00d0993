/* SPDX-License-Identifier: MIT */
/* The internal invariants (src/invariant.h): in a build that checks them
 * (TKO_LOCK_ORDER_CHECK: Debug, TSan, ASan, fuzzers, mutants) a broken one
 * names itself on stderr and aborts; every other suite running in those
 * builds shows that the library's own operation keeps them. Here a child
 * process breaks one on purpose: an idle list's search ended that never
 * began (its searching count would wrap). */
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tko_signal.h"
#include "tko_test.h"

Test(invariants, a_broken_one_names_itself_and_aborts) {
#ifndef TKO_LOCK_ORDER_CHECK
  cr_skip_test("the invariants are not checked in this build (TKO_LOCK_ORDER_CHECK)");
#endif
  int fds[2];
  cr_assert_eq(pipe(fds), 0);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    dup2(fds[1], STDERR_FILENO);
    tko__idle idle;
    if (tko__idle_init(&idle)) _exit(2);
    (void)tko__idle_search_end(&idle); /* no search began */
    _exit(0);
  }
  close(fds[1]);
  char out[1024];
  size_t len = 0;
  for (ssize_t n; len < sizeof out - 1 && (n = read(fds[0], out + len, sizeof out - 1 - len)) > 0;)
    len += (size_t)n;
  out[len] = '\0';
  close(fds[0]);
  int status;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT, "the child was not aborted");
  cr_assert_not_null(strstr(out, "internal invariant broken at"), "the report: %s", out);
  cr_assert_not_null(strstr(out, "tko__idle_searching(before) > 0"), "the report: %s", out);
}
