"""External-data cases: where a tensor's bytes live outside the .onnx file.

Every escape has a decoy holding the right bytes where the escape leads (outside the
model's folder, and in the working directory for relative reads of a model given as
bytes or as a proto): a loader that follows it compiles and gets onnxruntime's answer,
so following it shows up as "ran although it must fail", not as a lucky error.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.robustness.bases import INPUTS, lm_model
from tests.robustness.cases import Expect, ModelCase
from tests.robustness.gen_models import MODEL, rng_for

DATA = "weights.bin"
E, R, X, O = Expect.ERROR, Expect.RESULT, Expect.EITHER, Expect.ORT


def all_tensors(model: onnx.ModelProto) -> Iterator[TensorProto]:
    """Initializers, sparse initializers' values and every tensor held by an attribute,
    subgraphs included."""
    def graph(g: onnx.GraphProto) -> Iterator[TensorProto]:
        yield from g.initializer
        for s in g.sparse_initializer:
            yield s.values
        for node in g.node:
            for a in node.attribute:
                if a.HasField("t"):
                    yield a.t
                yield from a.tensors
                if a.HasField("sparse_tensor"):
                    yield a.sparse_tensor.values
                if a.HasField("g"):
                    yield from graph(a.g)
                for sub in a.graphs:
                    yield from graph(sub)
    yield from graph(model.graph)


def fill_locations(path: Path, work: str) -> None:
    """Put the case folder's absolute path where a location says ``{work}``."""
    model = onnx.load(str(path), load_external_data=False)
    for t in all_tensors(model):
        for entry in t.external_data:
            entry.value = entry.value.replace("{work}", work)
    path.write_bytes(model.SerializeToString())


def externalize(t: TensorProto, entries: list[tuple[str, str]]) -> bytes:
    """Make ``t`` external with ``entries`` (key, value); returns the bytes it held."""
    data = numpy_helper.to_array(t).tobytes()
    t.ClearField("raw_data")
    t.ClearField("float_data")
    t.ClearField("int64_data")
    t.data_location = TensorProto.EXTERNAL
    del t.external_data[:]
    for key, value in entries:
        e = t.external_data.add()
        e.key, e.value = key, value
    return data


def _emb(m: onnx.ModelProto) -> TensorProto:
    return next(t for t in m.graph.initializer if t.name == "emb")


def ext_case(name: str, expect: Expect, note: str, location: str = DATA, entries: list[tuple[str, str]] | None = None,
             data_path: str | None = "model/" + DATA, data: bytes | None = None, extra_files: tuple = (),
             links: tuple = (), fifos: tuple = (), entry: str = "path", **kw: Any) -> ModelCase:
    """``emb`` (2 KiB) stored externally at ``location`` (offset 0, its length), or with
    ``entries`` as given; the right bytes at ``data_path`` and at the decoys."""
    m = lm_model()
    raw = externalize(_emb(m), entries if entries is not None else [("location", location), ("offset", "0"),
                                                                      ("length", str(32 * 16 * 4))])
    blob = raw if data is None else data
    files = [(MODEL, m.SerializeToString()), ("outside/" + DATA, raw), ("cwd/" + DATA, raw), ("outside/values.bin", raw)]
    if data_path is not None:
        files.append((data_path, blob))
    files += list(extra_files)
    return ModelCase(f"extdata/{name}", "extdata", expect, note, files=tuple(files), links=tuple(links),
                     fifos=tuple(fifos), entry=entry, inputs=INPUTS["lm"], template="{work}" in repr(entries or location),
                     **kw)


def _n(raw: int) -> str:
    return str(raw)


