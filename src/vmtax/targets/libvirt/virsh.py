"""libvirt, reached through virsh: the daemons, one call with a deadline, and the undo of
what vmtax made through it (a domain, a tap lent to libvirt, a directory or an open file in
a guest) and of what libvirtd leaves on the host (its firewall chains; the NAT network
itself is vmtax.targets.libvirt.nat's).

virsh rather than libvirt-python: every call has a deadline of vmtax's own (a libvirtd that
accepts and never answers costs a timeout and one line, not a thread stuck in C), libvirt's
own message is what virsh prints, the guardian undoing a dead vmtax's domain in a fresh
process needs nothing but the binary, and `make deps` compiles nothing against libvirt-dev.
A call costs a process (~20 ms): paid at setup and teardown only, since jobs go over
vmtax's agent socket, never through libvirt.

This host has no systemd, so vmtax starts libvirtd and virtlogd itself where none answers
(vmtax.host.daemon). Where /dev/kvm exists but cannot run a guest (kvm.probe), libvirtd
probes QEMU as root with KVM and then finds /dev/kvm closed to the QEMU user: it calls its
capability cache stale and probes every QEMU binary again on every lookup (80 s per
`virsh create` here). The libvirtd vmtax starts there sees /dev/kvm masked by an empty
root-only file, in a mount namespace of its own, and reads a qemu.conf that is the host's
plus `namespaces = []` (libvirt cannot move that mask into each QEMU's private /dev); the
host's files are left as they are.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

from vmtax.core.errors import VmtaxError
from vmtax.host import daemon, machine, proc
from vmtax.host.daemon import Daemon
from vmtax.host.journal import Journal, undone_by
from vmtax.host.proc import running

DEFAULT_URI = "qemu:///system"
# Where QEMU, run by libvirt as libvirt-qemu, can read what vmtax copies for it (/root is
# closed to that user).
IMAGES = Path("/var/lib/libvirt/images")
# Seconds for one virsh call: a domain's start under a loaded TCG host takes a few.
CALL_TIMEOUT = 60.0
QEMU_CONF = Path("/etc/libvirt/qemu.conf")
RUN_DIR = Path("/run/libvirt")
# Where libvirtd logs each domain's QEMU (one file per name: a transient domain's outlives it).
QEMU_LOGS = Path("/var/log/libvirt/qemu")

VIRTLOGD = Daemon("virtlogd", ("virtlogd",), RUN_DIR / "virtlogd-sock")
LIBVIRTD = Daemon("libvirtd", ("libvirtd",), RUN_DIR / "libvirt-sock", needs=(VIRTLOGD,))
# $1 the private qemu.conf, $2 the mask of /dev/kvm, then libvirtd's argv.
_MASK_KVM = ('mount --bind "$1" /etc/libvirt/qemu.conf && mount --bind "$2" /dev/kvm '
             '&& shift 2 && exec "$@"')


def one_line(text: str) -> str:
    """virsh's message in one line: "error: " prefixes dropped, lines joined."""
    lines = [re.sub(r"^error:\s*", "", line.strip()) for line in text.strip().splitlines()]
    return "; ".join(line for line in lines if line)


class Virsh:
    """virsh on one connection URI; every call has a deadline."""

    def __init__(self, uri: str = DEFAULT_URI, timeout: float | None = None):
        self.uri = uri
        # In a lab (vmtax lab) libvirtd probes QEMU and starts domains under TCG.
        self.timeout = timeout or machine.lab_scaled(CALL_TIMEOUT)

    def argv(self, *args: str) -> list[str]:
        return ["virsh", "--quiet", "-c", self.uri, *args]

    def call(self, *args: str, timeout: float | None = None) -> proc.Completed:
        if shutil.which("virsh") is None:
            raise VmtaxError("virsh is not installed; install libvirt-clients")
        return proc.run(self.argv(*args), timeout=timeout or self.timeout)

    def must(self, *args: str, what: str, timeout: float | None = None) -> str:
        """virsh's stdout; VmtaxError in one line with libvirt's message when it fails or
        does not answer in time."""
        limit = timeout or self.timeout
        done = self.call(*args, timeout=limit)
        if done.timed_out:
            raise VmtaxError(f"{what}: libvirt at {self.uri} did not answer within "
                             f"{limit:g} s")
        if done.exit_code != 0:
            raise VmtaxError(f"{what}: {one_line(done.stderr or done.stdout)}")
        return done.stdout

    # A libvirtd's first answer waits for its QEMU capabilities: probed anew, that took
    # 3.6 min in a lab (lab_scaled: 5 min there).
    def connect(self, who: str = "libvirt", timeout: float = 60.0) -> str:
        """virsh's version lines; VmtaxError naming the URI when it refuses or hangs."""
        return self.must("version", what=f"{who}: uri = {self.uri!r}",
                         timeout=machine.lab_scaled(timeout))


