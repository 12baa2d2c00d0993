#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# bench_peers' taskorch rows at several commits, run in turn: each version's
# bench_peers is built with CMake (Release, as the README's benchmarks are),
# then every round runs each once, rotating who goes first, so that a drift
# in the machine's load falls on all of them. Prints, per version and
# workload, the sorted per-run figures (each itself bench_peers' median of
# --runs) and their median.
#
#   benchmarks/ab_peers.sh ROUNDS COMMIT... [-- BENCH_PEERS_ARGS...]
#   benchmarks/ab_peers.sh 16 c036209 HEAD tree
#
# "tree" is the working tree. The default workloads are the empty-task rows
# (1 producer) and the concurrent rows (4 producers): issue 14's "no
# slowdown of plain tko_submit" check. On this 2-core VM a run lands now and
# then in a slow mode (2-3x, scheduling); read the medians and the sorted
# figures together.
set -euo pipefail
if [ $# -lt 2 ]; then
  sed -n '3,17p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
rounds=$1
shift
versions=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do
  versions+=("$1")
  shift
done
[ "${1:-}" = -- ] && shift
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--pools taskorch --workloads empty,concurrent)
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
cleanup() {
  for d in "$tmp"/src_*; do
    [ -d "$d" ] && git -C "$root" worktree remove --force "$d" 2>/dev/null
  done
  rm -rf "$tmp"
}
trap cleanup EXIT

bins=()
for i in "${!versions[@]}"; do
  v=${versions[$i]}
  if [ "$v" = tree ]; then
    src=$root
  else
    src=$tmp/src_$i
    git -C "$root" worktree add -q --detach "$src" "$v"
  fi
  cmake -S "$src" -B "$tmp/build_$i" -DCMAKE_BUILD_TYPE=Release -DTKO_BUILD_TESTS=OFF \
    -DTKO_BUILD_WORKBENCH=OFF >/dev/null
  # The target's name before 0.2 was bench_peers.
  cmake --build "$tmp/build_$i" -j2 --target tko_bench_peers >/dev/null 2>&1 ||
    cmake --build "$tmp/build_$i" -j2 --target bench_peers >/dev/null
  bins+=("$tmp/build_$i/benchmarks/bench_peers")
done

k=${#versions[@]}
for ((r = 0; r < rounds; r++)); do
  for ((j = 0; j < k; j++)); do
    i=$(((j + r) % k))
    # The taskorch rows' ns/task, one line per run: the workloads in order.
    "${bins[$i]}" "${args[@]}" 2>/dev/null | awk -F'|' '/^\| taskorch/ {gsub(/ /, "", $5); printf "%s ", $5} END {print ""}' >>"$tmp/res_$i"
  done
done

for i in "${!versions[@]}"; do
  cols=$(awk '{print NF; exit}' "$tmp/res_$i")
  for ((c = 1; c <= cols; c++)); do
    sorted=$(awk -v c=$c '{print $c}' "$tmp/res_$i" | sort -n)
    med=$(echo "$sorted" | awk '{a[NR] = $1} END {print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2)}')
    printf '%-10s row %d: median %6s ns/task of %d | %s\n' "${versions[$i]}" $c "$med" "$rounds" \
      "$(echo "$sorted" | tr '\n' ' ')"
  done
done
