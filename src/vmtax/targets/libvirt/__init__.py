"""The libvirt target kind and everything it needs, in one place: the target (`target.py`,
the plugin), the guests it boots (`instance.py`), the users' domains it measures as they
are (`existing.py`), the domain XML it writes and reads back (`domain_xml.py`), libvirt
reached through virsh with the daemons vmtax starts and the undo of what it made
(`virsh.py`), and the NAT network of vmtax's own (`nat.py`).

Like any target plugin it may import the parts below targets (helpers, guest, host, core).
Nothing here is imported from below: the journal names the undo functions by their dotted
path (vmtax.host.journal.MOVED forwards the paths of older versions), and this package
imports nothing on its own, so undoing a domain after a crash imports virsh.py alone.
"""
