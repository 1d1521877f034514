"""Experiments: plans (files and flags), the session every study runs in, and the studies
themselves: run (the runner), density, boot, exits and fleet. A study reads a plan,
creates targets through the contract and records a run.

May import: `vmtax.core`, `vmtax.host`, `vmtax.guest`, `vmtax.helpers`, `vmtax.results`,
`vmtax.analysis`; plugins only through the contract's registry.
"""
