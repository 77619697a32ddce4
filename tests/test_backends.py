"""The backend registry: one Backend per target family, found by family or target, and
what each says about its kernels."""
import pytest

from tilefuse import backends
from tilefuse.codegen.launch import CpuLaunch, CudaLaunch
from tilefuse.errors import TilefuseError
from tilefuse.target import CPU, CUDA_SM90A


def test_each_target_finds_its_family():
    assert backends.families() == ["cpu", "cuda"]
    assert backends.for_target(CPU) is backends.get("cpu") is backends.for_target("cpu")
    assert backends.for_target(CUDA_SM90A) is backends.get("cuda") is backends.for_target("cuda:sm_90a")
    assert backends.family("cuda:sm_90a") == "cuda" and backends.find("tpu") is None


def test_an_unknown_family_names_the_known_ones():
    with pytest.raises(TilefuseError, match=r"no backend for target family 'tpu'; known families: \['cpu', 'cuda'\]"):
        backends.get("tpu")
    with pytest.raises(TilefuseError, match="registered twice"):
        backends.register(backends.get("cpu"))


def test_what_each_family_says_about_its_kernels():
    cpu, cuda = backends.get("cpu"), backends.get("cuda")
    assert (cpu.kernel_format.suffix, cpu.kernel_format.entry("k_0123456789")) == (".so", "k_0123456789")
    assert (cuda.kernel_format.suffix, cuda.kernel_format.entry("k_0123456789")) == (".cubin", "k_0123456789_kernel")
    assert (cpu.tiles_on_chip, cpu.on_gpu, cuda.tiles_on_chip, cuda.on_gpu) == (False, False, True, True)
    assert (cpu.launch_type(), cuda.launch_type()) == (CpuLaunch, CudaLaunch)
    assert cpu.executor().__name__ == "CpuExecutor" and cuda.executor().__name__ == "CudaExecutor"