def handmade() -> Iterator[ModelCase]:
    size = 32 * 16 * 4
    yield ext_case("control", R, "emb in weights.bin beside the model (control)")
    yield ext_case("control-subdir", R, "emb in data/weights.bin (control)", location="data/" + DATA, data_path="model/data/" + DATA)
    yield ext_case("control-proto-loaded", R, "a ModelProto from onnx.load with its external data loaded", entry="proto")
    yield ext_case("control-pathlib", R, "by pathlib.Path (control)", entry="pathlib")
    yield ext_case("dotdot", E, "location '../outside/weights.bin' (the right bytes are there)", location="../outside/" + DATA)
    yield ext_case("dotdot-deep", E, "location '../../../../../../../../etc/passwd'", location="../../../../../../../../etc/passwd",
                   entries=[("location", "../../../../../../../../etc/passwd"), ("length", "4")])
    yield ext_case("dotdot-inside", X, "location 'data/../weights.bin' (resolves inside)", location="data/../" + DATA,
                   extra_files=(("model/data/keep", b""),))
    yield ext_case("absolute-outside", E, "an absolute location outside the folder (the right bytes are there)",
                   location="{work}/outside/" + DATA)
    yield ext_case("absolute-inside", X, "an absolute location inside the model's folder", location="{work}/model/" + DATA)
    yield ext_case("absolute-dev-zero", E, "location '/dev/zero'", location="/dev/zero")
    yield ext_case("absolute-proc", E, "location '/proc/self/environ'", location="/proc/self/environ",
                   entries=[("location", "/proc/self/environ"), ("length", "8")])
    yield ext_case("symlink-out", E, "weights.bin is a symlink to a file outside the folder", data_path=None,
                   links=(("model/" + DATA, "{work}/outside/" + DATA),))
    yield ext_case("symlink-out-relative", E, "weights.bin is a relative symlink '../outside/weights.bin'", data_path=None,
                   links=(("model/" + DATA, "../outside/" + DATA),))
    yield ext_case("symlink-dir-out", E, "data/ is a symlink to a folder outside; location data/weights.bin",
                   location="data/" + DATA, data_path=None, links=(("model/data", "{work}/outside"),))
    yield ext_case("symlink-in", X, "weights.bin is a symlink to real.bin beside it", data_path="model/real.bin",
                   links=(("model/" + DATA, "real.bin"),))
    yield ext_case("symlink-loop", E, "weights.bin is a symlink to itself", data_path=None, links=(("model/" + DATA, DATA),))
    yield ext_case("symlink-dangling", E, "weights.bin is a dangling symlink", data_path=None, links=(("model/" + DATA, "nowhere.bin"),))
    yield ext_case("nul-in-name", E, "location 'weights.bin\\0../../x'", location=DATA + "\0../../x")
    yield ext_case("empty-location", E, "location ''", location="")
    yield ext_case("dot-location", E, "location '.'", location=".")
    yield ext_case("directory-location", E, "location 'data' (a folder)", location="data", extra_files=(("model/data/keep", b""),))
    yield ext_case("missing-file", E, "location 'nothere.bin'", location="nothere.bin")
    yield ext_case("no-location-key", E, "external data without a location entry", entries=[("offset", "0"), ("length", str(size))])
    yield ext_case("backslash", E, "location '..\\\\outside\\\\weights.bin' (a plain name on Linux; no such file)",
                   location="..\\outside\\" + DATA)
    yield ext_case("long-location", E, "a 5000-character location", location="a" * 5000)
    yield ext_case("home-location", E, "location '~/weights.bin'", location="~/" + DATA)
    yield ext_case("fifo", E, "location is a named pipe in the folder", data_path=None, fifos=("model/" + DATA,), timeout=20)
    yield ext_case("model-itself", O, "location 'model.onnx', the model's own bytes", entries=[("location", "model.onnx"), ("offset", "0"), ("length", str(size))],
                   extra_files=())
    for off in ("-8", "abc", "", "1e3", " 8", "99999999", str(2**63 - 1), str(2**64)):
        yield ext_case(f"offset-{off.strip() or 'empty'}", E, f"offset {off!r}",
                       entries=[("location", DATA), ("offset", off), ("length", str(size))])
    for length in ("-1", "abc", "0", str(size - 4), str(size + 4), str(2**40), str(2**64)):
        yield ext_case(f"length-{length}", E, f"length {length!r} (the tensor needs {size})",
                       entries=[("location", DATA), ("offset", "0"), ("length", length)],
                       data=None if length != str(size + 4) else None)
    yield ext_case("no-length", R, "offset 0, no length (the file is exactly the tensor)", entries=[("location", DATA), ("offset", "0")])
    yield ext_case("data-truncated", E, "weights.bin 100 bytes short", data=lm_emb_bytes()[:-100])
    yield ext_case("data-empty", E, "weights.bin empty", data=b"")
    yield ext_case("data-longer", X, "weights.bin with 100 extra bytes after the tensor (length given)", data=lm_emb_bytes() + b"\1" * 100)
    yield ext_case("offset-into-file", R, "emb at offset 4096 of a bigger file",
                   entries=[("location", DATA), ("offset", "4096"), ("length", str(size))], data=b"\7" * 4096 + lm_emb_bytes())
    yield ext_case("unknown-key", X, "an unknown external-data key 'checksum'",
                   entries=[("location", DATA), ("offset", "0"), ("length", str(size)), ("checksum", "deadbeef")])
    yield ext_case("duplicate-location", E, "two location entries: weights.bin, then ../outside/weights.bin",
                   entries=[("location", DATA), ("location", "../outside/" + DATA), ("length", str(size))])
    yield ext_case("bytes-entry", E, "compile(model bytes) of a model with external data (a decoy in the cwd)", entry="bytes")
    yield ext_case("proto-unloaded", E, "compile(onnx.load(..., load_external_data=False)) (a decoy in the cwd)",
                   entry="proto_unloaded")
    yield _raw_and_external()
    yield _constant_attribute("constant-external-dotdot", E, "../outside/" + DATA, "a Constant's value tensor at '../outside/weights.bin'")
    yield _constant_attribute("constant-external-inside", X, DATA, "a Constant's value tensor in weights.bin")
    yield _sparse_constant("sparse-external-dotdot", E, "../outside/values.bin", "a sparse Constant's values at '../outside/values.bin'")
    yield _sparse_constant("sparse-external-inside", X, "values.bin", "a sparse Constant's values in values.bin")
    yield _sparse_constant("sparse-external-absolute", E, "{work}/outside/values.bin", "a sparse Constant's values at an absolute path outside")


