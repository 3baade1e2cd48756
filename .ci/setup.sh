#!/usr/bin/env bash
# setup.sh: installs xtc's build and test dependencies from Debian 12 packages when missing.
# Needs root (or sudo) only when something is missing.
set -euo pipefail
# python3-packaging, -loguru, -frozendict: x-transformers 1.29.2 / 2.26.4 for
# tests/parity_newer/make_cases.py (the committed cases need none of them)
pkgs="cmake make gcc pkg-config flex bison check llvm-19-dev python3 python3-torch python3-numpy
  clang-14 libclang-rt-14-dev libopenmpi-dev openmpi-bin python3-packaging python3-loguru
  python3-frozendict"
missing=""
for p in $pkgs; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "setup: installing$missing"
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
echo "setup: dependencies present"
