"""A layered (Sugiyama-style) layout of a DAG of boxes, top to bottom, deterministic.

``layered_layout(sizes, edges)`` takes boxes given in a topological order (every edge
``(u, v)`` has ``u < v``) and returns where each box goes and the polyline of each edge:

1. layers by longest path from the sources; a source is then pulled down to just above
   its first consumer, so inputs do not all crowd the top row;
2. an edge that spans several layers gets a thin dummy box in each layer it crosses, so
   it is routed around boxes rather than through them; edges from one source share them;
3. the order within a layer comes from barycenter sweeps (down, up, down) that reduce
   crossings; ties keep the previous order, so the result never depends on hashing;
4. x coordinates: each box wants to sit at the mean x of its neighbours; an isotonic
   regression (pool adjacent violators) finds the closest positions that keep the order
   and the gaps.
"""
from __future__ import annotations

from dataclasses import dataclass

Point = tuple[float, float]

GAP_X = 14.0  # default gap between neighbouring boxes of a layer
GAP_Y = 26.0  # default gap between layers
DUMMY_WIDTH = 6.0
SWEEPS = 3
PORT_STEP = 8.0  # between the arrow heads of edges entering one box


@dataclass(frozen=True, slots=True)
class Layout:
    boxes: list[tuple[float, float, float, float]]  # (x, y, width, height), top-left corner
    edges: list[list[Point]]  # one polyline per distinct input edge, in first-seen order
    width: float
    height: float


def layered_layout(
    sizes: list[tuple[float, float]], edges: list[tuple[int, int]], *, gap_x: float = GAP_X, gap_y: float = GAP_Y
) -> Layout:
    n = len(sizes)
    edges = list(dict.fromkeys(edges))  # parallel edges draw as one; order kept
    for u, v in edges:
        if not 0 <= u < v < n:
            raise ValueError(f"edge ({u}, {v}) does not follow the topological order of {n} boxes")
    layer = _layers(n, edges)

    # Split long edges into chains through dummy boxes (ids n, n+1, ...).
    widths = [w for w, _ in sizes]
    heights = [h for _, h in sizes]
    layer_of = list(layer)
    # Edges from one source share their dummies: a fan-out runs down as one trunk.
    trunk: dict[tuple[int, int], int] = {}
    chains: list[list[int]] = []
    for u, v in edges:
        chain = [u]
        for l in range(layer[u] + 1, layer[v]):
            if (u, l) not in trunk:
                trunk[u, l] = len(widths)
                widths.append(DUMMY_WIDTH)
                heights.append(0.0)
                layer_of.append(l)
            chain.append(trunk[u, l])
        chain.append(v)
        chains.append(chain)
    links = dict.fromkeys((a, b) for chain in chains for a, b in zip(chain, chain[1:]))
    preds: list[list[int]] = [[] for _ in widths]
    succs: list[list[int]] = [[] for _ in widths]
    for a, b in links:
        succs[a].append(b)
        preds[b].append(a)

    rows: list[list[int]] = [[] for _ in range(max(layer_of, default=-1) + 1)]
    for i, l in enumerate(layer_of):
        rows[l].append(i)
    _order(rows, preds, succs)
    xs = _x_positions(rows, widths, preds, succs, gap_x)

    tops, y = [], 0.0
    for row in rows:
        tops.append(y)
        y += max((heights[i] for i in row), default=0.0) + gap_y
    height = max(0.0, y - gap_y)
    left = min((xs[i] - widths[i] / 2 for i in range(len(widths))), default=0.0)
    right = max((xs[i] + widths[i] / 2 for i in range(len(widths))), default=0.0)

    boxes = [(xs[i] - widths[i] / 2 - left, tops[layer[i]], widths[i], heights[i]) for i in range(n)]
    polylines = []
    for chain in chains:
        u, v = chain[0], chain[-1]
        points = [(xs[u] - left, tops[layer[u]] + heights[u])]
        for d in chain[1:-1]:
            row_height = max(heights[i] for i in rows[layer_of[d]])
            points += [(xs[d] - left, tops[layer_of[d]]), (xs[d] - left, tops[layer_of[d]] + row_height)]
        points.append((xs[v] - left, tops[layer[v]]))
        polylines.append(points)
    _spread_ports(polylines, [chain[-1] for chain in chains], widths)
    return Layout(boxes, polylines, right - left, height)


