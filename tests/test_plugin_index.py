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


def test_the_index_keeps_each_plugins_manifest_as_its_class_declares_it():
    from vmtax.core import plugin, workload
    from vmtax.core.types import Manifest

    for group in ("workload", "collector"):
        for name, cls in plugin.plugins(group).items():
            kept = plugin._index()["groups"][group][name][2]
            assert Manifest.from_json(kept) == Manifest.from_json(cls.manifest())
            assert Manifest.from_json(kept).metrics == cls.metrics
    # What the manifests are made of beyond the plugins' files (exits' metrics are
    # perf_kvm's) is watched too: a change to it makes the index again.
    watched = {path for path, *_ in plugin._index()["files"]}
    assert any(path.endswith(os.path.join("helpers", "perf_kvm.py")) for path in watched)
    hooks = {name: workload.manifest(name).hooks for name in workload.registered()}
    assert hooks["serving"] == {"cell_flags"} and hooks["dd"] == hooks["fio"] == {"explain_win"}
    assert hooks["cpu"] == frozenset()


# Runs the command line and then names, on stderr, every module it imported.
_IMPORTED = ("import atexit, sys\n"
             "atexit.register(lambda: print(*sys.modules, file=sys.stderr))\n"
             "sys.argv[0] = 'vmtax'\n"
             "from vmtax.__main__ import run\n"
             "run()\n")


def test_reading_stored_runs_imports_no_plugin_and_nothing_heavy(tmp_path):
    """`vmtax show`, `compare` and `trend` read the plugins' manifests from the index: no plugin
    module, nor pydantic (plan files), scipy or matplotlib (reports) is imported; `runs`
    and `--help` import no numpy either."""
    from vmtax.core.types import Metric
    from vmtax.results.store import Store

    store = Store(tmp_path / "results")
    plan = {"name": "nightly", "targets": [{"name": "native"}, {"name": "vm"}],
            "baseline": "native",
            "workloads": [{"name": "cpu", "params": {}}]}
    for _ in range(2):
        run_id = store.new_run(plan, {}, "0")
        for target, speed in (("native", 100.0), ("vm", 60.0)):
            store.set_target(run_id, target, target, {"bare_host": target == "native"})
            for idx in range(3):
                store.add_rep(run_id, target=target, workload="cpu", params={},
                              phase="measure", idx=idx, status="ok", argv=[], started=0.0,
                              host_elapsed=5.0,
                              metrics=[Metric("events/s", speed + idx, "events/s", True)])
        store.finish_run(run_id, "done")
    store.close()
    env = {**os.environ, "VMTAX_CACHE": str(tmp_path / "cache")}
    results = ["--results", str(tmp_path / "results")]
    # Listing runs and the help need no statistics either.
    for command, shows, avoided in ((["show", "last", *results], "events/s", ()),
                                    (["compare", *results], "events/s", ()),
                                    (["trend", "nightly", *results], "events/s", ()),
                                    (["runs", *results], "native", ("numpy",)),
                                    (["--help"], "Commands", ("numpy",))):
        argv = [sys.executable, "-c", _IMPORTED, *command]
        subprocess.run(argv, env=env, capture_output=True, check=True)   # makes the index
        done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
        assert shows in done.stdout
        heavy = sorted({m.partition(".")[0] for m in done.stderr.split() if m.partition(".")[0]
                        in ("pydantic", "scipy", "matplotlib", *avoided)}
                       | {m for m in done.stderr.split() if m.startswith(
                           ("vmtax.workloads.", "vmtax.targets.", "vmtax.collectors."))})
        assert not heavy, f"vmtax {' '.join(command)} imported {heavy}"


def test_a_third_party_plugin_whose_options_pydantic_cannot_build_is_named(tmp_path):
    """Options models build their validators on first use; the index builds each plugin's
    when it finds it, so a broken model still fails at load, naming the plugin."""
    site, cache = tmp_path / "site", tmp_path / "cache"
    site.mkdir()
    _install(site, COLLECTOR.replace(
        "from vmtax.core.collector import Collector, Subject",
        "from vmtax.core import plugin\n"
        "from vmtax.core.collector import Collector, Subject\n\n\n"
        "class Opaque:\n    pass\n\n\n"
        "class OpaqueOptions(plugin.Options):\n"
        "    opaque: Opaque = plugin.option(None, 'Not a type pydantic knows')\n").replace(
        '    metrics = (', '    Options = OpaqueOptions\n    metrics = ('))
    env = {**os.environ, "PYTHONPATH": str(site), "VMTAX_CACHE": str(cache)}
    done = subprocess.run([sys.executable, "-m", "vmtax", "list", "collectors"], env=env,
                          capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("vmtax: error: plugin throwaway_collector "
                                  "(throwaway_collector) failed to load: Unable to generate")
