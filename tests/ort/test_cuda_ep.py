"""The CUDA execution provider without a GPU.

onnxruntime offers plugin providers the GPUs it finds in /sys/class/drm; the provider
takes NVIDIA ones (or, when onnxruntime offers none, the CUDA driver's device 0 paired
with the CPU hardware device). Here there is no GPU and no driver, so these tests use
two stand-ins, each in a child process: a private mount namespace whose /sys/class/drm
shows one NVIDIA card (skipped where mounts are not allowed), and a fake libcuda.so.1
(fake_libcuda.c: host memory, memcpy, and CPU kernels launched as if they were cubins).
With the fake driver, CPU exports relabelled as CUDA run through everything onnxruntime
does with a GPU provider (device allocator, copies in and out, placing initializers,
copies around the nodes it keeps) and must match plain onnxruntime; the check script
that runs on the GPU machine (gpu_ep_check.py run) is what runs them.
"""
import ctypes
import ctypes.util
import glob
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import tilefuse.ort
from tests.ort.helpers import as_fake_cuda, mixed_model
from tilefuse.errors import TilefuseError
from tilefuse.ort import CUDA_EP_NAME, export_ort

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
CHECK = HERE / "gpu_ep_check.py"
no_driver = pytest.mark.skipif(ctypes.util.find_library("cuda") is not None, reason="a CUDA driver is installed here")


@pytest.fixture(scope="module")
def fake_sysfs(tmp_path_factory) -> Path:
    """A /sys/class with one NVIDIA card under drm (an H200's ids), as onnxruntime reads it."""
    root = tmp_path_factory.mktemp("sysclass")
    pci = root / "pci" / "0000:01:00.0"
    pci.mkdir(parents=True)
    (pci / "vendor").write_text("0x10de\n")
    (pci / "device").write_text("0x2335\n")
    (root / "drm" / "card0").mkdir(parents=True)
    (root / "drm" / "card0" / "device").symlink_to(pci)
    probe = subprocess.run(["unshare", "-m", "sh", "-c", f"mount --bind {root} /sys/class && ls /sys/class/drm"],
                           capture_output=True, text=True)
    if probe.returncode != 0 or "card0" not in probe.stdout:
        pytest.skip(f"cannot mount a stand-in /sys/class here: {probe.stderr.strip()[:200]}")
    return root


