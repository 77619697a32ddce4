"""The command line in a fresh process: a model or input it cannot take is one line on
stderr and exit 2; --check holds a plan to the precision it computed in."""
import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper


def tilefuse(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "tilefuse", *map(str, args)], capture_output=True, text=True, cwd=cwd)


def assert_one_line_error(proc, *needles):
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("tilefuse: error: ") and proc.stderr.count("\n") == 1, proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr


def _save(path, nodes, inputs, outputs, inits=()):
    g = h.make_graph(nodes, "m", inputs, outputs, initializer=list(inits))
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, path)
    return path


def _relu(path, shape, elem=T.FLOAT):
    return _save(path, [h.make_node("Relu", ["x"], ["y"])], [h.make_tensor_value_info("x", elem, shape)],
                 [h.make_tensor_value_info("y", elem, shape)])


def _matmul(path, rows=4):
    w = numpy_helper.from_array(np.random.default_rng().standard_normal((64, 64)).astype(np.float32), "w")
    return _save(path, [h.make_node("MatMul", ["x", "w"], ["y"])], [h.make_tensor_value_info("x", T.FLOAT, [rows, 64])],
                 [h.make_tensor_value_info("y", T.FLOAT, [rows, 64])], [w])


def test_inspect_exits_2_on_a_model_it_cannot_import(tmp_path):
    shape = numpy_helper.from_array(np.array([5, 5], np.int64), "s")
    path = _save(tmp_path / "m.onnx", [h.make_node("Reshape", ["x", "s"], ["y"], name="r")],
                 [h.make_tensor_value_info("x", T.FLOAT, [2, 4])], [h.make_tensor_value_info("y", T.FLOAT, [5, 5])], [shape])
    proc = tilefuse("inspect", path)
    assert_one_line_error(proc, "Reshape node 'r': cannot reshape [2, 4] to [5, 5]")
    assert "op histogram: Reshape 1" in proc.stdout  # the summary is still printed
    proc = tilefuse("inspect", path, "--json")
    assert_one_line_error(proc, "cannot reshape")
    assert "cannot reshape" in json.loads(proc.stdout)["not_imported"]


def test_inspect_of_a_dynamic_model_needs_no_shapes_but_bad_shapes_are_an_error(tmp_path):
    path = _relu(tmp_path / "m.onnx", [-1, 4])  # -1: a dynamic dim
    proc = tilefuse("inspect", path)
    assert proc.returncode == 0 and "x: float32['?', 4]" in proc.stdout and "(declared -1) is dynamic" in proc.stdout
    assert_one_line_error(tilefuse("inspect", path, "--shape", "x=3,5"), "input 'x' dim 1 is fixed at 4, but 5 was given")
    assert tilefuse("inspect", path, "--shape", "x=3,4").returncode == 0


@pytest.mark.parametrize("command", ["inspect", "optimize", "run"])
def test_undefined_element_type_is_one_line(tmp_path, command):
    path = _relu(tmp_path / "m.onnx", [2, 4], elem=99)
    assert_one_line_error(tilefuse(command, path), "element type 99, which is no ONNX type")


def test_negative_dim_unbound_is_one_line(tmp_path):
    path = _relu(tmp_path / "m.onnx", [-3, 4])
    assert_one_line_error(tilefuse("optimize", path, "-o", tmp_path / "p.tfplan"), "input 'x' dim 0 (declared -3) is dynamic")
    proc = tilefuse("run", path, "--shape", "x=2,4", "--random", "--check")
    assert proc.returncode == 0 and "check y:" in proc.stdout and "ok" in proc.stdout


def test_dims_of_2_to_the_40_are_refused_when_compiling(tmp_path):
    path = _relu(tmp_path / "m.onnx", [2**40])
    assert_one_line_error(tilefuse("optimize", path, "-o", tmp_path / "p.tfplan"), "the plan needs 8.0 TiB", "buffer 'x'")
    assert not (tmp_path / "p.tfplan").exists()
    # the reference executor has no plan to refuse; 4 TiB of random inputs are refused alike
    assert_one_line_error(tilefuse("run", path, "--random"), "--random: input 'x' float32[1099511627776] takes 4096.0 GiB")


def test_a_memory_error_is_one_line(monkeypatch, capsys):
    from tilefuse.cli import main as cli, run_cmd

    def allocate(args):
        raise MemoryError("Unable to allocate 8.00 TiB for an array")

    monkeypatch.setattr(run_cmd, "run", allocate)
    assert cli.main(["run", "model.onnx"]) == 2
    assert capsys.readouterr().err == "tilefuse: error: out of memory: Unable to allocate 8.00 TiB for an array\n"


def test_external_data_outside_the_folder_is_one_line(tmp_path):
    w = numpy_helper.from_array(np.ones((64, 64), np.float32), "w")
    w.ClearField("raw_data")
    w.data_location = T.EXTERNAL
    entry = w.external_data.add()
    entry.key, entry.value = "location", "../w.bin"
    (tmp_path / "w.bin").write_bytes(np.ones((64, 64), np.float32).tobytes())
    (tmp_path / "model").mkdir()
    path = _save(tmp_path / "model" / "m.onnx", [h.make_node("MatMul", ["x", "w"], ["y"])],
                 [h.make_tensor_value_info("x", T.FLOAT, [4, 64])], [h.make_tensor_value_info("y", T.FLOAT, [4, 64])], [w])
    for command in ("inspect", "optimize", "run"):
        assert_one_line_error(tilefuse(command, path), "'../w.bin' is outside the model's folder")


