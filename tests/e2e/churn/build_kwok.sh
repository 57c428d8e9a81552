#!/usr/bin/env bash
# Build KWOK's controller (the `kwok` binary of sigs.k8s.io/kwok) for `make e2e-churn` from the Go
# module proxy, as tests/e2e/build_control_plane.sh builds the control plane: into
# $KWOK_BIN_DIR when set, else ~/.cache/gpu-placement/kwok-<version>/; a second run finds it and
# returns at once. A cold build takes about 7 minutes on 2 cores (under 3 when Go's build cache already
# holds the control plane's Kubernetes packages). Beside the binary: the Stage CRD of the same release
# (kustomize/crd/bases in the module), which the harness installs.
# With --print-path the binary's path is printed on stdout at the end (the harness reads it).
set -euo pipefail
PRINT=0
[[ "${1:-}" == "--print-path" ]] && PRINT=1

KWOK_VERSION="${KWOK_VERSION:-0.8.0}"
DEST="${KWOK_BIN_DIR:-${HOME}/.cache/gpu-placement/kwok-${KWOK_VERSION}}"
log() { printf '[build-kwok %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

CRD=kwok.x-k8s.io_stages.yaml
if [[ -x "${DEST}/kwok" && -f "${DEST}/${CRD}" ]]; then
    log "cached: ${DEST}/kwok"
    [[ $PRINT == 1 ]] && echo "${DEST}/kwok"
    exit 0
fi
GO="$(command -v go || true)"
[[ -z "$GO" && -x /usr/local/go/bin/go ]] && GO=/usr/local/go/bin/go
if [[ -z "$GO" ]]; then
    log "Go is missing: install Go >= 1.26 (KWOK v${KWOK_VERSION}'s go.mod asks for it) and put it on PATH,"
    log "or set KWOK_BIN_DIR to a folder holding a kwok binary of v${KWOK_VERSION}."
    exit 2
fi
mkdir -p "$DEST"
export CGO_ENABLED=0 GOFLAGS=-mod=mod GOWORK=off
start=$SECONDS
if [[ -x "${DEST}/kwok" ]]; then rm -f "${DEST}/kwok"; fi  # no CRD beside it: an older cache, built again
log "go install sigs.k8s.io/kwok/cmd/kwok@v${KWOK_VERSION} into ${DEST} with $("$GO" version) (many minutes)"
# The module has no replace directives, so `go install pkg@version` builds it with its own go.sum.
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
GOBIN="$tmp" "$GO" install -trimpath \
    -ldflags="-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION}" \
    "sigs.k8s.io/kwok/cmd/kwok@v${KWOK_VERSION}"
moddir="$("$GO" env GOMODCACHE)/sigs.k8s.io/kwok@v${KWOK_VERSION}"
cp "${moddir}/kustomize/crd/bases/${CRD}" "${DEST}/${CRD}.tmp"
mv "${DEST}/${CRD}.tmp" "${DEST}/${CRD}"
mv "$tmp/kwok" "${DEST}/kwok"
log "done in $((SECONDS - start)) s: $("${DEST}/kwok" --version 2>/dev/null || echo "${DEST}/kwok")"
[[ $PRINT == 1 ]] && echo "${DEST}/kwok"
exit 0
