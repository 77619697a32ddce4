"""Bad input to the frontend gets a clear, typed error, never a crash."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

from tilefuse.errors import InputError, ModelLoadError, ShapeError, UnsupportedOpError
from tilefuse.frontend import import_onnx
from tilefuse.reference import run_graph


def _model(nodes, inputs, outputs, inits=(), opset=17, domains=()):
    g = h.make_graph(nodes, "m", inputs, outputs, initializer=list(inits))
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset), *[h.make_opsetid(d, 1) for d in domains]])
    m.ir_version = 8
    return m


def _relu_model():
    return _model(
        [h.make_node("Relu", ["x"], ["y"], name="relu")],
        [h.make_tensor_value_info("x", T.FLOAT, ["batch", 4])],
        [h.make_tensor_value_info("y", T.FLOAT, ["batch", 4])],
    )


def test_truncated_file(tmp_path):
    data = _relu_model().SerializeToString()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match="truncated or corrupt"):
        import_onnx(path, {"x": (1, 4)})


def test_missing_file(tmp_path):
    with pytest.raises(ModelLoadError, match="no such file"):
        import_onnx(tmp_path / "nope.onnx")


def test_every_unsupported_op_is_listed():
    m = _model(
        [
            h.make_node("MyCustomOp", ["x"], ["a"], domain="com.example", name="custom1"),
            h.make_node("MyCustomOp", ["a"], ["b"], domain="com.example", name="custom2"),
            h.make_node("Relu", ["b"], ["c"], name="fine"),
            h.make_node("Bernoulli", ["c"], ["y"], name="random"),
        ],
        [h.make_tensor_value_info("x", T.FLOAT, [2, 4])],
        [h.make_tensor_value_info("y", T.FLOAT, [2, 4])],
        domains=["com.example"],
    )
    with pytest.raises(UnsupportedOpError) as info:
        import_onnx(m)
    text = str(info.value)
    assert "com.example::MyCustomOp" in text and "custom1" in text and "custom2" in text
    assert "ai.onnx::Bernoulli" in text and "random" in text
    assert {u.op_type for u in info.value.ops} == {"MyCustomOp", "Bernoulli"}


def test_ops_inside_subgraphs_are_scanned():
    then = h.make_graph([h.make_node("Bernoulli", ["x"], ["t"], name="inner")], "then", [], [h.make_tensor_value_info("t", T.FLOAT, [2])])
    m = _model(
        [h.make_node("If", ["c"], ["y"], then_branch=then, else_branch=then, name="branch")],
        [h.make_tensor_value_info("c", T.BOOL, []), h.make_tensor_value_info("x", T.FLOAT, [2])],
        [h.make_tensor_value_info("y", T.FLOAT, [2])],
    )
    with pytest.raises(UnsupportedOpError) as info:
        import_onnx(m)
    assert "branch/then_branch/inner" in str(info.value)


def test_unbound_dynamic_dim_names_input_and_dim():
    with pytest.raises(ShapeError, match=r"input 'x' dim 0 \('batch'\) is dynamic"):
        import_onnx(_relu_model())


def test_binding_by_input_name_or_symbol():
    assert import_onnx(_relu_model(), {"x": (3, 4)}).inputs[0].type.shape == (3, 4)
    assert import_onnx(_relu_model(), {"batch": 5}).inputs[0].type.shape == (5, 4)


def test_bad_bindings():
    with pytest.raises(InputError, match="neither inputs"):
        import_onnx(_relu_model(), {"nope": (1, 4)})
    with pytest.raises(ShapeError, match="fixed at 4"):
        import_onnx(_relu_model(), {"x": (1, 5)})
    with pytest.raises(ShapeError, match="rank 2"):
        import_onnx(_relu_model(), {"x": (1, 4, 1)})


def test_wrong_feeds_are_named():
    g = import_onnx(_relu_model(), {"x": (2, 4)})
    with pytest.raises(InputError, match="missing input"):
        run_graph(g, {})
    with pytest.raises(InputError, match="unknown input"):
        run_graph(g, {"x": np.zeros((2, 4), np.float32), "z": 1})
    with pytest.raises(InputError, match="expected dtype float32, got float64"):
        run_graph(g, {"x": np.zeros((2, 4))})
    with pytest.raises(InputError, match=r"expected shape \[2, 4\], got \[3, 4\]"):
        run_graph(g, {"x": np.zeros((3, 4), np.float32)})


def test_invalid_model_fails_the_checker():
    m = _model([h.make_node("Relu", ["nowhere"], ["y"])], [], [h.make_tensor_value_info("y", T.FLOAT, [2])])
    with pytest.raises(ModelLoadError, match="not valid ONNX"):
        import_onnx(m)


def test_external_data_inside_folder_loads_and_escaping_path_is_refused(tmp_path):
    w = np.random.default_rng().standard_normal((4, 4)).astype(np.float32)
    m = _model(
        [h.make_node("MatMul", ["x", "w"], ["y"])],
        [h.make_tensor_value_info("x", T.FLOAT, [2, 4])],
        [h.make_tensor_value_info("y", T.FLOAT, [2, 4])],
        inits=[numpy_helper.from_array(w, "w")],
    )
    good = tmp_path / "good"
    good.mkdir()
    onnx.save_model(m, good / "m.onnx", save_as_external_data=True, location="w.bin", size_threshold=0)
    g = import_onnx(good / "m.onnx")
    x = np.random.default_rng().standard_normal((2, 4)).astype(np.float32)
    np.testing.assert_allclose(run_graph(g, {"x": x})["y"], x @ w, rtol=1e-6)

    evil = onnx.load(good / "m.onnx", load_external_data=False)
    for e in evil.graph.initializer[0].external_data:
        if e.key == "location":
            e.value = "../outside.bin"
    (tmp_path / "outside.bin").write_bytes((good / "w.bin").read_bytes())
    onnx.save_model(evil, good / "evil.onnx")
    with pytest.raises(ModelLoadError, match="outside the model's folder"):
        import_onnx(good / "evil.onnx")


def test_old_opset_is_upgraded():
    m = _model(
        [h.make_node("Relu", ["x"], ["r"]), h.make_node("Softmax", ["r"], ["y"], axis=1)],
        [h.make_tensor_value_info("x", T.FLOAT, [2, 3])],
        [h.make_tensor_value_info("y", T.FLOAT, [2, 3])],
        opset=9,
    )
    m.ir_version = 4
    g = import_onnx(m)
    assert g.opset == 13
    x = np.random.default_rng().standard_normal((2, 3)).astype(np.float32)
    y = run_graph(g, {"x": x})["y"]
    r = np.maximum(x, 0)
    want = np.exp(r) / np.exp(r).sum(1, keepdims=True)
    np.testing.assert_allclose(y, want, rtol=1e-5)


def test_opset9_linear_upsample_keeps_its_meaning_through_the_upgrade():
    import onnxruntime as ort

    scales = numpy_helper.from_array(np.array([1, 1, 2, 1.5], np.float32), "scales")
    m = _model(
        [h.make_node("Upsample", ["x", "scales"], ["y"], mode="linear")],
        [h.make_tensor_value_info("x", T.FLOAT, [1, 2, 3, 4])],
        [h.make_tensor_value_info("y", T.FLOAT, [1, 2, 6, 6])],
        inits=[scales],
        opset=9,
    )
    m.ir_version = 4
    x = np.random.default_rng().standard_normal((1, 2, 3, 4)).astype(np.float32)
    got = run_graph(import_onnx(m), {"x": x})["y"]
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_opset11_hardmax_keeps_its_flattening_meaning():
    import onnxruntime as ort

    m = _model(
        [h.make_node("Hardmax", ["x"], ["y"], axis=1)],
        [h.make_tensor_value_info("x", T.FLOAT, [2, 3, 4])],
        [h.make_tensor_value_info("y", T.FLOAT, [2, 3, 4])],
        opset=11,
    )
    x = np.random.default_rng().standard_normal((2, 3, 4)).astype(np.float32)
    got = run_graph(import_onnx(m), {"x": x})["y"]
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, want)


def test_corrupt_weight_data_is_a_clear_error():
    w = numpy_helper.from_array(np.random.default_rng().standard_normal((80, 80)).astype(np.float32), "w")
    w.raw_data = w.raw_data[:100]  # truncated tensor payload
    m = _model(
        [h.make_node("MatMul", ["x", "w"], ["y"])],
        [h.make_tensor_value_info("x", T.FLOAT, [2, 80])],
        [h.make_tensor_value_info("y", T.FLOAT, [2, 80])],
        inits=[w],
    )
    with pytest.raises(ModelLoadError, match="initializer 'w'|raw_data size"):
        import_onnx(m)


def _external(tensor, **fields):
    """``tensor`` with its data moved out to the external ``fields`` (location, offset...)."""
    t = onnx.TensorProto()
    t.CopyFrom(tensor)
    t.ClearField("raw_data")
    t.data_location = T.EXTERNAL
    for k, v in fields.items():
        entry = t.external_data.add()
        entry.key, entry.value = k, str(v)
    return t


def _matmul_model(w_tensor):
    return _model(
        [h.make_node("MatMul", ["x", "w"], ["y"])],
        [h.make_tensor_value_info("x", T.FLOAT, [2, 4])],
        [h.make_tensor_value_info("y", T.FLOAT, [2, 4])],
        inits=[w_tensor],
    )


def test_external_data_of_bytes_or_a_proto_needs_a_folder(tmp_path, monkeypatch):
    import tilefuse

    w = np.random.default_rng().standard_normal((4, 4)).astype(np.float32)
    (tmp_path / "w.bin").write_bytes(w.tobytes())
    m = _matmul_model(_external(numpy_helper.from_array(w, "w"), location="w.bin"))
    monkeypatch.chdir(tmp_path)  # the file is in the working directory: it must not be read from there
    for given in (m, m.SerializeToString()):
        with pytest.raises(ModelLoadError, match="no folder to read it from: pass external_data_dir"):
            import_onnx(given)
        with pytest.raises(ModelLoadError, match="external_data_dir"):
            tilefuse.compile(given)
    x = np.random.default_rng().standard_normal((2, 4)).astype(np.float32)
    g = import_onnx(m, external_data_dir=tmp_path)
    np.testing.assert_allclose(run_graph(g, {"x": x})["y"], x @ w, rtol=1e-6)
    assert m.graph.initializer[0].data_location == T.EXTERNAL  # the caller's proto is left alone
    plan = tilefuse.compile(m.SerializeToString(), external_data_dir=tmp_path)
    np.testing.assert_allclose(tilefuse.InferenceSession(plan).run(None, {"x": x})[0], x @ w, rtol=1e-5)


def test_external_data_dir_must_be_a_folder(tmp_path):
    with pytest.raises(ModelLoadError, match="is not a directory"):
        import_onnx(_relu_model(), external_data_dir=tmp_path / "nope")


@pytest.mark.parametrize("fields, message", [
    ({"location": "w.bin", "offset": "-8"}, "offset '-8' is not a non-negative integer"),
    ({"location": "w.bin", "offset": "abc"}, "offset 'abc' is not a non-negative integer"),
    ({"location": "w.bin", "length": "-1"}, "length '-1' is not a non-negative integer"),
    ({"location": "w\x00.bin"}, "contains a NUL byte"),
    ({"location": "w.bin", "length": "1000"}, r"1000 bytes from offset 0 run past the end of 'w.bin' \(64 bytes\)"),
    ({"location": "w.bin", "offset": "32", "length": "64"}, "run past the end"),
    ({"location": "w.bin", "offset": "65"}, "offset 65 is past the end"),
    ({"location": "."}, "'.' is not a regular file"),
    ({"location": "sub"}, "'sub' is not a regular file"),
    ({"location": "link.bin"}, "outside the model's folder"),
    ({"location": "/etc/passwd"}, "outside the model's folder"),
    ({"location": "gone.bin"}, "file 'gone.bin' is missing"),
    ({"offset": "0"}, "names no location"),
])
def test_bad_external_data_fields_are_clean_errors(tmp_path, fields, message):
    w = np.random.default_rng().standard_normal((4, 4)).astype(np.float32)
    folder = tmp_path / "model"
    (folder / "sub").mkdir(parents=True)
    (folder / "w.bin").write_bytes(w.tobytes())
    (tmp_path / "outside.bin").write_bytes(w.tobytes())
    (folder / "link.bin").symlink_to(tmp_path / "outside.bin")  # a symlink out of the folder
    path = folder / "m.onnx"
    path.write_bytes(_matmul_model(_external(numpy_helper.from_array(w, "w"), **fields)).SerializeToString())
    with pytest.raises(ModelLoadError, match=message):
        import_onnx(path)


def _sparse_constant_model(values):
    sparse = h.make_sparse_tensor(values, numpy_helper.from_array(np.array([0, 3], np.int64), "i"), [4])
    return _model(
        [h.make_node("Constant", [], ["c"], sparse_value=sparse), h.make_node("Add", ["x", "c"], ["y"])],
        [h.make_tensor_value_info("x", T.FLOAT, [4])],
        [h.make_tensor_value_info("y", T.FLOAT, [4])],
    )


def test_sparse_constants_and_subgraph_tensors_are_confined_like_initializers(tmp_path, monkeypatch):
    v = np.random.default_rng().standard_normal(2).astype(np.float32)
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "v.bin").write_bytes(v.tobytes())
    (tmp_path / "v.bin").write_bytes(v.tobytes())
    values = numpy_helper.from_array(v, "v")
    inside = _sparse_constant_model(_external(values, location="v.bin"))
    onnx.save(inside, folder / "m.onnx")
    x = np.random.default_rng().standard_normal(4).astype(np.float32)
    got = run_graph(import_onnx(folder / "m.onnx"), {"x": x})["y"]
    np.testing.assert_allclose(got, x + np.array([v[0], 0, 0, v[1]], np.float32), rtol=1e-6)

    monkeypatch.chdir(folder)
    with pytest.raises(ModelLoadError, match="tensor 'v' keeps its data in an external file"):
        import_onnx(inside)
    onnx.save(_sparse_constant_model(_external(values, location="../v.bin")), folder / "evil.onnx")
    with pytest.raises(ModelLoadError, match="outside the model's folder"):
        import_onnx(folder / "evil.onnx")

    # a weight of a Constant inside an If branch
    branch = h.make_graph(
        [h.make_node("Constant", [], ["t"], value=_external(values, location="../v.bin"))], "then", [],
        [h.make_tensor_value_info("t", T.FLOAT, [2])],
    )
    nested = _model(
        [h.make_node("If", ["cond"], ["y"], then_branch=branch, else_branch=branch)],
        [h.make_tensor_value_info("cond", T.BOOL, [])],
        [h.make_tensor_value_info("y", T.FLOAT, [2])],
    )
    onnx.save(nested, folder / "nested.onnx")
    with pytest.raises(ModelLoadError, match="tensor 'v'.*outside the model's folder"):
        import_onnx(folder / "nested.onnx")


@pytest.mark.parametrize("declared", [-1, -3])
def test_negative_dims_are_dynamic_as_in_onnxruntime(declared):
    import onnxruntime as ort

    m = _model(
        [h.make_node("Relu", ["x"], ["y"])],
        [h.make_tensor_value_info("x", T.FLOAT, [declared, 4])],
        [h.make_tensor_value_info("y", T.FLOAT, [declared, 4])],
    )
    with pytest.raises(ShapeError, match=rf"input 'x' dim 0 \(declared {declared}\) is dynamic; bind it, e.g. --shape x=N,4"):
        import_onnx(m)
    x = np.random.default_rng().standard_normal((3, 4)).astype(np.float32)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(run_graph(import_onnx(m, {"x": (3, 4)}), {"x": x})["y"], want)
    with pytest.raises(ShapeError, match="dim 1 is fixed at 4"):
        import_onnx(m, {"x": (3, 5)})


def test_a_zero_dim_is_fixed_as_in_onnxruntime():
    m = _model(
        [h.make_node("Relu", ["x"], ["y"])],
        [h.make_tensor_value_info("x", T.FLOAT, [0, 4])],
        [h.make_tensor_value_info("y", T.FLOAT, [0, 4])],
    )
    assert import_onnx(m).inputs[0].type.shape == (0, 4)
    with pytest.raises(ShapeError, match="dim 0 is fixed at 0, but 3 was given"):
        import_onnx(m, {"x": (3, 4)})


@pytest.mark.parametrize("shapes", [{"x": (-2, 4)}, {"batch": -1}, {"x": "ab"}, {"batch": 2.5}])
def test_bad_bound_sizes_are_shape_errors(shapes):
    with pytest.raises(ShapeError, match="must be non-negative integers"):
        import_onnx(_relu_model(), shapes)


def test_element_types_no_onnx_version_defines_are_clean_errors():
    bad_input = _model(
        [h.make_node("Relu", ["x"], ["y"])],
        [h.make_tensor_value_info("x", 99, [2])],
        [h.make_tensor_value_info("y", 99, [2])],
    )
    with pytest.raises(ModelLoadError, match="value 'x' has element type 99, which is no ONNX type"):
        import_onnx(bad_input)
    w = numpy_helper.from_array(np.ones(2, np.float32), "w")
    w.data_type = 99
    bad_weight = _model(
        [h.make_node("Add", ["x", "w"], ["y"])],
        [h.make_tensor_value_info("x", T.FLOAT, [2])],
        [h.make_tensor_value_info("y", T.FLOAT, [2])],
        inits=[w],
    )
    with pytest.raises(ModelLoadError, match="tensor 'w' has data type 99"):
        import_onnx(bad_weight)
    bad_cast = _model(
        [h.make_node("Cast", ["x"], ["y"], to=99, name="cast")],
        [h.make_tensor_value_info("x", T.FLOAT, [2])],
        [h.make_tensor_value_info("y", T.FLOAT, [2])],
    )
    with pytest.raises(UnsupportedOpError, match=r"Cast .* at cast \[element type 99 \(no ONNX type has this number\)\]"):
        import_onnx(bad_cast)


@pytest.mark.parametrize("model", [None, 5, {}, ["m.onnx"], "a" * 5000])
def test_what_is_not_a_model_is_a_clean_error(model):
    with pytest.raises(ModelLoadError):
        import_onnx(model)


def test_a_name_that_is_not_utf8_is_a_clean_error():
    """protobuf parses a string field of bytes that are not UTF-8 and fails only when it is
    read (deep in the checker or a converter): the loader reads every name once."""
    node = onnx.helper.make_node("Relu", ["x"], ["y"], name="relu_node")
    graph = onnx.helper.make_graph([node], "g", [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
                                   [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])])
    data = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)]).SerializeToString()
    at = data.index(b"relu_node")
    bad = data[:at] + b"\xff\xfe" + data[at + 2:]
    with pytest.raises(ModelLoadError, match="not valid UTF-8"):
        import_onnx(bad)
