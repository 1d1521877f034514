"""What E3's macro workloads share: jobs written as busybox shell scripts, phases timed by
the target's own clock, deterministic test data, and data files carried into targets.

Every target carries busybox (vmtax.guest.rootfs), and the host's busybox is the same file, so
scripts run by `busybox sh` and helpers called as `busybox cat` behave byte-identically
natively, in containers and in guests; the measured programs are the Debian binaries a
workload declares. Debian's busybox prefers its own applets to programs on PATH (its `dd`
runs busybox's dd), so a script calls those binaries by the absolute path the host has
them at, where every target's root file system carries them too ($DD_BIN, $BZIP2_BIN,
...; not $BZIP2, which bzip2 reads its options from).
Values reach a script as positional parameters ("$1") or its environment, never pasted
into its text.

A timed phase prints `vmtax-time LABEL START END` from /proc/uptime (10 ms steps, read by
the shell itself without a fork), so the parser gets seconds as the target's clock saw
them: the same clock a user timing the command inside the guest would read.

Test data is pseudo-English text from a fixed word list and a fixed-seed generator in
busybox awk: 1 MiB of it, repeated to the requested size, and a tree of small files cut
from it. bzip2 compresses 900 kB blocks independently, so a repeated 1 MiB text
compresses like that text does (about 3.5:1) instead of collapsing like a repeated block.
"""

from __future__ import annotations

import base64
import functools
import gzip
import hashlib
import re
import shutil
from pathlib import Path
from typing import ClassVar

from vmtax.core import plugin
from vmtax.core.errors import ParseError, VmtaxError
from vmtax.core.option_types import Size
from vmtax.core.types import Job
from vmtax.core.workload import Workload

SHELL = ("busybox", "sh", "-c")
# Shell functions every script starts with: set -e stops at the first failing step, so a
# broken phase never prints a time.
PRELUDE = """set -eu
set -o pipefail
begin() { read -r _t0 _ < /proc/uptime; }
end() { read -r _t1 _ < /proc/uptime; echo "vmtax-time $1 $_t0 $_t1"; }
"""
# /proc/uptime's step.
TIME_RESOLUTION = 0.01
SEED_BYTES = 1 << 20
FILES_PER_DIR = 100

_WORDS = (
    "the of and to a in is it you that he was for on are with as I his they be at one have "
    "this from or had by word but what some we can out other were all there when up use your "
    "how said an each she which do their time if will way about many then them write would "
    "like so these her long make thing see him two has look more day could go come did number "
    "sound no most people my over know water than call first who may down side been now find "
    "any new work part take get place made live where after back little only round man year "
    "came show every good me give our under name very through just form sentence great think "
    "say help low line differ turn cause much mean before move right boy old too same tell "
    "does set three want air well also play small end put home read hand port large spell add "
    "even land here must big high such follow act why ask men change went light kind off need "
    "house picture try us again animal point mother world near build self earth father head "
    "stand own page should country found answer school grow study still learn plant cover food "
    "sun four between state keep eye never last let thought city tree cross farm hard start "
    "might story saw far sea draw left late run while press close night real life few north")

# The generator: `awk -v mode=text` prints SEED_BYTES of text; `mode=dirs` prints the tree's
# directories; `mode=tree` writes `files` files of 256 B .. 16 KiB (most of them small, as
# in a source tree: 4 KiB on average), runs of that text's lines from pseudo-random ones. A
# Park-Miller generator keeps every product below 2^53, exact in awk's doubles.
_AWK = r"""
function rnd() { x = (x * 16807) % 2147483647; return x / 2147483647 }
BEGIN {
    x = 20261123; n = split(words, w, " ")
    if (mode == "dirs") {
        for (d = 0; d * per < files; d++) printf "tree/d%03d\n", d
        exit
    }
    if (mode == "text") {
        while (size < bytes) {
            k = 4 + int(rnd() * 14); line = ""
            for (i = 0; i < k; i++) {
                r = rnd(); word = w[1 + int(n * r * r)]
                if (rnd() < 0.03) word = int(rnd() * 100000)
                line = line (i ? " " : "") word
            }
            line = toupper(substr(line, 1, 1)) substr(line, 2) (rnd() < 0.2 ? ".\n\n" : ".\n")
            if (size + length(line) > bytes) line = substr(line, 1, bytes - size)
            printf "%s", line; size += length(line)
        }
        exit
    }
    # Short strings only: appending to one long string copies it every time.
    while ((getline l < "seed") > 0) lines[++m] = l "\n"
    for (f = 0; f < files; f++) {
        r = rnd(); len = 256 + int(r * r * r * 16128)
        s = ""; for (i = 1 + int(rnd() * m); length(s) < len; i = i % m + 1) s = s lines[i]
        path = sprintf("tree/d%03d/f%05d.txt", int(f / per), f)
        printf "%s", substr(s, 1, len) > path
        close(path)
    }
}
"""

