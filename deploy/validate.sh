#!/usr/bin/env bash
# Validate every manifest offline against the Kubernetes schemas, in strict mode.
set -euo pipefail
cd "$(dirname "$0")"
if ! command -v kubernetes-validate >/dev/null 2>&1; then
  python3 -m pip install --quiet 'kubernetes-validate>=1.33'
fi
kubernetes-validate --strict --kubernetes-version 1.33 \
  serviceaccount.yaml rbac.yaml cloud-config.yaml daemonset.yaml deployment.yaml metal-rbac.yaml
