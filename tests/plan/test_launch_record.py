"""Launch records and their manifest form: one encoder, one decoder, and plans written
before the records keep loading byte for byte (the format is pinned here)."""
import json
from pathlib import Path

import pytest

from tests.plan.handmade import cuda_mlp_plan
from tilefuse import backends
from tilefuse.codegen.launch import CpuLaunch, CudaLaunch, KernelArg, TensorMap
from tilefuse.errors import PlanError
from tilefuse.plan import load_plan
from tilefuse.plan.manifest import Decoder

ENTRY = "matmul_add_0123456789_kernel"
TMA = TensorMap(dtype=6, dims=(64, 128, 4), strides=(128, 32768), box=(64, 32, 1), element_strides=(1, 1, 1),
                interleave=0, swizzle=3, l2_promotion=2, oob_fill=0)
CUDA = CudaLaunch(ENTRY, (4, 2, 1), (384, 1, 1), (KernelArg("A", 0), KernelArg("B_desc", 1, TMA), KernelArg("C", 2)),
                  dynamic_smem=98304, programmatic=True, arch="sm_90a")
CPU = (CpuLaunch(128, (4, 2)), CpuLaunch(1))


def _decode(family: str, data: dict, n_params: int = 3, symbol: str = ENTRY):
    dec = Decoder({}, "manifest.json", Path("."))
    return backends.get(family).decode_launch(dec, data, "kernels[0].launch", n_params, symbol)


@pytest.mark.parametrize("family, record", [("cuda", CUDA), ("cpu", CPU[0]), ("cpu", CPU[1])])
def test_records_round_trip_through_the_manifest_form(family, record):
    data = json.loads(json.dumps(record.encode()))
    assert _decode(family, data) == record
    assert _decode(family, data).encode() == data


def test_the_manifest_form_is_the_one_plans_have_always_had():
    """Key for key and in order, as codegen wrote the dicts before the records: plans of
    format version 2 stay byte-identical."""
    want = {"entry": ENTRY, "grid": [4, 2, 1], "block": [384, 1, 1], "dynamic_smem": 98304, "arch": "sm_90a",
            "programmatic": True, "args": [
                {"name": "A", "kind": "pointer", "param": 0, "tma": {}},
                {"name": "B_desc", "kind": "tensormap", "param": 1, "tma": {
                    "dtype": 6, "rank": 3, "dims": [64, 128, 4], "strides": [128, 32768], "box": [64, 32, 1],
                    "element_strides": [1, 1, 1], "interleave": 0, "swizzle": 3, "l2_promotion": 2, "oob_fill": 0}},
                {"name": "C", "kind": "pointer", "param": 2, "tma": {}}]}
    assert json.dumps(CUDA.encode()) == json.dumps(want)
    assert json.dumps(CPU[0].encode()) == json.dumps({"threads": 128, "grid": [4, 2]})


def test_fields_a_manifest_may_leave_out_take_their_defaults():
    data = {"entry": ENTRY, "grid": [1, 1, 1], "block": [32, 1, 1], "args": [{"name": "x", "kind": "pointer", "param": 0}]}
    assert _decode("cuda", data) == CudaLaunch(ENTRY, (1, 1, 1), (32, 1, 1), (KernelArg("x", 0),))


@pytest.mark.parametrize("data, message", [
    ({}, r"kernels\[0\]\.launch: missing field 'threads'"),
    ({"threads": 0}, r"launch\.threads: 0 is outside"),
    ({"threads": 1, "grid": [-1]}, r"launch\.grid: expected integers"),
])
def test_a_bad_cpu_launch_names_its_field(data, message):
    with pytest.raises(PlanError, match=message):
        _decode("cpu", data)


def test_records_check_their_own_shape():
    with pytest.raises(ValueError, match="3 dimensions"):
        CudaLaunch(ENTRY, (1, 1), (32, 1, 1), ())
    with pytest.raises(ValueError, match="rank 2 tensor map"):
        TensorMap(6, (4, 4), (), (4, 4), (1, 1), 0, 0, 0, 0)


def test_a_saved_plan_loads_the_records_it_was_linked_with(tmp_path):
    _, plan = cuda_mlp_plan(tmp_path / "kernels")
    loaded = load_plan(plan.save(tmp_path / "p.tfplan"))
    assert loaded.kernels and {k: v.launch for k, v in loaded.kernels.items()} == \
        {k: v.launch for k, v in plan.kernels.items()}
    assert all(isinstance(k.launch, CudaLaunch) for k in loaded.kernels.values())
