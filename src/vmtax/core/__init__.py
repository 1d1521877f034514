"""The core: neutral data types, errors, paths and the plugin contract.

Holds what every other part shares: the data that flows between parts (`types`), errors,
where vmtax keeps files (`paths`), the plugin machinery (`plugin`, `option_types`) and the
contract of each kind of plugin: `workload`, `target`, `collector`, `runtime` (container
runtimes), `instance` (one running guest or container). May import: nothing of vmtax
outside `vmtax.core`.
"""
