"""An existing machine reached over SSH: a guest of any hypervisor (Xen, VirtualBox,
Hyper-V, a cloud), or a physical server to be the baseline (E3).

The workloads run the host's own programs there (vmtax.guest.remote_bundle), each job in the
target's scratch directory under `workdir`, which vmtax makes and removes (journaled:
also after Ctrl-C, and after a crash by the guardian or the next start). A lost connection
fails the repetition it interrupts; the next job reconnects, with growing waits, and kills
what the lost one left running. `ssh:[USER@]HOST[:PORT]` on the command line is a target
of this kind (with --identity, --known-hosts, --jump, --workdir); a plan's `[targets.NAME]`
with `kind = "ssh"` sets every option, and may name it the `baseline`:

    [targets.bare-metal]
    kind = "ssh"
    host = "bench@10.0.0.2"
    identity = "~/.ssh/bench"
    label = "physical"
"""

from __future__ import annotations

import posixpath
import re
import uuid
from typing import Annotated, Any, Literal

from pydantic import StringConstraints

from vmtax.core import plugin
from vmtax.core.errors import TargetError
from vmtax.core.option_types import LocalPath, NonEmpty
from vmtax.core.plugin import Expect
from vmtax.core.target import Target, TargetContext
from vmtax.core.types import Endpoint, Job, JobResult
from vmtax.guest import remote_bundle
from vmtax.host import ssh_session
from vmtax.host.ssh_session import ConnectionLost, Session, SshConfig, parse_spec

_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]*"
HOST_SPEC = re.compile(rf"(?:{_NAME}@)?{_NAME}(?::[0-9]{{1,5}})?")
HostSpec = Annotated[str, StringConstraints(pattern=rf"^{HOST_SPEC.pattern}$"),
                     Expect('a host like "10.0.0.2", "bench@xen-guest" or "host:2222"')]
AbsPath = Annotated[str, StringConstraints(pattern=r"^/\S*$"),
                    Expect('an absolute remote path like "/var/tmp"')]

# $0 the server's log, then its job argv, whose stdin is this one's: kept in LOG.env (0600)
# only until the detached job has it open, on fd 3 (a detached job's stdin is /dev/null).
DETACH = ('(umask 077 && cat > "$0.env") && exec 3< "$0.env" && rm -f -- "$0.env" '
          '&& { "$@" <&3 3<&- > "$0" 2>&1 & }')
# The fingerprint script: one "@section" line before each part of the answer.
FINGERPRINT = """
echo @machine; uname -m
echo @kernel; uname -r
echo @cores; nproc 2>/dev/null || getconf _NPROCESSORS_ONLN
echo @meminfo; grep -m1 '^MemTotal:' /proc/meminfo
echo @model; grep -m1 '^model name' /proc/cpuinfo
echo @flags; grep -m1 '^flags' /proc/cpuinfo
echo @detect_virt; systemd-detect-virt --vm 2>/dev/null
echo @hypervisor_type; cat /sys/hypervisor/type 2>/dev/null
echo @xen_guest_type; cat /sys/hypervisor/guest_type 2>/dev/null
echo @xen_caps; cat /proc/xen/capabilities 2>/dev/null
echo @clocksources; cat /sys/devices/system/clocksource/*/available_clocksource 2>/dev/null
for f in sys_vendor product_name bios_vendor; do
  echo @dmi_$f; cat /sys/class/dmi/id/$f 2>/dev/null
done
true
"""

# DMI vendor strings -> the names systemd-detect-virt gives those hypervisors. QEMU's
# machines say "QEMU" with or without KVM; only KVM gives the guest its kvm-clock.
DMI_VENDORS = (("qemu", "qemu"), ("kvm", "kvm"), ("xen", "xen"), ("vmware", "vmware"),
               ("innotek", "oracle"), ("virtualbox", "oracle"), ("oracle", "oracle"),
               ("microsoft", "microsoft"), ("amazon ec2", "amazon"), ("google", "google"),
               ("bochs", "bochs"), ("parallels", "parallels"))


def sections(text: str) -> dict[str, str]:
    found: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("@") and " " not in line:
            current = line[1:]
            found[current] = []
        elif current is not None:
            found[current].append(line)
    return {k: "\n".join(v).strip() for k, v in found.items()}