def hugetlbfs_mounted(mounts: Path = Path("/proc/mounts")) -> bool:
    try:
        return any(line.split()[2:3] == ["hugetlbfs"] for line in mounts.read_text().splitlines())
    except OSError:
        return False


def hugetlbfs_hint(size: str = "2M") -> str:
    """What a libvirtd started without a hugetlbfs mount needs: it looks for them only when
    it starts, so one made after (vmtax's own) is never used."""
    return (f"a libvirtd finds hugetlbfs mounts only when it starts: mount one for {size} pages "
            f"before starting it (mount -t hugetlbfs -o pagesize={size} hugetlbfs "
            "/dev/hugepages), then restart it, or stop it and vmtax starts its own")


def kvm_masked() -> bool:
    """Does a libvirtd vmtax starts need /dev/kvm masked (it exists, but runs no guest)?"""
    if not os.path.exists("/dev/kvm"):
        return False
    from vmtax.host import kvm   # probing runs a tiny vCPU: only when asked
    return not kvm.probe().usable


def libvirtd(work_dir: Path, hugetlbfs: tuple[Path, ...] = ()) -> Daemon:
    """The libvirtd vmtax starts when none answers: as it is (it finds hugetlbfs mounts
    itself), or with /dev/kvm masked (see the module's doc) and told where hugetlbfs is,
    from files it writes in work_dir."""
    if not kvm_masked():
        return LIBVIRTD
    work_dir.mkdir(parents=True, exist_ok=True)
    conf = work_dir / "qemu.conf"
    try:
        host_conf = QEMU_CONF.read_text()
    except OSError:
        host_conf = ""
    mounts = (f"hugetlbfs_mount = {json.dumps([str(p) for p in hugetlbfs])}\n"
              if hugetlbfs else "")
    conf.write_text(host_conf + "\n# vmtax: /dev/kvm is masked in this libvirtd's mount "
                    "namespace\nnamespaces = []\n" + mounts)
    mask = work_dir / "no-kvm"
    mask.touch(mode=0o600)
    binary = shutil.which("libvirtd") or "libvirtd"
    return replace(LIBVIRTD, argv=("unshare", "--mount", "--propagation", "slave", "--",
                                   "sh", "-c", _MASK_KVM, "sh", str(conf), str(mask), binary))


def ensure_daemon(journal: Journal, uri: str, work_dir: Path,
                  hugetlbfs: tuple[Path, ...] = ()) -> bool:
    """Start libvirtd (and virtlogd) for a local qemu:///system URI when none answers:
    True if vmtax started it. Other URIs are the user's to run. The firewall chains that
    libvirtd makes with its first network (a NAT target's, of this vmtax or of one sharing
    the daemon) are journaled first, so they are removed after it stops."""
    if uri != DEFAULT_URI:
        return False
    if daemon.answers(LIBVIRTD.socket):
        return False
    if shutil.which("libvirtd") is None:
        raise VmtaxError("libvirtd is not installed; install libvirt-daemon-system")
    if not libvirt_chains():
        journal.add(type="libvirt-firewall-chain", undo=undone_by(remove_chains),
                    dnsmasq_dir=not DNSMASQ_DIR.exists(),
                    tables=sorted(set(IPTABLES_TABLES) - nft_tables()))
    return daemon.ensure(journal, libvirtd(work_dir, hugetlbfs), work_dir / "logs",
                         timeout=machine.lab_scaled(60.0))


def startable() -> str | None:
    """Why vmtax cannot reach or start libvirtd here (None: it can), for doctor and list."""
    for program, package in (("virsh", "libvirt-clients"), ("libvirtd", "libvirt-daemon-system"),
                             ("virtlogd", "libvirt-daemon-system")):
        if shutil.which(program) is None:
            return f"{program} is not installed; install {package}"
    if not daemon.answers(LIBVIRTD.socket) and os.geteuid() != 0:
        return "no libvirtd answers, and starting one needs root"
    return None


# --- undo ---------------------------------------------------------------------------------

def journal_domain(journal: Journal, uri: str, name: str) -> int:
    """Record a domain about to be created; its undo destroys it (a transient domain is
    then gone). Once it runs, `journal.update(token, pid=, start=)` names its QEMU, killed
    if libvirtd cannot destroy it."""
    return journal.add(type="libvirt-domain", undo=undone_by(destroy_domain), uri=uri,
                       name=name)


