"""Malformed models: truncations, byte flips, hand-made structural faults, hostile
arguments to ``tilefuse.compile``.

Truncations and flips are judged by onnxruntime and the onnx checker (SPEC): a flip may
well leave a valid model (a changed weight), which must then give onnxruntime's answer.
Hand-made faults say what must happen case by case.
"""
from __future__ import annotations

import zlib
from typing import Any, Callable, Iterator

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.robustness.bases import BUILDERS, INPUTS, OPSET, lm_model, topk_model
from tests.robustness.cases import Expect, ModelCase, TensorSpec

MODEL = "model/model.onnx"


def rng_for(seed: int, family: str, i: int) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(family.encode()), i])


def model_case(cid: str, family: str, expect: Expect, note: str, proto: onnx.ModelProto | bytes,
               inputs: tuple[TensorSpec, ...] = INPUTS["lm"], **kw: Any) -> ModelCase:
    data = proto if isinstance(proto, bytes) else proto.SerializeToString()
    return ModelCase(cid, family, expect, note, files=((MODEL, data),), inputs=inputs, **kw)


# -- truncations and flips -------------------------------------------------------------
def truncations(seed: int, count: int) -> list[ModelCase]:
    """Cuts at many offsets: the first bytes densely, the rest at random."""
    out = []
    for i in range(count):
        base = ("lm", "topk")[i % 2]
        data = BUILDERS[base]().SerializeToString()
        j = i // 2
        offset = j if j < 24 else int(rng_for(seed, "truncate", i).integers(0, len(data)))
        offset = min(offset, len(data) - 1)
        out.append(model_case(f"model.truncate/{base}@{offset}", "model.truncate", Expect.SPEC,
                              f"{base} model cut to its first {offset} of {len(data)} bytes", data[:offset],
                              inputs=INPUTS[base]))
    return _unique(out)


def flips(seed: int, count: int) -> list[ModelCase]:
    """One to three bytes xor-ed with a random mask (half of them a single bit)."""
    out = []
    for i in range(count):
        rng = rng_for(seed, "flip", i)
        base = ("lm", "topk")[i % 2]
        data = bytearray(BUILDERS[base]().SerializeToString())
        edits = []
        for _ in range(int(rng.integers(1, 4))):
            pos = int(rng.integers(0, len(data)))
            mask = 1 << int(rng.integers(0, 8)) if rng.random() < 0.5 else int(rng.integers(1, 256))
            data[pos] ^= mask
            edits.append(f"{pos}^{mask:#04x}")
        out.append(model_case(f"model.flip/{base}@{','.join(edits)}", "model.flip", Expect.SPEC,
                              f"{base} model with byte(s) {', '.join(edits)} xor-ed", bytes(data), inputs=INPUTS[base]))
    return _unique(out)


def _unique(cases: list[ModelCase]) -> list[ModelCase]:
    seen: dict[str, ModelCase] = {}
    for c in cases:
        seen.setdefault(c.id, c)
    return list(seen.values())


# -- hand-made structural faults ---------------------------------------------------------
Edit = Callable[[onnx.ModelProto], None]


def _node(m: onnx.ModelProto, name: str) -> onnx.NodeProto:
    return next(n for n in m.graph.node if n.name == name)


def _set_attr(node: onnx.NodeProto, name: str, value: Any) -> None:
    for i, a in enumerate(node.attribute):
        if a.name == name:
            del node.attribute[i]
            break
    node.attribute.append(helper.make_attribute(name, value))


def _init(m: onnx.ModelProto, name: str) -> TensorProto:
    return next(t for t in m.graph.initializer if t.name == name)


def _input(m: onnx.ModelProto, name: str) -> onnx.ValueInfoProto:
    return next(v for v in m.graph.input if v.name == name)


def _dims(vi: onnx.ValueInfoProto, dims: list[int | str]) -> None:
    shape = vi.type.tensor_type.shape
    del shape.dim[:]
    for d in dims:
        if isinstance(d, str):
            shape.dim.add().dim_param = d
        else:
            shape.dim.add().dim_value = d


def _cycle(m: onnx.ModelProto) -> None:
    _node(m, "add").input[1] = "probs"


def _dup_init(m: onnx.ModelProto) -> None:
    m.graph.initializer.append(numpy_helper.from_array(np.ones((16, 16), np.float32), "w"))


