"""Plan corruptions: a copy of a compiled base plan, changed on disk, then loaded and run
on good feeds. The reference is onnxruntime on the base model: a corruption either gives
that answer (it changed nothing that matters) or a clean error, never a different answer.

Outputs are compared by position (a renamed output is an interface change a caller sees
when asking for it by name, not a wrong value).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
from safetensors.numpy import load_file, save_file

from tests.robustness.cases import Expect, PlanCase
from tests.robustness.gen_models import rng_for

MANIFEST, MANIFEST_DIGEST, WEIGHTS, KERNELS = "manifest.json", "manifest.sha256", "weights.safetensors", "kernels"
E, X = Expect.ERROR, Expect.EITHER
Mutation = Callable[..., None]
MUTATIONS: dict[str, Mutation] = {}


def mutation(fn: Mutation) -> Mutation:
    MUTATIONS[fn.__name__] = fn
    return fn


def mutate(plan: Path, name: str, params: dict[str, Any], outside: Path, base_plan: Callable[[str], Path]) -> None:
    """Apply mutation ``name``; ``base_plan(name)`` is where a base plan lies (for the
    mutations that borrow from the other one)."""
    outside.mkdir(parents=True, exist_ok=True)
    if name == "foreign_weights":
        params = {**params, "other": str(base_plan(params["other"]) / WEIGHTS)}
    MUTATIONS[name](plan, outside, **params)


# -- the manifest -------------------------------------------------------------------------
def _load(plan: Path) -> dict:
    return json.loads((plan / MANIFEST).read_text())


def _save(plan: Path, m: object, digest: bool = True) -> None:
    """The edited manifest with its digest rewritten (as a plan's author would write it), so
    an edit reaches every check after the digest, not only the digest's own. ``digest``
    False keeps the old digest: for edits that make another consistent plan (an input
    swapped, TopK's largest flipped), which only the digest tells from the plan compiled."""
    data = (json.dumps(m, indent=1) + "\n").encode()
    (plan / MANIFEST).write_bytes(data)
    if digest:
        (plan / MANIFEST_DIGEST).write_text(hashlib.sha256(data).hexdigest() + "\n")


@mutation
def manifest_digest_stale(plan: Path, outside: Path) -> None:
    """A harmless edit (the source path) under the digest of the manifest before it."""
    m = _load(plan)
    m["source_model_path"] = "/elsewhere/model.onnx"
    (plan / MANIFEST).write_text(json.dumps(m, indent=1))


def _path(m: dict, path: list) -> tuple[Any, Any]:
    """(container, key) of ``path`` in ``m``; negative list indices count from the end."""
    node: Any = m
    for key in path[:-1]:
        node = node[key]
    return node, path[-1]


@mutation
def manifest_set(plan: Path, outside: Path, path: list, value: Any, digest: bool = True) -> None:
    m = _load(plan)
    node, key = _path(m, path)
    node[key] = value
    _save(plan, m, digest)


@mutation
def manifest_delete(plan: Path, outside: Path, path: list) -> None:
    m = _load(plan)
    node, key = _path(m, path)
    del node[key]
    _save(plan, m)


@mutation
def manifest_copy_field(plan: Path, outside: Path, src: list, dst: list) -> None:
    m = _load(plan)
    s, sk = _path(m, src)
    d, dk = _path(m, dst)
    d[dk] = s[sk]
    _save(plan, m)


@mutation
def manifest_swap(plan: Path, outside: Path, a: list, b: list) -> None:
    m = _load(plan)
    na, ka = _path(m, a)
    nb, kb = _path(m, b)
    na[ka], nb[kb] = nb[kb], na[ka]
    _save(plan, m)


@mutation
def manifest_duplicate_kernel(plan: Path, outside: Path) -> None:
    m = _load(plan)
    m["kernels"].append(dict(m["kernels"][0]))
    _save(plan, m)


@mutation
def manifest_overlap_buffers(plan: Path, outside: Path) -> None:
    """Two arena buffers that one kernel step reads and writes put at the same offset."""
    m = _load(plan)
    arena = {b["id"]: b for b in m["buffers"] if b["offset"] is not None}
    for step in m["steps"]:
        ins = [i for i in step["inputs"] if i in arena]
        outs = [o for o in step["outputs"] if o in arena]
        if ins and outs and arena[ins[0]]["offset"] != arena[outs[0]]["offset"]:
            arena[outs[0]]["offset"] = arena[ins[0]]["offset"]
            _save(plan, m)
            return
    raise ValueError("no step reads and writes arena buffers")


@mutation
def manifest_retype_output(plan: Path, outside: Path, dtype: str) -> None:
    """The first output's buffer and binding say ``dtype`` (same size), consistently."""
    m = _load(plan)
    out = m["outputs"][0]
    buf = next(b for b in m["buffers"] if b["id"] == out["buffer"])
    buf["dtype"] = out["dtype"] = dtype
    _save(plan, m)


@mutation
def manifest_reshape_input(plan: Path, outside: Path) -> None:
    """The last input's buffer and binding get its shape reversed (same size), consistently."""
    m = _load(plan)
    inp = m["inputs"][-1]
    buf = next(b for b in m["buffers"] if b["id"] == inp["buffer"])
    buf["shape"] = inp["shape"] = list(reversed(inp["shape"]))
    _save(plan, m)


@mutation
def manifest_output_is_input(plan: Path, outside: Path) -> None:
    """The first output bound to an input buffer of the same type."""
    m = _load(plan)
    out = m["outputs"][0]
    same = [i for i in m["inputs"] if i["dtype"] == out["dtype"] and i["shape"] == out["shape"]]
    out["buffer"] = (same[0] if same else m["inputs"][0])["buffer"]
    _save(plan, m, digest=False)


@mutation
def manifest_swap_same_type_inputs(plan: Path, outside: Path) -> None:
    """A kernel step given, in place of one constant, another constant of the same type."""
    m = _load(plan)
    consts = {b["id"]: (b["dtype"], tuple(b["shape"])) for b in m["buffers"] if b["kind"] == "constant"}
    for step in m["steps"]:
        for j, b in enumerate(step["inputs"]):
            twins = [c for c, t in consts.items() if c != b and b in consts and t == consts[b]]
            if twins:
                step["inputs"][j] = twins[0]
                _save(plan, m, digest=False)
                return
    raise ValueError("no constant has a twin of its type")


@mutation
def manifest_text(plan: Path, outside: Path, text: str | None = None, raw: str | None = None) -> None:
    """The manifest replaced by ``text`` (utf-8) or ``raw`` (latin-1 bytes)."""
    (plan / MANIFEST).write_bytes(text.encode() if text is not None else (raw or "").encode("latin-1"))


@mutation
def manifest_deep(plan: Path, outside: Path, depth: int, field: str | None = None) -> None:
    if field is None:
        (plan / MANIFEST).write_text("[" * depth + "]" * depth)
        return
    text = (plan / MANIFEST).read_text()
    m = json.loads(text)
    m[field] = "@@DEEP@@"
    (plan / MANIFEST).write_text(json.dumps(m).replace('"@@DEEP@@"', "[" * depth + "]" * depth))


@mutation
def manifest_raw_field(plan: Path, outside: Path, field: str, literal: str) -> None:
    """A field set to a JSON literal written verbatim (NaN, Infinity, a 6000-digit number)."""
    m = _load(plan)
    m[field] = "@@RAW@@"
    (plan / MANIFEST).write_text(json.dumps(m).replace('"@@RAW@@"', literal))


@mutation
def manifest_duplicate_key(plan: Path, outside: Path, field: str, literal: str) -> None:
    text = (plan / MANIFEST).read_text().rstrip()
    assert text.endswith("}")
    (plan / MANIFEST).write_text(text[:-1] + f', "{field}": {literal}}}')


@mutation
def manifest_prefix(plan: Path, outside: Path, prefix: str = "", suffix: str = "", prefix_hex: str = "") -> None:
    data = (plan / MANIFEST).read_bytes()
    (plan / MANIFEST).write_bytes(bytes.fromhex(prefix_hex) + prefix.encode() + data + suffix.encode())


# -- bytes of any file in the plan ----------------------------------------------------------
def _file(plan: Path, which: str) -> Path:
    if which in (MANIFEST, WEIGHTS):
        return plan / which
    kernels = sorted((plan / KERNELS).iterdir())
    return kernels[int(which.removeprefix("kernel")) % len(kernels)]


@mutation
def flip(plan: Path, outside: Path, which: str, fraction: float, mask: int, region: str = "all") -> None:
    """xor one byte at ``fraction`` of the file (of its header or data part for the weights)."""
    path = _file(plan, which)
    data = bytearray(path.read_bytes())
    lo, hi = 0, len(data)
    if which == WEIGHTS and region != "all":
        header = 8 + struct.unpack("<Q", bytes(data[:8]))[0]
        lo, hi = (0, header) if region == "header" else (header, len(data))
    pos = lo + min(int(fraction * (hi - lo)), hi - lo - 1)
    data[pos] ^= mask
    path.write_bytes(bytes(data))


@mutation
def truncate(plan: Path, outside: Path, which: str, fraction: float) -> None:
    path = _file(plan, which)
    data = path.read_bytes()
    path.write_bytes(data[: int(fraction * len(data))])


@mutation
def remove(plan: Path, outside: Path, which: str) -> None:
    path = plan / which if which in (MANIFEST, WEIGHTS, KERNELS) else _file(plan, which)
    shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()


@mutation
def make_directory(plan: Path, outside: Path, which: str) -> None:
    path = _file(plan, which) if which.startswith("kernel") else plan / which
    path.unlink()
    path.mkdir()


@mutation
def make_fifo(plan: Path, outside: Path, which: str) -> None:
    path = _file(plan, which)
    path.unlink()
    os.mkfifo(path)


@mutation
def symlink_out(plan: Path, outside: Path, which: str) -> None:
    """``which`` moved outside the plan (the same bytes) and a symlink left in its place."""
    path = plan / KERNELS if which == KERNELS else _file(plan, which)
    target = outside / path.name
    shutil.move(str(path), target)
    os.symlink(target, path)


@mutation
def symlink_in(plan: Path, outside: Path, which: str) -> None:
    """``which`` renamed inside its own folder and a symlink left under its name."""
    path = _file(plan, which)
    real = path.with_name("real-" + path.name)
    path.rename(real)
    os.symlink(real.name, path)


@mutation
def swap_kernel_files(plan: Path, outside: Path) -> None:
    a, b = sorted((plan / KERNELS).iterdir())[:2]
    da, db = a.read_bytes(), b.read_bytes()
    a.write_bytes(db)
    b.write_bytes(da)


@mutation
def add_files(plan: Path, outside: Path) -> None:
    (plan / "README.txt").write_text("notes\n")
    (plan / KERNELS / "stray.so").write_bytes(b"\x7fELF not really")


@mutation
def foreign_weights(plan: Path, outside: Path, other: str) -> None:
    """The weights of another plan (compiled from another model) put in this one."""
    shutil.copyfile(Path(other), plan / WEIGHTS)


# -- the weights, rewritten with safetensors -------------------------------------------------
def _weights(plan: Path) -> dict[str, np.ndarray]:
    return load_file(plan / WEIGHTS)


@mutation
def weight_value(plan: Path, outside: Path, value: float, index: int = 0) -> None:
    """One weight element set to ``value`` (NaN, inf): a change no format check sees."""
    w = _weights(plan)
    name = sorted(k for k, v in w.items() if v.dtype.kind == "f" and v.size > 1)[index % 2]
    w[name] = w[name].copy()
    w[name].reshape(-1)[3] = value
    save_file(w, plan / WEIGHTS)


@mutation
def weight_retype(plan: Path, outside: Path, dtype: str) -> None:
    w = _weights(plan)
    name = sorted(w)[0]
    w[name] = w[name].astype(dtype)
    save_file(w, plan / WEIGHTS)


@mutation
def weight_reshape(plan: Path, outside: Path) -> None:
    w = _weights(plan)
    name = next(k for k in sorted(w) if w[k].ndim == 2)
    w[name] = np.ascontiguousarray(w[name].T) if w[name].shape[0] != w[name].shape[1] else w[name].reshape(-1)
    save_file(w, plan / WEIGHTS)


@mutation
def weight_extra(plan: Path, outside: Path) -> None:
    w = _weights(plan)
    w["__extra__"] = np.ones(3, np.float32)
    save_file(w, plan / WEIGHTS)


@mutation
def weight_drop(plan: Path, outside: Path) -> None:
    w = _weights(plan)
    del w[sorted(w)[0]]
    save_file(w, plan / WEIGHTS)


@mutation
def weight_header(plan: Path, outside: Path, header: str, size: int | None = None) -> None:
    """A safetensors file with a hand-written header (``size`` overrides its length field)."""
    data = (plan / WEIGHTS).read_bytes()
    old = 8 + struct.unpack("<Q", data[:8])[0]
    body = data[old:]
    raw = header.encode()
    (plan / WEIGHTS).write_bytes(struct.pack("<Q", len(raw) if size is None else size) + raw + body)


@mutation
def weight_alias(plan: Path, outside: Path) -> None:
    """A float tensor's header offsets pointed at the first bytes of a bigger one."""
    data = (plan / WEIGHTS).read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8 : 8 + n])
    floats = sorted(((v["data_offsets"][1] - v["data_offsets"][0], k) for k, v in header.items()
                     if k != "__metadata__" and v["dtype"] == "F32"), reverse=True)
    (_, big), (size, small) = floats[0], floats[-1]
    start = header[big]["data_offsets"][0]
    header[small]["data_offsets"] = [start, start + size]
    raw = json.dumps(header).encode()
    (plan / WEIGHTS).write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + n:])


