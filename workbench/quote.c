/* SPDX-License-Identifier: MIT */
/* Raw values echoed in error lines: whatever a user typed (a file name, an
 * option's value) is printed escaped, so that a value holding a newline, a
 * terminal escape or a quote still gives exactly one line on stderr that
 * says what was given. */
#include <string.h>

#include "wb.h"

const char *wb_quote(char *buf, size_t len, const char *s) {
  static const char hex[] = "0123456789abcdef";
  size_t n = 0;
  if (len < 4) { /* no room for even "..." */
    if (len) buf[0] = '\0';
    return buf;
  }
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    char esc[5];
    size_t k = 0;
    if (c == '\n') {
      esc[k++] = '\\', esc[k++] = 'n';
    } else if (c == '\t') {
      esc[k++] = '\\', esc[k++] = 't';
    } else if (c == '\r') {
      esc[k++] = '\\', esc[k++] = 'r';
    } else if (c == '\\' || c == '\'') {
      esc[k++] = '\\', esc[k++] = (char)c;
    } else if (c < 0x20 || c == 0x7f) {
      esc[k++] = '\\', esc[k++] = 'x', esc[k++] = hex[c >> 4], esc[k++] = hex[c & 15];
    } else {
      esc[k++] = (char)c; /* bytes >= 0x80 pass: UTF-8 names stay readable */
    }
    /* Always keep room for "..." and the terminator (so n + 4 <= len
     * holds here), and cut between escapes only. */
    if (n + k + 4 > len) {
      memcpy(buf + n, "...", 4);
      return buf;
    }
    memcpy(buf + n, esc, k);
    n += k;
  }
  buf[n] = '\0';
  return buf;
}
