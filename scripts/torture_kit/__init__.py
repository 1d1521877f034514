"""What `scripts/torture.py` and its attacks share: the registry of attacks (registry), a
sandbox to run vmtax in and the outcome each attack fills (env), what the host holds
before and after (host), results directories made to be attacked (stores) and the
property that every path option is attacked (coverage). The attacks themselves are the
modules of the `torture_attacks` namespace package, one attack (or one family) a module.
"""
