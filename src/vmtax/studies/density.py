"""E4 density: how many instances of a target fit on this host, and what each one costs.

Every instance (vmtax.studies.factory) serves a static site with Debian's nginx, the host's own
binary carried into the container's rootfs and the guest's initramfs like any workload's
binary; a job in the instance writes nginx's configuration and the site, then runs nginx
(`serve_job`). Instances start one at a time for the first `singles`, then `batch` at a
time, up to `max` or until the memory budget, the host's available memory or a failed start
ends the study. After each step vmtax waits until memory settles (with KSM on, until
merging has settled first), then records a `Step`: host used memory (MemTotal −
MemAvailable) as a delta from before the first instance, the instances' summed PSS and
RSS (/proc/PID/smaps_rollup, as the host-mem collector reads it), the kernel's own growth
(Slab, PageTables, KernelStack), the KSM counters, and how many instances answer an HTTP
request, from inside the network's namespace.

Memory per instance (vmtax.studies.density_results.summarize):
- raw: used delta / instances: everything the host lost to them;
- adjusted: (used delta − growth of Slab, PageTables and KernelStack) / instances: the
  kernel's own memory the instances made it allocate (network namespaces, devices, page
  tables of their address spaces, task structures) taken out, so what is left is the
  instances' own pages (their RAM, caches, a guest's whole memory);
- pss: summed PSS / instances: the instances' processes alone, shared pages divided;
- marginal: the used delta the last batch added, per instance of it.
Raw, adjusted and marginal read the whole host's used memory: when other processes free
memory meanwhile they can come to 0 or less, which no instance costs; such a figure is
no result (None, with `not_results` saying what it came to and why), and PSS stands.
The density ratio between two targets is the ratio of their adjusted costs: how many of
the cheaper fit in the memory of one of the dearer.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any, Callable, Sequence

from pydantic import AfterValidator

from vmtax.core import plugin
from vmtax.core.errors import VmtaxError
from vmtax.core.instance import Instance
from vmtax.core import target as target_registry
from vmtax.core.target import Target
from vmtax.core.types import Job
from vmtax.host import hugepages, ksm, proc
from vmtax.results import study_records as records
from vmtax.studies.factory import InstanceFactory
from vmtax.studies.plan import TargetSpec

WORKLOAD = records.DENSITY
SERVER = "nginx"                 # carried into every instance (TargetContext.binaries)
PORT = 80
MARKER = "vmtax density site"
# Memory the host keeps for itself: a step that would leave it less is not started.
HOST_RESERVE = hugepages.HOST_HEADROOM
KERNEL_LINES = ("Slab", "PageTables", "KernelStack")
# The host's CPUs are saturated (the limit of instances answering) when at least this
# share of them was busy while the instances idled.
SATURATED = 90.0
PAGE_MIB = os.sysconf("SC_PAGE_SIZE") / 2**20

# Written and run inside the instance by its own shell: no host shell, no host files.
SERVE_SCRIPT = r"""
set -e
d=/tmp/vmtax-nginx
mkdir -p $d/www $d/temp
cat > $d/nginx.conf <<EOF
user root;
worker_processes 1;
daemon off;
pid $d/nginx.pid;
error_log stderr warn;
events { worker_connections 256; }
http {
  access_log off;
  default_type text/html;
  client_body_temp_path $d/temp/body;
  proxy_temp_path $d/temp/proxy;
  fastcgi_temp_path $d/temp/fastcgi;
  uwsgi_temp_path $d/temp/uwsgi;
  scgi_temp_path $d/temp/scgi;
  server { listen PORT; root $d/www; }
}
EOF
printf '<html><body><h1>MARKER</h1><p>%s</p></body></html>\n' "$(hostname)" > $d/www/index.html
exec nginx -p $d/ -e stderr -c $d/nginx.conf
"""


def serve_job(port: int = PORT) -> Job:
    """The job every instance runs for its lifetime: nginx serving a static site."""
    script = SERVE_SCRIPT.replace("PORT", str(port)).replace("MARKER", MARKER)
    # Generous: with 200 TCG guests on 2 busy CPUs, one measured 75 s to start this
    # script (the step, and with it the study, ends at a start that fails).
    return Job(["/bin/sh", "-c", script], timeout=180)


# --- the targets: kinds that start instances of their own -----------------------------

def instance_kinds() -> list[str]:
    """The target kinds density and boot can measure: those that make instances."""
    return sorted(kind for kind, cls in target_registry.kinds().items()
                  if cls.makes_instances())


def default_kind() -> str:
    """The kind measured when none is named: of those that make instances, the quickest
    to start."""
    kinds = target_registry.kinds()
    return min(instance_kinds(), key=lambda kind: (kinds[kind].startup_seconds, kind))


def instance_specs(names: list[str]) -> dict[str, TargetSpec]:
    """Targets named on the command line (`container`, `vm:tcg`), each a small instance of
    its kind (its small_options): density is about many of them."""
    specs = {}
    for name in names:
        kind, variant = target_registry.parse_name(name)
        specs[name] = TargetSpec(name, kind,
                                 {**target_registry.get(kind).small_options, **variant})
    return specs


def stored_plan(kind: str, specs: dict[str, TargetSpec], **rest: Any) -> dict[str, Any]:
    """The plan of a density or boot run (kind) as stored, with its targets as `vmtax
    run` stores them."""
    return {"kind": kind, "targets": [asdict(spec) for spec in specs.values()],
            "workloads": [{"name": kind, "params": {}}], **rest}


def noted_plan(specs: dict[str, TargetSpec], kernel: str, **rest: Any) -> dict[str, Any]:
    """A density run's stored plan, with why KSM on leaves some of its targets' memory as
    it is, on this host's kernel, where it measures with KSM on: the report's figure says
    so from what the run stored (a renderer reads no host)."""
    plan = stored_plan(WORKLOAD, specs, **rest)
    if True in (rest.get("settings") or {}).get("ksm", [True]):
        note = ksm.unmarked_note([spec.kind for spec in specs.values()], kernel)
        if note:
            plan[records.KSM_NOTE] = note
    return plan


# --- what the study is told --------------------------------------------------------------

def _budget(value: str) -> str:
    if not re.fullmatch(r"(100|[1-9][0-9]?)%|[1-9][0-9]*[KMGT]", value):
        raise ValueError("not a budget")
    return value


Budget = Annotated[str, AfterValidator(_budget), plugin.Expect(
    lambda: 'a share of host RAM ("75%") or a size ("16G")')]


class Settings(plugin.Options):
    max: int = plugin.option(100, "Start instances up to this many", unit="instances", ge=1)
    singles: int = plugin.option(10, "The first this many start one at a time",
                                 unit="instances", ge=1)
    batch: int = plugin.option(10, "Then this many at a time", unit="instances", ge=1)
    parallel: int = plugin.option(4, "Instances of a batch started at once", ge=1)
    budget: Budget = plugin.option(
        "75%", 'Memory the instances may take, a share of host RAM ("75%") or a size '
        '("16G"); a step that would go beyond it is not started')
    ksm: list[bool] = plugin.option([False], "KSM off, on, or both (an axis: [false, true])",
                                    min_length=1)
    pages_to_scan: int = plugin.option(1000, "KSM pages scanned per wake-up while on",
                                       unit="pages", ge=1, le=100000)
    sleep_millisecs: int = plugin.option(20, "KSM's sleep between scans while on", unit="ms",
                                         ge=1, le=10000)
    ksm_timeout: float = plugin.option(120.0, "Give up waiting for KSM merging to settle",
                                       unit="s", gt=0)
    settle_threshold: float = plugin.option(
        16.0, "Memory has settled when host used memory moved less than this over the window",
        unit="MiB", gt=0)
    settle_window: float = plugin.option(5.0, "The settle window", unit="s", gt=0)
    settle_timeout: float = plugin.option(60.0, "Give up waiting for memory to settle",
                                          unit="s", gt=0)
    http_timeout: float = plugin.option(
        30.0, "How long an instance may take to answer HTTP on a host with CPU to spare; "
        "where the host's CPUs are saturated, this times the runnable tasks per CPU",
        unit="s", gt=0)
    http_timeout_max: float = plugin.option(
        600.0, "The HTTP timeout, however saturated the host", unit="s", gt=0)

    def problems(self) -> list[tuple[str, str]]:
        if len(set(self.ksm)) != len(self.ksm):
            return [("ksm", "each of false and true at most once")]
        if self.http_timeout_max < self.http_timeout:
            return [("http_timeout_max", f"at least http_timeout ({self.http_timeout:g} s)")]
        return []

    def http_deadline(self, load: float) -> float:
        """Seconds every instance is given to answer HTTP, scaled by load (runnable tasks
        per CPU, when the CPUs are saturated): each task gets about 1/load of a CPU, so an
        answer that needs a guest's CPU takes about load times as long."""
        return round(min(self.http_timeout_max, self.http_timeout * max(1.0, load)), 1)

    def sizes(self) -> list[int]:
        """Instances added at each step."""
        steps, total = [], 0
        while total < self.max:
            step = 1 if total < self.singles else min(self.batch, self.max - total)
            steps.append(step)
            total += step
        return steps

    def budget_bytes(self, mem_total: int) -> int:
        if self.budget.endswith("%"):
            return mem_total * int(self.budget[:-1]) // 100
        from vmtax.guest.qemu import parse_size
        return parse_size(self.budget)


