#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Where a benchmark's time goes, by perf's sampling: runs COMMAND under
# `perf record`, prints the symbols holding at least 1% of the samples and,
# with --annotate SYMBOL, the hottest instructions of SYMBOL with their share
# of that symbol's samples (for "N% of the submit path is on the tail CAS").
# --annotate may be repeated: an inlined function's samples are its caller's.
# --callers SYMBOL records call graphs (DWARF) and prints the call chains
# that reach SYMBOL, each with its share of all samples (for "60% of the
# sched_yield calls come from ...").
#
#   benchmarks/perf_share.sh [--user] [--comm NAME] [--annotate SYMBOL] [--callers SYMBOL]
#                            -- COMMAND [ARGS...]
#
#   --user        user-side samples only (perf record --all-user)
#   --comm NAME   only the samples of threads named NAME (the main thread of
#                 a bench_* program is named after it; pool workers tko-b0...)
#
# The README's perf figures name the command they came from. Needs perf
# (Debian: linux-perf) and kernel.perf_event_paranoid <= 2.
set -euo pipefail
record=()
report=()
symbols=()
callers=""
while [ $# -gt 0 ]; do
  case $1 in
    --user) record+=(--all-user) ;;
    --comm) report+=(--comms "$2"); shift ;;
    --annotate) symbols+=("$2"); shift ;;
    --callers) callers=$2; record+=(--call-graph dwarf); shift ;;
    --) shift; break ;;
    *) sed -n '3,20p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
  esac
  shift
done
[ $# -gt 0 ] || { echo "perf_share: no command (see --help)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
perf record -q "${record[@]}" -o "$tmp/perf.data" -- "$@" >"$tmp/out" 2>"$tmp/err" || {
  cat "$tmp/err" >&2
  exit 1
}
echo "== symbols with 1% or more of the samples${report:+ (${report[*]})}"
perf report -i "$tmp/perf.data" --stdio --no-children --sort sym --percent-limit 1 \
  "${report[@]}" 2>/dev/null | grep -v '^#' | grep -v '^$'
for symbol in "${symbols[@]}"; do
  echo "== hottest instructions of $symbol (share of its samples)"
  perf annotate -i "$tmp/perf.data" --stdio -s "$symbol" "${report[@]}" 2>/dev/null |
    grep -E '^ +[0-9]+\.[0-9]+ +:' | sort -rn | head -8 || echo "   (no samples)"
done
if [ -n "$callers" ]; then
  echo "== call chains reaching $callers (share of all samples)"
  perf report -i "$tmp/perf.data" --stdio --no-children -S "$callers" -G \
    "${report[@]}" 2>/dev/null | grep -v "^#" | grep -v "^$" | head -60
fi
