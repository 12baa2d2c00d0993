#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The bottleneck model of benchmarks/MODEL.md: a pool's throughput is at
# most the least of what its producers, its workers and its most demanded
# shared cache line can each sustain:
#   X = min(P / c_p, W / c_w, 1 / (d x t))
# c_p, c_w: a producer's and a worker's own cost per task (ns), measured
# pinned; d: the worst line's demand or the worst lock's serialised fetches
# per task, whichever is larger (audit_sharing); t: the line's transfer
# time (ns; probe_pingpong). d and t may be read from the
# programs' output:
#   benchmarks/model.sh --producers 8 --workers 8 --producer-ns 40 --worker-ns 25 \
#     --audit audit.txt --probe cas8.txt
#   benchmarks/model.sh --producers 8 --workers 8 --producer-ns 40 --worker-ns 25 \
#     --demand 1.0 --transfer-ns 190
# --probe takes the median of the "N ns per ..." figures in the file.
set -euo pipefail
usage() {
  sed -n '3,16p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}
P="" W="" cp="" cw="" d="" t=""
while [ $# -gt 0 ]; do
  case "$1" in
  --producers) P=$2 ;;
  --workers) W=$2 ;;
  --producer-ns) cp=$2 ;;
  --worker-ns) cw=$2 ;;
  --demand) d=$2 ;;
  --transfer-ns) t=$2 ;;
  --audit)
    # The larger of the worst line's demand and the worst lock's serialised
    # fetches: each is a resource served one transfer at a time.
    d=$(awk '/^  worst line.s demand per task/ { d = $6 }
             /^  serialised fetches per task/ { if ($5 > d) d = $5 }
             END { if (d != "") print d }' "$2")
    [ -n "$d" ] || { echo "model.sh: no demand line in $2" >&2; exit 2; } ;;
  --probe)
    t=$(grep -o '[0-9.]* ns per' "$2" | awk '{ print $1 }' | sort -g |
      awk '{ v[NR] = $1 }
        END { if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }')
    [ -n "$t" ] || { echo "model.sh: no 'ns per' figures in $2" >&2; exit 2; } ;;
  *) usage ;;
  esac
  shift 2
done
for v in "$P" "$W" "$cp" "$cw" "$d" "$t"; do [ -n "$v" ] || usage; done
awk -v P="$P" -v W="$W" -v cp="$cp" -v cw="$cw" -v d="$d" -v t="$t" 'BEGIN {
  xp = P / cp * 1000; xw = W / cw * 1000; xl = d > 0 ? 1000 / (d * t) : 1e300
  printf "producers:   %d / %.1f ns           = %8.2f M tasks/s\n", P, cp, xp
  printf "workers:     %d / %.1f ns           = %8.2f M tasks/s\n", W, cw, xw
  if (d > 0) printf "serial:      1 / (%.4f x %.1f ns) = %8.2f M tasks/s\n", d, t, xl
  else printf "serial:      demand 0: no bound\n"
  x = xp; b = "the producers"
  if (xw < x) { x = xw; b = "the workers" }
  if (xl < x) { x = xl; b = "the serial line (or lock)" }
  printf "predicted:   %.2f M tasks/s (%.1f ns/task), bound by %s\n", x, 1000 / x, b
}'
