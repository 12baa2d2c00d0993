/* SPDX-License-Identifier: MIT */
/* Test header for every suite: Criterion normally; under ThreadSanitizer a
 * minimal stand-in with the same Test()/cr_assert_* spelling, because
 * Criterion's inheritable arena cannot start under TSan (Criterion issue
 * #274). The stand-in runs the tests in order in one process and exits
 * non-zero at the first failed assertion. Suites use only the macros below.
 *
 * A test that cannot run in a build (fork under a sanitizer, a privilege
 * the process lacks) calls cr_skip_test("why"): it is reported as skipped,
 * with its reason, and counted apart in the summary - never as passed. */
#ifndef TKO_TEST_H
#define TKO_TEST_H

#ifndef TKO_TEST_STANDALONE
#include <criterion/criterion.h>
#else
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct tko_test_case {
  const char *suite, *name;
  void (*fn)(void);
  struct tko_test_case *next;
} tko_test_case;

/* Weak, like main below: an executable of several test files (each
 * including this header) has one list of tests, one runner and one skip
 * point, as under Criterion. */
__attribute__((weak)) tko_test_case *tko_test_head, **tko_test_tail = &tko_test_head;
__attribute__((weak)) jmp_buf tko_test_skip_jmp; /* cr_skip_test returns to the runner */

static inline void tko_test_register(tko_test_case *c) {
  *tko_test_tail = c;
  tko_test_tail = &c->next;
}

#define Test(suite, name, ...)                                               \
  static void suite##_##name(void);                                          \
  __attribute__((constructor)) static void suite##_##name##_register(void) { \
    static tko_test_case c = {#suite, #name, suite##_##name, NULL};          \
    tko_test_register(&c);                                                   \
  }                                                                          \
  static void suite##_##name(void)

#define cr_assert(cond, ...)                                                          \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      fprintf(stderr, "%s:%d: assertion failed: %s\n", __FILE__, __LINE__, #cond);   \
      exit(1);                                                                        \
    }                                                                                 \
  } while (0)
#define cr_assert_not(c, ...) cr_assert(!(c))
#define cr_assert_eq(a, b, ...) cr_assert((a) == (b))
#define cr_assert_neq(a, b, ...) cr_assert((a) != (b))
#define cr_assert_lt(a, b, ...) cr_assert((a) < (b))
#define cr_assert_leq(a, b, ...) cr_assert((a) <= (b))
#define cr_assert_gt(a, b, ...) cr_assert((a) > (b))
#define cr_assert_geq(a, b, ...) cr_assert((a) >= (b))
#define cr_assert_null(p, ...) cr_assert((p) == NULL)
#define cr_assert_not_null(p, ...) cr_assert((p) != NULL)
#define cr_assert_str_eq(a, b, ...) cr_assert(strcmp((a), (b)) == 0)
#define cr_fail(...) cr_assert(!"cr_fail")
/* Ends the test as skipped; the message is a plain string (the reason). */
#define cr_skip_test(msg)                         \
  do {                                            \
    fprintf(stderr, "[SKIP] %s\n", (msg));        \
    longjmp(tko_test_skip_jmp, 1);                \
  } while (0)

/* Runs one test: true if it passed, false if it skipped itself. */
static int tko_test_run_one(void (*fn)(void)) {
  if (setjmp(tko_test_skip_jmp) != 0) return 0;
  fn();
  return 1;
}

__attribute__((weak)) int main(int argc, char **argv) {
  const char *only = NULL; /* optional "suite/name" filter, like --filter */
  for (int i = 1; i < argc; i++)
    if (!strncmp(argv[i], "--filter=", 9)) only = argv[i] + 9;
  int passed = 0, skipped = 0;
  for (tko_test_case *c = tko_test_head; c; c = c->next) {
    char full[256];
    snprintf(full, sizeof full, "%s/%s", c->suite, c->name);
    if (only && strcmp(only, full) != 0) continue;
    fprintf(stderr, "[RUN ] %s\n", full);
    if (tko_test_run_one(c->fn)) passed++;
    else skipped++;
  }
  fprintf(stderr, "[ OK ] %d tests passed, %d skipped\n", passed, skipped);
  return 0;
}
#endif

#endif