# -- the cases ---------------------------------------------------------------------------------
def _case(name: str, base: str, expect: Expect, note: str, mut: str, **params: Any) -> PlanCase:
    return PlanCase(f"plan/{base}/{name}", "plan", expect, f"{base} plan: {note}", base=base, mutation=mut,
                    params=tuple(params.items()))


def handmade() -> Iterator[PlanCase]:
    for base in ("lm", "topk"):
        c = lambda name, expect, note, mut, **p: _case(name, base, expect, note, mut, **p)  # noqa: E731
        yield c("control", Expect.RESULT, "unchanged (control)", "add_files")
        yield c("symbol-abort", E, "kernel 0's symbol 'abort'", "manifest_set", path=["kernels", 0, "symbol"], value="abort")
        yield c("symbol-exit", E, "kernel 0's symbol 'exit'", "manifest_set", path=["kernels", 0, "symbol"], value="exit")
        yield c("symbol-driver", E, "kernel 0's symbol 'tf_run_steps' (the step driver)", "manifest_set", path=["kernels", 0, "symbol"], value="tf_run_steps")
        yield c("symbol-empty", E, "kernel 0's symbol ''", "manifest_set", path=["kernels", 0, "symbol"], value="")
        yield c("symbol-dotdot", E, "kernel 0's symbol '../x'", "manifest_set", path=["kernels", 0, "symbol"], value="../x")
        yield c("symbol-swap", X, "kernels 0 and 1 swap symbols", "manifest_swap", a=["kernels", 0, "symbol"], b=["kernels", 1, "symbol"])
        yield c("file-dotdot", E, "kernel 0's file '../x.so'", "manifest_set", path=["kernels", 0, "file"], value="../x.so")
        yield c("file-dotdot-inner", E, "kernel 0's file 'kernels/../../outside/k.so'", "manifest_set", path=["kernels", 0, "file"], value="kernels/../../outside/k.so")
        yield c("file-absolute", E, "kernel 0's file '/lib/x86_64-linux-gnu/libc.so.6'", "manifest_set", path=["kernels", 0, "file"], value="/lib/x86_64-linux-gnu/libc.so.6")
        yield c("file-empty", E, "kernel 0's file ''", "manifest_set", path=["kernels", 0, "file"], value="")
        yield c("file-directory", E, "kernel 0's file 'kernels'", "manifest_set", path=["kernels", 0, "file"], value="kernels")
        yield c("file-manifest", E, "kernel 0's file 'manifest.json'", "manifest_set", path=["kernels", 0, "file"], value="manifest.json")
        yield c("file-other-kernel", E, "kernel 0's file is kernel 1's (its sha256 kept)", "manifest_copy_field", src=["kernels", 1, "file"], dst=["kernels", 0, "file"])
        yield c("name-dotdot", X, "kernel 0 named '../../evil' (its steps still name the old one)", "manifest_set", path=["kernels", 0, "name"], value="../../evil")
        yield c("kernel-duplicate", E, "kernel 0 listed twice", "manifest_duplicate_kernel")
        yield c("kernel-entry-missing", E, "kernel 0's entry removed (steps still call it)", "manifest_delete", path=["kernels", 0])
        yield c("kernel-params-empty", E, "kernel 0's params []", "manifest_set", path=["kernels", 0, "params"], value=[])
        yield c("kernel-sha-short", E, "kernel 0's sha256 'abc'", "manifest_set", path=["kernels", 0, "sha256"], value="abc")
        yield c("launch-list", X, "kernel 0's launch []", "manifest_set", path=["kernels", 0, "launch"], value=[])
        yield c("launch-threads-huge", X, "kernel 0's launch threads 2**40", "manifest_set", path=["kernels", 0, "launch", "threads"], value=2**40)
        yield c("steps-swapped", X, "steps 0 and 1 swapped", "manifest_swap", a=["steps", 0], b=["steps", 1])
        yield c("step-dropped", X, "the last step removed", "manifest_delete", path=["steps", -1])
        yield c("step-repeated", X, "the first step listed twice", "manifest_copy_field", src=["steps", 0], dst=["steps", 1])
        if base == "lm":  # topk's constants all differ in type
            yield c("step-same-type-input", X, "a step reads another constant of the same type", "manifest_swap_same_type_inputs")
        yield c("buffers-overlap", X, "a step's input and output buffers at one arena offset", "manifest_overlap_buffers")
        yield c("buffer-offset-huge", X, "arena buffer offset 2**62", "manifest_set", path=["buffers", -1, "offset"], value=2**62)
        yield c("buffer-offset-negative", X, "arena buffer offset -64", "manifest_set", path=["buffers", -1, "offset"], value=-64)
        yield c("buffer-kind-input", X, "a constant buffer's kind 'input'", "manifest_set", path=["buffers", 2, "kind"], value="input")
        yield c("buffer-id-duplicate", X, "buffer 1's id 0", "manifest_set", path=["buffers", 1, "id"], value=0)
        yield c("output-dtype-int32", X, "the first output (buffer and binding) int32", "manifest_retype_output", dtype="int32")
        yield c("input-shape-reversed", X, "the last input (buffer and binding) of reversed shape", "manifest_reshape_input")
        yield c("output-bound-to-input", X, "the first output bound to an input buffer", "manifest_output_is_input")
        yield c("input-bound-to-output", X, "input 0 bound to the first output's buffer", "manifest_copy_field", src=["outputs", 0, "buffer"], dst=["inputs", 0, "buffer"])
        yield c("output-renamed", X, "the first output renamed 'renamed'", "manifest_set", path=["outputs", 0, "name"], value="renamed")
        yield c("arena-huge", X, "arena_bytes 2**62", "manifest_set", path=["arena_bytes"], value=2**62)
        yield c("arena-2-40", X, "arena_bytes 2**40", "manifest_set", path=["arena_bytes"], value=2**40)
        yield c("arena-negative", X, "arena_bytes -1", "manifest_set", path=["arena_bytes"], value=-1)
        yield c("arena-zero", X, "arena_bytes 0", "manifest_set", path=["arena_bytes"], value=0)
        yield c("arena-true", X, "arena_bytes true", "manifest_set", path=["arena_bytes"], value=True)
        yield c("arena-6000-digits", X, "arena_bytes a 6000-digit number", "manifest_raw_field", field="arena_bytes", literal="9" * 6000)
        yield c("arena-nan", X, "arena_bytes NaN", "manifest_raw_field", field="arena_bytes", literal="NaN")
        yield c("arena-infinity", X, "arena_bytes Infinity", "manifest_raw_field", field="arena_bytes", literal="Infinity")
        yield c("arena-duplicate-key", X, "arena_bytes given twice, the second 64", "manifest_duplicate_key", field="arena_bytes", literal="64")
        yield c("format-version-3", E, "format_version 3 (a later tilefuse's)", "manifest_set", path=["format_version"], value=3)
        yield c("format-version-str", E, "format_version '1'", "manifest_set", path=["format_version"], value="1")
        yield c("format-version-float", X, "format_version 1.0", "manifest_set", path=["format_version"], value=1.0)
        yield c("target-cuda", X, "target 'cuda:sm_90a' (no GPU here)", "manifest_set", path=["target"], value="cuda:sm_90a")
        yield c("target-unknown", E, "target 'tpu'", "manifest_set", path=["target"], value="tpu")
        yield c("extra-field", X, "an unknown top-level field", "manifest_set", path=["surprise"], value={"a": 1})
        for field in ("inputs", "outputs", "buffers", "kernels", "steps", "target", "arena_bytes", "format_version"):
            yield c(f"missing-{field}", X, f"field {field!r} removed", "manifest_delete", path=[field])
        yield c("deep-json", E, "the manifest is 100000 nested lists", "manifest_deep", depth=100000)
        yield c("deep-json-field", E, "a field holding 100000 nested lists", "manifest_deep", depth=100000, field="extra")
        yield c("deep-json-2000", E, "the manifest is 2000 nested lists", "manifest_deep", depth=2000)
        yield c("manifest-list", E, "the manifest is []", "manifest_text", text="[]")
        yield c("manifest-null", E, "the manifest is null", "manifest_text", text="null")
        yield c("manifest-string", E, "the manifest is a JSON string", "manifest_text", text='"plan"')
        yield c("manifest-empty", E, "the manifest is empty", "manifest_text", text="")
        yield c("manifest-not-utf8", E, "the manifest starts with bytes ff fe 00", "manifest_prefix", prefix_hex="fffe00")
        yield c("manifest-bom", X, "the manifest starts with a UTF-8 BOM", "manifest_prefix", prefix="\ufeff")
        yield c("manifest-trailing-garbage", E, "text after the manifest's JSON", "manifest_prefix", prefix="", suffix="\n}garbage")
        yield c("manifest-huge-whitespace", X, "the manifest padded with 8 MB of spaces", "manifest_prefix", prefix=" " * (8 << 20))
        yield c("manifest-digest-stale", E, "an edit under the old manifest.sha256", "manifest_digest_stale")
        yield c("manifest-missing", E, "manifest.json removed", "remove", which=MANIFEST)
        yield c("manifest-directory", E, "manifest.json is a folder", "make_directory", which=MANIFEST)
        yield c("manifest-symlink-out", E, "manifest.json moved outside, a symlink left", "symlink_out", which=MANIFEST)
        yield c("weights-missing", E, "weights.safetensors removed", "remove", which=WEIGHTS)
        yield c("weights-directory", E, "weights.safetensors is a folder", "make_directory", which=WEIGHTS)
        yield c("weights-empty", E, "weights.safetensors empty", "truncate", which=WEIGHTS, fraction=0.0)
        yield c("weights-symlink-out", E, "weights.safetensors moved outside, a symlink left", "symlink_out", which=WEIGHTS)
        yield c("weights-nan", X, "one weight element set to NaN", "weight_value", value=float("nan"))
        yield c("weights-inf", X, "one weight element set to +inf", "weight_value", value=float("inf"), index=1)
        yield c("weights-changed", X, "one weight element set to 123.0", "weight_value", value=123.0)
        yield c("weights-float64", E, "a weight stored as float64", "weight_retype", dtype="float64")
        yield c("weights-int32", E, "a weight stored as int32", "weight_retype", dtype="int32")
        yield c("weights-reshaped", E, "a 2-D weight stored transposed/flattened", "weight_reshape")
        yield c("weights-extra", X, "an extra tensor in the weights", "weight_extra")
        yield c("weights-dropped", E, "a weight removed", "weight_drop")
        yield c("weights-aliased", X, "a weight's offsets pointing into a bigger weight's bytes", "weight_alias")
        yield c("weights-header-huge", E, "the header length field says 2**63", "weight_header", header="{}", size=2**63)
        yield c("weights-header-past-end", E, "the header length field says 1 GiB", "weight_header", header="{}", size=1 << 30)
        yield c("weights-header-not-json", E, "the header is not JSON", "weight_header", header="{not json")
        yield c("weights-header-offsets-out", E, "a tensor's data_offsets past the end",
                "weight_header", header=json.dumps({"w": {"dtype": "F32", "shape": [16, 16], "data_offsets": [0, 1 << 20]}}))
        yield c("weights-header-deep", E, "the header is 100000 nested lists", "weight_header", header="[" * 100000 + "]" * 100000)
        yield c("kernel-missing", E, "kernel 0's file removed", "remove", which="kernel0")
        yield c("kernels-dir-missing", E, "kernels/ removed", "remove", which=KERNELS)
        yield c("kernel-directory", E, "kernel 0's file is a folder", "make_directory", which="kernel0")
        yield c("kernel-fifo", E, "kernel 0's file is a named pipe", "make_fifo", which="kernel0")
        yield c("kernel-truncated", E, "kernel 0's file cut in half", "truncate", which="kernel0", fraction=0.5)
        yield c("kernel-empty", E, "kernel 0's file empty", "truncate", which="kernel0", fraction=0.0)
        yield c("kernel-flipped-elf", E, "kernel 0's ELF magic changed", "flip", which="kernel0", fraction=0.0, mask=0x01)
        yield c("kernel-files-swapped", E, "kernels 0 and 1 swap file contents", "swap_kernel_files")
        yield c("kernel-symlink-out", E, "kernel 0's file moved outside, a symlink left", "symlink_out", which="kernel0")
        yield c("kernel-symlink-in", X, "kernel 0's file renamed beside itself, a symlink left", "symlink_in", which="kernel0")
        yield c("kernels-dir-symlink-out", E, "kernels/ moved outside, a symlink left", "symlink_out", which=KERNELS)
        yield c("weights-foreign", E, "the other base plan's weights", "foreign_weights", other="topk" if base == "lm" else "lm")
    # TopK's host step (the topk plan's steps[1]).
    h = lambda name, expect, note, **p: _case(name, "topk", expect, note, "manifest_set", **p)  # noqa: E731
    yield h("host-k-0", X, "TopK k 0", path=["steps", 1, "params", "k"], value=0)
    yield h("host-k-negative", X, "TopK k -1", path=["steps", 1, "params", "k"], value=-1)
    yield h("host-k-huge", X, "TopK k 10**9", path=["steps", 1, "params", "k"], value=10**9)
    yield h("host-k-3", X, "TopK k 3 (outputs are [4, 4])", path=["steps", 1, "params", "k"], value=3)
    yield h("host-axis-5", X, "TopK axis 5", path=["steps", 1, "params", "axis"], value=5)
    yield h("host-axis-0", X, "TopK axis 0", path=["steps", 1, "params", "axis"], value=0)
    yield h("host-largest-str", X, "TopK largest 'yes'", path=["steps", 1, "params", "largest"], value="yes")
    yield h("host-largest-false", X, "TopK largest false (old digest)", path=["steps", 1, "params", "largest"], value=False, digest=False)
    yield h("host-params-list", X, "TopK params []", path=["steps", 1, "params"], value=[])
    yield h("host-primitive-eval", E, "host primitive 'eval'", path=["steps", 1, "primitive"], value="eval")
    yield h("host-primitive-cumsum", X, "host primitive 'CumSum' with TopK's params", path=["steps", 1, "primitive"], value="CumSum")
    yield h("host-node-dotdot", X, "host step node '../../x'", path=["steps", 1, "node"], value="../../x")
    yield h("host-outputs-one", X, "TopK step with one output", path=["steps", 1, "outputs"], value=[4])


