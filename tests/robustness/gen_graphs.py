"""Random small graphs, built with onnx.helper, for the differential test against
onnxruntime: elementwise chains, reductions, MatMul/Gemm with epilogues, Softmax and
LayerNormalization, movement (Transpose, Reshape, Slice, Concat, Gather, ...), small
convolutions and pooling, integer and boolean chains, and mixtures of these.

Each graph is a RESULT case: it is valid ONNX by construction, so tilefuse must compile it
for the CPU and match onnxruntime on fresh random inputs (standard normal, never zeros).
Shapes are read back from onnx's shape inference while building, so every stage can fit
the next one to what came before.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.robustness.cases import Expect, ModelCase, TensorSpec
from tests.robustness.gen_models import MODEL, rng_for

NP_TO_ONNX = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "float64": TensorProto.DOUBLE, "int32": TensorProto.INT32,
              "int64": TensorProto.INT64, "bool": TensorProto.BOOL}
ONNX_TO_NP = {v: k for k, v in NP_TO_ONNX.items()}
# Unary ops onnxruntime's CPU provider runs in float64 too; the others are float32 only there.
DOUBLE_UNARY = ("Relu", "Sigmoid", "Tanh", "Abs", "Neg", "Exp", "Sqrt", "Log", "Reciprocal", "Floor", "Ceil", "Round", "Sign")
FLOAT_UNARY = DOUBLE_UNARY + ("LeakyRelu", "Elu", "Erf", "Softplus", "Softsign", "Sin", "Cos", "HardSigmoid", "Selu", "HardSwish",
                              "ThresholdedRelu", "Atan")
MAX_ELEMENTS = 1500


class GraphBuilder:
    """A graph under construction; ``shape``/``dtype`` ask onnx's shape inference."""

    def __init__(self, rng: np.random.Generator, opset: int) -> None:
        self.rng = rng
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.specs: list[TensorSpec] = []
        self.inits: list[TensorProto] = []
        self.types: dict[str, tuple[str, tuple[int, ...]]] = {}
        self.count = 0

    def fresh(self, stem: str) -> str:
        self.count += 1
        return f"{stem}{self.count}"

    def input(self, shape: tuple[int, ...], dtype: str = "float32", low: int = -5, high: int = 5) -> str:
        name = self.fresh("in")
        self.inputs.append(helper.make_tensor_value_info(name, NP_TO_ONNX[dtype], list(shape)))
        self.specs.append(TensorSpec(name, dtype, tuple(shape), low, high))
        self.types[name] = (dtype, tuple(shape))
        return name

    def const(self, array: np.ndarray) -> str:
        name = self.fresh("c")
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        self.types[name] = (str(np.asarray(array).dtype), tuple(np.shape(array)))
        return name

    def weight(self, shape: tuple[int, ...], dtype: str, scale: float = 1.0) -> str:
        return self.const((self.rng.standard_normal(shape) * scale).astype(dtype))

    def ints(self, values: list[int]) -> str:
        return self.const(np.array(values, np.int64))

    def op(self, op_type: str, inputs: list[str], outputs: int = 1, **attrs: object) -> str | list[str]:
        names = [self.fresh(op_type.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, names, name=self.fresh(f"n_{op_type}_"), **attrs))
        self._infer(names)
        return names[0] if outputs == 1 else names

    def _infer(self, names: list[str]) -> None:
        model = self._model([(n, None) for n in names], check=False)
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
        known = {vi.name: vi for vi in list(inferred.graph.value_info) + list(inferred.graph.output)}
        for n in names:
            t = known[n].type.tensor_type
            dims = tuple(d.dim_value for d in t.shape.dim)
            if not all(d.HasField("dim_value") for d in t.shape.dim):
                raise ValueError(f"shape of {n} not inferred")
            self.types[n] = (ONNX_TO_NP[t.elem_type], dims)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.types[name][1]

    def dtype(self, name: str) -> str:
        return self.types[name][0]

    def _model(self, outputs: list[tuple[str, object]], check: bool = True) -> onnx.ModelProto:
        outs = []
        for name, _ in outputs:
            if name in self.types:
                dt, shape = self.types[name]
                outs.append(helper.make_tensor_value_info(name, NP_TO_ONNX[dt], list(shape)))
            else:
                outs.append(helper.make_empty_tensor_value_info(name))
        graph = helper.make_graph(self.nodes, "random", self.inputs, outs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)], ir_version=8)
        if check:
            onnx.checker.check_model(model, full_check=True)
        return model

    def model(self, outputs: list[str]) -> bytes:
        return self._model([(n, None) for n in dict.fromkeys(outputs)]).SerializeToString()


