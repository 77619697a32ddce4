"""The CUDA family: TileLang kernels compiled to cubins for the arch a target names
("cuda:sm_90a"), run through the CUDA driver API. TileLang and cuda-python load only
when a kernel is built or a plan run."""
from __future__ import annotations

from tilefuse.backends.base import Backend, KernelFormat


class CudaBackend(Backend):
    def __init__(self) -> None:
        super().__init__("cuda", KernelFormat(".cubin", "_kernel"), tiles_on_chip=True, on_gpu=True)

    def build_all(self, programs, target, on_kernel=None):
        from tilefuse.codegen.cuda import build_all

        progress = (lambda: on_kernel(False)) if on_kernel is not None else None  # cache hits are not told apart
        return build_all(programs, arch=target.device.arch, options=target.codegen, device=target.device,
                         progress=progress)

    def executor(self) -> type:
        from tilefuse.runtime.cuda import CudaExecutor

        return CudaExecutor

    def launch_type(self):
        from tilefuse.codegen.launch import CudaLaunch

        return CudaLaunch

    def decode_launch(self, dec, d, where, n_params, symbol):
        from tilefuse.codegen.launch import decode_cuda

        return decode_cuda(dec, d, where, n_params, symbol)