def destroy_domain(journal: Journal, entry: dict[str, Any]) -> None:
    """Undo of journal_domain: destroy the domain if it is still there (libvirtd first, so
    it has recorded the domain's end before its log is removed), else kill its QEMU; then
    remove the log libvirtd kept of it."""
    name, uri = entry.get("name"), entry.get("uri")
    if not (isinstance(name, str) and re.fullmatch(r"vmtax-[A-Za-z0-9_-]+", name)
            and isinstance(uri, str)):
        return   # only vmtax's own domains are destroyed
    if shutil.which("virsh") is not None:
        try:
            subprocess.run(["virsh", "--quiet", "-c", uri, "destroy", name],
                           capture_output=True, timeout=10)
        except subprocess.TimeoutExpired:
            pass
    pid, start = entry.get("pid"), entry.get("start")
    if isinstance(pid, int) and pid > 1 and isinstance(start, int) and running(pid, start):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if uri == DEFAULT_URI:
        (QEMU_LOGS / f"{name}.log").unlink(missing_ok=True)


def journal_host_tap(journal: Journal, device: str) -> int:
    """Record a tap device about to be moved into the host's network namespace (for
    libvirt to open by name); its undo deletes it there."""
    return journal.add(type="libvirt-tap", undo=undone_by(delete_host_tap), device=device)


def delete_host_tap(journal: Journal, entry: dict[str, Any]) -> None:
    """Undo of journal_host_tap: delete the tap if it is still in the host's namespace."""
    device = entry.get("device")
    if not isinstance(device, str) or not re.fullmatch(r"vt[0-9a-z]{1,10}", device):
        return
    if Path("/sys/class/net", device).exists():
        subprocess.run(["ip", "link", "delete", device], capture_output=True, timeout=30)


def journal_guest_dir(journal: Journal, uri: str, domain: str, path: str) -> int:
    """Record a directory about to be made in a domain's guest through its QEMU guest
    agent; its undo removes it the same way."""
    return journal.add(type="libvirt-guest-dir", undo=undone_by(remove_guest_dir), uri=uri,
                       domain=domain, path=path)


# --- a domain of the user's, as it runs ------------------------------------------------------

def journal_guest_file(journal: Journal, uri: str, domain: str, handle: int) -> int:
    """Record a file the guest agent holds open for vmtax (guest-file-open's handle); its
    undo closes it. Killed mid-copy, vmtax would otherwise leave qemu-ga holding a deleted
    file's blocks on the guest's disk until qemu-ga restarts."""
    return journal.add(type="libvirt-guest-file", undo=undone_by(close_guest_file), uri=uri,
                       domain=domain, handle=handle)


def close_guest_file(journal: Journal, entry: dict[str, Any]) -> None:
    """Undo of journal_guest_file: guest-file-close of the handle."""
    uri, domain, handle = entry.get("uri"), entry.get("domain"), entry.get("handle")
    if not (isinstance(uri, str) and isinstance(domain, str) and type(handle) is int):
        return
    _guest_agent(uri, domain, {"execute": "guest-file-close", "arguments": {"handle": handle}})


def _guest_agent(uri: str, domain: str, command: dict[str, Any]) -> None:
    """One guest agent command of an undo: best effort, within 30 s."""
    if shutil.which("virsh") is None:
        return
    try:
        subprocess.run(["virsh", "--quiet", "-c", uri, "qemu-agent-command", domain,
                        json.dumps(command)], capture_output=True, timeout=30)
    except subprocess.TimeoutExpired:
        pass


def remove_guest_dir(journal: Journal, entry: dict[str, Any]) -> None:
    """Undo of journal_guest_dir: rm -rf the directory vmtax made in the guest."""
    uri, domain, path = entry.get("uri"), entry.get("domain"), entry.get("path")
    if not (isinstance(uri, str) and isinstance(domain, str) and isinstance(path, str)
            and re.fullmatch(r"/[^\s\"']*/\.vmtax-[0-9a-f]{12}", path)):
        return   # only a scratch directory vmtax names
    _guest_agent(uri, domain, {"execute": "guest-exec",
                               "arguments": {"path": "rm", "arg": ["-rf", "--", path]}})


