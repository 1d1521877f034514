"""Services on the host that vmtax changes and undoes: the undo journal and its guardian,
processes, networks, huge pages, KSM, the KVM probe, read-only trees, quietness checks, SSH
sessions, the host's fingerprint (`machine`) and `vmtax doctor` (`doctor`, which finds the
plugins' checks through the core registry).

May import: `vmtax.core`.
"""
