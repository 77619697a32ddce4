"""Bad feeds for a good plan: names, dtypes, shapes, Python objects where arrays belong,
layouts numpy allows (those must give the right answer), NaN and inf (which must
propagate as in onnxruntime), token ids out of range, odd output_names.

A recipe turns the good feeds into (output_names, feeds) for tilefuse and, where
onnxruntime should see something else to give the reference (a contiguous copy of a
strided array), into the reference's own pair. Recipes run inside the case's children,
so an object that needs torch imports it there.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

from tests.robustness.bases import VOCAB
from tests.robustness.cases import Expect, FeedCase

E, R, X, O = Expect.ERROR, Expect.RESULT, Expect.EITHER, Expect.ORT


@dataclass
class Made:
    feeds: Any
    output_names: Any = None
    reference_feeds: Any = None
    reference_names: Any = "same"

    @property
    def oracle_feeds(self) -> Any:
        return self.feeds if self.reference_feeds is None else self.reference_feeds

    @property
    def oracle_names(self) -> Any:
        return self.output_names if self.reference_names == "same" else self.reference_names


Recipe = Callable[..., Made]
RECIPES: dict[str, Recipe] = {}


def recipe(fn: Recipe) -> Recipe:
    RECIPES[fn.__name__] = fn
    return fn


def _with(good: dict, name: str, value: Any) -> dict:
    out = dict(good)
    out[name] = value
    return out


@recipe
def replace(good: dict, name: str, how: str, arg: Any = None) -> Made:
    """feeds[name] replaced by a hostile value; onnxruntime sees the same (it decides)."""
    x = good[name]
    rng = np.random.default_rng(5)
    value = {
        "dtype": lambda: x.astype(arg),
        "shape": lambda: rng.standard_normal(arg).astype(x.dtype) if x.dtype.kind == "f" else rng.integers(0, 2, arg).astype(x.dtype),
        "scalar": lambda: np.asarray(x.reshape(-1)[0]),
        "python-float": lambda: 1.5,
        "python-int": lambda: 3,
        "none": lambda: None,
        "string": lambda: "hello",
        "bytes": lambda: b"\x00" * x.nbytes,
        "str-array": lambda: np.full(x.shape, "a"),
        "empty": lambda: np.zeros((0,) + x.shape[1:], x.dtype),
        "empty-1d": lambda: np.array([], x.dtype),
        "dict": lambda: {"a": x},
        "int-values": lambda: np.full(x.shape, arg, x.dtype),
    }[how]()
    return Made(_with(good, name, value))


@recipe
def convertible(good: dict, name: str, how: str) -> Made:
    """feeds[name] as another object holding the same values (a list, a tuple, object or
    big-endian dtype, a torch tensor): the right answer or a clean error; the reference
    gets the plain array."""
    x = good[name]
    if how == "list":
        value: Any = x.tolist()
    elif how == "tuple":
        value = tuple(x.tolist())
    elif how == "object-array":
        value = x.astype(object)
    elif how == "big-endian":
        value = x.astype(x.dtype.newbyteorder(">"))
    elif how == "matrix":
        value = np.asmatrix(x)
    elif how == "masked":
        value = np.ma.masked_array(x, mask=np.zeros(x.shape, bool))
    elif how == "torch":
        import torch

        value = torch.from_numpy(x.copy())
    elif how == "memoryview":
        value = memoryview(x.copy())
    else:
        raise ValueError(how)
    return Made(_with(good, name, value), reference_feeds=good)


class _Sub(np.ndarray):
    pass


@recipe
def layout(good: dict, name: str, how: str) -> Made:
    """feeds[name] with the same values in another memory layout: must give the answer."""
    x = good[name]
    if how == "fortran":
        value = np.asfortranarray(x)
    elif how == "strided":
        big = np.zeros(x.shape[:-1] + (2 * x.shape[-1],), x.dtype)
        big[..., ::2] = x
        value = big[..., ::2]
    elif how == "negative-stride":
        value = np.flip(np.flip(x, 0).copy(), 0)
    elif how == "broadcast":
        row = x.reshape(-1, x.shape[-1])[0]
        value = np.broadcast_to(row, x.shape)
        good = _with(good, name, np.ascontiguousarray(value))
    elif how == "readonly":
        value = x.copy()
        value.setflags(write=False)
    elif how == "unaligned":
        raw = bytearray(x.nbytes + 1)
        value = np.frombuffer(raw, x.dtype, offset=1).reshape(x.shape)
        value[...] = x
    elif how == "subclass":
        value = x.copy().view(_Sub)
    elif how == "memmap":
        value = np.memmap("feed.bin", x.dtype, "w+", shape=x.shape)
        value[...] = x
    elif how == "transposed-view":
        value = np.ascontiguousarray(np.swapaxes(x, 0, -1)).swapaxes(0, -1)
    else:
        raise ValueError(how)
    assert np.array_equal(value, good[name])
    return Made(_with(good, name, value), reference_feeds=good)


@recipe
def specials(good: dict, name: str, how: str, count: int = 5) -> Made:
    """NaN, inf, huge or subnormal floats: valid feeds, onnxruntime gives the answer."""
    x = good[name].copy()
    flat = x.reshape(-1)
    rng = np.random.default_rng(count)
    where = rng.choice(flat.size, size=min(count, flat.size), replace=False)
    values = {
        "nan": [np.nan], "inf": [np.inf], "-inf": [-np.inf], "mixed": [np.nan, np.inf, -np.inf],
        "huge": [3e38, -3e38], "subnormal": [1e-42, -1e-42], "max": [np.finfo(x.dtype).max],
    }[how]
    flat[where] = np.resize(np.array(values, x.dtype), where.size)
    return Made(_with(good, name, x))


@recipe
def all_values(good: dict, name: str, value: float) -> Made:
    return Made(_with(good, name, np.full_like(good[name], value)))


@recipe
def token(good: dict, name: str, value: int, count: int = 1) -> Made:
    """Some token ids set to ``value`` (in range, negative in range, or out of it)."""
    ids = good[name].copy()
    ids.reshape(-1)[:count] = value
    return Made(_with(good, name, ids))


@recipe
def names(good: dict, drop: tuple = (), add: tuple = (), rename: tuple = ()) -> Made:
    feeds = {k: v for k, v in good.items() if k not in drop}
    for k in add:
        feeds[k] = next(iter(good.values()))
    for old, new in rename:
        feeds[new] = feeds.pop(old)
    return Made(feeds)


@recipe
def container(good: dict, how: str) -> Made:
    """The feeds in something other than a dict."""
    if how == "none":
        return Made(None)
    if how == "list":
        return Made(list(good.values()))
    if how == "pairs":
        return Made(tuple(good.items()))
    if how == "empty-dict":
        return Made({})
    if how == "int-key":
        return Made({0: next(iter(good.values())), **good})
    if how == "bytes-key":
        return Made({k.encode(): v for k, v in good.items()})
    if how == "ordered":
        return Made(OrderedDict(good), reference_feeds=good)
    if how == "mapping":
        return Made(_Mapping(good), reference_feeds=good)
    if how == "generator":
        return Made((kv for kv in good.items()))
    if how == "string":
        return Made("feeds")
    raise ValueError(how)


class _Mapping(Mapping):
    """A read-only Mapping that is not a dict."""

    def __init__(self, d: dict) -> None:
        self._d = d

    def __getitem__(self, k: str) -> Any:
        return self._d[k]

    def __iter__(self) -> Iterator[str]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)


@recipe
def outputs(good: dict, value: Any, how: str = "") -> Made:
    """An odd ``output_names``: onnxruntime decides what it means."""
    names = list(value) if isinstance(value, list) else value
    if how == "generator":
        value = (n for n in names)
    elif how == "array":
        value = np.array(names)
    elif how == "tuple":
        value = tuple(names)
    elif how == "str":  # one name as a str: its output, or a clean error
        return Made(good, output_names=value, reference_names=[value])
    return Made(good, output_names=value, reference_names=names if how == "generator" else "same")


def _case(base: str, cid: str, expect: Expect, note: str, recipe_name: str, **params: Any) -> FeedCase:
    return FeedCase(f"feeds/{base}/{cid}", "feeds", expect, f"{base} plan run with {note}", base=base,
                    recipe=recipe_name, params=tuple(params.items()), feed_seed=3)


def handmade() -> Iterator[FeedCase]:
    for base, first, out0, out1 in (("lm", "x", "probs", "pooled"), ("topk", "x", "y", "idx")):
        c = lambda cid, expect, note, rec, **p: _case(base, cid, expect, note, rec, **p)  # noqa: E731
        yield c("control", R, "good feeds (control)", "names")
        yield c("missing-input", O, f"input {first!r} left out", "names", drop=(first,))
        yield c("unknown-input", O, "an extra input 'zz'", "names", add=("zz",))
        yield c("renamed-input", O, f"input {first!r} given as 'X'", "names", rename=((first, "X"),))
        yield c("float64", O, f"{first!r} as float64", "replace", name=first, how="dtype", arg="float64")
        yield c("float16", O, f"{first!r} as float16", "replace", name=first, how="dtype", arg="float16")
        yield c("int32-for-float", O, f"{first!r} as int32", "replace", name=first, how="dtype", arg="int32")
        yield c("bool-for-float", O, f"{first!r} as bool", "replace", name=first, how="dtype", arg="bool")
        yield c("shape-last-axis", O, f"{first!r} with its last axis one longer", "replace", name=first, how="shape",
                arg=tuple(_shape(base)[:-1]) + (_shape(base)[-1] + 1,))
        yield c("shape-reversed", O, f"{first!r} of reversed shape", "replace", name=first, how="shape", arg=tuple(reversed(_shape(base))))
        yield c("shape-extra-axis", O, f"{first!r} with an extra leading axis", "replace", name=first, how="shape", arg=(1,) + _shape(base))
        yield c("scalar", O, f"{first!r} a 0-d array", "replace", name=first, how="scalar")
        yield c("python-float", O, f"{first!r} = 1.5", "replace", name=first, how="python-float")
        yield c("python-int", O, f"{first!r} = 3", "replace", name=first, how="python-int")
        yield c("none", O, f"{first!r} = None", "replace", name=first, how="none")
        yield c("string", O, f"{first!r} = 'hello'", "replace", name=first, how="string")
        yield c("bytes", O, f"{first!r} as bytes of the right size", "replace", name=first, how="bytes")
        yield c("str-array", O, f"{first!r} an array of strings", "replace", name=first, how="str-array")
        yield c("empty", O, f"{first!r} with a leading axis of 0", "replace", name=first, how="empty")
        yield c("empty-1d", O, f"{first!r} = np.array([])", "replace", name=first, how="empty-1d")
        yield c("dict-value", O, f"{first!r} = a dict", "replace", name=first, how="dict")
        for how in ("list", "tuple", "object-array", "big-endian", "masked", "memoryview", "torch"):
            yield c(f"as-{how}", X, f"{first!r} as a {how} of the right values", "convertible", name=first, how=how)
        if base == "topk":
            yield c("as-matrix", X, "'x' as an np.matrix", "convertible", name=first, how="matrix")
        for how in ("fortran", "strided", "negative-stride", "broadcast", "readonly", "unaligned", "subclass", "memmap",
                    "transposed-view"):
            yield c(f"layout-{how}", R, f"{first!r} in a {how} layout", "layout", name=first, how=how)
        for how in ("nan", "inf", "-inf", "mixed", "huge", "subnormal", "max"):
            yield c(f"special-{how}", R, f"{first!r} with a few {how} values", "specials", name=first, how=how)
        yield c("all-nan", R, f"{first!r} all NaN", "all_values", name=first, value=float("nan"))
        yield c("all-inf", R, f"{first!r} all +inf", "all_values", name=first, value=float("inf"))
        for how in ("none", "list", "pairs", "empty-dict", "int-key", "bytes-key", "generator", "string"):
            yield c(f"container-{how}", O, f"feeds given as {how}", "container", how=how)
        yield c("container-ordered", R, "feeds as an OrderedDict", "container", how="ordered")
        yield c("container-mapping", X, "feeds as a Mapping that is not a dict", "container", how="mapping")
        yield c("outputs-int", O, "output_names=5", "outputs", value=5)
        yield c("outputs-str", X, f"output_names={out0!r} (a str, not a list)", "outputs", value=out0, how="str")
        yield c("outputs-unknown", O, "output_names=['nope']", "outputs", value=["nope"])
        yield c("outputs-empty", O, "output_names=[] (onnxruntime: all outputs)", "outputs", value=[])
        yield c("outputs-none-item", O, "output_names=[None]", "outputs", value=[None])
        yield c("outputs-duplicate", O, f"output_names=[{out0!r}, {out0!r}]", "outputs", value=[out0, out0])
        yield c("outputs-reversed", R, f"output_names=[{out1!r}, {out0!r}]", "outputs", value=[out1, out0])
        yield c("outputs-subset", R, f"output_names=[{out1!r}]", "outputs", value=[out1])
        yield c("outputs-tuple", O, f"output_names=({out0!r},)", "outputs", value=[out0], how="tuple")
        yield c("outputs-array", O, f"output_names=np.array([{out0!r}])", "outputs", value=[out0], how="array")
        yield c("outputs-generator", X, "output_names a generator", "outputs", value=[out0], how="generator")
    t = lambda cid, expect, note, **p: _case("lm", cid, expect, note, "token", **p)  # noqa: E731
    yield t("ids-last", R, "token ids = 31 (the last row)", name="ids", value=VOCAB - 1, count=16)
    yield t("ids-minus-1", R, "token ids = -1 (valid: counts from the end)", name="ids", value=-1, count=3)
    yield t("ids-minus-32", R, "token ids = -32 (valid: the first row)", name="ids", value=-VOCAB, count=3)
    for value in (VOCAB, VOCAB + 1, 1000, -VOCAB - 1, 2**31, 2**40, np.iinfo(np.int64).max, np.iinfo(np.int64).min):
        yield t(f"ids-{value}", O, f"a token id {value} (the table has {VOCAB} rows)", name="ids", value=int(value))
    yield t("ids-32-last", O, f"the last token id = {VOCAB}", name="ids", value=VOCAB, count=16)


def _shape(base: str) -> tuple[int, ...]:
    return (2, 8, 16) if base == "lm" else (4, 12)


def cli_sample() -> Iterator[FeedCase]:
    """Feed cases the CLI can express (--input NAME=FILE.npy)."""
    for case in handmade():
        name = case.id.split("/")[-1]
        if name in ("control", "missing-input", "unknown-input", "float64", "shape-reversed", "special-nan",
                    "ids-32", "ids--1", "ids-minus-1", "empty"):
            yield FeedCase(case.id + "/cli", case.family + ".cli", case.expect, case.note + " (CLI)", cli=True,
                           base=case.base, recipe=case.recipe, params=case.params, feed_seed=case.feed_seed)
