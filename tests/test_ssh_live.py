"""ssh targets against a real OpenSSH server that the test starts in a network namespace
of its own (veth to the host, addresses on this machine only), with generated host and
client keys and a known_hosts file naming the server's key."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from conftest import start_vmtax, vmtax, wait_for

from vmtax.core import workload as workloads
from vmtax.core.target import TargetContext
from vmtax.core.target import create as create_target
from vmtax.core.types import Job
from vmtax.host import journal as journal_mod
from vmtax.host import proc, ssh_session

SSHD = "/usr/sbin/sshd"
pytestmark = [
    pytest.mark.live,
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root"),
    pytest.mark.skipif(not os.path.exists(SSHD),
                       reason="sshd is missing (scripts/bootstrap.sh installs openssh-server)"),
]


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=30)


class Sshd:
    """sshd -D in a fresh network namespace, reachable from the host at self.address."""

    def __init__(self, base: Path, sftp: bool = True):
        self.sftp = sftp   # False: no SFTP subsystem, as dropbear or a minimal sshd
        tag = secrets.token_hex(3)
        self.ns, self.veth = f"vmtax-sshd-{tag}", f"vsh{tag}"
        # Outside vmtax's own pools (10.213/16 networks, 10.214/16 docker, 10.200/13
        # libvirt NAT): a vmtax network at the same address once answered for this sshd.
        octet = int(tag[:2], 16)
        self.host_address, self.address = f"10.220.{octet}.1", f"10.220.{octet}.2"
        self.dir = base / "sshd"
        self.dir.mkdir()
        self.workdir = base / "remote"   # the remote's workdir: same filesystem, own netns
        self.workdir.mkdir()
        self.key = self.dir / "id_ed25519"
        self.known_hosts = self.dir / "known_hosts"
        self.server: subprocess.Popen | None = None
        self._made_run_sshd = False

    def start(self) -> "Sshd":
        for key in (self.dir / "host_key", self.key):
            _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key))
        shutil.copy(f"{self.key}.pub", self.dir / "authorized_keys")
        host_pub = (self.dir / "host_key.pub").read_text().split()
        self.known_hosts.write_text(f"{self.address} {host_pub[0]} {host_pub[1]}\n")
        (self.dir / "sshd_config").write_text(textwrap.dedent(f"""\
            ListenAddress {self.address}
            HostKey {self.dir}/host_key
            AuthorizedKeysFile {self.dir}/authorized_keys
            PidFile {self.dir}/sshd.pid
            PermitRootLogin prohibit-password
            PasswordAuthentication no
            KbdInteractiveAuthentication no
            UsePAM no
            StrictModes no
            """) + ("Subsystem sftp internal-sftp\n" if self.sftp else ""))
        # sshd's privilege separation directory (Debian's init script makes it at boot).
        if not os.path.isdir("/run/sshd"):
            os.mkdir("/run/sshd", 0o755)
            self._made_run_sshd = True
        _run("ip", "netns", "add", self.ns)
        _run("ip", "link", "add", self.veth, "type", "veth", "peer", "name", f"{self.veth}p")
        _run("ip", "link", "set", f"{self.veth}p", "netns", self.ns)
        _run("ip", "addr", "add", f"{self.host_address}/30", "dev", self.veth)
        _run("ip", "link", "set", self.veth, "up")
        for args in (["addr", "add", f"{self.address}/30", "dev", f"{self.veth}p"],
                     ["link", "set", f"{self.veth}p", "up"], ["link", "set", "lo", "up"]):
            _run("ip", "-n", self.ns, *args)
        # A clean remote: root's ~/.bashrc here (pyenv) costs ~0.3 s per command, as bash
        # reads it for ssh commands; hidden in the mount namespace `ip netns exec` makes.
        hide = 'if [ -f "$HOME/.bashrc" ]; then mount --bind /dev/null "$HOME/.bashrc"; fi; ' \
               'exec "$0" "$@"'
        self.server = proc.spawn(["ip", "netns", "exec", self.ns, "sh", "-c", hide, SSHD,
                                  "-D", "-e", "-f", str(self.dir / "sshd_config")],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        assert wait_for(self.listening, 30, 0.1), "sshd did not start listening"
        return self

    def listening(self) -> bool:
        out = subprocess.run(["ip", "netns", "exec", self.ns, "ss", "-Hltn"],
                             capture_output=True, text=True, timeout=30).stdout
        return f"{self.address}:22" in out

    def pids(self) -> list[int]:
        """Every process in the namespace: sshd, its session children, remote jobs."""
        out = subprocess.run(["ip", "netns", "pids", self.ns], capture_output=True,
                             text=True, timeout=30).stdout
        return [int(p) for p in out.split()]

    def _cmdlines(self) -> dict[int, str]:
        found = {}
        for pid in self.pids():
            try:
                found[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ") \
                    .decode(errors="replace")
            except OSError:   # gone meanwhile
                continue
        return found

    def jobs(self) -> list[str]:
        """Command lines of remote processes other than sshd itself."""
        return [cmd for cmd in self._cmdlines().values()
                if cmd and not cmd.startswith(("sshd", SSHD))]

    def sessions(self) -> list[int]:
        """sshd's per-connection children (`sshd: root@notty`), not the listener."""
        return [pid for pid, cmd in self._cmdlines().items()
                if cmd.startswith("sshd:") and "[listener]" not in cmd]

    def options(self, **extra) -> dict:
        return {"host": f"root@{self.address}", "identity": str(self.key),
                "known_hosts": str(self.known_hosts), "workdir": str(self.workdir), **extra}

    def stop(self) -> None:
        if self.server is not None:
            proc.kill_group(self.server)
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        subprocess.run(["ip", "link", "del", self.veth], capture_output=True, timeout=30)
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True, timeout=30)
        if self._made_run_sshd:
            shutil.rmtree("/run/sshd", ignore_errors=True)


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    server = Sshd(tmp_path_factory.mktemp("ssh"))
    try:
        yield server.start()
    finally:
        server.stop()


