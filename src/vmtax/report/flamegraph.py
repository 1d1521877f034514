"""Flame graphs of folded stacks as self-contained SVG: one frame per box, its width its
samples, the root at the bottom; a tooltip per frame; a search (click "Search", give a
regular expression) that marks the matching frames and says their share.

A differential graph draws B's stacks coloured by the CPU time each frame's function adds
per unit of work from A to B (of the stacks that hold it), the measure `vmtax profile
diff` ranks by: red where B spends more CPU per event (MB, repetition) in it, blue less,
white the same. A share of samples can fall while the time grows (a VM spends a smaller
share of many more µs per event in clone3), so the share is only in the tooltip, beside
the time; where a side's work or CPU time is unknown the colour falls back to the share,
and the legend says so.

Written here, small, so the report needs nothing else: no well-kept renderer of folded
stacks fits a Python package (Brendan Gregg's flamegraph.pl is Perl under the CDDL,
inferno is Rust).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from html import escape

from vmtax.analysis import profile

FRAME_HEIGHT = 16
FONT_SIZE = 11
CHAR_WIDTH = 6.4     # px per character of the font at FONT_SIZE, for clipping names
MIN_WIDTH = 0.5      # px: narrower frames are left out
HEADER = 36          # px above the frames: title and search

_ids = itertools.count(1)


@dataclass
class Node:
    name: str
    value: float = 0.0
    children: dict[str, "Node"] = field(default_factory=dict)

    def child(self, name: str) -> "Node":
        return self.children.setdefault(name, Node(name))


def tree(stacks: dict[str, float]) -> Node:
    """The call tree of folded stacks ("root;...;leaf" -> samples)."""
    root = Node("all")
    for stack, samples in stacks.items():
        root.value += samples
        node = root
        for frame in stack.split(";"):
            node = node.child(frame)
            node.value += samples
    return root


def _depth(node: Node) -> int:
    return 1 + max((_depth(c) for c in node.children.values()), default=0)


def _warm(name: str) -> str:
    """flamegraph.pl's palette: a warm colour that a frame's name keeps across graphs."""
    h = sum((i + 1) * ord(c) for i, c in enumerate(name)) % 1000 / 1000
    return f"rgb({205 + int(50 * h)},{int(230 * h)},{int(55 * (1 - h))})"


def _change_colour(delta: float, scale: float) -> str:
    """White for no change, to red (grew) or blue (shrank) at the largest change."""
    strength = min(1.0, abs(delta) / scale) if scale > 0 else 0.0
    fade = int(255 * (1 - strength))
    return f"rgb(255,{fade},{fade})" if delta > 0 else f"rgb({fade},{fade},255)"


def _shares(node: Node, total: float, path: tuple[str, ...],
            into: dict[tuple[str, ...], float]) -> None:
    into[path] = 100 * node.value / total if total else 0.0
    for child in node.children.values():
        _shares(child, total, (*path, child.name), into)


def name_samples(stacks: dict[str, float]) -> dict[str, float]:
    """Per frame name, the samples whose stack holds it. A differential graph compares
    names rather than whole paths: the same function runs under other roots in another
    target (a vCPU thread of QEMU, not sysbench), and would never match by path."""
    found: dict[str, float] = {}
    for stack, samples in stacks.items():
        for name in set(stack.split(";")):
            found[name] = found.get(name, 0.0) + samples
    return found


def name_shares(stacks: dict[str, float]) -> dict[str, float]:
    """Per frame name, the % of samples whose stack holds it."""
    total = sum(stacks.values())
    return {name: 100 * n / total for name, n in name_samples(stacks).items()} if total else {}


@dataclass(frozen=True)
class PerUnit:
    """What one sample stands for in CPU µs per unit of work, in A and in B."""
    a: float
    b: float
    unit: str                    # "event", "MB", "repetition"


def svg(stacks: dict[str, float], title: str, *, baseline: dict[str, float] | None = None,
        per_unit: PerUnit | None = None, width: int = 1200) -> str:
    """The flame graph of `stacks`; with `baseline` (A's stacks), differential against it,
    coloured by CPU µs added per unit of work when `per_unit` is known, else by share."""
    root = tree(stacks)
    after: dict[tuple[str, ...], float] = {}
    _shares(root, root.value, (), after)
    named_after = name_shares(stacks)
    before = name_shares(baseline or {})
    share_changes = {name: share - before.get(name, 0.0) for name, share in named_after.items()}
    if per_unit is not None:
        count_a, count_b = name_samples(baseline or {}), name_samples(stacks)
        times = {name: (count_a.get(name, 0.0) * per_unit.a, n * per_unit.b)
                 for name, n in count_b.items()}
        changes = {name: b - a for name, (a, b) in times.items()}
    else:
        changes = share_changes
    scale = max((abs(c) for c in changes.values()), default=0.0)
    graph_id = f"flame{next(_ids)}"
    height = HEADER + FRAME_HEIGHT * _depth(root) + 8
    boxes: list[str] = []

    def draw(node: Node, path: tuple[str, ...], x: float, level: int) -> None:
        w = width * node.value / root.value if root.value else 0.0
        if w < MIN_WIDTH:
            return
        y = height - 8 - FRAME_HEIGHT * (level + 1)
        share = after[path]
        tip = f"{node.name} — {node.value:,.0f} samples, {share:.2f}%"
        if baseline is not None and path:
            named = named_after[node.name]
            colour = _change_colour(changes[node.name], scale)
            if per_unit is not None:
                was, now = times[node.name]
                tip += (f"; CPU per {per_unit.unit}: {now:.3g} µs, baseline {was:.3g} µs, "
                        f"added {now - was:+.3g} µs")
            tip += (f"; on {named:.2f}% of stacks, baseline {before.get(node.name, 0.0):.2f}%"
                    f", change {share_changes[node.name]:+.2f} pp")
        elif baseline is not None:
            colour = "rgb(255,255,255)"
        else:
            colour = _warm(node.name)
        chars = int((w - 6) / CHAR_WIDTH)
        label = node.name if len(node.name) <= chars else (
            node.name[:chars - 1] + "…" if chars > 2 else "")
        boxes.append(
            f'<g class="f" data-share="{share:.4f}"><title>{escape(tip)}</title>'
            f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{FRAME_HEIGHT - 1}" '
            f'fill="{colour}" rx="2"/>'
            f'<text x="{x + 3:.1f}" y="{y + FRAME_HEIGHT - 4}">{escape(label)}</text></g>')
        offset = x
        for child in sorted(node.children.values(), key=lambda c: c.name):
            draw(child, (*path, child.name), offset, level + 1)
            offset += width * child.value / root.value

    draw(root, (), 0.0, 0)
    legend = ("width: share of samples" if baseline is None else
              f"colour: CPU µs per {per_unit.unit} added against the baseline (red: more, "
              "blue: less)" if per_unit is not None else
              "colour: share of samples against the baseline (red: larger, blue: smaller; "
              "work unknown, so no CPU per unit of work)")
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" id="{graph_id}" class="flamegraph" '
        f'width="100%" viewBox="0 0 {width} {height}" '
        f'font-family="Verdana, sans-serif" font-size="{FONT_SIZE}">'
        f'<style>#{graph_id} .f:hover rect{{stroke:#000;stroke-width:0.5}}'
        f' #{graph_id} .hit rect{{fill:rgb(230,0,230)}} #{graph_id} .s{{cursor:pointer}}</style>'
        f'<rect width="100%" height="100%" fill="#f8f8f8"/>'
        f'<text x="4" y="16" font-size="13">{escape(title)}</text>'
        f'<text x="4" y="30" fill="#555">{escape(legend)}; hover for numbers</text>'
        f'<text class="s" x="{width - 60}" y="16" fill="#06c">Search</text>'
        f'<text class="m" x="{width - 200}" y="30" fill="#555"></text>'
        + "".join(boxes) + _SEARCH.replace("GRAPH", graph_id) + "</svg>")


# Marks the frames whose name matches a regular expression and says the share they cover
# (outermost matches only, so nested matches are not counted twice).
_SEARCH = """<script><![CDATA[
(function () {
  var g = document.getElementById("GRAPH");
  g.querySelector(".s").addEventListener("click", function () {
    var term = prompt("Search frames (regular expression):", "");
    if (term === null) return;
    var re; try { re = new RegExp(term); } catch (e) { return; }
    var frames = g.querySelectorAll(".f"), covered = [], share = 0;
    frames.forEach(function (f) {
      var name = f.querySelector("title").textContent.split(" — ")[0];
      var hit = term !== "" && re.test(name);
      f.classList.toggle("hit", hit);
      if (!hit) return;
      var r = f.querySelector("rect"), x = +r.getAttribute("x"),
          w = +r.getAttribute("width");
      if (covered.some(function (c) { return x >= c[0] && x + w <= c[1] + 0.01; })) return;
      covered.push([x, x + w]);
      share += +f.getAttribute("data-share");
    });
    g.querySelector(".m").textContent = term ? "Matched: " + share.toFixed(1) + "%" : "";
  });
})();
]]></script>"""


# -- a run's profiled cells --------------------------------------------------------------------

@dataclass
class ProfileGraph:
    """A profiled cell's flame graph and, beside the baseline's, its differential one."""
    label: str
    svg: str
    diff_svg: str | None
    baseline: str | None         # the baseline cell's label
    samples: float
    unresolved: float | None
    overhead: float | None
    hints: list[str]
    symbols_note: str | None = None
    # Whole sampled CPU per unit of work, µs: the baseline's cell and this one.
    total_a: float | None = None
    total_b: float | None = None
    unit: str = ""


def per_unit(a: profile.CellProfile, b: profile.CellProfile) -> PerUnit | None:
    """CPU µs per unit of work of one sample of A and of B; None when either is unknown
    or the two count different units."""
    sa, sb = a.seconds_per_unit(1.0), b.seconds_per_unit(1.0)
    if sa is None or sb is None or a.work_unit != b.work_unit:
        return None
    return PerUnit(sa * 1e6, sb * 1e6, b.unit)


def graphs(cells: list[profile.CellProfile], baseline: str | None,
           labels: dict[str, str]) -> list[ProfileGraph]:
    """One graph per profiled cell of a run (analysis.profile.run_cells), differential
    against the baseline target's cell of the same workload and parameters when it was
    profiled too."""
    base = {(c.workload, repr(sorted(c.params.items()))): c for c in cells
            if c.target == baseline}
    found = []
    for cell in cells:
        label = cell.label.replace(cell.target, labels.get(cell.target, cell.target), 1)
        other = base.get((cell.workload, repr(sorted(cell.params.items()))))
        if other is cell:
            other = None
        # Graph titles without parameters: the section's heading has them.
        short = f"{labels.get(cell.target, cell.target)} · {cell.workload}"
        found.append(ProfileGraph(
            label, svg(cell.stacks, f"{short}: host CPU profile"),
            svg(cell.stacks, f"{short} against {labels.get(other.target, other.target)}",
                baseline=other.stacks, per_unit=per_unit(other, cell))
            if other else None, other.label if other else None, cell.samples,
            cell.unresolved, cell.overhead, cell.hints, cell.symbols_note,
            other.total_per_unit if other else None, cell.total_per_unit, cell.unit))
    return found
