"""An ssh target that is a real guest: OpenSSH's sshd, carried into a TCG guest as one of
its `binaries`, reached over QEMU's user-mode network through a port forwarded from the
host's loopback. Host and client keys are made on the host by the test and written into
the guest by jobs; the fingerprint vmtax takes over ssh must then name a hypervisor."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest
from conftest import vmtax, wait_for

from vmtax.core import target as targets
from vmtax.core.target import Job, TargetContext
from vmtax.host.journal import Journal
from vmtax.report import parts
from vmtax.results.store import Store

SSHD = "/usr/sbin/sshd"
pytestmark = [
    pytest.mark.live,
    pytest.mark.skipif(not os.path.exists(SSHD),
                       reason="sshd is missing (scripts/bootstrap.sh installs openssh-server)"),
]

WORKDIR = "/var/tmp"   # the ssh target's default: on the guest's rootfs, in RAM
# Debian's OpenSSH 9.2 refuses to start without its privilege separation user and its
# (root-owned, not group/world writable) chroot directory /run/sshd. Root's shell is
# busybox's sh, whose applets (sha256sum among them) vmtax's remote commands must work with.
PASSWD = ("root:x:0:0:root:/root:/bin/sh\n"
          "sshd:x:101:65534::/run/sshd:/usr/sbin/nologin\n")
SSHD_CONFIG = textwrap.dedent("""\
    HostKey /etc/ssh/host_key
    AuthorizedKeysFile /etc/ssh/authorized_keys
    PidFile none
    PermitRootLogin prohibit-password
    PasswordAuthentication no
    KbdInteractiveAuthentication no
    UsePAM no
    StrictModes no
    Subsystem sftp internal-sftp
    """)


def must(guest, argv: list[str]) -> str:
    done = guest.run(Job(argv, timeout=60))
    assert done.ok, (argv, done.stderr)
    return done.stdout


def write(guest, path: str, text: str, mode: str = "644") -> None:
    """A file in the guest, its text passed as an argument: no host shell involved."""
    must(guest, ["sh", "-c", 'printf %s "$1" > "$2" && chmod "$3" "$2"', "write", text, path,
                 mode])


def keygen(path: Path) -> list[str]:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)],
                   check=True, capture_output=True, timeout=30)
    return Path(f"{path}.pub").read_text().split()[:2]


def remote_jobs(guest) -> list[str]:
    """Processes in the guest that vmtax's ssh sessions made: the sessions themselves
    (sshd's per-connection children, not its listener) and anything running from the
    remote workdir (the bundle's programs, the job wrapper with its pid file there)."""
    out = must(guest, ["ps", "-o", "pid,args"])
    return [line for line in out.splitlines()[1:]
            if WORKDIR in line or ("sshd:" in line and "[listener]" not in line)]


@pytest.fixture
def guest(tmp_path):
    (tmp_path / "journal").mkdir()
    (tmp_path / "work").mkdir()
    ctx = TargetContext(work_dir=tmp_path / "work", journal=Journal(tmp_path / "journal"))
    # q35: a guest with SMBIOS, so that DMI names QEMU.
    target = targets.create("vm:tcg", "vm", {
        "accel": "tcg", "machine": "q35", "network": "user",
        "binaries": ["sshd"]}, ctx)
    try:
        target.prepare()
        yield target
    finally:
        target.cleanup()


def test_sshd_in_a_tcg_guest_is_an_ssh_target_whose_fingerprint_names_the_hypervisor(
        guest, tmp_path):
    client = tmp_path / "id_ed25519"
    client_pub, host_pub = keygen(client), keygen(tmp_path / "host_key")
    must(guest, ["mkdir", "-p", "-m", "755", "/etc/ssh", "/run/sshd"])
    write(guest, "/etc/passwd", PASSWD)
    write(guest, "/etc/ssh/host_key", (tmp_path / "host_key").read_text(), "600")
    write(guest, "/etc/ssh/authorized_keys", " ".join(client_pub) + "\n")
    write(guest, "/etc/ssh/sshd_config", SSHD_CONFIG)
    endpoint = guest.start_server(Job([SSHD, "-D", "-e", "-f", "/etc/ssh/sshd_config"],
                                      timeout=60), 22)
    try:
        assert endpoint.address == "127.0.0.1"
        known_hosts = tmp_path / "known_hosts"
        known_hosts.write_text(f"[127.0.0.1]:{endpoint.port} {' '.join(host_pub)}\n")
        plan = tmp_path / "plan.toml"
        plan.write_text(textwrap.dedent(f"""\
            runs = 1
            warmup = 0
            time = 1
            [targets.guest]
            kind = "ssh"
            host = "root@127.0.0.1:{endpoint.port}"
            identity = "{client}"
            known_hosts = "{known_hosts}"
            label = "tcg-guest"
            [[workloads]]
            name = "cpu"
            """))
        results = tmp_path / "results"
        ran = vmtax("run", str(plan), "--results", str(results), "--json", timeout=240)
        assert ran.returncode == 0, ran.stderr
        shown = json.loads(ran.stdout)
        fp = shown["run"]["targets"]["guest"]["fingerprint"]
        assert fp["kernel"] == must(guest, ["uname", "-r"]).strip()   # the guest's own
        assert "hypervisor" in fp["cpu_flags"].split()
        assert fp["hypervisor"] == "qemu", fp
        assert "DMI" in fp["hypervisor_source"] and fp["dmi"]["sys_vendor"] == "QEMU"
        assert fp["label"] == "tcg-guest" and fp["bundle"]
        summary = shown["summary"]
        assert not summary["failures"], summary["failures"]
        row = next(r for r in summary["rows"] if r["workload"] == "cpu")
        assert row["cells"]["guest"]["n"] == 1, row
        # Stored: the fingerprint vmtax took over ssh and the measured repetition.
        store = Store(results, readonly=True)
        run = store.load_run("last")
        store.close()
        assert run.targets["guest"]["fingerprint"]["hypervisor"] == "qemu"
        assert [(r.target, r.status) for r in run.reps if r.phase == "measure"] == \
            [("guest", "ok")]
        assert parts.target_label(run, "guest") == "guest (tcg-guest, qemu)"
        # Nothing of vmtax's is left in the guest: no files in its workdir, no processes.
        assert wait_for(lambda: not must(guest, ["ls", "-A", WORKDIR]).strip()
                        and not remote_jobs(guest), 20, 0.5), \
            (must(guest, ["ls", "-A", WORKDIR]), remote_jobs(guest))
    finally:
        guest.stop_server(endpoint)
