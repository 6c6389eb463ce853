#!/usr/bin/env bash
# Lays out DIR/kvloop/{engine,sidecar,operator} as links to this checkout, so that import-linter's graph
# builder (grimp), which walks folders and cannot follow the editable install's mapping, sees the package.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="${1:?usage: import_tree.sh DIR}"
mkdir -p "$dir/kvloop"
: > "$dir/kvloop/__init__.py"
for part in engine sidecar operator; do
  ln -sfn "$root/$part" "$dir/kvloop/$part"
done
