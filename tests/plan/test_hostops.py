"""Host steps name opaque primitives by class and JSON parameters, from an allow-list."""
import pytest

from tilefuse.errors import PlanError
from tilefuse.ir.prims import CumProd, CumSum, MatMul, Transpose, TopK
from tilefuse.plan.hostops import HOST_PRIMITIVES, primitive_from_json, primitive_to_json


def test_allow_list_is_the_opaque_primitives():
    assert HOST_PRIMITIVES == {"TopK": TopK, "CumSum": CumSum, "CumProd": CumProd}


@pytest.mark.parametrize("prim", [TopK(axis=2, k=3, largest=False), CumSum(0, exclusive=True), CumProd(1, reverse=True)])
def test_round_trip(prim):
    name, params = primitive_to_json(prim)
    assert primitive_from_json(name, params, "here") == prim


@pytest.mark.parametrize("prim", [MatMul(), Transpose((1, 0))])
def test_fused_primitives_are_not_host_steps(prim):
    with pytest.raises(PlanError, match="cannot run as a host step"):
        primitive_to_json(prim)


@pytest.mark.parametrize(
    "name, params, message",
    [
        ("os.system", {}, "unknown host primitive 'os.system'"),
        (["TopK"], {}, "unknown host primitive"),
        ("MatMul", {}, "unknown host primitive 'MatMul'"),
        ("TopK", [1, 2], "params must be an object"),
        ("TopK", {"axis": 1}, "missing 1 required positional argument: 'k'"),
        ("TopK", {"axis": 1.0, "k": 2}, r"TopK\.axis: expected int, got 1\.0"),
        ("CumSum", {"axis": 0, "reverse": 1}, r"CumSum\.reverse: expected bool, got 1"),
    ],
)
def test_bad_host_steps(name, params, message):
    with pytest.raises(PlanError, match=f"here: .*{message}"):
        primitive_from_json(name, params, "here")
