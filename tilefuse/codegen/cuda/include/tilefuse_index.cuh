// The index check of tilefuse's kernels (the tile IR's IndexCheck), included (nvcc -include)
// ahead of a kernel that reads indices at run time and called by name (T.call_extern).
// Also compiled for the host (tests/codegen/test_index_checks_cuda.py), where the atomic is
// a plain store.
#pragma once
#include <cstdint>
// An index read at run time (the tile IR's IndexCheck) as a position in [0, n): negative
// indices count from the end. One outside [-n, n) gives position 0, so no access leaves
// its buffer, and the first such index of a run claims the kernel's status word (word 0:
// site + 1, word 1: the index), which the runtime reads after the run. Valid indices pay
// two compares; the branch is taken only on an error.
static __host__ __device__ __forceinline__ int tf_index(int64_t i, int64_t n, int64_t* status, int site) {
  const int64_t w = i < 0 ? i + n : i;  // cannot overflow: i < 0 < n
  if ((uint64_t)w < (uint64_t)n) return (int)w;
#ifdef __CUDA_ARCH__
  if (atomicCAS(reinterpret_cast<unsigned long long*>(status), 0ull, (unsigned long long)(site + 1)) == 0ull)
    status[1] = i;
#else
  if (status[0] == 0) {
    status[0] = site + 1;
    status[1] = i;
  }
#endif
  return 0;
}
