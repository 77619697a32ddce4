"""The command line as a user runs it: exit codes and what it prints."""
import json
import subprocess
import sys

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

from tilefuse.cli.main import main


def _write(tmp_path, nodes, inputs, outputs, inits=(), domains=()):
    g = h.make_graph(nodes, "m", inputs, outputs, initializer=list(inits))
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17), *[h.make_opsetid(d, 1) for d in domains]])
    m.ir_version = 8
    path = tmp_path / "m.onnx"
    onnx.save(m, path)
    return path


def _gelu_mlp(tmp_path):
    rng = np.random.default_rng()
    w = numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w")
    return _write(
        tmp_path,
        [h.make_node("Mul", ["x", "w0"], ["a"]), h.make_node("Erf", ["a"], ["b"]), h.make_node("Add", ["b", "x"], ["y"])],
        [h.make_tensor_value_info("x", T.FLOAT, ["batch", 8])],
        [h.make_tensor_value_info("y", T.FLOAT, ["batch", 8])],
        inits=[numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "w0"), w],
    )


def test_inspect_prints_inputs_flops_and_primitives(tmp_path, capsys):
    path = _gelu_mlp(tmp_path)
    assert main(["inspect", str(path), "--shape", "batch=3"]) == 0
    out = capsys.readouterr().out
    assert "x: float32[3, 8]" not in out and "x: float32['batch', 8]" in out
    assert "FLOPs:" in out and "unsupported ops: none" in out and "erf 1" in out


def test_inspect_json_without_shapes_explains_missing_flops(tmp_path, capsys):
    path = _gelu_mlp(tmp_path)
    assert main(["inspect", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["flops"] is None and "dynamic" in data["not_imported"]
    assert data["op_histogram"] == {"Mul": 1, "Erf": 1, "Add": 1}


def test_unsupported_ops_exit_2_and_are_all_named(tmp_path, capsys):
    path = _write(
        tmp_path,
        [h.make_node("MyCustomOp", ["x"], ["a"], domain="com.example", name="c1"), h.make_node("Bernoulli", ["a"], ["y"], name="b1")],
        [h.make_tensor_value_info("x", T.FLOAT, [2])],
        [h.make_tensor_value_info("y", T.FLOAT, [2])],
        domains=["com.example"],
    )
    assert main(["inspect", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "com.example::MyCustomOp" in err and "Bernoulli" in err and "c1" in err


def test_truncated_model_exits_2_with_one_line(tmp_path):
    path = _gelu_mlp(tmp_path)
    path.write_bytes(path.read_bytes()[:40])
    proc = subprocess.run([sys.executable, "-m", "tilefuse.cli.main", "inspect", str(path)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.startswith("tilefuse: error:") and "Traceback" not in proc.stderr
    debug = subprocess.run([sys.executable, "-m", "tilefuse.cli.main", "--debug", "inspect", str(path)], capture_output=True, text=True)
    assert debug.returncode == 2 and "Traceback" in debug.stderr


def test_run_check_agrees_with_onnxruntime(tmp_path, capsys):
    path = _gelu_mlp(tmp_path)
    assert main(["run", str(path), "--shape", "x=4,8", "--random", "--check"]) == 0
    out = capsys.readouterr().out
    assert "check y: max abs error" in out and "ok" in out


def test_run_with_npy_inputs_and_bad_input(tmp_path, capsys):
    path = _gelu_mlp(tmp_path)
    x = np.random.default_rng().standard_normal((2, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    assert main(["run", str(path), "--input", f"x={tmp_path / 'x.npy'}", "--save", str(tmp_path / "out")]) == 0
    assert np.load(tmp_path / "out" / "y.npy").shape == (2, 8)
    np.save(tmp_path / "x64.npy", x.astype(np.float64))
    assert main(["run", str(path), "--input", f"x={tmp_path / 'x64.npy'}"]) == 2
    assert "expected dtype float32, got float64" in capsys.readouterr().err


def test_ops_lists_the_registry(capsys):
    assert main(["ops", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {"Add", "Where", "Cast"} <= {r["op_type"] for r in rows}


def test_bad_shape_argument(tmp_path, capsys):
    path = _gelu_mlp(tmp_path)
    assert main(["inspect", str(path), "--shape", "x=a,b"]) == 2
    assert "dims must be integers" in capsys.readouterr().err
