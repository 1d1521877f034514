"""The session run, density and boot share (vmtax.studies.session), and the target facts
studies read through the contract instead of guessing them from a kind's name."""

import pytest
from conftest import builtin

from vmtax.core.errors import VmtaxError
from vmtax.core.instance import Instance
from vmtax.host.journal import Journal
from vmtax.results.store import Store
from vmtax.studies import density, session
from vmtax.studies.plan import TargetSpec
from vmtax.targets.native import NativeTarget


@pytest.fixture
def own(tmp_path):
    (tmp_path / "journals").mkdir()
    return Journal(tmp_path / "journals")


class Broken(NativeTarget):
    def fingerprint(self):
        raise VmtaxError("never came up")


def test_a_session_stores_a_run_with_fingerprints_and_leaves_nothing(tmp_path, own):
    store = Store(tmp_path / "results")
    with session.session(store, own) as s:
        s.create(TargetSpec("native", "native")).prepare()
        s.targets["broken"] = Broken("broken", NativeTarget.Options(), s.ctx)
        run_id = s.new_run({"kind": "test"})
        s.store_fingerprints()
        assert s.work_dir.is_dir()
    run = store.load_run(run_id)
    assert run.status == "done"
    assert run.targets["native"]["fingerprint"]["bare_host"] is True
    assert run.targets["broken"]["fingerprint"] == {"kind": "native", "error": "never came up",
                                                    "bare_host": True}
    assert not list((tmp_path / "results").glob(".work-*")), "work dir left behind"


@pytest.mark.parametrize("raised, status", [(VmtaxError("boom"), "failed"),
                                            (KeyboardInterrupt(), "interrupted")])
def test_the_run_is_finished_with_what_ended_the_session(tmp_path, own, raised, status):
    store = Store(tmp_path / "results")
    with pytest.raises(type(raised)), session.session(store, own) as s:
        run_id = s.new_run({"kind": "test"})
        raise raised
    assert store.load_run(run_id).status == status


class Recorder:
    kind, bare_host = "native", False

    def __init__(self, seen):
        self.seen = seen

    def cleanup(self):
        self.seen.append("cleanup")


@pytest.mark.parametrize("undo_first, order", [(False, ["cleanup", "undo"]),
                                               (True, ["undo", "cleanup", "undo"])])
def test_a_study_of_instances_undoes_the_journal_first(tmp_path, own, monkeypatch,
                                                       undo_first, order):
    seen: list[str] = []
    monkeypatch.setattr(own, "undo_all", lambda: seen.append("undo") or [])
    with session.session(Store(tmp_path / "results"), own, undo_first=undo_first) as s:
        s.targets["t"] = Recorder(seen)
    assert seen == order


def test_a_targets_options_are_checked_through_its_kind():
    assert session.check_target(TargetSpec("v", "vm", {"vcpus": 2})).vcpus == 2
    with pytest.raises(VmtaxError, match="^plan: targets.v: vcpus: expected") as info:
        session.check_target(TargetSpec("v", "vm", {"vcpus": 0}), "plan: targets.v")
    assert "\n" not in str(info.value)


# -- the facts each kind declares -----------------------------------------------------------

@pytest.mark.plugin_lists
def test_target_facts_are_declared_by_each_kind():
    kinds = builtin("target")
    assert {k for k, c in kinds.items()
            if c.shares_host_page_cache} == {"native", "container", "lxd"}
    assert {k for k, c in kinds.items() if c.ksm_mergeable} == {"vm", "libvirt"}
    microvms = {"firecracker", "cloud-hypervisor"}
    assert {k for k, c in kinds.items() if c.guest_clock} == {"vm", "libvirt", *microvms}
    assert {k for k, c in kinds.items() if c.vmm_process} == {"vm", "libvirt", *microvms}
    assert {k for k, c in kinds.items() if c.makes_instances()} == {
        "container", "libvirt", "lxd", "vm", *microvms}
    assert {k for k, c in kinds.items() if c.small_options} == {"libvirt", "lxd", "vm",
                                                                  *microvms}


def test_an_instance_declares_its_guests_boot_time():
    class Bare(Instance):
        _start = stop = alive = host_pids = None   # type: ignore[assignment]
    assert Bare("x").guest_boot_seconds is None


def test_density_and_boot_read_kinds_through_their_facts():
    assert density.instance_kinds() == ["cloud-hypervisor", "container", "firecracker",
                                        "libvirt", "lxd", "vm"]
    assert density.default_kind() == "container"   # the quickest to start
    specs = density.instance_specs(["vm:tcg", "container:runc"])
    assert specs["vm:tcg"] == TargetSpec("vm:tcg", "vm", {
        "vcpus": 1, "memory": "56M", "disk_size": "64M", "kernel": "minimal", "tb_size": 16,
        "accel": "tcg"})
    assert specs["container:runc"] == TargetSpec("container:runc", "container",
                                                 {"runtime": "runc"})
    assert density.stored_plan("boot", specs, runs=3)["targets"][0] == {
        "name": "vm:tcg", "kind": "vm", "options": specs["vm:tcg"].options, "written": {}}



def test_every_target_s_fingerprint_says_what_its_workload_programs_are(tmp_path, own):
    """Issue 48.4: a rebuilt workload binary at the same path, with the same version
    string, is another program: each target's fingerprint keeps its sha256."""
    import shutil

    from vmtax.host import binary

    store = Store(tmp_path / "results")
    with session.session(store, own, binaries=("sysbench",)) as s:
        s.create(TargetSpec("native", "native")).prepare()
        run_id = s.new_run({"kind": "test"})
        s.store_fingerprints()
    programs = store.load_run(run_id).targets["native"]["fingerprint"]["programs"]
    assert programs == {"sysbench": binary.short_id(shutil.which("sysbench"))}
