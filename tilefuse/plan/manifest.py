"""manifest.json: the plan as JSON, and back with every field checked.

Decoding trusts nothing: each field is type- and range-checked and a bad one gives a
PlanError naming the manifest file and the field's path (``steps[3].inputs[1]``). Sizes
are bounded before anything is allocated from them; a kernel's file and symbol must be
the ones its name gives (the family's ``kernel_format``), its launch data decodes to
the family's launch record (``codegen/launch.py``, the one encoder and decoder of that
form), and its schedule record, where there is one, is a small object of scalars.
Cross-references (buffer ids, kernel names,
types, arena placement) are checked afterwards by ``verify_plan``.
"""
from __future__ import annotations

import hashlib
import json

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar, overload

from tilefuse import backends
from tilefuse.codegen.artifact import ROLES, ParamSpec
from tilefuse.errors import PlanError
from tilefuse.ir.dtypes import DType
from tilefuse.ir.types import TensorType
from tilefuse.plan.hostops import primitive_from_json, primitive_to_json
from tilefuse.plan.model import (
    FORMAT_VERSION, KERNEL_NAME, PRECISIONS, Binding, BranchStep, Buffer, BufferKind, HostStep, IndexSite, Kernel,
    KernelStep, Plan, SelectStep, Step, StepFacts,
)

# Bounds on what a manifest may ask for, far beyond any model, so that a corrupt number is
# refused here rather than allocated (10**23 bytes) or multiplied out.
MAX_BYTES = 1 << 48  # of one tensor, or of the arena: 256 TiB
MAX_RANK = 32
MAX_COUNT = 1 << 31  # ids, group numbers
SHA256 = re.compile(r"[0-9a-f]{64}")
CPU_FLAG = re.compile(r"[a-z0-9_]{1,40}")
# A kernel's schedule record (information only): an object of at most MAX_FIELDS fields
# named like identifiers, each a scalar or a list of at most MAX_ITEMS scalars or of such
# lists (a staged kernel's product tiles), strings at most MAX_TEXT long.
FIELD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
MAX_FIELDS, MAX_ITEMS, MAX_TEXT = 64, 64, 2048
# A step's facts (information only, StepFacts): its optional numbers, and its bound's names.
FACT_NUMBERS = ("estimated_seconds", "floor_seconds", "flops", "bytes")
MAX_FACT = 1e21  # FLOPs, bytes or seconds of one step: far beyond any model
BOUNDS = ("", "compute", "memory")

T = TypeVar("T")


def encode(plan: Plan, kernel_files: dict[str, str], weights_sha256: str) -> dict[str, object]:
    """The manifest of ``plan``; ``kernel_files`` maps kernel names to plan-relative paths,
    ``weights_sha256`` is the hash of the weights file written beside it."""
    kernels = []
    for k in plan.kernels.values():
        kernel: dict[str, object] = {
            "name": k.name, "file": kernel_files[k.name], "symbol": k.symbol, "sha256": k.sha256,
            "launch": k.launch.encode(),
            "params": [{"name": p.name, "dtype": p.dtype, "shape": list(p.shape), "role": p.role} for p in k.params],
        }
        if k.schedule:
            kernel["schedule"] = k.schedule
        kernels.append(kernel)
    report = plan.memory_report()
    return {
        "format_version": FORMAT_VERSION,
        "tilefuse_version": plan.tilefuse_version,
        "source_model_sha256": plan.source_sha256,
        "source_model_path": plan.source_path,
        "target": plan.target,
        "precision": plan.precision,
        "target_fingerprint": plan.target_fingerprint,
        "target_spec": plan.target_spec,
        "cpu_requires": list(plan.cpu_requires),
        "inputs": [_binding(plan, b) for b in plan.inputs],
        "outputs": [_binding(plan, b) for b in plan.outputs],
        "arena_bytes": plan.arena_bytes,
        "weights_sha256": weights_sha256,
        "intermediate_bytes": report.intermediate_bytes,
        "buffers": [
            {"id": b.id, "name": b.name, "kind": b.kind.value, "dtype": str(b.type.dtype),
             "shape": list(b.type.shape), "nbytes": b.nbytes, "offset": b.offset}
            for b in plan.buffers
        ],
        "kernels": kernels,
        "steps": [_step(s) for s in plan.steps],
    }


