#!/usr/bin/env bash
# Makes the base images deploy/Dockerfile builds FROM, for machines that reach no container registry
# (ours: Debian's packages, crates.io and PyPI only). Prints the image reference on stdout; progress
# goes to stderr.
#
#   deploy/local-base-image.sh            localhost/ccm-base:trixie
#       Debian 13 (trixie) minbase from debootstrap, the stand-in for debian:13-slim (the runtime
#       stage's BASE_IMAGE). Like the official slim image it has no ca-certificates.
#   deploy/local-base-image.sh builder    localhost/ccm-rust-builder:<rustc version>-trixie
#       The base + gcc, libc6-dev, ca-certificates + this machine's Rust toolchain (the one rustup
#       has active), the stand-in for rust:<version>-trixie (the build stage's RUST_IMAGE): same
#       Debian release, so the binaries link trixie's glibc as the official build image's do.
#
# Both are cached under target/image-cache/ as `podman save` archives (the base by suite, the
# builder by rustc version; delete the archive to refresh one), and
# loaded from there when podman lacks them: podman's build cache is keyed by the base images' IDs,
# and a saved archive keeps the ID, so a later `podman build` reuses its layers.
# Where the official images can be pulled, pass them to the Dockerfile instead (README "Image").
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=deploy/podman-env.sh
. "$root/deploy/podman-env.sh"
cache="$root/target/image-cache"
mkdir -p "$cache"
suite=trixie
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

say() { echo "local-base-image: $*" >&2; }

# Loads $1 from the archive $2 if podman lacks it; returns 1 when neither has it.
from_cache() {
  local ref=$1 archive=$2
  if podman image exists "$ref"; then return 0; fi
  if [ -f "$archive" ]; then
    say "loading $ref from $archive"
    podman load -q -i "$archive" >&2 && return 0
  fi
  return 1
}

base() {
  local ref=localhost/ccm-base:$suite archive="$cache/ccm-base-$suite.tar"
  if from_cache "$ref" "$archive"; then echo "$ref"; return; fi
  if ! command -v debootstrap >/dev/null 2>&1; then
    echo "error: debootstrap not found: install it with 'apt-get install -y debootstrap' (as root)" >&2
    exit 1
  fi
  local rootfs="$cache/rootfs-$suite"
  rm -rf "$rootfs"
  say "debootstrap --variant=minbase $suite from $mirror (about 2 minutes)"
  local started=$SECONDS
  # The release's signatures are checked against Debian's archive keyring, never skipped.
  local keyring=/usr/share/keyrings/debian-archive-keyring.gpg
  if [ ! -f "$keyring" ]; then
    echo "error: $keyring not found: install it with 'apt-get install -y debian-archive-keyring'" >&2
    exit 1
  fi
  if ! debootstrap --keyring="$keyring" --variant=minbase "$suite" "$rootfs" "$mirror" >"$cache/debootstrap.log" 2>&1; then
    echo "error: debootstrap of Debian $suite failed; its log: $cache/debootstrap.log" >&2
    tail -5 "$cache/debootstrap.log" >&2
    exit 1
  fi
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" -c . | podman import -q --change 'CMD ["bash"]' - "$ref" >/dev/null
  rm -rf "$rootfs"
  podman save -q -o "$archive.tmp" "$ref" && mv "$archive.tmp" "$archive"
  say "made $ref in $((SECONDS - started)) s"
  echo "$ref"
}

builder() {
  local base_ref toolchain version ref archive
  base_ref=$(base)
  toolchain=$(rustc --print sysroot)
  version=$(rustc --version | awk '{print $2}')
  ref=localhost/ccm-rust-builder:$version-$suite
  archive="$cache/ccm-rust-builder-$version-$suite.tar"
  if from_cache "$ref" "$archive"; then echo "$ref"; return; fi
  say "making $ref from $base_ref and the toolchain in $toolchain"
  local started=$SECONDS ctx="$cache/builder-context"
  rm -rf "$ctx"
  mkdir -p "$ctx"
  # The toolchain without its docs (the largest part that a build never reads).
  tar -C "$toolchain" --exclude=./share/doc -c . | tar -C "$ctx" -x
  mkdir -p "$ctx/.ccm"
  cat >"$ctx/.ccm/Containerfile" <<CONTAINERFILE
FROM $base_ref
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev ca-certificates \\
 && rm -rf /var/lib/apt/lists/*
COPY . /usr/local/rust/
ENV PATH=/usr/local/rust/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \\
    CARGO_HOME=/usr/local/cargo
CONTAINERFILE
  echo .ccm >"$ctx/.containerignore"
  podman build -q -f "$ctx/.ccm/Containerfile" -t "$ref" "$ctx" >&2
  rm -rf "$ctx"
  podman save -q -o "$archive.tmp" "$ref" && mv "$archive.tmp" "$archive"
  say "made $ref in $((SECONDS - started)) s"
  echo "$ref"
}

case "${1:-base}" in
  base) base ;;
  builder) builder ;;
  *) echo "usage: $0 [base|builder]" >&2; exit 2 ;;
esac
