#!/usr/bin/env bash
# Installs what vmtax needs on a Debian 12 host: Python and the packages vmtax itself uses,
# vmtax in a virtual environment (.venv), then the Debian packages its plugins declare
# (`vmtax list packages`: QEMU, sysbench, fio, OCI runtimes, ...), so a new plugin's
# packages need no edit here. Idempotent and quiet when everything is already there.
# It builds nothing: what vmtax builds from source (the minimal guest kernel, the compile
# workload's kernel tree, the serving tools, gVisor) is built when a plan first needs it.
#   bootstrap.sh          everything (root: installs Debian packages): make test
#   bootstrap.sh --run    what the default plan needs, vmtax without its test tools: make
#                         run (a plan's other plugins get their packages on first use)
#   bootstrap.sh --venv   only .venv, no root, no apt (make test-unit, make lint)
set -euo pipefail
cd "$(dirname "$0")/.."

apt_install() {
  local missing=() installed
  # One dpkg-query for all of them: this runs before every `make run` and `make test`.
  installed=$(dpkg-query -W -f='${Package} ${Status}\n' "$@" 2>/dev/null | awk '/install ok installed/ {print $1}' || true)
  for p in "$@"; do
    grep -qxF "$p" <<< "$installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "bootstrap: installing Debian packages: ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then
    echo "bootstrap: need root to install packages; run: sudo apt-get install ${missing[*]}" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  if [ -z "${APT_UPDATED:-}" ]; then
    apt-get update -qq
    APT_UPDATED=1
  fi
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

venv_only=false run_only=false
[ "${1:-}" = "--venv" ] && venv_only=true
[ "${1:-}" = "--run" ] && run_only=true

# What vmtax's core needs; the tests also check reports in a headless browser.
$venv_only || apt_install python3 python3-venv python3-pip procps
$venv_only || $run_only || apt_install linux-perf chromium fonts-dejavu-core
# Run a command ("$@") with no service started by what it installs (policy-rc.d): vmtax
# starts the programs it needs itself, while a plan uses them (dockerd, lxd, libvirtd).
without_services() {
  local policy=/usr/sbin/policy-rc.d made=false status=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy" && made=true
  fi
  "$@" || status=$?
  $made && rm -f "$policy"
  return $status
}
# Packages whose service must not run on the host because of vmtax: vmtax starts their
# programs itself (sshd for the ssh target's live tests, nginx in E4's instances), or a
# guest carries them (qemu-ga in the libvirt live tests' stand-in for a user's domain), so
# installing them neither starts nor enables the package's own service.
install_without_service() {   # PACKAGE SERVICE
  dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed' && return 0
  without_services apt_install "$1" || return 1
  if command -v systemctl > /dev/null; then systemctl disable "$2" > /dev/null 2>&1 || true; fi
}
if ! $venv_only && ! $run_only; then
  install_without_service openssh-server ssh.service
  install_without_service nginx nginx.service
  install_without_service qemu-guest-agent qemu-guest-agent.service
fi
# Any installed linux-source-X.Y will do for the kernels vmtax builds (VMTAX_LINUX_SOURCE
# picks one of several): the release's own version (`linux-source`) only when none is.
without_linux_source_if_installed() {
  if compgen -G '/usr/src/linux-source-*.tar.xz' > /dev/null; then
    for p in "$@"; do [ "$p" = linux-source ] || echo "$p"; done
  else
    printf '%s\n' "$@"
  fi
}

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "bootstrap: creating .venv"
  "$PY" -m venv .venv
fi
# vmtax alone for `make run`; with its test tools (pytest, mypy, Ray for the fleet's tests)
# otherwise. The stamp says which: one with the test tools serves a `make run` too.
extras="[test]"
$run_only && extras=""
if ! cmp -s pyproject.toml .venv/.pyproject.installed \
    || { [ -n "$extras" ] && [ "$(cat .venv/.extras.installed 2>/dev/null)" != "$extras" ]; }; then
  echo "bootstrap: installing vmtax${extras:+ and its test tools} (pinned) into .venv"
  # --no-compile: Python compiles what it imports when it first does (measured on a fresh
  # venv here: 2 min 23 s with every module compiled, 1 min 29 s without)
  .venv/bin/pip install -q --disable-pip-version-check --no-compile -e ".$extras"
  cp pyproject.toml .venv/.pyproject.installed
  echo "$extras" > .venv/.extras.installed
fi

$venv_only && exit 0
if $run_only; then
  mapfile -t plugin_packages < <(.venv/bin/vmtax list packages --plan default)
else
  mapfile -t plugin_packages < <(without_linux_source_if_installed $(.venv/bin/vmtax list packages))
fi
without_services apt_install "${plugin_packages[@]}"
