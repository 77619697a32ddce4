"""``tilefuse.InferenceSession``: onnxruntime's session interface over tilefuse plans.

Code written for ``onnxruntime.InferenceSession`` runs unchanged: the session takes a
``.tfplan`` folder or a Plan (run as it is), or an ``.onnx`` path or its bytes, compiled
for the shapes it is run with. A model whose dims are all known (fixed in the model, bound
with ``SessionOptions.add_free_dimension_override_by_name`` or ``shapes=``) is compiled
when the session is made; otherwise at the first run, for the shapes of that run's feeds,
and again for each new set of shapes (the plans of the last ``PLANS_KEPT`` sets are kept).
Compiled plans are cached on disk under ``$TILEFUSE_CACHE/plans``, keyed by the model's
sha256, the shapes, target, precision and tilefuse's version, so a server's second start
loads its plans instead of compiling them.

``sess_options`` may be a ``tilefuse.SessionOptions`` or an ``onnxruntime.SessionOptions``
(its ``intra_op_num_threads`` and ``enable_profiling`` are read); ``providers`` pick the
target: ``CUDAExecutionProvider`` (or tilefuse's own CUDA provider name) compiles for
``cuda:sm_90a``, anything else for the CPU.
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import os
import tempfile
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Protocol, Sequence

import numpy as np
import numpy.typing as npt

from tilefuse.errors import InputError, PlanError, TilefuseError
from tilefuse.plan import Plan
from tilefuse.runtime import InferenceSession as PlanSession
from tilefuse.runtime.session import NodeArg

if TYPE_CHECKING:  # the frontend (and onnx) are imported where a model is read
    from tilefuse.frontend.loader import ModelProto
    from tilefuse.frontend.shapes import ShapeSpec

PLANS_KEPT = 8  # shape sets whose plans a session keeps loaded
GPU_PROVIDERS = ("CUDAExecutionProvider", "TilefuseCudaExecutionProvider", "TensorrtExecutionProvider")


class SessionOptions:
    """The options onnxruntime's SessionOptions has that tilefuse reads, and tilefuse's own.

    ``intra_op_num_threads`` (0: the default), ``enable_profiling`` and
    ``profile_file_prefix``, ``add_free_dimension_override_by_name(symbol, size)``; and
    ``precision`` ("fp32", "fp16", "bf16", "tf32") and ``target`` (None: from providers)."""

    def __init__(self) -> None:
        self.intra_op_num_threads = 0
        self.enable_profiling = False
        self.profile_file_prefix = "tilefuse_profile"
        self.precision = "fp32"
        self.target: str | None = None
        self.free_dimension_overrides: dict[str, int] = {}

    def add_free_dimension_override_by_name(self, dim_name: str, dim_value: int) -> None:
        self.free_dimension_overrides[dim_name] = int(dim_value)


@dataclass(frozen=True)
class ModelMetadata:
    """``get_modelmeta()``: what onnxruntime's ModelMetadata holds."""

    producer_name: str = ""
    graph_name: str = ""
    domain: str = ""
    description: str = ""
    graph_description: str = ""
    version: int = 0
    custom_metadata_map: dict[str, str] = field(default_factory=dict)


