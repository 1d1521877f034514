#!/usr/bin/env bash
# Installs what vmtax needs on a Debian 12 host: the workload and hypervisor
# packages from Debian, and vmtax itself in a virtual environment (.venv).
# Idempotent and quiet when everything is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

DEBS=(
  qemu-system-x86 qemu-utils sysbench fio busybox-static crun runc
  linux-perf kmod cpio xz-utils e2fsprogs util-linux procps
  python3 python3-venv python3-pip
  chromium fonts-dejavu-core
)
missing=()
for p in "${DEBS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "bootstrap: installing Debian packages: ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then
    echo "bootstrap: need root to install packages; run: sudo apt-get install ${missing[*]}" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "bootstrap: creating .venv"
  "$PY" -m venv .venv
fi
if ! cmp -s pyproject.toml .venv/.pyproject.installed; then
  echo "bootstrap: installing vmtax and its pinned dependencies into .venv"
  .venv/bin/pip install -q --disable-pip-version-check -e '.[test]'
  cp pyproject.toml .venv/.pyproject.installed
fi
