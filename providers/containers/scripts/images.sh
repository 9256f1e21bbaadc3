#!/usr/bin/env bash
# Builds the containers provider's two images from the local Debian base
# (deploy/local-base-image.sh) and prints their references, one a line:
#   localhost/ccm-haproxy:latest    the load-balancer proxy (haproxy from Debian)
#   localhost/ccm-test-node:latest  a node stand-in for the tests (busybox httpd)
# An image already present is kept (podman's build cache keys on the base image's ID, so a
# rebuild after a base change redoes only these small layers). Progress goes to stderr.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
root=$(cd "$here/../.." && pwd)
# shellcheck source=../../../deploy/podman-env.sh
. "$root/deploy/podman-env.sh"
base=$(bash "$root/deploy/local-base-image.sh")
for pair in haproxy:ccm-haproxy node:ccm-test-node; do
  file=${pair%%:*} ref=localhost/${pair#*:}:latest
  if ! podman image exists "$ref"; then
    echo "images.sh: building $ref from $base" >&2
    podman build -q --build-arg "BASE_IMAGE=$base" -f "$here/images/$file.Containerfile" -t "$ref" "$here/images" >&2
  fi
  echo "$ref"
done