# -- stages: a tensor in, a tensor out -------------------------------------------------------
def _random_shape(rng: np.random.Generator, rank: int | None = None, low: int = 1, high: int = 7) -> tuple[int, ...]:
    rank = int(rng.integers(1, 5)) if rank is None else rank
    while True:
        shape = tuple(int(d) for d in rng.integers(low, high, rank))
        if int(np.prod(shape)) <= MAX_ELEMENTS:
            return shape


def _broadcast_partner(rng: np.random.Generator, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts against ``shape``: leading axes dropped, some set to 1."""
    keep = int(rng.integers(0, len(shape) + 1))
    partner = [d if rng.random() < 0.6 else 1 for d in shape[len(shape) - keep:]]
    return tuple(partner)


def unary(g: GraphBuilder, x: str) -> str:
    rng, dt = g.rng, g.dtype(x)
    op = str(rng.choice(DOUBLE_UNARY if dt == "float64" else FLOAT_UNARY))
    if op == "Exp":  # bounded: exp of exp overflows where two libms may disagree on the edge
        return g.op("Exp", [g.op("Tanh", [x])])
    if op == "Reciprocal":
        return g.op("Reciprocal", [g.op("Add", [g.op("Abs", [x]), g.const(np.array(0.5, dt))])])
    if op in ("Floor", "Ceil", "Round"):  # only on inputs scaled away from the rounding edges
        return g.op(op, [g.op("Mul", [x, g.const(np.array(3.0, dt))])])
    attrs: dict[str, object] = {}
    if op in ("LeakyRelu", "Elu"):
        attrs["alpha"] = float(np.round(rng.uniform(0.01, 1.5), 3))
    if op == "HardSigmoid":
        attrs.update(alpha=float(np.round(rng.uniform(0.1, 0.5), 3)), beta=float(np.round(rng.uniform(0.2, 0.8), 3)))
    if op == "ThresholdedRelu":
        attrs["alpha"] = float(np.round(rng.uniform(0.1, 1.0), 3))
    return g.op(op, [x], **attrs)


def binary(g: GraphBuilder, x: str) -> str:
    rng, dt, shape = g.rng, g.dtype(x), g.shape(x)
    op = str(rng.choice(["Add", "Sub", "Mul", "Div", "Max", "Min", "Pow", "PRelu", "Where", "Clip"]))
    other_shape = _broadcast_partner(rng, shape)
    other = g.input(other_shape, dt) if rng.random() < 0.5 else g.weight(other_shape, dt)
    if op == "Div":
        other = g.op("Add", [g.op("Abs", [other]), g.const(np.array(0.5, dt))])
    if op == "Pow":
        return g.op("Pow", [g.op("Abs", [x]), g.const(np.array(rng.choice([0.5, 2.0, 3.0, 1.5]), dt))])
    if op == "PRelu":
        if dt == "float64":
            op = "Max"
        else:
            return g.op("PRelu", [x, g.weight(other_shape, dt, 0.3)])
    if op == "Where":
        cond = g.op("Greater", [x, other])
        return g.op("Where", [cond, x, g.op("Neg", [other])])
    if op == "Clip":
        lo, hi = sorted(float(v) for v in rng.uniform(-1.5, 1.5, 2))
        return g.op("Clip", [x, g.const(np.array(lo, dt)), g.const(np.array(hi, dt))])
    a, b = (x, other) if rng.random() < 0.7 else (other, x)
    return g.op(op, [a, b])


def reduce(g: GraphBuilder, x: str) -> str:
    rng, shape = g.rng, g.shape(x)
    op = str(rng.choice(["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceL1", "ReduceL2", "ReduceSumSquare",
                         "ReduceLogSumExp", "ReduceProd", "ArgMax", "ArgMin"]))
    keepdims = int(rng.integers(0, 2))
    if op in ("ArgMax", "ArgMin"):
        return g.op(op, [x], axis=int(rng.integers(-len(shape), len(shape))), keepdims=keepdims,
                    select_last_index=int(rng.integers(0, 2)))
    axes = sorted(int(a) for a in rng.choice(len(shape), size=int(rng.integers(1, len(shape) + 1)), replace=False))
    axes = [a - len(shape) if rng.random() < 0.3 else a for a in axes]
    if op == "ReduceProd":  # keep products of normals in range
        x = g.op("Add", [g.op("Tanh", [x]), g.const(np.array(1.0, g.dtype(x)))])
    if rng.random() < 0.15:  # no axes: all of them
        return g.op(op, [x], keepdims=keepdims)
    if g.opset >= 18 or op == "ReduceSum":
        return g.op(op, [x, g.ints(axes)], keepdims=keepdims)
    return g.op(op, [x], axes=axes, keepdims=keepdims)


def softmax(g: GraphBuilder, x: str) -> str:
    rank = len(g.shape(x))
    return g.op(str(g.rng.choice(["Softmax", "LogSoftmax"])), [x], axis=int(g.rng.integers(-rank, rank)))


def layernorm(g: GraphBuilder, x: str) -> str:
    rng, shape, dt = g.rng, g.shape(x), g.dtype(x)
    axis = int(rng.integers(-len(shape), len(shape)))
    norm_shape = shape[axis:] if axis >= 0 else shape[len(shape) + axis:]
    inputs = [x, g.const((1 + 0.2 * rng.standard_normal(norm_shape)).astype(dt))]
    if rng.random() < 0.7:
        inputs.append(g.weight(norm_shape, dt, 0.2))
    return g.op("LayerNormalization", inputs, axis=axis, epsilon=float(rng.choice([1e-5, 1e-3, 1e-6])))


def matmul(g: GraphBuilder, x: str) -> str:
    rng, shape, dt = g.rng, g.shape(x), g.dtype(x)
    if len(shape) == 1:
        x = g.op("Unsqueeze", [x, g.ints([0])])
        shape = g.shape(x)
    k, n = shape[-1], int(rng.integers(1, 40))
    if rng.random() < 0.3 and len(shape) >= 3:
        w = g.input(shape[:-2] + (k, n), dt)  # a batched product of two inputs
    else:
        w = g.weight((k, n), dt, 1 / np.sqrt(k))
    y = g.op("MatMul", [x, w])
    return _epilogue(g, y)


def _epilogue(g: GraphBuilder, y: str) -> str:
    rng, dt, n = g.rng, g.dtype(y), g.shape(y)[-1]
    if rng.random() < 0.7:
        y = g.op("Add", [y, g.weight((n,), dt, 0.1)])
    act = str(rng.choice(["none", "Relu", "Tanh"] if dt == "float64" else ["none", "Relu", "Sigmoid", "Tanh", "gelu-erf", "Gelu"]))
    if act == "gelu-erf":
        half = g.op("Mul", [y, g.const(np.array(0.5, dt))])
        erf = g.op("Erf", [g.op("Div", [y, g.const(np.array(np.sqrt(2.0), dt))])])
        y = g.op("Mul", [half, g.op("Add", [erf, g.const(np.array(1.0, dt))])])
    elif act == "Gelu" and g.opset >= 20:
        y = g.op("Gelu", [y], approximate=str(rng.choice(["none", "tanh"])))
    elif act not in ("none", "Gelu"):
        y = g.op(act, [y])
    if rng.random() < 0.3:
        y = g.op("Add", [y, g.input(g.shape(y), dt)])  # a residual from another input
    return y


def gemm(g: GraphBuilder, x: str) -> str:
    rng, dt = g.rng, g.dtype(x)
    if len(g.shape(x)) != 2:
        x = g.op("Flatten", [x], axis=int(rng.integers(0, len(g.shape(x)) + 1)))
    m, k = g.shape(x)
    n = int(rng.integers(1, 33))
    trans_a, trans_b = int(rng.integers(0, 2)), int(rng.integers(0, 2))
    if trans_a:
        x = g.op("Transpose", [x], perm=[1, 0])
    b = g.weight((n, k) if trans_b else (k, n), dt, 1 / np.sqrt(k))
    inputs = [x, b]
    c_shape = [(n,), (m, n), (1, n), (m, 1), ()][int(rng.integers(0, 6)) % 5] if rng.random() < 0.8 else None
    if c_shape is not None:
        inputs.append(g.weight(c_shape, dt))
    attrs = {"transA": trans_a, "transB": trans_b, "alpha": float(rng.choice([1.0, 0.5, 2.0])),
             "beta": float(rng.choice([1.0, 0.25, -1.0]))}
    y = g.op("Gemm", inputs, **attrs)
    if rng.random() < 0.5:
        y = g.op(str(rng.choice(["Relu", "Tanh", "Sigmoid"])), [y])
    return y


def transpose(g: GraphBuilder, x: str) -> str:
    perm = [int(p) for p in g.rng.permutation(len(g.shape(x)))]
    return g.op("Transpose", [x], perm=perm)


def reshape(g: GraphBuilder, x: str) -> str:
    rng, total = g.rng, int(np.prod(g.shape(x)))
    dims: list[int] = []
    left = total
    for _ in range(int(rng.integers(1, 4))):
        divisors = [d for d in range(1, left + 1) if left % d == 0]
        d = int(rng.choice(divisors))
        dims.append(d)
        left //= d
    dims.append(left)
    if rng.random() < 0.4:
        dims[int(rng.integers(0, len(dims)))] = -1
    return g.op("Reshape", [x, g.ints(dims)])


def slice_(g: GraphBuilder, x: str) -> str:
    rng, shape = g.rng, g.shape(x)
    axes = sorted(int(a) for a in rng.choice(len(shape), size=int(rng.integers(1, len(shape) + 1)), replace=False))
    starts, ends, steps = [], [], []
    for a in axes:
        d = shape[a]
        step = int(rng.choice([1, 1, 2, -1, 3, -2]))
        if step > 0:
            s = int(rng.integers(-d, d)) if rng.random() < 0.3 else int(rng.integers(0, d))
            e = int(rng.choice([d, d + 5, 2**62, -1 if d > 1 else d])) if rng.random() < 0.5 else int(rng.integers(1, d + 1))
        else:
            s = int(rng.choice([d - 1, -1, d + 3]))
            e = int(rng.choice([-d - 1, -(2**62), 0])) if rng.random() < 0.5 else -d - 1
        starts.append(s)
        ends.append(e)
        steps.append(step)
    y = g.op("Slice", [x, g.ints(starts), g.ints(ends), g.ints(axes), g.ints(steps)])
    if 0 in g.shape(y):
        raise Retry("empty slice")
    return y


def concat(g: GraphBuilder, x: str) -> str:
    rng, shape, dt = g.rng, g.shape(x), g.dtype(x)
    axis = int(rng.integers(-len(shape), len(shape)))
    parts = [x]
    for _ in range(int(rng.integers(1, 3))):
        other = list(shape)
        other[axis] = int(rng.integers(1, 5))
        parts.append(g.input(tuple(other), dt) if rng.random() < 0.5 else g.weight(tuple(other), dt))
    rng.shuffle(parts)
    return g.op("Concat", parts, axis=axis)


def gather(g: GraphBuilder, x: str) -> str:
    rng, shape = g.rng, g.shape(x)
    axis = int(rng.integers(-len(shape), len(shape)))
    d = shape[axis]
    idx_shape = _random_shape(rng, int(rng.integers(0, 3)), 1, 4)
    if rng.random() < 0.5:
        idx = g.input(idx_shape, "int64", -d, d)
    else:
        idx = g.const(rng.integers(-d, d, idx_shape).astype(np.int64))
    op = "Gather" if rng.random() < 0.8 else "GatherElements"
    if op == "GatherElements":
        eshape = tuple(int(rng.integers(1, s + 1)) for s in shape)
        eshape = eshape[:axis] + (int(rng.integers(1, 5)),) + eshape[axis + 1:] if axis >= 0 else eshape
        idx = g.const(rng.integers(-d, d, eshape).astype(np.int64))
        return g.op("GatherElements", [x, idx], axis=axis)
    return g.op("Gather", [x, idx], axis=axis)


def squeeze_unsqueeze(g: GraphBuilder, x: str) -> str:
    rank = len(g.shape(x))
    y = g.op("Unsqueeze", [x, g.ints([int(g.rng.integers(-rank - 1, rank + 1))])])
    if g.rng.random() < 0.5:
        ones = [i for i, d in enumerate(g.shape(y)) if d == 1]
        y = g.op("Squeeze", [y, g.ints([ones[int(g.rng.integers(0, len(ones)))]])])
    return y


def expand_tile(g: GraphBuilder, x: str) -> str:
    rng, shape = g.rng, g.shape(x)
    if rng.random() < 0.5:
        target = [int(rng.integers(2, 4)) if d == 1 else d for d in shape]
        if int(np.prod(target)) > MAX_ELEMENTS:
            raise Retry("too big")
        return g.op("Expand", [x, g.ints(([2] if rng.random() < 0.3 else []) + target)])
    reps = [int(rng.integers(1, 3)) for _ in shape]
    if int(np.prod(shape)) * int(np.prod(reps)) > MAX_ELEMENTS:
        raise Retry("too big")
    return g.op("Tile", [x, g.ints(reps)])


def pad(g: GraphBuilder, x: str) -> str:
    rng, shape, dt = g.rng, g.shape(x), g.dtype(x)
    mode = str(rng.choice(["constant", "reflect", "edge"]))
    pads = []
    for d in shape * 2:
        limit = d - 1 if mode == "reflect" else 2
        pads.append(int(rng.integers(0, max(limit, 0) + 1)) if limit > 0 else 0)
    inputs = [x, g.ints(pads)]
    if mode == "constant":
        inputs.append(g.const(np.array(rng.standard_normal(), dt)))
    return g.op("Pad", inputs, mode=mode)


def conv(g: GraphBuilder, x: str) -> str:
    """A small 2-D (or 1-D) convolution of ``x`` ([N, C, H(, W)]), an epilogue after it."""
    rng, shape, dt = g.rng, g.shape(x), g.dtype(x)
    c, spatial = shape[1], shape[2:]
    group = c if (c > 1 and rng.random() < 0.3) else 1
    cout = group * int(rng.integers(1, 3)) if group > 1 else int(rng.integers(1, 6))
    kernel = [int(rng.integers(1, min(4, s + 1))) for s in spatial]
    strides = [int(rng.integers(1, 3)) for _ in spatial]
    dilations = [int(rng.integers(1, 3)) if s >= 2 * k else 1 for s, k in zip(spatial, kernel)]
    attrs: dict[str, object] = {"kernel_shape": kernel, "strides": strides, "dilations": dilations, "group": group}
    if rng.random() < 0.2:  # onnxruntime has no dilated convolution with auto_pad
        attrs["auto_pad"] = str(rng.choice(["SAME_UPPER", "SAME_LOWER", "VALID"]))
        attrs["dilations"] = [1] * len(spatial)
    else:
        attrs["pads"] = [int(rng.integers(0, k)) for k in kernel * 2]
    inputs = [x, g.weight((cout, c // group, *kernel), dt, 1 / np.sqrt(c // group * int(np.prod(kernel))))]
    if rng.random() < 0.7:
        inputs.append(g.weight((cout,), dt, 0.1))
    y = g.op("Conv", inputs, **attrs)
    if any(d < 1 for d in g.shape(y)):
        raise Retry("empty convolution output")
    if rng.random() < 0.6:
        y = g.op(str(rng.choice(["Relu", "Sigmoid", "Tanh"])), [y])
    if rng.random() < 0.3:
        y = pool(g, y)
    return y


def pool(g: GraphBuilder, x: str) -> str:
    rng, spatial = g.rng, g.shape(x)[2:]
    op = str(rng.choice(["MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"]))
    if op.startswith("Global"):
        return g.op(op, [x])
    kernel = [int(rng.integers(1, min(3, s) + 1)) for s in spatial]
    attrs: dict[str, object] = {"kernel_shape": kernel, "strides": [int(rng.integers(1, 3)) for _ in spatial]}
    pads = [int(rng.integers(0, k)) for k in kernel * 2]
    attrs["pads"] = pads
    if op == "AveragePool":
        attrs["count_include_pad"] = int(rng.integers(0, 2))
    y = g.op(op, [x], **attrs)
    if any(d < 1 for d in g.shape(y)):
        raise Retry("empty pooling output")
    return y


class Retry(Exception):
    """This random choice does not fit; draw another graph."""


Stage = Callable[[GraphBuilder, str], str]
MOVEMENT: tuple[Stage, ...] = (transpose, reshape, slice_, concat, gather, squeeze_unsqueeze, expand_tile, pad)
ANY: tuple[Stage, ...] = (unary, binary, reduce, softmax, layernorm, matmul, transpose, reshape, slice_, concat, gather)


def _pick(g: GraphBuilder, stages: tuple[Stage, ...]) -> Stage:
    stage = stages[int(g.rng.integers(0, len(stages)))]

    def apply(g: GraphBuilder, x: str) -> str:
        if not g.shape(x):  # a full reduction left a scalar: give the next stage an axis
            x = g.op("Unsqueeze", [x, g.ints([0])])
        return stage(g, x)

    return apply


# -- families: a whole graph ----------------------------------------------------------------
def fam_elementwise(g: GraphBuilder) -> list[str]:
    x = g.input(_random_shape(g.rng), _float(g))
    outs = []
    for _ in range(int(g.rng.integers(2, 7))):
        x = (unary if g.rng.random() < 0.55 else binary)(g, x)
        if g.rng.random() < 0.15:
            outs.append(x)
    return outs + [x]


def fam_reduce(g: GraphBuilder) -> list[str]:
    x = g.input(_random_shape(g.rng, int(g.rng.integers(1, 5))), _float(g))
    if g.rng.random() < 0.5:
        x = unary(g, x)
    y = reduce(g, x)
    if g.rng.random() < 0.5 and g.dtype(y).startswith("float"):
        y = unary(g, y)
    return [y]


def fam_matmul(g: GraphBuilder) -> list[str]:
    rank = int(g.rng.integers(2, 4))
    shape = _random_shape(g.rng, rank, 1, 9) if rank == 3 else (int(g.rng.integers(1, 33)), int(g.rng.integers(1, 49)))
    return [matmul(g, g.input(shape, _float(g)))]


def fam_gemm(g: GraphBuilder) -> list[str]:
    return [gemm(g, g.input((int(g.rng.integers(1, 25)), int(g.rng.integers(1, 41))), _float(g)))]


def fam_norm(g: GraphBuilder) -> list[str]:
    shape = _random_shape(g.rng, int(g.rng.integers(2, 5)))
    dt = _float(g, double=False)
    x = g.input(shape, dt)
    if g.rng.random() < 0.5:
        x = g.op("Add", [x, g.input(shape, dt)])
    y = (softmax if g.rng.random() < 0.4 else layernorm)(g, x)
    if g.rng.random() < 0.4:
        y = matmul(g, y)
    return [y]


def fam_movement(g: GraphBuilder) -> list[str]:
    x = g.input(_random_shape(g.rng, int(g.rng.integers(1, 5))), _float(g))
    for _ in range(int(g.rng.integers(1, 4))):
        x = _pick(g, MOVEMENT)(g, x)
    if g.rng.random() < 0.6:
        x = unary(g, x)
    return [x]


def fam_conv(g: GraphBuilder) -> list[str]:
    rank = 2 if g.rng.random() < 0.8 else 1
    shape = (int(g.rng.integers(1, 3)), int(g.rng.integers(1, 5))) + tuple(int(d) for d in g.rng.integers(3, 10, rank))
    return [conv(g, g.input(shape, _float(g, double=False)))]


def fam_mixed(g: GraphBuilder) -> list[str]:
    x = g.input(_random_shape(g.rng, int(g.rng.integers(2, 4)), 2, 7), "float32")
    outs = []
    for _ in range(int(g.rng.integers(3, 6))):
        x = _pick(g, ANY)(g, x)
        if not g.dtype(x).startswith("float"):
            outs.append(x)
            x = g.input(_random_shape(g.rng, int(g.rng.integers(2, 4)), 2, 7), "float32")
        if int(np.prod(g.shape(x))) > MAX_ELEMENTS:
            raise Retry("too big")
    return outs + [x]


def fam_int(g: GraphBuilder) -> list[str]:
    dt = str(g.rng.choice(["int32", "int64"]))
    shape = _random_shape(g.rng)
    x = g.input(shape, dt, -6, 7)
    for _ in range(int(g.rng.integers(2, 6))):
        op = str(g.rng.choice(["Add", "Sub", "Mul", "Max", "Min", "Abs", "Neg", "cast-round-trip"]))
        if op in ("Abs", "Neg"):
            x = g.op(op, [x])
        elif op == "cast-round-trip":
            f = g.op("Cast", [x], to=TensorProto.FLOAT)
            x = g.op("Cast", [g.op("Mul", [f, g.const(np.array(1.5, np.float32))])], to=NP_TO_ONNX[dt])
        else:
            other = g.input(_broadcast_partner(g.rng, g.shape(x)), dt, -4, 5)
            x = g.op(op, [x, other])
    return [x]


def fam_bool(g: GraphBuilder) -> list[str]:
    shape = _random_shape(g.rng)
    a, b = g.input(shape, "float32"), g.input(_broadcast_partner(g.rng, shape), "float32")
    p = g.op(str(g.rng.choice(["Greater", "Less", "GreaterOrEqual", "LessOrEqual"])), [a, b])
    q = g.op("Less", [a, g.const(np.array(0.3, np.float32))])
    r = g.op(str(g.rng.choice(["And", "Or", "Xor"])), [p, q])
    if g.rng.random() < 0.5:
        r = g.op("Not", [r])
    return [r, g.op("Where", [r, a, g.op("Neg", [b])])]


FAMILIES: dict[str, tuple[Callable[[GraphBuilder], list[str]], float]] = {
    "elementwise": (fam_elementwise, 3), "reduce": (fam_reduce, 2), "matmul": (fam_matmul, 2), "gemm": (fam_gemm, 1),
    "norm": (fam_norm, 2), "movement": (fam_movement, 3), "conv": (fam_conv, 3), "mixed": (fam_mixed, 3),
    "int": (fam_int, 1), "bool": (fam_bool, 1),
}


def _float(g: GraphBuilder, double: bool = True) -> str:
    """Mostly float32; float16 (onnxruntime's CPU runs it through float32) and, where every
    op of the family has a float64 kernel in onnxruntime, float64."""
    r = g.rng.random()
    return "float16" if r < 0.15 else "float64" if double and r < 0.27 else "float32"


def random_graphs(seed: int, count: int) -> list[ModelCase]:
    names = list(FAMILIES)
    weights = np.array([FAMILIES[n][1] for n in names], float)
    out = []
    for i in range(count):
        family = names[int(rng_for(seed, "graph.family", i).choice(len(names), p=weights / weights.sum()))]
        for attempt in range(50):
            rng = rng_for(seed, f"graph.{family}", i * 100 + attempt)
            g = GraphBuilder(rng, int(rng.choice([17, 18, 20])))
            try:
                outputs = FAMILIES[family][0](g)
                data = g.model(outputs)
            except (Retry, onnx.shape_inference.InferenceError, onnx.checker.ValidationError):
                continue
            ops = sorted({n.op_type for n in g.nodes})
            out.append(ModelCase(f"graph/{family}/{i}", "graph", Expect.RESULT,
                                 f"random {family} graph #{i} (opset {g.opset}): {' '.join(ops)}",
                                 files=((MODEL, data),), inputs=tuple(g.specs), feed_seed=i))
            break
        else:
            raise RuntimeError(f"no {family} graph fits after 50 tries (seed {seed}, #{i})")
    return out
