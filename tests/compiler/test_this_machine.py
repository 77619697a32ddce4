"""A CPU plan built for this machine's instruction set (``--cpu-isa native``, the default)
is built for its caches too: the target's on-chip budget is the host's L2 per core, as
Linux describes it (tilefuse/device.py ``host_l2_per_core``, target.py
``for_this_machine``). A portable ISA level and a device the caller set are kept."""
from __future__ import annotations

import dataclasses

import pytest

from tilefuse.device import X86_SERVER, host_l2_per_core
from tilefuse.target import CPU, CUDA_SM90A, adjust, for_this_machine


def _cache(root, index: int, level: int, kind: str, size: str, shared: str) -> None:
    d = root / f"index{index}"
    d.mkdir(parents=True)
    (d / "level").write_text(f"{level}\n")
    (d / "type").write_text(f"{kind}\n")
    (d / "size").write_text(f"{size}\n")
    (d / "shared_cpu_list").write_text(f"{shared}\n")


@pytest.mark.parametrize("size, shared, want", [("2048K", "0", 2 << 20), ("1280K", "0,32", 640 << 10),
                                                ("4M", "0-3", 1 << 20), ("512K", "0-1,8-9", 128 << 10)])
def test_the_l2_per_core_is_read_as_linux_describes_it(tmp_path, size, shared, want):
    _cache(tmp_path, 0, 1, "Data", "48K", "0")
    _cache(tmp_path, 1, 1, "Instruction", "32K", "0")
    _cache(tmp_path, 2, 2, "Unified", size, shared)
    _cache(tmp_path, 3, 3, "Unified", "300M", "0-63")
    assert host_l2_per_core(str(tmp_path)) == want


@pytest.mark.parametrize("case", ["missing", "no level 2", "garbled"])
def test_a_host_that_does_not_say_gives_no_l2(tmp_path, case):
    if case == "no level 2":
        _cache(tmp_path, 0, 1, "Data", "48K", "0")
    elif case == "garbled":
        _cache(tmp_path, 2, 2, "Unified", "lots", "0")
    assert host_l2_per_core(str(tmp_path / "cache" if case == "missing" else tmp_path)) == 0


def test_only_a_native_cpu_target_on_the_assumed_device_takes_this_machines_cache():
    native = for_this_machine(CPU)
    l2 = host_l2_per_core()
    assert native.device.onchip_bytes == (l2 or X86_SERVER.onchip_bytes)
    assert dataclasses.replace(native, device=X86_SERVER) == CPU  # nothing else changes
    portable = adjust(CPU, codegen__isa="x86-64-v3")
    assert for_this_machine(portable) is portable
    theirs = adjust(CPU, device__onchip_bytes=256 * 1024)
    assert for_this_machine(theirs) is theirs
    assert for_this_machine(CUDA_SM90A) is CUDA_SM90A