# Every workload tiny: the point is that each runs through ssh and is parsed and stored.
TINY_WORKLOADS = """
[[workloads]]
name = "cpu"
[[workloads]]
name = "threads"
params = { threads = 4 }
[[workloads]]
name = "memory"
[[workloads]]
name = "fileio"
params = { file-total-size = "16M", threads = 2, prepare-threads = 2 }
[[workloads]]
name = "mutex"
params = { threads = 2, mutex-locks = 1000, mutex-loops = 100 }
[[workloads]]
name = "fio"
params = { jobs = ["randread"], size = "8M", runtime = 1, iodepth = 4 }
"""


def ssh_table(server: Sshd, name: str, **extra) -> str:
    lines = [f"[targets.{name}]", 'kind = "ssh"']
    lines += [f"{k} = {json.dumps(v)}" for k, v in server.options(**extra).items()]
    return "\n".join(lines) + "\n"


def assert_remote_clean(server: Sshd, within: float = 20) -> None:
    assert wait_for(lambda: not os.listdir(server.workdir) and not server.jobs(), within, 0.2), \
        (os.listdir(server.workdir), server.jobs())


def is_primary(row: dict) -> bool:
    cls = workloads.registered().get(row["workload"])   # not "fileio prepare"
    return cls is not None and row["metric"] == cls.primary_metric()


def test_every_workload_runs_through_ssh_and_is_stored_then_nothing_is_left(sshd, tmp_path):
    plan = tmp_path / "plan.toml"
    plan.write_text("runs = 1\nwarmup = 0\ntime = 1\n"
                    + ssh_table(sshd, "remote", label="netns-sshd") + TINY_WORKLOADS)
    ran = vmtax("run", str(plan), "--results", str(tmp_path / "results"), "--json",
                timeout=300)
    assert ran.returncode == 0, ran.stderr
    shown = json.loads(ran.stdout)
    fp = shown["run"]["targets"]["remote"]["fingerprint"]
    assert fp["kernel"] == os.uname().release          # same kernel: a namespace, not a VM
    assert fp["hypervisor"] and fp["hypervisor_source"]
    assert fp["label"] == "netns-sshd" and fp["bundle"]
    summary = shown["summary"]
    assert not summary["failures"], summary["failures"]
    primary = [row for row in summary["rows"] if is_primary(row)]
    assert {row["workload"] for row in primary} == {"cpu", "threads", "memory", "fileio",
                                                    "mutex", "fio"}
    assert all(row["cells"]["remote"]["n"] == 1 for row in primary), primary
    assert_remote_clean(sshd)


