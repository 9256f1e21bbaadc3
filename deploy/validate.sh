#!/usr/bin/env bash
# Validate every manifest offline against the Kubernetes schemas, in strict mode, and check the
# image tag scheme: ccm-host:v<version of host/Cargo.toml> everywhere, never :latest.
set -euo pipefail
cd "$(dirname "$0")"
if ! command -v kubernetes-validate >/dev/null 2>&1; then
  python3 -m pip install --quiet 'kubernetes-validate>=1.33'
fi
kubernetes-validate --strict --kubernetes-version 1.33 \
  serviceaccount.yaml rbac.yaml cloud-config.yaml daemonset.yaml deployment.yaml metal-rbac.yaml

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' ../host/Cargo.toml | head -n 1)
status=0
if grep -nE '^[^#]*:latest' ./*.yaml Dockerfile; then
  echo "error: an image tagged :latest (use ccm-host:v$version)" >&2
  status=1
fi
for f in daemonset.yaml deployment.yaml; do
  if ! grep -q "image: ccm-host:v$version\$" "$f"; then
    echo "error: $f does not run ccm-host:v$version (host/Cargo.toml's version)" >&2
    status=1
  fi
done
if ! grep -q "newTag: v$version\$" kustomization.yaml; then
  echo "error: kustomization.yaml's newTag is not v$version" >&2
  status=1
fi
for probe in livenessProbe readinessProbe; do
  for f in daemonset.yaml deployment.yaml; do
    if ! grep -A4 "$probe:" "$f" | grep -q 'scheme: HTTPS'; then
      echo "error: $f: the $probe must use scheme HTTPS (the secure port serves HTTPS only)" >&2
      status=1
    fi
  done
done
[ "$status" = 0 ] && echo "image tags v$version and HTTPS probes: ok"
exit "$status"
