"""InferenceSession: onnxruntime's interface, results against the reference executor,
input checks, fresh outputs, and concurrent runs from threads."""
import threading

import numpy as np
import pytest

from tilefuse.errors import InputError, PlanError
from tilefuse.reference import run_graph
from tilefuse.runtime import InferenceSession

from tests.plan.handmade import mlp_graph, mlp_plan, random_feeds, topk_plan


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mlp")
    graph, plan = mlp_plan(tmp / "build")
    return graph, InferenceSession(plan.save(tmp / "mlp.tfplan"))


@pytest.fixture(scope="module")
def topk(tmp_path_factory):
    graph, plan = topk_plan(tmp_path_factory.mktemp("topk"))
    return graph, InferenceSession(plan)  # in memory, never saved


def _check(graph, sess, seed):
    feeds = random_feeds(graph, seed)
    ref = run_graph(graph, feeds)
    got = sess.run(None, feeds)
    for out, array in zip(sess.get_outputs(), got):
        assert array.dtype == ref[out.name].dtype and array.shape == ref[out.name].shape
        np.testing.assert_allclose(array.astype(np.float64), ref[out.name].astype(np.float64), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed", range(3))
def test_matches_reference(mlp, topk, seed):
    _check(*mlp, seed)
    _check(*topk, seed)


def test_inputs_and_outputs(mlp):
    _, sess = mlp
    (x,) = sess.get_inputs()
    assert (x.name, x.shape, x.type) == ("x", [4, 8], "tensor(float)")
    outs = {o.name: (o.shape, o.type) for o in sess.get_outputs()}
    assert outs == {
        "h0": ([4, 16], "tensor(float)"), "h1": ([4, 8], "tensor(float)"),
        "x_again": ([4, 8], "tensor(float)"), "table": ([2, 3], "tensor(bfloat16)"),
    }


def test_output_selection_and_order(mlp):
    graph, sess = mlp
    feeds = random_feeds(graph)
    h1, h0 = sess.run(["h1", "h0"], feeds)
    assert h1.shape == (4, 8) and h0.shape == (4, 16)
    with pytest.raises(InputError, match=r"unknown output name\(s\) \['h2'\]"):
        sess.run(["h2"], feeds)


def test_outputs_are_fresh_arrays(mlp):
    graph, sess = mlp
    feeds = random_feeds(graph, 1)
    first = sess.run(None, feeds)
    kept = [a.copy() for a in first]
    sess.run(None, random_feeds(graph, 2))  # reuses the arena
    for a, b in zip(first, kept):
        assert np.array_equal(a, b) and a.flags.owndata and a.flags.writeable
    x_again = first[2]
    assert not np.shares_memory(x_again, feeds["x"])  # an input returned as output is a copy
    first[3][...] = 0  # neither is the constant: the plan's weight stays intact
    assert sess.run(["table"], feeds)[0].any()


def test_non_contiguous_feed(mlp):
    graph, sess = mlp
    x = random_feeds(graph)["x"]
    strided = np.asfortranarray(x)
    assert np.array_equal(sess.run(["h1"], {"x": strided})[0], sess.run(["h1"], {"x": x})[0])


@pytest.mark.parametrize(
    "feeds, message",
    [
        ({"y": np.zeros((4, 8), np.float32)}, r"unknown input name\(s\) \['y'\]"),
        ({}, r"missing input\(s\) \['x'\]"),
        ({"x": np.zeros((4, 8), np.float64)}, "input 'x': expected dtype float32, got float64"),
        ({"x": np.zeros((4, 9), np.float32)}, r"input 'x': expected shape \[4, 8\], got \[4, 9\]"),
        ({"x": np.zeros((1, 4, 8), np.float32)}, r"expected shape \[4, 8\], got \[1, 4, 8\]"),
    ],
)
def test_input_errors(mlp, feeds, message):
    with pytest.raises(InputError, match=message):
        mlp[1].run(None, feeds)


_X = np.zeros((4, 8), np.float32)


@pytest.mark.parametrize(
    "feeds, message",
    [
        (None, "feeds must be a dict of input name -> array, got NoneType"),
        ([_X], "feeds must be a dict of input name -> array, got list"),
        ((_X,), "feeds must be a dict of input name -> array, got tuple"),
        ({0: _X}, r"feed names must be input names \(strings\), got int 0"),
        ({0: _X, "x": _X}, r"feed names must be input names \(strings\), got int 0"),
        ({"x": "abc"}, r"input 'x': expected an array of float32\[4,8\], got str 'abc'"),
        ({"x": None}, r"input 'x': expected an array of float32\[4,8\], got NoneType"),
        ({"x": object()}, r"input 'x': expected an array of float32\[4,8\], got object"),
        ({"x": [[1.0, 2.0], [3.0]]}, r"input 'x': not an array of float32\[4,8\]"),
        ({"x": [[1.0] * 8] * 4}, r"expected dtype float32, got float64 \(from a Python list: pass np.asarray\(\.\.\., dtype=np.float32\)\)"),
        ({"x": [[1.0] * 8] * 3}, r"expected dtype float32, got float64"),
    ],
)
def test_feeds_that_are_not_a_dict_of_arrays(mlp, feeds, message):
    with pytest.raises(InputError, match=message):
        mlp[1].run(None, feeds)


@pytest.mark.parametrize(
    "names, message",
    [
        (5, "output_names must be a list of output names or None, got int 5"),
        ("h1", "output_names must be a list of output names or None, got str 'h1'"),
        ([5], r"unknown output name\(s\) \[5\]"),
        (["h1", "nope"], r"unknown output name\(s\) \['nope'\]; the plan's outputs are \['h0', 'h1', 'x_again', 'table'\]"),
    ],
)
def test_bad_output_names(mlp, names, message):
    graph, sess = mlp
    with pytest.raises(InputError, match=message):
        sess.run(names, random_feeds(graph))
    assert [a.shape for a in sess.run(("h1",), random_feeds(graph))] == [(4, 8)]  # any sequence of names


def test_plan_compiled_for_other_shapes(tmp_path):
    # The plan records the shapes it was compiled for: a batch of 2 is not a batch of 4.
    graph, plan = mlp_plan(tmp_path / "build", m=2)
    sess = InferenceSession(plan.save(tmp_path / "b2.tfplan"))
    with pytest.raises(InputError, match=r"input 'x': expected shape \[2, 8\], got \[4, 8\]"):
        sess.run(None, {"x": np.zeros((4, 8), np.float32)})


def test_unknown_target(tmp_path):
    _, plan = mlp_plan(tmp_path)
    plan.target = "tpu"
    with pytest.raises(PlanError, match="no runtime for target 'tpu'"):
        InferenceSession(plan)


@pytest.mark.parametrize("which", ["mlp", "topk"])
def test_concurrent_runs(mlp, topk, which):
    graph, sess = {"mlp": mlp, "topk": topk}[which]
    cases = [random_feeds(graph, seed) for seed in range(16)]
    expected = [run_graph(graph, f) for f in cases]
    names = [o.name for o in sess.get_outputs()]
    failures: list[str] = []
    start = threading.Barrier(8)

    def worker(t: int) -> None:
        start.wait()  # all threads run at once, so arenas are really in use together
        for r in range(30):
            i = (t * 5 + r) % len(cases)
            for name, got in zip(names, sess.run(None, cases[i])):
                want = expected[i][name]
                if not np.allclose(got.astype(np.float64), want.astype(np.float64), rtol=1e-5, atol=1e-5):
                    failures.append(f"thread {t} run {r}: case {i} output {name} wrong")

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures[:5]


def test_step_driver_and_its_fallback(tmp_path, monkeypatch):
    # Generated kernel libraries carry tf_run_steps; a plan without it (older plans, the
    # handmade kernels above) runs step by step. Both must give the reference's results.
    from tilefuse.compiler import compile_graph
    from tilefuse.target import get_target
    graph = mlp_graph(4, 8, 16)
    sess = InferenceSession(compile_graph(graph, get_target("cpu")).plan)
    assert sess._executor._driver is not None
    feeds = random_feeds(graph, 7)
    _check(graph, sess, 7)
    with_driver = sess.run(None, feeds)
    monkeypatch.setattr(sess._executor, "_driver", None)
    for a, b in zip(with_driver, sess.run(None, feeds)):
        assert np.array_equal(a, b)


def test_feeds_are_read_at_run_time(mlp):
    # Feeds are copied into the arena on each run, never remembered between runs.
    graph, sess = mlp
    x = random_feeds(graph, 3)["x"]
    first = sess.run(["h1"], {"x": x})[0]
    x += 1
    assert not np.array_equal(sess.run(["h1"], {"x": x})[0], first)
    np.testing.assert_allclose(sess.run(["h1"], {"x": x - 1})[0], first, rtol=1e-5, atol=1e-5)


def test_half_float_feeds_pass_the_checks():
    from tilefuse.feeds import check_feeds
    from tilefuse.ir.dtypes import DType
    from tilefuse.ir.types import TensorType

    for dtype in (DType.BFLOAT16, DType.FLOAT16):
        x = np.random.default_rng().standard_normal((2, 3)).astype(dtype.numpy)  # bfloat16's numpy kind is "V"
        got = check_feeds([("x", TensorType(dtype, (2, 3)))], {"x": x})["x"]
        assert got.dtype == dtype.numpy and np.array_equal(got, x)
