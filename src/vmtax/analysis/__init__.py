"""Numbers from stored runs: statistics (medians, intervals, tests), the run summary that
every report renders (rows, cells, ratios, flags), comparisons, and the per-class
composite index with its verdicts. Knows plugins only through the contract's registry.

May import: `vmtax.core`, `vmtax.results`.
"""
