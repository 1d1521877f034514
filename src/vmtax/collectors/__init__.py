"""Collectors, one plugin module each (see vmtax.core.collector), found by the registry.

May import: `vmtax.core`, `vmtax.host`, `vmtax.helpers`; never another plugin package.
"""