def test_check_reports_onnxruntime_refusing_the_model_in_one_line(tmp_path):
    path = _relu(tmp_path / "m.onnx", [2, 3], elem=T.INT16)  # onnxruntime has no int16 Relu
    assert_one_line_error(tilefuse("run", path, "--random", "--check"), "--check: onnxruntime cannot load", "NOT_IMPLEMENTED")


def test_check_reports_onnxruntime_refusing_the_inputs_in_one_line(tmp_path):
    plan = tmp_path / "p.tfplan"
    assert tilefuse("optimize", _matmul(tmp_path / "a.onnx", rows=4), "-o", plan).returncode == 0
    other = _matmul(tmp_path / "b.onnx", rows=3)  # the same input, another shape
    assert_one_line_error(tilefuse("run", plan, "--random", "--check", "--model", other),
                          "--check: onnxruntime refuses the inputs", "Got invalid dimensions for input: x")


def test_check_of_a_half_precision_plan_follows_its_precision(tmp_path):
    model = _matmul(tmp_path / "m.onnx")
    for precision, tolerance in (("fp16", "0.01"), ("bf16", "0.05")):
        plan = tmp_path / f"{precision}.tfplan"
        assert tilefuse("optimize", model, "--precision", precision, "-o", plan).returncode == 0
        assert json.loads((plan / "manifest.json").read_text())["precision"] == precision
        proc = tilefuse("run", plan, "--random", "--check")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"tolerance {tolerance} x scale) ok" in proc.stdout
    # --rtol/--atol hold every element instead: exact equality fails a half-precision product
    proc = tilefuse("run", tmp_path / "fp16.tfplan", "--random", "--check", "--rtol", "0", "--atol", "0")
    assert proc.returncode == 1 and "(atol 0, rtol 0) FAIL" in proc.stdout and "elements beyond" in proc.stdout
    proc = tilefuse("run", tmp_path / "fp16.tfplan", "--random", "--check", "--rtol", "0.05", "--atol", "0.5")
    assert proc.returncode == 0 and "(atol 0.5, rtol 0.05) ok" in proc.stdout
    assert_one_line_error(tilefuse("run", tmp_path / "fp16.tfplan", "--random", "--rtol", "0.1"), "pass --check too")


def test_random_integers_span_the_inputs_valid_range(tmp_path):
    vocab = numpy_helper.from_array(np.random.default_rng().standard_normal((50, 4)).astype(np.float32), "vocab")
    one = numpy_helper.from_array(np.array(1, np.int64), "one")
    path = _save(
        tmp_path / "m.onnx",
        [h.make_node("Cast", ["ids"], ["ids64"], to=T.INT64), h.make_node("Gather", ["vocab", "ids64"], ["e"]),
         h.make_node("Add", ["n", "one"], ["n1"])],
        [h.make_tensor_value_info("ids", T.INT32, [4, 64]), h.make_tensor_value_info("n", T.INT64, [256])],
        [h.make_tensor_value_info("ids64", T.INT64, [4, 64]), h.make_tensor_value_info("e", T.FLOAT, [4, 64, 4]),
         h.make_tensor_value_info("n1", T.INT64, [256])],
        [vocab, one],
    )
    plan = tmp_path / "p.tfplan"
    assert tilefuse("optimize", path, "-o", plan).returncode == 0
    for target in (path, plan):  # the reference executor and a plan (which finds its source model)
        out = tmp_path / f"out-{target.suffix}"
        proc = tilefuse("run", target, "--random", "--check", "--save", out)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        ids, n = np.load(out / "ids64.npy"), np.load(out / "n1.npy") - 1
        assert ids.min() >= 0 and ids.max() < 50 and len(np.unique(ids)) > 10  # the vocabulary, not {0, 1}
        assert n.min() >= 0 and n.max() < 100 and n.max() >= 50  # nothing bounds n: [0, 100)


def test_random_integers_of_a_plan_without_its_model_stay_valid_for_any_index(tmp_path):
    vocab = numpy_helper.from_array(np.random.default_rng().standard_normal((3, 4)).astype(np.float32), "vocab")
    path = _save(tmp_path / "m.onnx", [h.make_node("Gather", ["vocab", "ids"], ["e"]), h.make_node("Identity", ["ids"], ["i"])],
                 [h.make_tensor_value_info("ids", T.INT64, [64])],
                 [h.make_tensor_value_info("e", T.FLOAT, [64, 4]), h.make_tensor_value_info("i", T.INT64, [64])], [vocab])
    plan = tmp_path / "p.tfplan"
    assert tilefuse("optimize", path, "-o", plan).returncode == 0
    path.unlink()  # the plan's source model is gone: nothing says what ids index
    proc = tilefuse("run", plan, "--random", "--save", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    assert set(np.load(tmp_path / "out" / "i.npy").tolist()) <= {0, 1}
    proc = tilefuse("bench", plan, "--repeats", "2", "--warmup", "0")
    assert proc.returncode == 0 and "tilefuse" in proc.stdout, proc.stderr
