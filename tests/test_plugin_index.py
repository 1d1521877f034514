"""The plugin index (vmtax.core.plugin): a command imports only the plugins it looks up, and
the kept index never hides a change: a plugin installed, renamed or removed shows at the
next call."""

import os
import shutil
import subprocess
import sys

from test_plugin_lists import COLLECTOR

LIST = ("import sys; from vmtax.core import plugin; "
        "print(','.join(plugin.plugins('collector'))); "
        "plugin.get('workload', 'cpu'); "
        "print(','.join(sorted(m for m in sys.modules if m.startswith('vmtax.workloads.'))))")


def _collectors_and_workload_modules(site, cache) -> tuple[list[str], list[str]]:
    env = {**os.environ, "PYTHONPATH": str(site), "VMTAX_CACHE": str(cache)}
    out = subprocess.run([sys.executable, "-c", LIST], env=env, capture_output=True,
                         text=True, check=True).stdout.split("\n")
    return out[0].split(","), out[1].split(",")


def _install(site, module_text):
    (site / "throwaway_collector.py").write_text(module_text)
    info = site / "vmtax_throwaway-0.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vmtax-throwaway\nVersion: 0\n")
    (info / "entry_points.txt").write_text("[vmtax.plugins]\n"
                                           "throwaway_collector = throwaway_collector\n")


def test_the_kept_index_follows_installs_renames_and_removals(tmp_path):
    site, cache = tmp_path / "site", tmp_path / "cache"
    site.mkdir()
    collectors, imported = _collectors_and_workload_modules(site, cache)
    assert "a-throwaway" not in collectors and "host-cpu" in collectors
    assert len(imported) > 1   # making the index imports every plugin
    # Kept, it lets the next call import the one workload module it looks up.
    assert _collectors_and_workload_modules(site, cache)[1] == ["vmtax.workloads.sysbench"]

    _install(site, COLLECTOR)
    assert "a-throwaway" in _collectors_and_workload_modules(site, cache)[0]

    _install(site, COLLECTOR.replace('name = "a-throwaway"', 'name = "a-renamed"'))
    collectors = _collectors_and_workload_modules(site, cache)[0]
    assert "a-renamed" in collectors and "a-throwaway" not in collectors

    shutil.rmtree(site / "vmtax_throwaway-0.dist-info")
    collectors = _collectors_and_workload_modules(site, cache)[0]
    assert "a-renamed" not in collectors and "host-cpu" in collectors


def test_a_plugin_package_is_scanned_and_its_modules_key_the_index():
    # targets/libvirt/ holds the libvirt target with its support: an edit of any module in
    # it must remake the index, as an edit of a plugin module at the top does.
    from vmtax.core import plugin

    stamped = {stamp[0] for stamp in plugin._index_key()[1]}
    assert any(path.endswith(os.path.join("targets", "libvirt", "target.py"))
               for path in stamped)
    assert not any("__pycache__" in path for path in stamped)
    assert plugin.registry()["target"]["libvirt"].__module__ == "vmtax.targets.libvirt.target"
