"""Unit tests of container:docker: the docker command lines it builds for each option, its
journal entries, and the plan check of its options. The live tests run the real dockerd."""

import ipaddress
import os
from pathlib import Path

import pytest

from vmtax.core import plugin
from vmtax.core import target as targets
from vmtax.core.errors import VmtaxError
from vmtax.core.instance import Instance
from vmtax.core.runtime import Launch, Runtime, runtimes
from vmtax.core.target import LISTEN_ENV, TargetContext
from vmtax.core.types import Job
from vmtax.host.journal import Journal
from vmtax.targets import container, docker

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="container options need root")


def runtime(tmp_path: Path, network: str | None = "vmtax-0123abcd", cpus=None,
            **settings) -> docker.Docker:
    """A Docker runtime as attach() leaves it, without a daemon."""
    made = docker.Docker("/usr/bin/docker", tmp_path, cpus)
    made.settings = {"network": "bridge" if network else "host", "storage": "overlay",
                     "seccomp": "default", "cpu_limit": None, "memory_limit": None,
                     **settings}
    made.network = network
    made.image = "vmtax-rootfs:0123456789abcdef"
    made.jobs = "vmtax-0123abcd"
    return made


def test_it_is_a_registered_runtime_of_the_container_target():
    assert runtimes()["docker"] is docker.Docker
    assert targets.parse_name("container:docker") == ("container", {"runtime": "docker"})
    assert docker.Docker.packages == ("docker.io",)


def test_a_dockerd_of_vmtax_leaves_the_hosts_network_alone():
    argv = docker.dockerd().argv
    for flag in ("--iptables=false", "--ip-forward=false", "--ip-masq=false",
                 "--bridge=none", "--ip6tables=false"):
        assert flag in argv
    assert docker.dockerd().socket == Path("/var/run/docker.sock")


def test_the_job_container_with_docker_defaults(tmp_path):
    made = runtime(tmp_path)
    argv = made.run_args("vmtax-0123abcd", Job(docker.HOLD), data=True)
    assert argv[:2] == ["run", "--detach"]
    assert "--network=vmtax-0123abcd" in argv and "--hostname=vmtax" in argv
    assert f"--cgroup-parent=/vmtax-docker-{made.id}" in argv
    assert made.cgroup_dirs() and all(d.endswith(f"/vmtax-docker-{made.id}")
                                      for d in made.cgroup_dirs())
    assert not any(a.startswith(("--security-opt", "--cpus", "--memory", "--volume",
                                 "--cpuset")) for a in argv)
    # The image, then the command: nothing after the image is read as docker's flag.
    assert argv[-3:] == ["vmtax-rootfs:0123456789abcdef", "sleep", "2147483647"]


def test_every_option_becomes_dockers_flag(tmp_path):
    made = runtime(tmp_path, network=None, cpus=[1], seccomp="unconfined", cpu_limit=1.5,
                   memory_limit="512M", storage="volume")
    made.trees = (Path("/usr/src/linux"),)
    argv = made.run_args("vmtax-0123abcd", Job(docker.HOLD), data=True)
    assert "--network=host" in argv
    assert not any(a.startswith("--hostname") for a in argv)   # docker refuses it with host
    for flag in ("--security-opt=seccomp=unconfined", "--cpuset-cpus=1", "--cpus=1.5",
                 "--memory=512M", f"--volume={tmp_path}/volume:/work",
                 "--volume=/usr/src/linux:/usr/src/linux:ro"):
        assert flag in argv
    # Only the job container holds the data directory.
    assert f"--volume={tmp_path}/volume:/work" not in made.run_args("x", Job(["true"]))


def test_a_job_is_a_docker_exec_with_exactly_its_environment(tmp_path):
    job = Job(["sysbench", "cpu", "run"], env={"LC_ALL": "C", "PASSWORD": "s3cret"},
              in_scratch=True, secrets=("s3cret",))
    launch = runtime(tmp_path).launch(job)
    assert launch.argv[1:3] == [f"--host={docker.HOST}", "exec"]
    assert "--workdir=/work" in launch.argv and "--env=LC_ALL=C" in launch.argv
    assert any(a.startswith("--env=PATH=") for a in launch.argv)
    # A secret's value reaches the CLI through its environment, never its argv.
    assert "--env=PASSWORD" in launch.argv
    assert not any("s3cret" in a for a in launch.argv)
    assert launch.env is not None and launch.env["PASSWORD"] == "s3cret"
    assert launch.argv[-4:] == ["vmtax-0123abcd", "sysbench", "cpu", "run"]
    assert launch.container is None and launch.undo is None   # nothing per job to undo


