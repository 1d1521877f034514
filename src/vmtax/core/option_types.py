"""Option types plugins share: sizes, host CPUs, programs, files.

Each is an `Annotated` type whose `Expect` says in words what it takes, so plan errors
read `expected a size like "2G", got 2`.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field, StringConstraints

from vmtax.core.limits import MAX_SECONDS
from vmtax.core.plugin import Expect

# A bare number is ambiguous (QEMU reads -m 512 as MiB), so a unit is required.
Size = Annotated[str, StringConstraints(pattern=r"^[1-9][0-9]*[KMGTkmgt]$"),
                 Expect('a size like "2G"')]


def size_bytes(size: str) -> int:
    """A Size in bytes, its unit binary as every tool vmtax passes it to reads it: "2K" is
    2048."""
    return int(size[:-1]) << {"K": 10, "M": 20, "G": 30, "T": 40}[size[-1].upper()]

NonEmpty = Annotated[str, StringConstraints(min_length=1, pattern=r"\S")]

Seconds = Annotated[float, Field(gt=0, le=MAX_SECONDS),
                    Expect(f"a positive number of seconds, at most {MAX_SECONDS} (a day)")]


def cpulist(cpus: set[int] | list[int]) -> str:
    """{0, 1, 2, 5} -> "0-2,5", as in /sys/devices/system/cpu/online."""
    ranges = []
    for _, group in itertools.groupby(enumerate(sorted(cpus)), lambda p: p[1] - p[0]):
        ids = [cpu for _, cpu in group]
        ranges.append(str(ids[0]) if len(ids) == 1 else f"{ids[0]}-{ids[-1]}")
    return ",".join(ranges)


_CPUSET = re.compile(r"\d+(-\d+)?(,\d+(-\d+)?)*")


def _parse_cpuset(value: Any) -> Any:
    """"0-2,5" -> [0, 1, 2, 5]; a list passes through (checked after)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if not isinstance(value, str) or not _CPUSET.fullmatch(value.replace(" ", "")):
        return value
    cpus: list[int] = []
    for part in value.replace(" ", "").split(","):
        low, _, high = part.partition("-")
        cpus.extend(range(int(low), int(high or low) + 1))
    return cpus


def _usable_cpus(cpus: list[int]) -> list[int]:
    usable = os.sched_getaffinity(0)
    if not cpus or len(set(cpus)) != len(cpus) or not set(cpus) <= usable:
        raise ValueError("not usable")
    return cpus


HostCpus = Annotated[list[int], BeforeValidator(_parse_cpuset), AfterValidator(_usable_cpus),
                     Expect("distinct host CPUs vmtax may use, as a list or a cpuset like "
                            f'"0-1" (usable here: {cpulist(os.sched_getaffinity(0))}), '
                            'or "none"')]


def _on_path(value: str) -> str:
    """A program's name as given, or its path made absolute ("../x" resolved from the
    current directory): what a plan names is the same file wherever vmtax joins it."""
    if shutil.which(value) is None:
        raise ValueError("not found")
    return os.path.abspath(value) if "/" in value else value


Program = Annotated[str, AfterValidator(_on_path),
                    Expect("an executable program (a path, or a name found on PATH)")]

Programs = Annotated[list[Annotated[str, AfterValidator(_on_path)]],
                     Expect('a list of programs found on PATH, like ["stress-ng"]')]


def _is_file(value: str) -> str:
    try:
        found = Path(value).expanduser().is_file()
    except (OSError, ValueError):   # a name too long for the filesystem, a NUL in it
        found = False
    if not found:
        raise ValueError("missing")
    return _absolute(value)


ExistingFile = Annotated[str, AfterValidator(_is_file), Expect("the path of an existing file")]


def _absolute(value: str) -> str:
    return os.path.abspath(os.path.expanduser(value))


# A file on this host vmtax reads or writes (an ssh key, a known_hosts file): kept absolute,
# "~" and "../" resolved where vmtax was started, so a stored plan names the same file.
LocalPath = Annotated[str, StringConstraints(min_length=1, pattern=r"\S"),
                      AfterValidator(_absolute), Expect("a path of a file on this host")]


# Guest kernels by name (vmtax.guest.image.DEBIAN_KERNELS says which Debian package each is).
DEBIAN_KERNEL_NAMES = ("debian", "debian-rt")


def _guest_kernel(value: str) -> str:
    if value in (*DEBIAN_KERNEL_NAMES, "minimal"):
        return value
    return _is_file(value)


GuestKernel = Annotated[str, AfterValidator(_guest_kernel),
                        Expect('"debian" (Debian\'s kernel), "debian-rt" (its PREEMPT_RT '
                               'kernel), "minimal" (built by vmtax) or the path of a vmlinux '
                               'or bzImage file')]
