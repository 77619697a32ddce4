"""The CUDA runtime on a GPU; skipped where there is none (CI). The GPU machine runs the
same checks over the whole tiny zoo with benchmarks/gpu_check.py."""
import numpy as np
import pytest

from tilefuse.codegen.launch import CudaLaunch, KernelArg
from tilefuse.errors import PlanError


def _gpu_available() -> bool:
    try:
        from cuda.bindings import driver
    except ImportError:
        return False
    try:  # (a newer cuda-bindings raises where it finds no driver library)
        err, = driver.cuInit(0)[:1]
    except Exception:
        return False
    if err != driver.CUresult.CUDA_SUCCESS:
        return False
    err, n = driver.cuDeviceGetCount()
    return err == driver.CUresult.CUDA_SUCCESS and n > 0


def _gpu_and_compiler() -> bool:
    """A GPU and TileLang in one place (the GPU machine has no TileLang: benchmarks/gpu_check.py
    builds plans on the compiling machine and runs them there)."""
    import importlib.util

    return _gpu_available() and importlib.util.find_spec("tilelang") is not None


NEEDS_BOTH = "needs a CUDA GPU and tilelang on one machine"


def test_missing_cuda_python_is_a_clear_error(monkeypatch):
    import sys

    from tilefuse.runtime import cuda

    monkeypatch.setitem(sys.modules, "cuda.bindings", None)
    with pytest.raises(PlanError, match="cuda-python"):
        cuda._driver()


@pytest.mark.skipif(not _gpu_and_compiler(), reason=NEEDS_BOTH)
def test_mlp_plan_matches_onnxruntime_on_the_gpu(tmp_path, zoo_cache):
    import onnxruntime as ort

    import models
    from tilefuse.compare import compare_output
    from tilefuse.compiler import compile
    from tilefuse.runtime import InferenceSession

    shapes = models.ZOO["mlp"].shapes("tiny")
    path = models.build("mlp", "tiny", "float32", cache_dir=zoo_cache)
    compile(path, "cuda:sm_90a", shapes).save(tmp_path / "m.tfplan")
    feeds = models.random_inputs(path, shapes, seed=int(np.random.default_rng().integers(2**31)))
    got = InferenceSession(tmp_path / "m.tfplan").run(None, feeds)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    for g, w in zip(got, want):
        assert compare_output("y", g, w).ok


@pytest.mark.skipif(not _gpu_and_compiler(), reason=NEEDS_BOTH)
def test_gpu_tensors_in_and_out_without_host_copies(tmp_path, zoo_cache):
    """torch CUDA tensors as feeds (through DLPack): the outputs stay on the GPU
    (DeviceArray, readable by torch through DLPack and __cuda_array_interface__, without
    a copy) and equal the host path's."""
    torch = pytest.importorskip("torch")
    import models
    from tilefuse.compiler import compile
    from tilefuse.runtime import DeviceArray, InferenceSession

    shapes = models.ZOO["mlp"].shapes("tiny")
    path = models.build("mlp", "tiny", "float32", cache_dir=zoo_cache)
    compile(path, "cuda:sm_90a", shapes).save(tmp_path / "m.tfplan")
    sess = InferenceSession(tmp_path / "m.tfplan")
    feeds = models.random_inputs(path, shapes, seed=int(np.random.default_rng().integers(2**31)))
    host = sess.run(None, feeds)
    device = sess.run(None, {k: torch.from_numpy(v).cuda() for k, v in feeds.items()})
    for h, d in zip(host, device):
        assert isinstance(d, DeviceArray)
        np.testing.assert_array_equal(torch.as_tensor(d, device="cuda").cpu().numpy(), h)
        t = torch.from_dlpack(d)
        assert t.data_ptr() == d.ptr
        np.testing.assert_array_equal(t.cpu().numpy(), h)
        np.testing.assert_array_equal(d.numpy(), h)


