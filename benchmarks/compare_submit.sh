#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Builds benchmarks/compare_submit.c (gcc -O3) against the library at
# commit OLD and at the working tree, then runs them alternately, ROUNDS
# times, with one weight and with four:
#   benchmarks/compare_submit.sh c1d04da [ROUNDS] [PATCH]
# PATCH, if given, is applied to OLD first: to ask what the features since
# OLD cost with a hot-path change carried back to it, e.g.
#   benchmarks/compare_submit.sh c1d04da 4 benchmarks/compare_submit-c1d04da-hotpath.patch
set -euo pipefail
old=${1:?usage: compare_submit.sh OLD_COMMIT [ROUNDS] [PATCH]}
rounds=${2:-3}
patch_file=${3:-}
[[ -z $patch_file ]] || patch_file=$(realpath "$patch_file")
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
git -C "$root" worktree add -q --detach "$tmp/old" "$old"
trap 'git -C "$root" worktree remove --force "$tmp/old"; rm -rf "$tmp"' EXIT
label=$old
if [[ -n $patch_file ]]; then
  patch -s -d "$tmp/old" -p1 <"$patch_file"
  label="$old + $(basename "$patch_file")"
fi
build() { # $1 = source tree, $2 = output (src/ flat in older trees, in layer folders since 0.3)
  local srcs=() incs=(-I "$1/include") d
  for d in "$1"/src/*/; do incs+=(-I "$d"); done
  for d in "$1"/src/*.c "$1"/src/*/*.c; do [ -e "$d" ] && srcs+=("$d"); done
  gcc -O3 -DNDEBUG "${incs[@]}" "${srcs[@]}" "$root/benchmarks/compare_submit.c" \
    -lpthread -o "$2"
}
build "$tmp/old" "$tmp/old_bin"
build "$root" "$tmp/new_bin"
for ((i = 0; i < rounds; i++)); do
  echo "old ($label): $("$tmp/old_bin" 0) | $("$tmp/old_bin" 1)"
  echo "new (tree): $("$tmp/new_bin" 0) | $("$tmp/new_bin" 1)"
done
