#!/usr/bin/env bash
# `make image`: the Dockerfile built into gpu-placement:<version> (version from pyproject.toml).
#
# Engine: docker when its daemon answers, else podman (installed from Debian's packages when missing,
# with runc: crun refuses cgroups in hybrid mode, which some hosts still run). Base: $BASE (default
# python:3.12-slim-bookworm) when it is present or can be pulled; else, with no registry reachable, a
# Debian bookworm base made once with mmdebstrap (Debian's packages: python3, venv, CA certificates),
# cached in $CACHE and imported into the engine. The build uses the host network, and the host's
# CA bundle and pip configuration as build secrets (never stored in the image).
#
#   bash image/build.sh                 build (BASE=..., IMAGE=..., DOCKERFILE=... override)
#   bash image/build.sh --print-engine  how the image tests run containers: the engine command on one
#                                       line, the flags its `run` and `build` need on the next
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."

BASE=${BASE:-python:3.12-slim-bookworm}
CACHE=${GPU_PLACEMENT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-placement}/image
VERSION=$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
IMAGE=${IMAGE:-gpu-placement:$VERSION}
DOCKERFILE=${DOCKERFILE:-Dockerfile}
# What mmdebstrap puts in the fallback base; its hash names the cached tarball and the image.
DEBIAN_BASE=(--variant=essential --include=python3,python3-venv,ca-certificates
             --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr
             --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*'
             --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/doc/*'
             --dpkgopt='path-include=/usr/share/doc/*/copyright' bookworm)
# A tarball has no configuration: the PATH Debian's login shells and Docker's Debian images set.
DEBIAN_BASE_CHANGES=(--change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin')

say() { echo "image: $*" >&2; }

apt_install() {
    if ! command -v apt-get >/dev/null || [[ $(id -u) != 0 ]]; then
        say "needs $* (Debian packages); install them and run again"; exit 1
    fi
    say "installing $* from Debian's packages"
    { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null; } 2>/dev/null \
        || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null; }
}

engine() {
    if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
        echo docker
        return
    fi
    if ! command -v podman >/dev/null || ! command -v runc >/dev/null; then
        apt_install podman runc
    fi
    echo podman
}

# podman: runc, and limits no higher than this process has (raising one is refused here; conmon
# also caps the process count at pid_max).
engine_flags() {
    if [[ $ENGINE == podman ]]; then
        local nproc
        nproc=$(ulimit -Hu)
        [[ $nproc == unlimited || $nproc -gt $(cat /proc/sys/kernel/pid_max) ]] && nproc=$(cat /proc/sys/kernel/pid_max)
        echo "--ulimit nofile=$(ulimit -Sn):$(ulimit -Hn) --ulimit nproc=$nproc:$nproc"
    fi
}

ENGINE=$(engine)
run_engine() {
    if [[ $ENGINE == podman ]]; then podman --runtime runc "$@"; else docker "$@"; fi
}
if [[ ${1:-} == --print-engine ]]; then
    [[ $ENGINE == podman ]] && echo "podman --runtime runc" || echo docker
    engine_flags
    exit 0
fi

# A short name is Docker Hub's; podman asks for the registry to be named.
pullable() {
    local first=${1%%/*}
    if [[ $ENGINE == podman && ( $1 != */* || ( $first != *.* && $first != *:* && $first != localhost ) ) ]]; then
        [[ $1 == */* ]] && echo "docker.io/$1" || echo "docker.io/library/$1"
    else
        echo "$1"
    fi
}

debian_base() {
    local tar name
    tar="$CACHE/debian-bookworm-python3-$(printf '%s\n' "${DEBIAN_BASE[@]}" | sha256sum | cut -c1-12).tar"
    name="gpu-placement-base:bookworm-$(printf '%s\n' "$tar" "${DEBIAN_BASE_CHANGES[@]}" | sha256sum | cut -c1-12)"
    [[ $ENGINE == podman ]] && name="localhost/$name"
    if ! run_engine image inspect "$name" >/dev/null 2>&1; then
        if [[ ! -s $tar ]]; then
            command -v mmdebstrap >/dev/null || apt_install mmdebstrap
            say "making a Debian bookworm base with mmdebstrap into $tar (once; about a minute)"
            mkdir -p "$CACHE"
            if ! mmdebstrap --format=tar "${DEBIAN_BASE[@]}" "$tar.part" >"$CACHE/mmdebstrap.log" 2>&1; then
                tail -20 "$CACHE/mmdebstrap.log" >&2
                say "mmdebstrap failed (log: $CACHE/mmdebstrap.log)"
                exit 1
            fi
            mv "$tar.part" "$tar"
        fi
        run_engine import --quiet "${DEBIAN_BASE_CHANGES[@]}" "$tar" "$name" >/dev/null
    fi
    echo "$name"
}

base=$(pullable "$BASE")
if run_engine image inspect "$base" >/dev/null 2>&1 || run_engine pull --quiet "$base" >/dev/null 2>&1; then
    say "base $base"
else
    base=$(debian_base)
    say "base $BASE cannot be pulled (no registry answers): using $base, Debian bookworm made with mmdebstrap"
fi

# The build's pip sees what pip sees on this host: its CA bundle and its configuration (files and
# PIP_* variables, as `pip config list` merges them), passed as secrets for the one install step.
secrets=()
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
ca=${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}
[[ -s $ca ]] && secrets+=(--secret "id=ca-certificates,src=$ca")
if python3 -m pip config list >"$work/pip.list" 2>/dev/null && [[ -s $work/pip.list ]]; then
    python3 - "$work/pip.list" >"$work/pip.conf" <<'EOF'
import ast
import sys
sections: dict[str, dict[str, str]] = {}
for line in open(sys.argv[1]):  # files first, then PIP_* variables, which win as they do for pip
    key, _, value = line.strip().partition("=")
    section, _, name = key.rpartition(".")
    section = "global" if section in ("", ":env:") else section
    values = str(ast.literal_eval(value)).split()
    if name == "find-links":  # a folder of this host means nothing inside the build
        values = [v for v in values if "://" in v]
    if values:
        sections.setdefault(section, {})[name] = "\n    ".join(values)
for section, options in sections.items():
    print(f"[{section}]", *(f"{name} = {value}" for name, value in options.items()), sep="\n")
EOF
    chmod 600 "$work/pip.conf"
    secrets+=(--secret "id=pip.conf,src=$work/pip.conf")
fi

read -ra flags <<<"$(engine_flags)"
flags+=(--network host --build-arg "BASE=$base" --build-arg "VERSION=$VERSION" --tag "$IMAGE")
say "building $IMAGE with $ENGINE"
start=$SECONDS
run_engine build "${flags[@]}" "${secrets[@]}" --file "$DOCKERFILE" . >&2
size=$(run_engine image inspect --format '{{.Size}}' "$IMAGE")
say "built $IMAGE in $((SECONDS - start)) s: $((size / 1000000)) MB"