def _child(code: str, sysfs: Path | None = None, driver: Path | None = None, python: str = sys.executable,
           args: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    if driver is not None:
        env["LD_LIBRARY_PATH"] = str(driver)
        env["TF_FAKE_CUDA_LOG"] = str(driver / "calls.log")
    cmd = [python, "-c", code, *args]
    if sysfs is not None:
        cmd = ["unshare", "-m", "sh", "-c", f'mount --bind {sysfs} /sys/class && exec "$@"', "sh", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)


def _calls(driver: Path) -> dict[str, int]:
    log = driver / "calls.log"
    words = log.read_text().split() if log.exists() else []
    log.unlink(missing_ok=True)
    return {w: words.count(w) for w in set(words)}


# ------------------------------------------------------------------ registration, no driver

@no_driver
def test_no_gpu_and_no_driver_lists_no_cuda_device():
    so = tilefuse.ort.session_options()  # the CPU provider, from the same library, is unaffected
    assert so is not None
    assert not [d for d in ort.get_ep_devices() if d.ep_name == CUDA_EP_NAME]
    with pytest.raises(TilefuseError, match=r"no device for TilefuseCudaExecutionProvider.*Hardware devices "
                                            r"onnxruntime offers: CPU vendor"):
        tilefuse.ort.session_options(target="cuda")


SESSION = r"""
import sys, onnxruntime as ort, tilefuse.ort as t
t.register()
print("offered:", t.hardware_devices())
print("devices:", [(d.ep_name, d.device.type.name, d.device.vendor_id) for d in ort.get_ep_devices()])
so = t.session_options(target="cuda")
try:
    ort.InferenceSession(sys.argv[1], so)
    print("SESSION CREATED")
except Exception as e:
    print("ERROR:", e)
"""


@no_driver
def test_gpu_without_driver_is_an_error_status(fake_sysfs, exports, tmp_path):
    """onnxruntime offers the (stand-in) NVIDIA GPU: the provider takes it, and creating a
    session fails with onnxruntime's error carrying tilefuse's reason, not a crash."""
    _, result = exports("mlp", "ep")
    model = as_fake_cuda(result.model_path.parent, tmp_path / "mlp") / "model.onnx"
    done = _child(SESSION, sysfs=fake_sysfs, args=(str(model),))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "GPU vendor 0x10de" in done.stdout
    assert f"('{CUDA_EP_NAME}', 'GPU', 4318)" in done.stdout
    assert ("ERROR: " in done.stdout and f"tilefuse: {CUDA_EP_NAME}: cannot open the CUDA driver (libcuda.so.1)"
            in done.stdout), done.stdout


# ------------------------------------------------------------------ slots

EP_SLOTS = r"""
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
class Base(ctypes.Structure):
    _fields_ = [("GetApi", ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_uint32)),
                ("GetVersionString", ctypes.CFUNCTYPE(ctypes.c_char_p))]
lib.OrtGetApiBase.restype = ctypes.POINTER(Base)
api = ctypes.cast(lib.OrtGetApiBase().contents.GetApi(23), ctypes.POINTER(ctypes.c_void_p))
fn = lambda table, i, *sig: ctypes.CFUNCTYPE(*sig)(table[i])
VP, U32, I = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int
info = VP()
status = fn(api, 320, VP, ctypes.c_char_p, I, U32, ctypes.c_int32, I, ctypes.c_size_t, I, ctypes.POINTER(VP))(
    b"TilefuseCuda", 1, 0x10de, 3, 0, 0, 0, ctypes.byref(info))  # CreateMemoryInfo_V2
assert not status and info
ep = ctypes.cast(fn(api, 317, VP)(), ctypes.POINTER(ctypes.c_void_p))  # GetEpApi
device = fn(ep, 6, VP, VP)(info)  # MemoryInfo_GetMemoryDevice
assert device
print(fn(ep, 9, I, VP)(device), fn(ep, 10, I, VP)(device), fn(ep, 11, U32, VP)(device), fn(ep, 12, U32, VP)(device),
      fn(ep, 8, ctypes.c_bool, VP, VP)(device, device))
fn(api, 94, None, VP)(info)  # ReleaseMemoryInfo
"""


def test_memory_slots_match_the_installed_onnxruntime():
    """The OrtApi and OrtEpApi slots the CUDA provider's memory code calls, on
    onnxruntime's own library: a GPU memory info made through CreateMemoryInfo_V2 reads
    back as GPU, DEFAULT memory, NVIDIA, device 3 through the EP API's MemoryDevice_*."""
    libs = glob.glob(os.path.join(os.path.dirname(ort.__file__), "capi", "libonnxruntime.so*"))
    if not libs:
        pytest.skip("this onnxruntime wheel ships no libonnxruntime.so")
    done = subprocess.run([sys.executable, "-c", EP_SLOTS, libs[0]], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "0", str(0x10DE), "3", "True"]


# ------------------------------------------------------------------ end to end, fake driver

@pytest.fixture(scope="module")
def fake_exports(exports, tmp_path_factory):
    """A gpu_ep_check.py folder: CPU exports of some zoo models and of the mixed model,
    relabelled for the CUDA provider, with references and the provider library."""
    root = tmp_path_factory.mktemp("ort_gpu_ep")
    shutil.copyfile(tilefuse.ort.get_library_path(), root / "libtilefuse_ep.so")
    rng = np.random.default_rng(0)
    for name in ("mlp", "bert", "gpt2"):
        path, result = exports(name, "ep")
        as_fake_cuda(result.model_path.parent, root / f"{name}-float32")
        import models

        feeds = models.random_inputs(path, models.ZOO[name].shapes("tiny"), seed=int(rng.integers(2**31)))
        _save(root / f"{name}-float32.npz", path, feeds)
    mixed = root.parent / "mixed.onnx"
    onnx.save(mixed_model(), str(mixed))
    export_ort(mixed, root.parent / "mixed-cpu", "cpu", {"batch": 2})
    as_fake_cuda(root.parent / "mixed-cpu", root / "mixed-float32")
    _save(root / "mixed-float32.npz", mixed, {"x": rng.standard_normal((2, 3, 3)).astype(np.float32)})
    return root


def _save(out: Path, model: Path, feeds: dict) -> None:
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    np.savez(out, **{f"in:{k}": v for k, v in feeds.items()}, **{f"out:{k}": v for k, v in zip(names, sess.run(names, feeds))})


RUN_CHECK = "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"


def _run_check(root: Path, driver: Path, sysfs: Path | None = None, python: str = sys.executable):
    done = _child(RUN_CHECK, sysfs=sysfs, driver=driver, python=python,
                  args=(str(CHECK), "run", "--root", str(root), "--repeats", "1"))
    report = json.loads((root / "ort_gpu_ep.json").read_text()) if (root / "ort_gpu_ep.json").exists() else {}
    return done, report


@pytest.mark.parametrize("devices", ["none offered", "drm"])
def test_check_script_with_the_fake_driver(devices, fake_exports, fake_driver, request):
    """Where onnxruntime offers no GPU (this machine; the provider pairs the driver's GPU
    with the CPU hardware device) and where it offers one (the stand-in /sys/class/drm),
    every model runs through the provider's allocator, copies and launches and matches."""
    sysfs = request.getfixturevalue("fake_sysfs") if devices == "drm" else None
    done, report = _run_check(fake_exports, fake_driver, sysfs)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "4/4 exports match" in done.stdout
    assert all(r["ok"] for r in report["models"].values())
    assert any(CUDA_EP_NAME in d and ("GPU" if sysfs else "CPU") in d for d in report["ep_devices"])
    calls = _calls(fake_driver)
    # every kernel node launched (checked run + one timed run each), weights and inputs
    # copied in, outputs copied out, device memory allocated and given back
    nodes = sum(1 for f in (fake_exports).glob("*/model.onnx")
                for n in onnx.load(str(f), load_external_data=False).graph.node if n.op_type == "EPContext")
    assert calls["launch"] == 2 * nodes
    assert calls["htod"] > 0 and calls["dtoh"] > 0 and calls["alloc"] == calls["free"] > 0
    # on onnxruntime's compute streams (the provider's own, non-blocking), never the legacy
    # default stream: every launch, and the copies of inputs and outputs around them
    assert calls["stream"] >= 1 and calls.get("legacy-launch", 0) == 0 and calls["async"] > 0
    assert calls["stream"] == calls["stream-freed"] and calls.get("event", 0) == calls.get("event-freed", 0)


ORT_130 = os.environ.get("TILEFUSE_ORT130_PYTHON", "/tmp/ort130g/bin/python")


@pytest.mark.skipif(not os.path.exists(ORT_130), reason="no onnxruntime 1.30 venv (TILEFUSE_ORT130_PYTHON)")
def test_check_script_on_onnxruntime_130(fake_exports, fake_driver):
    """The GPU machine's onnxruntime (1.30, CPU-only build), with the fake driver."""
    done, report = _run_check(fake_exports, fake_driver, python=ORT_130)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert report["onnxruntime"].startswith("1.30") and "4/4 exports match" in report["summary"]
    _calls(fake_driver)


def test_real_bert_weights_are_rewritten_from_their_names(tmp_path):
    """gpu_ep_check's --real-bert recipe: regenerated pieces, a carried one, each checked."""
    import hashlib

    from tests.ort import gpu_ep_check as check

    a = check.regenerate("encoder.layer.0.attention.self.query.weight", (64, 48), np.dtype(np.float16))
    assert a.dtype == np.float16 and 0 < np.abs(a).max() <= 0.03
    assert np.array_equal(a, check.regenerate("encoder.layer.0.attention.self.query.weight", (64, 48), np.float16))
    assert not np.array_equal(a, check.regenerate("other", (64, 48), np.float16))
    small = np.arange(10, dtype=np.float32)
    blob = a.tobytes() + small.tobytes()
    pieces = [{"offset": 0, "length": a.nbytes, "sha256": hashlib.sha256(a.tobytes()).hexdigest(),
               "regenerate": "encoder.layer.0.attention.self.query.weight", "dtype": a.dtype.str, "shape": [64, 48]},
              {"offset": a.nbytes, "length": small.nbytes, "sha256": hashlib.sha256(small.tobytes()).hexdigest(),
               "carried": "c0"}]
    np.savez(tmp_path / "carried.npz", c0=np.frombuffer(small.tobytes(), np.uint8))
    (tmp_path / "regen.json").write_text(json.dumps({"file": "model.weights", "size": len(blob), "pieces": pieces}))
    check.write_weights(tmp_path)
    assert (tmp_path / "model.weights").read_bytes() == blob
    pieces[1]["sha256"] = "0" * 64
    (tmp_path / "regen.json").write_text(json.dumps({"file": "model.weights", "size": len(blob), "pieces": pieces}))
    (tmp_path / "model.weights").unlink()
    with pytest.raises(RuntimeError, match="differ from the export's"):
        check.write_weights(tmp_path)