class InferenceSession:
    def __init__(self, path_or_bytes: str | os.PathLike[str] | bytes | Plan, sess_options: object = None,
                 providers: Sequence[object] | None = None, provider_options: object = None, *,
                 threads: int | None = None, launch: str | None = None,
                 shapes: ShapeSpec | None = None) -> None:
        options = sess_options if sess_options is not None else SessionOptions()
        self._options = options
        asked = getattr(options, "intra_op_num_threads", 0) or 0
        if threads is None and asked:
            threads = int(asked)
        self._threads, self._launch = threads, launch
        self._profiling = bool(getattr(options, "enable_profiling", False))
        self._profile: list[dict] = []
        self._profile_start = time.time()
        self._lock = threading.Lock()
        self._sessions: OrderedDict[tuple, PlanSession] = OrderedDict()
        self._proto: ModelProto | None = None
        self._fixed: PlanSession | None
        source = path_or_bytes
        if isinstance(source, Plan) or (isinstance(source, (str, os.PathLike)) and not Path(source).is_file()):
            # a plan folder (or a path that is no file: load_plan says what is wrong with it)
            self._fixed = PlanSession(source if isinstance(source, Plan) else Path(source), threads=threads, launch=launch)
            self._target = self._fixed.plan.target
            self._providers = [_provider_name(self._target)]
            self._model_path = self._fixed.plan.source_path
            return
        self._fixed = None
        self._target = _target_of(getattr(options, "target", None), providers)
        self._providers = [_provider_name(self._target)]
        self._precision = getattr(options, "precision", "fp32")
        self._model_path = str(source) if isinstance(source, (str, os.PathLike)) else ""
        from tilefuse.frontend.loader import load_model

        self._proto = load_model(source)
        from tilefuse.compiler import _sha256  # the model's hash, as plans record it

        self._bytes_sha = _sha256(source, self._proto)
        self._symbols = dict(getattr(options, "free_dimension_overrides", {}) or {})
        self._shapes = dict(shapes or {})
        self._inputs, self._outputs = _model_args(self._proto)
        for a in self._inputs:  # a whole input's shape binds the symbols it names (frontend/shapes.py)
            given = self._shapes.get(a.name)
            if given is not None and not isinstance(given, int):
                self._symbols.update({d: int(g) for d, g in zip(a.shape, given) if isinstance(d, str)})
        if all(isinstance(d, int) for a in self._inputs for d in self._bound(a.name, a.shape)):
            self._session_for({a.name: tuple(self._bound(a.name, a.shape)) for a in self._inputs})

    # -- what onnxruntime's session offers ---------------------------------------------
    def get_inputs(self) -> list[NodeArg]:
        if self._fixed is not None:
            return self._fixed.get_inputs()
        return [NodeArg(a.name, self._bound(a.name, a.shape), a.type) for a in self._inputs]

    def get_outputs(self) -> list[NodeArg]:
        if self._fixed is not None:
            return self._fixed.get_outputs()
        return list(self._outputs)

    def get_providers(self) -> list[str]:
        return list(self._providers)

    def get_session_options(self) -> object:
        return self._options

    def get_modelmeta(self) -> ModelMetadata:
        proto = self._proto
        if proto is None and self._model_path and Path(self._model_path).is_file():
            from tilefuse.frontend.loader import load_model

            proto = load_model(self._model_path)
        if proto is None:
            return ModelMetadata()
        return ModelMetadata(proto.producer_name, proto.graph.name, proto.domain, proto.doc_string,
                             proto.graph.doc_string, proto.model_version,
                             {p.key: p.value for p in proto.metadata_props})

    def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, object],
            run_options: object = None) -> list[np.ndarray]:
        """As onnxruntime's ``run``: the outputs named (all when None), in that order.
        ``run_options`` with onnxruntime's ``disable_synchronize_execution_providers`` entry
        set to "1": GPU feeds give outputs ordered on the feeds' stream, and the run returns
        once it is queued (the plan session's ``run(..., wait=False)``)."""
        session = self._fixed if self._fixed is not None else self._session_for(_feed_shapes(input_feed))
        start = time.perf_counter()
        out = session.run(output_names, input_feed, wait=not _unsynchronised(run_options))
        if self._profiling:
            self._profile.append({"name": "model_run", "ph": "X", "cat": "Session",
                                  "ts": (time.time() - self._profile_start) * 1e6 - (time.perf_counter() - start) * 1e6,
                                  "dur": (time.perf_counter() - start) * 1e6, "pid": os.getpid(), "tid": 0})
        return out

    def io_binding(self) -> "IOBinding":
        return IOBinding(self)

    def run_with_iobinding(self, binding: "IOBinding", run_options: object = None) -> None:
        if binding._on_device():
            binding._run_on_device(self, wait=not _unsynchronised(run_options))
            return
        names = [n for n, _ in binding._outputs] or None
        values = self.run(names, binding._inputs, run_options)
        outs = names or [a.name for a in self.get_outputs()]
        bound = dict(binding._outputs)
        binding._results = []
        for name, value in zip(outs, values):
            target = bound.get(name)
            if isinstance(target, np.ndarray):  # an output bound to the caller's array: written there
                np.copyto(target, value)
                value = target
            binding._results.append(OutputValue(value))

    def end_profiling(self) -> str:
        """The trace file written (Chrome's trace format, as onnxruntime's), "" when
        profiling was not enabled."""
        if not self._profiling:
            return ""
        prefix = getattr(self._options, "profile_file_prefix", "tilefuse_profile") or "tilefuse_profile"
        path = f"{prefix}_{time.strftime('%Y-%m-%d_%H-%M-%S')}.json"
        Path(path).write_text(json.dumps(self._profile))
        self._profile = []
        return path

    def close(self) -> None:
        if self._fixed is not None:
            self._fixed.close()
        for s in self._sessions.values():
            s.close()
        self._sessions.clear()

    def __enter__(self) -> "InferenceSession":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getattr__(self, name: str) -> object:
        """What else the plan's session offers (``closed``, ...), from the only or last one."""
        fixed, sessions = self.__dict__.get("_fixed"), self.__dict__.get("_sessions")
        session = fixed or (next(reversed(sessions.values())) if sessions else None)
        if session is None or name.startswith("__"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(session, name)

    @property
    def plan(self) -> Plan:
        """The plan of the last run (or the only one)."""
        if self._fixed is not None:
            return self._fixed.plan
        if not self._sessions:
            raise InputError("no plan yet: the model's dynamic dims are bound by the first run's feeds")
        return next(reversed(self._sessions.values())).plan

    @property
    def threads(self) -> int | None:
        session = self._fixed or (next(reversed(self._sessions.values())) if self._sessions else None)
        return session.threads if session is not None else self._threads

    # -- compiling for a set of shapes ---------------------------------------------------
    def _bound(self, name: str, shape: list) -> list:
        given = self._shapes.get(name)
        if given is not None:
            return list(given) if not isinstance(given, int) else [given]
        return [self._shapes.get(d, self._symbols.get(d, d)) if isinstance(d, str) else d for d in shape]

    def _session_for(self, shapes: dict[str, tuple[int, ...]]) -> PlanSession:
        known = {a.name for a in self._inputs}
        unknown = sorted(set(shapes) - known)
        if unknown:
            raise InputError(f"unknown input(s) {unknown}; the model's inputs are {sorted(known)}")
        key = tuple(sorted(shapes.items()))
        with self._lock:
            session = self._sessions.get(key)
            if session is not None:
                self._sessions.move_to_end(key)
                return session
            session = PlanSession(self._plan_for(shapes), threads=self._threads, launch=self._launch)
            self._sessions[key] = session
            while len(self._sessions) > PLANS_KEPT:
                self._sessions.popitem(last=False)[1].close()
            return session

    def _plan_for(self, shapes: dict[str, tuple[int, ...]]) -> Plan:
        """The plan for these input shapes: from the plan cache, else compiled (and cached)."""
        import tilefuse
        from tilefuse.codegen.toolchain import default_cache_dir
        from tilefuse.compiler import compile
        from tilefuse.plan import load_plan

        spec = json.dumps({"model": self._bytes_sha, "shapes": sorted((k, list(v)) for k, v in shapes.items()),
                           "target": self._target, "precision": self._precision, "tilefuse": tilefuse.__version__})
        folder = default_cache_dir().parent / "plans" / hashlib.sha256(spec.encode()).hexdigest()[:24]
        if folder.is_dir():
            try:
                return load_plan(folder)
            except PlanError:  # damaged or from another version: compiled again below
                pass
        # from the file where there is one: its external weights are read beside it
        model = self._model_path or self._proto
        assert model is not None, "a session of a plan compiles nothing"
        plan = compile(model, self._target, dict(shapes), self._precision)
        try:
            folder.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=".plan-", dir=folder.parent))
            plan.save(tmp / "p.tfplan")
            os.replace(tmp / "p.tfplan", folder)  # another process may have cached it first: fine
            tmp.rmdir()
        except OSError:
            pass  # an unwritable cache: the plan still runs from memory
        return plan