def test_native_and_two_ssh_targets_take_ratios_against_the_remote_baseline(sshd, tmp_path):
    plan = tmp_path / "plan.toml"
    plan.write_text('runs = 1\nwarmup = 0\ntime = 1\nbaseline = "bare-metal"\n'
                    "[targets.native]\n"
                    + ssh_table(sshd, "bare-metal", label="physical")
                    + ssh_table(sshd, "guest", label="xen-pv")
                    + '[[workloads]]\nname = "cpu"\n')
    ran = vmtax("run", str(plan), "--results", str(tmp_path / "results"), "--json",
                timeout=300)
    assert ran.returncode == 0, ran.stderr
    summary = json.loads(ran.stdout)["summary"]
    assert summary["baseline"] == "bare-metal"
    row = next(r for r in summary["rows"] if is_primary(r))
    assert row["cells"]["guest"]["ratio"] is not None
    assert row["cells"]["native"]["ratio"] is not None
    assert_remote_clean(sshd)


def session_to(server: Sshd, **changes) -> ssh_session.Session:
    config = {"host": server.address, "user": "root", "identity": str(server.key),
              "known_hosts": str(server.known_hosts), **changes}
    return ssh_session.Session(ssh_session.SshConfig(**config))


def connect_error(server: Sshd, **changes) -> str:
    session = session_to(server, **changes)
    with pytest.raises(ssh_session.TargetError) as caught:
        session.connect()
    session.close()
    return str(caught.value)


def test_host_key_auth_refusal_fail_in_one_line_and_a_jump_host_works(sshd, tmp_path):
    other = tmp_path / "other"
    _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other))
    wrong = tmp_path / "wrong_known_hosts"
    wrong.write_text(f"{sshd.address} {' '.join(Path(f'{other}.pub').read_text().split()[:2])}\n")
    assert "host key verification failed" in connect_error(sshd, known_hosts=str(wrong))
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    assert "host key unknown" in connect_error(sshd, known_hosts=str(empty))
    assert "authentication failed for root" in connect_error(sshd, identity=str(other))
    assert "connection refused" in connect_error(sshd, port=2222)
    # accept-new trusts a key never seen, and records it; a changed key stays refused.
    accepting = session_to(sshd, known_hosts=str(empty), host_key_check="accept-new")
    accepting.connect()
    accepting.close()
    assert sshd.address in empty.read_text()
    session_to(sshd, known_hosts=str(empty)).connect()
    assert "host key verification failed" in connect_error(
        sshd, known_hosts=str(wrong), host_key_check="accept-new")
    # Through a jump host (the same sshd, forwarding to itself).
    jumping = session_to(sshd, jump=f"root@{sshd.address}")
    jumping.connect()
    assert jumping.check(["echo", "via jump"], "echo") == "via jump\n"
    jumping.close()
    # What a user sees: one line, no traceback, nothing made remotely.
    ran = vmtax("run", "--targets", f"ssh:root@{sshd.address}", "--known-hosts", str(wrong),
                "--identity", str(sshd.key), "--workdir", str(sshd.workdir),
                "--workloads", "cpu", "--results", str(tmp_path / "results"), timeout=120)
    assert ran.returncode != 0
    errors = [line for line in ran.stderr.splitlines() if line.startswith("vmtax: error:")]
    assert len(errors) == 1 and "host key verification failed" in errors[0], ran.stderr
    assert "Traceback" not in ran.stderr
    assert_remote_clean(sshd)


def test_lost_connection_fails_one_repetition_then_reconnects_and_kills_the_orphan(sshd, tmp_path):
    journal = journal_mod.Journal()
    ctx = TargetContext(work_dir=tmp_path, journal=journal, binaries=("sysbench",))
    target = create_target("remote", "ssh", sshd.options(), ctx)
    try:
        target.prepare()
        result = {}
        # Silent, so that nothing kills it when its output has nowhere to go: an orphan.
        runner = threading.Thread(target=lambda: result.update(job=target.run(
            Job(["sh", "-c", "sleep 31; echo done"], timeout=60))))
        runner.start()
        assert wait_for(lambda: any("sleep 31" in c for c in sshd.jobs()), 30, 0.05)
        for pid in sshd.sessions():
            os.kill(pid, signal.SIGKILL)   # sshd's session child: the connection drops
        runner.join(60)
        lost = result["job"]
        assert not lost.ok and lost.exit_code is None and "connection lost" in lost.stderr
        assert any("sleep 31" in c for c in sshd.jobs())   # orphaned on the remote
        again = target.run(Job(["sysbench", "cpu", "--time=1", "run"], timeout=60))
        assert again.ok and "events per second" in again.stdout, again.stderr
        assert target.alive()
        assert not any("sleep 31" in c for c in sshd.jobs())
        # A timeout kills the job's whole process group on the remote.
        slow = target.run(Job(["sh", "-c", "sleep 40 & sleep 41"], timeout=1))
        assert slow.timed_out and slow.exit_code is None
        assert wait_for(lambda: not any("sleep" in c for c in sshd.jobs()), 10, 0.1), sshd.jobs()
    finally:
        target.cleanup()
    assert not journal.entries
    assert_remote_clean(sshd)


