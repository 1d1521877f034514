"""Experiments: plans (files and flags), the session every study runs in, and the studies
themselves: run (`comparison`, on the runner and its repetition policies), tune, density,
boot and fleet. A study gets a request (`requests`: typed, importing nothing of vmtax) or a
plan, creates targets through the contract and records a run.

May import: `vmtax.core`, `vmtax.host`, `vmtax.guest`, `vmtax.helpers`, `vmtax.results`,
`vmtax.analysis`; plugins only through the contract's registry.
"""
