"""What ``InferenceSession.run`` adds over a CUDA graph replay, with torch tensors on the GPU.

    python benchmarks/gpu_peers.py pack --models bert --batches 1 32      # here: plans without weights
    PYTHONPATH=. python benchmarks/gpu_run_overhead.py [--plans build/gpu_real] [--repeats 300]   # on the GPU machine

For each packed plan (weights synthesised as gpu_peers does), three forms that wait for
the run, timed on the host around each call and called in turn round after round (an
H200's clock drifts by a few percent over a minute of load; alternating moves every form
alike): a graph replay launched and waited for as a hand-written server would
(``cuGraphLaunch`` and ``cuStreamSynchronize``: the floor of any call that returns with
its outputs written), ``sess.run(None, feeds)`` with the feeds as torch CUDA tensors (each
run's outputs dropped before the next, as a server does), and a run of buffers bound once
(``sess.bind(feeds)``: no per-run feed handling), and the drop-in session's
``run_with_iobinding`` of the same memory (onnxruntime's IOBinding). The headline: each call's host time
beyond the device time of the graph it launched (events around the launch), run() and
bound against the replay: what they add, whatever clock the GPU ran each graph at. Also
the medians of the host times against the replay's device time (CUDA events, the
runtime's ``timed``, before and after the rounds) and against the replay's host time. Runs not waited for (``run(None, feeds,
wait=False)``, ``binding.run(wait=False)``: outputs ordered on torch's stream, as a torch
operation's are) are timed as a server queues them, back to back, each run's outputs
dropped, against graph replays queued back to back (wall time over the runs, both). The
issue's goal is 20 us or less over the replay. Each form's outputs are checked against a
host run's, also at addresses that change (held outputs, feeds 8 bytes off alignment).
The waited forms are first called untimed for ``--warmup`` seconds (3: a server that has
been serving, not a process seconds old on a machine just started); ``--sets N`` times
them N times in turn and reports each set (the spread within one process; the headline
pools the sets). ``--breakdown`` times run()'s parts alone; ``--pin CPU`` keeps the timing thread on one core.
Results to $OUT/gpu_run_overhead.json.
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

import numpy as np  # noqa: E402
from gpu_peers import prepare  # noqa: E402


def _walls(fn, repeats: int, warm: int = 20) -> list[float]:
    """Host wall time (ms) of each of ``repeats`` calls of ``fn`` after ``warm`` untimed ones."""
    for _ in range(warm):
        fn()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


class _GraphClock:
    """While entered, the executor's driver is a copy whose ``cuGraphLaunch`` records an
    event before and after the launch, so the device time of the graph a call launched
    can be taken from its host time: what the call costs beyond its graph, whatever clock
    the GPU ran that graph at (an H200 under load moves by a few percent within seconds)."""

    def __init__(self, *executors) -> None:
        self.executors, cu = executors, executors[0].cu
        self.real = cu
        self.start = cu.cuEventCreate(0)[1]
        self.end = cu.cuEventCreate(0)[1]
        self.proxy = SimpleNamespace(**{k: getattr(cu, k) for k in dir(cu) if not k.startswith("__")})

        def launch(graph, stream):
            cu.cuEventRecord(self.start, stream)
            result = cu.cuGraphLaunch(graph, stream)
            cu.cuEventRecord(self.end, stream)
            return result

        self.proxy.cuGraphLaunch = launch

    def __enter__(self) -> "_GraphClock":
        for ex in self.executors:
            ex.cu = self.proxy
        return self

    def __exit__(self, *exc) -> None:
        for ex in self.executors:
            ex.cu = self.real
        self.real.cuEventDestroy(self.start)
        self.real.cuEventDestroy(self.end)

    def last_ms(self) -> float:
        """The device time (ms) of the graph launched last."""
        self.real.cuEventSynchronize(self.end)
        return float(self.real.cuEventElapsedTime(self.start, self.end)[1])


def _rounds(forms: dict, repeats: int, clock: _GraphClock, warm_s: float = 0.0, warm: int = 20) -> dict[str, tuple[list, list]]:
    """Each form's calls, the forms called in turn in each of ``repeats`` rounds after
    untimed ones (``warm`` rounds, and more until ``warm_s`` seconds have passed: a server
    that has been serving, not a process seconds old on a machine just started):
    (host wall time, host time beyond the graph the call launched) in ms, per call; what a
    call returns is dropped after its time is taken."""
    start, i = time.perf_counter(), 0
    while i < warm or time.perf_counter() - start < warm_s:
        for fn in forms.values():
            fn()
        i += 1
    times: dict[str, tuple[list, list]] = {k: ([], []) for k in forms}
    for _ in range(repeats):
        for k, fn in forms.items():
            t0 = time.perf_counter()
            kept = fn()
            dt = (time.perf_counter() - t0) * 1e3
            del kept
            times[k][0].append(dt)
            times[k][1].append(dt - clock.last_ms())
    return times


def _io_binding(plan_dir: Path, gpu: dict):
    """The drop-in session (``tilefuse.InferenceSession``) on the plan and an onnxruntime
    IOBinding of the torch tensors' memory, outputs in memory the session keeps."""
    import tilefuse

    dropin = tilefuse.InferenceSession(str(plan_dir))
    io = dropin.io_binding()
    for name, t in gpu.items():
        io.bind_input(name, "cuda", 0, np.dtype(str(t.dtype).removeprefix("torch.")), tuple(t.shape), t.data_ptr())
    for o in dropin.get_outputs():
        io.bind_output(o.name, "cuda")
    dropin.run_with_iobinding(io)
    return dropin, io


