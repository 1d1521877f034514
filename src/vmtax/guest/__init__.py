"""What runs inside targets, made from the host's own binaries: the guest image, the
container root filesystem, the guest kernels, the agent's protocol, QEMU's command line and
the bundle shipped to remote machines. The non-Python files here (agent, init, ...) are
the guest's own scripts.

May import: `vmtax.core`, `vmtax.host`.
"""