# Writes `seed` (SEED_BYTES), `big` ($1 bytes, the seed repeated) and `tree` ($2 files),
# in the current directory.
MAKE_DATA = f"""
awk() {{ busybox awk -v words="$words" -v bytes={SEED_BYTES} -v per={FILES_PER_DIR} "$@"; }}
awk -v mode=text -v files=0 "$prog" > seed
# cat fails (SIGPIPE or EPIPE) once head has what it needs, which ends the loop.
while busybox cat seed; do :; done | busybox head -c "$1" > big
awk -v mode=dirs -v files="$2" "$prog" | busybox xargs busybox mkdir -p
awk -v mode=tree -v files="$2" "$prog"
busybox sync
"""


def programs(*names: str) -> dict[str, str]:
    """$NAME_BIN -> the host's path of each Debian binary (the targets carry it there)."""
    return {f"{name.upper()}_BIN": shutil.which(name) or f"/usr/bin/{name}" for name in names}


# Data files a workload needs (dbench's loadfile, MariaDB's messages) are carried into the
# target by prepare jobs, as root file systems carry programs only: compressed with gzip
# (bzip2 packs dbench's loadfile 40% smaller but takes 5 times as long on the host),
# base64-encoded and cut into pieces below the kernel's limit on one argument
# (MAX_ARG_STRLEN, 128 KiB) with room for a guest agent's own base64 of a piece, as many
# pieces a job as fit well inside the limit on all arguments together (ARG_MAX, 2 MiB
# here), appended in order, then decompressed by busybox and checked against the host
# file's SHA-256.
PIECE_CHARS = 64 * 1024
PIECES_PER_JOB = 12
PIECE_TIMEOUT = 30.0
_APPEND = """f=$1
shift
for piece in "$@"; do printf %s "$piece" | busybox base64 -d >> "$f.gz"; done
"""
_UNPACK = """busybox rm -f "$1"
busybox gunzip "$1.gz"
set -- "$1" "$2" $(busybox sha256sum "$1")
[ "$2" = "$3" ] || { echo "$1 arrived damaged: sha256 $3, expected $2" >&2; exit 1; }
"""


@functools.cache
def pieces(path: Path) -> tuple[str, tuple[str, ...]]:
    """A host file's SHA-256, and its gzip compression in base64 pieces."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise VmtaxError(f"{path} cannot be read ({exc.strerror}); install the package "
                         "that has it (`make deps` installs every workload's)") from None
    text = base64.b64encode(gzip.compress(data, 9, mtime=0)).decode()
    return (hashlib.sha256(data).hexdigest(),
            tuple(text[i:i + PIECE_CHARS] for i in range(0, len(text), PIECE_CHARS)))


def carry_jobs(path: Path, dest: str) -> list[Job]:
    """Prepare jobs that copy the host file `path` to `dest` in the scratch directory."""
    digest, parts = pieces(path)
    parent = dest.rpartition("/")[0]
    start = f'busybox mkdir -p "{parent}"\n' if parent else ""
    batches = [parts[i:i + PIECES_PER_JOB] for i in range(0, len(parts), PIECES_PER_JOB)]
    return [script_job(start + 'busybox rm -f "$1.gz"\n', dest, timeout=PIECE_TIMEOUT),
            *(script_job(_APPEND, dest, *batch, timeout=PIECE_TIMEOUT * len(batch))
              for batch in batches),
            script_job(_UNPACK, dest, digest, timeout=300)]


def data_env() -> dict[str, str]:
    """The generator program and its word list, passed to the script in its environment."""
    return {"prog": _AWK, "words": _WORDS}


def script_job(script: str, *args: object, timeout: float,
               env: dict[str, str] | None = None) -> Job:
    """`busybox sh -c PRELUDE+script vmtax ARGS...`, in the target's scratch directory."""
    return Job([*SHELL, PRELUDE + script, "vmtax", *map(str, args)], env=dict(env or {}),
               timeout=timeout, in_scratch=True)


