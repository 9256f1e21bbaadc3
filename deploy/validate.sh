#!/usr/bin/env bash
# Render every kustomization (the base, each overlay, the fake example) with `kubectl kustomize`
# and validate the output offline against the Kubernetes schemas in strict mode. Then check what
# a user could deploy by accident: the base (and deploy/ itself) runs no provider, only
# examples/fake runs the fake provider, every workload runs ccm-host:v<version of
# host/Cargo.toml> (never :latest) and probes the secure port over HTTPS.
set -euo pipefail
cd "$(dirname "$0")"
if ! command -v kubectl >/dev/null 2>&1; then
  echo "error: kubectl not found: it renders the kustomizations (kubectl kustomize); install kubectl" \
    "from your distribution or Kubernetes' release packages" >&2
  exit 1
fi
if ! command -v kubernetes-validate >/dev/null 2>&1; then
  python3 -m pip install --quiet 'kubernetes-validate>=1.33'
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' ../host/Cargo.toml | head -n 1)
status=0
fail() { echo "error: $*" >&2; status=1; }

kustomizations=(. base overlays/aws overlays/metal overlays/aws-metal examples/fake)
for k in "${kustomizations[@]}"; do
  name=$(echo "$k" | tr '/.' '__')
  if ! kubectl kustomize "$k" >"$out/$name.yaml" 2>"$out/$name.err"; then
    fail "kubectl kustomize deploy/$k: $(tail -1 "$out/$name.err")"
    continue
  fi
  rendered="$out/$name.yaml"
  providers=$(sed -n 's/^ *- --cloud-provider=\(.*\)$/\1/p' "$rendered")
  case "$k" in
    . | base)
      [ -z "$providers" ] || fail "deploy/$k runs --cloud-provider=$providers: the base must name no provider" ;;
    examples/fake)
      [ "$providers" = fake ] || fail "deploy/$k should run the fake provider, runs '$providers'" ;;
    *)
      [ -n "$providers" ] || fail "deploy/$k names no --cloud-provider"
      if echo ",$providers," | grep -q ',fake,'; then fail "deploy/$k runs the fake provider"; fi ;;
  esac
  if grep -nE '^[^#]*image: .*:latest' "$rendered"; then fail "deploy/$k: an image tagged :latest"; fi
  if ! grep -q "image: ccm-host:v$version\$" "$rendered"; then
    fail "deploy/$k does not run ccm-host:v$version (host/Cargo.toml's version)"
  fi
  for probe in livenessProbe readinessProbe; do
    if ! grep -A4 "$probe:" "$rendered" | grep -q 'scheme: HTTPS'; then
      fail "deploy/$k: the $probe must use scheme HTTPS (the secure port serves HTTPS only)"
    fi
  done
  echo "rendered deploy/$k: provider ${providers:-none}"
done
# The Deployment variant is not in any kustomization (base/kustomization.yaml says how to use it).
cp base/deployment.yaml "$out/deployment-variant.yaml"
grep -q "image: ccm-host:v$version\$" base/deployment.yaml || fail "base/deployment.yaml does not run ccm-host:v$version"
if grep -qE -- '^ *- --cloud-provider' base/deployment.yaml; then fail "base/deployment.yaml names a provider"; fi
if grep -nE '^[^#]*:latest' Dockerfile; then fail "Dockerfile: an image tagged :latest"; fi
kubernetes-validate --quiet --strict --kubernetes-version 1.33 "$out"/*.yaml
[ "$status" = 0 ] && echo "manifests: every kustomization renders and validates; only examples/fake runs fake; image tags v$version; HTTPS probes"
exit "$status"
