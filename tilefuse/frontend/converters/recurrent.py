"""Recurrent ONNX ops (RNN, GRU, LSTM), unrolled over their static sequence length.

Shapes are static, so the time loop becomes straight-line primitives. Per direction,
one MatMul projects every timestep's input at once (``X W^T`` plus the biases that do
not depend on the state); each step then slices its row, adds the recurrent MatMul
``H R^T`` and applies the gates as Map chains. The state stays shaped ``[1, B, H]``
throughout, so the steps concatenate into ``Y`` without reshapes.

``sequence_lens`` becomes one Where mask per step (``t < len[b]``): past its end a
batch row keeps its state and writes zeros into ``Y``. The reverse direction runs
``t = T-1 .. 0`` under the same masks, which is exactly "reverse each row's first
``len`` steps": the state stays initial until ``t = len - 1``. Constant lengths fold
the masks away; lengths given at run time are compared at run time.

Where the spec leaves things open, onnxruntime's CPU kernels are followed (they are
what models are checked against): activation alpha/beta are consumed in order only by
the functions that take them; ``clip`` bounds the gate pre-activations, not the cell
state; a row of length 0 gets zero final states. Half floats compute in float32.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from tilefuse.frontend.context import NodeContext
from tilefuse.frontend.converters.elementwise import elu_of, hard_sigmoid_of, mul_scalar, scalar, softplus_of
from tilefuse.frontend.registry import converter
from tilefuse.ir.builder import Builder
from tilefuse.ir.dtypes import DType
from tilefuse.ir.graph import Value
from tilefuse.ir.prims import ScalarFn as F

# -- activations -----------------------------------------------------------------------

# Which of (alpha, beta) each activation consumes from activation_alpha/beta, and the
# value it takes when the list has run out: the defaults of the corresponding ONNX
# operators, as the spec says (onnxruntime agrees for LeakyRelu, HardSigmoid and Elu,
# but takes 0 for Affine, ThresholdedRelu and ScaledTanh, which exporters always set).
_PARAMS: dict[str, tuple[bool, bool]] = {
    "relu": (False, False), "tanh": (False, False), "sigmoid": (False, False),
    "softsign": (False, False), "softplus": (False, False),
    "affine": (True, True), "leakyrelu": (True, False), "thresholdedrelu": (True, False),
    "scaledtanh": (True, True), "hardsigmoid": (True, True), "elu": (True, False),
}
_DEFAULTS: dict[str, tuple[float, float]] = {
    "affine": (1.0, 0.0), "leakyrelu": (0.01, 0.0), "thresholdedrelu": (1.0, 0.0),
    "scaledtanh": (1.0, 1.0), "hardsigmoid": (0.2, 0.5), "elu": (1.0, 0.0),
}


@dataclass(frozen=True)
class Activation:
    name: str  # lower case, a key of _PARAMS
    alpha: float = 0.0
    beta: float = 0.0

    def __call__(self, b: Builder, x: Value) -> Value:
        return _ACTIVATIONS[self.name](b, x, self.alpha, self.beta)


def _thresholded_relu(b: Builder, x: Value, alpha: float) -> Value:
    return b.map(F.WHERE, b.map(F.GT, x, scalar(b, alpha, x)), x, scalar(b, 0, x))


def _leaky_relu(b: Builder, x: Value, alpha: float) -> Value:
    return b.map(F.WHERE, b.map(F.LT, x, scalar(b, 0, x)), mul_scalar(b, x, alpha), x)


def _softsign(b: Builder, x: Value) -> Value:
    return b.map(F.DIV, x, b.map(F.ADD, scalar(b, 1, x), b.map(F.ABS, x)))


_ACTIVATIONS: dict[str, Callable[[Builder, Value, float, float], Value]] = {
    "relu": lambda b, x, a, c: b.map(F.MAX, x, scalar(b, 0, x)),
    "tanh": lambda b, x, a, c: b.map(F.TANH, x),
    "sigmoid": lambda b, x, a, c: b.map(F.SIGMOID, x),
    "affine": lambda b, x, a, c: b.map(F.ADD, mul_scalar(b, x, a), scalar(b, c, x)),
    "leakyrelu": lambda b, x, a, c: _leaky_relu(b, x, a),
    "thresholdedrelu": lambda b, x, a, c: _thresholded_relu(b, x, a),
    "scaledtanh": lambda b, x, a, c: mul_scalar(b, b.map(F.TANH, mul_scalar(b, x, c)), a),
    "hardsigmoid": lambda b, x, a, c: hard_sigmoid_of(b, x, a, c),
    "elu": lambda b, x, a, c: elu_of(b, x, a),
    "softsign": lambda b, x, a, c: _softsign(b, x),
    "softplus": lambda b, x, a, c: softplus_of(b, x),
}


def parse_activations(ctx: NodeContext, defaults: Sequence[str], directions: int) -> list[list[Activation]]:
    """The activations of each direction, with their alpha and beta.

    ``activations`` lists ``len(defaults)`` functions per direction; one set given to a
    bidirectional op serves both, two sets given to a one-way op use the first. alpha and beta are consumed in list order, each only
    by a function that takes it.
    """
    given = ctx.attr("activations") if ctx.has_attr("activations") else None
    names = [n.decode() if isinstance(n, bytes) else str(n) for n in (given or [])]
    if not names:
        names = list(defaults) * directions
    elif len(names) == len(defaults) and directions == 2:
        names = names * 2
    elif len(names) == 2 * len(defaults) and directions == 1:
        names = names[:len(defaults)]  # as onnxruntime reads RNN's two-name schema default
    if len(names) != len(defaults) * directions:
        raise ctx.error(f"activations: expected {len(defaults) * directions} names, got {names}")
    alphas = list(ctx.attr("activation_alpha") or [])
    betas = list(ctx.attr("activation_beta") or [])
    acts = []
    for name in names:
        key = name.lower()
        if key not in _PARAMS:
            raise ctx.unsupported(f"activation {name!r}")
        takes_alpha, takes_beta = _PARAMS[key]
        alpha, beta = _DEFAULTS.get(key, (0.0, 0.0))
        if takes_alpha and alphas:
            alpha = float(alphas.pop(0))
        if takes_beta and betas:
            beta = float(betas.pop(0))
        acts.append(Activation(key, alpha, beta))
    n = len(defaults)
    return [acts[d * n:(d + 1) * n] for d in range(directions)]


# -- what every recurrent op shares ----------------------------------------------------


@dataclass
class Direction:
    """One direction's parameters, sliced from the stacked inputs."""

    reverse: bool
    acts: list[Activation]
    w_t: Value  # [1, I, G*H]: W[d] transposed
    r_t: Value  # [1, H, G*H]: R[d] transposed
    wb: Value | None  # [1, G*H]
    rb: Value | None  # [1, G*H]
    h0: Value  # [1, B, H]
    c0: Value | None = None  # [1, B, H], LSTM only
    p: Value | None = None  # [1, 3H], LSTM peepholes (i, o, f)

    def initial_states(self) -> tuple[Value, ...]:
        return (self.h0,) if self.c0 is None else (self.h0, self.c0)