class IOBinding:
    """onnxruntime's IOBinding. Host buffers: inputs bound once (``bind_cpu_input``, or
    ``bind_input`` with a host buffer), outputs bound to a caller's array or left to the
    session. GPU buffers (``bind_input(name, "cuda", 0, dtype, shape, ptr)``, the same for
    outputs, or ``bind_output(name, "cuda")`` for memory the session keeps): checked once and
    run as one CUDA graph on that memory, with nothing allocated per run (the plan session's
    ``bind``). ``session.run_with_iobinding(binding)``, then ``copy_outputs_to_cpu()`` or
    ``get_outputs()[i].numpy()``. As with onnxruntime, bound GPU inputs must be ready when the
    run starts: work on the legacy default stream (torch's default) is; another stream's is
    not (``synchronize_inputs`` waits for the whole device). With ``run_options`` asking for
    no synchronisation (``disable_synchronize_execution_providers``), a GPU run returns once
    queued: ``synchronize_outputs()`` waits for it (work on the legacy default stream is
    ordered after it without)."""

    def __init__(self, session: InferenceSession) -> None:
        self._session = session
        self._inputs: dict[str, np.ndarray | _DeviceBuffer] = {}
        self._outputs: list[tuple[str, object]] = []  # a host array, a _DeviceBuffer, _GPU_KEPT or None
        self._results: list[OutputValue] = []
        self._device: _DeviceRun | None = None  # the plan session's binding of the GPU buffers, made at the first run

    def bind_cpu_input(self, name: str, arr_on_cpu: np.ndarray) -> None:
        self._inputs[name] = np.asarray(arr_on_cpu)
        self._device = None

    def bind_input(self, name: str, device_type: str, device_id: int, element_type: npt.DTypeLike, shape: Sequence[int],
                   buffer_ptr: int) -> None:
        self._inputs[name] = _buffer(f"bind_input({name!r})", device_type, device_id, element_type, shape, buffer_ptr)
        self._device = None

    def bind_output(self, name: str, device_type: str = "cpu", device_id: int = 0, element_type: npt.DTypeLike | None = None,
                    shape: Sequence[int] | None = None, buffer_ptr: int | None = None) -> None:
        target: object = None
        if buffer_ptr is not None:
            if element_type is None or shape is None:
                raise InputError("bind_output with a buffer needs its element_type and shape")
            target = _buffer(f"bind_output({name!r})", device_type, device_id, element_type, shape, buffer_ptr)
        elif str(device_type).lower() == "cuda":
            target = _GPU_KEPT
        elif str(device_type).lower() != "cpu":
            raise InputError(f"bind_output({name!r}): device_type must be 'cpu' or 'cuda', got {device_type!r}")
        self._outputs = [(n, a) for n, a in self._outputs if n != name] + [(name, target)]
        self._device = None

    def clear_binding_inputs(self) -> None:
        self._inputs.clear()
        self._device = None

    def clear_binding_outputs(self) -> None:
        self._outputs.clear()
        self._device = None

    def synchronize_inputs(self) -> None:
        """Wait for all work on the device (what makes inputs written on any stream ready)."""
        if self._on_device():
            synchronize = getattr(self._plan_session()._executor, "synchronize", None)
            if synchronize is not None:
                synchronize()

    def synchronize_outputs(self) -> None:
        """Wait for a run not waited for (``run_options`` with onnxruntime's
        ``disable_synchronize_execution_providers``) and raise the index error it found;
        after any other run the outputs are written when ``run_with_iobinding`` returns."""
        if self._on_device():
            self._plan_session().synchronize()

    def get_outputs(self) -> list["OutputValue"]:
        return list(self._results)

    def copy_outputs_to_cpu(self) -> list[np.ndarray]:
        return [r.numpy() for r in self._results]

    def _on_device(self) -> bool:
        return any(isinstance(v, _DeviceBuffer) for v in self._inputs.values()) or \
            any(v is _GPU_KEPT or isinstance(v, _DeviceBuffer) for _, v in self._outputs)

    def _run_on_device(self, session: InferenceSession, wait: bool = True) -> None:
        if self._device is None:
            plan_session = self._plan_session()
            bound = {n: v for n, v in self._outputs if v is not _GPU_KEPT}
            outputs: Mapping[str, object] | list[str] | None
            if not self._outputs:
                outputs = None
            elif bound and len(bound) == len(self._outputs):
                outputs = bound
            elif not bound:
                outputs = [n for n, _ in self._outputs]
            else:
                raise InputError("bind_output: bind every output to a buffer, or none (the session's memory)")
            self._device = plan_session.bind(self._inputs, outputs)
            self._results = [OutputValue(v, plan_session._executor) for v in self._device.outputs]
        self._device.run(wait=wait)

    def _plan_session(self) -> PlanSession:
        """The plan session for the bound inputs' shapes."""
        session = self._session
        if session._fixed is not None:
            return session._fixed
        return session._session_for({n: tuple(np.shape(v) if isinstance(v, np.ndarray) else v.shape)
                                     for n, v in self._inputs.items()})