def test_a_job_needing_more_capabilities_is_refused(tmp_path):
    with pytest.raises(VmtaxError, match="CAP_SYS_NICE, beyond Docker's default"):
        runtime(tmp_path).launch(Job(["cyclictest"], capabilities=("CAP_SYS_NICE",)))


def test_a_server_on_the_hosts_network_listens_on_loopback_only(tmp_path):
    job = Job(["iperf3", "-s"])
    assert runtime(tmp_path, network=None).on_host_network(job).env == {
        LISTEN_ENV: "127.0.0.1"}
    assert runtime(tmp_path).on_host_network(job) is job


def test_servers_run_in_the_job_container_and_instances_in_their_own(tmp_path):
    made = runtime(tmp_path)
    assert isinstance(made.instance("s", Job(["x"]), tmp_path / "l", True), docker.ExecServer)
    assert isinstance(made.instance("i", Job(["x"]), tmp_path / "l", False),
                      docker.DockerInstance)


def test_the_subnet_skips_the_hosts_networks(monkeypatch):
    monkeypatch.setattr(docker, "host_networks",
                        lambda: [ipaddress.IPv4Network("10.214.0.0/23"),
                                 ipaddress.IPv4Network("192.0.2.0/24")])
    subnets = docker.free_subnets("00000000")
    assert subnets[0] == ipaddress.IPv4Network("10.214.2.0/24")
    assert len(subnets) == 254
    assert docker.free_subnets("00000005")[0] == ipaddress.IPv4Network("10.214.5.0/24")


@pytest.mark.parametrize("undo", [docker.remove_container, docker.remove_network])
@pytest.mark.parametrize("name", ["nginx", "vmtax-x; rm -rf /", "--all", None])
def test_an_undo_entry_removes_only_what_vmtax_names(tmp_path, undo, name, monkeypatch):
    ran = []
    monkeypatch.setattr(docker.proc, "run", lambda argv, **kw: ran.append(argv))
    journal = Journal(tmp_path)
    token = journal.add(type="docker", name=name, undo=plugin_undo(undo))
    errors = journal.undo_all()
    assert token not in journal.entries and len(errors) == 1 and "not one vmtax makes" in \
        errors[0]
    assert ran == []


def plugin_undo(handler) -> str:
    from vmtax.host.journal import undone_by
    return undone_by(handler)


def test_an_undo_entry_removes_a_container_by_its_name(tmp_path, monkeypatch):
    ran = []

    class Done:
        exit_code, stderr = 0, ""
    monkeypatch.setattr(docker.daemon, "answers", lambda path: True)
    monkeypatch.setattr(docker.proc, "run", lambda argv, **kw: ran.append(argv) or Done())
    journal = Journal(tmp_path)
    journal.add(type="docker-container", name="vmtax-0123456789ab",
                undo=plugin_undo(docker.remove_container))
    journal.add(type="docker-network", name="vmtax-0123abcd",
                undo=plugin_undo(docker.remove_network))
    assert journal.undo_all() == []
    assert [argv[2:] for argv in ran] == [["network", "rm", "vmtax-0123abcd"],
                                          ["rm", "--force", "vmtax-0123456789ab"]]


@root_only
def test_dockers_own_options_are_refused_for_other_runtimes():
    cls = targets.get("container")
    with pytest.raises(VmtaxError, match=r"network: expected nothing for runtime 'runc' "
                                         r"\(set only for docker\), got 'host'"):
        plugin.build(cls.Options, {"runtime": "runc", "network": "host"}, "c")
    built = plugin.build(cls.Options, {"runtime": "docker", "network": "host",
                                       "storage": "volume", "seccomp": "unconfined",
                                       "cpu_limit": "0.5", "memory_limit": "1G"},
                         "c", strict=False)
    assert built.values() == {"runtime": "docker", "binaries": [], "network": "host",
                              "storage": "volume", "seccomp": "unconfined",
                              "cpu_limit": 0.5, "memory_limit": "1G"}