def test_step_by_step_waits_for_each_kernel_and_reads_buffers_back():
    """Tools that look between kernels (gpu_real_check --probe) run a plan one step at a
    time: each launch is followed by a wait before the step is handed over, and
    read_buffer copies a plan buffer to the host. Checked against a recording driver."""
    import ctypes
    from types import SimpleNamespace

    from tilefuse.ir import DType, TensorType
    from tilefuse.plan import KernelStep
    from tilefuse.runtime.cuda import CudaExecutor
    from tilefuse.runtime.cuda_launch import KernelLaunch

    calls = []
    device = {0x1000: np.arange(6, dtype=np.float32)}

    class Driver:
        CUresult = SimpleNamespace(CUDA_SUCCESS=0)

        def cuLaunchKernel(self, fn, *args):
            calls.append(("launch", fn))
            return (0,)

        def cuStreamSynchronize(self, stream):
            calls.append(("wait", stream))
            return (0,)

        def cuMemcpyDtoHAsync(self, dst, src, nbytes, stream):
            ctypes.memmove(dst, device[src].ctypes.data, nbytes)
            return (0,)

    steps = [KernelStep(f"k{i}", (), (0,), 0) for i in range(2)]
    ex = object.__new__(CudaExecutor)
    ex.cu, ex.stream, ex.ptr, ex._checked = Driver(), 7, {0: 0x1000}, []
    ex.plan = SimpleNamespace(steps=steps, buffers=[SimpleNamespace(name="y", type=TensorType(DType.FLOAT32, (2, 3)))])
    ex._launches = [KernelLaunch(f"fn{i}", (1, 1, 1), (32, 1, 1), 0, ((), ()), [], None) for i in range(2)]
    seen = []
    for step in ex.step_by_step():
        seen.append((step.kernel, list(calls)))
    assert seen == [("k0", [("launch", "fn0"), ("wait", 7)]),
                    ("k1", [("launch", "fn0"), ("wait", 7), ("launch", "fn1"), ("wait", 7)])]
    np.testing.assert_array_equal(ex.read_buffer(0), np.arange(6, dtype=np.float32).reshape(2, 3))


def test_programmatic_kernels_launch_with_stream_serialisation():
    """A kernel whose launch metadata says ``programmatic`` (it waits for the previous
    kernel itself) is launched with cuLaunchKernelEx and the programmatic-stream-
    serialisation attribute, with its grid, block, shared memory and stream; the others
    with cuLaunchKernel. With launch="plain", every kernel launches plainly.
    Checked against a recording driver."""
    from types import SimpleNamespace

    from tilefuse.plan import KernelStep
    from tilefuse.runtime.cuda import CudaExecutor

    calls = []

    class Driver:
        CUresult = SimpleNamespace(CUDA_SUCCESS=0)
        CUlaunchAttributeID = SimpleNamespace(CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION=6)

        class CUlaunchAttribute:
            def __init__(self):
                self.id, self.value = None, SimpleNamespace(programmaticStreamSerializationAllowed=0)

        class CUlaunchConfig:
            pass

        def cuLaunchKernel(self, fn, gx, gy, gz, bx, by, bz, smem, stream, args, extra):
            calls.append(("plain", fn, (gx, gy, gz), (bx, by, bz), smem, stream))
            return (0,)

        def cuLaunchKernelEx(self, config, fn, args, extra):
            (attr,) = config.attrs[: config.numAttrs]
            calls.append(("programmatic", fn, (config.gridDimX, config.gridDimY, config.gridDimZ),
                          (config.blockDimX, config.blockDimY, config.blockDimZ), config.sharedMemBytes,
                          config.hStream, attr.id, attr.value.programmaticStreamSerializationAllowed))
            return (0,)

    def executor(programmatic=True):
        ex = object.__new__(CudaExecutor)
        ex.cu, ex.stream, ex.ptr, ex.programmatic = Driver(), 7, {0: 0x1000}, programmatic
        kernels = {f"k{i}": SimpleNamespace(name=f"k{i}", launch=CudaLaunch(f"k{i}_kernel", (4, 1, 2), (384, 1, 1),
                   (KernelArg("x", 0),), dynamic_smem=1024, programmatic=i == 1)) for i in range(2)}
        steps = [KernelStep(f"k{i}", (0,), (), 0) for i in range(2)]
        ex.plan = SimpleNamespace(steps=steps, kernels=kernels)
        ex._functions = {"k0": "fn0", "k1": "fn1"}
        ex._launches = [ex._launch_args(i, s) for i, s in enumerate(steps)]
        return ex

    executor().launch_steps()
    assert calls == [("plain", "fn0", (4, 1, 2), (384, 1, 1), 1024, 7),
                     ("programmatic", "fn1", (4, 1, 2), (384, 1, 1), 1024, 7, 6, 1)]
    calls.clear()
    executor(programmatic=False).launch_steps()  # InferenceSession(plan, launch="plain")
    assert [c[0] for c in calls] == ["plain", "plain"]


