#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Tests of the taskorch-workbench CLI, run by CTest as one entry per group:
#   test_workbench.sh BINARY args|json|csv|svg|seed|progress|features|outputs
# Every run is tiny (a few hundred short tasks) so that the TSan and ASan
# builds get through it quickly too.
set -u
bin=$1
group=$2
py=${PYTHON3:-python3}
[ -n "$py" ] || py=python3
xmllint=${XMLLINT:-xmllint}
[ -n "$xmllint" ] || xmllint=xmllint
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0

fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

# expect_usage_error ARGS...: exit 2, exactly one line on stderr, nothing on stdout.
expect_usage_error() {
  "$bin" "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$? lines
  lines=$(wc -l <"$tmp/err")
  if [ "$rc" -ne 2 ]; then
    fail "'$*': exit $rc, expected 2"
  elif [ "$lines" -ne 1 ] || ! grep -q "taskorch-workbench: " "$tmp/err"; then
    fail "'$*': expected one error line, got $lines:"; cat "$tmp/err"
  elif [ -s "$tmp/out" ]; then
    fail "'$*': wrote to stdout on a usage error"
  else
    echo "ok: '$*' -> $(cat "$tmp/err")"
  fi
}

# watchdog TARGET: kills TARGET (a pid, or -pgid) after 120 s; stop it with
# `kill -KILL $dog`. It is a shell of its own whose output goes nowhere (its
# sleep, left to run out, must not hold CTest's pipe), and it is stopped
# with SIGKILL: a forked child of this script that any other signal reached
# before its exec would run this script's EXIT trap and remove $tmp under
# the tests still running.
watchdog() {
  sh -c 'sleep 120; kill -KILL -- "$1" 2>/dev/null' watchdog "$1" >/dev/null 2>&1 &
  dog=$!
}

expect_ok() {
  "$bin" "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [ "$rc" -ne 0 ]; then
    fail "'$*': exit $rc"; cat "$tmp/err"
    return 1
  fi
  return 0
}

# Small loads that finish in well under a second, sanitizers included.
small="--tasks 200 --task-us 20 --io-ms 1 --tail-ms 0 --quiet"

