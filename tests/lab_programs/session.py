"""The program a live test's lab session gives each command to (vmtax.studies.lab.run's
`program`): `kill9 KIND` runs kill9_microvm.py, which must look at the lab's processes;
anything else is a vmtax command."""

import os
import sys
from pathlib import Path

if sys.argv[1:2] == ["kill9"]:
    probe = str(Path(__file__).with_name("kill9_microvm.py"))
    os.execv(sys.executable, [sys.executable, probe, *sys.argv[2:]])
os.execv(sys.executable, [sys.executable, "-m", "vmtax", *sys.argv[1:]])
