#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Tests of the benchmark tools, run by CTest as one entry per group:
#   test_tools.sh SOURCE_DIR compare|svg|run_all|layout [SMOKE_JSON_DIR]
# compare and svg read the JSON kept in benchmarks/results-json/; layout
# reads the JSON the benchmarks' smoke runs just wrote.
set -u
src=$1
group=$2
py=${PYTHON3:-python3}
[ -n "$py" ] || py=python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}
kept=$src/benchmarks/results-json

case $group in
compare)
  # A run against itself: every ratio 1, every range overlapping.
  "$py" "$src/benchmarks/compare" "$kept" "$kept" >"$tmp/same" || fail "compare exited $?"
  n=$(grep -c " 1.000  .* ~$" "$tmp/same")
  [ "$n" -ge 20 ] || fail "only $n figures compared equal"
  grep -q " [<>]$" "$tmp/same" && fail "a run differs from itself: $(grep " [<>]$" "$tmp/same")"
  # The same run with bench_cpu twice as slow: ratios 2, ranges apart.
  mkdir "$tmp/b"
  cp "$kept"/*.json "$tmp/b/"
  "$py" - "$tmp/b/bench_cpu.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for t in d["tables"]:
    for r in t["rows"]:
        for k in ("ns/task", "min", "max"):
            r[k] *= 2
json.dump(d, open(sys.argv[1], "w"))
PY
  "$py" "$src/benchmarks/compare" "$kept" "$tmp/b" >"$tmp/slow" || fail "compare exited $?"
  grep "^cpu: " "$tmp/slow" | grep -v " 2.000 " && fail "bench_cpu rows without ratio 2"
  grep "^cpu: pool inline" "$tmp/slow" | grep -q " >$" || fail "a doubled figure not marked >"
  grep "^concurrent: " "$tmp/slow" | grep -qv " 1.000 " && fail "an unchanged benchmark changed"
  "$py" "$src/benchmarks/compare" "$tmp/nothing" "$kept" 2>"$tmp/err"
  [ $? -eq 2 ] || fail "a missing run is not a usage error"
  ;;
svg)
  "$py" "$src/benchmarks/peers_svg" "$kept/bench_peers.json" "$tmp/p.svg" || fail "peers_svg exited $?"
  "$py" - "$kept/bench_peers.json" "$tmp/p.svg" <<'PY' || fail "peers chart check"
import json, sys, xml.etree.ElementTree as ET
d = json.load(open(sys.argv[1]))
svg = ET.parse(sys.argv[2]).getroot()
ns = "{http://www.w3.org/2000/svg}"
titles = [t.text for t in svg.iter(ns + "title")]
texts = [t.text for t in svg.iter(ns + "text")]
for t in d["tables"]:
    assert t["title"] in texts, t["title"]
    for r in t["rows"]:
        med = [k for k in r if isinstance(r[k], float)][0]
        assert any(x.startswith(r["pool"] + ": ") for x in titles), r["pool"]
bars = [e for e in svg.iter(ns + "rect") if e.find(ns + "title") is not None]
assert len(bars) == sum(len(t["rows"]) for t in d["tables"]), len(bars)
assert all(float(b.get("width")) > 0 for b in bars)
print(len(bars), "bars in", len(d["tables"]), "panels")
PY
  ;;
run_all)
  # By default a run goes to its own folder, never over tracked files.
  dest=$("$src/benchmarks/run_all" --dry-run) || fail "--dry-run exited $?"
  # <UTC date-time>-<commit>, the commit "nogit" outside a git checkout.
  echo "$dest" | grep -Eq "benchmarks/runs/[0-9]{8}-[0-9]{6}-([0-9a-f]{4,}|nogit)/RESULTS.md" ||
    fail "default destination: $dest"
  "$src/benchmarks/run_all" --dry-run --update-tracked | grep -q "benchmarks/RESULTS.md" ||
    fail "--update-tracked does not write the tracked report"
  if git -C "$src" ls-files --error-unmatch benchmarks/RESULTS.md >/dev/null 2>&1; then
    "$src/benchmarks/run_all" "$src/benchmarks/RESULTS.md" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    [ $rc -eq 2 ] && [ "$(wc -l <"$tmp/err")" -eq 1 ] && grep -q "tracked" "$tmp/err" ||
      fail "writing over a tracked report: exit $rc, $(cat "$tmp/err")"
  fi
  ;;
layout)
  # One JSON layout for every benchmark, and no failed check in the smoke runs.
  "$py" - "$3"/*.json <<'PY' || fail "JSON layout"
import json, os, sys
keys = None
for p in sys.argv[1:]:
    d = json.load(open(p))
    k = sorted(d)
    assert keys is None or k == keys, (p, k, keys)
    keys = k
    assert d["benchmark"] + ".json" == os.path.basename(p), p
    assert d["checks_failed"] == [], (p, d["checks_failed"])
    assert d["checks_passed"] > 0, (p, "no check at all")
    for t in d["tables"]:
        assert t["rows"], (p, t["id"])
print(len(sys.argv) - 1, "benchmarks, one layout:", keys)
PY
  ;;
*)
  echo "unknown group '$group'"
  exit 2
  ;;
esac
if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed in group $group"
  exit 1
fi
echo "group $group: all checks passed"