def test_sigkill_of_vmtax_mid_run_leaves_nothing_remote_after_the_next_start(sshd, tmp_path):
    plan = tmp_path / "plan.toml"
    plan.write_text("runs = 3\nwarmup = 0\ntime = 20\n" + ssh_table(sshd, "remote")
                    + '[[workloads]]\nname = "cpu"\n')
    run = start_vmtax("run", str(plan), "--results", str(tmp_path / "results"))
    try:
        assert wait_for(lambda: any("sysbench" in c for c in sshd.jobs()), 60, 0.1), \
            run.stderr.read() if run.poll() is not None else "no remote job"
    finally:
        os.kill(run.pid, signal.SIGKILL)
        run.communicate(timeout=30)
    assert vmtax("cleanup", timeout=120).returncode == 0
    assert_remote_clean(sshd)


def test_next_start_undoes_remote_files_and_jobs_a_dead_vmtax_journaled(sshd, tmp_path):
    session = session_to(sshd)
    session.connect()
    left = str(sshd.workdir / ".vmtax-left")
    session.check(["mkdir", left], "mkdir")
    job, _ = session.job_argv(["sleep", "300"], {}, left, f"{left}/job.pid")
    session.check(["sh", "-c", '"$@" > /dev/null 2>&1 &', "detach", *job], "start")
    session.close()
    assert wait_for(lambda: any("sleep 300" in c for c in sshd.jobs()), 10, 0.05)
    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True).stdout)
    journal_mod.Journal(pid=dead).add(**ssh_session.journal_entry(session.config, left, True))
    recovered = vmtax("cleanup", timeout=120)
    assert recovered.returncode == 0 and "undid 1 host change" in recovered.stdout \
        + recovered.stderr, recovered.stdout + recovered.stderr
    assert_remote_clean(sshd)


def test_ctrl_c_mid_run_kills_the_remote_job_and_removes_everything(sshd, tmp_path):
    plan = tmp_path / "plan.toml"
    plan.write_text("runs = 3\nwarmup = 0\ntime = 20\n" + ssh_table(sshd, "remote")
                    + '[[workloads]]\nname = "cpu"\n')
    run = start_vmtax("run", str(plan), "--results", str(tmp_path / "results"))
    try:
        assert wait_for(lambda: any("sysbench" in c for c in sshd.jobs()), 60, 0.1), \
            run.stderr.read() if run.poll() is not None else "no remote job"
        run.send_signal(signal.SIGINT)
        _, err = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    assert run.returncode == 130, err
    assert "Traceback" not in err
    assert_remote_clean(sshd, within=2)


def test_server_in_the_remote_serves_a_client_on_the_host_and_stops(sshd, tmp_path):
    ctx = TargetContext(work_dir=tmp_path, journal=journal_mod.Journal(), binaries=("iperf3",))
    target = create_target("remote", "ssh", sshd.options(), ctx)
    try:
        target.prepare()
        endpoint = target.start_server(Job(["iperf3", "--server", "--port", "5201"]), 5201)
        assert endpoint.address == sshd.address
        assert wait_for(lambda: any("iperf3 --server" in c for c in sshd.jobs()), 30, 0.05)
        client, report = None, {}
        for _ in range(50):   # until the server listens and has served a whole test
            client = subprocess.run(["iperf3", "--client", sshd.address, "--port", "5201",
                                     "--time", "1", "--json"], capture_output=True,
                                    text=True, timeout=60)
            # A client that reached the server while it was still starting can end with
            # an "error" in its report and exit 0.
            report = json.loads(client.stdout or "{}") if client.returncode == 0 else {}
            if "sum_received" in report.get("end", {}):
                break
            time.sleep(0.1)
        assert client is not None and client.returncode == 0, client.stdout + client.stderr
        assert report["end"]["sum_received"]["bytes"] > 0, report.get("error")
        target.stop_server(endpoint)
        assert wait_for(lambda: not any("iperf3" in c for c in sshd.jobs()), 10, 0.05)
    finally:
        target.cleanup()
    assert_remote_clean(sshd)


