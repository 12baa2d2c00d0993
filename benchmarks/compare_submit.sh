#!/usr/bin/env bash
# Builds benchmarks/compare_submit.c (gcc -O3) against the library at
# commit OLD and at the working tree, then runs them alternately, ROUNDS
# times, with one weight and with four:
#   benchmarks/compare_submit.sh c1d04da [ROUNDS]
set -euo pipefail
old=${1:?usage: compare_submit.sh OLD_COMMIT [ROUNDS]}
rounds=${2:-3}
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
git -C "$root" worktree add -q --detach "$tmp/old" "$old"
trap 'git -C "$root" worktree remove --force "$tmp/old"; rm -rf "$tmp"' EXIT
build() { # $1 = source tree, $2 = output
  gcc -O3 -DNDEBUG -I "$1/include" "$1"/src/*.c "$root/benchmarks/compare_submit.c" \
    -lpthread -o "$2"
}
build "$tmp/old" "$tmp/old_bin"
build "$root" "$tmp/new_bin"
for ((i = 0; i < rounds; i++)); do
  echo "old ($old): $("$tmp/old_bin" 0) | $("$tmp/old_bin" 1)"
  echo "new (tree): $("$tmp/new_bin" 0) | $("$tmp/new_bin" 1)"
done
