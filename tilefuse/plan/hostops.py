"""Host steps in a manifest: an opaque primitive as its class name and JSON parameters.

Loading never imports or evaluates anything named by a plan: the class comes from a
fixed allow-list (the opaque primitives exported by ``tilefuse.ir.prims``), and each
parameter is checked against the type annotation of its dataclass field before the
frozen primitive is constructed.
"""
from __future__ import annotations

import enum
import types
import typing
from dataclasses import fields, is_dataclass

from tilefuse.errors import PlanError
from tilefuse.ir import prims
from tilefuse.ir.prims import Kind, Primitive

def _opaque_classes() -> dict[str, type[Primitive]]:
    out = {}
    for name in prims.__all__:
        cls = getattr(prims, name)
        if isinstance(cls, type) and issubclass(cls, Primitive) and getattr(cls, "kind", None) is Kind.OPAQUE:
            out[name] = cls
    return out


# Name -> class, built once from the package's public names; nothing else can be named.
HOST_PRIMITIVES: dict[str, type[Primitive]] = _opaque_classes()


def primitive_to_json(prim: Primitive) -> tuple[str, dict[str, object]]:
    """The allow-listed class name and the fields as JSON values (enums by name)."""
    name = type(prim).__name__
    if HOST_PRIMITIVES.get(name) is not type(prim) or not is_dataclass(prim):
        raise PlanError(f"{name} cannot run as a host step: not an opaque primitive of tilefuse.ir.prims")
    return name, {f.name: _encode(getattr(prim, f.name)) for f in fields(prim)}


def primitive_from_json(name: object, params: object, where: str) -> Primitive:
    """Rebuild a primitive; PlanError (naming ``where``) for any unknown name or bad value."""
    cls = HOST_PRIMITIVES.get(name) if isinstance(name, str) else None
    if cls is None or not is_dataclass(cls):  # every opaque primitive is a dataclass
        raise PlanError(f"{where}: unknown host primitive {name!r}; known: {sorted(HOST_PRIMITIVES)}")
    if not isinstance(params, dict):
        raise PlanError(f"{where}: params must be an object, got {type(params).__name__}")
    hints = typing.get_type_hints(cls)
    declared = {f.name for f in fields(cls)}
    extra = sorted(set(params) - declared)
    if extra:
        raise PlanError(f"{where}: {name} has no parameter(s) {extra}")
    values = {}
    for f in fields(cls):
        if f.name in params:
            values[f.name] = _decode(params[f.name], hints[f.name], f"{where}: {name}.{f.name}")
    try:
        return cls(**values)
    except (TypeError, ValueError) as e:  # a required parameter is missing, or out of range
        raise PlanError(f"{where}: {name}: {e}") from None


def _encode(value: object) -> object:
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, tuple):
        return [_encode(v) for v in value]
    return value


def _decode(value: object, hint: object, where: str) -> object:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        # The option of the value's own JSON type first, so 1 stays an int in float | int.
        options = sorted(typing.get_args(hint), key=lambda o: o is not type(value))
        for option in options:
            try:
                return _decode(value, option, where)
            except PlanError:
                pass
        raise PlanError(f"{where}: {value!r} is not a {hint}")
    if origin is tuple:
        args = typing.get_args(hint)
        if not isinstance(value, list):
            raise PlanError(f"{where}: expected a list, got {value!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_decode(v, args[0], where) for v in value)
        if len(args) != len(value):
            raise PlanError(f"{where}: expected {len(args)} items, got {len(value)}")
        return tuple(_decode(v, a, where) for v, a in zip(value, args))
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        if isinstance(value, str) and value in hint.__members__:
            return hint[value]
        raise PlanError(f"{where}: {value!r} is not one of {list(hint.__members__)}")
    if hint is type(None) and value is None:
        return None
    # bool is an int in Python: keep true/false and numbers apart in both directions.
    if hint is bool and isinstance(value, bool):
        return value
    if hint is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if hint is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if hint is str and isinstance(value, str):
        return value
    raise PlanError(f"{where}: expected {getattr(hint, '__name__', hint)}, got {value!r}")
