"""Index checks in CUDA code generation (no GPU): a kernel that reads indices at run time
takes the status word after its params and calls tf_index (include/tilefuse_index.cuh)
where it addresses with them; it lowers and compiles for sm_90a. The device function is
compiled for the host and checked value by value; the GPU machine runs whole plans with
bad ids (tools/gpu_index_check.py)."""
import re
import shutil
import subprocess

import pytest

from tests.compiler.index_cases import CASES, EXAMPLE
from tilefuse.codegen.cuda.build import HEADER, INDEX_HEADER, headers
from tilefuse.codegen.cuda.emit import emit_tilelang
from tilefuse.codegen.launch import KernelArg
from tilefuse.frontend import import_onnx
from tilefuse.partition import partition_graph
from tilefuse.target import CUDA_SM90A
from tilefuse.tile_ir.lower import lower_group


def _bert_programs():
    graph = import_onnx(EXAMPLE, {"batch": 1, "seq": 8})
    groups = [g for g in partition_graph(graph, CUDA_SM90A).groups if str(g.kind) != "opaque"]
    return [lower_group(g, CUDA_SM90A).program for g in groups]


def test_the_embedding_kernel_checks_input_ids_where_it_addresses_the_table():
    programs = _bert_programs()
    checking = [p for p in programs if p.index_sites]
    assert len(checking) == 1  # the word embedding; token types and positions are constants
    src = emit_tilelang(checking[0])
    head = re.search(r"def \w+\((.*)\):", src.text).group(1)
    assert head.endswith(', status: T.Tensor((2,), "int64")')
    calls = re.findall(r'T\.call_extern\("int32", "tf_index", (in\d+)\[[^\]]*\], 100, T\.address_of\(status\[0\]\), 0\)',
                       src.text)
    assert calls and len(set(calls)) == 1  # the ids param, its range, the status word, site 0
    assert src.params[-1].role == "status" and headers(src) == (HEADER, INDEX_HEADER)
    for p in programs:  # the others: as before, no status word, only the math header
        if not p.index_sites:
            other = emit_tilelang(p)
            assert "tf_index" not in other.text and "status" not in [x.name for x in other.params]
            assert headers(other) == (HEADER,)


def test_the_checking_kernel_lowers_and_compiles_for_sm90a():
    pytest.importorskip("tilelang")
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    from tilefuse.codegen.cuda import build_all

    (program,) = [p for p in _bert_programs() if p.index_sites]
    (art,) = build_all([program], arch="sm_90a")
    assert art.path.read_bytes()[:4] == b"\x7fELF"
    status = len(program.params)
    assert [a for a in art.launch.args if a.param == status] == [KernelArg("status", status)]
    cuda = art.source.read_text()
    assert re.search(r"int64_t\* __restrict__ status|int64_t\* status", cuda) and "tf_index(" in cuda


_DRIVER = r"""
#define __host__
#define __device__
#define __forceinline__ inline
#include <cstdio>
#include <cstdlib>
#include "HEADER"
int main(int argc, char** argv) {  // n, then indices: one line per index, "position word0 word1"
  int64_t status[2] = {0, 0};
  const int64_t n = strtoll(argv[1], nullptr, 10);
  for (int i = 2; i < argc; ++i) {
    int p = tf_index(strtoll(argv[i], nullptr, 10), n, status, i - 2);
    printf("%d %lld %lld\n", p, (long long)status[0], (long long)status[1]);
  }
}
"""


def test_tf_index_wraps_valid_indices_and_the_first_bad_one_claims_the_word(tmp_path):
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    (tmp_path / "d.cpp").write_text(_DRIVER.replace("HEADER", str(INDEX_HEADER)))
    subprocess.run([cxx, "-std=c++17", "-O1", "-o", str(tmp_path / "d"), str(tmp_path / "d.cpp")], check=True)
    values = [0, 99, -1, -100, 100, -101, 2**40, -2**63, 7]
    done = subprocess.run([str(tmp_path / "d"), "100", *map(str, values)], capture_output=True, text=True, check=True)
    rows = [tuple(map(int, line.split())) for line in done.stdout.splitlines()]
    # site i - 2 of argument i: the first bad one (100, site 4) keeps the word
    assert rows == [(0, 0, 0), (99, 0, 0), (99, 0, 0), (0, 0, 0), (0, 5, 100), (0, 5, 100), (0, 5, 100), (0, 5, 100),
                    (7, 5, 100)]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_every_index_op_checks_its_indices_where_its_kernel_addresses_with_them(case):
    """Gathers check where they load, scatters where they store (the staged schedule's
    stores into its on-chip result), one site per coordinate of the ND ops."""
    graph = import_onnx(case.model)
    # the kernel of the index op (on the GPU a scatter's elementwise neighbours are kernels
    # of their own: the staged schedule that scatters runs on one thread)
    (program,) = [p for p in (lower_group(g, CUDA_SM90A).program for g in partition_graph(graph, CUDA_SM90A).groups
                              if str(g.kind) != "opaque") if p.index_sites]
    text = emit_tilelang(program).text
    sites = {int(s) for s in re.findall(r'"tf_index", .*?, T\.address_of\(status\[0\]\), (\d+)\)', text)}
    assert sites == set(range(program.index_sites)) and program.index_sites == (2 if case.op == "GatherND" else 1)