def _spread_ports(polylines: list[list[Point]], targets: list[int], widths: list[float]) -> None:
    """Edges into one box arrive side by side along its top, in the order they come from."""
    into: dict[int, list[int]] = {}
    for e, v in enumerate(targets):
        into.setdefault(v, []).append(e)
    for v, es in into.items():
        if len(es) < 2:
            continue
        es.sort(key=lambda e: (polylines[e][-2][0], e))
        step = min(PORT_STEP, widths[v] / (len(es) + 1))
        for k, e in enumerate(es):
            x, y = polylines[e][-1]
            polylines[e][-1] = (x + (k - (len(es) - 1) / 2) * step, y)


def _layers(n: int, edges: list[tuple[int, int]]) -> list[int]:
    preds: list[list[int]] = [[] for _ in range(n)]
    succs: list[list[int]] = [[] for _ in range(n)]
    for u, v in edges:
        preds[v].append(u)
        succs[u].append(v)
    layer = [0] * n
    for v in range(n):
        layer[v] = max((layer[u] + 1 for u in preds[v]), default=0)
    for v in reversed(range(n)):
        if not preds[v] and succs[v]:
            layer[v] = min(layer[s] for s in succs[v]) - 1
    return layer


def _order(rows: list[list[int]], preds: list[list[int]], succs: list[list[int]]) -> None:
    """Reorder each row in place by the barycenter of its neighbours in the row above/below."""
    pos = {i: k for row in rows for k, i in enumerate(row)}
    for sweep in range(SWEEPS):
        down = sweep % 2 == 0
        for row in rows[1:] if down else reversed(rows[:-1]):
            near = preds if down else succs

            def key(i: int) -> tuple[float, int]:
                ns = near[i]
                return (sum(pos[j] for j in ns) / len(ns) if ns else pos[i], pos[i])

            row.sort(key=key)
            for k, i in enumerate(row):
                pos[i] = k


def _x_positions(
    rows: list[list[int]], widths: list[float], preds: list[list[int]], succs: list[list[int]], gap: float
) -> list[float]:
    """Box centres: each row packed, then pulled towards its neighbours' mean x."""
    xs = [0.0] * len(widths)
    for row in rows:
        _place(row, widths, xs, {i: 0.0 for i in row}, gap)
    for sweep in range(SWEEPS + 1):
        down = sweep % 2 == 0
        near = preds if down else succs
        for row in rows[1:] if down else reversed(rows[:-1]):
            want = {i: sum(xs[j] for j in near[i]) / len(near[i]) if near[i] else xs[i] for i in row}
            _place(row, widths, xs, want, gap)
    return xs


def _place(row: list[int], widths: list[float], xs: list[float], want: dict[int, float], gap: float) -> None:
    """Closest centres to ``want`` (least squares) that keep ``row``'s order and gaps.

    With offsets o_k (the packed distance of box k from box 0), y_k = x_k - o_k must be
    non-decreasing: an isotonic regression of want_k - o_k, solved by pooling.
    """
    offsets, o = [], 0.0
    for k, i in enumerate(row):
        if k:
            o += (widths[row[k - 1]] + widths[i]) / 2 + gap
        offsets.append(o)
    blocks: list[list[float]] = []  # [sum, count]
    for k, i in enumerate(row):
        blocks.append([want[i] - offsets[k], 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s, c = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += c
    k = 0
    for s, c in blocks:
        for _ in range(int(c)):
            xs[row[k]] = s / c + offsets[k]
            k += 1
