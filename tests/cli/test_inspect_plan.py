"""`tilefuse inspect PLAN.tfplan`: each kernel of a compiled plan with its schedule record."""
import json

from tilefuse.cli.main import main
from tilefuse.compiler import compile_graph
from tilefuse.target import CPU

from tests.plan.handmade import mlp_graph


def test_inspect_a_plan_lists_each_kernel_with_its_schedule(tmp_path, capsys):
    plan = compile_graph(mlp_graph(8, 16, 32), CPU).plan
    path = plan.save(tmp_path / "mlp.tfplan")
    assert main(["inspect", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("plan for cpu:")
    for k in plan.kernels.values():
        line = next(x for x in lines if k.name in x)
        assert "  gemm: batch=() m=8 " in line
        assert f"tile_m={k.schedule['tile_m']} " in line and f"threads={k.schedule['threads']} " in line
    assert main(["inspect", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["target"] == "cpu" and {k["name"]: k["schedule"] for k in data["kernels"]} == {
        n: k.schedule for n, k in plan.kernels.items()}
