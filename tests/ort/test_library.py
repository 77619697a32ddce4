"""The C libraries themselves: built from the project's sources, exporting only their
entry points, declaring the slots of onnxruntime's API table that it really has, and
refusing an onnxruntime that is too old with an error status rather than a crash."""
import ctypes
import glob
import os
import subprocess
import sys

import onnxruntime as ort
import pytest

import tilefuse.ort
from tilefuse.errors import TilefuseError
from tilefuse.codegen.toolchain import entry_ok
from tilefuse.ort import build

# Pointers returned from Python callbacks as c_size_t: ctypes leaks c_void_p and c_char_p results.
GET_API = ctypes.CFUNCTYPE(ctypes.c_size_t, ctypes.c_uint32)
GET_VERSION = ctypes.CFUNCTYPE(ctypes.c_size_t)
CREATE_STATUS = ctypes.CFUNCTYPE(ctypes.c_size_t, ctypes.c_int, ctypes.c_char_p)


class ApiBase(ctypes.Structure):
    _fields_ = [("GetApi", GET_API), ("GetVersionString", GET_VERSION)]


def _exports(path: str) -> set[str]:
    out = subprocess.run(["nm", "-D", "--defined-only", path], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}


def test_libraries_export_only_their_entry_points():
    assert _exports(tilefuse.ort.get_library_path()) == {"CreateEpFactories", "ReleaseEpFactory"}
    assert _exports(tilefuse.ort.custom_ops_library_path()) == {"RegisterCustomOps"}


def test_libraries_do_not_link_onnxruntime():
    for path in (tilefuse.ort.get_library_path(), tilefuse.ort.custom_ops_library_path()):
        needed = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True).stdout
        assert "onnxruntime" not in needed


def test_library_is_cached_and_rebuilt_only_when_sources_change(monkeypatch, tmp_path):
    monkeypatch.setenv("TILEFUSE_CACHE", str(tmp_path))
    first = build.library("ep")
    assert first.parent == tmp_path / "ort" and first.is_file()
    mtime = first.stat().st_mtime_ns
    assert build.library("ep") == first and first.stat().st_mtime_ns == mtime


