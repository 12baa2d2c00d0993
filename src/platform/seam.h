/* SPDX-License-Identifier: MIT */
/* Test seams: hooks that white-box and stress tests (tests/unit, tests/stress) set to park a thread
 * at one point or to fail one call. They exist only in the test library,
 * taskorch_test_static, whose objects are compiled with TKO_TEST_SEAMS; in
 * the released libraries TKO__SEAM(x) is the constant 0, so each seam's
 * branch folds away and its variable is never defined or referenced
 * (tests/check_no_seams.sh checks the released objects). */
#ifndef TKO_SEAM_H
#define TKO_SEAM_H

#ifdef TKO_TEST_SEAMS
#include <stdatomic.h>
/* seq_cst: a test sets a seam before the scene that reaches it, from any
 * thread; test builds pay nothing that matters for the plainest order. */
#define TKO__SEAM(name) atomic_load(&(name))
#else
#define TKO__SEAM(name) 0
#endif

#endif
