"""The CPU family: C kernels in shared libraries, run through ctypes on tilefuse's own
thread pool."""
from __future__ import annotations

from tilefuse.backends.base import Backend, KernelFormat


class CpuBackend(Backend):
    def __init__(self) -> None:
        super().__init__("cpu", KernelFormat(".so", ""), tiles_on_chip=False, on_gpu=False)

    def build_all(self, programs, target, on_kernel=None):
        from tilefuse.codegen.cpu import build_all

        return build_all(programs, options=target.codegen, on_kernel=on_kernel)

    def executor(self) -> type:
        from tilefuse.runtime.cpu import CpuExecutor

        return CpuExecutor

    def launch_type(self):
        from tilefuse.codegen.launch import CpuLaunch

        return CpuLaunch

    def decode_launch(self, dec, d, where, n_params, symbol):
        from tilefuse.codegen.launch import decode_cpu

        return decode_cpu(dec, d, where, n_params, symbol)
