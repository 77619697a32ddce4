"""Sessions give back what they take on a real GPU (issue 15, item 7): device memory,
modules, streams, graphs and the primary context, and the host's library mappings.

    python benchmarks/gpu_session_resources.py pack            # here: tiny mlp and bert plans for cuda:sm_90a
    python benchmarks/gpu_session_resources.py run [--sessions 100]   # on the GPU machine

``run`` opens, runs and closes ``--sessions`` sessions on each packed plan (a third each
through close(), a with block and the finaliser of a dropped session) and compares the
device's free memory (cuMemGetInfo, under a context the script itself keeps) and the
lines of /proc/self/maps before and after; then checks that a run after close is an
ExecutionError and, with torch, that a GPU output stays readable after its session
closed and is freed with it. Prints one JSON line per plan; exits 1 if anything held on.
On a tilefuse without InferenceSession.close the same loop measures the leak (sessions
are dropped instead).
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent / "build" / "gpu_resources"
MODELS = ("mlp", "bert")
SLACK_BYTES = 8 << 20  # the driver's own bookkeeping may move a little
SLACK_MAPS = 16


def pack(args) -> int:
    import models
    from tilefuse.compiler import compile_model

    ROOT.mkdir(parents=True, exist_ok=True)
    for name in MODELS:
        path = models.build(name, "tiny", "float32")
        compile_model(path, "cuda:sm_90a", models.ZOO[name].shapes("tiny")).plan.save(ROOT / f"{name}.tfplan")
        print(f"packed {name}", flush=True)
    return 0


def _maps() -> int:
    with open("/proc/self/maps") as f:
        return sum(1 for _ in f)


def _free_bytes(cu) -> int:
    err, free, _total = cu.cuMemGetInfo()
    assert err == cu.CUresult.CUDA_SUCCESS, err
    return int(free)


def _feeds(sess) -> dict:
    rng = np.random.default_rng(0)
    types = {"tensor(float)": np.float32, "tensor(int64)": np.int64, "tensor(float16)": np.float16}
    return {i.name: (rng.standard_normal(i.shape) if types[i.type] != np.int64 else rng.integers(0, 8, i.shape))
            .astype(types[i.type]) for i in sess.get_inputs()}


def check(plan_dir: Path, sessions: int) -> dict:
    from cuda.bindings import driver as cu

    from tilefuse.errors import ExecutionError
    from tilefuse.runtime import InferenceSession

    # The script's own reference on the primary context: it stays between sessions, so
    # cuMemGetInfo has a baseline and nothing is re-created per session.
    assert cu.cuInit(0)[0] == cu.CUresult.CUDA_SUCCESS
    _, dev = cu.cuDeviceGet(0)
    _, ctx = cu.cuDevicePrimaryCtxRetain(dev)
    cu.cuCtxSetCurrent(ctx)
    first = InferenceSession(plan_dir)
    feeds = _feeds(first)
    want = first.run(None, feeds)
    closes = hasattr(first, "close")
    first.close() if closes else None
    del first
    gc.collect()
    cu.cuCtxSetCurrent(ctx)
    free0, maps0 = _free_bytes(cu), _maps()
    for i in range(sessions):
        if closes and i % 3 == 1:
            with InferenceSession(plan_dir) as s:
                got = s.run(None, feeds)
        else:
            s = InferenceSession(plan_dir)
            got = s.run(None, feeds)
            if closes and i % 3 == 0:
                s.close()
            del s
            gc.collect()
        assert all(np.array_equal(a, b) for a, b in zip(got, want)), f"session {i}: other results"
    cu.cuCtxSetCurrent(ctx)
    free1, maps1 = _free_bytes(cu), _maps()
    out = {"plan": plan_dir.name, "sessions": sessions, "close": closes, "free_before": free0, "free_after": free1,
           "leaked_bytes": free0 - free1, "maps_before": maps0, "maps_after": maps1}
    ok = free0 - free1 <= SLACK_BYTES and maps1 - maps0 <= SLACK_MAPS
    if closes:
        s = InferenceSession(plan_dir)
        s.close()
        try:
            s.run(None, feeds)
            out["run_after_close"] = "ran"
            ok = False
        except ExecutionError as e:
            out["run_after_close"] = str(e)
        ok &= _device_output_outlives_its_session(plan_dir, feeds, want, out)
    out["ok"] = bool(ok)
    return out


def _device_output_outlives_its_session(plan_dir: Path, feeds: dict, want: list, out: dict) -> bool:
    try:
        import torch
    except ImportError:
        torch = None
    if torch is None or not torch.cuda.is_available():
        out["device_output"] = "skipped (no CUDA torch)"
        return True
    from tilefuse.runtime import InferenceSession

    s = InferenceSession(plan_dir)
    got = s.run(None, {k: torch.from_numpy(v).cuda() for k, v in feeds.items()})
    s.close()
    same = all(np.array_equal(g.numpy(), w) for g, w in zip(got, want))
    t = torch.from_dlpack(got[0])
    same &= bool(np.array_equal(t.cpu().numpy(), want[0]))
    del t, got
    gc.collect()
    out["device_output"] = "readable after close" if same else "differs after close"
    return same


def run(args) -> int:
    failed = 0
    for plan_dir in sorted(args.root.glob("*.tfplan")):
        result = check(plan_dir, args.sessions)
        failed += not result["ok"]
        print(json.dumps(result), flush=True)
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("pack").set_defaults(func=pack)
    r = sub.add_parser("run")
    r.add_argument("--root", type=Path, default=ROOT)
    r.add_argument("--sessions", type=int, default=100)
    r.set_defaults(func=run)
    args = parser.parse_args()
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