def test_bad_values_are_one_line_errors():
    cls = targets.get("container")
    for key, value, expected in (("network", "nat", 'one of "bridge", "host"'),
                                 ("cpu_limit", "0", "a number above 0"),
                                 ("memory_limit", "512", 'a size like "2G"')):
        with pytest.raises(VmtaxError, match=f"c: {key}: expected {expected}"):
            plugin.build(cls.Options, {"runtime": "docker", key: value}, "c", strict=False)


def test_other_runtimes_store_no_docker_options():
    cls = targets.get("container")
    assert "network" not in cls.Options(runtime="runc").values()


def test_the_knobs_pass_their_own_checks():
    infos = plugin.option_infos(targets.get("container").Options)
    for key in ("network", "storage", "seccomp"):
        assert infos[key].tune
        for value in infos[key].tune:
            infos[key].check(value)


# --- the container target drives a runtime that keeps things of its own ------------------

class FakeInstance(Instance):
    def __init__(self, name, server):
        super().__init__(name)
        self.server, self.running = server, False

    def _start(self):
        self.running, self.address = True, "10.214.9.2"

    def stop(self):
        self.running = False

    def alive(self):
        return self.running

    def host_pids(self):
        return []


class Keeper(Runtime):
    """A runtime with a daemon, a network and instances of its own, as Docker has (a test
    module is not scanned for plugins: it is not registered)."""
    name = "keeper"
    install = "nowhere"
    kernel_sockets = False     # the target does not wait for a socket of a fake server
    fail_attach = False

    def __init__(self, binary, home, cpus=None):
        super().__init__(binary, home, cpus)
        self.calls: list = []
        self.made: list[FakeInstance] = []

    def attach(self, ctx, options, source):
        self.calls.append(("attach", source.name, options.values()["runtime"]))
        if self.fail_attach:
            raise VmtaxError("dockerd did not answer")

    def detach(self):
        self.calls.append("detach")

    def launch(self, job):
        self.calls.append(("launch", job.argv[0]))
        return Launch(["true"])

    def instance(self, name, job, log, server):
        self.made.append(FakeInstance(name, server))
        return self.made[-1]


@pytest.fixture
def keeper_target(tmp_path, monkeypatch):
    source = tmp_path / "cache" / "0123456789abcdef"
    (source / "work").mkdir(parents=True)
    monkeypatch.setattr(container.rootfs, "build", lambda binaries: source)
    cls = targets.get("container")
    monkeypatch.setattr(cls, "candidates", lambda self: [(Keeper, "/bin/true")])
    (tmp_path / "journal").mkdir()
    ctx = TargetContext(work_dir=tmp_path / "work", journal=Journal(tmp_path / "journal"),
                        make_network=lambda: "vmtax's network")
    return targets.create("container", "container", {}, ctx)


@root_only
def test_the_target_attaches_the_runtime_and_asks_it_for_its_instances(keeper_target):
    target = keeper_target
    target.prepare()
    runtime = target.runtime
    assert runtime.calls == [("attach", "0123456789abcdef", "auto"), ("launch", "true")]
    endpoint = target.start_server(Job(["iperf3", "-s"]), 5201)
    assert endpoint.address == "10.214.9.2" and endpoint.client_preexec is None
    instance = target.make_instance(3, "vmtax's network")
    assert [(i.name, i.server, i.running) for i in runtime.made] == [
        ("container server", True, True), ("container#3", False, True)]
    target.stop_server(endpoint)
    assert not runtime.made[0].running
    target.cleanup()
    assert runtime.calls[-1] == "detach" and instance.running   # the factory stops its own


@root_only
def test_a_runtime_that_cannot_attach_is_passed_over_and_detached(keeper_target, monkeypatch):
    monkeypatch.setattr(Keeper, "fail_attach", True)
    detached = []
    monkeypatch.setattr(Keeper, "detach", lambda self: detached.append(self))
    with pytest.raises(VmtaxError, match=r"no usable container runtime \(keeper: dockerd "
                                         r"did not answer\)"):
        keeper_target.prepare()
    assert len(detached) == 1
    assert keeper_target.ctx.journal.entries == {}