def _reuse(sess, ex, gpu, runs: int) -> dict:
    """Over ``runs`` runs of the same feeds, each run's outputs dropped: the kernel nodes
    re-pointed and the outputs given memory other than their last block (both should be
    none: the pool hands each output its block back)."""
    direct, counts = ex._direct, {"nodes_repointed": 0, "outputs_moved": 0}
    point, memory = direct._point, ex._output_memory

    def counting_point(*a):
        counts["nodes_repointed"] += 1
        return point(*a)

    def counting_memory(nbytes, prefer=None):
        ptr = memory(nbytes, prefer)
        counts["outputs_moved"] += ptr != prefer
        return ptr

    direct._point, ex._output_memory = counting_point, counting_memory
    try:
        for _ in range(runs):
            sess.run(None, gpu)
    finally:
        del direct._point, ex._output_memory
    return {f"{k}_in_{runs}_runs": v for k, v in counts.items()}


def _addresses(sess, feeds, torch) -> dict:
    """run() with GPU feeds at addresses that change (runtime/cuda_direct.py re-points its
    graph): two feed sets with each run's outputs held (new output memory each run), then
    feeds at an offset of 8 bytes (copied in, not read in place); each run's outputs
    against a host run of the same feeds."""
    other = {k: np.roll(v, 1, axis=-1) for k, v in feeds.items()}
    want = [sess.run(None, f) for f in (feeds, other)]
    held = []
    for f in (feeds, other, feeds):
        held.append(sess.run(None, {k: torch.from_numpy(v).cuda() for k, v in f.items()}))
    moved = all((torch.from_dlpack(o).cpu().numpy() == w).all()
                for outs, w in zip(held, [want[0], want[1], want[0]]) for o, w in zip(outs, w))

    def unaligned(v):
        t = torch.empty(v.size + 1, dtype=torch.from_numpy(v).dtype, device="cuda")[1:]
        return t.copy_(torch.from_numpy(v.reshape(-1)).cuda()).view(v.shape)

    outs = sess.run(None, {k: unaligned(v) for k, v in other.items()})
    shifted = all((torch.from_dlpack(o).cpu().numpy() == w).all() for o, w in zip(outs, want[1]))
    return {"held_outputs_equal_host": bool(moved), "unaligned_feeds_equal_host": bool(shifted)}