@dataclass
class Recurrence:
    """A recurrent node's inputs in layout 0 and the compute dtype, and its attributes."""

    ctx: NodeContext
    x: Value  # [T, B, I]
    hidden: int
    clip: float | None
    lens: Value | None  # [1, B, 1] sequence lengths
    directions: list[Direction]
    out_dtype: DType

    @property
    def b(self) -> Builder:
        return self.ctx.b

    @property
    def steps(self) -> int:
        return self.x.type.shape[0]

    def clipped(self, x: Value) -> Value:
        if self.clip is None:
            return x
        b = self.b
        return b.map(F.MIN, b.map(F.MAX, x, scalar(b, -self.clip, x)), scalar(b, self.clip, x))

    def project_inputs(self, d: Direction, bias: Value | None) -> Value:
        """``X W^T + bias`` for every timestep at once: [T, B, G*H]."""
        xw = self.b.matmul(self.x, d.w_t)
        return xw if bias is None else self.b.map(F.ADD, xw, bias)

    def mask(self, t: int) -> Value | None:
        """``t < len[b]`` as [1, B, 1]; None when every row is still running."""
        if self.lens is None:
            return None
        m = self.b.map(F.LT, self.b.const(np.array(t, self.lens.type.dtype.numpy)), self.lens)
        return None if m.is_constant and bool(np.all(m.data)) else m


