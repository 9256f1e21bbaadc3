#!/usr/bin/env bash
# The image test: builds deploy/Dockerfile as users build it (the full multi-stage build) and runs
# the result the way the manifests run it, with podman. One line per check, then
# `image-test: N passed, M failed`; exit 1 when any check failed. CI runs it (.ci/run).
#
#   bash deploy/image-test.sh
#
# What it needs: podman + runc (deploy/podman-env.sh says how to install them; it never skips),
# debootstrap for the local base images, curl, openssl, python3 (moto for the aws check, through
# providers/aws/scripts/install-moto.sh), cargo. Base images: RUST_IMAGE and BASE_IMAGE from the
# environment when set (e.g. the official rust:1.95.0-trixie and debian:13.1-slim where a registry
# is reachable), else stand-ins made locally by deploy/local-base-image.sh (same Debian release).
# The build stage gets the crates from this machine's cargo registry (mounted; `cargo fetch
# --locked` first), and keeps its target directory in target/image-build/, so a second run only
# rebuilds what changed. Test traffic goes to 127.0.0.1 only (containers share the host network).
# IMAGE_TEST_IMAGE=REF tests an image built elsewhere (e.g. pulled from your registry) instead of
# building one; the base image is still needed for the layer check.
#
# Checks (docs/image.md describes each):
#   image: one layer on the base, CA bundle, user 65532, glibc needs within the base's
#   smoke, under the manifests' security context (--read-only, --cap-drop=ALL, no-new-privileges,
#   --user 65532, --memory 256m): --version; plugins lists every provider in providers/; sandbox
#   converges with no system CA roots; check passes on the example provider; run with an
#   in-cluster configuration against an API server over HTTPS initialises a node, answers
#   /healthz and /readyz over HTTPS from outside and stops on SIGTERM within the grace period;
#   the aws plugin's HTTPS calls succeed with the CA mounted at the standard path and fail with a
#   clear line without it
#   vendor: new-provider's crate, copied out of the repository, builds its Dockerfile FROM this
#   image; plugins lists it beside the image's own; check passes on it
#   deploy-time plugins: an init container's copy into a 0777 volume (as kubelet makes emptyDir)
#   loads once the volume is made root's 0755; left 0777 it is refused
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# shellcheck source=deploy/podman-env.sh
. deploy/podman-env.sh || exit 1

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' host/Cargo.toml | head -n 1)
image=localhost/ccm-host:v$version
vendor_image=localhost/ccm-host-acme:test
work=$(mktemp -d)
containers=()
pids=()
cleanup() {
  for c in "${containers[@]}"; do podman rm -f -t 0 "$c" >/dev/null 2>&1; done
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT

passed=0
failed=0
started=$SECONDS
# check NAME COMMAND...: runs COMMAND, one line with its outcome; on failure the last lines of its
# output follow.
check() {
  local name=$1
  shift
  local log="$work/check.log"
  if "$@" >"$log" 2>&1; then
    passed=$((passed + 1))
    echo "ok   $name"
  else
    failed=$((failed + 1))
    echo "FAIL $name"
    tail -n 15 "$log" | sed 's/^/     | /'
  fi
}
info() { echo "     $*"; }
finish() {
  info "took $((SECONDS - started)) s"
  echo "image-test: $passed passed, $failed failed"
  [ "$failed" = 0 ]
  exit $?
}
# A prerequisite that failed: nothing after it can run.
abort() {
  failed=$((failed + 1))
  echo "FAIL $1"
  [ -s "$work/step.log" ] && tail -n 25 "$work/step.log" | sed 's/^/     | /'
  finish
}
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
for need in curl:curl openssl:openssl python3:python3 cargo:cargo objdump:binutils; do
  command -v "${need%%:*}" >/dev/null 2>&1 ||
    abort "${need%%:*} is needed: install it (apt-get install -y ${need#*:})"
done

# The security context of deploy/base/daemonset.yaml (readOnlyRootFilesystem, drop ALL,
# allowPrivilegeEscalation false, runAsUser/runAsGroup 65532, limits.memory 256Mi). podman's
# --read-only alone mounts writable tmpfs on /tmp, /run and /var/tmp, which a pod does not get, and
# --memory alone allows as much swap again.
secure=(--read-only --read-only-tmpfs=false --cap-drop=ALL --security-opt no-new-privileges
  --user 65532:65532 --memory 256m --memory-swap 256m)
# The tools (sandbox, check) are not manifest workloads: they get a /tmp for their scratch files.
tool=("${secure[@]}" --tmpfs /tmp:rw,size=64m,mode=1777)

# ---------------------------------------------------------------------------------------------
# Build
# ---------------------------------------------------------------------------------------------
t=$SECONDS
# The Dockerfile's pinned base images when a registry serves them (a pull fails at once where
# none is reachable), else stand-ins made here; RUST_IMAGE/BASE_IMAGE choose others.
pinned_rust=docker.io/library/$(sed -n 's/^ARG RUST_IMAGE=//p' deploy/Dockerfile)
pinned_base=docker.io/library/$(sed -n 's/^ARG BASE_IMAGE=//p' deploy/Dockerfile)
if [ -z "${RUST_IMAGE:-}${BASE_IMAGE:-}" ] &&
  timeout 600 podman pull -q "$pinned_rust" >"$work/step.log" 2>&1 &&
  timeout 600 podman pull -q "$pinned_base" >>"$work/step.log" 2>&1; then
  rust_image=$pinned_rust base_image=$pinned_base
  info "base images: the pinned ones, pulled"
else
  rust_image=${RUST_IMAGE:-$(bash deploy/local-base-image.sh builder 2>"$work/step.log")} ||
    abort "the local build image (deploy/local-base-image.sh builder)"
  base_image=${BASE_IMAGE:-$(bash deploy/local-base-image.sh base 2>"$work/step.log")} ||
    abort "the local base image (deploy/local-base-image.sh)"
  info "base images: build $rust_image, runtime $base_image ($((SECONDS - t)) s; the pinned ones could not be pulled)"
fi

# Every crate of Cargo.lock in the registry, so the build stage needs no network; the host tools
# the test uses outside the image (new-provider, the HTTPS API server).
cargo fetch --locked >"$work/step.log" 2>&1 || abort "cargo fetch --locked"
cargo build --quiet -p ccm-host-cli -p kube-apiserver-inmem >"$work/step.log" 2>&1 ||
  abort "cargo build -p ccm-host-cli -p kube-apiserver-inmem"
bin=${CARGO_TARGET_DIR:-$root/target}/debug
registry="${CARGO_HOME:-$HOME/.cargo}/registry"
if [ -n "${IMAGE_TEST_IMAGE:-}" ]; then
  image=$IMAGE_TEST_IMAGE
  info "testing $image (IMAGE_TEST_IMAGE: not built here)"
else
  mkdir -p target/image-build
  t=$SECONDS
  # The image is used by its ID from here on: another build on this machine may move the tag.
  podman build -f deploy/Dockerfile -t "$image" --iidfile "$work/image.id" \
    --build-arg RUST_IMAGE="$rust_image" --build-arg BASE_IMAGE="$base_image" \
    --build-arg CARGO_NET_OFFLINE=true \
    -v "$registry:/usr/local/cargo/registry" -v "$root/target/image-build:/src/target" \
    . >"$work/step.log" 2>&1 || abort "podman build -f deploy/Dockerfile"
  info "built $image ($(cut -c1-19 "$work/image.id")) in $((SECONDS - t)) s (multi-stage: cargo build --locked --release in the build stage)"
  image=$(cat "$work/image.id")
fi

# ---------------------------------------------------------------------------------------------
# The image itself
# ---------------------------------------------------------------------------------------------
size=$(podman image inspect "$image" --format '{{.Size}}')
base_size=$(podman image inspect "$base_image" --format '{{.Size}}')
info "image size $((size / 1000000)) MB uncompressed (base $((base_size / 1000000)) MB); layers:"
podman history --format '{{.Size}}	{{.CreatedBy}}' "$image" | cut -c1-110 | sed 's/^/       /'

one_layer_on_the_base() {
  local base_layers layers
  base_layers=$(podman image inspect "$base_image" --format '{{len .RootFS.Layers}}')
  layers=$(podman image inspect "$image" --format '{{len .RootFS.Layers}}')
  echo "base $base_layers layers, image $layers"
  [ "$layers" -eq $((base_layers + 1)) ]
}
check "one layer on the base (binary, plugins and CA bundle stored once)" one_layer_on_the_base

in_image() { podman run --rm --entrypoint "$1" "$image" "${@:2}"; }
check "CA bundle at /etc/ssl/certs/ca-certificates.crt" \
  in_image sh -c 'grep -c "BEGIN CERTIFICATE" /etc/ssl/certs/ca-certificates.crt'
runs_as_65532() { [ "$(podman image inspect "$image" --format '{{.Config.User}}')" = 65532:65532 ]; }
check "runs as 65532:65532" runs_as_65532

glibc_within_the_base() {
  local dir="$work/extract" c
  mkdir -p "$dir"
  c=$(podman create "$image") || return 1
  podman cp "$c:/usr/bin/ccm-host" "$dir/" && podman cp "$c:/usr/lib/ccm-host/plugins" "$dir/"
  podman rm -f "$c" >/dev/null
  glibc_needed=$(objdump -T "$dir/ccm-host" "$dir"/plugins/*.so | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)
  glibc_base=$(in_image sh -c 'ldd --version | head -1' | grep -o '[0-9.]*$')
  echo "binaries need at most $glibc_needed; the base has glibc $glibc_base"
  [ -n "$glibc_needed" ] && [ -n "$glibc_base" ] || return 1
  [ "$(printf '%s\n%s\n' "${glibc_needed#GLIBC_}" "$glibc_base" | sort -V | tail -1)" = "$glibc_base" ]
}
glibc_needed=unknown glibc_base=unknown
check "glibc symbols within the base's glibc" glibc_within_the_base
info "glibc: the binary and plugins need at most $glibc_needed; the base has $glibc_base"

# ---------------------------------------------------------------------------------------------
# Smoke tests under the manifests' security context
# ---------------------------------------------------------------------------------------------
run_secure() { podman run --rm "${secure[@]}" "$@"; }

prints_version() { run_secure "$image" --version | grep -q "ccm-host.* $version"; }
check "--version" prints_version

# The plugin crates of providers/ (package names, e.g. ccm-provider-aws).
expected_plugins() {
  local manifest
  for manifest in providers/*/Cargo.toml; do
    sed -n 's/^name = "\(.*\)"$/\1/p' "$manifest" | head -n 1
  done
}
# The plugins of the `plugins -o json` document on stdin are exactly those named in the
# arguments, each with at least one provider, and no file was refused; prints
# "plugin: provider,..." per plugin.
plugins_listed() {
  python3 -c '
import json, sys
doc = json.load(sys.stdin)
found = {p["pluginName"]: [q["name"] for q in p.get("providers", [])] for p in doc["plugins"]}
missing = [name for name in sys.argv[1:] if not found.get(name)]
extra = sorted(set(found) - set(sys.argv[1:]))
for name in sys.argv[1:]:
    print(name + ": " + ",".join(found.get(name) or ["MISSING"]))
for name in extra:
    print(name + ": NOT EXPECTED (a stale build output?)")
refused = doc.get("refused") or []
for r in refused:
    print("refused: " + json.dumps(r))
sys.exit(1 if missing or extra or refused else 0)' "$@"
}
lists_every_provider() {
  run_secure "$image" plugins -o json | plugins_listed $(expected_plugins)
}
check "plugins lists every plugin of providers/ ($(expected_plugins | sed 's/ccm-provider-//' | tr '\n' ' '))" lists_every_provider

# No system roots at all: the sandbox's own API server is plain HTTP.
run_tool() { podman run --rm "${tool[@]}" "$@"; }
no_roots=(-e SSL_CERT_FILE=/nonexistent -e SSL_CERT_DIR=/nonexistent)
check "sandbox converges (no system CA roots needed)" \
  run_tool "${no_roots[@]}" "$image" sandbox --progress lines

check "check passes on the example provider (no system CA roots needed)" \
  run_tool "${no_roots[@]}" -v "$root/providers/example/example.conf:/etc/ccm-host/example.conf:ro" "$image" \
  check --cloud-provider example --cloud-config /etc/ccm-host/example.conf

# run, with an in-cluster configuration, against an API server over HTTPS.
sa="$work/serviceaccount"
"$bin/kube-apiserver-inmem" --tls --in-cluster-dir "$sa" --port-file "$work/api-port" \
  >"$work/apiserver.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [ -s "$work/api-port" ] && break; sleep 0.1; done
api_port=$(cat "$work/api-port" 2>/dev/null) || abort "kube-apiserver-inmem did not start"
api=https://127.0.0.1:$api_port
api_curl() { curl -sS --fail --cacert "$sa/ca.crt" -H "Authorization: Bearer $(cat "$sa/token")" "$@"; }
# A node waiting for its cloud provider, as the kubelet registers it with --cloud-provider=external.
: >"$work/step.log"
api_curl -X POST -H 'Content-Type: application/json' "$api/api/v1/nodes" -d '{
  "apiVersion": "v1", "kind": "Node", "metadata": {"name": "image-test-node"},
  "spec": {"taints": [{"key": "node.cloudprovider.kubernetes.io/uninitialized", "value": "true", "effect": "NoSchedule"}]}
}' >"$work/step.log" 2>&1 || abort "seeding a node into the HTTPS API server"
secure_port=$(free_port)
echo "autoInstances: true" >"$work/fake.yaml"
run_name=ccm-image-test-run-$$
containers+=("$run_name")
: >"$work/step.log"
podman run -d --name "$run_name" "${secure[@]}" --network host \
  -v "$sa:/var/run/secrets/kubernetes.io/serviceaccount:ro" \
  -v "$work/fake.yaml:/etc/ccm-host/fake.yaml:ro" \
  -e KUBERNETES_SERVICE_HOST=127.0.0.1 -e KUBERNETES_SERVICE_PORT="$api_port" \
  "$image" run --cloud-provider=fake --cloud-config=/etc/ccm-host/fake.yaml \
  --leader-elect=true --configure-cloud-routes=false \
  --bind-address=127.0.0.1 --secure-port="$secure_port" >/dev/null ||
  abort "podman run ... run (in-cluster configuration)"

# As the kubelet probes: HTTPS, certificate not verified, 1 s timeout, until it answers.
probe() {
  local path=$1 i code
  for i in $(seq 60); do
    code=$(curl -sk -m 1 -o "$work/probe.body" -w '%{http_code}' "https://127.0.0.1:$secure_port$path")
    if [ "$code" = 200 ]; then
      echo "$path: 200 $(cat "$work/probe.body") after ~$i probes"
      return 0
    fi
    sleep 1
  done
  echo "$path: last answer $code"
  podman logs --tail 10 "$run_name"
  return 1
}
check "run (in-cluster config, HTTPS API server): /healthz 200 over HTTPS from outside" probe /healthz
check "run (in-cluster config, HTTPS API server): /readyz 200 over HTTPS from outside" probe /readyz
node_initialised() {
  local i node
  for i in $(seq 30); do
    node=$(api_curl "$api/api/v1/nodes/image-test-node")
    if echo "$node" | grep -q '"providerID": *"fake://'; then
      echo "$node" | grep -o '"providerID": *"[^"]*"'
      return 0
    fi
    sleep 1
  done
  echo "$node"
  podman logs --tail 20 "$run_name"
  return 1
}
check "run (in-cluster config, HTTPS API server): the node is initialised" node_initialised
stops_on_sigterm() {
  local t=$SECONDS code
  # The manifests' terminationGracePeriodSeconds is Kubernetes' default, 30 s; podman stop sends
  # SIGTERM and kills after -t seconds.
  podman stop -t 30 "$run_name" >/dev/null
  code=$(podman inspect "$run_name" --format '{{.State.ExitCode}}')
  echo "stopped in $((SECONDS - t)) s, exit code $code"
  podman logs --tail 3 "$run_name"
  [ $((SECONDS - t)) -lt 30 ] && [ "$code" = 0 ]
}
check "run: SIGTERM stops it within the grace period (exit 0)" stops_on_sigterm

# The aws plugin against moto behind TLS (its own CA), from inside the container.
aws_with_ca() {
  CCM_CHECK_IMAGE="$image" CCM_MOTO_TLS=1 CCM_CHECK_MOUNT_CA=1 \
    bash providers/aws/scripts/check-against-moto.sh
}
check "aws plugin: HTTPS calls succeed with the CA mounted at /etc/ssl/certs/ca-certificates.crt" aws_with_ca
aws_without_ca() {
  local out status=0
  out=$(CCM_CHECK_IMAGE="$image" CCM_MOTO_TLS=1 CCM_CHECK_MOUNT_CA=0 \
    bash providers/aws/scripts/check-against-moto.sh 2>&1) || status=$?
  echo "$out" | grep -E 'invalid peer certificate: UnknownIssuer' | head -3
  [ "$status" != 0 ] && echo "$out" | grep -qE 'DescribeInstances: cannot reach https://127\.0\.0\.1:[0-9]+: .*invalid peer certificate: UnknownIssuer'
}
check "aws plugin: without the CA it fails with a line naming the certificate" aws_without_ca

# ---------------------------------------------------------------------------------------------
# A vendor's image from new-provider's crate, outside this repository
# ---------------------------------------------------------------------------------------------
vendor="$work/vendor/acme"
t=$SECONDS
"$bin/ccm-host" new-provider acme --path "$vendor" --with loadbalancer,routes,zones \
  >"$work/step.log" 2>&1 || abort "ccm-host new-provider acme"
# What the vendor does once (the Dockerfile's header says so): write Cargo.lock. Seeded with this
# repository's lock, so the versions are the host's (tested) ones, not whatever is newest today.
cp Cargo.lock "$vendor/Cargo.lock"
(cd "$vendor" && cargo fetch) >"$work/step.log" 2>&1 || abort "cargo fetch in the vendor crate (writes its Cargo.lock)"
vendor_build() {
  ! grep -q "$root" "$vendor/Cargo.toml" || { echo "Cargo.toml names $root"; return 1; }
  podman build -t "$vendor_image" --iidfile "$work/vendor.id" \
    --build-arg RUST_IMAGE="$rust_image" --build-arg HOST_IMAGE="$image" \
    --build-arg CARGO_NET_OFFLINE=true -v "$registry:/usr/local/cargo/registry" "$vendor" &&
    vendor_image=$(cat "$work/vendor.id")
}
check "vendor crate (copied out of the repository) builds its Dockerfile FROM the host image" vendor_build
info "vendor image built in $((SECONDS - t)) s"
vendor_listed() {
  run_secure "$vendor_image" plugins -o json | plugins_listed ccm-provider-acme $(expected_plugins)
}
check "vendor image: plugins lists acme beside the image's own" vendor_listed
check "vendor image: check passes on acme" \
  run_tool -v "$vendor/cloud-config.json:/etc/acme/cloud-config.json:ro" "$vendor_image" \
  check --cloud-provider acme --cloud-config /etc/acme/cloud-config.json

# ---------------------------------------------------------------------------------------------
# Plugins added at deploy time (docs/image.md "Adding plugins at deploy time")
# ---------------------------------------------------------------------------------------------
# An emptyDir as kubelet makes it: 0777, no sticky bit. The init container runs as root with no
# capabilities and copies the vendor's plugin in, then makes the volume root's 0755.
init_copy() {
  local volume=$1 finish=$2
  podman run --rm --user 0:0 --cap-drop=ALL --security-opt no-new-privileges --read-only \
    -v "$volume:/extra-plugins" --entrypoint sh "$vendor_image" -c \
    "cp /usr/lib/ccm-host/plugins/libccm_provider_acme.so /extra-plugins/ && chmod 0644 /extra-plugins/*.so $finish"
}
deploy_time_loads() {
  local volume="$work/emptydir-ok"
  mkdir -m 0777 "$volume" && chmod 0777 "$volume"
  init_copy "$volume" "&& chmod 0755 /extra-plugins" || return 1
  run_secure -v "$volume:/extra-plugins:ro" "$image" \
    plugins --plugin-dir /usr/lib/ccm-host/plugins:/extra-plugins -o json |
    plugins_listed ccm-provider-acme $(expected_plugins)
}
check "deploy-time plugin: init container's copy into a 0777 volume, made 0755, loads" deploy_time_loads
deploy_time_refused() {
  local volume="$work/emptydir-open" out
  mkdir -m 0777 "$volume" && chmod 0777 "$volume"
  init_copy "$volume" "" || return 1
  out=$(run_secure -v "$volume:/extra-plugins:ro" "$image" plugins --plugin-dir /extra-plugins 2>&1)
  echo "$out" | grep -i 'refus'
  ! echo "$out" | grep -q '"acme"\|^  *acme ' && echo "$out" | grep -q 'writable by group or others (mode 777)'
}
check "deploy-time plugin: left in the 0777 volume (replaceable by any user) it is refused" deploy_time_refused

finish
