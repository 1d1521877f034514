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

Memory per instance (`summarize`):
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

from vmtax.core import hints, plugin
from vmtax.core.errors import VmtaxError
from vmtax.core.instance import Instance
from vmtax.core import target as target_registry
from vmtax.core.target import Target
from vmtax.core.types import Job, Metric
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
        pss=_mib(pss), rss=_mib(rss),
        answering=sum(1 for v in answers.values() if v is not None), settled=settled,
        settle_seconds=round(waited, 2), available=_mib(info["MemAvailable"]),
        ksm=counters, ksm_settled=ksm_settled,
        boot_seconds=[round(i.boot_seconds, 4) for i in added if i.boot_seconds is not None],
        ksm_curve=curve, host_busy=round(busy_share_pct, 1),
        instances_cpu=None if own_cpu is None else round(own_cpu, 3),
        load=round(load, 2), cpus=cpus, merged=round(merged_mib, 1), http_wait=wait,
        http_slowest=round(max(times), 2) if times else None)


# --- what it comes to --------------------------------------------------------------------

@dataclass
class Summary:
    target: str
    ksm: bool
    instances: int
    stopped: str
    raw: float | None             # MiB per instance
    adjusted: float | None
    pss: float | None
    marginal: float | None        # MiB per instance of the last batch
    all_answered: bool
    settled: bool = False         # memory settled after the last step
    # Why raw, adjusted or marginal is None although measured: what they came to, which
    # no instance can cost (None: every figure is a result).
    not_results: str | None = None
    # The last step's HTTP check and the CPU while the instances idled (Step's fields).
    answering: int = 0
    http_slowest: float | None = None
    http_wait: float | None = None
    host_busy: float | None = None
    instances_cpu: float | None = None
    cpus: int | None = None
    # What the budget or the host's memory that ended it came to (Outcome.detail).
    detail: str = ""
    warning: str | None = None    # a figure the host made less than it seems


def summarize(outcome: Outcome) -> Summary:
    steps = outcome.steps
    if not steps:
        return Summary(outcome.target, outcome.ksm, 0, outcome.stopped, None, None, None,
                       None, False)
    last = steps[-1]
    n = last.instances
    kernel = sum(last.kernel_delta.values())
    prev_used = steps[-2].used_delta if len(steps) > 1 else 0.0
    from_used = {"raw": round(last.used_delta / n, 2),
                 "adjusted": round((last.used_delta - kernel) / n, 2),
                 "marginal": round((last.used_delta - prev_used) / last.added, 2)}
    # Every started instance holds memory: a cost of 0 or less is the host's other
    # processes freeing memory meanwhile, never a result (PSS counts the instances alone).
    impossible = {name: value for name, value in from_used.items() if value <= 0}
    note = None
    if impossible:
        note = (" and ".join(f"{name} {value:.1f}" for name, value in impossible.items())
                + " MiB per instance: no instance costs that; other processes on the host "
                "freed memory while these started, so the host's used memory says nothing "
                "of them here; PSS stands")
    kept = {name: None if name in impossible else value for name, value in from_used.items()}
    warning = None
    if not outcome.ksm and last.merged:
        warning = (f"KSM had merged {last.merged:,.0f} MiB of these instances although this "
                   "study ran with KSM off (another process turned it on meanwhile): their "
                   "PSS is up to that much lower than with KSM off")
    return Summary(
        outcome.target, outcome.ksm, n, outcome.stopped, kept["raw"], kept["adjusted"],
        round(last.pss / n, 2), kept["marginal"],
        all(s.answering == s.instances for s in steps), last.settled, note,
        last.answering, last.http_slowest, last.http_wait, last.host_busy,
        last.instances_cpu, last.cpus, outcome.detail, warning)


def http_line(summary: Summary) -> str | None:
    """The last step's HTTP check in words: how many answered and the slowest; with the
    CPU the idle instances took, and whether the host's CPUs were the limit (None: not
    measured)."""
    if not summary.instances or summary.http_wait is None:
        return None
    n = summary.instances
    line = (f"{summary.target} (KSM {'on' if summary.ksm else 'off'}): "
            f"{summary.answering}/{n} answered HTTP within {summary.http_wait:g} s"
            + (f", the slowest after {summary.http_slowest:.1f} s"
               if summary.http_slowest is not None else ""))
    if summary.host_busy is None or summary.instances_cpu is None:
        return line
    cpus = summary.cpus or 1
    line += (f"; idle, the {n} instances took {summary.instances_cpu:.2f} of the host's "
             f"{cpus} CPUs ({summary.instances_cpu / n * 100:.2f}% of one each), "
             f"the host was {summary.host_busy:.0f}% busy")
    if summary.host_busy >= SATURATED:
        # Limit: some did not answer; else the CPUs only slowed the answers.
        others = max(0.0, summary.host_busy / 100 * cpus - summary.instances_cpu)
        line += (f": the host's {cpus} CPUs "
                 + ("are the limit" if summary.answering < n else "were saturated")
                 + (f", {others:.2f} of them busy with other processes than the instances"
                    if others >= summary.instances_cpu else ""))
    return line