case $group in
args)
  expect_usage_error
  expect_usage_error frob
  expect_usage_error list extra
  expect_usage_error run
  expect_usage_error run --quiet
  expect_usage_error run --scenario nope
  expect_usage_error run --scenario
  expect_usage_error run --scenario demo --frob
  expect_usage_error run --scenario demo -x
  expect_usage_error run --scenario demo extra
  expect_usage_error run --scenario demo --tasks abc
  expect_usage_error run --scenario demo --tasks 12x
  expect_usage_error run --scenario demo --tasks -5
  expect_usage_error run --scenario demo --tasks 0
  expect_usage_error run --scenario demo --tasks 99999999999999999999999
  expect_usage_error run --scenario demo --tasks
  expect_usage_error run --scenario demo --tasks --quiet
  expect_usage_error run --scenario demo --workers -1
  expect_usage_error run --scenario demo --producers 0
  expect_usage_error run --scenario demo --io-pct 150
  expect_usage_error run --scenario demo --io-pct x
  expect_usage_error run --scenario demo --fail-pct -1
  expect_usage_error run --scenario demo --seed x
  # Percentages are decimal: no hex, exponent or sign.
  for v in 0x10 1e1 -0 . 1.2.3; do expect_usage_error run --scenario demo --io-pct "$v"; done
  expect_usage_error run --scenario demo --seed 0x
  expect_usage_error run --scenario demo --quiet=yes
  expect_usage_error run --scenario demo --pool fancy
  expect_usage_error run --scenario cpu --workers 0
  expect_usage_error run --scenario demo --pool basic --workers 0
  expect_usage_error run --scenario cpu --max-elastic 3
  expect_usage_error run --scenario cpu --idle-ms 100
  expect_usage_error run --scenario demo --pool elastic --workers 0 --max-elastic 0
  expect_usage_error run --scenario demo --workers 5000
  expect_usage_error run --scenario demo --weights 5:1
  expect_usage_error run --scenario demo --weights=-1:-3
  expect_usage_error run --scenario demo --weights 1:x
  expect_usage_error run --scenario demo --weights 1:2:3
  expect_usage_error run --scenario demo --weights 1:99999999999
  expect_usage_error run --scenario demo --tasks 10 --bursts 11
  expect_usage_error run --scenario demo --json "$tmp/no/such/dir/out.json"
  # Help and version take nothing after them.
  expect_usage_error --help extra
  expect_usage_error -h extra
  expect_usage_error help extra
  expect_usage_error --version extra
  expect_usage_error -V extra
  expect_usage_error run --help extra
  expect_usage_error run --scenario demo --help --tasks 5
  # An empty thread name is refused (the library would name threads "-b0").
  expect_usage_error run --scenario demo --thread-name ""
  expect_usage_error run --scenario demo --thread-name=
  # Raw values are echoed escaped: a newline in one still gives one line
  # (issue 17, defect 10); expect_usage_error counts the lines.
  nl=$(printf 'a\nb')
  expect_usage_error "x${nl}"
  expect_usage_error list "$nl"
  expect_usage_error run "$nl"
  expect_usage_error run "-$nl"
  expect_usage_error run --scenario demo "--x${nl}=1"
  expect_usage_error run --scenario "$nl"
  expect_usage_error run --scenario demo --tasks "1$nl"
  expect_usage_error run --scenario demo --io-pct "1$nl"
  expect_usage_error run --scenario demo --weights "1:$nl"
  expect_usage_error run --scenario demo --pool "$nl"
  expect_usage_error run --scenario demo --json "$tmp/no/$nl/out.json"
  expect_usage_error run --scenario "$(printf 'a\033[2Jb\\c')"
  grep -qF "'a\\x1b[2Jb\\\\c'" "$tmp/err" || fail "control bytes not escaped: $(cat "$tmp/err")"
  expect_usage_error run --scenario "$(head -c 300 /dev/zero | tr '\0' x)"
  grep -q "x\.\.\.'" "$tmp/err" || fail "a long value is not cut: $(cat "$tmp/err")"
  # Nothing is started or written on bad input.
  expect_usage_error run --scenario demo --json "$tmp/never.json" --tasks abc
  [ -e "$tmp/never.json" ] && fail "a usage error created the --json file"
  # Help and list succeed and say what they should.
  expect_ok --help && grep -q "usage: taskorch-workbench run" "$tmp/out" ||
    fail "--help shows no usage"
  expect_ok run --help && grep -q -- "--weights LO:HI" "$tmp/out" ||
    fail "run --help shows no options"
  expect_ok --version && grep -q "^taskorch-workbench [0-9]" "$tmp/out" || fail "--version"
  expect_ok -V && grep -q "^taskorch-workbench [0-9]" "$tmp/out" || fail "-V"
  if expect_ok list; then
    for s in demo cpu io mixed concurrent stress burst; do
      grep -q "^$s\$" "$tmp/out" || fail "list does not describe scenario $s"
    done
  fi
  # Forms that must be accepted: --name=VALUE, negative weights, hex seeds.
  expect_ok run --scenario cpu $small --weights=-3:-1 --seed 0x2a --workers=2 &&
    grep -q "weights -3..-1\|weight -1" "$tmp/out" || fail "--weights=-3:-1 not applied"
  expect_ok run --scenario cpu $small --workers 2 --thread-name pool || fail "--thread-name pool"
  # A seed with a leading zero is decimal, not octal: 010 is 10.
  expect_ok run --scenario cpu $small --workers 2 --seed 010 --json "$tmp/seed.json" &&
    grep -q '"seed": 10,' "$tmp/seed.json" || fail "--seed 010 is not 10: $(grep -o '"seed": [0-9]*' "$tmp/seed.json")"
  ;;
json)
  if expect_ok run --scenario mixed $small --json "$tmp/out.json"; then
    grep -q "^queue wait" "$tmp/out" || fail "no summary table on stdout"
    grep -q "^allocations" "$tmp/out" || fail "no allocations line"
    [ -s "$tmp/err" ] && fail "stderr is not a terminal, yet something was drawn: $(cat "$tmp/err")"
    "$py" - "$tmp/out.json" <<'PY' || fail "JSON check"
import json, sys
d = json.load(open(sys.argv[1]))
def need(obj, keys, where):
    for k in keys:
        assert k in obj, f"{where}: missing {k}"
need(d, ["version", "scenario", "seed", "mix_checksum", "config", "wall_s", "active_s",
         "throughput_per_s", "tasks", "wait_ns", "run_ns", "weight_classes", "elastic",
         "allocations", "timeline"], "top level")
need(d["config"], ["pool", "workers", "max_elastic", "idle_ms", "tasks", "producers",
                   "weight_lo", "weight_hi", "task_us", "io_ms", "io_pct", "fail_pct",
                   "bursts", "gap_ms", "tail_ms"], "config")
