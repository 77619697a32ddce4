"""`--const` on the command line: `optimize` specialises an If on the bound input, `run
--check` feeds onnxruntime the value the plan was compiled with, and bad values are one
line and exit 2."""
import onnx

from tests.compiler.if_models import sample_rate_model
from tilefuse.cli.main import main


def test_cli_const_specialises_branches_of_different_shapes(tmp_path, capsys):
    path = tmp_path / "rate.onnx"
    onnx.save(sample_rate_model(else_shape=(1, 32, 16)), str(path))
    plan = tmp_path / "rate.tfplan"
    assert main(["optimize", str(path), "-o", str(plan)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "different output types" in err and "--const" in err
    assert main(["optimize", str(path), "--const", "sample_rate=44100", "-o", str(plan)]) == 0
    capsys.readouterr()
    assert main(["run", str(plan), "--random", "--check", "--const", "sample_rate=44100"]) == 0
    out = capsys.readouterr().out
    assert "y: float32[1, 32, 16]" in out and "ok" in out
    assert main(["run", str(plan), "--random", "--check"]) == 2  # onnxruntime needs sample_rate too
    assert "--const" in capsys.readouterr().err
    assert main(["optimize", str(path), "--const", "sample_rate=16k", "-o", str(plan)]) == 2
    assert "numbers or true/false" in capsys.readouterr().err
