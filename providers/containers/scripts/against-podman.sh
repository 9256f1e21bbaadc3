#!/usr/bin/env bash
# Runs `ccm-host check` (the provider conformance kit) or `ccm-host sandbox` with the kind
# (containers) provider against real podman: sources deploy/podman-env.sh (fails with the
# apt-get command when podman or runc is missing), builds the proxy and node images
# (scripts/images.sh), ccm-host and the plugin, starts `podman system service` on a socket in a
# temporary directory, creates a network of its own and, on it, node containers labelled
# io.x-k8s.kind.cluster=<cluster> (three running, one paused: a paused container is shut down as
# a stopped one is, but keeps its address, which check's node-addresses wants of every node; an
# exited container has none: tests/podman.rs covers that case), then runs
#   check:   ccm-host check --cloud-provider kind --node <running> --shutdown-node <paused> ...
#   sandbox: ccm-host sandbox --cloud-provider kind --scenario <the nodes + two Services> ...
# and removes everything it made (containers, network, service) on exit, with the command's exit code.
#
#   bash providers/containers/scripts/against-podman.sh check   [extra ccm-host check flags, e.g. -o json]
#   bash providers/containers/scripts/against-podman.sh sandbox [extra ccm-host sandbox flags]
set -euo pipefail
root="$(cd "$(dirname "$0")/../../.." && pwd)"
cd "$root"
mode="${1:-check}"
case "$mode" in check|sandbox) shift || true ;; *) echo "usage: $0 check|sandbox [flags]" >&2; exit 2 ;; esac

# shellcheck source=../../../deploy/podman-env.sh
. deploy/podman-env.sh
mapfile -t images < <(bash providers/containers/scripts/images.sh)
proxy_image=${images[0]} node_image=${images[1]}

echo "== building ccm-host and the containers plugin" >&2
cargo build --quiet -p ccm-host-cli -p ccm-provider-containers >&2
target="${CARGO_TARGET_DIR:-$root/target}"

work="$(mktemp -d)"
cluster="ccm$mode$$"
network="$cluster-net"
service_pid=""
cleanup() {
  local names
  names=$(podman ps -a --format '{{.Names}}' | grep -E "^$cluster-" || true)
  names+=" $(podman ps -a --filter "label=io.ccm-host.containers.load-balancer-of=$cluster" --format '{{.Names}}')"
  # shellcheck disable=SC2086
  [ -n "${names// /}" ] && podman rm -f -t 0 $names >/dev/null 2>&1 || true
  podman network rm -f "$network" >/dev/null 2>&1 || true
  if [ -n "$service_pid" ]; then kill "$service_pid" 2>/dev/null || true; wait "$service_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

socket="$work/podman.sock"
podman system service --time=0 "unix://$socket" >"$work/service.log" 2>&1 &
service_pid=$!
for _ in $(seq 100); do
  [ -S "$socket" ] && break
  sleep 0.1
done
[ -S "$socket" ] || { echo "podman system service did not create $socket; its log:" >&2; cat "$work/service.log" >&2; exit 1; }
podman network create "$network" >/dev/null

echo "== podman: network $network, node containers of cluster $cluster" >&2
node() {
  podman run -d --name "$cluster-$1" --hostname "$cluster-$1" --network "$network" \
    --label "io.x-k8s.kind.cluster=$cluster" --label "topology.kubernetes.io/zone=zone-$2" \
    --label "topology.kubernetes.io/region=local" "$node_image" sleep infinity >/dev/null
}
node worker a; node worker2 b; node worker3 a; node paused b
podman pause "$cluster-paused" >/dev/null

cat >"$work/cloud.yaml" <<CONF
socket: $socket
cluster: $cluster
network: $network
loadBalancer:
  image: $proxy_image
CONF
mkdir -m 0700 "$work/plugins"
cp "$target/debug/libccm_provider_containers.so" "$work/plugins/"
chmod 0644 "$work/plugins/libccm_provider_containers.so"

status=0
case "$mode" in
  check)
    echo "== ccm-host check --cloud-provider kind (cluster $cluster)" >&2
    "$target/debug/ccm-host" check --plugin-dir "$work/plugins" --cloud-provider kind \
      --cloud-config "$work/cloud.yaml" \
      --node "$cluster-worker" --node "$cluster-worker2" --node "$cluster-worker3" \
      --shutdown-node "$cluster-paused" \
      --absent-provider-id "kind://$cluster/kind/$cluster-absent" \
      --cluster-name "$cluster" "$@" || status=$?
    ;;
  sandbox)
    cat >"$work/scene.yaml" <<SCENE
# Nodes named after the containers; two LoadBalancer Services (their proxies are containers too).
nodes:
  - {name: $cluster-worker}
  - {name: $cluster-worker2}
  - {name: $cluster-worker3}
services:
  - name: web
    ports: [{name: http, port: 80, targetPort: 8080}]
  - name: api
    namespace: team-a
    ports: [{name: http, port: 8080, targetPort: 8080}]
SCENE
    echo "== ccm-host sandbox --cloud-provider kind --scenario (cluster $cluster)" >&2
    "$target/debug/ccm-host" sandbox --plugin-dir "$work/plugins" --cloud-provider kind \
      --cloud-config "$work/cloud.yaml" --scenario "$work/scene.yaml" "$@" || status=$?
    ;;
esac
exit "$status"