_TIME_LINE = re.compile(r"vmtax-time (\S+) ([0-9]+\.[0-9]+) ([0-9]+\.[0-9]+)")


def times(stdout: str, labels: tuple[str, ...]) -> dict[str, float]:
    """Seconds of each timed phase, exactly the labels asked for, each timed once and
    long enough for /proc/uptime's 10 ms steps to measure."""
    found: dict[str, float] = {}
    for line in stdout.splitlines():
        m = _TIME_LINE.fullmatch(line.strip())
        if not m:
            continue
        label = m[1]
        if label in found:
            raise ParseError(f"phase {label!r} was timed twice")
        elapsed = float(m[3]) - float(m[2])
        if elapsed < 0:
            raise ParseError(f"phase {label!r} ended before it began ({m[2]} > {m[3]})")
        found[label] = round(elapsed, 2)
    missing = [label for label in labels if label not in found]
    if missing:
        raise ParseError(f"no time for phase {', '.join(missing)} in the output")
    for label in labels:
        if found[label] < TIME_RESOLUTION:
            raise ParseError(f"phase {label!r} took less than 10 ms, too short to time: "
                             "make it larger")
    return {label: found[label] for label in labels}


def size_bytes(size: str) -> int:
    """A checked Size option ("256M") in bytes."""
    return int(size[:-1]) << {"K": 10, "M": 20, "G": 30, "T": 40}[size[-1].upper()]


# Mean size of a generated tree file (the generator's 256 B + 16128 B * E[r^3]).
MEAN_FILE_BYTES = 256 + 16128 / 4


class DataOptions(plugin.Options):
    size: Size = plugin.option("256M", "Size of the large generated file")
    files: int = plugin.option(20000, "Small files in the generated tree (256 B to 16 KiB, "
                               "4 KiB on average)", unit="files", ge=1, le=1000000)


class DataWorkload(Workload):
    """A workload over generated data: a large text file of `size` and a tree of `files`
    small files, made once per target by its prepare job (`prepare_script`: MAKE_DATA and
    what follows); its estimates and timeouts scale with the data's size. Its scripts call
    its declared binaries as $NAME_BIN."""
    options: DataOptions
    prepare_script: ClassVar[str]
    estimate_mib_s: ClassVar[float]    # for estimates: the rate on this host, natively
    slowest_mib_s: ClassVar[float]     # for timeouts: the slowest rate allowed (TCG)

    def data_mib(self) -> float:
        return (size_bytes(self.options.size) + self.options.files * MEAN_FILE_BYTES) / 2**20

    def tool_env(self) -> dict[str, str]:
        # Only the prepare job generates data: a guest's agent decodes every byte of a
        # job's environment before its clock starts, which the host's time would count.
        return programs(*self.binaries)

    def run_seconds(self) -> float:
        return self.data_mib() / self.estimate_mib_s

    def run_timeout(self) -> float:
        return self.data_mib() / self.slowest_mib_s + 60

    def prepare_seconds(self) -> float:
        # Natively about 100 MiB/s of data, and a millisecond a file.
        return self.data_mib() / 100 + self.options.files / 1000

    def prepare_jobs(self) -> list[Job]:
        return [script_job(self.prepare_script, size_bytes(self.options.size),
                           self.options.files, env={**data_env(), **self.tool_env()},
                           timeout=20 * self.prepare_seconds() + 300)]
