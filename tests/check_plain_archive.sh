#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Usage: check_plain_archive.sh INSTALLED_ARCHIVE [LTO_ARCHIVE]
# Fails when the static library that is installed holds GCC LTO bytecode
# (.gnu.lto_* sections): a host's GCC would optimise it again at every link,
# and refuse it if its version differs (CMakeLists.txt: TKO_LTO). With
# LTO_ARCHIVE (the in-tree LTO build, when TKO_LTO is on), fails also when
# that one holds none: then the check itself would be blind.
set -euo pipefail
has_lto() { objdump -h "$1" | grep -c '\.gnu\.lto_' >/dev/null; }
status=0
if has_lto "$1"; then
  echo "LTO bytecode in the installed $1"
  status=1
fi
if [ $# -ge 2 ] && ! has_lto "$2"; then
  echo "no LTO bytecode in $2: the check cannot see it"
  status=1
fi
[ "$status" = 0 ] && echo "no LTO bytecode in $1"
exit "$status"
