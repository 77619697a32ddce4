"""How long the host takes to learn that a CUDA graph is done, by way of waiting.

    python benchmarks/gpu_peers.py pack --models bert --batches 1 32     # here
    PYTHONPATH=. python benchmarks/gpu_wait_modes.py [--plans build/gpu_real]   # on the GPU machine

A synchronous run() is a graph launch and a wait; the graph replay it is compared with is
device time (CUDA events). For each packed plan: the replay's device time, and the host
wall time of one launch followed by each way of waiting — cuStreamSynchronize, an event
recorded after the launch and cuEventSynchronize, a loop of cuEventQuery (the host
polling) — under the context's scheduling flags as found, then with the context set to
spin (CU_CTX_SCHED_SPIN) and to blocking sync. Medians of --repeats, in microseconds;
results to $OUT/gpu_wait_modes.json.
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


def _median_us(fn, repeats: int) -> float:
    for _ in range(20):
        fn()
    walls = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        walls.append(time.perf_counter() - t0)
    return 1e6 * statistics.median(walls)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--plans", default="build/gpu_real")
    ap.add_argument("--match", default="*.tfplan")
    ap.add_argument("--repeats", type=int, default=300)
    args = ap.parse_args()
    rows = []
    for plan_dir in sorted(Path(args.plans).glob(args.match)):
        sess, feeds = prepare(plan_dir)
        sess.run(None, feeds)
        ex = sess._executor
        cu = ex.cu
        ex.timed(20)
        row = {"plan": plan_dir.name, "replay_us": 1e3 * statistics.median(ex.timed(args.repeats))}
        event = ex._check(cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING), "cuEventCreate")

        def stream_sync():
            ex.launch_all()
            cu.cuStreamSynchronize(ex.stream)

        def event_sync():
            ex.launch_all()
            cu.cuEventRecord(event, ex.stream)
            cu.cuEventSynchronize(event)

        def poll():
            ex.launch_all()
            cu.cuEventRecord(event, ex.stream)
            ready = cu.CUresult.CUDA_SUCCESS
            while cu.cuEventQuery(event)[0] != ready:
                pass

        modes = {"as found": None, "spin": cu.CUctx_flags.CU_CTX_SCHED_SPIN,
                 "blocking sync": cu.CUctx_flags.CU_CTX_SCHED_BLOCKING_SYNC}
        err, found = cu.cuCtxGetFlags()
        row["flags_as_found"] = int(found)
        for mode, flag in modes.items():
            if flag is not None:
                err, = cu.cuCtxSetFlags(int(flag))
                if err != cu.CUresult.CUDA_SUCCESS:
                    row[mode] = f"cuCtxSetFlags: {err}"
                    continue
            row[mode] = {name: _median_us(fn, args.repeats)
                         for name, fn in (("stream_sync", stream_sync), ("event_sync", event_sync), ("poll", poll))}
        cu.cuCtxSetFlags(int(found))
        cu.cuEventDestroy(event)
        print(json.dumps(row), flush=True)
        rows.append(row)
        sess.close()
    out = Path(os.environ.get("OUT") or ".") / "gpu_wait_modes.json"
    out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
