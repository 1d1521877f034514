"""Figures drawn from a stored run itself rather than its summary: a density study's
memory, cold starts (E4), and a `vmtax tune` stage's forest plot."""

from __future__ import annotations

import json
from itertools import cycle
from typing import Any

import matplotlib
from matplotlib.figure import Figure

from vmtax.analysis import tune as tuning
from vmtax.report.figure import (BASELINE_COLOR, DPI, LOG_SPAN, PALETTE, STYLE, SWEEP_SIZE,
                                 Chart, finite)
from vmtax.results import study_records as records

# -- density and start-up (E4) -----------------------------------------------------------------
# Their numbers are per step of a density study and per cold start (`vmtax boot`), not
# medians of repetitions: drawn from the stored run itself, through the typed records
# vmtax.results.study_records declares (the studies write what those read).


def _run_colors(targets: list[str]) -> dict[str, str]:
    return dict(zip(targets, cycle(PALETTE)))


def _density_lines(points: list[records.DensityPoint]
                   ) -> dict[tuple[str, str], list[tuple[float, float]]]:
    """(target, KSM on|off) -> [(instances, value)] of a density run's steps."""
    lines: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for point in points:
        lines.setdefault((point.target, point.ksm), []).append((point.instances, point.value))
    return {key: sorted(points) for key, points in lines.items()}


def _finish(fig: Figure, ax: Any, title: str, grid: str) -> None:
    """The E4 figures' common frame: light grid lines on one axis, the legend outside on
    the right, the title left."""
    ax.grid(True, axis=grid, color="#eef0f2")
    fig.legend(loc="outside right upper", fontsize=8)
    fig.suptitle(title, x=0.01, ha="left", fontsize=STYLE["axes.titlesize"],
                 fontweight=STYLE["axes.titleweight"])


def _density_figure(title: str, ylabel: str,
                    lines: dict[tuple[str, str], list[tuple[float, float]]],
                    labels: dict[str, str]) -> Figure:
    targets = list(dict.fromkeys(t for t, _ in lines))
    colors = _run_colors(targets)
    fig = Figure(figsize=SWEEP_SIZE, dpi=DPI, layout="constrained")
    ax = fig.subplots()
    for (target, ksm), points in lines.items():
        on = ksm == "on"
        ax.plot([p[0] for p in points], [p[1] for p in points], color=colors[target],
                linestyle="--" if on else "-", marker="s" if on else "o", markersize=4,
                linewidth=1.6, label=f"{labels.get(target, target)}, KSM {ksm}")
    ax.set_xlabel("instances")
    ax.set_ylabel(ylabel)
    _finish(fig, ax, title, "x")
    return fig


def density_memory(run: Any, labels: dict[str, str],
                   steps: dict[str, list[records.DensityPoint]]) -> list[Chart]:
    """Host used memory (delta) against the instance count, and PSS per instance: one
    line per target and KSM setting (steps: each metric's points, analysis.model.study_records)."""
    used = _density_lines(steps.get(records.USED_DELTA, []))
    if not used:
        return []
    pss = {key: [(n, v / n) for n, v in points if n > 0]
           for key, points in _density_lines(steps.get(records.PSS_TOTAL, [])).items()}
    # Containers measured with KSM on: why their lines do not move (the study stores the
    # note with the run, from the host it ran on).
    note = run.plan.get(records.KSM_NOTE) if any(on == "on" for _, on in used) else None
    with matplotlib.rc_context(STYLE):
        return [
            Chart("density-memory-used", "density: host memory used vs instances",
                  "Host used memory (MemTotal − MemAvailable) after each step, less what "
                  "it was before the first instance; solid KSM off, dashed KSM on."
                  + (f" {note}" if note else ""),
                  _density_figure("density: host memory used vs instances",
                                  "used memory delta (MiB)", used, labels)),
            Chart("density-memory-per-instance", "density: memory per instance",
                  "Summed PSS of every instance's host processes (shared pages divided "
                  "among their sharers) per instance, after each step.",
                  _density_figure("density: memory per instance", "PSS per instance (MiB)",
                                  pss, labels))]


