"""Live, the real LXD (issue #35, items 2 and 11): a container that cannot start (`memory =
"1K"`) is reported in LXD's and the kernel's words and leaves nothing in LXD, no journal and
no log directory; a run that succeeds leaves no log directory of its container either."""

import os
from pathlib import Path

import pytest
from conftest import vmtax
from test_lxd_live import pytestmark, vmtax_objects  # noqa: F401 - LXD's live marks

from vmtax.helpers import lxd_api
from vmtax.host import daemon

# Debian's lxd's log directories of its instances (lxd_api.LOGS).
LOGS = Path("/var/log/lxd")


PLAN = """\
runs = 1
warmup = 0
time = 1

[targets.l]
kind = "lxd"
memory = "{memory}"

[[workloads]]
name = "cpu"
"""


def left(runtime: Path, ran_before: bool) -> list[str]:
    """What of vmtax's is left: in LXD, its logs, the journal, the daemon it started."""
    return [*vmtax_objects(), *(str(p) for p in LOGS.glob(f"{lxd_api.PREFIX}*")),
            *(str(p) for p in runtime.glob("journal-*")),
            *(["the daemon vmtax started"] if not ran_before
              and daemon.answers(lxd_api.SOCKET, timeout=0.2) else [])]


@pytest.mark.parametrize("memory", ["1K", "64M"])
def test_a_run_leaves_nothing_in_lxd_whether_its_container_starts_or_not(tmp_path, memory):
    runtime = Path(os.environ["VMTAX_RUNTIME"])
    ran_before = daemon.answers(lxd_api.SOCKET)
    assert not left(runtime, ran_before), "vmtax's LXD objects or logs before the test"
    plan = tmp_path / "lxd.toml"
    plan.write_text(PLAN.format(memory=memory))
    done = vmtax("run", str(plan), "--results", str(tmp_path / "results"), timeout=300)
    if memory == "1K":
        lines = done.stderr.strip().splitlines()
        assert done.returncode != 0 and len(lines) == 1, done.stderr
        assert "l: LXD: Starting instance: Failed to run:" in lines[0], lines[0]
        if os.access("/dev/kmsg", os.R_OK):
            assert lines[0].endswith("in the container's memory cgroup: its memory limit is "
                                     "too small"), lines[0]
    else:
        assert done.returncode == 0, done.stderr[-2000:]
    assert left(runtime, ran_before) == []
    assert vmtax("cleanup").stdout.strip() == "nothing to clean up"
