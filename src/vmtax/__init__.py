"""vmtax: measure the virtualization tax of VMs and containers against the bare host."""

__version__ = "0.1.0"