@dataclass
class Stacked:
    """The per-direction inputs as the node gives them, stacked on a leading axis of size
    ``num_directions`` (weights already transposed, states in layout 0)."""

    w_t: Value  # [D, I, G*H]
    r_t: Value  # [D, H, G*H]
    bias: Value | None  # [D, 2*G*H]
    h0: Value | None  # [D, B, H]
    c0: Value | None  # [D, B, H]
    p: Value | None  # [D, 3H]

    def direction(self, b: Builder, d: int, reverse: bool, acts: list[Activation], gh: int, zeros: Value,
                  has_cell: bool) -> Direction:
        """Direction ``d``'s slices; missing states start at ``zeros``."""

        def pick(v: Value | None) -> Value | None:
            return None if v is None else b.slice(v, 0, d, d + 1)

        bias, h0, c0 = pick(self.bias), pick(self.h0), pick(self.c0)
        return Direction(
            reverse=reverse,
            acts=acts,
            w_t=b.slice(self.w_t, 0, d, d + 1),
            r_t=b.slice(self.r_t, 0, d, d + 1),
            wb=None if bias is None else b.slice(bias, 1, 0, gh),
            rb=None if bias is None else b.slice(bias, 1, gh, 2 * gh),
            h0=zeros if h0 is None else h0,
            c0=None if not has_cell else zeros if c0 is None else c0,
            p=pick(self.p),
        )


def prepare(ctx: NodeContext, gates: int, default_acts: Sequence[str]) -> Recurrence:
    """Read X, W, R, B, sequence_lens, initial_h (and LSTM's initial_c, P), in layout 0."""
    b = ctx.b
    x, w, r = ctx.input(0), ctx.input(1), ctx.input(2)
    out_dtype = x.type.dtype
    if not out_dtype.is_float:
        raise ctx.error(f"X must be a float tensor, got {out_dtype}")
    dtype = out_dtype.compute

    def up(v: Value | None) -> Value | None:
        return None if v is None else b.cast(v, dtype)

    direction = ctx.attr("direction", "forward")
    if direction not in ("forward", "reverse", "bidirectional"):
        raise ctx.unsupported(f"direction={direction!r}")
    num_dirs = 2 if direction == "bidirectional" else 1
    layout = ctx.attr("layout", 0)
    if layout not in (0, 1):
        raise ctx.unsupported(f"layout={layout}")
    hidden = ctx.attr("hidden_size") or r.type.shape[-1]
    if w.type.shape[:2] != (num_dirs, gates * hidden) or r.type.shape != (num_dirs, gates * hidden, hidden):
        raise ctx.error(f"W {w.type.shape} / R {r.type.shape} do not match hidden_size={hidden}, "
                        f"{num_dirs} direction(s), {gates} gate(s)")
    x = b.cast(x, dtype)
    if layout == 1:  # [B, T, I] -> [T, B, I]; states [B, D, H] -> [D, B, H]
        x = b.transpose(x, (1, 0, 2))
    batch = x.type.shape[1]

    def state(i: int) -> Value | None:
        v = up(ctx.optional_input(i))
        return v if v is None or layout == 0 else b.transpose(v, (1, 0, 2))

    is_lstm = ctx.op_type == "LSTM"
    stacked = Stacked(
        w_t=b.transpose(b.cast(w, dtype), (0, 2, 1)),
        r_t=b.transpose(b.cast(r, dtype), (0, 2, 1)),
        bias=up(ctx.optional_input(3)),
        h0=state(5),
        c0=state(6) if is_lstm else None,
        p=up(ctx.optional_input(7)) if is_lstm else None,
    )
    zeros = b.const(np.zeros((1, batch, hidden), dtype.numpy))
    acts = parse_activations(ctx, default_acts, num_dirs)
    dirs = [
        stacked.direction(b, d, direction == "reverse" or d == 1, acts[d], gates * hidden, zeros, is_lstm)
        for d in range(num_dirs)
    ]
    lens = ctx.optional_input(4)
    if lens is not None:
        lens = b.reshape(lens, (1, batch, 1))
    clip = ctx.attr("clip")
    return Recurrence(ctx, x, hidden, None if clip is None else float(clip), lens, dirs, out_dtype)


def add(b: Builder, x: Value, y: Value | None) -> Value:
    return x if y is None else b.map(F.ADD, x, y)


def recur(b: Builder, h: Value, r_t: Value) -> Value | None:
    """``H R^T``; None for a state known to be zero (the first step without initial_h)."""
    if h.is_constant and not np.any(h.data):
        return None
    return b.matmul(h, r_t)


