"""Workloads, one plugin module each (see vmtax.core.workload), found by the registry.

May import: `vmtax.core`, `vmtax.host`, `vmtax.guest`, `vmtax.helpers`; never another
plugin package, nor another workload's module (shared code lives in vmtax.helpers).
"""
