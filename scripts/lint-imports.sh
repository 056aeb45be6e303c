#!/usr/bin/env bash
# The walls between the rooms: import-linter's contracts ([tool.importlinter] in pyproject.toml),
# checked over the installed layout. effect_ledger.schemas/.streams/.processors live in the top-level
# folders schemas/, streams/, processors/ (joined to the import path by package-dir), which import-linter
# cannot see through an editable install: it reads a copy of the tree laid out as it is installed.
# Usage: scripts/lint-imports.sh [SOURCE_ROOT]   (default: this repository); exit 1 on a broken wall.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
src="$(cd "${1:-$here}" && pwd)"
linter="${LINT_IMPORTS:-$here/.venv/bin/lint-imports}"
tree="$(mktemp -d "${TMPDIR:-/tmp}/effect-ledger-walls.XXXXXX")"
trap 'rm -rf "$tree"' EXIT
cp -r "$src/effect_ledger" "$tree/"
for d in schemas streams processors; do cp -r "$src/$d" "$tree/effect_ledger/$d"; done
cd "$tree"
PYTHONPATH="$tree" "$linter" --config "$src/pyproject.toml" --no-cache
