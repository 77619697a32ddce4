"""Where a waited ``run()`` spends its host time beyond the graph, part by part, and how
the way the host waits for a graph changes that.

    python benchmarks/gpu_peers.py pack --models bert --batches 1 32 --dtype float16   # here
    PYTHONPATH=. python benchmarks/gpu_wait_probe.py [--plans build/gpu_real]           # on the GPU machine

benchmarks/gpu_run_overhead.py found run() adding more over a graph replay at bert-base
b32 (2 ms of kernels) than at b1 (0.43 ms), and the replay itself taking longer beyond its
device time. This probe splits the steady run (runtime/cuda_steady.py) into its parts with
a clock read at each driver call (a proxy of the executor's driver: the time before the
first call, the launch, the time between the launch and the wait, the wait, the time after
it) and times a graph replay waited for in several ways, each against the device time of
the graph it launched (events around the launch): ``cuStreamSynchronize``, an event
recorded after the launch and ``cuEventSynchronize``, and a host loop that polls
``cuStreamQuery`` (the thread never sleeps); run() also with that polling wait. Forms alternate round after round; medians
in microseconds. Results to $OUT/gpu_wait_probe.json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_peers import prepare  # noqa: E402


class _Stamped:
    """The executor's driver with a clock read before and after each call, and events
    recorded around each graph launch (its device time)."""

    def __init__(self, cu) -> None:
        self.real, self.stamps, self.poll = cu, [], False
        self.start, self.end = cu.cuEventCreate(0)[1], cu.cuEventCreate(0)[1]
        self.proxy = SimpleNamespace(**{k: getattr(cu, k) for k in dir(cu) if not k.startswith("__")})
        for name in ("cuCtxSetCurrent", "cuGraphLaunch", "cuStreamSynchronize", "cuEventSynchronize",
                     "cuEventRecord", "cuStreamWaitEvent"):
            setattr(self.proxy, name, self._wrap(name, getattr(cu, name)))

    def _wrap(self, name, fn):
        clock, stamps = time.perf_counter_ns, self.stamps
        cu, start, end = self.real, self.start, self.end

        if name == "cuGraphLaunch":
            def launch(graph, stream):
                t0 = clock()
                cu.cuEventRecord(start, stream)
                r = fn(graph, stream)
                cu.cuEventRecord(end, stream)
                stamps.append((name, t0, clock()))
                return r
            return launch

        if name == "cuStreamSynchronize":
            query, ready = cu.cuStreamQuery, cu.CUresult.CUDA_SUCCESS

            def sync(stream):
                t0 = clock()
                if self.poll:  # the host never sleeps: poll until the stream is done
                    while query(stream)[0] != ready:
                        pass
                    r = (ready,)
                else:
                    r = fn(stream)
                stamps.append((name, t0, clock()))
                return r
            return sync

        def call(*a):
            t0 = clock()
            r = fn(*a)
            stamps.append((name, t0, clock()))
            return r
        return call

    def device_us(self) -> float:
        self.real.cuEventSynchronize(self.end)
        return 1e3 * float(self.real.cuEventElapsedTime(self.start, self.end)[1])


def _parts(stamps, t0: int, t1: int) -> dict[str, float]:
    """A run's parts (us) from its driver calls' stamps and its own start and end."""
    launch = next(s for s in stamps if s[0] == "cuGraphLaunch")
    wait = next(s for s in stamps if s[0] in ("cuStreamSynchronize", "cuEventSynchronize"))
    first = stamps[0]
    return {"before_first_call": (first[1] - t0) / 1e3, "calls_before_launch": (launch[1] - first[1]) / 1e3,
            "launch": (launch[2] - launch[1]) / 1e3, "launch_to_wait": (wait[1] - launch[2]) / 1e3,
            "wait": (wait[2] - wait[1]) / 1e3, "after_wait": (t1 - wait[2]) / 1e3}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--plans", default="build/gpu_real")
    ap.add_argument("--match", default="*.tfplan")
    ap.add_argument("--repeats", type=int, default=400)
    ap.add_argument("--warmup", type=float, default=2.0)
    args = ap.parse_args()
    import torch

    torch.cuda.init()
    rows = []
    for plan_dir in sorted(Path(args.plans).glob(args.match)):
        sess, feeds = prepare(plan_dir)
        gpu = {k: torch.from_numpy(v).cuda() for k, v in feeds.items()}
        torch.cuda.synchronize()
        sess.run(None, gpu)
        sess.run(None, gpu)
        ex = sess._executor
        direct, stream = ex._direct, ex.stream
        flags = ex.cu.cuCtxGetFlags()
        stamped = _Stamped(ex.cu)
        cu = stamped.proxy
        done = ex.cu.cuEventCreate(0)[1]
        ready = ex.cu.CUresult.CUDA_SUCCESS

        def replay_sync():
            cu.cuGraphLaunch(direct.exec, stream)
            cu.cuStreamSynchronize(stream)

        def replay_event():
            cu.cuGraphLaunch(direct.exec, stream)
            ex.cu.cuEventRecord(done, stream)
            cu.cuEventSynchronize(done)

        def polling(fn):
            def polled():
                stamped.poll = True
                try:
                    return fn()
                finally:
                    stamped.poll = False
            return polled

        forms = {"replay_sync": replay_sync, "replay_event": replay_event, "replay_poll": polling(replay_sync),
                 "run": lambda: sess.run(None, gpu), "run_poll": polling(lambda: sess.run(None, gpu))}
        ex.cu = cu
        try:
            assert sess.run(None, gpu) is not None and ex._steady is not None, "no steady run"
            start = time.perf_counter()
            while time.perf_counter() - start < args.warmup:
                for fn in forms.values():
                    fn()
            got: dict[str, list[dict]] = {k: [] for k in forms}
            for _ in range(args.repeats):
                for k, fn in forms.items():
                    stamped.stamps.clear()
                    t0 = time.perf_counter_ns()
                    kept = fn()
                    t1 = time.perf_counter_ns()
                    del kept
                    dev = stamped.device_us()
                    parts = _parts(stamped.stamps, t0, t1)
                    parts["total"], parts["device"] = (t1 - t0) / 1e3, dev
                    parts["beyond_device"] = parts["total"] - dev
                    parts["wait_beyond_device"] = parts["wait"] + parts["launch_to_wait"] - dev
                    got[k].append(parts)
        finally:
            ex.cu = stamped.real
        med = {k: {p: statistics.median(r[p] for r in rs) for p in rs[0]} for k, rs in got.items()}
        row = {"plan": plan_dir.name, "ctx_flags": int(flags[1]) if flags[0] == ready else str(flags), "medians_us": med}
        rows.append(row)
        print(f"{plan_dir.name}: context flags {row['ctx_flags']}", flush=True)
        for k, m in med.items():
            print(f"  {k:13s} " + ", ".join(f"{p} {v:.1f}" for p, v in m.items()), flush=True)
        sess.close()
    out = Path(os.environ.get("OUT") or ".") / "gpu_wait_probe.json"
    out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