def _binding(plan: Plan, b: Binding) -> dict[str, object]:
    t = plan.buffers[b.buffer].type
    return {"name": b.name, "dtype": str(t.dtype), "shape": list(t.shape), "buffer": b.buffer}


def _step(s: Step) -> dict[str, object]:
    if isinstance(s, KernelStep):
        step: dict[str, object] = {"op": "kernel", "kernel": s.kernel, "group": s.group, "inputs": list(s.inputs),
                                   "outputs": list(s.outputs)}
        if s.sites:
            step["sites"] = [{"what": x.what, "extent": x.extent} for x in s.sites]
        return _with_facts(step, s.facts)
    if isinstance(s, BranchStep):
        return {"op": "branch", "then_steps": s.then_steps, "else_steps": s.else_steps, "group": s.group,
                "node": s.node, "inputs": list(s.inputs), "outputs": []}
    if isinstance(s, SelectStep):  # inputs: the condition, the then values, the else values
        return {"op": "select", "group": s.group, "node": s.node, "inputs": list(s.inputs), "outputs": list(s.outputs)}
    name, params = primitive_to_json(s.primitive)
    return _with_facts({"op": "host", "primitive": name, "params": params, "group": s.group, "node": s.node,
                        "inputs": list(s.inputs), "outputs": list(s.outputs)}, s.facts)


def _with_facts(step: dict[str, object], facts: StepFacts | None) -> dict[str, object]:
    """``step`` with its ``facts`` object where there are facts (only the known fields)."""
    if facts is not None:
        record: dict[str, object] = {"onnx_nodes": list(facts.onnx_nodes), "onnx_ops": list(facts.onnx_ops)}
        for key in FACT_NUMBERS:
            if getattr(facts, key) is not None:
                record[key] = getattr(facts, key)
        if facts.bound:
            record["bound"] = facts.bound
        step["facts"] = record
    return step


@dataclass(frozen=True, slots=True)
class Header:
    """The manifest's top-level fields of a plan of this format version, checked."""

    source_sha256: str
    source_path: str
    target: str
    precision: str
    target_spec: dict
    target_fingerprint: str
    cpu_requires: tuple[str, ...]
    arena_bytes: int
    weights_sha256: str