need(d["tasks"], ["submitted", "completed", "failed", "cancelled", "submit_errors"], "tasks")
need(d["elastic"], ["peak", "spawned", "retired", "tasks_run"], "elastic")
need(d["allocations"], ["source", "total", "per_task"], "allocations")
need(d["timeline"], ["samples", "period_ms"], "timeline")
assert d["scenario"] == "mixed" and d["config"]["pool"] == "elastic"
assert d["config"]["tasks"] == 200 and d["tasks"]["completed"] == 200, d["tasks"]
assert d["tasks"]["submitted"] == 200 and d["tasks"]["submit_errors"] == 0
assert 0 <= d["tasks"]["failed"] <= 200
assert d["mix_checksum"].startswith("0x") and len(d["mix_checksum"]) == 18
assert d["wall_s"] > 0 and d["throughput_per_s"] > 0
for dist in [d["wait_ns"], d["run_ns"]] + [c["wait_ns"] for c in d["weight_classes"]]:
    need(dist, ["count", "mean", "p50", "p90", "p99", "max"], "distribution")
    assert dist["p50"] <= dist["p90"] <= dist["p99"] <= dist["max"], dist
assert d["wait_ns"]["count"] == 200
classes = d["weight_classes"]
assert len(classes) == 8, classes                       # weights 0..7: one class each
assert [c["lo"] for c in classes] == list(range(7, -1, -1))
assert sum(c["wait_ns"]["count"] for c in classes) == 200
assert d["elastic"]["peak"] <= d["config"]["max_elastic"]
if d["allocations"]["source"] == "none":
    assert d["allocations"]["total"] is None and d["allocations"]["per_task"] is None
else:
    assert d["allocations"]["total"] >= 0
assert d["timeline"]["samples"] >= 1
# The period starts at 1 ms and doubles only when 2048 samples are kept.
assert d["timeline"]["period_ms"] == 1 or d["timeline"]["samples"] >= 1024, d["timeline"]
PY
  fi
  # A basic pool: no elastic workers, and a wide weight range in 8 classes.
  if expect_ok run --scenario cpu $small --workers 2 --weights -1000:1000 --json "$tmp/b.json"; then
    "$py" - "$tmp/b.json" <<'PY' || fail "JSON check (basic pool)"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["config"]["pool"] == "basic" and d["config"]["max_elastic"] == 0
assert d["elastic"]["spawned"] == 0
c = d["weight_classes"]
assert len(c) == 8 and c[0]["hi"] == 1000 and c[-1]["lo"] == -1000, c
assert all(c[i]["lo"] == c[i + 1]["hi"] + 1 for i in range(7)), c
PY
  fi
  ;;
csv)
  if expect_ok run --scenario burst --tasks 100 --task-us 20 --io-ms 2 --gap-ms 40 \
      --idle-ms 20 --quiet --timeline "$tmp/t.csv"; then
    "$py" - "$tmp/t.csv" <<'PY' || fail "CSV check"
import sys
lines = open(sys.argv[1]).read().splitlines()
header = "t_ms,submitted,completed,queued,running,basic_workers,elastic_workers"
assert lines[0] == header, lines[0]
rows = [l.split(",") for l in lines[1:]]
assert len(rows) >= 5, f"only {len(rows)} samples"
assert all(len(r) == 7 for r in rows)
t = [float(r[0]) for r in rows]
assert all(b > a for a, b in zip(t, t[1:])), "timestamps not increasing"
assert t[0] >= 0
for r in rows:
    assert all(x.isdigit() for x in r[1:]), r
    assert int(r[5]) == 2          # the burst scenario's two basic workers
done = [int(r[2]) for r in rows]
assert all(b >= a for a, b in zip(done, done[1:]))
assert done[-1] == 100, done[-1]
PY
  fi
  ;;
svg)
  if expect_ok run --scenario demo --tasks 80 --bursts 2 --gap-ms 30 --idle-ms 20 \
      --task-us 50 --io-ms 1 --tail-ms 40 --quiet --plot "$tmp/p.svg"; then
    "$xmllint" --noout "$tmp/p.svg" || fail "SVG is not well-formed XML"
    for want in "<svg xmlns=\"http://www.w3.org/2000/svg\"" "queued tasks" "running tasks" \
        "basic workers" "elastic workers" "time since start (s)" "Queue wait by weight" \
        "weight 3" "p99"; do
      grep -q "$want" "$tmp/p.svg" || fail "SVG lacks '$want'"
    done
    grep -q "<script\|href=" "$tmp/p.svg" && fail "SVG is not self-contained"
  fi
  # With nine bar groups (all + 8 classes) and long class names, no two
  # labels of the latency panel overlap (widths estimated at 0.6 em a
  # character, as plot.c lays them out; rotated axis titles left out).
  for w in -5:5 -1000:1000 -2147483648:2147483647 0:7; do
    expect_ok run --scenario cpu $small --workers 2 --weights "$w" --plot "$tmp/w.svg" || continue
    "$py" - "$tmp/w.svg" "$w" <<'PY' || fail "SVG labels overlap with --weights $w"