def _init_shadows_input(m: onnx.ModelProto) -> None:
    """An initializer named like a graph input is that input's default (IR >= 4): a feed
    overrides it."""
    m.graph.initializer.append(numpy_helper.from_array(np.ones((2, 8, 16), np.float32), "x"))


def _wrong_length(delta: int) -> Edit:
    def edit(m: onnx.ModelProto) -> None:
        t = _init(m, "w")
        t.raw_data = t.raw_data[:delta] if delta < 0 else t.raw_data + b"\0" * delta
    return edit


def _raw_and_float(m: onnx.ModelProto) -> None:
    _init(m, "w").float_data.extend([1.0] * 256)


def _float_data_count(m: onnx.ModelProto) -> None:
    t = _init(m, "w")
    t.ClearField("raw_data")
    t.float_data.extend([0.5, 1.5, 2.5])


def _external_without_location(m: onnx.ModelProto) -> None:
    t = _init(m, "w")
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL


def _elem_type(where: str, value: int) -> Edit:
    def edit(m: onnx.ModelProto) -> None:
        if where == "input":
            _input(m, "x").type.tensor_type.elem_type = value
        elif where == "output":
            m.graph.output[0].type.tensor_type.elem_type = value
        else:
            _init(m, "w").data_type = value
    return edit


def _opset(version: int | None, extra: int | None = None) -> Edit:
    def edit(m: onnx.ModelProto) -> None:
        del m.opset_import[:]
        if version is not None:
            m.opset_import.append(helper.make_opsetid("", version))
        if extra is not None:
            m.opset_import.append(helper.make_opsetid("", extra))
    return edit


def _remove_init(name: str) -> Edit:
    def edit(m: onnx.ModelProto) -> None:
        t = _init(m, name)
        m.graph.initializer.remove(t)
    return edit


def _huge_init(m: onnx.ModelProto) -> None:
    t = _init(m, "bias")
    del t.dims[:]
    t.dims.extend([2**40])


def _value_info(name: str, elem: int, dims: list[int]) -> Edit:
    def edit(m: onnx.ModelProto) -> None:
        m.graph.value_info.append(helper.make_tensor_value_info(name, elem, dims))
    return edit


def _replace_node(name: str, new: onnx.NodeProto) -> Edit:
    def edit(m: onnx.ModelProto) -> None:
        old = _node(m, name)
        i = list(m.graph.node).index(old)
        new.name = name
        m.graph.node.remove(old)
        m.graph.node.insert(i, new)
    return edit


def _add_init(name: str, array: np.ndarray) -> Edit:
    def edit(m: onnx.ModelProto) -> None:
        m.graph.initializer.append(numpy_helper.from_array(array, name))
    return edit


def _chain(*edits: Edit) -> Edit:
    def edit(m: onnx.ModelProto) -> None:
        for e in edits:
            e(m)
    return edit


def _rename_input(new: str) -> Edit:
    def edit(m: onnx.ModelProto) -> None:
        _input(m, "x").name = new
        for n in m.graph.node:
            for i, name in enumerate(n.input):
                if name == "x":
                    n.input[i] = new
    return edit


def _sparse_constant(indices: list[int]) -> Edit:
    def edit(m: onnx.ModelProto) -> None:
        values = numpy_helper.from_array(np.array([1.5, -2.0, 0.25], np.float32), "bias")
        sparse = helper.make_sparse_tensor(values, numpy_helper.from_array(np.array(indices, np.int64), ""), [16])
        m.graph.initializer.remove(_init(m, "bias"))
        m.graph.node.insert(0, helper.make_node("Constant", [], ["bias"], name="bias_const", sparse_value=sparse))
    return edit


def _deep_chain(length: int) -> Edit:
    def edit(m: onnx.ModelProto) -> None:
        node = _node(m, "tanh")
        node.output[0] = "t0"
        i = list(m.graph.node).index(node)
        for k in range(length):
            m.graph.node.insert(i + 1 + k, helper.make_node("Neg", [f"t{k}"], [f"t{k + 1}" if k + 1 < length else "t"], name=f"neg{k}"))
    return edit


