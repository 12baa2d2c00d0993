#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Mutation testing of taskorch's core promises (scripts/mutants.sh runs this).

Each mutant in scripts/mutants.list is one deliberate bug: an exact source
string in one file under src/ and its replacement. For each, in a scratch
copy of the tree (build-mutants/tree, rebuilt incrementally in
build-mutants/build), this applies the mutant, builds only the test
executables it names and runs them with a time bound, cheapest first (by
their time on the unmutated tree), stopping at the first that fails. A
test that fails, crashes or hangs past the bound has killed the mutant; if
all pass, it survived. MUTANTS_PARALLEL scratch trees (build-mutants/tree2,
build2, ...) take mutants from one list at once: a test run mostly waits
for its pool's workers, and a mutant killed by its hang bound waits for
nothing at all, so two trees keep two cores busy where one would not.

The list cannot rot silently: a mutant whose string is not found exactly
once in its file is an error, reported before anything is built, and so is
a mutant that does not compile. Exit status: 0 when every selected mutant
was killed, 1 otherwise (a survivor, a stale or broken mutant, or a test
that fails on the unmutated tree).

Usage: scripts/mutants.sh [ID ...]       run all mutants, or the named ones
                                         (an ID named n times runs n times)
Environment:
  MUTANTS_LIST     the list (default scripts/mutants.list)
  MUTANTS_DIR      scratch directory (default build-mutants)
  MUTANTS_TIMEOUT  seconds per test run before it counts as hung (default 120)
  MUTANTS_PARALLEL scratch trees run at once (default 2)
  MUTANTS_JOBS     build jobs per tree (default: the cores / MUTANTS_PARALLEL)
  MUTANTS_CHECK=1  only check that every mutant applies; build nothing
  MUTANTS_NO_BASELINE=1  skip running the named tests on the unmutated tree
"""
import os
import shutil
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIELDS = ("id", "file", "find", "repl", "tests", "desc", "timeout")


def die(msg):
    print("mutants: " + msg, file=sys.stderr)
    sys.exit(1)


def unescape(s):
    """find/repl are one line each; \\n stands for a newline, \\\\ for a backslash."""
    out, i = [], 0
    while i < len(s):
        if s[i] == "\\" and i + 1 < len(s) and s[i + 1] in "n\\":
            out.append("\n" if s[i + 1] == "n" else "\\")
            i += 2
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


def parse(path):
    """Blocks of `key: value` lines separated by blank lines; # starts a comment line."""
    mutants, cur = [], {}
    with open(path) as f:
        lines = f.read().split("\n")
    for n, line in enumerate(lines + [""], 1):
        if line.startswith("#"):
            continue
        if not line.strip():
            if cur:
                mutants.append(cur)
                cur = {}
            continue
        key, sep, value = line.partition(":")
        key = key.strip()
        if not sep or key not in FIELDS:
            die(f"{path}:{n}: expected 'key: value' with key in {FIELDS}")
        if key in cur:
            die(f"{path}:{n}: {key} given twice")
        cur[key] = value[1:] if value.startswith(" ") else value
        cur.setdefault("line", n)
    ids = set()
    for m in mutants:
        for key in ("id", "file", "find", "repl", "tests", "desc"):
            if key not in m:
                die(f"{path}:{m['line']}: mutant without '{key}'")
        if m["id"] in ids:
            die(f"{path}:{m['line']}: duplicate id {m['id']}")
        ids.add(m["id"])
        m["find"], m["repl"] = unescape(m["find"]), unescape(m["repl"])
        # tests: exe or exe:criterion-filter, space-separated
        m["runs"] = [tuple(t.split(":", 1)) if ":" in t else (t, None) for t in m["tests"].split()]
    return mutants


