"""KSM and huge pages on the real host: a process that turned KSM on and reserved huge
pages is killed with SIGKILL; its guardian puts both back exactly as they were."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from vmtax.host import hugepages, ksm

pytestmark = pytest.mark.live

SCRIPT = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from vmtax.host import guardian
    from vmtax.host import hugepages
    from vmtax.host import ksm
    from vmtax.host.journal import Journal

    journal = Journal(Path(sys.argv[1]))
    with guardian.guard(journal.path):
        ksm.enable(journal, 4321, 7)
        hugepages.pool(journal, "2M").reserve(2)
        print("READY", flush=True)
        time.sleep(600)
""")


def nr_hugepages() -> int:
    return hugepages.persistent(hugepages.pool_dir("2M") / "nr_hugepages")


@pytest.mark.skipif(ksm.unavailable() is not None, reason=str(ksm.unavailable()))
def test_sigkill_leaves_ksm_and_huge_pages_as_they_were(tmp_path):
    before_ksm, before_pages = ksm.settings(), nr_hugepages()
    owner = subprocess.Popen([sys.executable, "-c", SCRIPT, str(tmp_path)],
                             stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert owner.stdout.readline().strip() == "READY"
        assert ksm.settings() == {"run": 1, "pages_to_scan": 4321, "sleep_millisecs": 7}
        assert nr_hugepages() >= before_pages + 2
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        deadline = time.monotonic() + 15
        while ((ksm.settings(), nr_hugepages()) != (before_ksm, before_pages)
               and time.monotonic() < deadline):
            time.sleep(0.1)
        assert ksm.settings() == before_ksm
        assert nr_hugepages() == before_pages
        assert list(tmp_path.glob("journal-*.json")) == []
    finally:
        if owner.poll() is None:
            os.killpg(owner.pid, signal.SIGKILL)
            owner.wait()