# --- measuring ---------------------------------------------------------------------------

def used_kib(info: dict[str, int]) -> int:
    return info["MemTotal"] - info["MemAvailable"]


def settle(threshold_mib: float, window: float, timeout: float,
           read: Callable[[], dict[str, int]] = hugepages.meminfo,
           clock: Callable[[], float] = time.monotonic,
           sleep: Callable[[float], None] = time.sleep) -> tuple[bool, float, dict[str, int]]:
    """Until host used memory moved less than threshold over the last window seconds, or
    timeout: (settled, seconds waited, the last /proc/meminfo)."""
    start = clock()
    history: list[tuple[float, int]] = []
    while True:
        now, info = clock(), read()
        history.append((now, used_kib(info)))
        recent = [u for t, u in history if t >= now - window]
        if history[0][0] <= now - window and max(recent) - min(recent) <= threshold_mib * 1024:
            return True, now - start, info
        if now - start >= timeout:
            return False, now - start, info
        sleep(min(0.5, window / 5))


def merging_pages(pid: int) -> int:
    """Pages of pid that KSM merged (0: none, or a kernel before 5.19, or pid gone)."""
    try:
        return int(Path(f"/proc/{pid}/ksm_merging_pages").read_text())
    except (OSError, ValueError):
        return 0