class Decoder:
    """Reads one manifest; ``source`` names the file in every error."""

    def __init__(self, data: object, source: str, root: Path) -> None:
        self.source = source
        self.root = root
        self.data = self.obj(data, "the manifest")
        self.backend: backends.Backend | None = None  # the target's family, once check_target has run

    def fail(self, where: str, msg: str) -> PlanError:
        return PlanError(f"{self.source}: {where.lstrip('.') or 'top level'}: {msg}")

    # -- typed field access -------------------------------------------------------
    def obj(self, x: object, where: str) -> dict:
        if not isinstance(x, dict):
            raise self.fail(where, f"expected an object, got {type(x).__name__}")
        return x

    @overload
    def get(self, d: dict, key: str, typ: type[T], where: str) -> T: ...
    @overload  # the form codegen/launch.py's Fields protocol declares
    def get(self, d: dict, key: str, typ: type | tuple[type, ...], where: str) -> object: ...

    def get(self, d: dict, key: str, typ: type | tuple[type, ...], where: str) -> object:
        if key not in d:
            raise self.fail(where, f"missing field {key!r}")
        x = d[key]
        # bool is an int subclass: a true/false where a number belongs is a corruption.
        if not isinstance(x, typ) or (isinstance(x, bool) and bool not in (typ if isinstance(typ, tuple) else (typ,))):
            name = typ.__name__ if isinstance(typ, type) else " or ".join(t.__name__ for t in typ)
            raise self.fail(f"{where}.{key}", f"expected {name}, got {show(x)}")
        return x

    def integer(self, d: dict, key: str, where: str, lo: int = 0, hi: int = MAX_COUNT) -> int:
        x = self.get(d, key, int, where)
        if not lo <= x <= hi:
            raise self.fail(f"{where}.{key}", f"{show(x)} is outside [{lo}, {hi}]")
        return x

    def ints(self, d: dict, key: str, where: str, hi: int = MAX_COUNT, max_len: int = MAX_COUNT) -> tuple[int, ...]:
        xs = self.get(d, key, list, where)
        if len(xs) > max_len:
            raise self.fail(f"{where}.{key}", f"{len(xs)} items, at most {max_len} expected")
        if not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= hi for x in xs):
            raise self.fail(f"{where}.{key}", f"expected integers in [0, {hi}], got {show(xs)}")
        return tuple(xs)

    def items(self, d: dict, key: str, where: str) -> list[tuple[dict, str]]:
        xs = self.get(d, key, list, where)
        return [(self.obj(x, f"{where}{key}[{i}]"), f"{where}{key}[{i}]") for i, x in enumerate(xs)]

    def sha256(self, d: dict, key: str, where: str) -> str:
        x = self.get(d, key, str, where)
        if not SHA256.fullmatch(x):
            raise self.fail(f"{where}.{key}", f"expected 64 lowercase hex digits, got {show(x)}")
        return x

    def dtype(self, d: dict, where: str) -> DType:
        name = self.get(d, "dtype", str, where)
        try:
            return DType(name)
        except ValueError:
            raise self.fail(f"{where}.dtype", f"unknown dtype {show(name)}") from None

    def type(self, d: dict, where: str) -> TensorType:
        dtype = self.dtype(d, where)
        shape = self.ints(d, "shape", where, hi=MAX_BYTES, max_len=MAX_RANK)
        if math.prod(shape) * dtype.itemsize > MAX_BYTES:
            raise self.fail(f"{where}.shape", f"{dtype}{list(shape)} is over {MAX_BYTES} bytes")
        return TensorType(dtype, shape)

    # -- sections -------------------------------------------------------------------
    def version(self) -> tuple[int, str]:
        """The plan's format version and the tilefuse that wrote it: read first, since the
        rest of a plan of another version may differ (the caller explains)."""
        return self.get(self.data, "format_version", int, ""), self.get(self.data, "tilefuse_version", str, "")

    def header(self) -> Header:
        """The top-level fields, once ``version`` is known to be this one."""
        d = self.data
        source_sha256 = self.get(d, "source_model_sha256", str, "")
        source_path = d.get("source_model_path", "")
        target = self.get(d, "target", str, "")
        precision = self.precision(d)
        target_spec, target_fingerprint = self.target_record(d)
        return Header(
            source_sha256, source_path if isinstance(source_path, str) else "", target, precision,
            target_spec, target_fingerprint, self.cpu_requires(d), self.integer(d, "arena_bytes", "", hi=MAX_BYTES),
            self.sha256(d, "weights_sha256", ""),
        )

    def precision(self, d: dict) -> str:
        """Plans written before the field was added computed in float32."""
        x = d.get("precision", "fp32")
        if x not in PRECISIONS:
            raise self.fail("precision", f"expected one of {PRECISIONS}, got {show(x)}")
        return x

    def cpu_requires(self, d: dict) -> tuple[str, ...]:
        """CPU extension names, as /proc/cpuinfo spells them (absent: none recorded)."""
        x = d.get("cpu_requires", [])
        if not isinstance(x, list) or len(x) > 512 or not all(isinstance(f, str) and CPU_FLAG.fullmatch(f) for f in x):
            raise self.fail("cpu_requires", f"expected a list of CPU extension names, got {show(x)}")
        return tuple(x)

    def target_record(self, d: dict) -> tuple[dict, str]:
        """The target spec and its fingerprint, which must agree (both absent, or empty, in
        plans that do not record them). Information only: nothing at load depends on it."""
        spec, fingerprint = d.get("target_spec", {}), d.get("target_fingerprint", "")
        if not isinstance(spec, dict):
            raise self.fail("target_spec", f"expected an object, got {show(spec)}")
        if not isinstance(fingerprint, str):
            raise self.fail("target_fingerprint", f"expected a string, got {show(fingerprint)}")
        if spec or fingerprint:
            if not SHA256.fullmatch(fingerprint):
                raise self.fail("target_fingerprint", f"expected 64 lowercase hex digits, got {show(fingerprint)}")
            actual = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()
            if actual != fingerprint:
                raise self.fail("target_fingerprint", f"{fingerprint} is not the sha256 of target_spec ({actual})")
        return spec, fingerprint

    def check_target(self, target: str) -> None:
        """The target's family must have a backend: it says what kernels and their launch
        data look like."""
        self.backend = backends.find(backends.family(target))
        if self.backend is None:
            raise self.fail("target", f"unknown target {show(target)}; known families: {backends.families()}")

    def buffers(self) -> tuple[Buffer, ...]:
        out = []
        for d, where in self.items(self.data, "buffers", ""):
            kind = self.get(d, "kind", str, where)
            if kind not in {k.value for k in BufferKind}:
                raise self.fail(f"{where}.kind", f"unknown buffer kind {show(kind)}")
            offset = d.get("offset")
            if offset is not None and (not isinstance(offset, int) or isinstance(offset, bool) or not 0 <= offset <= MAX_BYTES):
                raise self.fail(f"{where}.offset", f"expected an integer in [0, {MAX_BYTES}] or null, got {show(offset)}")
            buf = Buffer(self.integer(d, "id", where), self.get(d, "name", str, where), BufferKind(kind),
                         self.type(d, where), offset)
            if self.get(d, "nbytes", int, where) != buf.nbytes:
                raise self.fail(f"{where}.nbytes", f"{show(d['nbytes'])} does not match {buf.type}")
            out.append(buf)
        return tuple(out)

    def bindings(self, key: str, buffers: tuple[Buffer, ...]) -> tuple[Binding, ...]:
        out = []
        for d, where in self.items(self.data, key, ""):
            b = Binding(self.get(d, "name", str, where), self.integer(d, "buffer", where))
            if not 0 <= b.buffer < len(buffers) or buffers[b.buffer].type != self.type(d, where):
                raise self.fail(where, f"type {show(d.get('dtype'))}{show(d.get('shape'))} differs from buffer {b.buffer}")
            out.append(b)
        return tuple(out)

    def kernels(self) -> dict[str, Kernel]:
        assert self.backend is not None, "check_target first"
        fmt = self.backend.kernel_format
        out: dict[str, Kernel] = {}
        for d, where in self.items(self.data, "kernels", ""):
            params = []
            for p, pw in self.items(d, "params", f"{where}."):
                role = self.get(p, "role", str, pw)
                if role not in ROLES:
                    raise self.fail(f"{pw}.role", f"expected one of {ROLES}, got {show(role)}")
                t = self.type(p, pw)
                params.append(ParamSpec(self.get(p, "name", str, pw), str(t.dtype), t.shape, role))
            name = self.get(d, "name", str, where)
            if not KERNEL_NAME.fullmatch(name):
                raise self.fail(f"{where}.name", f"{show(name)} is not a generated kernel name ({KERNEL_NAME.pattern})")
            symbol = self.get(d, "symbol", str, where)
            if symbol != fmt.entry(name):
                raise self.fail(f"{where}.symbol", f"{show(symbol)} is not the entry of kernel {name}, "
                                f"{fmt.entry(name)!r}")
            launch_data = self.obj(self.get(d, "launch", dict, where), f"{where}.launch")
            launch = self.backend.decode_launch(self, launch_data, f"{where}.launch", len(params), symbol)
            kernel = Kernel(name, symbol, self.kernel_path(d, name, where),
                            self.sha256(d, "sha256", where), launch, tuple(params), self.schedule(d, where))
            if out.setdefault(name, kernel) is not kernel:
                raise self.fail(where, f"kernel {name!r} listed twice")
        return out

    def schedule(self, d: dict, where: str) -> dict:
        """A kernel's schedule record: absent in plans written before it was recorded
        (then empty), else an object with a ``family`` name and bounded scalar fields.
        Nothing depends on its values, so only its shape is checked."""
        if "schedule" not in d:
            return {}
        where = f"{where}.schedule"
        x = self.obj(d["schedule"], where)
        if len(x) > MAX_FIELDS:
            raise self.fail(where, f"{len(x)} fields, at most {MAX_FIELDS} expected")
        family = x.get("family")
        if not isinstance(family, str) or not FIELD_NAME.fullmatch(family):
            raise self.fail(f"{where}.family", f"expected a schedule family name, got {show(family)}")
        for key, value in x.items():
            if not isinstance(key, str) or not FIELD_NAME.fullmatch(key):
                raise self.fail(where, f"field name {show(key)} is not an identifier")
            self.schedule_value(value, f"{where}.{key}", depth=2)
        return x

    def schedule_value(self, x: object, where: str, depth: int) -> None:
        """A scalar (null, bool, finite number, short string), or within ``depth`` levels
        a short list of them."""
        if x is None or isinstance(x, bool):
            return
        if isinstance(x, int):
            if abs(x) > MAX_BYTES:
                raise self.fail(where, f"{show(x)} is outside [-{MAX_BYTES}, {MAX_BYTES}]")
            return
        if isinstance(x, float):
            if not math.isfinite(x):
                raise self.fail(where, f"expected a finite number, got {show(x)}")
            return
        if isinstance(x, str):
            if len(x) > MAX_TEXT:
                raise self.fail(where, f"a string of {len(x)} characters, at most {MAX_TEXT} expected")
            return
        if isinstance(x, list) and depth > 0:
            if len(x) > MAX_ITEMS:
                raise self.fail(where, f"{len(x)} items, at most {MAX_ITEMS} expected")
            for i, item in enumerate(x):
                self.schedule_value(item, f"{where}[{i}]", depth - 1)
            return
        raise self.fail(where, f"expected a number, string, bool, null or a short list of them, got {show(x)}")

    def kernel_path(self, d: dict, name: str, where: str) -> Path:
        """The kernel's file: ``kernels/NAME.SUFFIX`` and nothing else, so it stays inside
        the plan (and the loader opens it by that plain name, refusing symlinks)."""
        assert self.backend is not None
        rel = self.get(d, "file", str, where)
        want = f"kernels/{name}{self.backend.kernel_format.suffix}"
        if rel != want:
            raise self.fail(f"{where}.file", f"{show(rel)} must be the plan's own {want!r}, a path inside the plan")
        return self.root / want

    def steps(self) -> tuple[Step, ...]:
        out: list[Step] = []
        for d, where in self.items(self.data, "steps", ""):
            op = self.get(d, "op", str, where)
            ins, outs = self.ints(d, "inputs", where), self.ints(d, "outputs", where)
            group = self.integer(d, "group", where)
            if op == "kernel":
                sites = tuple(IndexSite(self.get(x, "what", str, xw), self.integer(x, "extent", xw, hi=MAX_BYTES))
                              for x, xw in (self.items(d, "sites", f"{where}.") if "sites" in d else []))
                out.append(KernelStep(self.get(d, "kernel", str, where), ins, outs, group, sites,
                                      self.facts(d, where)))
            elif op == "host":
                prim = primitive_from_json(d.get("primitive"), d.get("params"), f"{self.source}: {where}")
                out.append(HostStep(prim, ins, outs, group, self.get(d, "node", str, where),
                                    self.facts(d, where)))
            elif op == "branch":
                out.append(self.branch(d, ins, outs, where))
            elif op == "select":
                out.append(self.select(d, ins, outs, where))
            else:
                raise self.fail(f"{where}.op", f"unknown step op {show(op)} (expected 'kernel', 'host', 'branch' or 'select')")
        return tuple(out)

    def facts(self, d: dict, where: str) -> StepFacts | None:
        """A step's facts: absent in plans written before they were recorded (None), else
        node names and op types (strings), non-negative finite seconds and non-negative
        integer counts (FLOPs, bytes), each number possibly null."""
        if "facts" not in d:
            return None
        where = f"{where}.facts"
        x = self.obj(d["facts"], where)
        onnx_nodes, onnx_ops = (self.texts(x, key, where) for key in ("onnx_nodes", "onnx_ops"))
        estimated, floor = (self.fact(x, key, where) for key in ("estimated_seconds", "floor_seconds"))
        flops, nbytes = (self.fact_count(x, key, where) for key in ("flops", "bytes"))
        bound = x.get("bound", "")
        if bound not in BOUNDS:
            raise self.fail(f"{where}.bound", f"expected one of {BOUNDS}, got {show(bound)}")
        return StepFacts(onnx_nodes, onnx_ops, estimated, floor, flops, nbytes, bound)

    def fact(self, d: dict, key: str, where: str) -> float | None:
        """A non-negative finite number, or null (absent: null)."""
        value = d.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value) or not 0 <= value <= MAX_FACT):
            raise self.fail(f"{where}.{key}", f"expected a non-negative finite number or null, got {show(value)}")
        return value

    def fact_count(self, d: dict, key: str, where: str) -> int | None:
        """A non-negative integer, or null: StepFacts counts FLOPs and bytes in integers."""
        value = self.fact(d, key, where)
        if value is not None and not isinstance(value, int):
            raise self.fail(f"{where}.{key}", f"expected a non-negative integer or null, got {show(value)}")
        return value

    def texts(self, d: dict, key: str, where: str) -> tuple[str, ...]:
        """A list of short strings (an absent one: empty)."""
        xs = d.get(key, [])
        if not isinstance(xs, list) or len(xs) > MAX_COUNT:
            raise self.fail(f"{where}.{key}", f"expected a list of strings, got {show(xs)}")
        if not all(isinstance(x, str) and len(x) <= MAX_TEXT for x in xs):
            raise self.fail(f"{where}.{key}", f"expected strings of at most {MAX_TEXT} characters, got {show(xs)}")
        return tuple(xs)

    def branch(self, d: dict, ins: tuple[int, ...], outs: tuple[int, ...], where: str) -> BranchStep:
        if len(ins) != 1 or outs:
            raise self.fail(where, f"a branch reads its condition only and writes nothing, got inputs {list(ins)} "
                                   f"and outputs {list(outs)}")
        then_steps, else_steps = (self.integer(d, key, where) for key in ("then_steps", "else_steps"))
        return BranchStep(ins[0], then_steps, else_steps, self.integer(d, "group", where), self.get(d, "node", str, where))

    def select(self, d: dict, ins: tuple[int, ...], outs: tuple[int, ...], where: str) -> SelectStep:
        n = len(outs)
        if len(ins) != 1 + 2 * n:
            raise self.fail(f"{where}.inputs", f"a select of {n} outputs reads 1 + 2 x {n} buffers, got {len(ins)}")
        return SelectStep(ins[0], ins[1:1 + n], ins[1 + n:], outs, self.integer(d, "group", where),
                          self.get(d, "node", str, where))


def show(x: object, limit: int = 60) -> str:
    """A value from a manifest in an error message: its repr, cut short (it may be huge)."""
    text = repr(x)
    return text if len(text) <= limit else text[: limit - 3] + "..."