def ratios(summaries: Sequence[Summary]) -> dict[tuple[str, bool], float]:
    """(target, ksm) -> adjusted cost relative to the cheapest target with the same KSM
    setting: how many of the cheapest fit in the memory of one of it. Only where two
    targets or more have a positive cost: a target alone is cheapest by default."""
    found = {}
    for with_ksm in (False, True):
        costs = {s.target: s.adjusted for s in summaries
                 if s.ksm == with_ksm and s.adjusted is not None and s.adjusted > 0}
        if len(costs) > 1:
            cheapest = min(costs.values())
            found.update({(t, with_ksm): round(c / cheapest, 2) for t, c in costs.items()})
    return found


# --- stored ------------------------------------------------------------------------------

def _mb(name: str, value: float, dims: dict[str, str] | None = None,
        unit: str = "MiB") -> Metric:
    return Metric(name, float(value), unit, False, dims or {})


def step_metrics(step: Step) -> list[Metric]:
    """One step as metrics with its instance count as a dimension (phase "step")."""
    dims = {records.INSTANCES: str(step.instances)}
    metrics = [_mb(records.USED_DELTA, step.used_delta, dims),
               _mb(records.PSS_TOTAL, step.pss, dims),
               _mb("rss total", step.rss, dims),
               Metric("answering", float(step.answering), "instances", True, dims),
               Metric("settle time", step.settle_seconds, "s", False, dims),
               Metric("start time", step.start_seconds, "s", False, dims),
               _mb("available", step.available, dims)]
    metrics += [_mb(f"{k} delta", v, dims) for k, v in step.kernel_delta.items()]
    if step.host_busy is not None and step.instances_cpu is not None:
        metrics += [Metric("host cpu busy", step.host_busy, "%", False, dims),
                    Metric("instances cpu", step.instances_cpu, "cores", False, dims)]
    metrics += [Metric(f"ksm {k}", float(v), "pages", k == "pages_sharing", dims)
                for k, v in step.ksm.items()]
    metrics += [Metric(records.KSM_SAVED, saved, "MiB", True,
                       {**dims, records.SECONDS: f"{seconds:g}"})
                for seconds, saved in curve_points(step.ksm_curve)]
    return metrics


CURVE_READINGS = 24   # per step, stored as metrics (the step's JSON keeps every reading)


def curve_points(curve: Sequence[Sequence[float]],
                 most: int = CURVE_READINGS) -> list[tuple[float, float]]:
    """(seconds, MiB KSM saved) of a step's merge curve, at most `most` readings of it
    evenly spread, its first and last always among them."""
    if not curve:
        return []
    count = min(most, len(curve))
    picks = sorted({round(i * (len(curve) - 1) / max(1, count - 1)) for i in range(count)})
    return [(float(curve[i][0]), round(curve[i][1] * PAGE_MIB, 2)) for i in picks]


SPARKS = "▁▂▃▄▅▆▇█"


def ksm_curve_line(outcome: Outcome, width: int = 40) -> str | None:
    """KSM's merge curve over the whole study in one line: a sparkline of the memory it
    saved over time, where it ended and when it first came within 10% of that (None: KSM
    off or no reading)."""
    readings = [(t, pages * PAGE_MIB) for step in outcome.steps for t, pages in step.ksm_curve]
    if not outcome.ksm or not readings:
        return None
    readings.sort()
    end_t, end = readings[-1]
    first_t = readings[0][0]
    top = max(v for _, v in readings) or 1.0
    sparks = ""
    for i in range(width):
        at = first_t + (end_t - first_t) * i / max(1, width - 1)
        value = next(v for t, v in reversed(readings) if t <= at + 1e-9)
        sparks += SPARKS[min(len(SPARKS) - 1, int(value / top * len(SPARKS)))]
    near = next(t for t, v in readings if v >= 0.9 * end) if end > 0 else end_t
    return (f"KSM merge curve, {outcome.target}: {sparks} {readings[0][1]:,.0f} → "
            f"{end:,.0f} MiB saved from {first_t:,.0f} to {end_t:,.0f} s of the study "
            f"({outcome.steps[-1].instances} instances; within 10% of the end by "
            f"{near:,.0f} s)")


def summary_metrics(summary: Summary, ratio: float | None) -> list[Metric]:
    """The study's outcome; the first is what `vmtax show` headlines."""
    metrics = []
    for name, value in (("memory per instance", summary.raw),
                        ("memory per instance adjusted", summary.adjusted),
                        ("pss per instance", summary.pss),
                        ("marginal per instance", summary.marginal)):
        if value is not None:
            metrics.append(_mb(name, value))
    metrics.append(Metric("instances", float(summary.instances), "instances", True))
    if ratio is not None:
        metrics.append(Metric("density ratio", ratio, "x", False))
    return metrics


def params(with_ksm: bool) -> dict[str, str]:
    return {records.KSM: "on" if with_ksm else "off"}


