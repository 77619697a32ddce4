"""What ``InferenceSession.run`` adds over a CUDA graph replay, with torch tensors on the GPU.

    python benchmarks/gpu_peers.py pack --models bert --batches 1 32      # here: plans without weights
    PYTHONPATH=. python benchmarks/gpu_run_overhead.py [--plans build/gpu_real] [--repeats 300]   # on the GPU machine

For each packed plan (weights synthesised as gpu_peers does): the device time of a graph
replay (CUDA events, the runtime's ``timed``), and the wall time of ``sess.run(None, feeds)``
with the feeds as torch CUDA tensors, measured on the host around each call (a run returns
once its outputs are written, so no extra synchronise is needed) with each run's outputs
dropped before the next, as a server does; then the same with the buffers bound once
(``sess.bind(feeds)``: one graph with the copies in and out, nothing per run but its
launch and the wait). The overhead is the difference of the medians; the issue's goal is
20 us or less. Results to $OUT/gpu_run_overhead.json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_peers import prepare  # noqa: E402


def _walls(fn, repeats: int) -> list[float]:
    """Host wall time (ms) of each of ``repeats`` calls of ``fn`` after 20 untimed ones."""
    for _ in range(20):
        fn()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--plans", default="build/gpu_real")
    ap.add_argument("--match", default="*.tfplan")
    ap.add_argument("--repeats", type=int, default=300)
    ap.add_argument("--profile", action="store_true", help="also print where run()'s host time goes (cProfile)")
    args = ap.parse_args()
    import torch

    rows = []
    for plan_dir in sorted(Path(args.plans).glob(args.match)):
        sess, feeds = prepare(plan_dir)
        gpu = {k: torch.from_numpy(v).cuda() for k, v in feeds.items()}
        torch.cuda.synchronize()
        host = sess.run(None, feeds)
        dev = [torch.from_dlpack(o).cpu().numpy() for o in sess.run(None, gpu)]
        same = all((a == b).all() for a, b in zip(host, dev))
        ex = sess._executor
        ex.timed(20)
        replay = statistics.median(ex.timed(args.repeats))
        for _ in range(20):
            sess.run(None, gpu)
        walls = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            outs = sess.run(None, gpu)
            walls.append((time.perf_counter() - t0) * 1e3)
            del outs
        run_ms = statistics.median(walls)
        # buffers bound once: the plan session's bind (outputs in memory it keeps)
        binding = sess.bind(gpu)
        binding.run()
        bound_same = all((torch.from_dlpack(o).cpu().numpy() == h).all() for o, h in zip(binding.outputs, host))
        bound = _walls(binding.run, args.repeats)
        row = {"plan": plan_dir.name, "replay_ms": replay, "run_ms": run_ms, "overhead_us": 1e3 * (run_ms - replay),
               "run_p90_ms": sorted(walls)[int(0.9 * len(walls))], "device_outputs_equal_host": bool(same),
               "bound_run_ms": statistics.median(bound), "bound_overhead_us": 1e3 * (statistics.median(bound) - replay),
               "bound_p90_ms": sorted(bound)[int(0.9 * len(bound))], "bound_outputs_equal_host": bool(bound_same)}
        rows.append(row)
        if args.profile:
            import cProfile
            import pstats

            prof = cProfile.Profile()
            prof.enable()
            for _ in range(100):
                sess.run(None, gpu)  # each run's outputs dropped at once
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(14)
        print(f"{plan_dir.name:28s} replay {replay:.3f} ms  run() {run_ms:.3f} ms  over: {row['overhead_us']:.1f} us  "
              f"(p90 {row['run_p90_ms']:.3f}); device outputs equal host: {same}", flush=True)
        print(f"{'':28s} bound: run {row['bound_run_ms']:.3f} ms  over: {row['bound_overhead_us']:.1f} us  "
              f"(p90 {row['bound_p90_ms']:.3f}); outputs equal host: {bound_same}", flush=True)
        sess.close()
    out = Path(os.environ.get("OUT") or ".") / "gpu_run_overhead.json"
    out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