def lm_emb_bytes() -> bytes:
    return numpy_helper.to_array(_emb(lm_model())).tobytes()


def _raw_and_external() -> ModelCase:
    """External data entries and raw_data both present: which one is read is the
    loader's choice; both are the right bytes here, the result must match."""
    m = lm_model()
    t = _emb(m)
    raw = numpy_helper.to_array(t).tobytes()
    t.data_location = TensorProto.EXTERNAL
    for key, value in (("location", DATA), ("offset", "0"), ("length", str(len(raw)))):
        e = t.external_data.add()
        e.key, e.value = key, value
    return ModelCase("extdata/raw-and-external", "extdata", X, "emb with both raw_data and external data",
                     files=((MODEL, m.SerializeToString()), ("model/" + DATA, raw)), inputs=INPUTS["lm"])


def _constant_attribute(name: str, expect: Expect, location: str, note: str) -> ModelCase:
    m = lm_model()
    bias = next(t for t in m.graph.initializer if t.name == "bias")
    value = TensorProto()
    value.CopyFrom(bias)
    value.name = ""
    raw = externalize(value, [("location", location), ("offset", "0"), ("length", "64")])
    m.graph.initializer.remove(bias)
    m.graph.node.insert(0, helper.make_node("Constant", [], ["bias"], name="bias_const", value=value))
    files = ((MODEL, m.SerializeToString()), ("model/" + DATA, raw), ("outside/" + DATA, raw), ("cwd/" + DATA, raw))
    return ModelCase(f"extdata/{name}", "extdata", expect, note, files=files, inputs=INPUTS["lm"])


def _sparse_constant(name: str, expect: Expect, location: str, note: str) -> ModelCase:
    """bias as a sparse Constant whose values tensor is external."""
    m = lm_model()
    bias = next(t for t in m.graph.initializer if t.name == "bias")
    values = numpy_helper.from_array(np.array([1.5, -2.0, 0.25], np.float32), "bias_values")
    raw = externalize(values, [("location", location), ("offset", "0"), ("length", "12")])
    sparse = helper.make_sparse_tensor(values, numpy_helper.from_array(np.array([0, 5, 15], np.int64), ""), [16])
    m.graph.initializer.remove(bias)
    m.graph.node.insert(0, helper.make_node("Constant", [], ["bias"], name="bias_const", sparse_value=sparse))
    files = ((MODEL, m.SerializeToString()), ("model/values.bin", raw), ("outside/values.bin", raw), ("cwd/values.bin", raw))
    return ModelCase(f"extdata/{name}", "extdata", expect, note, files=files, inputs=INPUTS["lm"],
                     template="{work}" in location)


def data_flips(seed: int, count: int) -> list[ModelCase]:
    """A valid model whose external weights were changed: both read the same bytes."""
    out = []
    for i in range(count):
        rng = rng_for(seed, "extdata.flip", i)
        raw = bytearray(lm_emb_bytes())
        pos, mask = int(rng.integers(0, len(raw))), int(rng.integers(1, 256))
        raw[pos] ^= mask
        case = ext_case(f"flip@{pos}^{mask:#04x}", O, f"byte {pos} of weights.bin xor {mask:#04x}", data=bytes(raw))
        out.append(ModelCase(case.id.replace("extdata/", "extdata.flip/"), "extdata.flip", case.expect, case.note,
                             files=case.files, inputs=case.inputs))
    return out
