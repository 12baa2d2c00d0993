/* SPDX-License-Identifier: MIT */
/* The completion queue on the pipe that stands in for eventfd where there
 * is none. The executable test_completion_pipe is this file beside
 * tests/api/test_completion.c (tests/CMakeLists.txt): the test seam makes
 * every queue of the process use a pipe, so the whole API suite runs again
 * on it, and the test below checks that it is a pipe indeed. */
#include <stdatomic.h>
#include <sys/stat.h>
#include <taskorch.h>

#include "prim.h"
#include "tko_test.h"

/* Before main, so before any test makes a queue. */
__attribute__((constructor)) static void use_pipe(void) {
  atomic_store_explicit(&tko__test_wakefd_pipe, 1, memory_order_relaxed);
}

Test(completion_pipe, the_descriptor_is_a_pipe) {
  tko_cq *cq = NULL;
  cr_assert_eq(tko_cq_create(&cq, 4, NULL), 0);
  cr_assert_not_null(cq);
  struct stat st;
  cr_assert_eq(fstat(tko_cq_fd(cq), &st), 0);
  cr_assert(S_ISFIFO(st.st_mode));
  cr_assert_eq(tko_cq_destroy(cq), 0);
}