def sync_tree(dst):
    """Copies the working tree (tracked and untracked, not ignored) into dst,
    rewriting only files whose content differs so the build stays incremental."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                           check=True, capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src, out = os.path.join(ROOT, rel), os.path.join(dst, rel)
        if not os.path.isfile(src) or os.path.islink(src):
            continue
        with open(src, "rb") as f:
            data = f.read()
        if os.path.exists(out):
            with open(out, "rb") as f:
                if f.read() == data:
                    continue
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with open(out, "wb") as f:
            f.write(data)
        shutil.copymode(src, out)


def read(path):
    with open(path) as f:
        return f.read()


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


def check_applies(mutants):
    bad = []
    for m in mutants:
        path = os.path.join(ROOT, m["file"])
        if not os.path.isfile(path):
            bad.append(f"{m['id']}: no file {m['file']}")
            continue
        count = read(path).count(m["find"])
        if count != 1:
            bad.append(f"{m['id']}: its string occurs {count} times in {m['file']} (must be once):"
                       f"\n    {m['find']!r}")
    return bad


def build(bdir, targets, jobs):
    r = subprocess.run(["cmake", "--build", bdir, "-j", str(jobs), "--target", *sorted(targets)],
                       capture_output=True, text=True)
    return r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]


def run_test(bdir, exe, filt, timeout):
    """Returns (passed, why). A run past the bound is killed and counts as failed."""
    cmd = [os.path.join(bdir, "tests", exe), "--jobs", "2"]
    if filt:
        cmd.append("--filter=" + filt)
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                           cwd=os.path.join(bdir, "tests"))
    except subprocess.TimeoutExpired:
        return False, f"hung past {timeout} s"
    if r.returncode == 0:
        # Criterion passes a filter that matches nothing: a typo would make a
        # mutant look "survived" for the wrong reason, so insist on a test run.
        if "Tested: 0 " in r.stderr or "0 tests passed" in r.stderr:
            return True, "no test matched the filter"
        return True, ""
    lines = (r.stdout + r.stderr).strip().splitlines() or [""]
    # The first failed assertion says most; else the last line.
    said = next((l for l in lines if "ssertion" in l or "crash" in l.lower()), lines[-1])
    return False, f"exit {r.returncode}: {' '.join(said.split())[:110]}"


class Tree:
    """One scratch copy of the source tree and its build. A mutant's file
    stays mutated until the tree takes a mutant of another file: the next
    mutant of the same file replaces it, so the file is compiled once per
    mutant, not twice (mutated, then pristine again)."""

    def __init__(self, scratch, n):
        suffix = "" if n == 0 else str(n + 1)
        self.tree = os.path.join(scratch, "tree" + suffix)
        self.bdir = os.path.join(scratch, "build" + suffix)
        self.mutated = None  # the file under src/ that holds a mutant now

    def setup(self, targets, jobs):
        os.makedirs(self.tree, exist_ok=True)
        sync_tree(self.tree)
        subprocess.run(["cmake", "-S", self.tree, "-B", self.bdir, "-G", "Ninja" if shutil.which("ninja")
                        else "Unix Makefiles", "-DCMAKE_BUILD_TYPE=RelWithDebInfo",
                        # the witness-* mutants need the lock-order checker
                        "-DTKO_LOCK_ORDER_CHECK=ON",
                        "-DTKO_BUILD_BENCHMARKS=OFF", "-DTKO_BUILD_WORKBENCH=OFF"],
                       check=True, stdout=subprocess.DEVNULL)
        return build(self.bdir, targets, jobs)

    def restore(self, pristine):
        if self.mutated:
            write(os.path.join(self.tree, self.mutated), pristine[self.mutated])
            self.mutated = None

    def apply(self, m, pristine):
        if self.mutated != m["file"]:
            self.restore(pristine)
        write(os.path.join(self.tree, m["file"]),
              pristine[m["file"]].replace(m["find"], m["repl"], 1))
        self.mutated = m["file"]


def in_parallel(trees, items, work):
    """Runs work(tree, item) for every item, each tree in a thread of its
    own taking the next item as it becomes free."""
    lock, pending, errors = threading.Lock(), list(reversed(items)), []

    def loop(tree):
        while True:
            with lock:
                if not pending or errors:
                    return
                item = pending.pop()
            try:
                work(tree, item)
            except BaseException as e:  # stop the others; raised below
                with lock:
                    errors.append(e)

    threads = [threading.Thread(target=loop, args=(t,)) for t in trees]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def main(argv):
    list_path = os.environ.get("MUTANTS_LIST", os.path.join(ROOT, "scripts", "mutants.list"))
    mutants = parse(list_path)
    if argv:
        unknown = set(argv) - {m["id"] for m in mutants}
        if unknown:
            die("unknown mutant id(s): " + " ".join(sorted(unknown)))
        # In the order given; an id given n times runs n times (a kill
        # must hold in every run: docs/TESTING.md).
        by_id = {m["id"]: m for m in mutants}
        mutants = [by_id[a] for a in argv]
    bad = check_applies(mutants)
    if bad:
        die("stale mutants (update scripts/mutants.list to the current source):\n  "
            + "\n  ".join(bad))
    print(f"mutants: {len(mutants)} apply cleanly")
    if os.environ.get("MUTANTS_CHECK") == "1":
        return 0

    scratch = os.path.abspath(os.environ.get("MUTANTS_DIR", os.path.join(ROOT, "build-mutants")))
    timeout = int(os.environ.get("MUTANTS_TIMEOUT", "120"))
    parallel = max(1, min(int(os.environ.get("MUTANTS_PARALLEL", "2")), len(mutants)))
    jobs = int(os.environ.get("MUTANTS_JOBS", str(max(1, (os.cpu_count() or 2) // parallel))))
    start = time.time()
    trees = [Tree(scratch, n) for n in range(parallel)]
    all_targets = {exe for m in mutants for exe, _ in m["runs"]}
    built = [None] * parallel
    in_parallel(trees, list(range(parallel)),
                lambda tree, n: built.__setitem__(n, tree.setup(all_targets, jobs)))
    for ok, log in built:
        if not ok:
            die("the unmutated tree does not build:\n" + log)
    print(f"mutants: {parallel} scratch trees built ({time.time() - start:.0f} s)", flush=True)

    # The baseline: every named test run passes on the unmutated tree; its
    # time orders each mutant's runs, cheapest first, so that the run that
    # kills it comes as early as it can.
    cost = {}
    if os.environ.get("MUTANTS_NO_BASELINE") != "1":
        failed, lock = [], threading.Lock()

        def baseline(tree, run):
            t0 = time.time()
            passed, why = run_test(tree.bdir, run[0], run[1], timeout)
            with lock:
                cost[run] = time.time() - t0
                if not passed or why:
                    print(f"mutants: baseline {run[0]} {run[1] or ''}: {why or 'failed'}")
                    failed.append(run)

        in_parallel(trees, sorted({r for m in mutants for r in m["runs"]}, key=str), baseline)
        if failed:
            die(f"{len(failed)} test run(s) fail or match nothing on the unmutated tree")
        print(f"mutants: baseline passed ({time.time() - start:.0f} s)", flush=True)

    pristine = {m["file"]: read(os.path.join(ROOT, m["file"])) for m in mutants}
    results, lock = {}, threading.Lock()

    def one(tree, m):
        t0 = time.time()
        tree.apply(m, pristine)
        ok, log = build(tree.bdir, {exe for exe, _ in m["runs"]}, jobs)
        if not ok:
            verdict, why = "ERROR", "does not build: " + log.strip().splitlines()[-1][:80]
        else:
            verdict, why = "SURVIVED", "every test passed, twice"
            limit = int(m.get("timeout", timeout))
            # A survivor's tests run once more: a few tests catch their
            # mutant by racing it many times, and one pass of a race can
            # miss; a mutant no test catches survives both passes.
            for _ in range(2):
                for exe, filt in sorted(m["runs"], key=lambda r: cost.get(r, 0)):
                    passed, w = run_test(tree.bdir, exe, filt, limit)
                    if not passed:
                        verdict, why = "killed", f"{exe}{':' + filt if filt else ''} {w}"
                        break
                if verdict == "killed":
                    break
        with lock:
            results[m["id"]] = (verdict, why)
            print(f"  {m['id']:<28} {verdict:<8} {time.time() - t0:5.0f} s  {why}", flush=True)

    # Mutants of one file follow each other (see Tree); sorted() is stable.
    try:
        in_parallel(trees, sorted(mutants, key=lambda m: m["file"]), one)
    finally:
        for tree in trees:
            tree.restore(pristine)

    print("\n| mutant | file | verdict | killed by / why |\n|---|---|---|---|")
    for m in mutants:
        verdict, why = results[m["id"]]
        print(f"| {m['id']} | {m['file']} | {verdict} | {why.replace('|', '/')} |")
    bad = [m["id"] for m in mutants if results[m["id"]][0] != "killed"]
    print(f"\nmutants: {len(mutants) - len(bad)}/{len(mutants)} killed in {time.time() - start:.0f} s"
          f" ({parallel} scratch trees)")
    for mid in bad:
        print(f"mutants: {results[mid][0]}: {mid}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
