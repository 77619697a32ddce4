"""The CUDA execution provider inside onnxruntime, on the GPU machine.

    PYTHONPATH=. python tests/ort/gpu_ep_check.py build    # here: nvcc, tilelang, a C compiler
    PYTHONPATH=. python tests/ort/gpu_ep_check.py run      # there: numpy and onnxruntime only

``build`` exports tiny zoo models (bert, gpt2, llama, vit, mlp; float32 and float16) for
``cuda:sm_90a`` with ``export_ort`` (EPContext nodes for TilefuseCudaExecutionProvider,
cubins beside them), builds the provider library, and saves fresh random inputs with
plain onnxruntime's outputs on the original model (CPU), all under build/ort_gpu_ep/
(carry that folder to the GPU machine).

``build --real-bert`` adds bert-base (float16, batch 1, seq 128) as bert-base-float16. Its
200 MiB of weights are not carried: the model's large weights are replaced, before the
export, by values a fixed function of their name computes (``regenerate``, integer hashing
in numpy, the same on every machine), and ``run`` writes the export's weight file again
from that function (the compiler's joined sibling weights as concatenations of such
values), the offsets recorded in regen.json and the few small or folded
constants kept in carried.npz, each piece checked against its recorded SHA-256.

``run`` registers the carried library with the onnxruntime installed there (a CPU-only
build is enough: the provider brings its own device memory, allocator and copies), runs
every export in a session with the provider on the GPU, and compares with the saved
reference: max abs error within 1e-3 (float32) or 1e-2 (float16) times the output's
scale. It prints the hardware devices onnxruntime offers, a line per model and a
summary, writes the results as JSON to $OUT/ort_gpu_ep.json (else into the folder), and
exits 1 if a model fails. It imports no compiler, tilelang or torch.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
import zlib
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(REPO))
ROOT = REPO / "build" / "ort_gpu_ep"
LIBRARY = "libtilefuse_ep.so"
MODELS = ["bert", "gpt2", "llama", "vit", "mlp"]
DTYPES = ["float32", "float16"]
TOLERANCE = {"float32": 1e-3, "float16": 1e-2}  # relative to the output's scale (tilefuse.compare)
MAX_BYTES = 40 << 20
REGEN_BYTES = 64 << 10  # real-size weights at least this large are regenerated, not carried


def build(args) -> int:
    import onnxruntime as ort

    import models
    from models.reference import save_reference
    from tilefuse.ort import export_ort, get_library_path

    root = Path(args.root)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    shutil.copyfile(get_library_path(), root / LIBRARY)
    failed = 0
    for name in args.models:
        for dtype in args.dtypes:
            tag = f"{name}-{dtype}"
            t0 = time.perf_counter()
            try:
                shapes = models.ZOO[name].shapes("tiny")
                path = models.build(name, "tiny", dtype)
                result = export_ort(path, root / tag, "cuda:sm_90a", shapes, "ep")
                save_reference(path, shapes, root / f"{tag}.npz")
                print(f"{tag:18s} exported: {result.kernel_nodes} kernel nodes for {result.claimed_nodes} ONNX nodes, "
                      f"{len(result.kept)} kept by onnxruntime, {time.perf_counter() - t0:.1f} s", flush=True)
            except Exception as e:  # report every model, then fail
                failed += 1
                print(f"{tag:18s} FAILED: {type(e).__name__}: {str(e)[:1500]}", flush=True)
    if args.real_bert:
        t0 = time.perf_counter()
        try:
            build_real_bert(root)
            print(f"{'bert-base-float16':18s} exported, weights to regenerate, {time.perf_counter() - t0:.1f} s")
        except Exception as e:
            failed += 1
            print(f"bert-base-float16  FAILED: {type(e).__name__}: {str(e)[:1500]}", flush=True)
    size = sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    (root / "manifest.json").write_text(json.dumps({"commit": commit, "built": time.strftime("%Y-%m-%d %H:%M:%S"),
                                                    "onnxruntime": ort.__version__, "bytes": size}, indent=1))
    print(f"{root}: {size / 2**20:.1f} MiB")
    if size > MAX_BYTES:
        print(f"more than {MAX_BYTES >> 20} MiB to carry")
        return 1
    return 1 if failed else 0


def regenerate(name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """Weights in [-0.03, 0.03) from the tensor's name alone: splitmix64 over the element
    index in numpy's wrapping uint64 arithmetic, so every numpy computes the same bits."""
    n = int(np.prod(shape, dtype=np.int64))
    x = np.arange(n, dtype=np.uint64) + np.uint64(zlib.crc32(name.encode()) * 0x9E3779B97F4A7C15 % 2**64)
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    u = (x >> np.uint64(40)).astype(np.float32) * np.float32(2.0**-24)
    return ((u - np.float32(0.5)) * np.float32(0.06)).astype(dtype).reshape(shape)


