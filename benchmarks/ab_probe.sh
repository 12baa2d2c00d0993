#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A/B runs of one probe built against two versions of the library: the
# probe's source from the working tree, the library's from commit A and
# commit B (or "tree" for the working tree), each built with gcc -O3.
# ROUNDS rounds; each round runs both sides, A first in odd rounds and B
# first in even ones, so a drift in the machine's load falls on both.
# Prints every run's line, then each side's median of the first figure a
# line prints ("NN.N ns/task" for probe_flood).
#
#   benchmarks/ab_probe.sh A B ROUNDS PROBE [ARGS...]
#   benchmarks/ab_probe.sh 5c91f31^ 5c91f31 40 probe_flood submit 4 1
#
# The figures of the README's "what changed" notes came from such runs (the
# command is next to each). On a shared 2-core machine run it when nothing
# else runs, and read the two medians together with the spread of the lines.
set -euo pipefail
if [ $# -lt 4 ]; then
  sed -n '3,16p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
a=$1 b=$2 rounds=$3 probe=$4
shift 4
root=$(cd "$(dirname "$0")/.." && pwd)
src=$root/benchmarks/probes/$probe.c
[ -f "$src" ] || { echo "ab_probe: no probe $src" >&2; exit 2; }
tmp=$(mktemp -d)
cleanup() {
  for side in a b; do
    [ -d "$tmp/$side" ] && git -C "$root" worktree remove --force "$tmp/$side" 2>/dev/null
  done
  rm -rf "$tmp"
}
trap cleanup EXIT

tree_of() { # $1 = commit or "tree", $2 = a or b: prints the source tree
  if [ "$1" = tree ]; then
    echo "$root"
  else
    git -C "$root" worktree add -q --detach "$tmp/$2" "$1"
    echo "$tmp/$2"
  fi
}
build() { # $1 = library tree, $2 = output
  # Each source as that tree's CMake builds it: with -fexceptions where its
  # CMakeLists says so (worker.c, and in later trees keyed.c, lanes.c,
  # run.c and take.c:
  # pthread_cleanup_push is then a cleanup attribute, not a sigsetjmp per
  # task).
  # src/ is flat in older trees and one folder per layer since 0.3.
  local objs=() f o flags incs=(-I "$1/include" -I "$1/src")
  for f in "$1"/src/*/; do incs+=(-I "$f"); done
  for f in "$1"/src/*.c "$1"/src/*/*.c; do
    [ -e "$f" ] || continue
    o=$2.$(basename "$f" .c).o
    flags=
    if grep -Eq "set_source_files_properties\(.*src/([a-z]+/)?$(basename "$f")[ )].*COMPILE_OPTIONS -fexceptions" "$1/CMakeLists.txt"; then
      flags=-fexceptions
    fi
    gcc -O3 -DNDEBUG $flags "${incs[@]}" -c "$f" -o "$o"
    objs+=("$o")
  done
  gcc -O3 -DNDEBUG -I "$1/include" -I "$root/benchmarks/probes" "${objs[@]}" "$src" \
    -lpthread -lm -o "$2"
}
build "$(tree_of "$a" a)" "$tmp/bin_a"
build "$(tree_of "$b" b)" "$tmp/bin_b"

for ((r = 1; r <= rounds; r++)); do
  order="a b"
  [ $((r % 2)) -eq 0 ] && order="b a"
  for side in $order; do
    label=$a
    [ "$side" = b ] && label=$b
    "$tmp/bin_$side" "$@" | sed "s|^|$side ($label): |" | tee -a "$tmp/out_$side"
  done
done
median() { # the first number after the label of each line
  sed 's/^[^:]*: //' "$1" | grep -o '^[0-9.]*' | sort -n |
    awk '{ v[NR] = $1 } END { if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2), "of", NR }'
}
echo "median A ($a): $(median "$tmp/out_a")"
echo "median B ($b): $(median "$tmp/out_b")"
