#!/usr/bin/env bash
# Render every kustomization (deploy/ itself, the base, each overlay, each example) with
# `kubectl kustomize` and validate the output offline against the Kubernetes schemas in strict
# mode. Then check what a user could deploy by accident: the base (and deploy/ itself) runs no
# provider, only examples/fake runs the fake provider (as a flag, in either spelling, or through
# CCM_CLOUD_PROVIDER), every workload runs ccm-host:v<version of host/Cargo.toml> (never :latest)
# and probes the secure port over HTTPS.
#
# The providers' config files are shipped as *.example (components/*): an overlay does not render
# until the user has copied and filled them in. Here they are rendered from a copy of deploy/
# with the examples in place.
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
cp -r . "$out/deploy"
find "$out/deploy" -name '*.example' | while read -r example; do cp "$example" "${example%.example}"; done

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' ../host/Cargo.toml | head -n 1)
status=0
fail() { echo "error: $*" >&2; status=1; }

# What a rendered kustomization runs, from its workloads' args and env: "provider(s) image
# probes-scheme" lines, one per container.
inspect() {
  python3 -c '
import sys, yaml
for doc in yaml.safe_load_all(open(sys.argv[1])):
    if not doc or doc.get("kind") not in ("DaemonSet", "Deployment", "StatefulSet", "Pod", "Job"):
        continue
    spec = doc["spec"].get("template", {}).get("spec") or doc["spec"]
    for c in spec.get("containers", []) + spec.get("initContainers", []):
        args = list(c.get("command") or []) + list(c.get("args") or [])
        providers = []
        for i, a in enumerate(args):
            if a.startswith("--cloud-provider="):
                providers.append(a.split("=", 1)[1])
            elif a == "--cloud-provider" and i + 1 < len(args):
                providers.append(args[i + 1])
        for e in c.get("env") or []:
            if e.get("name") == "CCM_CLOUD_PROVIDER":
                providers.append(str(e.get("value") or e.get("valueFrom")))
        schemes = [ (c.get(p) or {}).get("httpGet", {}).get("scheme", "HTTP") for p in ("livenessProbe", "readinessProbe")]
        print(",".join(providers) or "-", c.get("image"), ",".join(schemes))
' "$1"
}

kustomizations=(. base)
for dir in overlays/*/ examples/*/; do kustomizations+=("${dir%/}"); done
for k in "${kustomizations[@]}"; do
  name=$(echo "$k" | tr '/.' '__')
  rendered="$out/$name.yaml"
  if ! kubectl kustomize "$out/deploy/$k" >"$rendered" 2>"$out/$name.err"; then
    fail "kubectl kustomize deploy/$k: $(tail -1 "$out/$name.err")"
    continue
  fi
  if ! summary=$(inspect "$rendered"); then
    fail "deploy/$k: cannot read the rendered YAML"
    continue
  fi
  [ -n "$summary" ] || fail "deploy/$k renders no workload"
  providers=$(echo "$summary" | awk '$1 != "-" {print $1}' | sort -u | paste -sd, -)
  case "$k" in
    . | base)
      [ -z "$providers" ] || fail "deploy/$k runs --cloud-provider=$providers: the base must name no provider" ;;
    examples/fake)
      [ "$providers" = fake ] || fail "deploy/$k should run the fake provider, runs '$providers'" ;;
    *)
      [ -n "$providers" ] || fail "deploy/$k names no --cloud-provider"
      if echo ",$providers," | grep -q ',fake,'; then fail "deploy/$k runs the fake provider"; fi ;;
  esac
  if echo "$summary" | awk '{print $2}' | grep -q ':latest$'; then fail "deploy/$k: an image tagged :latest"; fi
  if echo "$summary" | awk '{print $2}' | grep -vq "^ccm-host:v$version\$"; then
    fail "deploy/$k: a container does not run ccm-host:v$version (host/Cargo.toml's version): $(echo "$summary" | awk '{print $2}' | sort -u | paste -sd' ' -)"
  fi
  if echo "$summary" | awk '{print $3}' | grep -vq '^HTTPS,HTTPS$'; then
    fail "deploy/$k: the liveness and readiness probes must use scheme HTTPS (the secure port serves HTTPS only)"
  fi
  echo "rendered deploy/$k: provider ${providers:-none}"
done
# The Deployment variant is in no kustomization (base/kustomization.yaml says how to use it).
cp base/deployment.yaml "$out/deployment-variant.yaml"
variant=$(inspect base/deployment.yaml)
[ "$(echo "$variant" | awk '{print $1}')" = - ] || fail "base/deployment.yaml names a provider"
echo "$variant" | awk '{print $2}' | grep -q "^ccm-host:v$version\$" || fail "base/deployment.yaml does not run ccm-host:v$version"
if grep -nE '^[^#]*:latest' Dockerfile; then fail "Dockerfile: an image tagged :latest"; fi
kubernetes-validate --quiet --strict --kubernetes-version 1.33 "$out"/*.yaml
[ "$status" = 0 ] && echo "manifests: every kustomization renders and validates; only examples/fake runs fake; image tags v$version; HTTPS probes"
exit "$status"
