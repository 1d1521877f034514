"""The guest image: a directly bootable kernel plus an initramfs with the rootfs, the guest
agent and the handful of kernel modules the guest needs.

The kernel is Debian's (downloaded as a .deb and unpacked into the cache, never installed on
the host): its general-purpose one ("debian") or its PREEMPT_RT one ("debian-rt"), or one
the user gives. Either way the uncompressed ELF inside is used: QEMU boots it
through PVH, skipping the bzImage decompressor, which under TCG saves seconds per boot.
Everything is cached by a key of its inputs and published by an atomic rename.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import lzma
import os
import re
import shutil
import stat
import subprocess
import tempfile
import zlib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, BinaryIO, Iterable, Mapping

from vmtax.core import paths
from vmtax.core.errors import VmtaxError
from vmtax.guest import minimal_kernel
from vmtax.guest import rootfs as rootfs_mod
from vmtax.guest.kernel_cache import Kernel, kernel_version, load_kernel, publish_dir

FORMAT = "6"   # bump when the image layout changes, to invalidate caches
DEBIAN_META_PACKAGE = "linux-image-amd64"
# Guest kernel choices by name, and the Debian meta-package each follows.
DEBIAN_KERNELS = {"debian": DEBIAN_META_PACKAGE, "debian-rt": "linux-image-rt-amd64"}
AGENT_PORT = "vmtax.agent"
GUEST_FILES = ("init", "agent", "disk", "net", "spawn")
# Loaded by /init before READY, per transport of the virtio devices (microvm: mmio, q35: pci).
BOOT_MODULES = {"mmio": ("virtio_mmio", "virtio_console"), "pci": ("virtio_pci", "virtio_console")}
# Loaded by /vmtax/disk when the host asks for the scratch disk.
DISK_MODULES = ("virtio_blk", "crc32c_generic", "ext4")
# Loaded by /vmtax/net when a server in the guest needs its network interface.
NET_MODULES = ("virtio_net",)
# Loaded before /vmtax/disk when the scratch disk is on virtio-scsi (a libvirt target's
# disk_bus = "scsi", vm's "virtio-scsi") or NVMe (vm's "nvme"); none for a kernel without
# them, whose disk then never appears.
SCSI_MODULES = ("virtio_scsi", "sd_mod")
NVME_MODULES = ("nvme",)
# Loaded by /init before the agent's channel when it is vsock (a VMM without virtio-serial:
# Firecracker, Cloud Hypervisor; vmtax.vsock= on the command line).
VSOCK_MODULES = ("vmw_vsock_virtio_transport",)
# ext4's soft dependency crc32c-intel fails to load on TCG CPU models; crc32c_generic covers it.
SKIP_MODULES = frozenset({"crc32c_intel"})

ELF_MAGIC = b"\x7fELF"
XZ_MAGIC = b"\xfd7zXZ\x00"
GZIP_MAGIC = b"\x1f\x8b\x08"
_MAX_TRIES = 8           # compressed-stream candidates tried per magic


# --- kernel -----------------------------------------------------------------------------

def extract_vmlinux(data: bytes) -> bytes | None:
    """The uncompressed ELF kernel inside a bzImage/vmlinuz (or data itself if it is one)."""
    if data[:4] == ELF_MAGIC:
        return data
    decompressors = ((XZ_MAGIC, lambda: lzma.LZMADecompressor(format=lzma.FORMAT_XZ)),
                     (GZIP_MAGIC, lambda: zlib.decompressobj(16 + zlib.MAX_WBITS)))
    for magic, make in decompressors:
        pos = data.find(magic)
        for _ in range(_MAX_TRIES):
            if pos < 0:
                break
            try:
                out = make().decompress(data[pos:])
            except (lzma.LZMAError, zlib.error):
                out = b""
            if out[:4] == ELF_MAGIC:
                return out
            pos = data.find(magic, pos + 1)
    return None


def _module_name(ko: Path) -> str:
    return ko.name.split(".ko", 1)[0].replace("-", "_")


def _run_tool(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Run a host tool the image build needs; a missing tool is a one-line VmtaxError."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, **kwargs)
    except FileNotFoundError:
        raise VmtaxError(f"{argv[0]} is not installed; building the guest image needs it "
                         "(Debian: apt-get install dpkg kmod)") from None


def _check(out: subprocess.CompletedProcess[str]) -> None:
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no error output"])[-1]
        raise VmtaxError(f"{' '.join(out.args[:2])} failed: {last}")


def _insmod_order(root: Path, version: str, module: str) -> list[Path]:
    """The .ko files to insmod, in order, for module (none when it is built in)."""
    out = _run_tool(["modprobe", "-d", str(root), "-S", version, "--show-depends", module])
    if out.returncode != 0:
        raise VmtaxError(f"kernel {version}: module {module} not found in {root}/lib/modules "
                         f"({out.stderr.strip()}); use a kernel with virtio and ext4 built in")
    files = []
    for line in out.stdout.splitlines():
        parts = line.split()
        if parts[:1] == ["insmod"] and _module_name(Path(parts[1])) not in SKIP_MODULES:
            files.append(Path(parts[1]))
    return files


def select_modules(root: Path, version: str, dest: Path) -> dict[str, list[str]]:
    """Copy the modules the guest needs into dest; return each phase's insmod order (file
    names): "boot-mmio"/"boot-pci" before READY ("vsock" then, for a vsock channel), "disk"
    and "net" after (minus what boot loaded)."""
    def ordered(modules: Iterable[str]) -> list[Path]:
        return list(dict.fromkeys(itertools.chain.from_iterable(
            _insmod_order(root, version, m) for m in modules)))

    phases = {f"boot-{bus}": ordered(mods) for bus, mods in BOOT_MODULES.items()}
    loaded_at_boot = set(ordered(["virtio_console"]))
    phases["disk"] = [ko for ko in ordered(DISK_MODULES) if ko not in loaded_at_boot]
    phases["net"] = [ko for ko in ordered(NET_MODULES) if ko not in loaded_at_boot]
    for phase, modules in (("scsi", SCSI_MODULES), ("nvme", NVME_MODULES),
                           ("vsock", VSOCK_MODULES)):
        try:
            phases[phase] = [ko for ko in ordered(modules) if ko not in loaded_at_boot]
        except VmtaxError:
            phases[phase] = []
    dest.mkdir(parents=True, exist_ok=True)
    for ko in set(itertools.chain.from_iterable(phases.values())):
        shutil.copyfile(ko, dest / ko.name)
    return {phase: [ko.name for ko in kos] for phase, kos in phases.items()}


def config_hz(config: Path) -> int | None:
    """CONFIG_HZ from a kernel .config (the guest's timer tick, for lpj=)."""
    try:
        m = re.search(r"^CONFIG_HZ=(\d+)$", config.read_text(errors="replace"), re.MULTILINE)
    except OSError:
        return None
    return int(m.group(1)) if m else None


def _sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _apt_kernel_package(meta: str = DEBIAN_META_PACKAGE) -> str:
    """The versioned package the meta-package (linux-image-amd64) currently depends on."""
    def resolve() -> str | None:
        out = subprocess.run(["apt-cache", "depends", meta],
                             capture_output=True, text=True)
        for line in out.stdout.splitlines():
            key, _, value = line.strip().partition(":")
            if key == "Depends" and value.strip().startswith("linux-image-"):
                return value.strip()
        return None

    try:
        package = resolve()
        if package is None:   # empty package lists: fetch them once
            subprocess.run(["apt-get", "update"], capture_output=True, text=True)
            package = resolve()
    except FileNotFoundError:
        raise VmtaxError("no --kernel given and apt is not available to fetch Debian's "
                         "kernel; pass --kernel PATH (a vmlinux or bzImage)") from None
    if package is None:
        raise VmtaxError(f"apt cannot resolve {meta} (run apt-get update, "
                         "or pass --kernel PATH)")
    return package


def _download_deb(package: str, debs: Path) -> Path:
    debs.mkdir(parents=True, exist_ok=True)
    found = sorted(debs.glob(f"{package}_*.deb"))
    if found:
        return found[-1]
    with tempfile.TemporaryDirectory(dir=debs) as tmp:
        out = _run_tool(["apt-get", "download", "-o", "APT::Sandbox::User=root", package],
                        cwd=tmp)
        got = list(Path(tmp).glob("*.deb"))
        if out.returncode != 0 or not got:
            last = (out.stderr.strip().splitlines() or ["no .deb written"])[-1]
            raise VmtaxError(f"apt-get download {package} failed: {last}")
        os.rename(got[0], debs / got[0].name)
        return debs / got[0].name


def _build_debian_kernel(deb: Path, dest: Path) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        unpacked = tmp / "unpacked"
        _check(_run_tool(["dpkg-deb", "-x", str(deb), str(unpacked)]))
        vmlinuz = sorted((unpacked / "boot").glob("vmlinuz-*"))
        if not vmlinuz:
            raise VmtaxError(f"{deb.name} holds no boot/vmlinuz-*")
        version = vmlinuz[0].name.removeprefix("vmlinuz-")
        elf = extract_vmlinux(vmlinuz[0].read_bytes())
        if elf is None:
            raise VmtaxError(f"{vmlinuz[0].name} in {deb.name}: no xz/gzip-compressed ELF inside")
        (tmp / "vmlinux").write_bytes(elf)
        _check(_run_tool(["depmod", "-b", str(unpacked), version]))
        modules = select_modules(unpacked, version, tmp / "modules")
        (tmp / "meta.json").write_text(json.dumps(
            {"path": "vmlinux", "version": version, "sha256": _sha256_bytes(elf),
             "modules": modules, "hz": config_hz(unpacked / "boot" / f"config-{version}"),
             "source": deb.name}, indent=1))
        shutil.rmtree(unpacked)
        publish_dir(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _is_rt(name: str) -> bool:
    """Is it a Debian kernel package, or its build, of the PREEMPT_RT flavour
    (linux-image-6.1.0-56-rt-amd64)?"""
    return "-rt-" in name


def debian_kernel(cache: Path, meta: str = DEBIAN_META_PACKAGE) -> Kernel:
    """The current kernel of Debian's meta-package `meta` (linux-image-amd64 or
    linux-image-rt-amd64), fetched and prepared once; later calls reuse the cached one
    (without asking apt) so results stay comparable until the cache is cleared."""
    kernels = cache / "kernels"
    rt = meta == DEBIAN_KERNELS["debian-rt"]
    built = sorted((p for p in kernels.glob(f"linux-image-*-f{FORMAT}/meta.json")
                    if _is_rt(p.parent.name) == rt), key=lambda p: p.stat().st_mtime)
    if built:
        return load_kernel(built[-1].parent)
    deb = _download_deb(_apt_kernel_package(meta), cache / "debs")
    kernels.mkdir(parents=True, exist_ok=True)
    # Keyed on the .deb's name and size: rehashing 70 MB on every call would be too slow.
    dest = kernels / f"{deb.stem}-{deb.stat().st_size}-f{FORMAT}"
    if not (dest / "meta.json").exists():
        _build_debian_kernel(deb, dest)
    return load_kernel(dest)


def guest_kernel(choice: str | Path, cache: Path) -> Kernel:
    """The guest kernel a target asks for: "debian" (Debian's general-purpose kernel),
    "debian-rt" (its PREEMPT_RT kernel), "minimal" (built from Debian's linux-source with
    everything built in) or the path of a vmlinux or bzImage."""
    if choice == "minimal":
        return minimal_kernel.minimal_kernel(cache)
    if isinstance(choice, str) and choice in DEBIAN_KERNELS:
        return debian_kernel(cache, DEBIAN_KERNELS[choice])
    return user_kernel(choice, cache)


def user_kernel(path: str | Path, cache: Path) -> Kernel:
    """A kernel the user gave (vmlinux or bzImage); its modules come from the host's
    /lib/modules/VERSION when that tree exists, else everything is assumed built in."""
    src = Path(path).expanduser()
    if not src.is_file():
        raise VmtaxError(f"kernel {path} not found (--kernel wants a vmlinux or bzImage file)")
    kernels = cache / "kernels"
    built = src.resolve().parent
    if built.parent == kernels.resolve() and (built / "meta.json").exists():
        # One vmtax built (the minimal kernel, a Debian one): its HZ and boot parameters are
        # known, as when it is asked for by name.
        kernel = load_kernel(built)
        if kernel.path.resolve() == src.resolve():
            return kernel
    st = src.stat()
    key = _sha256_bytes(f"{FORMAT}\0{src.resolve()}\0{st.st_size}\0{st.st_mtime_ns}".encode())
    dest = kernels / f"user-{key[:16]}"
    if (dest / "meta.json").exists():
        return load_kernel(dest)
    kernels.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=kernels))
    try:
        data = src.read_bytes()
        elf = extract_vmlinux(data)
        if elf is not None and elf is not data:
            (tmp / "vmlinux").write_bytes(elf)
            boot_path = "vmlinux"
        else:   # already an ELF, or a format we cannot unpack: QEMU gets the file as is
            boot_path = str(src.resolve())
        version = kernel_version(elf if elf is not None else data) or "unknown"
        # The release string is the file's to say: a "../" in it must not lead elsewhere.
        tree = paths.under("/lib/modules", version, f"kernel {path}: its release string")
        modules = ({} if not (tree / "modules.dep").exists()
                   else select_modules(Path("/"), version, tmp / "modules"))
        config = paths.under("/boot", f"config-{version}", f"kernel {path}: its release string")
        (tmp / "meta.json").write_text(json.dumps(
            {"path": boot_path, "version": version, "sha256": _sha256_bytes(elf or data),
             "modules": modules, "hz": config_hz(config),
             "source": str(src.resolve())}, indent=1))
        publish_dir(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return load_kernel(dest)


# --- initramfs --------------------------------------------------------------------------

@dataclass(frozen=True)
class CpioEntry:
    name: str                         # path inside the archive, without a leading "/"
    mode: int                         # st_mode: file type and permissions
    data: bytes | Path = b""          # file contents, a file to read them from, or a link target
    rdev: tuple[int, int] = (0, 0)    # device nodes: (major, minor)


def _cpio_header(ino: int, entry: CpioEntry, size: int) -> bytes:
    name = entry.name.encode() + b"\0"
    nlink = 2 if stat.S_ISDIR(entry.mode) else 1
    fields = (ino, entry.mode, 0, 0, nlink, 0, size, 0, 0, *entry.rdev, len(name), 0)
    header = b"070701" + b"".join(b"%08X" % f for f in fields) + name
    return header + b"\0" * (-len(header) % 4)


def write_cpio(out: BinaryIO, entries: Iterable[CpioEntry]) -> None:
    """A deterministic newc archive: entries in the given order, mtime 0, owner root."""
    ino = 0
    for ino, entry in enumerate(entries, start=1):
        data = entry.data.read_bytes() if isinstance(entry.data, Path) else entry.data
        out.write(_cpio_header(ino, entry, len(data)))
        out.write(data + b"\0" * (-len(data) % 4))
    out.write(_cpio_header(ino + 1, CpioEntry("TRAILER!!!", 0), 0))


def tree_entries(root: Path) -> dict[str, CpioEntry]:
    """Archive entries for every directory, file and symlink below root."""
    entries = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            rel = path.relative_to(root).as_posix()
            st = path.lstat()
            if stat.S_ISLNK(st.st_mode):
                entries[rel] = CpioEntry(rel, stat.S_IFLNK | 0o777, os.readlink(path).encode())
            elif stat.S_ISDIR(st.st_mode):
                entries[rel] = CpioEntry(rel, stat.S_IFDIR | stat.S_IMODE(st.st_mode))
            elif stat.S_ISREG(st.st_mode):
                entries[rel] = CpioEntry(rel, stat.S_IFREG | stat.S_IMODE(st.st_mode), path)
    return entries


def guest_file(name: str) -> bytes:
    """A file of the in-guest side (src/vmtax/guest/, shipped as package data)."""
    return resources.files("vmtax").joinpath("guest", name).read_bytes()


class GuestImage:
    """Kernel + initramfs for VM targets, built on first use and cached across runs."""

    def __init__(self, binaries: Iterable[str], kernel: str | Path | None = None,
                 cache: Path | None = None, programs: Mapping[str, Path] | None = None):
        """kernel: as guest_kernel takes it; None is "debian". programs: more of vmtax's own
        programs under /vmtax in the guest, by name (the vsock channel's end)."""
        self.binaries = sorted(set(binaries))
        self.kernel_arg = kernel
        self.cache = cache or paths.cache_dir()
        self.programs = dict(programs or {})
        self._kernel: Kernel | None = None
        self._rootfs: Path | None = None
        self._initramfs: Path | None = None

    def kernel_info(self) -> Kernel:
        if self._kernel is None:
            self._kernel = guest_kernel(self.kernel_arg or "debian", self.cache)
        return self._kernel

    def kernel(self) -> Path:
        return self.kernel_info().path

    def rootfs(self) -> Path:
        if self._rootfs is None:
            self._rootfs = rootfs_mod.build(self.binaries, self.cache)
        return self._rootfs

    def _entries(self) -> list[CpioEntry]:
        kernel = self.kernel_info()
        entries = tree_entries(self.rootfs())
        entries.pop(".complete", None)
        extra = [CpioEntry("dev/console", stat.S_IFCHR | 0o600, rdev=(5, 1)),
                 CpioEntry("init", stat.S_IFREG | 0o755, guest_file("init")),
                 CpioEntry("vmtax", stat.S_IFDIR | 0o755),
                 CpioEntry("vmtax/modules", stat.S_IFDIR | 0o755)]
        extra += [CpioEntry(f"vmtax/{name}", stat.S_IFREG | 0o755, guest_file(name))
                  for name in GUEST_FILES if name != "init"]
        extra += [CpioEntry(f"vmtax/{name}", stat.S_IFREG | 0o755, path)
                  for name, path in sorted(self.programs.items())]
        for phase, files in kernel.modules.items():
            extra.append(CpioEntry(f"vmtax/modules/{phase}.list", stat.S_IFREG | 0o644,
                                   "".join(f + "\n" for f in files).encode()))
            if not files:
                continue
            if kernel.modules_dir is None:
                raise VmtaxError(f"kernel {kernel.version}: modules {', '.join(files)} are "
                                 "listed but its modules directory is missing")
            extra += [CpioEntry(f"vmtax/modules/{f}", stat.S_IFREG | 0o644,
                                kernel.modules_dir / f) for f in files]
        entries.update((e.name, e) for e in extra)
        # Sorted paths put every directory before its contents, as the kernel's unpacker needs.
        return [entries[name] for name in sorted(entries)]

    def _initramfs_key(self) -> str:
        h = hashlib.sha256(f"{FORMAT}\0{self.rootfs().name}\0{self.kernel_info().key}".encode())
        for name in GUEST_FILES:
            h.update(b"\0" + name.encode() + b"\0" + guest_file(name))
        for name, path in sorted(self.programs.items()):
            h.update(b"\0" + name.encode() + b"\0" + path.read_bytes())
        return h.hexdigest()[:16]

    def initramfs(self) -> Path:
        if self._initramfs is not None:
            return self._initramfs
        base = self.cache / "initramfs"
        dest = base / f"{self._initramfs_key()}.cpio"
        if not dest.exists():
            base.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}-", dir=base)
            try:
                with os.fdopen(fd, "wb") as f:
                    write_cpio(f, self._entries())
                os.replace(tmp, dest)
            except BaseException:
                os.unlink(tmp)
                raise
        self._initramfs = dest
        return dest

    def fingerprint(self) -> dict[str, Any]:
        kernel = self.kernel_info()
        return {"kernel_version": kernel.version, "kernel_sha256": kernel.sha256[:16],
                "initramfs": self.initramfs().stem, "binaries": self.binaries}