import sys, xml.etree.ElementTree as ET
ns = "{http://www.w3.org/2000/svg}"
root = ET.parse(sys.argv[1]).getroot()
boxes = []
def box(x, y, fs, text, anchor):
    w = 0.6 * fs * len(text)
    x0 = x - w / 2 if anchor == "middle" else x - w if anchor == "end" else x
    return (x0, y - 0.8 * fs, x0 + w, y + 0.2 * fs, text)
for t in root.iter(ns + "text"):
    if t.get("transform"):
        continue
    x, y = float(t.get("x")), float(t.get("y"))
    if y < 430:                      # the latency panel and its legend only
        continue
    fs = float(t.get("font-size", root.get("font-size", "12")))
    anchor = t.get("text-anchor", "start")
    if t.text:
        boxes.append(box(x, y, fs, t.text, anchor))
    for s in t.iter(ns + "tspan"):
        x, y = float(s.get("x", x)), y + float(s.get("dy", "0"))
        boxes.append(box(x, y, fs, s.text, anchor))
bad = [(a[4], b[4]) for i, a in enumerate(boxes) for b in boxes[i + 1:]
       if a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]]
assert not bad, bad[:5]
print(sys.argv[2], ":", len(boxes), "labels, none overlapping")
PY
  done
  ;;
seed)
  for n in 1 2 3; do
    seed=7
    extra=""
    [ $n = 2 ] && extra="--producers 2"
    [ $n = 3 ] && seed=8
    expect_ok run --scenario mixed $small --seed $seed $extra --json "$tmp/s$n.json" || continue
  done
  "$py" - "$tmp/s1.json" "$tmp/s2.json" "$tmp/s3.json" <<'PY' || fail "seed check"
import json, sys
a, b, c = (json.load(open(p)) for p in sys.argv[1:])
assert a["mix_checksum"] == b["mix_checksum"], "same seed, different mix"
assert a["mix_checksum"] != c["mix_checksum"], "different seed, same mix"
# The same mix also means the same weight spread.
assert [k["wait_ns"]["count"] for k in a["weight_classes"]] == \
       [k["wait_ns"]["count"] for k in b["weight_classes"]]
print("seed 7:", a["mix_checksum"], " seed 8:", c["mix_checksum"])
PY
  # The summary table prints the checksum too.
  expect_ok run --scenario cpu $small --seed 7 && grep -q "task mix checksum: 0x" "$tmp/out" ||
    fail "no checksum in the summary"
  ;;
progress)
  # With a terminal on stderr the line is drawn and then erased. `script`
  # supplies the terminal; without it this check is skipped.
  if ! command -v script >/dev/null 2>&1; then
    echo "skipped: no script(1)"
    exit 0
  fi
  # Only stderr goes to the terminal; script(1) copies what it shows to $tmp/tty.
  script -qec "'$bin' run --scenario io --tasks 60 --io-ms 5 --max-elastic 2 --tail-ms 0 >'$tmp/out'" \
    /dev/null >"$tmp/tty" </dev/null
  grep -qE '\] +[0-9]+% [0-9.]+k?/' "$tmp/tty" || fail "no progress line on a terminal"
  grep -q "queue wait" "$tmp/out" || fail "no summary under script(1)"
  "$py" - "$tmp/tty" <<'PY' || fail "progress line not erased at the end"
import sys
tty = open(sys.argv[1], "rb").read()
assert tty.endswith(b"\r\x1b[K"), tty[-40:]
assert b"\n" not in tty, "the progress line must stay on one line"
PY
  # Every redraw fits the width, less its last column, and at 80 columns
  # keeps its bar; narrower, it degrades (script(1)'s terminal has no size,
  # so COLUMNS sets it). 2,000 tasks of 1 ms on two workers give a second
  # of redraws whose figures have grown past their first widths.
  for cols in 80 40 12; do
    COLUMNS=$cols script -qec "'$bin' run --scenario io --tasks 2000 --io-ms 1 --workers 2 \
      --max-elastic 0 --pool basic --tail-ms 0 >'$tmp/out'" /dev/null >"$tmp/tty" </dev/null
    "$py" - "$tmp/tty" "$cols" <<'PY' || fail "progress line at $cols columns"
import re, sys
tty = open(sys.argv[1], "rb").read().decode()
cols = int(sys.argv[2])
draws = [d for d in re.sub(r"\x1b\[K", "", tty).split("\r") if d]
assert len(draws) >= 2, f"{len(draws)} draws"
for d in draws:
    assert len(d) <= cols - 1, (cols, len(d), d)
    assert "%" in d, d
    if cols >= 80:
        assert d.startswith("[") and "]" in d, d
