"""Writes the README's lists of target kinds, workloads and collectors from `vmtax list`,
between the README's `<!-- plugins: begin -->` and `<!-- plugins: end -->` lines, so a new
plugin shows up there without an edit by hand. tests/test_readme.py checks they agree.

    .venv/bin/python scripts/readme_plugins.py          # rewrite the README's lists
"""

import json
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
BEGIN, END = "<!-- plugins: begin -->", "<!-- plugins: end -->"


def _listing(group: str) -> list[dict]:
    vmtax = Path(sys.executable).parent / "vmtax"
    done = subprocess.run([str(vmtax), "list", group, "--json"], capture_output=True,
                          text=True, check=True, timeout=120)
    return json.loads(done.stdout)


def _first_sentence(text: str) -> str:
    return re.split(r"(?<=[a-z0-9)])\. ", " ".join(text.split()), maxsplit=1)[0].rstrip(".")


def lists() -> str:
    lines = ["Generated from `vmtax list` by `scripts/readme_plugins.py`; "
             "`vmtax list targets|workloads|collectors` gives every option.", ""]
    lines.append("Target kinds (`KIND` or `KIND:VARIANT`):")
    for target in _listing("targets"):
        variants = ", ".join(f"`{v['name']}`" for v in target["variants"])
        lines.append(f"- `{target['name']}`: {_first_sentence(target['description'])}"
                     + (f" ({variants})" if variants else ""))
    lines += ["", "Workloads:"]
    lines += [f"- `{w['name']}`: {_first_sentence(w['description'])}"
              for w in _listing("workloads")]
    lines += ["", "Collectors (`--collect`):"]
    lines += [f"- `{c['name']}`: {_first_sentence(c['description'])}"
              for c in _listing("collectors")]
    return "\n".join(lines)


def section(readme: str) -> str:
    """The README's generated part as it stands."""
    start, end = readme.index(BEGIN) + len(BEGIN), readme.index(END)
    return readme[start:end].strip("\n")


def main() -> None:
    readme = README.read_text()
    start, end = readme.index(BEGIN) + len(BEGIN), readme.index(END)
    README.write_text(f"{readme[:start]}\n{lists()}\n{readme[end:]}")


if __name__ == "__main__":
    main()