def random_flips(seed: int, count: int) -> list[PlanCase]:
    """Random byte flips and truncations of the manifest, the weights and the kernels."""
    out = []
    for i in range(count):
        rng = rng_for(seed, "plan.random", i)
        base = ("lm", "topk")[i % 2]
        which = str(rng.choice([MANIFEST, MANIFEST, MANIFEST, WEIGHTS, WEIGHTS, "kernel0", "kernel1"]))
        fraction = round(float(rng.random()), 4)
        if rng.random() < 0.25:
            params: dict[str, Any] = {"which": which, "fraction": fraction}
            mut, note = "truncate", f"{which} cut at {fraction:.4f} of its length"
        else:
            mask = 1 << int(rng.integers(0, 8)) if rng.random() < 0.5 else int(rng.integers(1, 256))
            region = str(rng.choice(["header", "data"])) if which == WEIGHTS else "all"
            params = {"which": which, "fraction": fraction, "mask": mask, "region": region}
            mut, note = "flip", f"{which}{'' if region == 'all' else ' ' + region} byte at {fraction:.4f} xor {mask:#04x}"
        # A kernel's bytes are checked by their sha256; the manifest and weights must
        # either not matter or be caught.
        expect = E if which.startswith("kernel") else X
        out.append(PlanCase(f"plan.random/{base}/{mut}:{which}@{fraction}" + (f"^{params['mask']:#04x}" if mut == "flip" else ""),
                            "plan.random", expect, f"{base} plan: {note}", base=base, mutation=mut,
                            params=tuple(params.items())))
    return out
