"""Target kinds, and container runtimes, one plugin module each, with the instances they
start (`*_instance`); a kind with support of its own (its daemon, its XML, what it undoes)
is a package holding all of it (`libvirt/`). Found by the registry (vmtax.core.plugin); a
target name is `KIND` or `KIND:VARIANT` (container:runc, vm:tcg), the variant setting the
kind's `variant_option`.

May import: `vmtax.core`, `vmtax.host`, `vmtax.guest`, `vmtax.helpers`; never another
plugin package.
"""
