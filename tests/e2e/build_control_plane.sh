#!/usr/bin/env bash
# Build the real Kubernetes control plane for `make e2e` from Go modules (no release downloads are
# possible here): kube-apiserver, kube-controller-manager, kube-scheduler from k8s.io/kubernetes and
# etcd from go.etcd.io/etcd/server/v3. The binaries land in a cache outside the repo,
# $KUBEBUILDER_ASSETS when set, else ~/.cache/gpu-placement/k8s-<version>/; a second run finds them
# and returns at once. A cold build takes tens of minutes on 2 cores (see README).
# With --print-dir the folder is printed on stdout at the end (the e2e harness reads it).
set -euo pipefail
PRINT_DIR=0
[[ "${1:-}" == "--print-dir" ]] && PRINT_DIR=1

K8S_VERSION="${K8S_VERSION:-1.37.2}"
ETCD_VERSION="${ETCD_VERSION:-3.6.16}"
DEST="${KUBEBUILDER_ASSETS:-${HOME}/.cache/gpu-placement/k8s-${K8S_VERSION}}"
K8S_BINS=(kube-apiserver kube-controller-manager kube-scheduler)

log() { printf '[build-control-plane %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

missing=()
for b in "${K8S_BINS[@]}" etcd; do [[ -x "${DEST}/${b}" ]] || missing+=("$b"); done
if [[ ${#missing[@]} -eq 0 ]]; then
    log "cached in ${DEST}: ${K8S_BINS[*]} etcd"
    [[ $PRINT_DIR == 1 ]] && echo "$DEST"
    exit 0
fi

GO="$(command -v go || true)"
[[ -z "$GO" && -x /usr/local/go/bin/go ]] && GO=/usr/local/go/bin/go
if [[ -z "$GO" ]]; then
    log "Go is missing: install Go >= 1.25 (https://go.dev/dl, or the golang apt package if new enough)"
    log "and put it on PATH, or set KUBEBUILDER_ASSETS to a folder holding ${K8S_BINS[*]} etcd."
    exit 2
fi
log "building ${missing[*]} into ${DEST} with $("$GO" version)"
mkdir -p "$DEST"
WORK="${DEST}/.src"
export CGO_ENABLED=0 GOFLAGS=-mod=mod GOWORK=off
start=$SECONDS

need() { local b; for b in "$@"; do [[ " ${missing[*]} " == *" $b "* ]] && return 0; done; return 1; }

if need "${K8S_BINS[@]}"; then
    mod="${WORK}/kubernetes"
    mkdir -p "$mod"
    log "k8s.io/kubernetes v${K8S_VERSION}: fetching go.mod"
    gomod="$(cd "$mod" && "$GO" mod download -json "k8s.io/kubernetes@v${K8S_VERSION}" \
        | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')"
    [[ -f "$gomod" ]] || { log "could not download k8s.io/kubernetes@v${K8S_VERSION}"; exit 1; }
    # k8s.io/kubernetes requires its staging repositories as v0.0.0 (replaced locally upstream);
    # a dependent module must map each to the matching published v0.<minor>.<patch> release.
    staging="$(awk '/^[[:space:]]*k8s\.io\/[^ ]+ v0\.0\.0$/ {print $1}' "$gomod" | sort -u)"
    {
        echo "module gpu-placement.local/control-plane"
        echo
        echo "go $(awk '/^go /{print $2; exit}' "$gomod")"
        echo
        echo "require k8s.io/kubernetes v${K8S_VERSION}"
        echo
        for m in $staging; do echo "replace $m => $m v0.${K8S_VERSION#*.}"; done
    } > "${mod}/go.mod"
    # A blank import keeps `go mod tidy` from dropping the requirement.
    printf 'package tools\n\nimport _ "k8s.io/kubernetes/cmd/kube-apiserver/app"\n' > "${mod}/tools.go"
    log "resolving $(wc -w <<<"$staging") staging modules and dependencies"
    (cd "$mod" && "$GO" mod tidy)
    minor="${K8S_VERSION#*.}"; minor="${minor%%.*}"
    ldflags="-s -w"
    for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        # The API server derives its emulation/compatibility version from these; the defaults
        # of a non-release build ("v0.0.0-master") would not parse as 1.<minor>.
        ldflags+=" -X ${p}.gitVersion=v${K8S_VERSION} -X ${p}.gitMajor=1 -X ${p}.gitMinor=${minor}"
        ldflags+=" -X ${p}.gitTreeState=clean -X ${p}.buildDate=1970-01-01T00:00:00Z"
    done
    for b in "${K8S_BINS[@]}"; do
        need "$b" || continue
        log "go build ${b} (the first one compiles most of Kubernetes: many minutes)"
        t=$SECONDS
        (cd "$mod" && "$GO" build -trimpath -ldflags="$ldflags" -o "${DEST}/${b}.tmp" "k8s.io/kubernetes/cmd/${b}")
        mv "${DEST}/${b}.tmp" "${DEST}/${b}"
        log "${b} built in $((SECONDS - t)) s"
    done
fi

if need etcd; then
    mod="${WORK}/etcd"
    mkdir -p "$mod"
    # A module of its own: etcd's dependency versions (grpc, otel) need not agree with Kubernetes'.
    cat > "${mod}/main.go" <<'GO'
// etcd's own server entry point, built from the go.etcd.io/etcd/server/v3 module.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
    printf 'module gpu-placement.local/etcd\n\ngo 1.24\n\nrequire go.etcd.io/etcd/server/v3 v%s\n' \
        "$ETCD_VERSION" > "${mod}/go.mod"
    log "go build etcd v${ETCD_VERSION}"
    t=$SECONDS
    (cd "$mod" && "$GO" mod tidy && "$GO" build -trimpath \
        -ldflags="-s -w" -o "${DEST}/etcd.tmp" .)
    mv "${DEST}/etcd.tmp" "${DEST}/etcd"
    log "etcd built in $((SECONDS - t)) s"
fi

log "done in $((SECONDS - start)) s; $(du -sh "$DEST" | cut -f1) in ${DEST} (Go's module and build caches: $(du -sh "$("$GO" env GOMODCACHE)" 2>/dev/null | cut -f1), $(du -sh "$("$GO" env GOCACHE)" 2>/dev/null | cut -f1))"
[[ $PRINT_DIR == 1 ]] && echo "$DEST"
exit 0