def gate(b: Builder, x: Value, index: int, hidden: int) -> Value:
    """Gate ``index`` of a [..., G*H] pre-activation."""
    return b.slice(x, x.type.rank - 1, index * hidden, (index + 1) * hidden)


# A cell maps (this step's projected input [1, B, G*H], the states) to the new states;
# the hidden state comes first.
Cell = Callable[[Value, tuple[Value, ...]], tuple[Value, ...]]


def unroll(rec: Recurrence, d: Direction, xw: Value, cell: Cell) -> tuple[list[Value], tuple[Value, ...]]:
    """Run one direction over all steps: ``Y``'s rows [1, B, H] in time order, and the
    final states."""
    b = rec.b
    states = d.initial_states()
    rows: dict[int, Value] = {}
    zero = scalar(b, 0, states[0])
    order = range(rec.steps - 1, -1, -1) if d.reverse else range(rec.steps)
    for t in order:
        new = cell(b.slice(xw, 0, t, t + 1), states)
        m = rec.mask(t)
        if m is None:
            rows[t], states = new[0], new
        else:  # past a row's end: keep its state, write zeros
            rows[t] = b.map(F.WHERE, m, new[0], zero)
            states = tuple(b.map(F.WHERE, m, n, s) for n, s in zip(new, states))
    return [rows[t] for t in range(rec.steps)], states


def run(rec: Recurrence, make_cell: Callable[[Direction], tuple[Value | None, Cell]], count: int) -> list[Value | None]:
    """Unroll every direction and assemble the node's ``count`` outputs.

    ``make_cell`` gives a direction's input bias (added to ``X W^T`` once, for all
    steps) and its step function; it runs once per direction, so the weights it
    slices are sliced once, not once per step.
    """
    ys, finals = [], []
    for d in rec.directions:
        bias, cell = make_cell(d)
        y, final = unroll(rec, d, rec.project_inputs(d, bias), cell)
        ys.append(y)
        finals.append(final)
    return finish(rec, ys, finals, count)


def finish(rec: Recurrence, ys: list[list[Value]], finals: list[tuple[Value, ...]], count: int) -> list[Value | None]:
    """Assemble ``Y`` [T, D, B, H] and the final states [D, B, H] (in the node's layout)
    for the outputs the node asks for, cast back to the input dtype."""
    b, ctx = rec.b, rec.ctx
    layout = ctx.attr("layout", 0)
    wanted = [i < len(ctx.node.output) and bool(ctx.node.output[i]) for i in range(count)]
    outputs: list[Value | None] = [None] * count
    if wanted[0]:
        _, batch, hidden = ys[0][0].type.shape
        per_dir = [b.reshape(b.concat(y, 0), (rec.steps, 1, batch, hidden)) for y in ys]
        y = b.concat(per_dir, 1)
        outputs[0] = b.transpose(y, (2, 0, 1, 3)) if layout == 1 else y
    ended = None
    if rec.lens is not None:  # onnxruntime zeroes the final states of empty rows
        ended = b.map(F.EQ, rec.lens, b.const(np.array(0, rec.lens.type.dtype.numpy)))
        ended = None if ended.is_constant and not np.any(ended.data) else ended
    for i in range(1, count):
        if not wanted[i]:
            continue
        s = b.concat([f[i - 1] for f in finals], 0)
        if ended is not None:
            s = b.map(F.WHERE, ended, scalar(b, 0, s), s)
        outputs[i] = b.transpose(s, (1, 0, 2)) if layout == 1 else s
    return [None if v is None else b.cast(v, rec.out_dtype) for v in outputs]


def _sum_biases(b: Builder, wb: Value | None, rb: Value | None) -> Value | None:
    return None if wb is None or rb is None else b.map(F.ADD, wb, rb)


# -- the ops ---------------------------------------------------------------------------


def rnn_cell(rec: Recurrence, d: Direction) -> tuple[Value | None, Cell]:
    """``H = f(X W^T + H R^T + Wb + Rb)``."""
    b, (f,) = rec.b, d.acts

    def step(x_t: Value, states: tuple[Value, ...]) -> tuple[Value, ...]:
        return (f(b, rec.clipped(add(b, x_t, recur(b, states[0], d.r_t)))),)

    return _sum_biases(b, d.wb, d.rb), step


