#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The layering check (CTest `layering`; docs/DESIGN.md).

src/ holds one folder per layer, lowest first: platform, structures,
engine, features, ext. A file may use only what its own layer or a lower
one defines; it reaches a higher layer only through a function pointer
that the higher layer registered. This reads that rule off the build:

- symbols: for each library object, the symbols it leaves undefined (nm -u)
  that another library object defines; one defined in a higher layer is a
  violation, reported as `src/<file> -> <symbol> (src/<file>)`;
- includes: each `#include "x.h"` of a file in src/ that names a header of
  a higher layer is a violation, reported as `src/<file> includes src/<h>`.

The upward edges that remain are listed, one per line, in
scripts/layers.allow: the ratchet. A violation not in the list fails the
check, and so does a line of the list that no longer matches anything
(remove it: the edge is gone). Usage: check_layers.py ROOT OBJECT...
"""
import os
import re
import subprocess
import sys

LAYERS = ["platform", "structures", "engine", "features", "ext"]


def rel_source(path):
    """src/<layer>/<file> for an object or source path, else None."""
    m = re.search(r"(?:^|/)src/(" + "|".join(LAYERS) + r")/([^/]+?)(?:\.o|\.obj)?$", path)
    return f"src/{m.group(1)}/{m.group(2)}" if m else None


def layer(rel):
    return LAYERS.index(rel.split("/")[1])


def nm(args, obj):
    out = subprocess.run(["nm", *args, obj], check=True, capture_output=True, text=True).stdout
    return [line.split()[-1] for line in out.splitlines() if line.strip()]


def main():
    root, objects = sys.argv[1], sys.argv[2:]
    if not objects:
        sys.exit("check_layers: no objects given")
    defined, undefined = {}, {}
    for obj in objects:
        src = rel_source(obj)
        if src is None:
            sys.exit(f"check_layers: {obj} is not in a layer folder of src/")
        for sym in nm(["--defined-only", "-g"], obj):
            defined[sym] = src
        undefined[src] = nm(["-u"], obj)
    found = set()
    for src, syms in undefined.items():
        for sym in syms:
            home = defined.get(sym)
            if home and layer(home) > layer(src):
                found.add(f"{src} -> {sym} ({home})")
    headers = {}
    for lay in LAYERS:
        for name in os.listdir(os.path.join(root, "src", lay)):
            headers[name] = f"src/{lay}/{name}"
    for lay in LAYERS:
        for name in sorted(os.listdir(os.path.join(root, "src", lay))):
            src = f"src/{lay}/{name}"
            with open(os.path.join(root, src)) as f:
                for inc in re.findall(r'^\s*#\s*include\s+"([^"]+)"', f.read(), re.M):
                    target = headers.get(inc)
                    if target and layer(target) > layer(src):
                        found.add(f"{src} includes {target}")
    allow_path = os.path.join(root, "scripts", "layers.allow")
    allowed = set()
    with open(allow_path) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line:
                allowed.add(line)
    new = sorted(found - allowed)
    stale = sorted(allowed - found)
    for v in new:
        print(f"layering: a call or include up the layers: {v}")
    for v in stale:
        print(f"layering: scripts/layers.allow lists an edge that is gone (remove it): {v}")
    print(f"layering: {len(objects)} objects, {len(found)} upward edges, "
          f"{len(found & allowed)} of them listed in scripts/layers.allow")
    sys.exit(1 if new or stale else 0)


if __name__ == "__main__":
    main()
