"""What a target family is to the rest of tilefuse: one Backend object.

A family ("cpu", "cuda": the part of a target's name before ":") brings its own code
generator, its executor, the form of its kernel files and of its launch records, and the
few facts the stages ask of it (must a tile's buffers fit on chip? do its kernels run on a
GPU?). The stages ask the registry (``tilefuse.backends.get``) instead of testing target
names, so a new family is one module here plus its generator and executor.

A Backend is imported by every stage, the tile IR's verifier included, so it holds data
and imports its generator, executor and launch records only when one is asked for: the
CPU path never loads TileLang, torch or cuda-python, and no stage imports a later one by
importing this.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, TYPE_CHECKING, Sequence

if TYPE_CHECKING:  # for the annotations only
    from tilefuse.codegen.artifact import KernelArtifact
    from tilefuse.codegen.launch import Fields, LaunchRecord
    from tilefuse.target import Target
    from tilefuse.tile_ir.ir import TileProgram


@dataclass(frozen=True, slots=True)
class KernelFormat:
    """How one target family stores its kernels: the file's suffix, and the entry symbol,
    which is the kernel's name plus ``entry_suffix`` (TileLang names a prim_func's CUDA
    entry ``<func>_kernel``; a C kernel's function is its name)."""

    suffix: str
    entry_suffix: str

    def entry(self, name: str) -> str:
        return name + self.entry_suffix


@dataclass(frozen=True)
class Backend:
    """One target family. ``tiles_on_chip``: a tile's buffers live in the block's on-chip
    memory, so ``tile_ir.verify`` holds them to the target's ``onchip_bytes`` (a CPU tile's
    live on its thread's stack or heap). ``on_gpu``: kernels take device pointers and run
    on a GPU stream (``ort`` export puts them on onnxruntime's CUDA provider)."""

    family: str
    kernel_format: KernelFormat
    tiles_on_chip: bool
    on_gpu: bool

    def build_all(self, programs: Sequence[TileProgram], target: Target,
                  on_kernel: Callable[[bool], None] | None = None) -> list[KernelArtifact]:
        """One built kernel per program, in order (raises CompileError); ``on_kernel(cached)``
        once per distinct kernel as it is ready (``cached``: it came from the build cache)."""
        raise NotImplementedError

    def executor(self) -> type:
        """The executor class that runs this family's plans (``runtime/session.py`` says
        what an executor offers)."""
        raise NotImplementedError

    def launch_type(self) -> type[LaunchRecord]:
        """The launch record this family's kernels carry."""
        raise NotImplementedError

    def decode_launch(self, dec: Fields, d: dict, where: str, n_params: int, symbol: str) -> LaunchRecord:
        """The launch record of a manifest's ``launch`` object, checked (PlanError through
        ``dec``, naming the field)."""
        raise NotImplementedError
