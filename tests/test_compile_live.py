"""The compile workload for real: one kernel object compiled with the kernel's own command
from the read-only tree, in a container and in a TCG guest (natively and through the CLI:
test_macro_live.py), and the tree is read-only in both. Needs the tree that set-up builds
(`make builds`: python -m vmtax.helpers.kernel_tree)."""

import shutil

import pytest

from vmtax.core import target as targets
from vmtax.core.target import Job, TargetContext
from vmtax.helpers import kernel_tree
from vmtax.host.journal import Journal
from vmtax.workloads.compile import Compile

pytestmark = pytest.mark.live


@pytest.fixture(scope="module")
def tree():
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    try:
        path = kernel_tree.tree_path()
    except Exception as exc:   # no linux-source or gcc
        pytest.skip(str(exc))
    if not (path / kernel_tree.MANIFEST).exists():
        pytest.skip("the kernel tree is not built: make builds "
                    "(python -m vmtax.helpers.kernel_tree)")
    return path


@pytest.mark.parametrize("kind, options", [("container", {}), ("vm", {"accel": "tcg"})])
def test_compile_from_the_read_only_tree(tmp_path, tree, kind, options):
    workload = Compile.make({"objects": 1})
    assert workload.trees() == (tree,)
    (tmp_path / "journal").mkdir()
    journal = Journal(tmp_path / "journal")
    ctx = TargetContext(work_dir=tmp_path, journal=journal, binaries=Compile.binaries,
                        trees=workload.trees())
    target = targets.create(kind, kind, options, ctx)
    target.prepare()
    try:
        result = target.run(workload.run_job())
        assert result.ok, result.stderr
        assert workload.parse(result.stdout)[0].value > 0
        obj = kernel_tree.select(kernel_tree.manifest(tree)["objects"], 1)[0]
        listed = target.run(Job(["ls", "-l", f"out/{obj}"], in_scratch=True))
        assert listed.ok, listed.stderr
        write = target.run(Job(["touch", f"{tree}/src/vmtax.mk"]))
        assert not write.ok and "Read-only file system" in write.stderr
        for job in workload.cleanup_jobs():
            assert target.run(job).ok
    finally:
        target.cleanup()
    assert not journal.entries