# --- what a libvirtd leaves on the host with its first network -------------------------------
#
# Made once per libvirtd with its first network (a NAT target's: vmtax.targets.libvirt.nat),
# never removed by it: the LIBVIRT_* chains (iptables and ip6tables: filter, nat, mangle)
# with the jumps to them, the tables iptables-nft made for them and /var/lib/libvirt/dnsmasq.
# Those stay with a libvirtd of the user's, which needs them for its next network (without
# them it fails it: "No chain/target/match by that name"); the libvirtd vmtax starts takes
# them with it (ensure_daemon journals them first).

DNSMASQ_DIR = Path("/var/lib/libvirt/dnsmasq")
# (table, built-in chain, libvirt's chain), in the order libvirt 9.0 adds the jumps.
LIBVIRT_JUMPS = (("filter", "INPUT", "LIBVIRT_INP"), ("filter", "OUTPUT", "LIBVIRT_OUT"),
                 ("filter", "FORWARD", "LIBVIRT_FWX"), ("filter", "FORWARD", "LIBVIRT_FWI"),
                 ("filter", "FORWARD", "LIBVIRT_FWO"), ("nat", "POSTROUTING", "LIBVIRT_PRT"),
                 ("mangle", "POSTROUTING", "LIBVIRT_PRT"))
IPTABLES = ("iptables", "ip6tables")
# The nf_tables tables iptables-nft makes for libvirt's chains: "FAMILY NAME".
IPTABLES_TABLES = ("ip filter", "ip nat", "ip mangle", "ip6 filter", "ip6 nat", "ip6 mangle")


def iptables_save(program: str) -> str:
    save = shutil.which(f"{program}-save")
    if save is None:
        return ""
    return subprocess.run([save], capture_output=True, text=True, timeout=30).stdout


def nft_tables() -> set[str]:
    """The nf_tables tables that exist ("ip filter"); all of them where nft is missing (so
    none is taken for vmtax's to remove)."""
    if shutil.which("nft") is None:
        return set(IPTABLES_TABLES)
    done = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True, timeout=30)
    return {line.removeprefix("table ").strip() for line in done.stdout.splitlines()
            if line.startswith("table ")}


def libvirt_chains() -> set[str]:
    """libvirt's chains ("iptables filter LIBVIRT_INP") that exist now."""
    found = set()
    for program in IPTABLES:
        table = ""
        for line in iptables_save(program).splitlines():
            if line.startswith("*"):
                table = line[1:]
            elif line.startswith(":LIBVIRT_"):
                found.add(f"{program} {table} {line[1:].split()[0]}")
    return found


def remove_chains(journal: Journal, entry: dict[str, Any]) -> None:
    """Undo of libvirt's chains, which a libvirtd makes once, with its first network, and
    never removes: gone, with the jumps to them, once that libvirtd has stopped (a running
    one would fail its next network without them) and no rule is left in them."""
    if daemon.answers(LIBVIRTD.socket):
        return   # the libvirtd vmtax started serves another vmtax still: it made them
    if not libvirt_chains():   # it started no network
        _remove_dnsmasq_dir(entry)
        return
    saved = {program: iptables_save(program) for program in IPTABLES}
    if any(re.search(r"^-A LIBVIRT_", text, re.M) for text in saved.values()):
        return   # a libvirt network runs still
    for program in IPTABLES:
        if shutil.which(program) is None:
            continue
        for table, chain, target in LIBVIRT_JUMPS:
            subprocess.run([program, "-w", "-t", table, "-D", chain, "-j", target],
                           capture_output=True, timeout=30)
        for table, _, target in LIBVIRT_JUMPS:
            subprocess.run([program, "-w", "-t", table, "-X", target], capture_output=True,
                           timeout=30)
    # The tables iptables-nft made for them, where no rule or chain of anyone's is left.
    tables = entry.get("tables")
    for table in tables if isinstance(tables, list) and shutil.which("nft") else ():
        family, _, name = str(table).partition(" ")
        if table not in IPTABLES_TABLES:
            continue
        text = iptables_save("iptables" if family == "ip" else "ip6tables")
        body = text.partition(f"*{name}\n")[2].partition("COMMIT")[0]
        if not re.search(r"^(-A |:(?!(PREROUTING|INPUT|FORWARD|OUTPUT|POSTROUTING) ))", body,
                         re.M):
            subprocess.run(["nft", "delete", "table", family, name], capture_output=True,
                           timeout=30)
    _remove_dnsmasq_dir(entry)


def _remove_dnsmasq_dir(entry: dict[str, Any]) -> None:
    if entry.get("dnsmasq_dir") is True:
        with contextlib.suppress(OSError):
            DNSMASQ_DIR.rmdir()   # only when empty