def build_real_bert(root: Path) -> None:
    """bert-base float16 with regenerable weights: the export, without its weight file,
    and the recipe to write that file again (see the module doc)."""
    import onnx
    from onnx import numpy_helper

    import models
    from models.reference import save_reference
    from tilefuse.ort import export_ort

    tag, shapes = "bert-base-float16", models.ZOO["bert"].shapes("real")
    model = onnx.load(str(models.build("bert", "real", "float16")))
    regenerated = {}
    for init in model.graph.initializer:
        a = numpy_helper.to_array(init)
        if a.dtype.kind == "f" and a.nbytes >= REGEN_BYTES:
            a = regenerate(init.name, a.shape, a.dtype)
            init.CopyFrom(numpy_helper.from_array(a, init.name))
            regenerated[hashlib.sha256(a.tobytes()).hexdigest()] = (init.name, a.dtype.str, list(a.shape))
    source = root / "bert-base-source.onnx"
    onnx.save(model, str(source))
    try:
        export_ort(source, root / tag, "cuda:sm_90a", shapes, "ep")
        save_reference(source, shapes, root / f"{tag}.npz")
    finally:
        source.unlink()
    folder = root / tag
    exported = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    weights = (folder / "model.weights").read_bytes()
    pieces, carried = [], {}
    for init in exported.graph.initializer:
        ext = {e.key: e.value for e in init.external_data}
        if not ext:
            continue
        offset, length = int(ext.get("offset", 0)), int(ext["length"])
        data = weights[offset:offset + length]
        digest = hashlib.sha256(data).hexdigest()
        piece = {"offset": offset, "length": length, "sha256": digest}
        if digest in regenerated:
            piece["regenerate"], piece["dtype"], piece["shape"] = regenerated[digest]
        elif (parts := sibling_parts(data, list(init.dims), regenerated.values())) is not None:
            piece["concat"] = parts  # sibling weights joined on their last axis by the compiler
        else:
            piece["carried"] = key = f"c{len(carried)}"
            carried[key] = np.frombuffer(data, np.uint8)
        pieces.append(piece)
    np.savez(folder / "carried.npz", **carried)
    (folder / "regen.json").write_text(json.dumps({"file": "model.weights", "size": len(weights), "pieces": pieces}))
    (folder / "model.weights").unlink()


def sibling_parts(data: bytes, dims: list, regenerated) -> list | None:
    """The regenerated weights whose concatenation on the last axis is ``data`` (a 2-D
    initializer of ``dims``), in order, or None. The compiler joins sibling MatMuls'
    weights (query, key and value) that way; carrying those would carry most of the model."""
    if len(dims) != 2:
        return None
    rows, width = dims
    candidates = [(name, np.dtype(dt), shape) for name, dt, shape in regenerated
                  if len(shape) == 2 and shape[0] == rows]
    if not candidates:
        return None
    itemsize = candidates[0][1].itemsize
    if len(data) != rows * width * itemsize:
        return None
    first_row = data[:width * itemsize]
    parts, pos = [], 0
    while pos < len(first_row):
        for name, dt, shape in candidates:
            n = shape[1] * dt.itemsize
            if dt.itemsize == itemsize and pos + n <= len(first_row) \
                    and regenerate(name, (1, shape[1]), dt).tobytes() == first_row[pos:pos + n]:
                parts.append([name, dt.str, shape])
                pos += n
                break
        else:
            return None
    whole = np.concatenate([regenerate(n, tuple(s), np.dtype(d)) for n, d, s in parts], axis=1)
    return parts if whole.tobytes() == data else None


def write_weights(folder: Path) -> None:
    """Write the weight file of a --real-bert export from regen.json (once)."""
    recipe = json.loads((folder / "regen.json").read_text())
    target = folder / recipe["file"]
    if target.is_file() and target.stat().st_size == recipe["size"]:
        return
    carried = np.load(folder / "carried.npz")
    buf = bytearray(recipe["size"])
    for piece in recipe["pieces"]:
        if "carried" in piece:
            data = carried[piece["carried"]].tobytes()
        elif "concat" in piece:
            data = np.concatenate([regenerate(n, tuple(s), np.dtype(d)) for n, d, s in piece["concat"]],
                                  axis=1).tobytes()
        else:
            data = regenerate(piece["regenerate"], tuple(piece["shape"]), np.dtype(piece["dtype"])).tobytes()
        if hashlib.sha256(data).hexdigest() != piece["sha256"]:
            raise RuntimeError(f"{folder.name}: regenerated weights at offset {piece['offset']} differ from the export's")
        buf[piece["offset"]:piece["offset"] + piece["length"]] = data
    tmp = target.with_suffix(".tmp")
    tmp.write_bytes(bytes(buf))
    tmp.replace(target)


