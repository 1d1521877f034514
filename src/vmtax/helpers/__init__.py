"""Helpers that more than one plugin, or a plugin and a study, share: parsers of tools'
output (sysbench's report, `perf kvm stat`), the base of runc-compatible container
runtimes (`oci_runtime`), tools built from pinned sources (the Go toolchain, vegeta and the
HTTP server), the data that macro workloads generate, the kernel tree the compile
workload reads. No plugin lives here.

May import: `vmtax.core`, `vmtax.host`, `vmtax.guest`.
"""
