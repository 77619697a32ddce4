"""The partition as one self-contained HTML page: numbers, a picture, the kernels, the refusals.

``render_html(partition, summary)`` needs nothing outside the page: inline CSS, inline
SVG, no fonts, no links out, and one fixed script of the page's own (the kernel filter box;
nothing from the model is ever placed in it). ``summary`` is ``summarize_partition``'s dict
(an optional ``"model"`` key names the model); the picture comes from the partition.
``profile``, where given, is a profile's JSON (tilefuse/profile.py, ``as_dict``): each
kernel's measured time (its step's median) is shown beside its estimate.

The picture draws every primitive inside a box per kernel when the graph is small; above
``condense_above`` primitives it draws one box per kernel, with the edges between kernels.
"""
from __future__ import annotations

from html import escape

from tilefuse.ir.graph import Node
from tilefuse.partition.model import FusedGroup, Partition
from tilefuse.partition.summary import folded
from tilefuse.report.layout import Layout, layered_layout

CONDENSE_ABOVE = 400
ONNX_SHOWN = 3  # ONNX node names shown in a table row before the expander

# Fixed, distinct, light enough for dark text; kernel i gets PALETTE[i % len(PALETTE)].
PALETTE = [
    "#8ecae6", "#ffb703", "#90be6d", "#f4a3a8", "#cdb4db", "#f9c74f",
    "#84dcc6", "#f8961e", "#a3c4f3", "#e5989b", "#b5e48c", "#d4a373",
]

