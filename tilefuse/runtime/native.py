"""Kernel libraries loaded from verified bytes, their entries looked up in them alone,
and unloaded again.

What runs is what was checked: a kernel file is read once and hashed
(``plan.files.read_verified``), and those bytes are what ``dlopen`` maps, written to a
file of this process's own private directory (mode 0700) that is removed as soon as it is
loaded. A plan's file changed on disk after the check, or during the load, is never what
runs. The private file is named by the sha256 of its bytes: the dynamic loader hands back
a library already loaded under the same name without opening the file, and with the
content in the name that is always the same code (a memfd's ``/proc/self/fd/N`` cannot be
used: N is reused, and the loader would return another kernel). Each executor unloads
what it loaded (``close``).

``dlsym`` on a library searches its dependencies too, so the libc's ``abort`` or
``free`` would be found "in" any kernel library: an entry must lie in the library's own
link map (``dladdr1``), or it is refused.

OpenMP runtimes are never unloaded: their worker threads outlive a parallel region, and
unmapping libgomp under them (when the last kernel library using it is closed) would
crash the process. They are pinned with RTLD_NODELETE once a kernel library has loaded one.
"""
from __future__ import annotations

import _ctypes
import atexit
import ctypes
import hashlib
import os
import shutil
import tempfile
import threading
import time
from typing import Literal, overload

from tilefuse.errors import PlanError

RTLD_DI_LINKMAP = 2  # <dlfcn.h>: dlinfo request, and dladdr1 flag, for the link map
OPENMP_RUNTIMES = ("libgomp.so.1", "libomp.so", "libomp.so.5", "libiomp5.so")


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


# glibc has dlinfo and dladdr1 in libc itself since 2.34, in libdl before
_dl = ctypes.CDLL(None) if hasattr(ctypes.CDLL(None), "dladdr1") else ctypes.CDLL("libdl.so.2")
_dlinfo = _dl.dlinfo
_dlinfo.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
_dladdr1 = _dl.dladdr1
_dladdr1.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo), ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
_pinned: set[str] = set()
_pin_lock = threading.Lock()
_load_lock = threading.Lock()
_dirs: dict[str, str] = {}  # this process's private load directory under each base (_private_dir)
LOAD_PREFIX = "tilefuse-load-"  # + pid + "-" + random: a private load directory
SWEEP_AGE_S = 3600
_pid_made = os.getpid()


class NativeLibrary:
    """One kernel library, loaded from ``data`` (bytes already verified by the caller)."""

    def __init__(self, data: bytes, label: str) -> None:
        self.label = label  # for messages: the kernel file it came from
        self._lib: ctypes.CDLL | None = _dlopen_bytes(data, label)
        self._link_map = ctypes.c_void_p()
        if _dlinfo(self._lib._handle, RTLD_DI_LINKMAP, ctypes.byref(self._link_map)) != 0:
            self.close()
            raise PlanError(f"{label}: dlinfo cannot describe the loaded library")
        _pin_openmp(data)

    @overload
    def function(self, symbol: str, required: Literal[True] = True) -> _ctypes.CFuncPtr: ...
    @overload
    def function(self, symbol: str, required: bool) -> _ctypes.CFuncPtr | None: ...

    def function(self, symbol: str, required: bool = True) -> _ctypes.CFuncPtr | None:
        """The library's own exported ``symbol``; PlanError (or None if not ``required``)
        when it has none, or when the name resolves into another library."""
        assert self._lib is not None, "closed"
        fn = getattr(self._lib, symbol, None)
        if fn is None:
            if required:
                raise PlanError(f"{self.label}: no symbol {symbol!r}")
            return None
        info, owner = _DlInfo(), ctypes.c_void_p()
        found = _dladdr1(ctypes.cast(fn, ctypes.c_void_p), ctypes.byref(info), ctypes.byref(owner), RTLD_DI_LINKMAP)
        if not found or owner.value != self._link_map.value:
            where = info.dli_fname.decode(errors="replace") if found and info.dli_fname else "another library"
            raise PlanError(f"{self.label}: {symbol!r} is not defined by the kernel library but by {where}; "
                            f"a plan calls its own kernels only")
        return fn

    def dependency_function(self, symbol: str) -> _ctypes.CFuncPtr | None:
        """``symbol`` as the library sees it, wherever it is defined (its OpenMP runtime's
        ``omp_set_num_threads``): for the runtime's own calls only, never a name a plan gives."""
        assert self._lib is not None, "closed"
        return getattr(self._lib, symbol, None)

    def close(self) -> None:
        """Unload the library; every function taken from it is invalid afterwards."""
        lib, self._lib = self._lib, None
        if lib is not None:
            _ctypes.dlclose(lib._handle)  # type: ignore[attr-defined]  # POSIX only: typeshed's _ctypes stub omits it


