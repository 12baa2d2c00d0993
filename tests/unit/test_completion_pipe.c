/* SPDX-License-Identifier: MIT */
/* The completion queue's whole API suite again, on the pipe that stands in
 * for eventfd where there is none: the test seam makes every queue of this
 * process use a pipe. */
#include <sys/stat.h>

#include "prim.h"

__attribute__((constructor)) static void use_pipe(void) {
  atomic_store_explicit(&tko__test_wakefd_pipe, 1, memory_order_relaxed);
}

#include "../api/test_completion.c"

Test(completion_pipe, the_descriptor_is_a_pipe) {
  tko_cq *cq = make_cq(4);
  struct stat st;
  cr_assert_eq(fstat(tko_cq_fd(cq), &st), 0);
  cr_assert(S_ISFIFO(st.st_mode));
  cr_assert_eq(tko_cq_destroy(cq), 0);
}