def test_a_server_without_sftp_gets_the_files_over_exec_channels(tmp_path):
    """dropbear and minimal sshds have no SFTP subsystem ("Session request failed"): the
    bundle is copied with `cat > PATH` instead, and a workload runs from it."""
    server = Sshd(tmp_path, sftp=False)
    try:
        server.start()
        ctx = TargetContext(work_dir=tmp_path, journal=journal_mod.Journal(),
                            binaries=("sysbench",))
        target = create_target("remote", "ssh", server.options(), ctx)
        try:
            target.prepare()
            # A path with a space and a $: an argument of the copy, never shell syntax.
            odd = f"{target.scratch}/a dir/$HOME x"
            local = tmp_path / "local"
            local.write_bytes(b"\x00binary\xff\n")
            target.session.put({odd: local})
            assert Path(odd).read_bytes() == local.read_bytes()
            done = target.run(Job(["sysbench", "cpu", "--time=1", "run"]))
            assert done.exit_code == 0 and "events per second" in done.stdout, done
        finally:
            target.cleanup()
        assert_remote_clean(server)
    finally:
        server.stop()


def _argv_holding(value: str) -> list[str]:
    """The command lines of every process on this machine (the remote's too: the same
    kernel) that hold value, as any user of the machine can read them."""
    found = []
    for pid in os.listdir("/proc"):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes() if pid.isdigit() else b""
        except OSError:   # gone meanwhile
            continue
        if value.encode() in cmdline:
            found.append(cmdline.replace(b"\0", b" ").decode(errors="replace"))
    return found


def test_a_jobs_environment_is_in_no_command_line_on_the_machine(sshd, tmp_path):
    """A job's secrets (the oltp workload's password) reach it on the wrapper's stdin, as a
    job and as a detached server: never in any process's argv, remote or local."""
    secret = f"hunter2-{secrets.token_hex(8)}"
    env = {"SECRET": secret, "ODD": f"a\nb'{secret}\"=c", "EMPTY": ""}
    ctx = TargetContext(work_dir=tmp_path, journal=journal_mod.Journal(),
                        binaries=("sysbench",))   # an empty bundle fails its checksum check
    target = create_target("remote", "ssh", sshd.options(), ctx)
    leaked: list[str] = []
    try:
        target.prepare()
        result = {}
        runner = threading.Thread(target=lambda: result.update(job=target.run(
            Job(["sh", "-c", "sleep 2; env"], env=env, timeout=60, secrets=(secret,)))))
        runner.start()
        saw_job = False
        while runner.is_alive():
            leaked += _argv_holding(secret)
            saw_job = saw_job or any("sleep 2; env" in c for c in sshd.jobs())
        runner.join()
        assert saw_job and not leaked, leaked
        done = result["job"]
        assert done.ok, done.stderr
        for name, value in env.items():
            assert f"\n{name}={value}\n" in "\n" + done.stdout, done.stdout
        # A server, started detached: the same, and the values' file is gone once it runs.
        endpoint = target.start_server(Job(["sh", "-c", "env > server.env; exec sleep 30"],
                                           env=env, in_scratch=True, secrets=(secret,)), 5299)
        shown = Path(str(target.scratch), "server.env")
        # Exec'd once env has written its file.
        assert wait_for(lambda: any(c.startswith("sleep 30") for c in sshd.jobs()), 30, 0.01)
        leaked += _argv_holding(secret)
        assert not leaked, leaked
        assert all(f"\n{name}={value}\n" in "\n" + shown.read_text()
                   for name, value in env.items()), shown.read_text()
        assert not [f for f in os.listdir(str(target.scratch)) if f.endswith(".env")
                    and f != "server.env"]
        target.stop_server(endpoint)
        assert wait_for(lambda: not any("sleep 30" in c for c in sshd.jobs()), 10, 0.05)
    finally:
        target.cleanup()
    assert_remote_clean(sshd)