print(cols, "columns:", len(draws), "draws, widest", max(map(len, draws)))
PY
  done
  script -qec "'$bin' run --scenario io --tasks 60 --io-ms 5 --max-elastic 2 --tail-ms 0 --quiet >'$tmp/out'" \
    /dev/null >"$tmp/tty" </dev/null
  [ -s "$tmp/tty" ] && fail "progress drawn on a terminal despite --quiet"
  "$bin" run --scenario io --tasks 60 --io-ms 5 --max-elastic 2 --tail-ms 0 2>"$tmp/q" >/dev/null
  [ -s "$tmp/q" ] && fail "progress drawn although stderr is not a terminal"
  ;;
features)
  # One quick run per pool-feature option (alone and in a few mixes): each
  # must exit 0 and complete every task, and the JSON must echo the option.
  expect_usage_error run --scenario mixed --groups 2 --batch 2
  expect_usage_error run --scenario mixed --batch 2 --delay-ms 1
  expect_usage_error run --scenario mixed --full block
  expect_usage_error run --scenario mixed --capacity 2 --full sideways
  expect_usage_error run --scenario mixed --capacity 0
  expect_usage_error run --scenario mixed --capacity 2 --batch 4
  expect_usage_error run --scenario mixed --capacity 2 --full reject --delay-ms 1
  expect_usage_error run --scenario mixed --async --delay-ms 1
  expect_usage_error run --scenario mixed --max-async 2
  expect_usage_error run --scenario mixed --aging-ms 0
  expect_usage_error run --scenario mixed --blocking-hint=yes
  expect_usage_error run --scenario mixed --resize 3
  expect_usage_error run --scenario mixed --resize 0:0
  expect_usage_error run --scenario mixed --resize 1:2000
  expect_usage_error run --scenario cpu --resize 1:2
  expect_usage_error run --scenario mixed --handles 0
  expect_usage_error run --scenario mixed --handles many
  expect_usage_error run --scenario mixed --handles 4 --groups 2
  expect_usage_error run --scenario mixed --handles 4 --async
  expect_usage_error run --scenario mixed --cancel-pct 10
  expect_usage_error run --scenario mixed --handles 4 --cancel-pct 101
  # Handles: every task waited on; a cancel that won ends its task as
  # -ECANCELED (counted by the pool too), and no status contradicts it.
  for opts in "--handles 8" "--handles 16 --cancel-pct 40 --producers 2" \
      "--handles 5 --cancel-pct 100 --capacity 4 --full reject"; do
    # shellcheck disable=SC2086 # opts is a list of words
    expect_ok run --scenario mixed --tasks 120 --task-us 20 --io-ms 1 --tail-ms 0 --quiet \
      $opts --json "$tmp/h.json" || continue
    grep -q "^handles  *120 waited" "$tmp/out" || fail "'$opts': no handles line: $(cat "$tmp/out")"
    "$py" - "$tmp/h.json" "$opts" <<'PY' || fail "JSON check for '$opts'"
import json, sys
d = json.load(open(sys.argv[1]))
opts = sys.argv[2].split()
h, t, c = d["handles"], d["tasks"], d["config"]
assert c["handles"] == int(opts[opts.index("--handles") + 1]), c
pct = float(opts[opts.index("--cancel-pct") + 1]) if "--cancel-pct" in opts else 0
assert c["cancel_pct"] == pct, c
assert h["waited"] == 120 and h["broken"] == 0, h
assert h["cancelled"] == h["cancels_won"] == t["cancelled"], (h, t)
assert t["completed"] + t["cancelled"] == 120 and t["submit_errors"] == 0, t
if pct == 0: assert h["cancels_won"] == h["cancels_late"] == 0, h
if pct == 100: assert h["cancels_won"] + h["cancels_late"] == 120, h
assert d["wait_ns"]["count"] == t["completed"], d["wait_ns"]
PY
  done
  n=0
  for opts in "--groups 7" "--batch 16" "--capacity 8 --full block" "--capacity 8 --full reject" \
      "--capacity 8 --full caller" "--capacity 8" "--aging-ms 1" "--blocking-hint" \
      "--delay-ms 2" "--async" "--async --max-async 2" \
      "--groups 5 --async --capacity 4 --full reject" "--batch 4 --async --capacity 4" \
      "--delay-ms 1 --capacity 4 --full caller" "--blocking-hint --aging-ms 2 --producers 2" \
      "--resize 3:1" "--resize 0:3 --bursts 2 --producers 2" "--resize 1:0 --batch 8"; do
    n=$((n + 1))
    # shellcheck disable=SC2086 # opts is a list of words
    expect_ok run --scenario mixed --tasks 120 --task-us 20 --io-ms 1 --tail-ms 0 --quiet \
      $opts --json "$tmp/f$n.json" || continue
    "$py" - "$tmp/f$n.json" "$opts" <<'PY' || fail "JSON check for '$opts'"