CHAR_W = 6.7  # width of one 11px monospace character
BOX_H = 17.0
PAD = 8.0
TITLE_H = 16.0

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#1d1d1f;background:#fff}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px}
.stats{display:grid;grid-template-columns:max-content auto;gap:2px 16px;margin:8px 0}
.stats dt{color:#666}.stats dd{margin:0;font-variant-numeric:tabular-nums}
.note{color:#555;font-style:italic}
.graph{overflow:auto;border:1px solid #ddd;padding:8px;max-width:100%}
.graph svg{display:block;margin:0 auto;max-width:100%;height:auto}
nav a{margin-right:12px}
svg text{font:11px monospace;fill:#111;pointer-events:none}
svg .kt{font-weight:bold}
table{border-collapse:collapse;font-size:13px}
th,td{border-bottom:1px solid #e3e3e3;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f4f4f4;position:sticky;top:0}td.n{text-align:right;font-variant-numeric:tabular-nums}
.sw{display:inline-block;width:10px;height:10px;border:1px solid #555;margin-right:4px}
code{font-size:12px}summary{cursor:pointer;color:#2563eb}
tr:target{background:#fff3bf}
input[type=search]{font:13px system-ui,sans-serif;padding:3px 6px;width:28em;margin:4px 0 8px}
.legend dt{font-weight:600}.legend{display:grid;grid-template-columns:max-content auto;gap:2px 16px}
"""

# The filter box: rows of the kernel tables whose text does not hold what is typed are
# hidden. Fixed text; the page's data reaches it only through the DOM.
FILTER_JS = (
    "document.getElementById('q').addEventListener('input',function(e){var q=e.target.value.toLowerCase();"
    "document.querySelectorAll('table.k tr[data-row]').forEach(function(r){"
    "r.style.display=r.textContent.toLowerCase().indexOf(q)<0?'none':''})});"
)

PATTERNS = (
    ("gemm", "a matrix product or convolution (implicit GEMM) with what is fused before and after it: bias, "
             "activations, residuals, whole-row norms, sibling products, a second product (MLP chains)"),
    ("attention", "two products around a softmax, flash-style: the score matrix never leaves the chip"),
    ("rows", "row tiles: norms, softmax and elementwise chains over the last axis"),
    ("windows", "pooling windows"),
    ("staged", "the general fallback: every primitive in turn over scratch, on one tile (slow on the GPU; "
               "the reason the others refused is in the plan's schedules)"),
)


def render_html(partition: Partition, summary: dict, *, condense_above: int = CONDENSE_ABOVE,
                profile: dict | None = None) -> str:
    title = str(summary.get("model") or partition.graph.name or "model")
    measured = measured_by_group(profile) if profile else None
    condensed = len(partition.graph.nodes) > condense_above
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>tilefuse report: {escape(title)}</title><style>{CSS}</style></head><body>",
        _header(title, summary, profile, measured),
        '<h2 id="graph">Graph</h2>',
        _graph_note(partition, condensed, condense_above),
        '<div class="graph">',
        _kernel_svg(partition) if condensed else _primitive_svg(partition),
        "</div>",
        _legend(),
        _pattern_table(summary, measured),
        _kernel_table(summary, measured),
        _refusals(summary),
        f"<script>{FILTER_JS}</script>",
        "</body></html>",
    ]
    return "\n".join(parts)


# -- text -----------------------------------------------------------------------------


def _bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024:
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TB"


def _count(n: float) -> str:
    for unit in ("", "K", "M", "G", "T"):
        if abs(n) < 1000:
            return f"{n:.0f}{unit}" if unit == "" else f"{n:.1f}{unit}"
        n /= 1000
    return f"{n:.1f}P"


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.2f} us"


def measured_by_group(profile: dict) -> dict[int, float]:
    """Group id -> measured seconds of its step (the median), for the steps outside
    run-time branches (a branch's groups are numbered in its own partition)."""
    return {int(st["group"]): float(st["median_ms"]) / 1e3 for st in profile["steps"] if not st["in_branch"]}


def _header(title: str, s: dict, profile: dict | None = None, measured: dict[int, float] | None = None) -> str:
    ratio = s["fused_bytes"] / max(1, s["unfused_bytes"])
    speedup = s["unfused_estimated_seconds"] / max(1e-30, s["fused_estimated_seconds"])
    opaque = f" ({s['opaque_kernels']} opaque)" if s.get("opaque_kernels") else ""
    rows = [
        ("target", escape(str(s["target"]))),
        ("graph", f"{s['onnx_nodes']} ONNX nodes &rarr; {s['primitives']} primitives &rarr; "
                  f"{s['kernels']} kernels{opaque}"),
        ("memory traffic", f"{_bytes(s['unfused_bytes'])} unfused &rarr; "
                           f"{_bytes(s['fused_bytes'])} fused ({ratio:.0%})"),
        ("estimated time", f"{_us(s['unfused_estimated_seconds'])} unfused &rarr; "
                           f"{_us(s['fused_estimated_seconds'])} fused ({speedup:.1f}x)"),
        ("FLOPs", _count(s["flops"])),
    ]
    if profile is not None and measured is not None:
        threads = profile.get("threads")
        how = f"{threads} thread{'s' if threads != 1 else ''}" if threads is not None else "GPU kernels"
        rows.append(("measured time", f"{_us(sum(measured.values()))} "
                                      f"(each step timed on its own, median of {int(profile.get('iterations', 0))} "
                                      f"runs, {escape(how)})"))
    body = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in rows)
    nav = ('<nav><a href="#graph">graph</a><a href="#legend">legend</a><a href="#patterns">by pattern</a>'
           '<a href="#kernels">kernels</a><a href="#refusals">why not fused</a></nav>')
    return f"<h1>{escape(title)}</h1><dl class=\"stats\">{body}</dl>{nav}"


def _graph_note(p: Partition, condensed: bool, limit: int) -> str:
    if condensed:
        return (f'<p class="note">{len(p.graph.nodes)} primitives is more than {limit}: one box per kernel, '
                "an arrow where one kernel reads another's output. Hover a box for its primitives and ONNX nodes.</p>")
    return ('<p class="note">Primitives (boxes) grouped by kernel (coloured frames); '
            "arrows between frames are tensors passed through memory. Hover a box for details.</p>")


def _legend() -> str:
    items = "".join(f"<dt>{name}</dt><dd>{escape(text)}</dd>" for name, text in PATTERNS)
    more = ("<dt>est.</dt><dd>the cost model's time: the larger of FLOPs at the device's rate and bytes at its "
            "bandwidth, plus a launch</dd><dt>bound</dt><dd>which of the two the estimate is</dd>"
            "<dt>measured</dt><dd>from <code>tilefuse profile PLAN --json</code>, where given</dd>"
            "<dt>colour</dt><dd>a kernel's frame in the graph and its swatch in the tables</dd>")
    return f'<h2 id="legend">Legend</h2><dl class="legend">{items}{more}</dl>'


def _pattern_table(s: dict, measured: dict[int, float] | None = None) -> str:
    """Kernels by what they do: identical kernels (a transformer's layers) in one row."""
    rows = []
    total = sum(g["estimated_seconds"] for g in s["groups"]) or 1e-30
    for gs in folded(s["groups"]):
        g = gs[0]
        est = sum(x["estimated_seconds"] for x in gs)
        ids = ", ".join(f'<a href="#k{x["id"]}">k{x["id"]}</a>' for x in gs)
        what = escape("+".join(g.get("onnx_ops") or g["primitives"]))
        meas = ""
        if measured is not None:
            got = [measured[int(x["id"])] for x in gs if int(x["id"]) in measured]
            meas = f'<td class="n">{sum(got) * 1e6:.2f} us</td>' if got else '<td class="n">-</td>'
        rows.append(
            f'<tr data-row><td><span class="sw" style="background:{_colour(g["id"])}"></span>'
            f'{escape(str(g.get("pattern", g["anchor_kind"])))}</td><td>{what}</td><td class="n">{len(gs)}</td>'
            f'<td class="n">{g["estimated_seconds"] * 1e6:.2f} us</td><td class="n">{est * 1e6:.2f} us</td>'
            f'<td class="n">{est / total:.0%}</td>{meas}<td>{ids}</td></tr>'
        )
    head = ("<tr><th>pattern</th><th>what (ONNX ops)</th><th>x</th><th>est. each</th><th>est. total</th><th>share</th>"
            + ("<th>measured total</th>" if measured is not None else "") + "<th>kernels</th></tr>")
    search = ('<input id="q" type="search" placeholder="filter kernels: pattern, ONNX op, kernel or node name" '
              'aria-label="filter kernels">')
    return (f'<h2 id="patterns">Kernels by what they do ({len(rows)} distinct of {len(s["groups"])})</h2>{search}'
            f'<table class="k">{head}{"".join(rows)}</table>')


def _kernel_table(s: dict, measured: dict[int, float] | None = None) -> str:
    head = ("<tr><th>id</th><th>kernel</th><th>pattern</th><th>anchor</th><th>prims</th><th>ONNX nodes</th><th>FLOPs</th>"
            "<th>bytes in</th><th>bytes out</th><th>est. time</th>"
            + ("<th>measured</th><th>measured / est.</th>" if measured is not None else "") + "<th>bound</th></tr>")
    rows = []
    for g in s["groups"]:
        onnx = [escape(str(o)) for o in g["onnx_nodes"]]
        cell = ", ".join(onnx[:ONNX_SHOWN])
        if len(onnx) > ONNX_SHOWN:
            cell += (f"<details><summary>{len(onnx) - ONNX_SHOWN} more</summary>"
                     f"{', '.join(onnx[ONNX_SHOWN:])}</details>")
        anchor = escape(str(g["anchor_kind"])) + (f" ({escape(str(g['anchor']))})" if g.get("anchor") else "")
        rows.append(
            f'<tr id="k{g["id"]}" data-row><td><span class="sw" style="background:{_colour(g["id"])}"></span>k{g["id"]}</td>'
            f"<td><code>{escape(str(g['name']))}</code></td><td>{escape(str(g.get('pattern', '')))}</td><td>{anchor}</td>"
            f'<td class="n">{len(g["primitives"])}</td><td>{cell}</td><td class="n">{_count(g["flops"])}</td>'
            f'<td class="n">{_bytes(g["bytes_in"])}</td><td class="n">{_bytes(g["bytes_out"])}</td>'
            f'<td class="n">{g["estimated_seconds"] * 1e6:.2f} us</td>{_measured_cells(g, measured)}'
            f'<td>{escape(str(g["bound"]))}</td></tr>'
        )
    return f'<h2 id="kernels">Kernels ({len(rows)})</h2><table class="k">{head}{"".join(rows)}</table>'


def _measured_cells(g: dict, measured: dict[int, float] | None) -> str:
    """The measured time of a kernel and its ratio to the estimate ("-": not profiled)."""
    if measured is None:
        return ""
    seconds = measured.get(int(g["id"]))
    if seconds is None:
        return '<td class="n">-</td><td class="n">-</td>'
    ratio = f'{seconds / g["estimated_seconds"]:.1f}x' if g["estimated_seconds"] else "-"
    return f'<td class="n">{seconds * 1e6:.2f} us</td><td class="n">{ratio}</td>'


def _refusals(s: dict) -> str:
    refusals = s.get("refusals") or []
    if not refusals:
        return '<h2 id="refusals">Why not fused</h2><p>Every pair of neighbouring kernels was merged.</p>'
    items = "".join(
        f'<li><a href="#k{r["a"]}">k{r["a"]}</a> &rarr; <a href="#k{r["b"]}">k{r["b"]}</a> '
        f"(<code>{escape(str(r['node_a']))}</code> &rarr; <code>{escape(str(r['node_b']))}</code>): "
        f"{escape(str(r['reason']))}</li>"
        for r in refusals
    )
    counts: dict[str, int] = {}
    for r in refusals:
        counts[str(r["reason"])] = counts.get(str(r["reason"]), 0) + 1
    by_count = sorted(counts.items(), key=lambda c: -c[1])
    tally = "".join(f"<li>{k} &times; {escape(reason)}</li>" for reason, k in by_count)
    return (f'<h2 id="refusals">Why not fused ({len(refusals)})</h2><p>By reason:</p><ul>{tally}</ul>'
            f"<p>Each pair:</p><ul>{items}</ul>")


# -- pictures -------------------------------------------------------------------------


def _colour(kernel: int) -> str:
    return PALETTE[kernel % len(PALETTE)]


def _text_w(label: str) -> float:
    return CHAR_W * len(label) + 10


def _kernel_edges(p: Partition) -> list[tuple[int, int]]:
    owner = p.group_of()
    return [
        (owner[id(v.producer)].id, g.id)
        for g in p.groups for v in g.inputs
        if v.producer is not None and id(v.producer) in owner
    ]


def _svg_open(width: float, height: float) -> str:
    w, h = width + 2 * PAD, height + 2 * PAD
    return (f'<svg width="{w:.0f}" height="{h:.0f}" '
            f'viewBox="{-PAD:.0f} {-PAD:.0f} {w:.0f} {h:.0f}">'
            '<defs><marker id="arrow" viewBox="0 0 8 8" refX="8" refY="4" markerWidth="7" markerHeight="7" '
            'orient="auto"><path d="M0,0L8,4L0,8z" fill="#666"/></marker></defs>')


def _path(points: list[tuple[float, float]], dx: float = 0.0, dy: float = 0.0, *, between_kernels: bool) -> str:
    d = "M" + "L".join(f"{x + dx:.1f},{y + dy:.1f}" for x, y in points)
    style = 'stroke="#666" stroke-width="1.2"' if between_kernels else 'stroke="#999" stroke-width="1"'
    return f'<path d="{d}" fill="none" {style} marker-end="url(#arrow)"/>'


def _node_title(n: Node) -> str:
    types = ", ".join(str(v.type) for v in n.outputs)
    return escape(f"{n.name}\n{n.op} -> {types}\nONNX node: {n.origin or '(none)'}")


def _group_title(g: FusedGroup, p: Partition) -> str:
    ops: dict[str, int] = {}
    for n in g.nodes:
        ops[n.op.name] = ops.get(n.op.name, 0) + 1
    onnx = g.onnx_nodes
    shown = ", ".join(onnx[:8]) + (f", ... ({len(onnx) - 8} more)" if len(onnx) > 8 else "")
    return escape(
        f"{g.name}: {len(g.nodes)} primitives, {g.kind}, est. {g.cost.seconds(p.target) * 1e6:.2f} us "
        f"on {p.target.name}\n" + ", ".join(f"{op} x{k}" for op, k in ops.items()) + f"\nONNX: {shown}"
    )


def _inner_layout(g: FusedGroup) -> Layout:
    index = {id(n): k for k, n in enumerate(g.nodes)}
    sizes = [(_text_w(n.op.name), BOX_H) for n in g.nodes]
    edges = [(index[id(v.producer)], k) for k, n in enumerate(g.nodes)
             for v in n.inputs if v.producer is not None and id(v.producer) in index]
    return layered_layout(sizes, edges, gap_x=10, gap_y=14)


def _primitive_svg(p: Partition) -> str:
    """Each kernel a coloured frame around its own layered primitives; frames laid out in turn."""
    inner = [_inner_layout(g) for g in p.groups]
    labels = [f"k{g.id} {g.name.split('_', 1)[-1]}" for g in p.groups]
    sizes = [(max(lay.width, CHAR_W * len(lab)) + 2 * PAD, lay.height + TITLE_H + 2 * PAD)
             for lay, lab in zip(inner, labels)]
    outer = layered_layout(sizes, _kernel_edges(p))
    out = [_svg_open(outer.width, outer.height)]
    out += [_path(pts, between_kernels=True) for pts in outer.edges]
    for g, lay, label, (x, y, w, h) in zip(p.groups, inner, labels, outer.boxes):
        c = _colour(g.id)
        ox, oy = x + (w - lay.width) / 2, y + TITLE_H + PAD
        out.append(f'<g data-kernel="{g.id}"><rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" '
                   f'rx="6" fill="{c}" fill-opacity="0.18" stroke="{c}" stroke-width="2">'
                   f"<title>{_group_title(g, p)}</title></rect>"
                   f'<text class="kt" x="{x + 5:.1f}" y="{y + 13:.1f}">{escape(label)}</text>')
        out += [_path(pts, ox, oy, between_kernels=False) for pts in lay.edges]
        for n, (bx, by, bw, bh) in zip(g.nodes, lay.boxes):
            out.append(f'<g><rect x="{bx + ox:.1f}" y="{by + oy:.1f}" width="{bw:.1f}" height="{bh:.1f}" rx="3" '
                       f'fill="{c}" stroke="#555" stroke-width="0.6"><title>{_node_title(n)}</title></rect>'
                       f'<text x="{bx + ox + 5:.1f}" y="{by + oy + 13:.1f}">{escape(n.op.name)}</text></g>')
        out.append("</g>")
    out.append("</svg>")
    return "".join(out)


def _kernel_svg(p: Partition) -> str:
    """One box per kernel: its id and ops, its primitive count and estimated time."""
    lines = [(f"k{g.id} {g.name.split('_', 1)[-1]}", f"{len(g.nodes)} prims, {g.cost.seconds(p.target) * 1e6:.1f} us")
             for g in p.groups]
    sizes = [(max(_text_w(a), _text_w(b)), 2 * BOX_H) for a, b in lines]
    lay = layered_layout(sizes, _kernel_edges(p))
    out = [_svg_open(lay.width, lay.height)]
    out += [_path(pts, between_kernels=True) for pts in lay.edges]
    for g, (a, b), (x, y, w, h) in zip(p.groups, lines, lay.boxes):
        title = _group_title(g, p)
        out.append(f'<g data-kernel="{g.id}"><rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" rx="4" '
                   f'fill="{_colour(g.id)}" stroke="#555" stroke-width="0.8"><title>{title}</title></rect>'
                   f'<text class="kt" x="{x + 5:.1f}" y="{y + 13:.1f}">{escape(a)}</text>'
                   f'<text x="{x + 5:.1f}" y="{y + 30:.1f}">{escape(b)}</text></g>')
    out.append("</svg>")
    return "".join(out)