class _DeviceRun(Protocol):
    """What a plan session's ``bind`` returns (``runtime/cuda_binding.py``)."""

    outputs: Sequence[Any]  # DeviceArrays, or the caller's _DeviceBuffers

    def run(self, stream: int | None = None, wait: bool = True) -> None: ...


class _OnDevice(Protocol):
    """GPU memory an output lives in: the runtime's DeviceArray or a caller's _DeviceBuffer."""

    ptr: int
    shape: tuple[int, ...]


class _Downloads(Protocol):
    def download(self, a: Any) -> np.ndarray: ...


class _DeviceBuffer:
    """A GPU buffer named by pointer, dtype and shape, as ``__cuda_array_interface__`` (no
    stream: the caller has it ready)."""

    def __init__(self, ptr: int, dtype: np.dtype, shape: tuple[int, ...]) -> None:
        self.ptr, self.dtype, self.shape = ptr, dtype, shape
        self.__cuda_array_interface__ = {"shape": shape, "typestr": dtype.str, "data": (ptr, False),
                                         "version": 3, "stream": None}


_GPU_KEPT = object()  # bind_output(name, "cuda") without a buffer: memory the session keeps


def _buffer(what: str, device_type: str, device_id: int, element_type: npt.DTypeLike, shape: Sequence[int],
            buffer_ptr: int) -> np.ndarray | _DeviceBuffer:
    """The caller's buffer: a host array over it, or a GPU buffer."""
    kind = str(device_type).lower()
    try:
        dtype = np.dtype(element_type)
        dims = tuple(int(d) for d in shape)
        ptr = int(buffer_ptr)
    except (TypeError, ValueError) as e:
        raise InputError(f"{what}: element_type, shape and buffer_ptr must be a dtype, ints and an int ({e})") from None
    if kind == "cuda":
        if device_id != 0:
            raise InputError(f"{what}: CUDA device {device_id}; tilefuse sessions run on device 0")
        return _DeviceBuffer(ptr, dtype, dims)
    if kind != "cpu":
        raise InputError(f"{what}: device_type must be 'cpu' or 'cuda', got {device_type!r}")
    count = int(np.prod(dims)) if dims else 1
    buf = (ctypes.c_char * (count * dtype.itemsize)).from_address(ptr)
    return np.frombuffer(memoryview(buf), dtype=dtype, count=count).reshape(dims)