import json, sys
d = json.load(open(sys.argv[1]))
opts = sys.argv[2].split()
t, c = d["tasks"], d["config"]
assert t["completed"] == c["tasks"] == 120, t
assert t["submitted"] == 120 and t["submit_errors"] == 0 and t["cancelled"] == 0, t
assert d["handles"] is None, d["handles"]
for k in ["groups", "batch", "capacity", "full", "aging_ms", "blocking_hint", "delay_ms",
          "async", "max_async"]:
    assert k in c, "config lacks " + k
for k in ["rejected", "caller_runs", "groups"]:
    assert k in t, "tasks lacks " + k
def val(name):
    return opts[opts.index(name) + 1]
if "--groups" in opts:
    g = int(val("--groups"))
    assert c["groups"] == g and t["groups"] == (120 + g - 1) // g, (c, t)
if "--batch" in opts: assert c["batch"] == int(val("--batch"))
if "--capacity" in opts:
    assert c["capacity"] == int(val("--capacity"))
    assert c["full"] == (val("--full") if "--full" in opts else "block")
else:
    assert c["capacity"] == 0 and t["rejected"] == 0 and t["caller_runs"] == 0
if "--full" in opts and val("--full") != "reject": assert t["rejected"] == 0, t
if "--full" in opts and val("--full") != "caller": assert t["caller_runs"] == 0, t
if "--aging-ms" in opts: assert c["aging_ms"] == int(val("--aging-ms"))
assert c["blocking_hint"] == ("--blocking-hint" in opts)
if "--delay-ms" in opts: assert c["delay_ms"] == int(val("--delay-ms"))
assert c["async"] == ("--async" in opts)
if "--max-async" in opts: assert c["max_async"] == int(val("--max-async"))
if "--resize" in opts:
    b, e = map(int, val("--resize").split(":"))
    r = d["resize"]
    assert r == dict(r, basic=b, max_elastic=e, done=True, error="OK"), r
else:
    assert d["resize"] is None, d["resize"]
assert d["wait_ns"]["count"] == 120, d["wait_ns"]
PY
    grep -q "^features\|features: " "$tmp/out" || fail "'$opts': the summary does not show the features"
  done
  ;;
