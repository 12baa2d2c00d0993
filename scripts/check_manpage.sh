#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# CTest workbench_manpage: the man page formats without a warning and names
# every long option that `taskorch-workbench --help` lists, so the two stay
# in step.  Usage: scripts/check_manpage.sh WORKBENCH MANPAGE
set -euo pipefail
wb=$1
page=$2
warnings=$(groff -t -man -Tutf8 -ww -z "$page" 2>&1)
[ -z "$warnings" ] || { echo "$page: groff warnings:" >&2; echo "$warnings" >&2; exit 1; }
# In roff source a dash is written \-, so --max-elastic reads \-\-max\-elastic.
text=$(sed 's/\\-/-/g' "$page")
missing=0
# (--name=VALUE is the help's way of saying how any option may be written.)
for opt in $("$wb" --help | grep -oE -- '--[a-z][a-z-]*' | grep -vx -- --name | sort -u); do
  grep -qF -- "$opt" <<<"$text" || { echo "$page does not document $opt" >&2; missing=1; }
done
exit $missing
