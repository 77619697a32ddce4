"""RNN, GRU and LSTM converters against onnxruntime, on fresh random inputs.

onnxruntime's CPU kernels only run layout 0, so a layout-1 case is checked against the
same node in layout 0 with its inputs and outputs transposed.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper as h
from onnx import numpy_helper

from tilefuse.frontend import import_onnx
from tilefuse.reference import run_graph

RNG = np.random.default_rng()
F32, F16 = np.float32, np.float16
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
OUTPUTS = {"RNN": 2, "GRU": 2, "LSTM": 3}


@dataclass
class Case:
    id: str
    op: str
    T: int = 5  # sequence length
    B: int = 3  # batch
    I: int = 4  # input size
    H: int = 6  # hidden size
    direction: str = "forward"
    bias: bool = True
    initial: bool = False  # initial_h (and initial_c)
    lens: list[int] | None = None
    lens_const: bool = True  # sequence_lens as an initializer, else a runtime input
    peepholes: bool = False
    layout: int = 0
    dtype: type = F32
    weights_const: bool = True
    outputs: tuple[bool, ...] | None = None  # which outputs to ask for; default all
    attrs: dict = field(default_factory=dict)

    @property
    def dirs(self) -> int:
        return 2 if self.direction == "bidirectional" else 1


def _inputs(case: Case) -> list[np.ndarray | None]:
    """X, W, R, B, sequence_lens, initial_h, initial_c, P in layout 0; weights scaled so
    the recurrence neither explodes nor saturates."""
    g, d, n = GATES[case.op], case.dirs, case.H

    def rand(*shape: int, scale: float = 1.0) -> np.ndarray:
        return ((RNG.standard_normal(shape) + 0.1) * scale).astype(case.dtype)

    x = rand(case.T, case.B, case.I)
    w = rand(d, g * n, case.I, scale=1 / np.sqrt(case.I))
    r = rand(d, g * n, n, scale=1 / np.sqrt(n))
    b = rand(d, 2 * g * n, scale=0.5) if case.bias else None
    lens = None if case.lens is None else np.array(case.lens, np.int32)
    h0 = rand(d, case.B, n) if case.initial else None
    c0 = rand(d, case.B, n) if case.initial and case.op == "LSTM" else None
    p = rand(d, 3 * n, scale=0.5) if case.peepholes else None
    return [x, w, r, b, lens, h0, c0, p][: 8 if case.op == "LSTM" else 6]


def _to_layout1(i: int, a: np.ndarray) -> np.ndarray:
    if i == 0:  # X [T, B, I] -> [B, T, I]
        return a.transpose(1, 0, 2)
    if i in (5, 6):  # states [D, B, H] -> [B, D, H]
        return a.transpose(1, 0, 2)
    return a


def build(case: Case, inputs: list[np.ndarray | None], layout: int) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    names, graph_inputs, inits, feeds = [], [], [], {}
    for i, array in enumerate(inputs):
        if array is None:
            names.append("")
            continue
        if layout == 1:
            array = _to_layout1(i, array)
        name = f"in{i}"
        names.append(name)
        const = (i in (1, 2, 3, 7) and case.weights_const) or (i == 4 and case.lens_const)
        if const:
            inits.append(numpy_helper.from_array(array, name))
        else:
            graph_inputs.append(h.make_tensor_value_info(name, h.np_dtype_to_tensor_dtype(array.dtype), array.shape))
            feeds[name] = array
    while names and not names[-1]:
        names.pop()
    wanted = case.outputs or (True,) * OUTPUTS[case.op]
    outs = [f"out{i}" if w else "" for i, w in enumerate(wanted)]
    attrs = dict(case.attrs, hidden_size=case.H, direction=case.direction)
    if layout:
        attrs["layout"] = 1
    node = h.make_node(case.op, names, outs, **attrs)
    elem = h.np_dtype_to_tensor_dtype(np.dtype(case.dtype))
    y_shape = [case.T, case.dirs, case.B, case.H] if layout == 0 else [case.B, case.T, case.dirs, case.H]
    s_shape = [case.dirs, case.B, case.H] if layout == 0 else [case.B, case.dirs, case.H]
    shapes = [y_shape, s_shape, s_shape]
    outputs = [h.make_tensor_value_info(o, elem, shapes[i]) for i, o in enumerate(outs) if o]
    g = h.make_graph([node], "case", graph_inputs, outputs, initializer=inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 10
    return m, feeds


def onnxruntime_outputs(case: Case, inputs: list[np.ndarray | None]) -> dict[str, np.ndarray]:
    """onnxruntime's outputs for the case, in the case's layout."""
    model, feeds = build(case, inputs, layout=0)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    if case.layout == 1:
        want = {k: v.transpose(2, 0, 1, 3) if v.ndim == 4 else v.transpose(1, 0, 2) for k, v in want.items()}
    return want


def check(case: Case) -> None:
    inputs = _inputs(case)
    model, feeds = build(case, inputs, case.layout)
    graph = import_onnx(model, {k: v.shape for k, v in feeds.items()})
    got = run_graph(graph, feeds)
    want = onnxruntime_outputs(case, inputs)
    assert set(got) == set(want)
    for name, w in want.items():
        g = got[name]
        assert g.dtype == w.dtype and g.shape == w.shape, (name, g.dtype, g.shape, w.dtype, w.shape)
        tol = 1e-2 if w.dtype == np.float16 else 1e-5
        scale = max(1.0, float(np.abs(w.astype(np.float64)).max(initial=0)))
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=tol, atol=tol * scale, err_msg=name)


def acts(*names: str, alpha: list[float] | None = None, beta: list[float] | None = None) -> dict:
    attrs: dict = {"activations": list(names)}
    if alpha is not None:
        attrs["activation_alpha"] = alpha
    if beta is not None:
        attrs["activation_beta"] = beta
    return attrs


CASES = [
    # RNN
    Case("rnn_forward", "RNN"),
    Case("rnn_no_bias", "RNN", bias=False),
    Case("rnn_reverse_initial", "RNN", direction="reverse", initial=True),
    Case("rnn_bidirectional", "RNN", direction="bidirectional", initial=True),
    Case("rnn_seq_lens", "RNN", lens=[5, 2, 4], initial=True),
    Case("rnn_seq_lens_reverse_runtime", "RNN", direction="reverse", lens=[3, 5, 1], lens_const=False, initial=True),
    Case("rnn_seq_lens_bidirectional", "RNN", direction="bidirectional", lens=[4, 5, 2]),
    Case("rnn_layout1", "RNN", layout=1, initial=True, direction="bidirectional"),
    Case("rnn_relu_clip", "RNN", attrs=dict(acts("Relu"), clip=0.7)),
    Case("rnn_leaky_bidirectional", "RNN", direction="bidirectional", attrs=acts("LeakyRelu", "LeakyRelu", alpha=[0.1, 0.3])),
    Case("rnn_only_y_h", "RNN", outputs=(False, True)),
    Case("rnn_runtime_weights", "RNN", weights_const=False, initial=True),
    Case("rnn_f16", "RNN", dtype=F16, initial=True, direction="bidirectional"),
    # GRU
    Case("gru_forward", "GRU"),
    Case("gru_no_bias_initial", "GRU", bias=False, initial=True),
    Case("gru_reverse", "GRU", direction="reverse", initial=True),
    Case("gru_bidirectional", "GRU", direction="bidirectional"),
    Case("gru_linear_before_reset", "GRU", initial=True, attrs={"linear_before_reset": 1}),
    Case("gru_lbr_bidirectional_no_bias", "GRU", direction="bidirectional", bias=False, attrs={"linear_before_reset": 1}),
    Case("gru_seq_lens", "GRU", lens=[1, 5, 3], initial=True),
    Case("gru_seq_lens_bidirectional_runtime", "GRU", direction="bidirectional", lens=[2, 4, 5], lens_const=False,
         attrs={"linear_before_reset": 1}),
    Case("gru_layout1", "GRU", layout=1, initial=True, lens=[5, 3, 4]),
    Case("gru_clip", "GRU", initial=True, attrs={"clip": 0.5}),
    Case("gru_hardsigmoid_softsign", "GRU", attrs=acts("HardSigmoid", "Softsign", alpha=[0.3], beta=[0.4])),
    Case("gru_elu_affine", "GRU", initial=True, attrs=acts("Sigmoid", "Affine", alpha=[0.8], beta=[0.1])),
    Case("gru_runtime_weights", "GRU", weights_const=False, initial=True, direction="bidirectional"),
    Case("gru_f16", "GRU", dtype=F16, initial=True),
    # LSTM
    Case("lstm_forward", "LSTM"),
    Case("lstm_no_bias_initial", "LSTM", bias=False, initial=True),
    Case("lstm_reverse", "LSTM", direction="reverse", initial=True),
    Case("lstm_bidirectional", "LSTM", direction="bidirectional", initial=True),
    Case("lstm_peepholes", "LSTM", peepholes=True, initial=True),
    Case("lstm_peepholes_bidirectional", "LSTM", peepholes=True, direction="bidirectional"),
    Case("lstm_input_forget", "LSTM", initial=True, peepholes=True, attrs={"input_forget": 1}),
    Case("lstm_seq_lens", "LSTM", lens=[5, 1, 3], initial=True),
    Case("lstm_seq_lens_reverse", "LSTM", direction="reverse", lens=[2, 5, 4], initial=True, peepholes=True),
    Case("lstm_seq_lens_bidirectional_runtime", "LSTM", direction="bidirectional", lens=[3, 5, 2], lens_const=False),
    Case("lstm_layout1", "LSTM", layout=1, initial=True, direction="bidirectional"),
    Case("lstm_clip", "LSTM", initial=True, attrs={"clip": 0.6}),
    Case("lstm_activations", "LSTM", initial=True,
         attrs=acts("HardSigmoid", "ScaledTanh", "ThresholdedRelu", alpha=[0.25, 0.9, 0.05], beta=[0.45, 1.3])),
    Case("lstm_activations_bidirectional", "LSTM", direction="bidirectional",
         attrs=acts("Sigmoid", "Elu", "Softplus", "Sigmoid", "Relu", "LeakyRelu", alpha=[0.7, 0.2])),
    Case("lstm_only_y_c", "LSTM", outputs=(False, False, True), initial=True),
    Case("lstm_y_and_y_c", "LSTM", outputs=(True, False, True), direction="reverse"),
    Case("lstm_runtime_weights", "LSTM", weights_const=False, initial=True, peepholes=True),
    Case("lstm_f16", "LSTM", dtype=F16, initial=True, peepholes=True, direction="bidirectional"),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_against_onnxruntime(case: Case) -> None:
    check(case)


def test_long_sequence_unrolls_linearly() -> None:
    """Unrolling emits a bounded number of primitives per step (speed is for benchmarks)."""
    case = Case("lstm_long", "LSTM", T=200, B=2, I=8, H=16, direction="bidirectional", initial=True,
                lens=[200, 150], peepholes=True)
    inputs = _inputs(case)
    model, feeds = build(case, inputs, 0)
    graph = import_onnx(model, {k: v.shape for k, v in feeds.items()})
    assert len(graph.nodes) < 40 * 2 * case.T
    got = run_graph(graph, feeds)
    want = onnxruntime_outputs(case, inputs)
    for name, w in want.items():
        # 200 steps compound float32 rounding: held to the output's scale, as compare_output does
        np.testing.assert_allclose(got[name], w, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(w).max())))
