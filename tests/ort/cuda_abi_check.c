/* Compiled by test_cuda_build.py against the real cuda.h: tilefuse's own declarations of
 * the driver API (tilefuse/ort/csrc/cuda_abi.h) must match it. Prints mismatches of the
 * exported symbol names and exits 1; type mismatches fail the compilation. */
#include <stdio.h>
#include <string.h>

#include <cuda.h>

#define TF_STR(x) #x
#define TF_XSTR(x) TF_STR(x)

/* The header's own declarations, beside the real ones. */
#include "cuda_abi.h"
_Static_assert(sizeof(tf_CUtensorMap) == sizeof(CUtensorMap), "CUtensorMap size");
_Static_assert(_Alignof(tf_CUtensorMap) == _Alignof(CUtensorMap), "CUtensorMap alignment");
_Static_assert(sizeof(tf_CUresult) == sizeof(CUresult), "CUresult size");
_Static_assert(sizeof(tf_CUtensorMapDataType) == sizeof(CUtensorMapDataType), "enum size");
_Static_assert(TF_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
               "attribute number");
_Static_assert(TF_CU_STREAM_NON_BLOCKING == CU_STREAM_NON_BLOCKING, "stream flag");
_Static_assert(TF_CU_EVENT_DISABLE_TIMING == CU_EVENT_DISABLE_TIMING, "event flag");

int main(void) {
  int bad = 0;
  /* cuda.h's macros name the versioned symbol that code compiled against it would call. */
#define TF_SAME_SYMBOL(name, symbol)                                              \
  if (strcmp(symbol, TF_XSTR(name)) != 0) {                                       \
    printf("%s: tilefuse loads %s, cuda.h calls %s\n", #name, symbol, TF_XSTR(name)); \
    bad = 1;                                                                      \
  }
  TF_CUDA_SYMBOLS(TF_SAME_SYMBOL)
  return bad;
}