def density_ksm(readings: list[records.KsmReading], labels: dict[str, str]) -> list[Chart]:
    """KSM's merge curve: memory it saved against the seconds of the study, one line per
    target measured with KSM on, a marker where each step's wait for merging ended."""
    lines: dict[str, list[records.KsmReading]] = {}
    for reading in readings:
        lines.setdefault(reading.target, []).append(reading)
    if not lines:
        return []
    colors = _run_colors(list(lines))
    title = "density: KSM merge curve"
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=SWEEP_SIZE, dpi=DPI, layout="constrained")
        ax = fig.subplots()
        for target, readings in lines.items():
            readings = sorted(readings, key=lambda r: r.seconds)
            # One segment per step's wait: between them instances start, unread (a gap).
            xs: list[float] = []
            ys: list[float] = []
            ends: dict[float, records.KsmReading] = {}
            for r in readings:
                if ends and r.instances not in ends:
                    xs, ys = [*xs, float("nan")], [*ys, float("nan")]
                xs, ys = [*xs, r.seconds], [*ys, r.saved]
                ends[r.instances] = r   # each step's last reading
            ax.plot(xs, ys, color=colors[target], linewidth=1.6,
                    label=labels.get(target, target))
            ax.plot([r.seconds for r in ends.values()], [r.saved for r in ends.values()],
                    color=colors[target], linestyle="none", marker="o", markersize=3)
            last = readings[-1]
            ax.annotate(f"{last.instances:g} instances", (last.seconds, last.saved),
                        fontsize=7, xytext=(-4, 4), textcoords="offset points", ha="right")
        ax.set_xlabel("seconds since the study started")
        ax.set_ylabel("memory KSM saved (MiB)")
        _finish(fig, ax, title, "y")
    return [Chart("density-ksm-curve", title,
                  "Memory KSM saved (pages_sharing × page size) while each step waited for "
                  "merging to settle, against the seconds since the study started; a dot "
                  "where each step's wait ended. The gaps: the next step's instances "
                  "starting, and memory settling, while KSM is not read.", fig)]


def boot_ecdf(starts: list[records.BootStart], labels: dict[str, str]) -> list[Chart]:
    """Cold-start times as empirical CDFs: one line per target, to ready (solid) and to
    the first HTTP answer (dashed)."""
    times: dict[tuple[str, str], list[float]] = {}
    for start in starts:
        times.setdefault((start.target, start.milestone), []).append(start.seconds)
    if not times:
        return []
    targets = list(dict.fromkeys(t for t, _ in times))
    colors = _run_colors(targets)
    title = "start-up: cold-start time ECDF"
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=SWEEP_SIZE, dpi=DPI, layout="constrained")
        ax = fig.subplots()
        for (target, what), values in sorted(times.items()):
            ordered = sorted(values)
            # From 0 at the fastest start, a step up at each one.
            xs = [ordered[0], *ordered]
            ys = [0.0, *((i + 1) / len(ordered) for i in range(len(ordered)))]
            ax.step(xs, ys, where="post", color=colors[target],
                    linestyle={"ready": "-", "guest ready": ":"}.get(what, "--"), linewidth=1.6,
                    label=f"{labels.get(target, target)}: {what}")
        ax.set_xlabel("seconds from start")
        ax.set_ylabel("share of starts")
        ax.set_ylim(0, 1.02)
        if min(min(v) for v in times.values()) > 0 and \
                max(max(v) for v in times.values()) / min(min(v) for v in times.values()) \
                >= LOG_SPAN / 10:
            ax.set_xscale("log")
        _finish(fig, ax, title, "x")
    return [Chart("boot-ecdf", title,
                  "Each cold start's time to ready (solid: a guest's agent READY, a "
                  "container's first process) and to its first HTTP answer (dashed); "
                  "dotted: a guest's own uptime at READY (without QEMU's start).", fig)]


# -- `vmtax tune` ----------------------------------------------------------------------------
VERDICT_COLORS = {"better": "#009E73", "worse": "#D55E00"}