def hypervisor(s: dict[str, str]) -> tuple[str, str]:
    """(hypervisor, how it was found) from the fingerprint script's sections: kvm, xen
    (with PV, HVM or PVH), vmware, oracle, microsoft, ..., or none."""
    xen_type = s.get("xen_guest_type", "")
    if not xen_type and s.get("hypervisor_type") == "xen":
        # Older kernels have no guest_type: only a PV domain lacks the CPUID hypervisor flag.
        xen_type = "HVM" if "hypervisor" in s.get("flags", "").split() else "PV"
    detect = s.get("detect_virt", "")
    if detect:
        found, how = detect, "systemd-detect-virt"
    elif s.get("hypervisor_type"):
        found, how = s["hypervisor_type"], "/sys/hypervisor/type"
    else:
        dmi = " ".join(s.get(f"dmi_{f}", "") for f in ("sys_vendor", "product_name",
                                                       "bios_vendor")).lower()
        vendor = next((name for word, name in DMI_VENDORS if word in dmi), None)
        flagged = "hypervisor" in s.get("flags", "").split()
        if vendor == "qemu" and flagged and "kvm-clock" in s.get("clocksources", "").split():
            found, how = "kvm", "cpuinfo hypervisor flag, DMI vendor and kvm-clock"
        elif vendor and flagged:
            found, how = vendor, "cpuinfo hypervisor flag and DMI vendor"
        elif flagged:
            found, how = "unknown", "cpuinfo hypervisor flag"
        else:
            found, how = "none", "no cpuinfo hypervisor flag"
    if found == "xen" and xen_type:
        found = f"xen ({xen_type})"
    return found, how


def describe(text: str) -> dict[str, Any]:
    """The fingerprint fields of a remote from its fingerprint script's output."""
    s = sections(text)
    mem = s.get("meminfo", "").split()
    name, how = hypervisor(s)
    return {"kernel": s.get("kernel", ""), "machine": s.get("machine", ""),
            "cpu_model": s.get("model", "").partition(":")[2].strip(),
            "cpu_flags": s.get("flags", "").partition(":")[2].strip(),
            "cores": int(s["cores"]) if s.get("cores", "").isdigit() else None,
            "memory_kib": int(mem[1]) if len(mem) > 1 and mem[1].isdigit() else None,
            "hypervisor": name, "hypervisor_source": how,
            "dmi": {f: s[f"dmi_{f}"] for f in ("sys_vendor", "product_name", "bios_vendor")
                    if s.get(f"dmi_{f}")}}


class _Hosts(dict[str, "str | None"]):
    """ssh's variants: every `[USER@]HOST[:PORT]` (ssh:bench@10.0.0.2), none listed."""

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and HOST_SPEC.fullmatch(key) is not None


class SshOptions(plugin.Options):
    host: HostSpec | None = plugin.option(
        None, "The machine: [USER@]HOST[:PORT] (user and port may also be set on their own)")
    port: int | None = plugin.option(None, "SSH port (default 22)", ge=1, le=65535)
    user: NonEmpty | None = plugin.option(None, "Remote user (default: the current one)")
    identity: LocalPath | None = plugin.option(
        None, "Private key file; none: the SSH agent and ~/.ssh keys", cli=True)
    known_hosts: LocalPath = plugin.option(
        "~/.ssh/known_hosts", "Known hosts file the host key must be in", cli=True)
    host_key_check: Literal["strict", "accept-new"] = plugin.option(
        "strict", "strict: the host key must be known; accept-new: an unknown one is "
        "trusted and added to known_hosts (a changed one is still refused)")
    jump: HostSpec | None = plugin.option(
        None, "Jump host [USER@]HOST[:PORT] reached first (same key and known_hosts)",
        cli=True)
    workdir: AbsPath = plugin.option(
        "/var/tmp", "Remote directory on a real disk where vmtax makes its scratch "
        "directory and bundle (both removed at the end)", cli=True)
    sudo: bool = plugin.option(False, "Run the workloads as root through sudo -n")
    label: NonEmpty | None = plugin.option(
        None, 'What the machine is, shown with results (e.g. "xen-pv")')

    def problems(self) -> list[tuple[str, str]]:
        if self.host is None:
            return [("host", "the machine to reach, [USER@]HOST[:PORT]")]
        user, _, port = parse_spec(self.host)
        problems = []
        if user and self.user and user != self.user:
            problems.append(("user", f"the user in host ({user}) or no user option"))
        if port is not None and self.port is not None and port != self.port:
            problems.append(("port", f"the port in host ({port}) or no port option"))
        if port is not None and not 1 <= port <= 65535:
            problems.append(("host", "a port from 1 to 65535"))
        return problems


