# shellcheck shell=bash
# Source this file (`. deploy/podman-env.sh`) before calling podman from the project's scripts and
# tests. It checks that podman and runc are installed (else it prints the command that installs
# them and fails), and exports CONTAINERS_CONF pointing at a private containers.conf under
# target/podman/, so no system file is changed. The two settings it carries are the ones machines
# like ours need (measured; docs/image.md "Container runtime"):
#   runtime = "runc"   Debian 12's default crun 1.8 fails with "cgroups in hybrid mode not supported";
#   default_ulimits    podman's defaults exceed the hard rlimits of a root without CAP_SYS_RESOURCE
#                      ("setrlimit RLIMIT_NOFILE: Operation not permitted"), so they are clamped to
#                      this shell's hard limits (nproc at most 32768, above which runc failed).
ccm_podman_env() {
  local missing=() tool
  for tool in podman runc; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "error: ${missing[*]} not found: install the container runtime with" \
      "'apt-get update && apt-get install -y podman runc debootstrap' (as root)" >&2
    return 1
  fi
  local root dir nofile nproc
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  dir="$root/target/podman"
  mkdir -p "$dir"
  nofile=$(ulimit -Hn)
  [ "$nofile" = unlimited ] && nofile=1048576
  [ "$nofile" -gt 1048576 ] && nofile=1048576
  nproc=$(ulimit -Hu)
  if [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ]; then nproc=32768; fi
  cat >"$dir/containers.conf.new" <<CONF
# Written by deploy/podman-env.sh; see the comment there.
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
[engine]
runtime = "runc"
CONF
  mv "$dir/containers.conf.new" "$dir/containers.conf"
  export CONTAINERS_CONF="$dir/containers.conf"
}
ccm_podman_env
