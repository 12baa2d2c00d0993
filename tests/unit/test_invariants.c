/* SPDX-License-Identifier: MIT */
/* The internal invariants (src/platform/invariant.h): in a build that checks them
 * (TKO_LOCK_ORDER_CHECK: Debug, TSan, ASan, fuzzers, mutants) a broken one
 * names itself on stderr and aborts; every other suite running in those
 * builds shows that the library's own operation keeps them. Here a child
 * process breaks one on purpose: an idle set's search ended that never
 * began (its searching count would wrap). */
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tko_signal.h"
#include "tko_test.h"
#include "tko_test_child.h"

/* The child's breach: an idle set's search ended that never began. */
static void end_a_search_never_begun(void) {
  tko__idle idle;
  tko__idle_init(&idle, NULL, 0, 0);
  (void)tko__idle_search_end(&idle);
}

Test(invariants, a_broken_one_names_itself_and_aborts) {
#ifndef TKO_LOCK_ORDER_CHECK
  cr_skip_test("the invariants are not checked in this build (TKO_LOCK_ORDER_CHECK)");
#endif
  char out[1024];
  int status = tt_run_child(end_a_search_never_begun, out, sizeof out);
  cr_assert(status != -1 && WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT,
            "the child was not aborted");
  cr_assert_not_null(strstr(out, "internal invariant broken at"), "the report: %s", out);
  cr_assert_not_null(strstr(out, "tko__idle_searching(before) > 0"), "the report: %s", out);
}