def tune_forest(summary: tuning.TuneSummary | None, labels: dict[str, str]) -> list[Chart]:
    """A forest plot of a tune stage: one row per knob value (and workload), its gain over
    the baseline with the CI, coloured by the adjusted verdict; the control in grey. Of
    the combined stage: the combination against the baseline and the best single, with
    the tax recovered per class in the caption."""
    if summary is None:
        return []
    rows: list[tuple[str, tuning.Effect, bool]] = []
    several = len({(e.workload, json.dumps(e.params, sort_keys=True))
                   for k in summary.knobs for e in k.effects}) > 1
    for knob in summary.knobs:
        for e in knob.effects:
            name = "control (A vs A)" if knob.control else knob.label
            rows.append((f"{name} · {e.workload}" if several else name, e, knob.control))
    for e in summary.vs_baseline:
        rows.append((f"tuned vs {summary.baseline} · {e.workload}", e, False))
    for e in summary.vs_best:
        rows.append((f"tuned vs {summary.best} · {e.workload}", e, False))
    rows = [r for r in rows if finite(r[1].gain.value)]
    if not rows:
        return []
    title = f"tune: gain over {summary.baseline} per knob value"
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(9.0, 1.2 + 0.32 * len(rows)), dpi=DPI, layout="constrained")
        ax = fig.subplots()
        for y, (_, effect, control) in enumerate(reversed(rows)):
            g = effect.gain
            color = (BASELINE_COLOR if control
                     else VERDICT_COLORS.get(effect.comparison.verdict, "#30343a"))
            low = g.low if finite(g.low) else g.value
            high = g.high if finite(g.high) else g.value
            ax.plot([100 * low, 100 * high], [y, y], color=color, linewidth=2)
            ax.plot([100 * g.value], [y], marker="D" if control else "o", color=color,
                    markersize=5)
        ax.set_yticks(range(len(rows)), [r[0] for r in reversed(rows)])
        ax.set_ylim(-0.6, len(rows) - 0.4)
        ax.axvline(0, color="#30343a", linewidth=0.8)
        ax.set_xlabel(f"gain over {summary.baseline} (%), {100 * (1 - summary.alpha):g}% CI; "
                      "green better, red worse (adjusted), black ~")
        ax.grid(True, axis="x", color="#eef0f2")
        ax.grid(False, axis="y")
        fig.suptitle(title, x=0.01, ha="left", fontsize=STYLE["axes.titlesize"],
                     fontweight=STYLE["axes.titleweight"])
    recovered = ", ".join(f"{group} {value:.0%}" for group, value in
                          summary.tax_recovered.items() if value is not None)
    caption = (f"Each knob value's gain over the baseline {summary.baseline} (positive: "
               f"faster), verdicts adjusted ({summary.method}) over every comparison of the "
               f"search; {summary.control_text}."
               + (f" Tax recovered by the combination, (tuned − baseline) / (native − "
                  f"baseline): {recovered}." if recovered else ""))
    return [Chart("tune-forest", title, caption, fig), *_tax_recovered(summary)]


def _tax_recovered(summary: tuning.TuneSummary) -> list[Chart]:
    """The combination's tax recovered per class of work: 100% is native speed."""
    shown = {g: v for g, v in summary.tax_recovered.items() if v is not None}
    if not shown:
        return []
    title = "tune: tax recovered per class"
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(9.0, 1.0 + 0.4 * len(shown)), dpi=DPI, layout="constrained")
        ax = fig.subplots()
        groups = list(shown)
        ax.barh(range(len(groups)), [100 * shown[g] for g in groups], color=PALETTE[0])
        ax.set_yticks(range(len(groups)), groups)
        ax.axvline(0, color="#30343a", linewidth=0.8)
        ax.axvline(100, color=BASELINE_COLOR, linestyle="--", linewidth=0.8)
        ax.set_xlabel("tax recovered (%): 0 the baseline, 100 native speed")
        ax.grid(True, axis="x", color="#eef0f2")
        ax.grid(False, axis="y")
        fig.suptitle(title, x=0.01, ha="left", fontsize=STYLE["axes.titlesize"],
                     fontweight=STYLE["axes.titleweight"])
    tuned = summary.tuned_text
    return [Chart("tune-tax-recovered", title,
                  f"(tuned − baseline) / (native − baseline) of each class's primary metric "
                  f"medians, the tuned configuration being {tuned}.", fig)]
