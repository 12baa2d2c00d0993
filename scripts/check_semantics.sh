#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# CTest semantics_doc: the contract stays in two levels. Each cell of
# README.md's Semantics table states a guarantee short enough to rely on
# (at most 45 words; the fine print belongs in docs/SEMANTICS.md), and every
# test docs/SEMANTICS.md names as `tests/<dir>/test_x.c: suite/name` exists,
# so a renamed or deleted test cannot leave a clause claiming a check.
# Usage: scripts/check_semantics.sh [SOURCE_DIR, default: this tree]
set -euo pipefail
cd "${1:-$(dirname "$0")/..}"
max_words=45
status=0

# The table rows of the Semantics section, split on the cell bars; the
# separator row (|---|) is skipped. Prints the longest cell's count.
awk -v max="$max_words" '
  /^## / { in_sem = ($0 == "## Semantics"); next }
  !in_sem || !/^\|/ || /^\|---/ { next }
  {
    n = split($0, cell, "|")
    for (i = 2; i < n; i++) {
      words = split(cell[i], w, /[ \t]+/)
      for (j = 1; j <= words; j++) if (w[j] == "") words--
      if (words > longest) longest = words
      if (words > max) {
        printf "README.md:%d: a Semantics cell has %d words (at most %d): %.60s...\n",
               NR, words, max, cell[i] > "/dev/stderr"
        bad = 1
      }
    }
    rows++
  }
  END {
    if (rows == 0) { print "README.md: no Semantics table found" > "/dev/stderr"; exit 1 }
    printf "semantics_doc: %d README rows, longest cell %d words\n", rows, longest
    exit bad
  }' README.md || status=1

[ -f docs/SEMANTICS.md ] || { echo "docs/SEMANTICS.md: missing" >&2; exit 1; }
refs=$(grep -oE 'tests/[a-z]+/test_[a-z0-9_]+\.c: [a-z0-9_]+/[a-z0-9_]+' docs/SEMANTICS.md |
       sort -u || true)
[ -n "$refs" ] || { echo "docs/SEMANTICS.md: names no test" >&2; exit 1; }
count=0
while IFS= read -r ref; do
  file=${ref%%: *}
  test=${ref#*: }
  suite=${test%%/*}
  name=${test#*/}
  count=$((count + 1))
  if [ ! -f "$file" ]; then
    echo "docs/SEMANTICS.md: $ref: no such file" >&2
    status=1
  elif ! grep -qE "^(Test|ParameterizedTest)\($suite, *$name *[,)]" "$file"; then
    echo "docs/SEMANTICS.md: $ref: no Test($suite, $name in $file" >&2
    status=1
  fi
done <<<"$refs"
echo "semantics_doc: $count tests named in docs/SEMANTICS.md"
exit $status
