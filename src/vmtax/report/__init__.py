"""Renderers of stored runs: terminal tables, the HTML report, plots and exports (CSV,
JSON lines, benchstat). Each renders the analysis' view model; none measures anything.

What every renderer says the same way (numbers, the notation of intervals, labels, flags)
is `parts`; no renderer but the terminal's tables takes anything from `terminal`.

May import: `vmtax.core`, `vmtax.results`, `vmtax.analysis`; never `vmtax.host` (what a
figure needs of the host is stored with its run, or read by analysis from what was).
"""
