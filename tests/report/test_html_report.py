"""The HTML report: one self-contained page, a picture per kernel, every kernel in the table.

Graphs come from the Builder (no onnx needed); nothing here needs a browser.
"""
import re

import numpy as np
import pytest

from tilefuse.ir import Builder, DType, TensorType
from tilefuse.ir.prims import ReduceFn, ScalarFn
from tilefuse.partition import partition_graph
from tilefuse.partition.summary import summarize_partition
from tilefuse.report import render_html
from tilefuse.report.html import FILTER_JS
from tilefuse.report.html import CONDENSE_ABOVE, PALETTE
from tilefuse.report.layout import layered_layout
from tilefuse.target import CUDA_SM90A

EVIL = "<script>alert('x')</script>"


def _small_graph() -> Builder:
    """x @ w1 + b, a softmax over rows, @ w2, tanh; one ONNX node name is hostile."""
    b = Builder("small & <odd>")
    x = b.input("x", TensorType(DType.FLOAT32, (64, 32)))
    b.origin = "mm1"
    h = b.map(ScalarFn.ADD, b.matmul(x, b.const(np.ones((32, 48), np.float32))), b.const(np.float32(0.5)))
    b.origin = EVIL
    m = b.reduce(ReduceFn.MAX, h, [1], keepdims=True)
    e = b.map(ScalarFn.EXP, b.map(ScalarFn.SUB, h, m))
    s = b.map(ScalarFn.DIV, e, b.reduce(ReduceFn.SUM, e, [1], keepdims=True))
    b.origin = "mm2"
    y = b.map(ScalarFn.TANH, b.matmul(s, b.const(np.ones((48, 16), np.float32))))
    b.output("y", y)
    b.output("h", h)  # a second consumer of h outside any kernel
    return b


def _chain(length: int) -> Builder:
    b = Builder("chain")
    x = b.input("x", TensorType(DType.FLOAT32, (8, 16)))
    w = b.const(np.ones((16, 16), np.float32), name="w")
    for i in range(length):
        b.origin = f"layer{i}"
        x = b.map(ScalarFn.TANH, b.map(ScalarFn.ADD, b.matmul(x, w), b.const(np.float32(1))))
    b.output("y", x)
    return b


def _render(b: Builder, **kwargs) -> tuple[str, object]:
    p = partition_graph(b.graph, CUDA_SM90A)
    return render_html(p, summarize_partition(p, onnx_nodes=7), **kwargs), p


def _assert_self_contained(html: str) -> None:
    assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")
    lowered = html.lower()
    for needle in ("http://", "https://", "src=", "<link", "@import"):
        assert needle not in lowered, needle
    # one script, the page's own fixed filter, and nothing else
    assert re.findall(r"<script>(.*?)</script>", html, flags=re.S) == [FILTER_JS] and lowered.count("<script") == 1
    assert all(ref.startswith("#") for ref in re.findall(r"url\(([^)]*)\)", html))
    assert all(ref.startswith("#") for ref in re.findall(r'href="([^"]*)"', html))


def _kernel_fills(html: str) -> dict[int, str]:
    """Each kernel's colour: the fill of the first rect in its <g data-kernel=...>."""
    return {int(k): fill for k, fill in re.findall(r'<g data-kernel="(\d+)"><rect [^>]*?fill="(#[0-9a-f]{6})"', html)}


def test_small_graph_page():
    html, p = _render(_small_graph())
    _assert_self_contained(html)
    assert html.count("<svg") == 1
    assert html.count('<tr id="k') == len(p.groups) >= 2
    fills = _kernel_fills(html)
    assert fills == {g.id: PALETTE[g.id % len(PALETTE)] for g in p.groups}
    assert len(set(fills.values())) == len(p.groups)
    # every primitive drawn, with a hover title naming its ONNX node
    assert html.count("<title>") == len(p.graph.nodes) + len(p.groups) + 1  # + kernels' frames, + the page
    assert "ONNX node: mm1" in html
    assert "ONNX nodes &rarr;" in html and "kernels" in html


