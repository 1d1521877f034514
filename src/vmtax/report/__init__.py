"""Renderers of stored runs: terminal tables, the HTML report, plots and exports (CSV,
JSON lines, benchstat). Each renders the analysis' view model; none measures anything.

May import: `vmtax.core`, `vmtax.host`, `vmtax.results`, `vmtax.analysis`.
"""