class OutputValue:
    """An output of ``run_with_iobinding`` (onnxruntime's OrtValue): a host array, or GPU
    memory (``numpy()`` copies it to the host)."""

    def __init__(self, value: np.ndarray | _OnDevice, executor: _Downloads | None = None) -> None:
        self._value, self._executor = value, executor

    def numpy(self) -> np.ndarray:
        if isinstance(self._value, np.ndarray):
            return self._value
        assert self._executor is not None, "GPU outputs come with the executor that made them"
        return self._executor.download(self._value)

    def shape(self) -> list[int]:
        return list(np.shape(self._value) if isinstance(self._value, np.ndarray) else self._value.shape)

    def device_name(self) -> str:
        return "cpu" if isinstance(self._value, np.ndarray) else "cuda"

    def data_ptr(self) -> int:
        return int(self._value.ctypes.data if isinstance(self._value, np.ndarray) else self._value.ptr)


def _provider_name(target: str) -> str:
    return "TilefuseCudaExecutionProvider" if target.startswith("cuda") else "TilefuseExecutionProvider"


def _target_of(target: str | None, providers: Sequence[object] | None) -> str:
    if target:
        return target
    names = [p[0] if isinstance(p, (tuple, list)) else p for p in providers or []]
    for name in names:
        if not isinstance(name, str):
            raise InputError(f"providers must be provider names, got {name!r}")
    return "cuda:sm_90a" if any(n in GPU_PROVIDERS for n in names) else "cpu"