@pytest.mark.parametrize("damage", ["truncate", "flip", "no digest"])
def test_a_damaged_cached_library_is_built_again(monkeypatch, tmp_path, damage):
    """A library cut short by a full disk or a killed copy would take onnxruntime down
    with SIGBUS when it is mapped: the cache checks each entry's digest and rebuilds."""
    monkeypatch.setenv("TILEFUSE_CACHE", str(tmp_path))
    lib = build.library("custom-ops")
    good = lib.read_bytes()
    if damage == "truncate":
        lib.write_bytes(good[: len(good) // 3])
    elif damage == "flip":
        lib.write_bytes(good[:4096] + bytes([good[4096] ^ 0xFF]) + good[4097:])
    else:
        lib.with_name(lib.name + ".sha256").unlink()
    stale = tmp_path / "ort" / ".libtilefuse_old.so.tmp"
    stale.write_bytes(b"left by a killed build")
    os.utime(stale, (0, 0))
    assert build.library("custom-ops") == lib
    assert entry_ok(lib) and len(lib.read_bytes()) == len(good)
    ctypes.CDLL(str(lib)).RegisterCustomOps  # loads, and has its entry
    assert not stale.exists()


def test_no_compiler_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("TILEFUSE_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", "no-such-cc-tilefuse")
    with pytest.raises(TilefuseError, match="no C compiler found"):
        build.library("custom-ops")


class FakeOrt:
    """An OrtApiBase whose GetApi knows versions up to ``newest``; its table's
    CreateStatus (slot 0) records the messages it is given."""

    def __init__(self, newest: int, version: bytes) -> None:
        self.messages: list[str] = []
        self._create = CREATE_STATUS(self._create_status)
        self._table = (ctypes.c_void_p * 1)(ctypes.cast(self._create, ctypes.c_void_p))
        self._get_api = GET_API(lambda v: ctypes.addressof(self._table) if v <= newest else 0)
        self._version_text = ctypes.create_string_buffer(version)
        self._version = GET_VERSION(lambda: ctypes.addressof(self._version_text))
        self.base = ApiBase(self._get_api, self._version)

    def _create_status(self, code, msg):
        self.messages.append(msg.decode())
        return 0x1000  # any non-NULL pointer: an error status


def test_plugin_ep_refuses_an_old_onnxruntime_with_a_status():
    fake = FakeOrt(newest=20, version=b"1.20.1")
    lib = ctypes.CDLL(tilefuse.ort.get_library_path())
    lib.CreateEpFactories.restype = ctypes.c_void_p
    factories = (ctypes.c_void_p * 4)()
    count = ctypes.c_size_t(7)
    status = lib.CreateEpFactories(b"tilefuse", ctypes.byref(fake.base), None, factories, ctypes.c_size_t(4),
                                   ctypes.byref(count))
    assert status and count.value == 0
    assert fake.messages == [fake.messages[0]]
    assert "needs onnxruntime 1.23 or newer" in fake.messages[0] and "1.20.1" in fake.messages[0]


def test_custom_op_library_refuses_an_old_onnxruntime_with_a_status():
    fake = FakeOrt(newest=15, version=b"1.15.0")
    lib = ctypes.CDLL(tilefuse.ort.custom_ops_library_path())
    lib.RegisterCustomOps.restype = ctypes.c_void_p
    assert lib.RegisterCustomOps(None, ctypes.byref(fake.base))
    assert "needs onnxruntime 1.16 or newer" in fake.messages[0] and "1.15.0" in fake.messages[0]


def test_register_refuses_an_old_onnxruntime(monkeypatch):
    monkeypatch.setattr(ort, "__version__", "1.22.0")
    with pytest.raises(TilefuseError, match="needs onnxruntime >= 1.23"):
        tilefuse.ort.register()


ABI_CHECK = r"""
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
class Base(ctypes.Structure):
    _fields_ = [("GetApi", ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_uint32)),
                ("GetVersionString", ctypes.CFUNCTYPE(ctypes.c_char_p))]
lib.OrtGetApiBase.restype = ctypes.POINTER(Base)
base = lib.OrtGetApiBase().contents
print(base.GetVersionString().decode())
assert base.GetApi(16)  # the custom-op library's
major, minor = (int(x) for x in base.GetVersionString().decode().split(".")[:2])
assert bool(base.GetApi(23)) == ((major, minor) >= (1, 23))  # the provider's
table = ctypes.cast(base.GetApi(16), ctypes.POINTER(ctypes.c_void_p))
slot = lambda i, *sig: ctypes.CFUNCTYPE(*sig)(table[i])
status = slot(0, ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p)(2, b"tilefuse slot check")  # CreateStatus
assert slot(1, ctypes.c_int, ctypes.c_void_p)(status) == 2  # GetErrorCode
assert slot(2, ctypes.c_char_p, ctypes.c_void_p)(status) == b"tilefuse slot check"  # GetErrorMessage
slot(93, None, ctypes.c_void_p)(status)  # ReleaseStatus
print("ok")
"""


def test_status_slots_match_the_installed_onnxruntime():
    """The error path's slots, checked on onnxruntime's own library (in a child process:
    two copies of onnxruntime must not share one). The other slots are exercised by
    every session the tests above create."""
    capi = os.path.join(os.path.dirname(ort.__file__), "capi")
    libs = glob.glob(os.path.join(capi, "libonnxruntime.so*"))
    if not libs:
        pytest.skip("this onnxruntime wheel ships no libonnxruntime.so")
    done = subprocess.run([sys.executable, "-c", ABI_CHECK, libs[0]], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    version, ok = done.stdout.split()
    assert version == ort.__version__ and ok == "ok"