def test_text_is_escaped():
    html, _ = _render(_small_graph())
    assert EVIL not in html and html.count("<script") == 1  # only the page's own filter
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in html
    assert "small &amp; &lt;odd&gt;" in html


def test_refusals_are_listed():
    html, p = _render(_small_graph())
    assert p.refusals, "two contractions stay in two kernels"
    for r in p.refusals:
        assert f'href="#k{r.group_a}">k{r.group_a}</a> &rarr; <a href="#k{r.group_b}">' in html


def test_big_graph_is_drawn_one_box_per_kernel():
    b = _chain(CONDENSE_ABOVE // 3 + 10)
    assert len(b.graph.nodes) > CONDENSE_ABOVE
    html, p = _render(b)
    _assert_self_contained(html)
    assert f"is more than {CONDENSE_ABOVE}: one box per kernel" in html
    assert html.count("<g data-kernel=") == len(p.groups)
    assert html.count("<title>") == len(p.groups) + 1  # no box per primitive
    assert html.count('<tr id="k') == len(p.groups)
    assert len(set(_kernel_fills(html).values())) == min(len(p.groups), len(PALETTE))
    # and the same graph drawn per primitive when the threshold allows it
    full = render_html(p, summarize_partition(p, onnx_nodes=1), condense_above=10**6)
    assert full.count("<title>") == len(p.graph.nodes) + len(p.groups) + 1


def test_rendering_is_deterministic():
    assert _render(_small_graph())[0] == _render(_small_graph())[0]


def test_layout_keeps_layers_and_order():
    # a diamond 0-1-2-3 into 5, a long edge 0 -> 5, and a source (4) that feeds only 5
    sizes = [(40.0, 10.0)] * 6
    edges = [(0, 1), (0, 2), (1, 3), (2, 3), (3, 5), (0, 5), (4, 5), (4, 5)]
    lay = layered_layout(sizes, edges)
    ys = [y for _, y, _, _ in lay.boxes]
    assert ys[0] < ys[1] == ys[2] < ys[3] < ys[5]
    assert ys[4] == ys[3]  # pulled down next to its consumer's other input
    for x, y, w, h in lay.boxes:
        assert 0 <= x and x + w <= lay.width + 1e-6 and y + h <= lay.height + 1e-6
    for row in (ys[1], ys[3]):
        a, b = sorted((x, x + w) for x, y, w, _ in lay.boxes if y == row)
        assert a[1] <= b[0]  # no overlap within a layer
    assert len(lay.edges) == len(edges) - 1  # the parallel edge is drawn once
    assert len(lay.edges[5]) > 2  # the long edge bends around the boxes between
    assert layered_layout(sizes, edges) == lay
    with pytest.raises(ValueError):
        layered_layout(sizes, [(3, 1)])


def test_repeated_layers_fold_into_one_row_named_by_pattern(zoo_cache):
    """bert tiny's two layers: each kernel of a layer appears once in the table of what the
    kernels do, with a count of 2 and links to both; a legend names the patterns; the
    filter box is there."""
    import models
    from tilefuse.compiler import compile_model

    compiled = compile_model(models.build("bert", "tiny", "float32", cache_dir=zoo_cache), "cpu",
                             models.ZOO["bert"].shapes("tiny"))
    s = summarize_partition(compiled.partition, compiled.onnx_nodes, compiled.onnx_ops)
    html = render_html(compiled.partition, s)
    _assert_self_contained(html)
    table = html[html.index('id="patterns"'):html.index('id="kernels"')]
    rows = re.findall(r"<tr data-row>(.*?)</tr>", table)
    attention = [r for r in rows if ">attention</td>" in r]
    assert len(attention) == 1 and '<td class="n">2</td>' in attention[0] and "Softmax" in attention[0]
    assert len(re.findall(r'href="#k\d+"', attention[0])) == 2
    assert sum(int(re.findall(r'<td class="n">(\d+)</td>', r)[0]) for r in rows) == len(s["groups"])
    assert '<dl class="legend">' in html and "<dt>staged</dt>" in html and 'id="q" type="search"' in html