def _feed_shapes(feeds: Mapping[str, object]) -> dict[str, tuple[int, ...]]:
    if not isinstance(feeds, Mapping):
        raise InputError(f"feeds must be a dict of input name -> array, got {type(feeds).__name__}")
    out = {}
    for name, value in feeds.items():
        shape = getattr(value, "shape", None)
        if shape is None:
            shape = np.asarray(value).shape  # what np.shape does with a value that has none
        out[name] = tuple(int(d) for d in shape)
    return out


def _model_args(proto: ModelProto) -> tuple[list[NodeArg], list[NodeArg]]:
    """The model's runtime inputs and outputs as onnxruntime lists them: dims as ints, or the
    symbol's name (None where a dim has neither)."""
    from tilefuse.frontend.context import onnx_dtype
    from tilefuse.frontend.shapes import fixed_size, runtime_inputs
    from tilefuse.runtime.session import onnx_type_name

    def arg(vi) -> NodeArg:
        tt = vi.type.tensor_type
        dims = [fixed_size(d) if fixed_size(d) is not None else (d.dim_param or None) for d in tt.shape.dim]
        # runtime/session.py's NodeArg declares list[int] (a plan's shapes are static); a
        # model's dims may be symbols or unknown, listed as onnxruntime lists them.
        type_name = f"tensor({onnx_type_name(onnx_dtype(tt.elem_type, repr(vi.name)))})"
        return NodeArg(vi.name, dims, type_name)  # type: ignore[arg-type]

    try:
        return [arg(i) for i in runtime_inputs(proto)], [arg(o) for o in proto.graph.output]
    except (AttributeError, ValueError) as e:
        raise TilefuseError(f"cannot read the model's inputs and outputs: {e}") from None


def _unsynchronised(run_options: object) -> bool:
    """Whether onnxruntime ``RunOptions`` (or anything with its ``get_run_config_entry``)
    ask for a run not synchronised with the host (``disable_synchronize_execution_providers``
    "1")."""
    entry = getattr(run_options, "get_run_config_entry", None)
    if entry is None:
        return False
    try:
        return str(entry("disable_synchronize_execution_providers")).strip() == "1"
    except Exception:  # noqa: BLE001 - onnxruntime raises when the entry is not set
        return False