def load_outcomes(run: Any) -> list[Outcome]:
    """The outcomes of a stored density run (vmtax.results.store.Run), from its step reps."""
    found: dict[tuple[str, bool], Outcome] = {}
    for rep in run.reps:
        if rep.workload != WORKLOAD or rep.phase != records.STEP or not rep.stdout:
            continue
        with_ksm = rep.params.get(records.KSM) == "on"
        key = (rep.target, with_ksm)
        if key not in found:
            found[key] = Outcome(rep.target, with_ksm, [], "", 0.0)
        found[key].steps.append(Step(**json.loads(rep.stdout)))
    for rep in run.reps:
        if rep.workload == WORKLOAD and rep.phase == "measure":
            key = (rep.target, rep.params.get(records.KSM) == "on")
            if key in found and rep.stdout:
                stored = json.loads(rep.stdout)
                found[key].stopped = stored.get("stopped", "")
                found[key].detail = stored.get("detail", "")
    return list(found.values())


def json_step(step: Step) -> str:
    """A step as stored in its rep's stdout (load_outcomes reads it back)."""
    return json.dumps(asdict(step), sort_keys=True)


def json_summary(outcome: Outcome) -> str:
    return json.dumps({"stopped": outcome.stopped, "baseline_used": outcome.baseline_used,
                       "detail": outcome.detail})


# --- across runs -------------------------------------------------------------------------

@dataclass
class StoredStudy:
    """A density run's summaries, as its targets are named across runs."""
    run_id: str
    summaries: list[Summary]
    kinds: dict[str, str]         # target label -> target kind
    kernel: str                   # the host's kernel release when it ran
    curves: list[str] = field(default_factory=list)   # ksm_curve_line of each KSM-on study


def stored_study(run: Any, results: str | os.PathLike | None = None) -> StoredStudy:
    """The summaries of a stored density run (vmtax.results.store.Run, loaded with its output,
    from the results directory results); VmtaxError in one line when it is not one or
    measured nothing."""
    kind = run.plan.get("kind") if isinstance(run.plan, dict) else None
    if kind != WORKLOAD:
        what = f"a {kind} run" if kind else "a run of workloads"
        raise VmtaxError(f"run {run.id} is not a density run ({what}); "
                         f"`{hints.command('runs', results=results)}` lists them, "
                         f"`{hints.command('density', results=results)}` makes them")
    outcomes = load_outcomes(run)
    if not outcomes:
        raise VmtaxError(f"run {run.id} is a density run without a measured step "
                         f"(status {run.status}); "
                         f"`{hints.command('show', run.id, results=results)}` lists why")
    kinds = {t["name"]: t.get("kind", "") for t in run.plan.get("targets", [])
             if isinstance(t, dict) and "name" in t}
    kinds.update({name: t.get("kind", kinds.get(name, "")) for name, t in run.targets.items()})
    return StoredStudy(run.id, [summarize(o) for o in outcomes], kinds,
                       str(run.host.get("kernel", "")),
                       [line for o in outcomes if (line := ksm_curve_line(o))])


def combine(studies: Sequence[StoredStudy]) -> tuple[list[tuple[str, Summary]],
                                                     dict[str, str]]:
    """Every study's summaries side by side: [(run id, summary)] with targets relabelled
    "NAME (RUN)" where a name comes from more than one run (so ratios() keeps them apart),
    and label -> kind."""
    runs_of: dict[str, set[str]] = {}
    for study in studies:
        for s in study.summaries:
            runs_of.setdefault(s.target, set()).add(study.run_id)
    rows, kinds = [], {}
    for study in studies:
        for s in study.summaries:
            label = s.target if len(runs_of[s.target]) == 1 else f"{s.target} ({study.run_id})"
            rows.append((study.run_id, Summary(**{**asdict(s), "target": label})))
            kinds[label] = study.kinds.get(s.target, "")
    return rows, kinds


def ratio_lines(summaries: Sequence[Summary]) -> list[str]:
    """Per KSM setting measured: each target's memory per instance against the cheapest
    target's, in words: adjusted (where both are positive: on a busy host, used memory
    can move more than the instances add) and PSS (the instances' own processes)."""
    lines = []
    for with_ksm in (False, True):
        measured = sorted((s for s in summaries if s.ksm == with_ksm and s.pss),
                          key=lambda s: s.pss or 0.0)
        if len(measured) < 2:
            continue
        base = measured[0]
        parts = []
        for s in measured[1:]:
            assert s.pss is not None and base.pss is not None   # measured
            words = f"{s.target} PSS {s.pss:.1f} MiB = {s.pss / base.pss:.2f}×"
            if s.adjusted and base.adjusted and s.adjusted > 0 and base.adjusted > 0:
                words += (f", adjusted {s.adjusted:.1f} MiB = "
                          f"{s.adjusted / base.adjusted:.2f}×")
            parts.append(words)
        lines.append(f"KSM {'on' if with_ksm else 'off'}, per instance against "
                     f"{base.target} (PSS {base.pss:.1f} MiB"
                     + (f", adjusted {base.adjusted:.1f} MiB" if base.adjusted
                        and base.adjusted > 0 else "") + "): " + "; ".join(parts))
    return lines