def run_one(ort, folder: Path, library: Path, repeats: int) -> dict:
    from models.reference import load_reference
    from tilefuse.compare import compare_output
    from tilefuse.ort import session_options

    if (folder / "regen.json").is_file():
        write_weights(folder)
    data = np.load(folder.parent / f"{folder.name}.npz")
    feeds, expected = load_reference(data)
    t0 = time.perf_counter()
    sess = ort.InferenceSession(str(folder / "model.onnx"), session_options(target="cuda", library=library))
    created = time.perf_counter() - t0
    got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    tol = TOLERANCE[folder.name.rsplit("-", 1)[1]]
    checks = [compare_output(n, got[n], w, tol) for n, w in expected.items()]
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        sess.run(None, feeds)
        times.append(time.perf_counter() - t)
    return {"ok": all(c.ok for c in checks), "session_s": round(created, 3),
            "run_ms": round(1e3 * sorted(times)[len(times) // 2], 3) if times else None,
            "outputs": [{"name": c.name, "max_abs_error": c.max_abs_error, "scale": c.scale,
                         "relative_error": c.relative_error, "problem": c.problem} for c in checks]}


def run(args) -> int:
    import onnxruntime as ort

    from tilefuse.ort import CUDA_EP_NAME, hardware_devices, register

    root = Path(args.root)
    library = root / LIBRARY
    report: dict = {"onnxruntime": ort.__version__, "providers": ort.get_available_providers(), "models": {}}
    print(f"onnxruntime {ort.__version__}, providers {report['providers']}")
    try:
        register(library=library)
        report["hardware_devices"] = hardware_devices()
        report["ep_devices"] = [f"{d.ep_name} on {d.device.type.name} vendor 0x{d.device.vendor_id:04x}"
                                for d in ort.get_ep_devices()]
    except Exception as e:
        report["error"] = f"registering {library}: {type(e).__name__}: {e}"
    for line in report.get("hardware_devices", []):
        print(f"  onnxruntime offers: {line}")
    for line in report.get("ep_devices", []):
        print(f"  provider device: {line}")
    if not any(CUDA_EP_NAME in d for d in report.get("ep_devices", [])):
        print(f"  no device for {CUDA_EP_NAME}")
    folders = sorted(p for p in root.iterdir() if p.is_dir() and (p / "model.onnx").is_file())
    failed = 0
    for folder in folders:
        try:
            result = run_one(ort, folder, library, args.repeats)
            detail = " ".join(f"{o['name']}:{o['relative_error']:.1e}" + (f" ({o['problem']})" if o["problem"] else "")
                              for o in result["outputs"])
            detail += f"  run {result['run_ms']} ms" if result["run_ms"] is not None else ""
        except Exception as e:
            result = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-2000:]}
            detail = result["error"][:800]
        report["models"][folder.name] = result
        failed += not result["ok"]
        print(f"{folder.name:18s} {'ok' if result['ok'] else 'FAILED':7s} {detail}", flush=True)
    summary = f"{len(folders) - failed}/{len(folders)} exports match onnxruntime (CPU) through {CUDA_EP_NAME}"
    report["summary"] = summary
    print(summary)
    out = Path(os.environ["OUT"]) if os.environ.get("OUT") else root
    out.mkdir(parents=True, exist_ok=True)
    (out / "ort_gpu_ep.json").write_text(json.dumps(report, indent=1))
    return 1 if failed or not folders or "error" in report else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="export the models and save references (here)")
    b.add_argument("--models", nargs="+", default=MODELS)
    b.add_argument("--dtypes", nargs="+", default=DTYPES)
    b.add_argument("--root", default=str(ROOT))
    b.add_argument("--real-bert", action="store_true",
                   help="also bert-base float16 (batch 1, seq 128), its weights regenerated by run")
    r = sub.add_parser("run", help="run them in onnxruntime with the CUDA provider (on the GPU machine)")
    r.add_argument("--root", default=str(ROOT))
    r.add_argument("--repeats", type=int, default=10, help="timed runs per model after the checked one")
    args = ap.parse_args()
    return build(args) if args.cmd == "build" else run(args)


if __name__ == "__main__":
    sys.exit(main())
