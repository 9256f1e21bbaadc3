#!/usr/bin/env bash
# Installs moto (the AWS emulator the aws provider's tests run against), pinned, into a
# virtualenv that is reused while it holds the pinned version, and prints the path of its
# moto_server. Used by .ci/run and check-against-moto.sh.
#
#   bash providers/aws/scripts/install-moto.sh [VENV]     (default: target/moto-venv)
#
# The tests find moto_server through $CCM_MOTO_SERVER, else target/moto-venv/bin/moto_server.
set -euo pipefail
MOTO_VERSION=5.2.5
root="$(cd "$(dirname "$0")/../../.." && pwd)"
venv="${1:-${CCM_MOTO_VENV:-$root/target/moto-venv}}"

if [ -x "$venv/bin/moto_server" ] &&
  "$venv/bin/python" -c "import moto, sys; sys.exit(moto.__version__ != '$MOTO_VERSION')" 2>/dev/null; then
  echo "$venv/bin/moto_server"
  exit 0
fi
if ! command -v python3 >/dev/null 2>&1; then
  echo "install-moto: python3 is needed to install moto (the aws provider's tests run against it)" >&2
  exit 1
fi
echo "install-moto: installing moto[server]==$MOTO_VERSION into $venv" >&2
python3 -m venv "$venv" >&2
"$venv/bin/pip" install --quiet --disable-pip-version-check "moto[server]==$MOTO_VERSION" >&2
echo "$venv/bin/moto_server"
