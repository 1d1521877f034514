"""compile: build a generated C code base with Debian's make and gcc (E3's kernel-style
compile), timed by the target's clock.

E3 compiled a kernel. The issue asks for the Linux kernel's `tinyconfig` from Debian's
linux-source; its source (150 MB) and a toolchain with headers would have to reach guests
on a disk image, which vmtax cannot build yet. What every target can carry today is
programs (vmtax.rootfs: a binary and its shared libraries, at its host path), so this
workload compiles without headers or linking: a code base the prepare job generates
(deterministically, in busybox awk) of freestanding C files, the way a kernel is built
(`-ffreestanding -nostdinc`, objects only), with gcc's driver, its compiler proper (cc1)
and the assembler (as) from Debian's gcc and binutils, driven by GNU make (`-j jobs`).
Each repetition deletes the objects untimed and times the build.
"""

from __future__ import annotations

import glob

from vmtax import plugin
from vmtax.types import Job, Metric, MetricSpec
from vmtax.workloads.base import Workload
from vmtax.workloads.macro_util import TIME_RESOLUTION, programs, script_job, times

# gcc's compiler proper lives beside its version, not on PATH: carried by its full path.
CC1 = (sorted(glob.glob("/usr/lib/gcc/x86_64-linux-gnu/*/cc1")) or ["cc1"])[-1]
# For estimates and timeouts: gcc -O2 took ~0.07 s per generated function on this
# (shared) host; TCG is tens of times slower, and a timeout allows 3 s a function.
ESTIMATE_FUNCTION_S = 0.07
SLOWEST_FUNCTION_S = 3.0

# Each file: a header of shared declarations and `functions` functions mixing loops,
# branches, switches, struct and array work, as kernel code does.
_AWK = r"""
function rnd(n) { x = (x * 16807) % 2147483647; return int(x / 2147483647 * n) }
BEGIN {
    x = 4242
    h = "cb/common.h"
    print "struct item { long key; int count; unsigned char tag[16]; struct item *next; };" > h
    print "typedef unsigned long u64;" > h
    print "static inline u64 mix(u64 a, u64 b)" > h
    print "{ return (a ^ (b << 7)) * 0x9e3779b97f4a7c15UL; }" > h
    close(h)
    objs = ""
    for (f = 0; f < sources; f++) {
        c = sprintf("cb/f%04d.c", f); objs = objs sprintf(" f%04d.o", f)
        print "#include \"common.h\"" > c
        for (g = 0; g < functions; g++) {
            printf "u64 f%d_%d(struct item *it, const long *v, int n)\n{\n", f, g > c
            print "\tu64 acc = " rnd(1000) "; int i;" > c
            print "\tfor (i = 0; i < n; i++) {" > c
            print "\t\tswitch ((v[i] + " rnd(97) ") % 5) {" > c
            for (k = 0; k < 5; k++)
                print "\t\tcase " k ": acc = mix(acc, v[i] * " rnd(100000) "); break;" > c
            print "\t\t}" > c
            print "\t\tif (acc & " (1 + rnd(255)) ") it->tag[i & 15] ^= (unsigned char)acc;" > c
            print "\t}" > c
            print "\tfor (; it; it = it->next) {" > c
            print "\t\tit->count += (int)(acc >> " rnd(32) ");" > c
            print "\t\tacc += it->key * " rnd(1000) " + it->tag[" rnd(16) "];" > c
            print "\t}" > c
            print "\treturn acc;\n}\n" > c
        }
        close(c)
    }
    m = "cb/Makefile"
    print "CFLAGS = -O2 -ffreestanding -nostdinc -fno-common -Wall" > m
    print "all:" objs > m
    print "%.o: %.c common.h\n\t$(CC) $(CFLAGS) -c -o $@ $<" > m
    print "clean:\n\trm -f *.o" > m
    close(m)
}
"""
_PREPARE = """busybox rm -rf cb
busybox mkdir cb
busybox awk -v sources="$1" -v functions="$2" "$prog"
"""
# make is GNU make from Debian; its recipes run through /bin/sh, busybox in the targets.
_RUN = """busybox rm -f cb/*.o
begin; "$MAKE_BIN" -s -C cb -j "$1" CC="$GCC_BIN"; end build
"""


class CompileOptions(plugin.Options):
    sources: int = plugin.option(100, "C files in the generated code base", unit="files",
                                 ge=1, le=10000)
    functions: int = plugin.option(10, "Functions per file (20 lines each)", unit="functions", ge=1,
                                   le=1000)
    jobs: int = plugin.option(1, "Files compiled at once (make -j)", unit="processes",
                              ge=1, le=256)


class Compile(Workload):
    name = "compile"
    description = ("make and gcc building a generated freestanding C code base, objects "
                   "only (seconds)")
    Options = CompileOptions
    options: CompileOptions
    binaries = ("make", "gcc", "as", CC1)
    packages = ("make", "gcc", "binutils")
    metrics = (
        MetricSpec("time", "s", False, "Seconds the build took, by the target's clock",
                   group="CPU", primary=True, resolution=TIME_RESOLUTION),
    )

    def _functions(self) -> int:
        return self.options.sources * self.options.functions

    def run_seconds(self) -> float:
        return self._functions() * ESTIMATE_FUNCTION_S / self.options.jobs

    def prepare_seconds(self) -> float:
        return 1.0 + self._functions() / 4000

    def prepare_jobs(self) -> list[Job]:
        return [script_job(_PREPARE, self.options.sources, self.options.functions,
                           env={"prog": _AWK}, timeout=60 * self.prepare_seconds() + 120)]

    def run_job(self) -> Job:
        return script_job(_RUN, self.options.jobs, env=programs("make", "gcc"),
                          timeout=self._functions() * SLOWEST_FUNCTION_S + 120)

    def cleanup_jobs(self) -> list[Job]:
        return [script_job("busybox rm -rf cb\n", timeout=120)]

    def parse(self, stdout: str) -> list[Metric]:
        return [self.metric("time", times(stdout, ("build",))["build"])]
