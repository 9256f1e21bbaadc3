#!/usr/bin/env bash
# Builds the containers provider's two images from the local Debian base
# (deploy/local-base-image.sh) and prints their references, one a line:
#   localhost/ccm-haproxy:latest    the load-balancer proxy (haproxy from Debian)
#   localhost/ccm-test-node:latest  a node stand-in for the tests (busybox httpd)
# Built every time: podman's layer cache makes an unchanged build take about a second, and a
# changed Containerfile or base image is picked up. Progress goes to stderr.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
root=$(cd "$here/../.." && pwd)
# shellcheck source=../../../deploy/podman-env.sh
. "$root/deploy/podman-env.sh"
base=$(bash "$root/deploy/local-base-image.sh")
for pair in haproxy:ccm-haproxy node:ccm-test-node; do
  file=${pair%%:*} ref=localhost/${pair#*:}:latest
  podman build -q --build-arg "BASE_IMAGE=$base" -f "$here/images/$file.Containerfile" -t "$ref" "$here/images" >/dev/null
  echo "$ref"
done