class SshTarget(Target):
    name = "ssh"
    description = ("An existing machine over SSH (a guest of any hypervisor, or a physical "
                   "baseline), running the host's own programs")
    Options = SshOptions
    variant_option = "host"
    startup_seconds = 2.0
    remote = True

    def __init__(self, name: str, options: plugin.Options, ctx: TargetContext):
        super().__init__(name, options, ctx)
        o: SshOptions = options  # type: ignore[assignment]
        assert o.host is not None   # SshOptions.problems
        user, host, port = parse_spec(o.host)
        self.config = SshConfig(host=host, port=port or o.port or 22, user=user or o.user,
                                identity=o.identity, known_hosts=o.known_hosts,
                                host_key_check=o.host_key_check, jump=o.jump, sudo=o.sudo)
        self.session = Session(self.config)
        self.bundle: remote_bundle.Bundle | None = None
        self.bundle_dir: str | None = None
        self.scratch: str | None = None
        self._token: int | None = None
        self._facts: dict[str, Any] = {}
        self._lost = False     # the connection broke: reconnect before the next job
        self._dead: str | None = None   # reconnecting failed: why

    @classmethod
    def variants(cls) -> dict[str, str | None]:
        return _Hosts()

    # -- lifecycle -------------------------------------------------------------------------

    def prepare(self) -> None:
        o: SshOptions = self.options  # type: ignore[assignment]
        if self.ctx.trees:
            raise TargetError(f"{self.name}: ssh targets cannot carry read-only trees yet "
                              f"({', '.join(map(str, self.ctx.trees))}, the compile workload's)")
        self._dead, self._lost = None, False
        self.bundle = remote_bundle.make(self.ctx.binaries)
        self.session.connect()
        self._facts = describe(self.session.check(["sh", "-c", FINGERPRINT], "fingerprinting"))
        remote_bundle.check_arch(self._facts["machine"], f"ssh {self.config.where}")
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", self.name)   # ssh:root@host is a name too
        scratch = posixpath.join(o.workdir, f".vmtax-{safe}-{uuid.uuid4().hex[:12]}")
        self._token = self.ctx.journal.add(type="remote", ssh=self.config.to_json(),
                                           path=scratch, jobs=True)
        self.session.check(["mkdir", "-p", "--", scratch], f"making {scratch}")
        self.scratch = scratch
        self.bundle_dir = remote_bundle.install(self.session, self.bundle, o.workdir,
                                                self.ctx.journal)

    def _reconnect(self) -> None:
        """After a lost connection: connect again and kill what the broken one left."""
        try:
            self.session.reconnect()
            if self.scratch:
                self.session.check(self.session.kill_argv(self.scratch),
                                   "killing the interrupted job")
            self._lost = False
        except TargetError as exc:
            self._dead = str(exc)

    def run(self, job: Job) -> JobResult:
        if self._lost:
            self._reconnect()
        if self._dead is not None or self.scratch is None or self.bundle is None:
            return JobResult(None, "", f"{self.name}: {self._dead or 'not prepared'}", 0.0)
        cwd = self.scratch if job.in_scratch else "/"
        argv, stdin = self.session.job_argv(self.bundle.argv(str(self.bundle_dir), job.argv),
                                            job.env, cwd, posixpath.join(self.scratch, "job.pid"))
        try:
            done = self.session.run(argv, timeout=job.timeout,
                                    on_timeout=self.session.kill_argv(self.scratch), stdin=stdin)
        except ConnectionLost as exc:
            self._lost = True
            return JobResult(None, "", str(exc), 0.0)
        return JobResult(done.exit_code, done.stdout, done.stderr, done.elapsed,
                         guest_elapsed=None, timed_out=done.timed_out)

    def alive(self) -> bool:
        return self._dead is None

    def start_server(self, job: Job, port: int) -> Endpoint:
        if self.scratch is None or self.bundle is None:
            raise TargetError(f"{self.name}: not prepared")
        cwd = self.scratch if job.in_scratch else "/"
        pid_file = posixpath.join(self.scratch, f"server-{port}.pid")
        argv, stdin = self.session.job_argv(self.bundle.argv(str(self.bundle_dir), job.argv),
                                            job.env, cwd, pid_file)
        # Detached: nohup-like, its output to a log in the scratch directory. The values
        # (the wrapper's stdin) are read whole first, into a file only the user can read,
        # removed once it is open: the channel may close before a detached reader is done.
        log = posixpath.join(self.scratch, f"server-{port}.log")
        self.session.check(["sh", "-c", DETACH, log, *argv],
                           f"starting the server on port {port}", stdin=stdin)
        return Endpoint(self.config.host, port, [], handle=pid_file)

    def stop_server(self, endpoint: Endpoint) -> None:
        if self.session.connected:
            self.session.check(self.session.kill_argv(str(endpoint.handle)),
                               "stopping the server")

    def cleanup(self) -> None:
        o: SshOptions = self.options  # type: ignore[assignment]
        try:
            if self._token is None and self.bundle_dir is None:
                return
            if not self.session.connected:
                self.session.connect()
            if self.scratch is not None and self._token is not None:
                ssh_session.remove(self.session, self.scratch, jobs=True)
                self.ctx.journal.forget(self._token)
        except TargetError as exc:
            # Left in the journal: its undo at the end of the run tries again.
            self.warnings.append(f"cleanup: {exc}")
        finally:
            if self.bundle is not None and self.bundle_dir is not None:
                remote_bundle.release(self.session, self.bundle, o.workdir, self.ctx.journal)
            self.scratch = self.bundle_dir = None
            self._token = None
            self.session.close()

    def fingerprint(self) -> dict[str, Any]:
        o: SshOptions = self.options  # type: ignore[assignment]
        return {"kind": self.kind, "label": o.label, "host": self.config.host,
                "port": self.config.port, "user": self.config.user, "jump": o.jump,
                "sudo": o.sudo, "workdir": o.workdir,
                "bundle": self.bundle.digest[:16] if self.bundle else None, **self._facts}