def memory_of(pids: Sequence[int]) -> tuple[int, int]:
    """(RSS, PSS) in KiB summed over pids (those gone count nothing)."""
    rss = pss = 0
    for pid in pids:
        value = proc.smaps_rollup(Path(f"/proc/{pid}/smaps_rollup"))
        if value is not None:
            rss, pss = rss + value[0], pss + value[1]
    return rss, pss


def guest_ram_pss(instances: Sequence[Instance]) -> int | None:
    """KiB of PSS in the guests' RAM, summed: the mappings of each VMM (an instance's first
    process) at least half its guest's memory large; None when no instance is a guest.
    RAM on hugetlbfs counts nothing here (huge pages are not in PSS)."""
    guests = [i for i in instances if i.guest_memory and i.host_pids()]
    if not guests:
        return None
    return sum(proc.large_mappings_pss(Path(f"/proc/{i.host_pids()[0]}/smaps"),
                                       (i.guest_memory or 0) >> 11) or 0 for i in guests)


# Run in the network's namespace by the interpreter running vmtax: GET / of every address
# at once until each answers with the site or the deadline; prints address -> when it
# answered (CLOCK_MONOTONIC, the same in every process; null: it did not). A request may
# take all the time left: a guest starved of CPU can need many seconds for one answer,
# and a shorter per-request timeout would drop it every time, however long the deadline.
PROBE = r"""
import json, sys, threading, time, urllib.request
timeout, port, marker, addresses = float(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]
start = time.monotonic()
found = {}
def one(address):
    while (left := timeout - (time.monotonic() - start)) > 0:
        try:
            with urllib.request.urlopen(f"http://{address}:{port}/", timeout=left) as r:
                if r.status == 200 and marker in r.read().decode(errors="replace"):
                    found[address] = time.monotonic()
                    return
        except Exception:
            pass
        time.sleep(0.05)
threads = [threading.Thread(target=one, args=(a,)) for a in addresses]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps({a: found.get(a) for a in addresses}))
"""


def probe_http(instances: Sequence[Instance], timeout: float,
               port: int = PORT) -> dict[str, float | None]:
    """Address -> when (time.monotonic()) it answered GET / with the site (None: it did
    not within timeout)."""
    reachable = [i for i in instances if i.address]
    if not reachable:
        return {}
    done = proc.run([sys.executable, "-c", PROBE, str(timeout), str(port), MARKER,
                     *[str(i.address) for i in reachable]], timeout=timeout + 30,
                    preexec=reachable[0].client_preexec)
    try:
        answers = json.loads(done.stdout)
    except json.JSONDecodeError:
        raise VmtaxError("the HTTP probe failed: "
                         + (done.stderr.strip().splitlines() or ["no output"])[-1]) from None
    return {str(k): v for k, v in answers.items()}