def _if_branches(m: onnx.ModelProto) -> None:
    """An If whose branches give different numbers of outputs."""
    out = helper.make_tensor_value_info("o", TensorProto.FLOAT, [2, 8, 16])
    then = helper.make_graph([helper.make_node("Identity", ["t"], ["o"])], "then", [], [out])
    other = helper.make_graph([helper.make_node("Identity", ["t"], ["o"]), helper.make_node("Identity", ["t"], ["o2"])],
                              "else", [], [out, helper.make_tensor_value_info("o2", TensorProto.FLOAT, [2, 8, 16])])
    m.graph.initializer.append(numpy_helper.from_array(np.array(True), "cond"))
    sm = _node(m, "softmax")
    sm.input[0] = "t_if"
    m.graph.node.insert(list(m.graph.node).index(sm),
                        helper.make_node("If", ["cond"], ["t_if"], name="if", then_branch=then, else_branch=other))


def _if_outer_missing(m: onnx.ModelProto) -> None:
    """An If whose branch reads an outer name that does not exist."""
    out = helper.make_tensor_value_info("o", TensorProto.FLOAT, [2, 8, 16])
    then = helper.make_graph([helper.make_node("Identity", ["nowhere"], ["o"])], "then", [], [out])
    other = helper.make_graph([helper.make_node("Identity", ["t"], ["o"])], "else", [], [out])
    m.graph.initializer.append(numpy_helper.from_array(np.array(True), "cond"))
    sm = _node(m, "softmax")
    sm.input[0] = "t_if"
    m.graph.node.insert(list(m.graph.node).index(sm),
                        helper.make_node("If", ["cond"], ["t_if"], name="if", then_branch=then, else_branch=other))


def _local_function(m: onnx.ModelProto) -> None:
    """A model-local function (valid ONNX; onnxruntime inlines it)."""
    fn = helper.make_function("local", "Twice", ["a"], ["b"], [helper.make_node("Add", ["a", "a"], ["b"])],
                              [helper.make_opsetid("", OPSET)])
    m.functions.append(fn)
    m.opset_import.append(helper.make_opsetid("local", 1))
    _replace_node("tanh", helper.make_node("Twice", ["a"], ["t"], domain="local"))(m)


def _no_graph_io(m: onnx.ModelProto) -> None:
    del m.graph.node[:]
    del m.graph.input[:]
    del m.graph.output[:]
    del m.graph.initializer[:]


def _identity_graph(m: onnx.ModelProto) -> None:
    """No nodes: the graph output is the graph input (valid ONNX)."""
    del m.graph.node[:]
    del m.graph.initializer[:]
    del m.graph.output[:]
    m.graph.output.append(helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, 16]))
    m.graph.input.remove(_input(m, "ids"))


def _constant_only(m: onnx.ModelProto) -> None:
    del m.graph.node[:]
    del m.graph.input[:]
    del m.graph.initializer[:]
    del m.graph.output[:]
    value = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5, "c")
    m.graph.node.append(helper.make_node("Constant", [], ["c"], name="c", value=value))
    m.graph.node.append(helper.make_node("Relu", ["c"], ["y"], name="relu"))
    m.graph.output.append(helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3]))


def _dynamic(m: onnx.ModelProto) -> None:
    _dims(_input(m, "ids"), ["batch", 8])
    _dims(_input(m, "x"), ["batch", 8, 16])
    _dims(m.graph.output[0], ["batch", 8, 16])
    _dims(m.graph.output[1], ["batch", 16])


NO_FEEDS: tuple[TensorSpec, ...] = ()
IDENTITY_FEEDS = (TensorSpec("x", "float32", (2, 8, 16)),)
ZERO_FEEDS = (TensorSpec("ids", "int64", (0, 8), 0, 32), TensorSpec("x", "float32", (0, 8, 16)))
S, O, E, R, X = Expect.SPEC, Expect.ORT, Expect.ERROR, Expect.RESULT, Expect.EITHER

