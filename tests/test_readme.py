"""The README's lists of plugins are what `vmtax list` says (scripts/readme_plugins.py
writes them), and it links the plugin guide."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import readme_plugins  # noqa: E402


def test_the_readme_lists_every_plugin_as_vmtax_list_does():
    readme = readme_plugins.README.read_text()
    assert readme_plugins.section(readme) == readme_plugins.lists(), (
        "the README's plugin lists are stale: run .venv/bin/python scripts/readme_plugins.py")


def test_the_readme_links_the_plugin_guide():
    readme = readme_plugins.README.read_text()
    assert "](docs/plugins.md)" in readme
    assert (readme_plugins.README.parent / "docs" / "plugins.md").exists()
