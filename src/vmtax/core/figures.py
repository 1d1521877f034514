"""A workload's own figures, described in neutral terms for the report to draw.

The report's generic figures (ratio bars, every repetition, parameter sweeps) suit metrics
that one number per configuration describes. A workload whose metrics carry dimensions
that the generic figures would scatter over dozens of charts (serving: an endpoint and an
offered rate on every latency) declares its figures instead (`Workload.figures`), and gets
only those. Plugins cannot import the report, so a figure is described here by what it
shows: which metric, which of its dimensions is the x axis or makes the panels, which axes
are logarithmic. The report (vmtax.report.plots) draws one chart per figure and
configuration of the workload (its parameters that vary in the run), titled
"WORKLOAD: TITLE (PARAMETERS)"; the y axis is the metric with its unit and direction.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mark:
    """A point marked on each line of a `Lines` figure: the one whose x is the median of
    another metric of the same panel and target (serving's capacity on its latency curve).
    When `bound` is set, a median of that 0/1 metric below 1/2 says the marked value is
    only a lower bound: drawn as an open triangle pointing on, with "≥"."""
    metric: str              # its median is the x of the marked point: "requests/s"
    label: str               # the legend's entry for a mark
    bound: str | None = None      # the 0/1 metric: 1 the mark is exact, 0 a lower bound
    bound_label: str = ""         # the legend's entry for a lower bound


@dataclass(frozen=True)
class Lines:
    """`metric` against a numeric dimension, one panel per value of another dimension,
    one line per target with its confidence band. Rows whose x dimension is no number
    are left out."""
    slug: str                # file name stem after the workload's: "p99-vs-rate"
    title: str               # after "WORKLOAD: "
    caption: str
    metric: str
    x: str                   # the dimension on the x axis: "rate"
    x_label: str
    panels: str              # one panel per value of this dimension: "endpoint"
    log_x: bool = False
    log_y: bool = False
    mark: Mark | None = None


@dataclass(frozen=True)
class Bars:
    """`metric`'s median per value of a dimension (one group of bars each, labelled by
    the value), one bar per target with its confidence interval, the median written on
    it; a log y axis when the medians span two orders of magnitude."""
    slug: str
    title: str
    caption: str
    metric: str
    groups: str              # one group of bars per value of this dimension: "endpoint"


Figure = Lines | Bars