# (name, base, edit, expect, note, inputs or None for the base's)
FAULTS: list[tuple[str, str, Edit, Expect, str, tuple[TensorSpec, ...] | None]] = [
    ("missing-input", "lm", lambda m: _node(m, "add").input.__setitem__(1, "x_missing"), S, "Add reads a name nothing defines", None),
    ("missing-initializer", "lm", _remove_init("w"), S, "MatMul's weight initializer removed", None),
    ("attr-float-for-int", "lm", lambda m: _set_attr(_node(m, "softmax"), "axis", 1.5), S, "Softmax axis=1.5 (FLOAT)", None),
    ("attr-string-for-int", "lm", lambda m: _set_attr(_node(m, "softmax"), "axis", "last"), S, "Softmax axis='last'", None),
    ("attr-tensor-for-float", "lm", lambda m: _set_attr(_node(m, "ln"), "epsilon", numpy_helper.from_array(np.array(1e-5, np.float32))), S, "LayerNorm epsilon as a TENSOR", None),
    ("attr-ints-for-int", "lm", lambda m: _set_attr(_node(m, "gather"), "axis", [0]), S, "Gather axis=[0] (INTS)", None),
    ("attr-int-for-float", "lm", lambda m: _set_attr(_node(m, "ln"), "epsilon", 0), S, "LayerNorm epsilon=0 as an INT", None),
    ("attr-duplicate", "lm", lambda m: _node(m, "softmax").attribute.append(helper.make_attribute("axis", 0)), S, "Softmax with two axis attributes", None),
    ("attr-unknown", "lm", lambda m: _node(m, "softmax").attribute.append(helper.make_attribute("foo", 1)), S, "Softmax with an unknown attribute foo=1", None),
    ("attr-empty-name", "lm", lambda m: _node(m, "softmax").attribute.append(helper.make_attribute("", 1)), S, "Softmax with an attribute named ''", None),
    ("softmax-axis-5", "lm", lambda m: _set_attr(_node(m, "softmax"), "axis", 5), S, "Softmax axis=5 on a 3-D tensor", None),
    ("softmax-axis--4", "lm", lambda m: _set_attr(_node(m, "softmax"), "axis", -4), S, "Softmax axis=-4 on a 3-D tensor", None),
    ("layernorm-axis-7", "lm", lambda m: _set_attr(_node(m, "ln"), "axis", 7), S, "LayerNorm axis=7", None),
    ("gather-axis-2", "lm", lambda m: _set_attr(_node(m, "gather"), "axis", 2), S, "Gather axis=2 on 2-D data", None),
    ("reducesum-axis-9", "lm", lambda m: _init(m, "axes").CopyFrom(numpy_helper.from_array(np.array([9], np.int64), "axes")), S, "ReduceSum axes=[9]", None),
    ("reducesum-axes-dup", "lm", lambda m: _init(m, "axes").CopyFrom(numpy_helper.from_array(np.array([1, 1], np.int64), "axes")), S, "ReduceSum axes=[1, 1]", None),
    ("cycle", "lm", _cycle, S, "Add reads Softmax's output: a cycle", None),
    ("self-loop", "lm", lambda m: _node(m, "tanh").input.__setitem__(0, "t"), S, "Tanh reads its own output", None),
    ("duplicate-output", "lm", lambda m: _node(m, "tanh").output.__setitem__(0, "a"), S, "two nodes write 'a'", None),
    ("duplicate-initializer", "lm", _dup_init, S, "two initializers named 'w'", None),
    ("duplicate-input", "lm", lambda m: m.graph.input.append(_input(m, "x")), S, "graph input 'x' listed twice", None),
    ("duplicate-node-name", "lm", lambda m: setattr(_node(m, "tanh"), "name", "softmax"), S, "two nodes named 'softmax' (valid: names need not be unique)", None),
    ("initializer-shadows-input", "lm", _init_shadows_input, S, "an initializer named like input 'x' (its default; the feed overrides it)", None),
    ("node-writes-graph-input", "lm", lambda m: _node(m, "tanh").output.__setitem__(0, "x"), S, "Tanh writes the graph input 'x'", None),
    ("unknown-op", "lm", lambda m: setattr(_node(m, "tanh"), "op_type", "FooBar"), S, "op FooBar in the default domain", None),
    ("unknown-domain", "lm", lambda m: (setattr(_node(m, "tanh"), "domain", "com.evil"), m.opset_import.append(helper.make_opsetid("com.evil", 1))), S, "Tanh in domain com.evil (imported)", None),
    ("domain-not-imported", "lm", lambda m: setattr(_node(m, "tanh"), "domain", "com.evil"), S, "Tanh in domain com.evil, no opset import", None),
    ("empty-op-type", "lm", lambda m: setattr(_node(m, "tanh"), "op_type", ""), S, "a node with op_type ''", None),
    ("opset-0", "lm", _opset(0), S, "default-domain opset 0", None),
    ("opset-999", "lm", _opset(999), S, "default-domain opset 999", None),
    ("opset--1", "lm", _opset(-1), S, "default-domain opset -1", None),
    ("opset-1", "lm", _opset(1), S, "opset 1 (LayerNormalization does not exist there)", None),
    ("opset-none", "lm", _opset(None), S, "no opset import at all", None),
    ("opset-twice", "lm", _opset(13, 17), S, "the default domain imported twice (13 and 17)", None),
    ("ir-version-0", "lm", lambda m: setattr(m, "ir_version", 0), S, "ir_version 0", None),
    ("ir-version-999", "lm", lambda m: setattr(m, "ir_version", 999), S, "ir_version 999", None),
    ("ir-version-3", "lm", lambda m: setattr(m, "ir_version", 3), S, "ir_version 3 (initializers must be graph inputs there)", None),
    ("negative-dim", "lm", lambda m: _dims(_input(m, "x"), [-5, 8, 16]), S, "input x of shape [-5, 8, 16]", None),
    ("zero-dim", "lm", lambda m: (_dims(_input(m, "x"), [0, 8, 16]), _dims(_input(m, "ids"), [0, 8]), _dims(m.graph.output[0], [0, 8, 16]), _dims(m.graph.output[1], [0, 16])), S, "batch 0: empty inputs and outputs", ZERO_FEEDS),
    ("huge-dim-input", "lm", lambda m: _dims(_input(m, "x"), [2**40, 8, 16]), E, "input x of shape [2**40, 8, 16], fed [2, 8, 16]", None),
    ("huge-dim-initializer", "lm", _huge_init, E, "initializer 'bias' with dims [2**40] and 64 bytes of data", None),
    ("huge-rank", "lm", lambda m: _dims(_input(m, "x"), [2, 8, 16] + [1] * 61), S, "input x of rank 64", None),
    ("huge-value-info", "lm", _value_info("a", TensorProto.FLOAT, [2**40, 16]), S, "value_info claims 'a' is [2**40, 16]", None),
    ("lying-value-info", "lm", _value_info("a", TensorProto.INT64, [3, 3]), S, "value_info claims 'a' is int64[3, 3]", None),
    ("elem-type-99-input", "lm", _elem_type("input", 99), S, "input x of elem_type 99", None),
    ("elem-type-0-input", "lm", _elem_type("input", 0), S, "input x of elem_type 0 (UNDEFINED)", None),
    ("elem-type-99-output", "lm", _elem_type("output", 99), S, "output probs of elem_type 99", None),
    ("elem-type-99-initializer", "lm", _elem_type("initializer", 99), S, "initializer w of data_type 99", None),
    ("elem-type-string-initializer", "lm", _elem_type("initializer", TensorProto.STRING), S, "initializer w of data_type STRING holding float bytes", None),
    ("cast-to-99", "lm", _replace_node("tanh", helper.make_node("Cast", ["a"], ["t"], to=99)), S, "Cast to=99", None),
    ("output-type-mismatch", "lm", _elem_type("output", TensorProto.INT64), S, "output probs declared int64 (computes float)", None),
    ("output-shape-mismatch", "lm", lambda m: _dims(m.graph.output[0], [2, 8, 17]), S, "output probs declared [2, 8, 17] (computes [2, 8, 16])", None),
    ("output-never-computed", "lm", lambda m: m.graph.output.append(helper.make_tensor_value_info("ghost", TensorProto.FLOAT, [1])), S, "a graph output nothing computes", None),
    ("no-outputs", "lm", lambda m: m.graph.ClearField("output"), S, "a graph without outputs", None),
    ("empty-graph", "lm", _no_graph_io, S, "no nodes, inputs, outputs or initializers", NO_FEEDS),
    ("identity-graph", "lm", _identity_graph, S, "no nodes: output 'x' is the input 'x'", IDENTITY_FEEDS),
    ("constant-only", "lm", _constant_only, S, "no inputs: Relu of a Constant", NO_FEEDS),
    ("initializer-short", "lm", _wrong_length(-4), S, "initializer w's raw_data 4 bytes short", None),
    ("initializer-long", "lm", _wrong_length(4), S, "initializer w's raw_data 4 bytes long", None),
    ("initializer-empty", "lm", _wrong_length(-1024), S, "initializer w's raw_data empty", None),
    ("initializer-raw-and-float", "lm", _raw_and_float, S, "initializer w with both raw_data and float_data", None),
    ("initializer-float-data-count", "lm", _float_data_count, S, "initializer w [16, 16] with 3 float_data values", None),
    ("initializer-external-no-location", "lm", _external_without_location, S, "initializer w marked EXTERNAL with no location", None),
    ("constant-no-value", "lm", _replace_node("tanh", helper.make_node("Constant", [], ["t"])), S, "a Constant without a value", None),
    ("constant-sparse", "lm", _sparse_constant([0, 5, 15]), S, "bias as a sparse Constant (valid)", None),
    ("constant-sparse-bad-index", "lm", _sparse_constant([0, 5, 99]), S, "a sparse Constant with index 99 in a [16] tensor", None),
    ("constant-sparse-unsorted", "lm", _sparse_constant([5, 0, 5]), S, "a sparse Constant with repeated, unsorted indices", None),
    ("reshape-bad-count", "lm", _chain(_add_init("shape35", np.array([3, 5], np.int64)), _replace_node("tanh", helper.make_node("Reshape", ["a", "shape35"], ["t"]))), S, "Reshape of 256 values to [3, 5]", None),
    ("reshape-two-minus-one", "lm", _chain(_add_init("shape_mm", np.array([-1, -1], np.int64)), _replace_node("tanh", helper.make_node("Reshape", ["a", "shape_mm"], ["t"]))), S, "Reshape to [-1, -1]", None),
    ("matmul-dim-mismatch", "lm", lambda m: _init(m, "w").CopyFrom(numpy_helper.from_array(np.ones((15, 16), np.float32), "w")), S, "MatMul of [2, 8, 16] by [15, 16]", None),
    ("too-many-inputs", "lm", lambda m: _node(m, "tanh").input.append("a"), S, "Tanh with two inputs", None),
    ("too-few-inputs", "lm", lambda m: _node(m, "add").input.pop(), S, "Add with one input", None),
    ("too-many-outputs", "lm", lambda m: _node(m, "tanh").output.append("t2"), S, "Tanh with two outputs", None),
    ("transpose-bad-perm", "lm", _replace_node("tanh", helper.make_node("Transpose", ["a"], ["t"], perm=[0, 0, 1])), S, "Transpose perm=[0, 0, 1]", None),
    ("transpose-perm-out-of-range", "lm", _replace_node("tanh", helper.make_node("Transpose", ["a"], ["t"], perm=[0, 1, 5])), S, "Transpose perm=[0, 1, 5]", None),
    ("slice-zero-step", "lm", _chain(_add_init("s0", np.array([0], np.int64)), _add_init("s1", np.array([16], np.int64)), _add_init("sax", np.array([2], np.int64)), _add_init("sst", np.array([0], np.int64)), _replace_node("tanh", helper.make_node("Slice", ["a", "s0", "s1", "sax", "sst"], ["t"]))), S, "Slice with step 0", None),
    ("concat-bad-axis", "lm", _replace_node("tanh", helper.make_node("Concat", ["a", "a"], ["t"], axis=7)), S, "Concat axis=7", None),
    ("concat-rank-mismatch", "lm", _replace_node("tanh", helper.make_node("Concat", ["a", "bias"], ["t"], axis=0)), S, "Concat of [2, 8, 16] and [16]", None),
    ("expand-incompatible", "lm", _chain(_add_init("eshape", np.array([3, 8, 16], np.int64)), _replace_node("tanh", helper.make_node("Expand", ["a", "eshape"], ["t"]))), S, "Expand [2, 8, 16] to [3, 8, 16]", None),
    ("expand-huge", "lm", _chain(_add_init("eshape", np.array([2**30, 2, 8, 16], np.int64)), _replace_node("pool", helper.make_node("Expand", ["ln", "eshape"], ["pooled"]))), S, "Expand to [2**30, 2, 8, 16] (1 TiB of float32)", None),
    ("topk-k-too-big", "topk", lambda m: _init(m, "k").CopyFrom(numpy_helper.from_array(np.array([20], np.int64), "k")), O, "TopK k=20 along an axis of 10", None),
    ("topk-k-negative", "topk", lambda m: _init(m, "k").CopyFrom(numpy_helper.from_array(np.array([-1], np.int64), "k")), O, "TopK k=-1", None),
    ("topk-k-zero", "topk", lambda m: (_init(m, "k").CopyFrom(numpy_helper.from_array(np.array([0], np.int64), "k")), m.graph.ClearField("output"), m.graph.output.extend([helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 0]), helper.make_tensor_value_info("idx", TensorProto.INT64, [4, 0])])), S, "TopK k=0 (empty outputs)", None),
    ("gather-constant-index-out-of-range", "lm", _chain(_add_init("cidx", np.array([[40] * 8] * 2, np.int64)), lambda m: _node(m, "gather").input.__setitem__(1, "cidx")), O, "Gather with constant index 40 in a table of 32", None),
    ("gather-constant-index-negative", "lm", _chain(_add_init("cidx", np.array([[-1, -32] * 4] * 2, np.int64)), lambda m: _node(m, "gather").input.__setitem__(1, "cidx")), S, "Gather with constant indices -1 and -32 (valid)", None),
    ("gather-constant-index-below", "lm", _chain(_add_init("cidx", np.array([[-33] * 8] * 2, np.int64)), lambda m: _node(m, "gather").input.__setitem__(1, "cidx")), O, "Gather with constant index -33 in a table of 32", None),
    ("if-branch-output-count", "lm", _if_branches, S, "If whose branches give 1 and 2 outputs", None),
    ("if-outer-name-missing", "lm", _if_outer_missing, S, "If branch reading an outer name that does not exist", None),
    ("local-function", "lm", _local_function, S, "a model-local function Twice (valid)", None),
    ("deep-chain-300", "lm", _deep_chain(300), S, "300 Neg nodes in a chain (valid)", None),
    ("input-name-empty", "lm", _rename_input(""), S, "input 'x' renamed ''", (TensorSpec("ids", "int64", (2, 8), 0, 32), TensorSpec("", "float32", (2, 8, 16)))),
    ("input-name-weird", "lm", _rename_input("x/../../etc:\u00e9\n"), S, "input 'x' renamed 'x/../../etc:\\u00e9\\n'", (TensorSpec("ids", "int64", (2, 8), 0, 32), TensorSpec("x/../../etc:\u00e9\n", "float32", (2, 8, 16)))),
    ("input-name-nul", "lm", _rename_input("x\0y"), S, "input 'x' renamed 'x\\0y'", (TensorSpec("ids", "int64", (2, 8), 0, 32), TensorSpec("x\0y", "float32", (2, 8, 16)))),
    ("dynamic-unbound", "lm", _dynamic, E, "dims named 'batch', compiled without binding them", None),
]