@pytest.mark.parametrize("cond", [True, False])
def test_branches_launch_the_branch_taken_and_copy_its_results(cond):
    """A plan with a branch runs step by step: the condition is copied to the host once
    the kernels before it are done, only the branch taken is launched, and the select
    copies that branch's result device to device. Checked against a recording driver."""
    import ctypes
    from types import SimpleNamespace

    from tilefuse.ir import DType, TensorType
    from tilefuse.plan import BranchStep, KernelStep, SelectStep
    from tilefuse.runtime.cuda import CudaExecutor
    from tilefuse.runtime.cuda_launch import KernelLaunch

    calls = []
    flag = np.array([cond])

    class Driver:
        CUresult = SimpleNamespace(CUDA_SUCCESS=0)

        def cuLaunchKernel(self, fn, *args):
            calls.append(("launch", fn))
            return (0,)

        def cuStreamSynchronize(self, stream):
            calls.append(("wait",))
            return (0,)

        def cuMemcpyDtoHAsync(self, dst, src, nbytes, stream):
            assert src == 0x100 and nbytes == 1
            calls.append(("read condition",))
            ctypes.memmove(dst, flag.ctypes.data, nbytes)
            return (0,)

        def cuMemcpyDtoDAsync(self, dst, src, nbytes, stream):
            calls.append(("copy", hex(src), hex(dst), nbytes))
            return (0,)

    f32 = TensorType(DType.FLOAT32, (2, 3))
    buffers = [SimpleNamespace(name="c", type=TensorType(DType.BOOL, ()), nbytes=1)] + [
        SimpleNamespace(name=n, type=f32, nbytes=24) for n in ("t", "e", "y")]
    steps = [KernelStep("k0", (), (0,), 0), BranchStep(0, 1, 1, 1, "if"), KernelStep("k1", (), (1,), 0),
             KernelStep("k2", (), (2,), 0), SelectStep(0, (1,), (2,), (3,), 1, "if"), KernelStep("k3", (3,), (), 2)]
    ex = object.__new__(CudaExecutor)
    ex.cu, ex.stream = Driver(), 7
    ex.ptr = {0: 0x100, 1: 0x200, 2: 0x300, 3: 0x400}
    ex.plan = SimpleNamespace(steps=steps, buffers=buffers)
    ex._launches = [KernelLaunch(f"fn_{s.kernel}", (1, 1, 1), (32, 1, 1), 0, ((), ()), [], None)
                    if isinstance(s, KernelStep) else None for s in steps]
    ex.launch_steps()
    taken, source = ("fn_k1", "0x200") if cond else ("fn_k2", "0x300")
    assert calls == [("launch", "fn_k0"), ("read condition",), ("wait",), ("launch", taken),
                     ("read condition",), ("wait",), ("copy", source, "0x400", 24), ("launch", "fn_k3")]


def test_launch_mode_is_checked_and_only_for_gpu_plans(tmp_path):
    """``InferenceSession(plan, launch="plain")`` times a plan without programmatic launches
    (it replaced a module switch); an unknown mode, or one given for a CPU plan, is an
    InputError naming it, before any driver is touched."""
    from types import SimpleNamespace

    from tilefuse.compiler import compile_graph
    from tilefuse.errors import InputError
    from tilefuse.runtime import InferenceSession
    from tilefuse.runtime.cuda import CudaExecutor
    from tilefuse.target import CPU

    from tests.plan.handmade import mlp_graph

    with pytest.raises(InputError, match="launch must be one of .*'as-built', 'plain'.*got 'fast'"):
        CudaExecutor(SimpleNamespace(), launch="fast")
    plan = compile_graph(mlp_graph(4, 8, 16), CPU).plan
    with pytest.raises(InputError, match="launch='plain': a cpu plan has no GPU launches"):
        InferenceSession(plan, launch="plain")
