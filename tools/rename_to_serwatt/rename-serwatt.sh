#!/usr/bin/env bash
# The serwatt rename (issue 48 ask 5): one import name, `serwatt`, for a checkout whose
# folders stay profiler/, collectors/, configs/, dashboards/, tests/.
#   usage: rename-serwatt.sh REPO_ROOT
# Idempotent: run it on any later tree, as often as needed; a second run changes nothing.
# See rename-serwatt.md beside it for what it does and the order to apply it in.
set -euo pipefail
ROOT=$(cd "${1:?usage: rename-serwatt.sh REPO_ROOT}" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
for d in profiler collectors configs dashboards tests; do
  [ -d "$ROOT/$d" ] || { echo "rename-serwatt: $ROOT/$d missing: not a serwatt checkout" >&2; exit 2; }
done
# Python 3.11 tokenizes f-strings as one token (3.12 splits them): use the project's venv
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  for c in "$ROOT/.venv/bin/python" python3.11 python3; do
    if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then PY=$c; break; fi
  done
fi
[ -n "$PY" ] || { echo "rename-serwatt: needs Python 3.11 (set PYTHON=)" >&2; exit 2; }

# 1. serwatt/: the package's own files, and links to the folders it maps (the wheel maps
#    them with package-dir; the links make a checkout on PYTHONPATH import `serwatt`)
mkdir -p "$ROOT/serwatt"
for d in profiler collectors configs dashboards; do
  link="$ROOT/serwatt/$d"
  if [ -L "$link" ]; then [ "$(readlink "$link")" = "../$d" ] || { echo "rename-serwatt: $link points elsewhere" >&2; exit 2; }
  elif [ -e "$link" ]; then echo "rename-serwatt: $link exists and is not a link" >&2; exit 2
  else ln -s "../$d" "$link"; fi
done
if [ ! -e "$ROOT/serwatt/__init__.py" ]; then
  cat > "$ROOT/serwatt/__init__.py" <<'PY'
"""serwatt: attribution of CPU time, energy and GPU-wait to serialization codepaths.

The one top-level import name. `serwatt.profiler` and `serwatt.collectors` are the
repository's profiler/ and collectors/ folders (pyproject's package-dir; in a checkout, the
links beside this file). Imports nothing, so importing a collector imports no profiler code.
"""
PY
fi
if [ ! -e "$ROOT/serwatt/__main__.py" ]; then
  cat > "$ROOT/serwatt/__main__.py" <<'PY'
"""`python -m serwatt`: the `serwatt` command."""

import sys

from serwatt.profiler.cli.main import main

sys.exit(main())
PY
fi

# 2. the rewrites: imports, module names in strings, `-m profiler`, pyproject, Makefile, docs
"$PY" "$HERE/rename-serwatt.py" "$ROOT"

# 3. import order and line length after the longer names (ruff from the project's venv)
RUFF=${RUFF:-$ROOT/.venv/bin/ruff}
if [ -x "$RUFF" ] || command -v "$RUFF" >/dev/null 2>&1; then
  (cd "$ROOT" && "$RUFF" check -q --select I --fix profiler collectors tests bench serwatt/__init__.py serwatt/__main__.py >/dev/null || true
   "$RUFF" format -q profiler collectors tests bench serwatt/__init__.py serwatt/__main__.py)
  # lines the longer names pushed past 100 columns: broken by hand rules, then formatted again
  long=$(cd "$ROOT" && "$RUFF" check -q --select E501 --output-format concise profiler collectors tests bench 2>/dev/null \
         | sed -n 's/^\([^:]*\.py\):.*E501.*/\1/p' | sort -u || true)
  if [ -n "$long" ]; then
    (cd "$ROOT" && "$PY" "$HERE/rename-serwatt.py" "$ROOT" --wrap $long && "$RUFF" format -q $long)
  fi
else
  echo "rename-serwatt: WARNING: no ruff; run ruff check --select I --fix and ruff format" >&2
fi

# 4. what is left for a person: imports of the old top-level names, `-m profiler`
left=$(cd "$ROOT" && grep -rnE --include='*.py' '^\s*from\s+(profiler|collectors)(\.\w+)*\s+import\b|^\s*import\s+(profiler|collectors)(\.\w+)*\s*($|as\b|#|,)|"-m", "(profiler|collectors)' \
        profiler collectors tests bench 2>/dev/null | grep -v '^tests/fixtures/\|^tests/test_import_name.py:' || true)
if [ -n "$left" ]; then echo "rename-serwatt: WARNING: old import names left:"; echo "$left"; fi
echo "rename-serwatt: done ($ROOT)"
