"""Stored results: the SQLite store, where every repetition is committed as it
finishes, and the resolver of run specs (an id, a prefix, `last`, a name, an import's
label).

May import: `vmtax.core`, `vmtax.host`.
"""
