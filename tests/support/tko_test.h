/* SPDX-License-Identifier: MIT */
/* Test header for every suite: Criterion normally; under ThreadSanitizer a
 * minimal stand-in with the same Test()/cr_assert_* spelling, because
 * Criterion's inheritable arena cannot start under TSan (Criterion issue
 * #274). The stand-in runs the tests in order in one process and exits
 * non-zero at the first failed assertion. Suites use only the macros below. */
#ifndef TKO_TEST_H
#define TKO_TEST_H

#ifndef TKO_TEST_STANDALONE
#include <criterion/criterion.h>
#else
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct tko_test_case {
  const char *suite, *name;
  void (*fn)(void);
  struct tko_test_case *next;
} tko_test_case;

static tko_test_case *tko_test_head, **tko_test_tail = &tko_test_head;

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

int main(int argc, char **argv) {
  const char *only = NULL; /* optional "suite/name" filter, like --filter */
  for (int i = 1; i < argc; i++)
    if (!strncmp(argv[i], "--filter=", 9)) only = argv[i] + 9;
  int ran = 0;
  for (tko_test_case *c = tko_test_head; c; c = c->next) {
    char full[256];
    snprintf(full, sizeof full, "%s/%s", c->suite, c->name);
    if (only && strcmp(only, full) != 0) continue;
    fprintf(stderr, "[RUN ] %s\n", full);
    c->fn();
    ran++;
  }
  fprintf(stderr, "[ OK ] %d tests passed\n", ran);
  return 0;
}
#endif

#endif
