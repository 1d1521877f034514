"""Run inside a lab by tests/test_microvm_live.py (vmtax.studies.lab.run's `program`):
start a vmtax run of a microVM target KIND whose guest serves iperf3 (so it has a tap on
vmtax's bridge), kill -9 vmtax while the guest is up, and see within 5 s that no VMM
process, run directory (its sockets), tap, network namespace, scratch disk or journal is
left. Prints one line, "KIND: nothing left N s after kill -9" (exit 0), or what was left (exit 1).

Usage: kill9_microvm.py KIND"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VMM = {"firecracker": "firecracker", "cloud-hypervisor": "cloud-hypervisor"}
RUNTIME = Path(tempfile.mkdtemp(prefix="kill9-runtime-"))
WORK = Path(tempfile.mkdtemp(prefix="kill9-work-", dir="/var/tmp"))


def vmm_pids(name: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and os.path.basename(os.readlink(entry / "exe")) == name:
                found.append(int(entry.name))
        except OSError:
            pass
    return found


def netns() -> list[str]:
    done = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return [line.split()[0] for line in done.stdout.splitlines()
            if line.startswith("vmtax")]


def left() -> dict[str, list]:
    return {"vmm": vmm_pids(VMM[kind]),
            "run dirs": [str(p) for p in Path(tempfile.gettempdir()).glob("vmtax-vm-*")],
            "netns": netns(), "journals": [str(p) for p in RUNTIME.glob("journal-*")],
            "work": [str(p) for p in WORK.rglob("*.img")]}


kind = sys.argv[1]
assert not left()["vmm"] and not left()["netns"], left()
env = {**os.environ, "VMTAX_RUNTIME": str(RUNTIME), "TMPDIR": tempfile.gettempdir()}
vmtax = subprocess.Popen([sys.executable, "-m", "vmtax", "run", "--targets", kind,
                          "--workloads", "iperf3", "--kernel", "minimal", "--runs", "3",
                          "--warmup", "0", "--time", "30", "--results", str(WORK / "r")],
                         cwd=WORK, env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
deadline = time.monotonic() + 600
while not (left()["vmm"] and left()["netns"]):   # its guest up, on its tap
    if vmtax.poll() is not None or time.monotonic() > deadline:
        print(f"{kind}: its guest never came up: {(vmtax.communicate()[1] or '')[-600:]}")
        sys.exit(1)
    time.sleep(0.2)
time.sleep(2)   # in the middle of its first repetition
vmtax.send_signal(signal.SIGKILL)
vmtax.wait()
killed = time.monotonic()


def clean_by(bound: float) -> float | None:
    """When a look found nothing left: the moment it began (a look takes seconds in a busy
    lab: nothing was left by then), if that is within bound seconds of the kill."""
    while (began := time.monotonic()) - killed < bound:
        if not any(left().values()):
            return began - killed
        time.sleep(0.1)
    return None


took = clean_by(5)
if took is None:   # what was left, and how long it took after all, which says what is slow
    remains = {k: v for k, v in left().items() if v}
    after = clean_by(60)
    print(f"{kind}: left 5 s after kill -9 (" + (
        "still there after 60 s" if after is None else f"gone {after:.1f} s after") +
        f"): {json.dumps(remains)}")
    sys.exit(1)
print(f"{kind}: nothing left {took:.1f} s after kill -9")
