#!/usr/bin/env bash
# Installs the Debian 12 packages moetune needs to build, test and run
# (clang-19 also serves CI's second compiler build; Open MPI runs the
# multi-rank collectives and their test).
# Idempotent and silent when everything is present: one dpkg-query, no
# apt-get update, no output. Otherwise installs only what is missing, and
# refreshes the package lists only when apt cannot find a package without
# them. Needs root (or sudo) only then.
set -euo pipefail

pkgs=(
  build-essential cmake pkg-config git
  libsqlite3-dev sqlite3 libcjson-dev libcriterion-dev libffi-dev
  libpcre2-dev libcivetweb-dev
  libamdhip64-dev libamd-comgr-dev
  clang-19 lld-19 llvm-19 rocm-device-libs
  curl jq
  libopenmpi-dev openmpi-bin
)
# The OpenAI-client test (test_serve_agent) runs the official npm client:
# Debian's node where the machine has none of its own.
command -v node >/dev/null 2>&1 || pkgs+=(nodejs)
command -v npm >/dev/null 2>&1 || pkgs+=(npm)

if ! command -v dpkg-query >/dev/null 2>&1; then
  echo "install-deps: not a Debian system (no dpkg-query); install the equivalents of:" \
       "${pkgs[*]}" >&2
  exit 0
fi

# One query for all: "name status" per installed-or-known package.
declare -A state=()
while read -r name status; do
  state[$name]=$status
done < <(dpkg-query -W -f='${Package} ${db:Status-Status}\n' "${pkgs[@]}" 2>/dev/null || true)
missing=()
for p in "${pkgs[@]}"; do
  [ "${state[$p]:-}" = installed ] || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || {
    echo "install-deps: missing ${missing[*]}; run as root or install sudo" >&2
    exit 1
  }
  SUDO="sudo"
fi
echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt_install() {
  $SUDO apt-get install -y -qq --no-install-recommends -o DPkg::Lock::Timeout=300 "$@"
}
# Fresh lists are only needed when apt does not know a package (or a
# version it knows is gone from the mirror): try without them first.
if ! apt_install "${missing[@]}" >/dev/null 2>&1; then
  $SUDO apt-get update -qq -o DPkg::Lock::Timeout=300
  apt_install "${missing[@]}" >/dev/null
fi
