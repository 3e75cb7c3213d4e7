#!/usr/bin/env bash
# Builds helm-render with Debian's Go and Go library packages, offline, in
# GOPATH mode (no module proxy is reachable here).
#   tools/helm-render/build.sh OUTPUT_BINARY
# Needs: golang-go golang-github-masterminds-sprig-dev
#        golang-github-masterminds-semver-dev golang-k8s-sigs-yaml-dev
set -euo pipefail
out=$(realpath -m "${1:?usage: build.sh OUTPUT_BINARY}")
src=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Sprig imports github.com/Masterminds/{sprig,semver}/v3; Debian installs
# them without the /v3 directory, and GOPATH mode does not map major-version
# import paths, so link them where the import paths point.
mkdir -p "$work/gopath/src/github.com/Masterminds/sprig" \
         "$work/gopath/src/github.com/Masterminds/semver" "$work/gopath/src/helm-render"
ln -s /usr/share/gocode/src/github.com/Masterminds/sprig "$work/gopath/src/github.com/Masterminds/sprig/v3"
ln -s /usr/share/gocode/src/github.com/Masterminds/semver "$work/gopath/src/github.com/Masterminds/semver/v3"
cp "$src/main.go" "$work/gopath/src/helm-render/"
mkdir -p "$(dirname "$out")"
cd "$work/gopath/src/helm-render"
GO111MODULE=off GOPATH="$work/gopath:/usr/share/gocode" GOPROXY=off \
  GOCACHE="${GOCACHE:-$work/cache}" go build -o "$out" .