@dataclass
class Step:
    instances: int
    added: int
    start_seconds: float          # starting this step's instances
    used_delta: float             # MiB, host used memory since before the first instance
    kernel_delta: dict[str, float]   # MiB, growth of Slab, PageTables, KernelStack
    pss: float                    # MiB, summed over every instance's processes
    rss: float
    answering: int
    settled: bool
    settle_seconds: float
    available: float              # MiB, MemAvailable after the step
    ksm: dict[str, int] = field(default_factory=dict)
    ksm_settled: bool | None = None
    boot_seconds: list[float] = field(default_factory=list)   # this step's instances
    # KSM's merge curve while this step waited for it: (seconds since the study started,
    # pages_sharing) per reading.
    ksm_curve: list[list[float]] = field(default_factory=list)
    # Over the settle wait, the instances idling: the host's CPUs busy (% of all of them,
    # other processes included) and the instances' own CPU (cores' worth, summed).
    host_busy: float | None = None
    instances_cpu: float | None = None
    # MiB of that PSS in the guests' RAM, as their VMMs map it (None: no guests): the rest
    # is each VMM's own process, its code, heap and device state.
    guest_ram: float | None = None
    # The HTTP check: every instance asked until it answered or http_wait seconds, scaled
    # from http_timeout by load (runnable tasks per CPU, 1-minute average, at the check);
    # the slowest answer, in seconds from the check's start.
    load: float | None = None
    cpus: int | None = None
    # MiB of the instances' pages KSM had merged (/proc/PID/ksm_merging_pages): with KSM
    # off, more than 0 means another process turned KSM on meanwhile, and PSS is low.
    merged: float | None = None
    http_wait: float | None = None
    http_slowest: float | None = None


@dataclass
class Outcome:
    target: str
    ksm: bool
    steps: list[Step]
    stopped: str                  # why it ended: "max", "budget", "memory", "a start failed: …"
    baseline_used: float          # MiB
    detail: str = ""              # budget, memory: what the next step needed against what was left

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _mib(kib: float) -> float:
    return round(kib / 1024, 2)


def study(target: Target, network: Any, settings: Settings, with_ksm: bool, journal: Any,
          on_step: Callable[[Step], None] = lambda step: None,
          say: Callable[[str], None] = lambda text: None) -> Outcome:
    """One target, KSM on or off: instances added step by step until max, the budget, the
    host's memory or a failed start; all stopped at the end (also on an error)."""
    _, _, before = settle(settings.settle_threshold, settings.settle_window,
                          settings.settle_timeout)
    budget = settings.budget_bytes(before["MemTotal"] * 1024) / 1024   # KiB
    outcome = Outcome(target.name, with_ksm, [], "max", _mib(used_kib(before)))
    lease = (ksm.enable(journal, settings.pages_to_scan, settings.sleep_millisecs)
             if with_ksm else None)
    job = serve_job()
    begun = time.monotonic()
    try:
        with InstanceFactory(target, network) as factory:
            per_instance = 0.0   # KiB, the latest step's cost per added instance
            # KiB, what a new instance holds before KSM merges any of it (RSS counts merged
            # pages whole): what the host must have free while a step starts.
            unmerged = 0.0
            last_used = 0.0
            for size in settings.sizes():
                info = hugepages.meminfo()
                need = per_instance * size
                running = len(factory.instances)
                if last_used + need > budget:
                    outcome.stopped = "budget"
                    outcome.detail = (
                        f"{running} instances took {last_used / 1024:,.0f} MiB; {size} more "
                        f"at {per_instance / 1024:.1f} MiB each would take "
                        f"{(last_used + need) / 1024:,.0f} MiB, over the budget of "
                        f"{budget / 1024:,.0f} MiB ({settings.budget}); {settings.max} at "
                        f"that cost would need {per_instance * settings.max / 1024:,.0f} MiB")
                    break
                if info["MemAvailable"] - max(need, unmerged * size) < HOST_RESERVE / 1024:
                    outcome.stopped = "memory"
                    outcome.detail = (
                        f"{running} instances running; {size} more need "
                        f"{max(need, unmerged * size) / 1024:,.0f} MiB before KSM merges "
                        f"any of it, the host has {info['MemAvailable'] / 1024:,.0f} MiB "
                        f"available and keeps {HOST_RESERVE / 2**20:,.0f} MiB for itself")
                    break
                say(f"{target.name} (KSM {'on' if with_ksm else 'off'}): starting {size} "
                    f"more ({len(factory.instances)} running)")
                count = len(factory.instances)
                started = time.monotonic()
                failure = None
                try:
                    factory.start(size, parallel=min(settings.parallel, size), job=job)
                except VmtaxError as exc:
                    failure = f"a start failed: {exc}"
                start_seconds = time.monotonic() - started
                added = factory.instances[count:]
                if added:
                    step = _measure(factory.instances, added, before, settings, with_ksm,
                                    start_seconds, begun)
                    # The next step's cost per instance, estimated high: what each holds
                    # so far, what each of the last batch added, and never below the PSS
                    # of one (used memory can hide it on a busy host). Not a single start's
                    # used memory: on a shared host other processes' churn in those seconds
                    # can be many times one instance (measured: 447 MiB for one 56 MiB
                    # guest) and would end the study at a fraction of its budget.
                    # Never above the RSS of one, where measured: another run starting
                    # beside the first container made it look 551 MiB (RSS 5.6).
                    from_used = max(step.used_delta * 1024 / step.instances,
                                    ((step.used_delta * 1024 - last_used) / len(added)
                                     if len(added) > 1 else 0.0))
                    rss_one = step.rss * 1024 / step.instances if step.rss > 0 else from_used
                    per_instance = max(step.pss * 1024 / step.instances,
                                       min(from_used, rss_one))
                    unmerged = max(unmerged, step.rss * 1024 / step.instances)
                    last_used = step.used_delta * 1024
                    outcome.steps.append(step)
                    on_step(step)
                if failure is not None:
                    outcome.stopped = failure
                    break
    finally:
        if lease is not None:
            lease.release()
    return outcome