def gru_cell(rec: Recurrence, d: Direction, linear_before_reset: bool) -> tuple[Value | None, Cell]:
    """Gates z, r, h: ``H = (1 - z) h + z H_prev``. ``linear_before_reset`` applies
    ``R_h`` and its bias before the reset gate multiplies, so that bias stays out of
    the all-steps input bias."""
    b, n, (f, g) = rec.b, rec.hidden, d.acts
    rb, rb_h = d.rb, None
    if linear_before_reset and rb is not None:
        rb_h = gate(b, rb, 2, n)
        rb = b.concat([b.slice(rb, 1, 0, 2 * n), b.const(np.zeros((1, n), rb.type.dtype.numpy))], 1)
    r_zr, r_h = b.slice(d.r_t, 2, 0, 2 * n), b.slice(d.r_t, 2, 2 * n, 3 * n)

    def step(x_t: Value, states: tuple[Value, ...]) -> tuple[Value, ...]:
        (h,) = states
        hr = recur(b, h, d.r_t if linear_before_reset else r_zr)
        zr = add(b, b.slice(x_t, 2, 0, 2 * n), None if hr is None else b.slice(hr, 2, 0, 2 * n))
        z = f(b, rec.clipped(gate(b, zr, 0, n)))
        r = f(b, rec.clipped(gate(b, zr, 1, n)))
        if linear_before_reset:
            hh = rb_h if hr is None else add(b, gate(b, hr, 2, n), rb_h)
            pre = gate(b, x_t, 2, n) if hh is None else b.map(F.ADD, gate(b, x_t, 2, n), b.map(F.MUL, r, hh))
        else:
            pre = add(b, gate(b, x_t, 2, n), recur(b, b.map(F.MUL, r, h), r_h))
        candidate = g(b, rec.clipped(pre))
        # (1 - z) h~ + z H, in onnxruntime's order of operations
        return (b.map(F.ADD, b.map(F.MUL, b.map(F.SUB, scalar(b, 1, z), z), candidate), b.map(F.MUL, z, h)),)

    return _sum_biases(b, d.wb, rb), step


def lstm_cell(rec: Recurrence, d: Direction, input_forget: bool) -> tuple[Value | None, Cell]:
    """Gates i, o, f, c (W's order): ``C = f C_prev + i c``, ``H = o h(C)``. Peepholes add
    ``P (.) C`` to i and f (previous C) and to o (new C); ``input_forget`` sets
    ``f = 1 - i``."""
    b, n, (f, g, hact) = rec.b, rec.hidden, d.acts
    p_i, p_o, p_f = (None,) * 3 if d.p is None else (gate(b, d.p, k, n) for k in range(3))

    def peephole(x: Value, p: Value | None, c: Value) -> Value:
        return x if p is None else b.map(F.ADD, x, b.map(F.MUL, p, c))

    def step(x_t: Value, states: tuple[Value, ...]) -> tuple[Value, ...]:
        h, c = states
        pre = add(b, x_t, recur(b, h, d.r_t))
        i = f(b, rec.clipped(peephole(gate(b, pre, 0, n), p_i, c)))
        if input_forget:
            forget = b.map(F.SUB, scalar(b, 1, i), i)
        else:
            forget = f(b, rec.clipped(peephole(gate(b, pre, 2, n), p_f, c)))
        c_new = b.map(F.ADD, b.map(F.MUL, forget, c), b.map(F.MUL, i, g(b, rec.clipped(gate(b, pre, 3, n)))))
        o = f(b, rec.clipped(peephole(gate(b, pre, 1, n), p_o, c_new)))
        return b.map(F.MUL, o, hact(b, c_new)), c_new

    return _sum_biases(b, d.wb, d.rb), step


@converter("RNN", since=1)
def rnn(ctx: NodeContext) -> list[Value | None]:
    rec = prepare(ctx, 1, ["Tanh"])
    return run(rec, lambda d: rnn_cell(rec, d), 2)


@converter("GRU", since=1)
def gru(ctx: NodeContext) -> list[Value | None]:
    rec = prepare(ctx, 3, ["Sigmoid", "Tanh"])
    linear_before_reset = bool(ctx.attr("linear_before_reset", 0))
    return run(rec, lambda d: gru_cell(rec, d, linear_before_reset), 2)


@converter("LSTM", since=1)
def lstm(ctx: NodeContext) -> list[Value | None]:
    rec = prepare(ctx, 4, ["Sigmoid", "Tanh", "Tanh"])
    input_forget = bool(ctx.attr("input_forget", 0))
    return run(rec, lambda d: lstm_cell(rec, d, input_forget), 3)