def faults() -> Iterator[ModelCase]:
    for name, base, edit, expect, note, inputs in FAULTS:
        m = BUILDERS[base]()
        edit(m)
        yield model_case(f"model.fault/{name}", "model.fault", expect, note, m,
                         inputs=INPUTS[base] if inputs is None else inputs)


def _dynamic_lm() -> onnx.ModelProto:
    m = lm_model()
    _dynamic(m)
    return m


# -- hostile arguments to tilefuse.compile -------------------------------------------------
def arguments() -> Iterator[ModelCase]:
    good = lm_model().SerializeToString()
    dyn = _dynamic_lm().SerializeToString()
    inputs = INPUTS["lm"]

    def case(name: str, expect: Expect, note: str, data: bytes = good, **kw: Any) -> ModelCase:
        return model_case(f"model.args/{name}", "model.args", expect, note, data, inputs=inputs,
                          oracle_model=kw.pop("oracle_model", good), **kw)

    yield case("control-path", R, "the base model by path (control)")
    yield case("control-pathlib", R, "the base model as a pathlib.Path", entry="pathlib")
    yield case("control-bytes", R, "the base model as bytes", entry="bytes")
    yield case("control-proto", R, "the base model as a ModelProto", entry="proto")
    yield case("bytearray", X, "the base model as a bytearray", entry="bytearray")
    yield case("directory", E, "compile(the model's folder)", entry="dir")
    yield case("int", E, "compile(5)", entry="value", value=5)
    yield case("none", E, "compile(None)", entry="value", value=None)
    yield case("empty-str", E, "compile('')", entry="value", value="")
    yield case("empty-bytes", E, "compile(b'')", entry="value", value=b"")
    yield case("garbage-bytes", S, "compile(b'\\x08\\x07garbage')", entry="value", value=b"\x08\x07garbage", oracle_model=b"\x08\x07garbage")
    yield case("dict", E, "compile({'graph': ...})", entry="value", value={"graph": good})
    yield case("missing-path", E, "compile('/nonexistent/model.onnx')", entry="value", value="/nonexistent/model.onnx")
    yield case("nul-in-path", E, "compile('model\\0.onnx')", entry="value", value="model\0.onnx")
    yield case("long-path", E, "compile('a' * 5000)", entry="value", value="a" * 5000)
    yield case("dev-null", E, "compile('/dev/null')", entry="value", value="/dev/null")
    yield case("empty-file", E, "a 0-byte model file", data=b"")
    yield case("text-file", E, "a model file holding JSON text", data=b'{"graph": {"node": []}}\n')
    yield case("model-no-graph", S, "a ModelProto with an opset import and no graph",
               data=helper.make_model(helper.make_graph([], "g", [], []), opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    yield case("model-fifo", E, "the model path is a named pipe", fifos=("model/pipe.onnx",), model="model/pipe.onnx")
    yield case("target-gpu9", X, "compile(target='gpu9')", compile_kwargs=(("target", "gpu9"),))
    yield case("target-empty", X, "compile(target='')", compile_kwargs=(("target", ""),))
    yield case("target-none", X, "compile(target=None)", compile_kwargs=(("target", None),))
    yield case("target-int", X, "compile(target=5)", compile_kwargs=(("target", 5),))
    yield case("target-cuda-sm1", X, "compile(target='cuda:sm_1')", compile_kwargs=(("target", "cuda:sm_1"),))
    yield case("precision-fp8", X, "compile(precision='fp8')", compile_kwargs=(("precision", "fp8"),))
    yield case("precision-none", X, "compile(precision=None)", compile_kwargs=(("precision", None),))
    yield case("shapes-unknown-name", X, "compile(shapes={'nope': 3})", shapes={"nope": 3})
    yield case("shapes-int", X, "compile(shapes=5)", shapes=5)
    yield case("shapes-str", X, "compile(shapes='batch=2')", shapes="batch=2")
    yield case("shapes-list", X, "compile(shapes=[('batch', 2)])", shapes=[("batch", 2)])
    yield case("shapes-wrong-rank", X, "compile(shapes={'x': (2, 8)}) for a static [2, 8, 16] input", shapes={"x": (2, 8)})
    yield case("shapes-conflict", X, "compile(shapes={'x': (3, 8, 16)}) for a static [2, 8, 16] input", shapes={"x": (3, 8, 16)})
    yield case("dynamic-bound", R, "dims named 'batch' bound to 2 (control)", data=dyn, shapes={"batch": 2})
    yield case("dynamic-bound-by-input", R, "dynamic inputs bound by name (control)", data=dyn, shapes={"ids": (2, 8), "x": (2, 8, 16)})
    yield case("dynamic-negative", E, "compile(shapes={'batch': -1})", data=dyn, shapes={"batch": -1})
    yield case("dynamic-huge", E, "compile(shapes={'batch': 2**40}), fed batch 2", data=dyn, shapes={"batch": 2**40})
    yield case("dynamic-huge-ish", E, "compile(shapes={'batch': 2**26}) (8 GiB per input), fed batch 2", data=dyn, shapes={"batch": 2**26})
    yield case("dynamic-zero", X, "compile(shapes={'batch': 0}), fed batch 2", data=dyn, shapes={"batch": 0})
    yield case("dynamic-str", X, "compile(shapes={'batch': '2'})", data=dyn, shapes={"batch": "2"})
    yield case("dynamic-float", X, "compile(shapes={'batch': 2.0})", data=dyn, shapes={"batch": 2.0})
    yield case("dynamic-bool", X, "compile(shapes={'batch': True}), fed batch 2", data=dyn, shapes={"batch": True})
    yield case("dynamic-none", E, "compile(shapes={'batch': None})", data=dyn, shapes={"batch": None})
    yield case("dynamic-rank-mismatch", E, "compile(shapes={'x': (2, 8)}) for a [batch, 8, 16] input", data=dyn, shapes={"x": (2, 8)})
    yield case("dynamic-input-conflict", E, "compile(shapes={'x': (2, 9, 16)}) for a [batch, 8, 16] input", data=dyn, shapes={"x": (2, 9, 16)})