def _measure(instances: list[Instance], added: list[Instance], before: dict[str, int],
             settings: Settings, with_ksm: bool, start_seconds: float, begun: float) -> Step:
    from vmtax.helpers.serving_client import busy_share, host_busy
    counters: dict[str, int] = {}
    ksm_settled = None
    curve: list[list[float]] = []
    if with_ksm:
        offset = time.monotonic() - begun
        merged = ksm.wait_merged(timeout=settings.ksm_timeout)
        counters, ksm_settled = merged.counters, merged.settled
        curve = [[round(offset + t, 2), pages] for t, pages in merged.curve]
    pids = [pid for i in instances for pid in i.host_pids()]
    busy, ticks, cpu_start = host_busy(), sum(map(proc.cpu_ticks, pids)), time.monotonic()
    settled, waited, info = settle(settings.settle_threshold, settings.settle_window,
                                   settings.settle_timeout)
    elapsed, busy_share_pct = time.monotonic() - cpu_start, busy_share(busy, host_busy())
    own_cpu = ((sum(map(proc.cpu_ticks, pids)) - ticks) / os.sysconf("SC_CLK_TCK") / elapsed
               if elapsed > 0 else None)
    if not with_ksm:
        counters = ksm.counters()
    rss, pss = memory_of(pids)
    guest_ram = guest_ram_pss(instances)
    merged_mib = sum(map(merging_pages, pids)) * PAGE_MIB
    cpus = os.cpu_count() or 1
    load = os.getloadavg()[0] / cpus
    wait = settings.http_deadline(load if busy_share_pct >= SATURATED else 1.0)
    asked = time.monotonic()
    answers = probe_http(instances, wait)
    times = [v - asked for v in answers.values() if v is not None]
    return Step(
        instances=len(instances), added=len(added), start_seconds=round(start_seconds, 3),
        used_delta=_mib(used_kib(info) - used_kib(before)),
        kernel_delta={k: _mib(info.get(k, 0) - before.get(k, 0)) for k in KERNEL_LINES},
        pss=_mib(pss), rss=_mib(rss), guest_ram=None if guest_ram is None else _mib(guest_ram),
        answering=sum(1 for v in answers.values() if v is not None), settled=settled,
        settle_seconds=round(waited, 2), available=_mib(info["MemAvailable"]),
        ksm=counters, ksm_settled=ksm_settled,
        boot_seconds=[round(i.boot_seconds, 4) for i in added if i.boot_seconds is not None],
        ksm_curve=curve, host_busy=round(busy_share_pct, 1),
        instances_cpu=None if own_cpu is None else round(own_cpu, 3),
        load=round(load, 2), cpus=cpus, merged=round(merged_mib, 1), http_wait=wait,
        http_slowest=round(max(times), 2) if times else None)