outputs)
  # --json - writes the JSON alone on stdout; the summary goes to stderr.
  if expect_ok run --scenario cpu $small --workers 2 --json -; then
    "$py" -c 'import json, sys; d = json.load(open(sys.argv[1])); assert d["tasks"]["completed"] == 200' \
      "$tmp/out" || fail "--json - did not write the JSON alone to stdout"
    grep -q "^queue wait" "$tmp/err" || fail "--json -: no summary on stderr"
    [ -e ./- ] && fail "--json - created a file named '-'"
  fi
  expect_ok run --scenario cpu $small --workers 2 --timeline - &&
    head -1 "$tmp/out" | grep -q "^t_ms," || fail "--timeline - did not write the CSV to stdout"
  # Two outputs into one file are refused before anything runs.
  expect_usage_error run --scenario cpu --json - --plot -
  expect_usage_error run --scenario cpu --json "$tmp/same" --timeline "$tmp/same"
  grep -q "same file" "$tmp/err" || fail "no 'same file' in: $(cat "$tmp/err")"
  # A file that does not exist yet, spelled two ways.
  expect_usage_error run --scenario cpu --json "$tmp/new.json" --plot "$tmp/./new.json"
  expect_usage_error run --scenario cpu --json "$tmp/new.json" --timeline "$tmp//new.json"
  [ -e "$tmp/new.json" ] && fail "a refused run wrote $tmp/new.json"
  touch "$tmp/one"
  ln "$tmp/one" "$tmp/two"
  expect_usage_error run --scenario cpu --plot "$tmp/one" --json "$tmp/two"
  expect_usage_error run --scenario cpu --json "$tmp"
  # A finished run replaces an existing file, with fopen's mode, no
  # temporary file left; a failed one leaves the old file.
  echo old >"$tmp/r.json"
  chmod 600 "$tmp/r.json"
  (umask 022 && expect_ok run --scenario cpu $small --workers 2 --json "$tmp/r.json") &&
    grep -q '"scenario": "cpu"' "$tmp/r.json" || fail "the JSON did not replace the old file"
  [ "$(stat -c %a "$tmp/r.json")" = 644 ] || fail "mode $(stat -c %a "$tmp/r.json"), not 644"
  ls "$tmp"/r.json.* >/dev/null 2>&1 && fail "a temporary file was left: $(ls "$tmp")"
  # Standard output that cannot be written is an error (status 1, one line),
  # for every command; a closed one does not become an output file's.
  for cmd in "run --scenario cpu $small --workers 2" list --help --version; do
    # shellcheck disable=SC2086 # cmd is a list of words
    "$bin" $cmd >/dev/full 2>"$tmp/err"
    rc=$?
    [ $rc = 1 ] && [ "$(wc -l <"$tmp/err")" = 1 ] &&
      grep -q "writing standard output failed" "$tmp/err" ||
      fail "'$cmd' into /dev/full: exit $rc, stderr: $(cat "$tmp/err")"
  done
  "$bin" run --scenario cpu $small --workers 2 --json "$tmp/closed.json" >&- 2>"$tmp/err"
  rc=$?
  [ $rc = 1 ] && grep -q "writing standard output failed" "$tmp/err" ||
    fail "a run with standard output closed: exit $rc, stderr: $(cat "$tmp/err")"
  "$py" -c 'import json, sys; json.load(open(sys.argv[1]))' "$tmp/closed.json" ||
    fail "with standard output closed, the JSON file is not JSON"
  # Ctrl-C: the summary of what ran, status 130, existing outputs intact,
  # no temporary file left. Each case waits (bounded, polling /proc) for a
  # state of the run before the signal: THREADS threads alive means, in the
  # io scenario, its 2 basic workers, 4 elastic ones (so tasks are queued and
  # running), the producer, sampler and Ctrl-C watcher; in the burst
  # scenario with a long lead gap, 6 threads mean the run idles in that gap.
  # The async case keeps at most 4 tasks in flight so that it lasts minutes:
  # unlimited, its 100,000 tasks end in under a second and, on a loaded
  # machine, before the signal (the run then exits 0).
  # Job control gives the background run SIGINT at its default action (a
  # non-interactive shell would have it ignored).
  io="--scenario io --tasks 100000 --io-ms 20 --max-elastic 4 --tail-ms 0"
  for case in "9:$io" "9:$io --groups 50" "9:$io --delay-ms 5" "9:$io --bursts 4 --gap-ms 60000" \
      "6:$io --async --max-async 4" "6:--scenario burst --gap-ms 60000"; do
    threads=${case%%:*}
    opts=${case#*:}
    echo keep >"$tmp/i.json"
    rm -f "$tmp/i.svg"
    set -m
    # shellcheck disable=SC2086 # opts is a list of words
    "$bin" run $opts --quiet --json "$tmp/i.json" --plot "$tmp/i.svg" >"$tmp/out" 2>"$tmp/err" &
    pid=$!
    set +m
    n=0
    until [ "$(ls /proc/$pid/task 2>/dev/null | wc -l)" -ge "$threads" ] || [ $n -ge 3000 ]; do
      sleep 0.01
      n=$((n + 1))
    done
    kill -INT $pid
    wait $pid
    rc=$?
    if [ $rc -ne 130 ]; then
      fail "Ctrl-C ($opts): exit $rc, expected 130"; cat "$tmp/err"
      continue
    fi
    grep -q "^interrupted by Ctrl-C after [0-9]* of [0-9]* tasks" "$tmp/out" &&
      grep -q "^queue wait" "$tmp/out" || fail "Ctrl-C ($opts): no summary of what ran"
    [ "$(cat "$tmp/i.json")" = keep ] || fail "Ctrl-C ($opts): the existing JSON was changed"
    [ -e "$tmp/i.svg" ] && fail "Ctrl-C ($opts): an output file was written"
    ls "$tmp"/i.json.* "$tmp"/i.svg.* >/dev/null 2>&1 && fail "Ctrl-C ($opts): temporary files left"
    if [ "$threads" = 9 ]; then
      grep -q "^interrupted by Ctrl-C after 0 " "$tmp/out" && fail "Ctrl-C ($opts): nothing ran"
      grep -q "^tasks  *0 completed" "$tmp/out" && fail "Ctrl-C ($opts): nothing completed"
    fi
    echo "ok: Ctrl-C ($opts) -> $(grep -o "after [0-9]* of [0-9]* tasks" "$tmp/out"), $(grep "^tasks" "$tmp/out")"
  done
  # Ctrl-C cuts the running tasks short. Their work is 500 to 1,500 s
  # (--io-ms / --task-us 1,000 s), far beyond the 120 s this test gives the
  # run to end after the signal, so exit 130 within that means the tasks
  # were woken, not waited for; the summary counts them as completed. The
  # run waits for its 9 threads (2 basic, 4 elastic workers busy, with
  # 100,000 tasks queued; producer, sampler, watcher) before the signal.
  long="--scenario io --tasks 100000 --max-elastic 4 --tail-ms 0 --quiet"
  # A run signalled before any task started proves nothing: it is rerun,
  # up to 5 times (the async case's thread count does not show a started
  # task, and a slow sanitizer build may start none in time).
  for opts in "$long --io-ms 1000000" "$long --io-pct 0 --task-us 1000000000" \
      "$long --io-ms 1000000 --async --max-async 4" "$long --io-ms 1000000 --groups 50"; do
    threads=9
    case $opts in *--async*) threads=6 ;; esac # async tasks leave the workers free
    for try in 1 2 3 4 5; do
      set -m
      # shellcheck disable=SC2086 # opts is a list of words
      "$bin" run $opts --json "$tmp/l.json" >"$tmp/out" 2>"$tmp/err" &
      pid=$!
      set +m
      n=0
      until [ "$(ls /proc/$pid/task 2>/dev/null | wc -l)" -ge "$threads" ] || [ $n -ge 3000 ]; do
        sleep 0.01
        n=$((n + 1))
      done
      kill -INT $pid
      watchdog $pid # kills the run (exit 137) if it outlives the bound
      wait $pid
      rc=$?
      kill -KILL $dog 2>/dev/null
      wait $dog 2>/dev/null
      [ $rc -eq 130 ] && ! grep -q "^tasks  *[1-9][0-9]* completed" "$tmp/out" || break
    done
    if [ $rc -ne 130 ]; then
      fail "Ctrl-C with long tasks ($opts): exit $rc, expected 130"; cat "$tmp/err"
      continue
    fi
    grep -q "^tasks  *[1-9][0-9]* completed" "$tmp/out" ||
      fail "Ctrl-C with long tasks ($opts): no task had started in 5 tries"
    [ -e "$tmp/l.json" ] && fail "Ctrl-C with long tasks ($opts): the JSON was written"
    echo "ok: Ctrl-C with long tasks ($opts) -> $(grep "^tasks" "$tmp/out") (try $try)"
  done
  # Two SIGINTs, as a second Ctrl-C or timeout(1) (the child, then its
  # group) sends them: the run ends as after one - summary, exit 130, the
  # old file kept, no temporary file left.
  for how in twice timeout; do
    echo keep >"$tmp/k.json"
    rm -f "$tmp/k.csv"
    if [ $how = timeout ]; then
      # timeout(1) starts the run in its own process group, so it can
      # signal the group; the run is waited for after its 9 threads are up.
      set -m
      timeout -s INT 3600 "$bin" run $io --io-ms 1000000 --quiet --json "$tmp/k.json" \
        --timeline "$tmp/k.csv" >"$tmp/out" 2>"$tmp/err" &
      tpid=$!
      set +m
      n=0
      pid=""
      until [ -n "$pid" ] && [ "$(ls /proc/$pid/task 2>/dev/null | wc -l)" -ge 9 ] || [ $n -ge 3000 ]; do
        sleep 0.01
        pid=$(pgrep -P $tpid | head -1)
        n=$((n + 1))
      done
      # What timeout does when its time is up: the child, then the group.
      kill -INT "$pid"
      kill -INT -- "-$tpid" 2>/dev/null
      watchdog "-$tpid"
      wait $tpid
      rc=$?
    else
      set -m
      "$bin" run $io --io-ms 1000000 --quiet --json "$tmp/k.json" --timeline "$tmp/k.csv" \
        >"$tmp/out" 2>"$tmp/err" &
      pid=$!
      set +m
      n=0
      until [ "$(ls /proc/$pid/task 2>/dev/null | wc -l)" -ge 9 ] || [ $n -ge 3000 ]; do
        sleep 0.01
        n=$((n + 1))
      done
      kill -INT $pid
      kill -INT $pid
      watchdog $pid
      wait $pid
      rc=$?
    fi
    kill -KILL $dog 2>/dev/null
    wait $dog 2>/dev/null
    [ $rc -eq 130 ] || { fail "two SIGINTs ($how): exit $rc, expected 130"; cat "$tmp/err"; }
    grep -q "^interrupted by Ctrl-C" "$tmp/out" || fail "two SIGINTs ($how): no summary"
    [ "$(cat "$tmp/k.json")" = keep ] || fail "two SIGINTs ($how): the existing JSON was changed"
    [ -e "$tmp/k.csv" ] && fail "two SIGINTs ($how): the CSV was written"
    left=$(ls "$tmp" | grep -E '\.[A-Za-z0-9]{6}$')
    [ -n "$left" ] && fail "two SIGINTs ($how): temporary files left: $left"
    echo "ok: two SIGINTs ($how) -> exit $rc, $(grep "^tasks" "$tmp/out")"
  done
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
