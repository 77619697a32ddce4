"""A plan's integrity (issue 15, items 3 and 5): corrupted weights, symbols that name other
functions, symlinks, kernels swapped after the check, names that escape the folder, and
manifests of any shape are each refused with a one-line PlanError.

A plan is native code, like a TensorRT engine; these checks guard against corruption and
accidents, not against a hostile author. Where a defect would crash the process (a kernel
replaced by one that aborts), the case runs in a subprocess, so a crash fails the test
instead of taking pytest down.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tilefuse.plan.files import write_manifest
from tilefuse.errors import PlanError
from tilefuse.plan import load_plan

from tests.plan.handmade import aborting_library, cuda_mlp_plan, mlp_plan, random_feeds, topk_plan

REPO = Path(__file__).resolve().parents[2]


def _python(code: str, *args: object, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter from the repository root (a crash shows as a
    negative return code, never as pytest dying)."""
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture
def saved(tmp_path):
    graph, plan = topk_plan(tmp_path / "build")
    return graph, plan.save(tmp_path / "model.tfplan")


def _manifest(path: Path) -> dict:
    return json.loads((path / "manifest.json").read_text())


def _write_manifest(path: Path, m: dict) -> None:
    write_manifest(path, m)


def _weights_layout(path: Path) -> tuple[int, dict]:
    """Where the tensor data starts in weights.safetensors, and its JSON header."""
    raw = (path / "weights.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return 8 + n, json.loads(raw[8 : 8 + n])


# -- weights -------------------------------------------------------------------------------

def test_flipped_bits_in_the_weights_are_refused(saved):
    _, path = saved
    start, _ = _weights_layout(path)
    raw = bytearray((path / "weights.safetensors").read_bytes())
    rng = np.random.default_rng(15)
    for bit in rng.choice((len(raw) - start) * 8, size=200, replace=False):
        raw[start + bit // 8] ^= 1 << (bit % 8)
    (path / "weights.safetensors").write_bytes(bytes(raw))
    with pytest.raises(PlanError, match=r"weights\.safetensors: sha256 .* the file was modified \(the weights\)"):
        load_plan(path)


def test_a_nan_written_into_the_weights_is_refused(saved):
    _, path = saved
    start, header = _weights_layout(path)
    begin, _ = header["w"]["data_offsets"]
    raw = bytearray((path / "weights.safetensors").read_bytes())
    raw[start + begin : start + begin + 4] = np.float32(np.nan).tobytes()
    (path / "weights.safetensors").write_bytes(bytes(raw))
    with pytest.raises(PlanError, match="the weights"):
        load_plan(path)


def test_weights_written_by_write_weights_load_and_plain_rewrites_do_not(saved):
    """Tools that carry a plan without its weights synthesise them where it runs
    (benchmarks/gpu_peers.py): write_weights records their hash, an editor that only
    replaces the file does not."""
    from safetensors.numpy import load_file, save_file

    from tilefuse.plan import write_weights

    _, path = saved
    weights = load_file(path / "weights.safetensors")
    rng = np.random.default_rng(1)
    other = {k: np.asarray(rng.standard_normal(v.shape) * 0.02, v.dtype) for k, v in weights.items()}
    save_file(other, path / "weights.safetensors")
    with pytest.raises(PlanError, match="the weights"):
        load_plan(path)
    write_weights(path, other)
    loaded = load_plan(path)
    assert all(np.array_equal(loaded.weights[k], v) for k, v in other.items())
    assert not list(path.glob(".*"))


# -- symbols and names -----------------------------------------------------------------------

@pytest.mark.parametrize("symbol", ["abort", "exit", "free", "tf_run_steps", "other"])
def test_the_manifest_symbol_must_be_the_kernels_own_entry(saved, symbol):
    _, path = saved
    m = _manifest(path)
    m["kernels"][0]["symbol"] = m["kernels"][1]["symbol"] if symbol == "other" else symbol
    _write_manifest(path, m)
    with pytest.raises(PlanError, match=r"kernels\[0\]\.symbol: .* is not the entry of kernel"):
        load_plan(path)


def test_a_plan_in_memory_cannot_call_abort(tmp_path):
    """A Plan built in memory never went through the manifest: the runtime checks the
    symbol itself. Before, ``abort`` was found in the kernel library's dependencies and
    called (a subprocess, since that kills the interpreter)."""
    code = """
import dataclasses, sys
from pathlib import Path
from tests.plan.handmade import mlp_plan, random_feeds
from tilefuse.errors import PlanError
from tilefuse.runtime import InferenceSession
graph, plan = mlp_plan(Path(sys.argv[1]))
name = next(iter(plan.kernels))
plan.kernels[name] = dataclasses.replace(plan.kernels[name], symbol="abort")
try:
    InferenceSession(plan).run(None, random_feeds(graph))
except PlanError as e:
    print("refused:", e)
"""
    done = _python(code, tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "refused:" in done.stdout and "symbol 'abort' is not its entry" in done.stdout


def test_an_entry_must_be_defined_by_the_kernel_library_itself(tmp_path):
    """dlsym searches a library's dependencies: libc's abort is found "in" any kernel
    library. The loader takes only what the library defines."""
    from tilefuse.runtime.native import NativeLibrary

    path = aborting_library(tmp_path, "k0_calls_libc_0123456789")  # it needs libc: libc is searched
    lib = NativeLibrary(path.read_bytes(), str(path))
    try:
        assert lib.function("k0_calls_libc_0123456789") is not None  # found, never called
        for name in ("abort", "free", "exit"):
            with pytest.raises(PlanError, match=rf"'{name}' is not defined by the kernel library but by .*libc"):
                lib.function(name)
        assert lib.function("no_such_symbol", required=False) is None
    finally:
        lib.close()


@pytest.mark.parametrize("name", ["../../escaped_0123456789", "kernels/../../x", "/tmp/abs", "a b", ""])
def test_kernel_names_that_are_not_plain_file_names_are_not_saved(tmp_path, name):
    _, plan = mlp_plan(tmp_path / "build")
    key = next(iter(plan.kernels))
    plan.kernels[key] = dataclasses.replace(plan.kernels[key], name=name)
    with pytest.raises(PlanError, match="is not a generated kernel name"):
        plan.save(tmp_path / "out" / "model.tfplan")
    assert not list(tmp_path.glob("**/escaped*")) and not (tmp_path / "out" / "model.tfplan").exists()


def test_manifest_kernel_names_that_escape_are_refused(saved):
    _, path = saved
    m = _manifest(path)
    m["kernels"][0]["name"] = "../" + m["kernels"][0]["name"]
    _write_manifest(path, m)
    with pytest.raises(PlanError, match=r"kernels\[0\]\.name: .* is not a generated kernel name"):
        load_plan(path)


# -- symlinks ------------------------------------------------------------------------------

@pytest.mark.parametrize("which", ["kernels", "a kernel", "weights.safetensors", "manifest.json"])
def test_symlinks_inside_the_plan_are_refused(saved, tmp_path, which):
    """The link points at an exact copy, so the hashes match: only the link is wrong."""
    _, path = saved
    target = {"kernels": path / "kernels", "a kernel": next((path / "kernels").iterdir()),
              "weights.safetensors": path / "weights.safetensors", "manifest.json": path / "manifest.json"}[which]
    elsewhere = tmp_path / "elsewhere" / target.name
    elsewhere.parent.mkdir()
    shutil.move(target, elsewhere)
    target.symlink_to(elsewhere)
    with pytest.raises(PlanError, match=f"{target.name}: a symbolic link"):
        load_plan(path)


def test_a_fifo_in_place_of_the_weights_does_not_hang(saved):
    _, path = saved
    (path / "weights.safetensors").unlink()
    os.mkfifo(path / "weights.safetensors")
    with pytest.raises(PlanError, match="weights.safetensors: not a regular file"):
        load_plan(path)


# -- what is loaded is what was checked --------------------------------------------------------

SWAP_AFTER_LOAD = """
import sys, shutil
from tilefuse.errors import PlanError
from tilefuse.plan import load_plan
from tilefuse.runtime import InferenceSession
plan = load_plan(sys.argv[1])
kernel = next(iter(plan.kernels.values()))
shutil.copyfile(sys.argv[2], kernel.path)   # same symbol, calls abort()
try:
    InferenceSession(plan)
except PlanError as e:
    print("refused:", e)
"""


def test_a_kernel_swapped_between_load_plan_and_the_session_is_refused(saved, tmp_path):
    _, path = saved
    kernel = next(iter(load_plan(path).kernels.values()))
    evil = aborting_library(tmp_path / "evil", kernel.symbol)
    done = _python(SWAP_AFTER_LOAD, path, evil)
    assert done.returncode == 0, f"the swapped kernel ran (exit {done.returncode}): {done.stderr[-2000:]}"
    assert "refused:" in done.stdout and "sha256" in done.stdout and "the file was modified" in done.stdout


OVERWRITE_AFTER_SESSION = """
import sys
import numpy as np
from safetensors.numpy import load_file
from tests.plan.handmade import topk_graph
from tilefuse.reference import run_graph
from tilefuse.runtime import InferenceSession
sess = InferenceSession(sys.argv[1])
feeds = load_file(sys.argv[3])
for kernel in sess.plan.kernels.values():
    with open(kernel.path, "r+b") as f:   # in place: a mapped file would change under the process
        f.write(open(sys.argv[2], "rb").read())
        f.truncate()
want = run_graph(topk_graph(), feeds)
for out, got in zip(sess.get_outputs(), sess.run(None, feeds)):
    np.testing.assert_allclose(got.astype(np.float64), want[out.name].astype(np.float64), rtol=1e-5, atol=1e-5)
print("ok")
"""


def test_a_session_runs_the_bytes_it_verified_not_the_file(saved, tmp_path):
    """Overwriting a plan's kernel in place after the session loaded it changes nothing:
    the session runs a private copy of the verified bytes. Before, the kernel library was
    the plan's file itself, mapped: rewriting it rewrote the running code (SIGBUS)."""
    from safetensors.numpy import save_file

    graph, path = saved
    kernel = next(iter(load_plan(path).kernels.values()))
    evil = aborting_library(tmp_path / "evil", kernel.symbol)
    save_file(random_feeds(graph, seed=3), tmp_path / "feeds.safetensors")
    done = _python(OVERWRITE_AFTER_SESSION, path, evil, tmp_path / "feeds.safetensors")
    assert done.returncode == 0 and "ok" in done.stdout, f"exit {done.returncode}: {done.stderr[-2000:]}"


# -- the manifest's schema and bounds ------------------------------------------------------------

def test_a_manifest_nested_100000_deep_is_a_plan_error(saved):
    _, path = saved
    m = _manifest(path)
    m["source_model_path"] = "__DEEP__"
    deep = "[" * 100_000 + "]" * 100_000
    for text in (deep, json.dumps(m).replace('"__DEEP__"', deep)):  # alone, and inside a valid manifest
        (path / "manifest.json").write_text(text)
        with pytest.raises(PlanError, match="manifest.json: nested too deeply"):
            load_plan(path)


def test_the_cli_prints_one_line_and_exits_2_for_a_deep_manifest(saved):
    _, path = saved
    (path / "manifest.json").write_text("{\"a\": " * 100_000 + "1" + "}" * 100_000)
    done = subprocess.run([sys.executable, "-m", "tilefuse", "run", str(path)], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert "nested too deeply" in done.stderr


def _edit(path: Path, edit) -> None:
    m = _manifest(path)
    edit(m)
    _write_manifest(path, m)


def _arena_buffer(m: dict) -> dict:
    return next(b for b in m["buffers"] if b["kind"] in ("intermediate", "output") and b["nbytes"])


@pytest.mark.parametrize("edit, message", [
    (lambda m: m.update(arena_bytes=10**23), r"arena_bytes: 100000000000000000000000 is outside \[0, "),
    (lambda m: m.update(arena_bytes=-1), r"arena_bytes: -1 is outside"),
    (lambda m: m.update(arena_bytes=m["arena_bytes"] * 1000), "its buffers take .* without any reuse"),
    (lambda m: m.update(arena_bytes="64"), "arena_bytes: expected int, got '64'"),
    (lambda m: m.update(arena_bytes=1e3), "arena_bytes: expected int, got 1000.0"),
    (lambda m: _arena_buffer(m).update(offset=-64), r"offset: expected an integer in \[0, .* got -64"),
    (lambda m: _arena_buffer(m).update(offset=m["arena_bytes"]), "ends past the arena"),
    (lambda m: _arena_buffer(m).update(offset=10**30), "offset: expected an integer"),
    (lambda m: m["buffers"][0].update(shape=[10**12, 10**12], nbytes=4 * 10**24), "is over .* bytes"),
    (lambda m: m["buffers"][0].update(shape=[1] * 100), r"shape: 100 items, at most 32"),
    (lambda m: m["buffers"][0].update(shape=[-4, 8]), r"shape: expected integers in \[0, "),
    (lambda m: m["buffers"][0].update(id=-1), r"buffers\[0\]\.id: -1 is outside"),
    (lambda m: m["buffers"][0].update(nbytes=None), r"buffers\[0\]\.nbytes: expected int, got None"),
    (lambda m: m["steps"][0].update(group="0"), r"steps\[0\]\.group: expected int"),
    (lambda m: m["kernels"][0].update(sha256="0" * 63), r"kernels\[0\]\.sha256: expected 64 lowercase hex"),
    (lambda m: m["kernels"][0].update(launch=[]), r"kernels\[0\]\.launch: expected dict, got \[\]"),
    (lambda m: m.update(weights_sha256=None), "weights_sha256: expected str, got None"),
    (lambda m: m.pop("weights_sha256"), "missing field 'weights_sha256'"),
    (lambda m: m.update(target="tpu"), "target: unknown target 'tpu'"),
    (lambda m: m.update(target=7), "target: expected str, got 7"),
    (lambda m: m.update(inputs={}), "inputs: expected list, got {}"),
    (lambda m: m["inputs"][0].update(buffer=2**80), r"inputs\[0\]\.buffer: .* is outside"),
    # StepFacts counts FLOPs and bytes in integers: a fraction is a corruption, not a fact.
    (lambda m: m["steps"][0]["facts"].update(flops=1.5), r"steps\[0\]\.facts\.flops: expected a non-negative integer"),
    (lambda m: m["steps"][0]["facts"].update(bytes=964.0), r"steps\[0\]\.facts\.bytes: expected a non-negative integer"),
    (lambda m: m["steps"][0]["facts"].update(estimated_seconds=-1.0), r"facts\.estimated_seconds: expected a non-negative"),
])
def test_absurd_sizes_and_wrong_types_are_plan_errors(saved, edit, message):
    _, path = saved
    _edit(path, edit)
    with pytest.raises(PlanError, match=message):
        load_plan(path)


# Every field of the manifest replaced by each of these (and removed): each load is a
# PlanError or a plan that verifies; each plan that loads runs or raises a TilefuseError.
FUZZ = r"""
import json, shutil, sys, traceback
from pathlib import Path
import numpy as np
from tilefuse.errors import PlanError, TilefuseError
from tilefuse.plan import load_plan
from tilefuse.plan.files import write_manifest
from tilefuse.runtime import InferenceSession

BAD = [None, True, -1, 0, 2**70, 10**23, 1.5, float("nan"), "x", "../x", [], [0], {}, [[[]]], {"a": 1}]
source, work, run = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] == "run"
original = json.loads((source / "manifest.json").read_text())
feeds = {i["name"]: np.random.default_rng(0).standard_normal(i["shape"]).astype(i["dtype"]) for i in original["inputs"]}

def paths(x, here=()):
    yield here
    if isinstance(x, dict):
        for k, v in x.items():
            yield from paths(v, here + (k,))
    elif isinstance(x, list):
        for i, v in enumerate(x[:2]):
            yield from paths(v, here + (i,))

def edited(path, value):
    m = json.loads(json.dumps(original))
    if not path:
        return value
    node = m
    for k in path[:-1]:
        node = node[k]
    if value is KeyError:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return m

shutil.copytree(source, work)
cases = loaded = 0
for path in list(paths(original)):
    for value in BAD + [KeyError]:
        if value is KeyError and not path:
            continue
        cases += 1
        write_manifest(work, edited(path, value))
        try:
            plan = load_plan(work)
        except PlanError as e:
            assert "\n" not in str(e), (path, value, str(e))
            continue
        except Exception:
            print("NOT A PlanError:", path, repr(value)); traceback.print_exc(); sys.exit(1)
        loaded += 1
        if run:
            try:
                with InferenceSession(plan) as sess:
                    sess.run(None, feeds)
            except TilefuseError:
                pass
            except Exception:
                print("RUN FAILED:", path, repr(value)); traceback.print_exc(); sys.exit(1)
print(f"{cases} cases, {loaded} loaded")
"""


def test_every_manifest_field_of_any_type_is_a_plan_error_or_loads(saved, tmp_path):
    _, path = saved
    done = _python(FUZZ, path, tmp_path / "fuzz.tfplan", "run", timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    cases, loaded = (int(w) for w in done.stdout.split()[::2][:2])
    assert cases > 1000 and loaded < cases // 10  # nearly every corruption is caught, not run


def test_every_cuda_manifest_field_of_any_type_is_a_plan_error_or_loads(tmp_path):
    """The CUDA runtime reads launch data (grid, block, TMA arguments): each field is
    checked at load, here with fake cubins (loading needs no GPU)."""
    _, plan = cuda_mlp_plan(tmp_path / "build")
    path = plan.save(tmp_path / "cuda.tfplan")
    done = _python(FUZZ, path, tmp_path / "fuzz.tfplan", "load", timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


@pytest.mark.parametrize("edit, message", [
    (lambda k: k["launch"].update(grid=[0, 1, 1]), r"launch\.grid: expected 3 dimensions"),
    (lambda k: k["launch"].update(grid=[1, 1]), r"launch\.grid: expected 3 dimensions"),
    (lambda k: k["launch"].update(block=[1024, 2, 1]), r"launch\.block: .* is over 1024 threads"),
    (lambda k: k["launch"].update(dynamic_smem=10**9), r"launch\.dynamic_smem: .* is outside"),
    (lambda k: k["launch"].update(entry="abort"), r"launch\.entry: 'abort' is not the kernel's symbol"),
    (lambda k: k["launch"]["args"][0].update(param=99), r"args\[0\]\.param: 99 is outside"),
    (lambda k: k["launch"]["args"][0].update(kind="tensormap", tma={"rank": 9}), r"tma\.rank: 9 is outside"),
    (lambda k: k["launch"]["args"][0].update(kind="tensormap", tma={"rank": 2, "dims": [4], "strides": [],
                                                                    "box": [1, 1], "element_strides": [1, 1]}),
     r"tma\.dims: expected 2 integers"),
    (lambda k: k["launch"]["args"][0].update(kind="texture"), r"args\[0\]\.kind: expected 'pointer' or 'tensormap'"),
    (lambda k: k.update(file="kernels/" + k["name"] + ".so"), r"file: .* must be the plan's own"),
])
def test_cuda_launch_data_is_checked_at_load(tmp_path, edit, message):
    _, plan = cuda_mlp_plan(tmp_path / "build")
    path = plan.save(tmp_path / "cuda.tfplan")
    _edit(path, lambda m: edit(m["kernels"][0]))
    with pytest.raises(PlanError, match=message):
        load_plan(path)


# -- loading runs no Python from the plan and reads nothing outside it --------------------------

AUDIT = r"""
import os, sys
from pathlib import Path
import numpy as np
from tilefuse.plan import load_plan
from tilefuse.runtime import InferenceSession
from tilefuse.runtime import native

first, second = Path(sys.argv[1]), Path(sys.argv[2]).resolve()
feeds = {"x": np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)}
with InferenceSession(first) as s:  # every import and private directory made once, before auditing
    s.run(None, feeds)
private = [Path(d).resolve() for d in native._dirs.values()]
events = []
sys.addaudithook(lambda event, args: events.append((event, args)) if event in (
    "open", "os.listdir", "os.scandir", "import", "exec", "compile", "ctypes.dlopen", "subprocess.Popen", "os.system") else None)
with InferenceSession(second) as s:
    s.run(None, feeds)
sys.addaudithook(lambda *a: None)
hooked = list(events)
plan_names = {"manifest.json", "manifest.sha256", "weights.safetensors", "kernels"} | {p.name for p in (second / "kernels").iterdir()}
for event, args in hooked:
    if event in ("open", "ctypes.dlopen"):
        name = args[0]
        if isinstance(name, int) or (event == "ctypes.dlopen" and name in native.OPENMP_RUNTIMES):
            continue  # an fd; a probe (RTLD_NOLOAD) for an OpenMP runtime already loaded, to pin it
        path = Path(os.fsdecode(name))
        if not path.is_absolute():  # opened relative to the plan's own directory handle
            assert path.name in plan_names and len(path.parts) == 1, (event, args)
            continue
        path = path.resolve()
        inside = path == second or second in path.parents or any(d in path.parents for d in private)
        assert inside, (event, args)
    else:
        raise AssertionError(f"{event} {args!r:.200}")
print("ok", len(hooked))
"""


def test_loading_runs_no_python_and_reads_only_the_plan(tmp_path):
    _, plan = mlp_plan(tmp_path / "build")
    first = plan.save(tmp_path / "first.tfplan")
    second = plan.save(tmp_path / "second.tfplan")
    done = _python(AUDIT, first, second)
    assert done.returncode == 0 and done.stdout.startswith("ok"), done.stdout[-2000:] + done.stderr[-2000:]
    assert int(done.stdout.split()[1]) >= 5  # the hook saw the plan's files being opened