def _steady(sess, feeds, gpu, torch) -> dict:
    """New values written into the same tensors (a server's case: the same addresses run
    after run, runtime/cuda_steady.py launches and waits with no feed reading), each run's
    outputs against a host run of the values; and whether those runs read no feed."""
    check, read = sess._check, []
    sess._check = lambda f: read.append(1) or check(f)
    equal, reads = True, 0
    try:
        sess.run(None, gpu)  # a full run on these tensors: the record the next ones repeat
        for shift in (1, 2, 0):
            other = {k: np.roll(v, shift, axis=-1) for k, v in feeds.items()}
            want = sess.run(None, other)
            read.clear()
            for k, t in gpu.items():
                t.copy_(torch.from_numpy(other[k]))
            got = sess.run(None, gpu)
            reads += len(read)
            equal &= all((torch.from_dlpack(o).cpu().numpy() == w).all() for o, w in zip(got, want))
            del got
    finally:
        sess._check = check
    return {"steady_runs_equal_host": bool(equal), "steady_runs_read_no_feed": reads == 0}


def _late_errors(sess, gpu, torch) -> dict:
    """A bad index in a run not waited for (the first input's element set past any table)
    is raised by the next run once the first is done, for run() and for a binding; None
    where the plan checks no index."""
    from tilefuse.errors import ExecutionError

    name, first = next(iter(gpu.items()))
    if first.dtype not in (torch.int64, torch.int32):
        return {}
    bad = first.clone()
    bad.view(-1)[0] = 10**7
    out = {}
    for form in ("run", "bound"):
        binding = sess.bind({**gpu, name: bad}) if form == "bound" else None
        go = (lambda: binding.run(wait=False)) if binding else (lambda: sess.run(None, {**gpu, name: bad}, wait=False))
        go()
        torch.cuda.synchronize()
        try:
            go()
            out[f"{form}_late_error"] = "not raised"
        except ExecutionError as e:
            out[f"{form}_late_error"] = "raised" if "not waited for" in str(e) and "10000000" in str(e) else str(e)
        sess.synchronize()
        if binding:
            binding.release()
    return out


