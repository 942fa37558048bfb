#!/usr/bin/env bash
# run_python.sh: runs a Python test of the moetune binding (tests/api/*.py)
# with the build's libmoetune.so and the source tree's python/ package.
# Usage: run_python.sh LIBMOETUNE SCRIPT [--torch]
# With --torch it picks the first Python 3 that imports torch ($MOETUNE_PYTHON,
# Debian's /usr/bin/python3 (python3-torch), then python3 on PATH) and exits
# 77 (skipped) when none does; without, the first Python 3 found.
set -euo pipefail
lib=$1 script=$2 need_torch=${3:-}
here=$(cd "$(dirname "$0")" && pwd)
py=""
for cand in "${MOETUNE_PYTHON:-}" /usr/bin/python3 python3; do
  [ -n "$cand" ] && command -v "$cand" >/dev/null 2>&1 || continue
  if [ "$need_torch" != "--torch" ] || "$cand" -c "import torch" >/dev/null 2>&1; then
    py=$cand
    break
  fi
done
if [ -z "$py" ]; then
  echo "run_python.sh: no Python 3${need_torch:+ with torch (Debian: apt-get install python3-torch)}; skipped"
  exit 77
fi
export PYTHONDONTWRITEBYTECODE=1 MOETUNE_LIBRARY=$lib PYTHONPATH="$here/../../python${PYTHONPATH:+:$PYTHONPATH}"
exec "$py" "$script"