def _dlopen_bytes(data: bytes, label: str) -> ctypes.CDLL:
    name = f"{hashlib.sha256(data).hexdigest()}.so"
    errors = []
    with _load_lock:  # one writer of a name at a time; the file lives only during dlopen
        for base in _bases():
            try:
                path = os.path.join(_private_dir(base), name)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o700)
            except OSError as e:
                errors.append(str(e))
                continue
            try:
                try:
                    _write_all(fd, data)
                finally:
                    os.close(fd)
                return ctypes.CDLL(path, mode=os.RTLD_LOCAL)
            except OSError as e:  # e.g. a temporary directory mounted noexec: try the next
                errors.append(str(e))
            finally:
                if os.path.lexists(path):
                    os.unlink(path)  # loaded or not: the mapping keeps the data it needs
    raise PlanError(f"{label}: cannot load the kernel library: {'; '.join(errors)}")


def _after_fork() -> None:
    global _pid_made
    _dirs.clear()
    _pid_made = os.getpid()


os.register_at_fork(after_in_child=_after_fork)


def _bases() -> list[str]:
    """Where private load directories go: the temporary directory, then the user's cache
    in case the first is mounted noexec."""
    return [tempfile.gettempdir(), os.path.join(os.path.expanduser("~"), ".cache", "tilefuse")]


def _private_dir(base: str) -> str:
    """This process's own directory for libraries being loaded under ``base``: made on first
    use (and again if someone removed it), removed at exit. Making one also removes those
    that processes which no longer exist left behind (killed before their exit handlers)."""
    folder = _dirs.get(base)
    if folder is not None and os.path.isdir(folder):
        return folder
    os.makedirs(base, exist_ok=True)
    if not _dirs:  # the first of this process
        for b in _bases():
            _sweep(b)
    folder = _dirs[base] = tempfile.mkdtemp(prefix=f"{LOAD_PREFIX}{os.getpid()}-", dir=base)
    return folder


@atexit.register
def _remove_private_dirs() -> None:
    if _pid_made == os.getpid():  # a forked child does not remove its parent's
        for folder in _dirs.values():
            shutil.rmtree(folder, True)


def _sweep(base: str) -> None:
    """Remove ``base``'s load directories of processes that have ended, once they are an
    hour old: a process of another PID namespace sharing ``base`` may look ended, and an
    hour-old load directory is empty between loads (its files live only during dlopen)."""
    now = time.time()
    try:
        entries = list(os.scandir(base))
    except OSError:
        return
    for entry in entries:
        if not entry.name.startswith(LOAD_PREFIX):
            continue
        pid = entry.name[len(LOAD_PREFIX):].partition("-")[0]
        try:
            st = entry.stat(follow_symlinks=False)
            if not pid.isdigit() or not entry.is_dir(follow_symlinks=False) or st.st_uid != os.getuid():
                continue
            if now - st.st_mtime < SWEEP_AGE_S or _alive(int(pid)):
                continue
            shutil.rmtree(entry.path, ignore_errors=True)
        except OSError:
            continue


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # e.g. another user's process: it exists
        return True
    return True


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _pin_openmp(data: bytes) -> None:
    """Make the OpenMP runtime a library needs undeletable (its DT_NEEDED name is in the
    library's string table; RTLD_NOLOAD: only one the loader has loaded)."""
    with _pin_lock:
        for name in OPENMP_RUNTIMES:
            if name in _pinned or name.encode() not in data:
                continue
            try:
                ctypes.CDLL(name, mode=os.RTLD_NOLOAD | os.RTLD_NODELETE | os.RTLD_LOCAL)
            except OSError:
                continue  # not loaded
            _pinned.add(name)
