#!/usr/bin/env bash
# Installs the Debian 12 packages moetune needs to build, test and run.
# Idempotent: packages already present are skipped. Needs root (or sudo).
set -euo pipefail

pkgs=(
  build-essential cmake pkg-config git
  libsqlite3-dev sqlite3 libcjson-dev libcriterion-dev libffi-dev
  libpcre2-dev libcivetweb-dev
  libamdhip64-dev libamd-comgr-dev
  curl jq
)

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