def _breakdown(sess, gpu, repeats: int) -> dict:
    """Where run()'s host time goes, each part timed alone (median us of ``repeats``):
    checking the feeds, the executor's run on checked feeds, reading one torch tensor,
    asking torch for its current stream, and the direct graph's launch and wait alone."""
    from tilefuse.torch_feeds import torch_view
    import torch

    ex = sess._executor
    names = list(sess._outputs)
    views = sess._check(gpu)
    first = next(iter(gpu.values()))

    def direct():
        ex._direct.launch(ex._direct._where or {})
        ex.cu.cuStreamSynchronize(ex.stream)

    parts = {"check_feeds": lambda: sess._check(gpu), "executor_run": lambda: ex.run(views, names),
             "torch_view": lambda: torch_view(first, 0, int(ex.stream)),
             "current_stream": lambda: torch.cuda.current_stream(0), "graph_launch_and_wait": direct,
             "session_run": lambda: sess.run(None, gpu)}
    return {k: 1e3 * statistics.median(_walls(f, repeats)) for k, f in parts.items() if k != "graph_launch_and_wait"
            or ex._direct is not None}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--plans", default="build/gpu_real")
    ap.add_argument("--match", default="*.tfplan")
    ap.add_argument("--repeats", type=int, default=300)
    ap.add_argument("--warmup", type=float, default=3.0, metavar="SECONDS",
                    help="untimed rounds of the waited forms for this long before the timed ones (default 3)")
    ap.add_argument("--sets", type=int, default=1, help="time the waited forms this many times in turn, "
                    "each set reported (the spread within one process)")
    ap.add_argument("--breakdown", action="store_true", help="also time run()'s parts alone")
    ap.add_argument("--profile", action="store_true", help="also print where run()'s host time goes (cProfile)")
    ap.add_argument("--pin", type=int, metavar="CPU", help="keep the timing thread on this CPU core "
                    "(os.sched_setaffinity; the driver's and torch's threads keep every core)")
    args = ap.parse_args()
    import torch

    torch.cuda.init()
    if args.pin is not None:  # this thread only: threads started before keep their cores
        os.sched_setaffinity(0, {args.pin})
    rows = []
    for plan_dir in sorted(Path(args.plans).glob(args.match)):
        sess, feeds = prepare(plan_dir)
        gpu = {k: torch.from_numpy(v).cuda() for k, v in feeds.items()}
        torch.cuda.synchronize()
        host = sess.run(None, feeds)
        dev = [torch.from_dlpack(o).cpu().numpy() for o in sess.run(None, gpu)]
        same = all((a == b).all() for a, b in zip(host, dev))
        ex = sess._executor
        checks = {**_addresses(sess, feeds, torch), **_steady(sess, feeds, gpu, torch), **_late_errors(sess, gpu, torch)}
        ex.timed(20)
        replay = statistics.median(ex.timed(args.repeats))
        # waited forms in turn, round after round (a clock that drifts moves them alike): a
        # graph replay launched and waited for as a hand-written server would (the direct
        # graph, no re-pointing), run() with torch tensors, and a bound run
        binding = sess.bind(gpu)
        sess.run(None, gpu)  # the direct graph pointed at these feeds (the checks above moved it)
        direct = ex._direct

        def replay_and_wait():
            ex.cu.cuGraphLaunch(direct.exec, ex.stream)
            ex.cu.cuStreamSynchronize(ex.stream)

        dropin, io = _io_binding(plan_dir, gpu)
        forms = {"replay": replay_and_wait, "run": lambda: sess.run(None, gpu), "bound": binding.run,
                 "io_binding": lambda: dropin.run_with_iobinding(io)}
        sets = []  # each set's times; the headline pools them
        with _GraphClock(ex, dropin._fixed._executor) as clock:
            for k in range(max(1, args.sets)):
                sets.append(_rounds(forms, args.repeats, clock, args.warmup if k == 0 else 0.0))
        waited = {k: tuple(sum((s[k][i] for s in sets), []) for i in (0, 1)) for k in forms}
        per_set = [{f"{k}_over_replay_us": 1e3 * (statistics.median(s[k][1]) - statistics.median(s["replay"][1]))
                    for k in ("run", "bound", "io_binding")} for s in sets]
        io_same = all((o.numpy() == h).all() for o, h in zip(io.get_outputs(), host))
        dropin = io = None
        replay_after = statistics.median(ex.timed(args.repeats))
        reuse = _reuse(sess, ex, gpu, 100)
        walls, bound = waited["run"][0], waited["bound"][0]
        run_ms, host_replay = statistics.median(walls), statistics.median(waited["replay"][0])
        beyond = {k: 1e3 * statistics.median(v[1]) for k, v in waited.items()}  # us beyond each call's graph
        # runs not waited for: queued back to back on torch's stream, each run's outputs dropped;
        # against graph replays queued back to back the same way (wall time / runs, both)
        n = args.repeats

        def queued():
            for _ in range(n):
                sess.run(None, gpu, wait=False)
            torch.cuda.synchronize()

        def replays():
            for _ in range(n):
                ex.launch_all()
            ex.synchronize()

        queued()
        unwaited = [torch.from_dlpack(o).cpu().numpy() for o in sess.run(None, gpu, wait=False)]
        unwaited_same = all((a == b).all() for a, b in zip(host, unwaited))
        back_to_back = statistics.median(_walls(replays, 5, 1)) / n
        queued_ms = statistics.median(_walls(queued, 5, 1)) / n
        # buffers bound once: the plan session's bind (outputs in memory it keeps)
        binding.run()
        bound_same = all((torch.from_dlpack(o).cpu().numpy() == h).all() for o, h in zip(binding.outputs, host))

        def bound_queued():  # bound runs not waited for, back to back, as queued() above
            for _ in range(n):
                binding.run(wait=False)
            torch.cuda.synchronize()

        bound_queued_ms = statistics.median(_walls(bound_queued, 5, 1)) / n
        for o in binding.outputs:
            torch.from_dlpack(o).zero_()
        binding.run(wait=False)
        bound_unwaited_same = all((torch.from_dlpack(o).cpu().numpy() == h).all() for o, h in zip(binding.outputs, host))
        row = {"plan": plan_dir.name, "replay_ms": replay, "replay_after_ms": replay_after,
               "beyond_graph_us": beyond, "run_over_replay_us": beyond["run"] - beyond["replay"],
               "bound_over_replay_us": beyond["bound"] - beyond["replay"],
               "io_binding_over_replay_us": beyond["io_binding"] - beyond["replay"], "io_binding_outputs_equal_host": io_same,
               "warmup_s": args.warmup, "sets": per_set,
               "replay_and_wait_ms": host_replay, "run_over_replay_and_wait_us": 1e3 * (run_ms - host_replay),
               "bound_over_replay_and_wait_us": 1e3 * (statistics.median(bound) - host_replay),
               "run_ms": run_ms, "overhead_us": 1e3 * (run_ms - replay),
               "run_p90_ms": sorted(walls)[int(0.9 * len(walls))], "device_outputs_equal_host": bool(same),
               "bound_run_ms": statistics.median(bound), "bound_overhead_us": 1e3 * (statistics.median(bound) - replay),
               "bound_p90_ms": sorted(bound)[int(0.9 * len(bound))], "bound_outputs_equal_host": bool(bound_same),
               "direct_reason": ex.direct_reason, **checks, **reuse,
               "replays_back_to_back_ms": back_to_back, "unwaited_run_ms": queued_ms,
               "unwaited_overhead_us": 1e3 * (queued_ms - back_to_back), "unwaited_outputs_equal_host": bool(unwaited_same),
               "bound_unwaited_run_ms": bound_queued_ms, "bound_unwaited_overhead_us": 1e3 * (bound_queued_ms - back_to_back),
               "bound_unwaited_outputs_equal_host": bool(bound_unwaited_same)}
        if args.breakdown:
            row["breakdown_us"] = _breakdown(sess, gpu, args.repeats)
            print(f"{'':28s} parts (us): " + ", ".join(f"{k} {v:.1f}" for k, v in row["breakdown_us"].items()), flush=True)
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
        print(f"{plan_dir.name:28s} replay {replay:.3f} ms (device; {replay_after:.3f} after), launched and waited for "
              f"{host_replay:.3f} ms; run() {run_ms:.3f} ms  over: {row['overhead_us']:.1f} us device, "
              f"{row['run_over_replay_and_wait_us']:.1f} us waited replay "
              f"(p90 {row['run_p90_ms']:.3f}); device outputs equal host: {same}; {checks}; {reuse}"
              + (f"; no direct graph: {ex.direct_reason}" if ex.direct_reason else ""), flush=True)
        print(f"{'':28s} beyond its graph's device time: replay launched and waited for {beyond['replay']:.1f} us, "
              f"run() {beyond['run']:.1f} us, bound {beyond['bound']:.1f} us, io_binding {beyond['io_binding']:.1f} us: "
              f"run() adds {row['run_over_replay_us']:.1f} us to the replay, bound {row['bound_over_replay_us']:.1f} us, "
              f"the drop-in's io_binding {row['io_binding_over_replay_us']:.1f} us (outputs equal host: {io_same})",
              flush=True)
        if len(per_set) > 1:
            print(f"{'':28s} each set (us over the replay): " + "; ".join(
                ", ".join(f"{k.removesuffix('_over_replay_us')} {v:.1f}" for k, v in p.items()) for p in per_set), flush=True)
        print(f"{'':28s} not waited for: {queued_ms:.3f} ms a run against {back_to_back:.3f} back-to-back replays, "
              f"over: {row['unwaited_overhead_us']:.1f} us; outputs equal host: {unwaited_same}", flush=True)
        print(f"{'':28s} bound: run {row['bound_run_ms']:.3f} ms  over: {row['bound_overhead_us']:.1f} us device, "
              f"{row['bound_over_replay_and_wait_us']:.1f} us waited replay "
              f"(p90 {row['bound_p90_ms']:.3f}); outputs equal host: {bound_same}", flush=True)
        print(f"{'':28s} bound, not waited for: {bound_queued_ms:.3f} ms a run, over: "
              f"{row['bound_unwaited_overhead_us']:.1f} us; outputs equal host: {bound_unwaited_same}", flush=True)
        sess.close()
    out = Path(os.environ.get("OUT") or ".") / "gpu_run_overhead.json"
    out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
