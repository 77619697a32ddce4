"""Bad input reaches the user as an onnxruntime error carrying tilefuse's message, never
a crash: a kernel file missing, inputs of other shapes than the export's, a model
without a path, the custom-op library registered from elsewhere than beside the model."""
import shutil

import numpy as np
import onnx
import onnxruntime as ort
import pytest

MODES = ["ep", "custom-ops"]


@pytest.fixture
def mlp_export(exports, tmp_path):
    """A private copy of the mlp export (tests below damage it), per mode."""

    def copy(mode: str):
        _, result = exports("mlp", mode)
        out = tmp_path / mode
        shutil.copytree(result.model_path.parent, out)
        return out

    return copy


def _options(mode, folder, ep_options):
    if mode == "ep":
        return ep_options()
    so = ort.SessionOptions()
    so.register_custom_ops_library(str(folder / "libtilefuse_ops.so"))
    return so


@pytest.mark.parametrize("mode", MODES)
def test_missing_kernel_library(mode, mlp_export, ep_options):
    folder = mlp_export(mode)
    victim = sorted((folder / "kernels").glob("*.so"))[0]
    victim.unlink()
    with pytest.raises(Exception, match=r"tilefuse: node \S+: kernel \S+: cannot load .*" + victim.name):
        sess = ort.InferenceSession(str(folder / "model.onnx"), _options(mode, folder, ep_options))
        sess.run(None, {"x": np.zeros((4, 64), np.float32)})  # custom ops may load lazily


@pytest.mark.parametrize("mode", MODES)
def test_missing_kernel_descriptor(mode, mlp_export, ep_options):
    folder = mlp_export(mode)
    victim = sorted((folder / "kernels").glob("*.tfk"))[0]
    victim.unlink()
    with pytest.raises(Exception, match=r"tilefuse: node \S+: kernel descriptor \S+" + victim.name + " cannot be opened"):
        sess = ort.InferenceSession(str(folder / "model.onnx"), _options(mode, folder, ep_options))
        sess.run(None, {"x": np.zeros((4, 64), np.float32)})


@pytest.mark.parametrize("symbol", ["abort", "exit", "free", "tf_run_steps"])
@pytest.mark.parametrize("mode", MODES)
def test_a_descriptor_naming_another_function_is_refused(mode, symbol, mlp_export, ep_options):
    """A descriptor's symbol must be the generated entry of its own kernel: ``abort`` (in
    libc, which every kernel library links) would otherwise run inside onnxruntime."""
    folder = mlp_export(mode)
    for tfk in (folder / "kernels").glob("*.tfk"):
        lines = [f"symbol {symbol}" if line.startswith("symbol ") else line for line in tfk.read_text().splitlines()]
        tfk.write_text("\n".join(lines) + "\n")
    with pytest.raises(Exception, match=rf"symbol '{symbol}' is not a generated kernel entry"):
        sess = ort.InferenceSession(str(folder / "model.onnx"), _options(mode, folder, ep_options))
        sess.run(None, {"x": np.zeros((4, 64), np.float32)})


@pytest.mark.parametrize("mode", MODES)
def test_a_kernel_changed_after_export_is_refused(mode, mlp_export, ep_options):
    """The libraries load only the bytes the export recorded (each descriptor's sha256):
    a kernel file with a byte flipped (an ELF that still loads) is refused, not run."""
    folder = mlp_export(mode)
    victim = sorted((folder / "kernels").glob("*.so"))[0]
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0xFF  # past the code: the library would load and run as before
    victim.write_bytes(bytes(data))
    with pytest.raises(Exception, match=rf"tilefuse: node \S+: kernel \S+: \S+{victim.name}: sha256 .* is not the "
                                        r"exported kernel's .*modified after export"):
        sess = ort.InferenceSession(str(folder / "model.onnx"), _options(mode, folder, ep_options))
        sess.run(None, {"x": np.zeros((4, 64), np.float32)})


@pytest.mark.parametrize("mode", MODES)
def test_a_descriptor_without_its_kernel_digest_is_refused(mode, mlp_export, ep_options):
    folder = mlp_export(mode)
    for tfk in (folder / "kernels").glob("*.tfk"):
        tfk.write_text("".join(line for line in tfk.read_text().splitlines(keepends=True) if not line.startswith("sha256 ")))
    with pytest.raises(Exception, match="no sha256 line: the kernel's bytes cannot be checked"):
        sess = ort.InferenceSession(str(folder / "model.onnx"), _options(mode, folder, ep_options))
        sess.run(None, {"x": np.zeros((4, 64), np.float32)})


@pytest.mark.parametrize("mode", MODES)
def test_inputs_of_other_shapes(mode, mlp_export, ep_options):
    folder = mlp_export(mode)
    sess = ort.InferenceSession(str(folder / "model.onnx"), _options(mode, folder, ep_options))
    assert sess.run(None, {"x": np.ones((4, 64), np.float32)})[0].shape == (4, 10)
    with pytest.raises(Exception, match=r"tilefuse: .* was exported for input 0 of type 1 and shape \[4,64\], "
                                        r"got type 1 and shape \[5,64\]; export the model again"):
        sess.run(None, {"x": np.ones((5, 64), np.float32)})
    # the session survives the refusal
    assert sess.run(None, {"x": np.ones((4, 64), np.float32)})[0].shape == (4, 10)


def test_ep_model_loaded_from_bytes(mlp_export, ep_options):
    folder = mlp_export("ep")
    data = onnx.load(str(folder / "model.onnx")).SerializeToString()  # weights inline: only the kernels are files
    with pytest.raises(Exception, match="tilefuse: node .*the model has no path"):
        ort.InferenceSession(data, ep_options())


def test_custom_op_library_from_elsewhere(mlp_export):
    from tilefuse.ort import custom_ops_library_path

    folder = mlp_export("custom-ops")
    so = ort.SessionOptions()
    so.register_custom_ops_library(custom_ops_library_path())  # the cached build, not the copy beside the model
    with pytest.raises(Exception, match="register the library that export-ort wrote beside the model"):
        sess = ort.InferenceSession(str(folder / "model.onnx"), so)
        sess.run(None, {"x": np.zeros((4, 64), np.float32)})


def test_export_copies_only_the_kernel_bytes_the_plan_linked(tmp_path):
    """A kernel library changed since the plan was linked (the build cache, rewritten) is
    refused, not copied beside the exported model."""
    from tests.plan.handmade import mlp_plan
    from tilefuse.errors import PlanError
    from tilefuse.ort.stitch import Stitcher

    _, plan = mlp_plan(tmp_path / "build")
    kernel = next(iter(plan.kernels.values()))
    stitcher = Stitcher(tmp_path / "out", "custom-ops", False)
    rel = stitcher._write_kernel(kernel, ())
    assert (tmp_path / "out" / "kernels" / f"{kernel.name}.so").read_bytes() == kernel.path.read_bytes()
    assert rel.endswith(".tfk")
    kernel.path.write_bytes(kernel.path.read_bytes() + b"changed")
    with pytest.raises(PlanError, match="sha256 .* the file was modified"):
        Stitcher(tmp_path / "out2", "custom-ops", False)._write_kernel(kernel, ())
