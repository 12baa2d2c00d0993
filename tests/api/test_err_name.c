/* SPDX-License-Identifier: MIT */
/* tko_err_name and tko_strerror for every error code the public API returns. */
#include <errno.h>
#include <limits.h>
#include <string.h>

#include <taskorch.h>

#include "tko_test.h"

/* Each code with its name as the preprocessor spells it. */
#define CODE(e) {-(e), #e}
static const struct {
  int err;
  const char *name;
} codes[] = {
  CODE(EINVAL),    CODE(ENOMEM), CODE(EAGAIN),  CODE(ETIMEDOUT), CODE(ESHUTDOWN), CODE(EDEADLK),
  CODE(ECANCELED), CODE(EBUSY),  CODE(ENOENT),  CODE(EPERM),     CODE(EALREADY), CODE(EINPROGRESS),  CODE(ECHILD),
  CODE(EMFILE),    CODE(ENFILE), CODE(ENOTSUP),
};
#define NCODES (sizeof codes / sizeof codes[0])

Test(err_name, names_every_code_the_api_returns) {
  for (size_t i = 0; i < NCODES; i++) {
    const char *name = tko_err_name(codes[i].err);
    cr_assert_not_null(name, "code %d", codes[i].err);
    cr_assert_str_eq(name, codes[i].name, "code %d", codes[i].err);
    cr_assert_eq(name, tko_err_name(codes[i].err), "a static string");
  }
  cr_assert_str_eq(tko_err_name(0), "OK");
}

Test(err_name, unknown_and_positive_values) {
  const int odd[] = {-123456, INT_MIN, INT_MAX, 1, EINVAL, -4095};
  for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++)
    cr_assert_str_eq(tko_err_name(odd[i]), "UNKNOWN", "value %d", odd[i]);
}

Test(err_name, strerror_describes_every_code_distinctly) {
  const char *unknown = tko_strerror(-123456);
  for (size_t i = 0; i < NCODES; i++) {
    const char *text = tko_strerror(codes[i].err);
    cr_assert_not_null(text);
    cr_assert_neq(strcmp(text, unknown), 0, "%s has no description", codes[i].name);
    for (size_t j = i + 1; j < NCODES; j++)
      cr_assert_neq(strcmp(text, tko_strerror(codes[j].err)), 0, "%s and %s share a description",
                    codes[i].name, codes[j].name);
  }
}
