"""manifest.json: the plan as JSON, and back with every field checked.

Decoding trusts nothing: each field is type-checked and a bad one gives a PlanError
naming the manifest file and the field's path (``steps[3].inputs[1]``). Cross-references
(buffer ids, kernel names, types) are checked afterwards by ``verify_plan``.
"""
from __future__ import annotations

from pathlib import Path

from tilefuse.codegen.artifact import ROLES, ParamSpec
from tilefuse.errors import PlanError
from tilefuse.ir.dtypes import DType
from tilefuse.ir.types import TensorType
from tilefuse.plan.hostops import primitive_from_json, primitive_to_json
from tilefuse.plan.model import (
    FORMAT_VERSION,
    Binding,
    Buffer,
    BufferKind,
    HostStep,
    IndexSite,
    Kernel,
    KernelStep,
    Plan,
    Step,
)


def encode(plan: Plan, kernel_files: dict[str, str]) -> dict[str, object]:
    """The manifest of ``plan``; ``kernel_files`` maps kernel names to plan-relative paths."""
    kernels = []
    for k in plan.kernels.values():
        kernels.append({
            "name": k.name, "file": kernel_files[k.name], "symbol": k.symbol, "sha256": k.sha256,
            "launch": dict(k.launch),
            "params": [{"name": p.name, "dtype": p.dtype, "shape": list(p.shape), "role": p.role} for p in k.params],
        })
    report = plan.memory_report()
    return {
        "format_version": FORMAT_VERSION,
        "tilefuse_version": plan.tilefuse_version,
        "source_model_sha256": plan.source_sha256,
        "source_model_path": plan.source_path,
        "target": plan.target,
        "inputs": [_binding(plan, b) for b in plan.inputs],
        "outputs": [_binding(plan, b) for b in plan.outputs],
        "arena_bytes": plan.arena_bytes,
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
        return step
    name, params = primitive_to_json(s.primitive)
    return {"op": "host", "primitive": name, "params": params, "group": s.group, "node": s.node,
            "inputs": list(s.inputs), "outputs": list(s.outputs)}


class Decoder:
    """Reads one manifest; ``source`` names the file in every error."""

    def __init__(self, data: object, source: str, root: Path) -> None:
        self.source = source
        self.root = root
        self.data = self.obj(data, "the manifest")

    def fail(self, where: str, msg: str) -> PlanError:
        return PlanError(f"{self.source}: {where.lstrip('.') or 'top level'}: {msg}")

    # -- typed field access -------------------------------------------------------
    def obj(self, x: object, where: str) -> dict:
        if not isinstance(x, dict):
            raise self.fail(where, f"expected an object, got {type(x).__name__}")
        return x

    def get(self, d: dict, key: str, typ: type | tuple[type, ...], where: str) -> object:
        if key not in d:
            raise self.fail(where, f"missing field {key!r}")
        x = d[key]
        # bool is an int subclass: a true/false where a number belongs is a corruption.
        if not isinstance(x, typ) or (isinstance(x, bool) and bool not in (typ if isinstance(typ, tuple) else (typ,))):
            raise self.fail(f"{where}.{key}", f"expected {typ}, got {x!r}")
        return x

    def ints(self, d: dict, key: str, where: str) -> tuple[int, ...]:
        xs = self.get(d, key, list, where)
        if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in xs):  # type: ignore[union-attr]
            raise self.fail(f"{where}.{key}", f"expected non-negative integers, got {xs!r}")
        return tuple(xs)  # type: ignore[arg-type]

    def items(self, d: dict, key: str, where: str) -> list[tuple[dict, str]]:
        xs = self.get(d, key, list, where)
        return [(self.obj(x, f"{where}{key}[{i}]"), f"{where}{key}[{i}]") for i, x in enumerate(xs)]  # type: ignore[arg-type]

    def dtype(self, d: dict, where: str) -> DType:
        name = self.get(d, "dtype", str, where)
        try:
            return DType(name)
        except ValueError:
            raise self.fail(f"{where}.dtype", f"unknown dtype {name!r}") from None

    def type(self, d: dict, where: str) -> TensorType:
        return TensorType(self.dtype(d, where), self.ints(d, "shape", where))

    # -- sections -------------------------------------------------------------------
    def header(self) -> dict[str, object]:
        d = self.data
        return {
            "format_version": self.get(d, "format_version", int, ""),
            "tilefuse_version": self.get(d, "tilefuse_version", str, ""),
            "source_model_sha256": self.get(d, "source_model_sha256", str, ""),
            "source_model_path": d.get("source_model_path", "") if isinstance(d.get("source_model_path", ""), str) else "",
            "target": self.get(d, "target", str, ""),
            "arena_bytes": self.get(d, "arena_bytes", int, ""),
        }

    def buffers(self) -> tuple[Buffer, ...]:
        out = []
        for d, where in self.items(self.data, "buffers", ""):
            kind = self.get(d, "kind", str, where)
            if kind not in {k.value for k in BufferKind}:
                raise self.fail(f"{where}.kind", f"unknown buffer kind {kind!r}")
            offset = d.get("offset")
            if offset is not None and (not isinstance(offset, int) or isinstance(offset, bool)):
                raise self.fail(f"{where}.offset", f"expected an integer or null, got {offset!r}")
            buf = Buffer(self.get(d, "id", int, where), self.get(d, "name", str, where), BufferKind(kind),  # type: ignore[arg-type]
                         self.type(d, where), offset)
            if self.get(d, "nbytes", int, where) != buf.nbytes:
                raise self.fail(f"{where}.nbytes", f"{d['nbytes']} does not match {buf.type}")
            out.append(buf)
        return tuple(out)

    def bindings(self, key: str, buffers: tuple[Buffer, ...]) -> tuple[Binding, ...]:
        out = []
        for d, where in self.items(self.data, key, ""):
            b = Binding(self.get(d, "name", str, where), self.get(d, "buffer", int, where))  # type: ignore[arg-type]
            if not 0 <= b.buffer < len(buffers) or buffers[b.buffer].type != self.type(d, where):
                raise self.fail(where, f"type {d.get('dtype')}{d.get('shape')} differs from buffer {b.buffer}")
            out.append(b)
        return tuple(out)

    def kernels(self) -> dict[str, Kernel]:
        out: dict[str, Kernel] = {}
        for d, where in self.items(self.data, "kernels", ""):
            params = []
            for p, pw in self.items(d, "params", f"{where}."):
                role = self.get(p, "role", str, pw)
                if role not in ROLES:
                    raise self.fail(f"{pw}.role", f"expected one of {ROLES}, got {role!r}")
                t = self.type(p, pw)
                params.append(ParamSpec(self.get(p, "name", str, pw), str(t.dtype), t.shape, role))  # type: ignore[arg-type]
            name = self.get(d, "name", str, where)
            kernel = Kernel(name, self.get(d, "symbol", str, where), self.kernel_path(d, where),  # type: ignore[arg-type]
                            self.get(d, "sha256", str, where), self.get(d, "launch", dict, where), tuple(params))  # type: ignore[arg-type]
            if out.setdefault(name, kernel) is not kernel:  # type: ignore[arg-type]
                raise self.fail(where, f"kernel {name!r} listed twice")
        return out

    def kernel_path(self, d: dict, where: str) -> Path:
        """The kernel file, which must stay inside the plan directory."""
        rel = Path(self.get(d, "file", str, where))  # type: ignore[arg-type]
        if rel.is_absolute() or ".." in rel.parts:
            raise self.fail(f"{where}.file", f"{str(rel)!r} must be a path inside the plan")
        return self.root / rel

    def steps(self) -> tuple[Step, ...]:
        out: list[Step] = []
        for d, where in self.items(self.data, "steps", ""):
            op = self.get(d, "op", str, where)
            ins, outs = self.ints(d, "inputs", where), self.ints(d, "outputs", where)
            group = self.get(d, "group", int, where)
            if op == "kernel":
                sites = tuple(IndexSite(self.get(x, "what", str, xw), self.get(x, "extent", int, xw))  # type: ignore[arg-type]
                              for x, xw in (self.items(d, "sites", f"{where}.") if "sites" in d else []))
                out.append(KernelStep(self.get(d, "kernel", str, where), ins, outs, group, sites))  # type: ignore[arg-type]
            elif op == "host":
                prim = primitive_from_json(d.get("primitive"), d.get("params"), f"{self.source}: {where}")
                out.append(HostStep(prim, ins, outs, group, self.get(d, "node", str, where)))  # type: ignore[arg-type]
            else:
                raise self.fail(f"{where}.op", f"unknown step op {op!r} (expected 'kernel' or 'host')")
        return tuple(out)
