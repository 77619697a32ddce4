/* The parts of the CUDA driver API that tilefuse's custom ops and CUDA execution provider use, declared by tilefuse.
 *
 * libcuda is opened at run time (dlopen), so the library builds and loads on machines
 * without CUDA, and needs no CUDA headers. tests/ort/test_cuda_build.py compiles this
 * file against the real cuda.h (TF_CHECK_CUDA_H) to prove the declarations match.
 */
#ifndef TILEFUSE_CUDA_ABI_H
#define TILEFUSE_CUDA_ABI_H

#include <stddef.h>
#include <stdint.h>

#ifdef TF_CHECK_CUDA_H
/* Compile-time check: the same names as the real types, so that the function types below
 * can be compared with cuda.h's prototypes. */
#include <cuda.h>
typedef CUresult tf_CUresult;
typedef CUdevice tf_CUdevice;
typedef CUdeviceptr tf_CUdeviceptr;
typedef CUcontext tf_CUcontext;
typedef CUmodule tf_CUmodule;
typedef CUfunction tf_CUfunction;
typedef CUstream tf_CUstream;
typedef CUevent tf_CUevent;
typedef CUtensorMap tf_CUtensorMap;
typedef CUfunction_attribute tf_CUfunction_attribute;
typedef CUtensorMapDataType tf_CUtensorMapDataType;
typedef CUtensorMapInterleave tf_CUtensorMapInterleave;
typedef CUtensorMapSwizzle tf_CUtensorMapSwizzle;
typedef CUtensorMapL2promotion tf_CUtensorMapL2promotion;
typedef CUtensorMapFloatOOBfill tf_CUtensorMapFloatOOBfill;
#else
/* C enums without negative values are unsigned int (gcc, clang). */
typedef unsigned int tf_CUresult; /* 0 is CUDA_SUCCESS */
typedef int tf_CUdevice;
typedef unsigned long long tf_CUdeviceptr; /* 64-bit builds */
typedef struct CUctx_st* tf_CUcontext;
typedef struct CUmod_st* tf_CUmodule;
typedef struct CUfunc_st* tf_CUfunction;
typedef struct CUstream_st* tf_CUstream;
typedef struct CUevent_st* tf_CUevent;
typedef struct {
  _Alignas(128) uint64_t opaque[16];
} tf_CUtensorMap; /* 128 bytes, 128-byte aligned (as cuda.h declares it) */
typedef unsigned int tf_CUfunction_attribute;
typedef unsigned int tf_CUtensorMapDataType;
typedef unsigned int tf_CUtensorMapInterleave;
typedef unsigned int tf_CUtensorMapSwizzle;
typedef unsigned int tf_CUtensorMapL2promotion;
typedef unsigned int tf_CUtensorMapFloatOOBfill;
#endif

#define TF_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES 8
#define TF_CU_STREAM_NON_BLOCKING 1 /* not ordered with the legacy default stream */
#define TF_CU_EVENT_DISABLE_TIMING 2

typedef tf_CUresult (*tf_cuInit_fn)(unsigned int flags);
typedef tf_CUresult (*tf_cuGetErrorName_fn)(tf_CUresult error, const char** name);
typedef tf_CUresult (*tf_cuDeviceGetCount_fn)(int* count);
typedef tf_CUresult (*tf_cuDeviceGet_fn)(tf_CUdevice* device, int ordinal);
typedef tf_CUresult (*tf_cuDevicePrimaryCtxRetain_fn)(tf_CUcontext* ctx, tf_CUdevice device);
typedef tf_CUresult (*tf_cuCtxSynchronize_fn)(void);
typedef tf_CUresult (*tf_cuMemAlloc_fn)(tf_CUdeviceptr* ptr, size_t bytes);
typedef tf_CUresult (*tf_cuMemFree_fn)(tf_CUdeviceptr ptr);
typedef tf_CUresult (*tf_cuMemcpyHtoD_fn)(tf_CUdeviceptr dst, const void* src, size_t bytes);
typedef tf_CUresult (*tf_cuMemcpyDtoH_fn)(void* dst, tf_CUdeviceptr src, size_t bytes);
typedef tf_CUresult (*tf_cuMemcpyDtoD_fn)(tf_CUdeviceptr dst, tf_CUdeviceptr src, size_t bytes);
typedef tf_CUresult (*tf_cuMemcpyHtoDAsync_fn)(tf_CUdeviceptr dst, const void* src, size_t bytes, tf_CUstream stream);
typedef tf_CUresult (*tf_cuMemcpyDtoHAsync_fn)(void* dst, tf_CUdeviceptr src, size_t bytes, tf_CUstream stream);
typedef tf_CUresult (*tf_cuMemcpyDtoDAsync_fn)(tf_CUdeviceptr dst, tf_CUdeviceptr src, size_t bytes,
                                               tf_CUstream stream);
typedef tf_CUresult (*tf_cuStreamCreate_fn)(tf_CUstream* stream, unsigned int flags);
typedef tf_CUresult (*tf_cuStreamDestroy_fn)(tf_CUstream stream);
typedef tf_CUresult (*tf_cuStreamWaitEvent_fn)(tf_CUstream stream, tf_CUevent event, unsigned int flags);
typedef tf_CUresult (*tf_cuEventCreate_fn)(tf_CUevent* event, unsigned int flags);
typedef tf_CUresult (*tf_cuEventRecord_fn)(tf_CUevent event, tf_CUstream stream);
typedef tf_CUresult (*tf_cuEventSynchronize_fn)(tf_CUevent event);
typedef tf_CUresult (*tf_cuEventDestroy_fn)(tf_CUevent event);
typedef tf_CUresult (*tf_cuStreamGetCtx_fn)(tf_CUstream stream, tf_CUcontext* ctx);
typedef tf_CUresult (*tf_cuStreamSynchronize_fn)(tf_CUstream stream);
typedef tf_CUresult (*tf_cuCtxPushCurrent_fn)(tf_CUcontext ctx);
typedef tf_CUresult (*tf_cuCtxPopCurrent_fn)(tf_CUcontext* ctx);
typedef tf_CUresult (*tf_cuModuleLoadData_fn)(tf_CUmodule* module, const void* image);
typedef tf_CUresult (*tf_cuModuleGetFunction_fn)(tf_CUfunction* fn, tf_CUmodule module, const char* name);
typedef tf_CUresult (*tf_cuFuncSetAttribute_fn)(tf_CUfunction fn, tf_CUfunction_attribute attribute, int value);
typedef tf_CUresult (*tf_cuLaunchKernel_fn)(tf_CUfunction fn, unsigned int gx, unsigned int gy, unsigned int gz,
                                            unsigned int bx, unsigned int by, unsigned int bz, unsigned int smem,
                                            tf_CUstream stream, void** params, void** extra);
typedef tf_CUresult (*tf_cuTensorMapEncodeTiled_fn)(tf_CUtensorMap* map, tf_CUtensorMapDataType dtype, uint32_t rank,
                                                    void* address, const uint64_t* dims, const uint64_t* strides,
                                                    const uint32_t* box, const uint32_t* element_strides,
                                                    tf_CUtensorMapInterleave interleave, tf_CUtensorMapSwizzle swizzle,
                                                    tf_CUtensorMapL2promotion l2_promotion,
                                                    tf_CUtensorMapFloatOOBfill oob_fill);

/* Each function: its field name and its exported name in libcuda.so.1 (cuda.h maps some
 * names to versioned symbols; these are the ones its macros pick). */
#define TF_CUDA_SYMBOLS(X)                          \
  X(cuInit, "cuInit")                               \
  X(cuGetErrorName, "cuGetErrorName")               \
  X(cuDeviceGetCount, "cuDeviceGetCount")           \
  X(cuDeviceGet, "cuDeviceGet")                     \
  X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain") \
  X(cuCtxSynchronize, "cuCtxSynchronize")           \
  X(cuMemAlloc, "cuMemAlloc_v2")                    \
  X(cuMemFree, "cuMemFree_v2")                      \
  X(cuMemcpyHtoD, "cuMemcpyHtoD_v2")                \
  X(cuMemcpyDtoH, "cuMemcpyDtoH_v2")                \
  X(cuMemcpyDtoD, "cuMemcpyDtoD_v2")                \
  X(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2")      \
  X(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2")      \
  X(cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2")      \
  X(cuStreamCreate, "cuStreamCreate")               \
  X(cuStreamDestroy, "cuStreamDestroy_v2")          \
  X(cuStreamWaitEvent, "cuStreamWaitEvent")         \
  X(cuEventCreate, "cuEventCreate")                 \
  X(cuEventRecord, "cuEventRecord")                 \
  X(cuEventSynchronize, "cuEventSynchronize")       \
  X(cuEventDestroy, "cuEventDestroy_v2")            \
  X(cuStreamGetCtx, "cuStreamGetCtx")               \
  X(cuStreamSynchronize, "cuStreamSynchronize")     \
  X(cuCtxPushCurrent, "cuCtxPushCurrent_v2")        \
  X(cuCtxPopCurrent, "cuCtxPopCurrent_v2")          \
  X(cuModuleLoadData, "cuModuleLoadData")           \
  X(cuModuleGetFunction, "cuModuleGetFunction")     \
  X(cuFuncSetAttribute, "cuFuncSetAttribute")       \
  X(cuLaunchKernel, "cuLaunchKernel")               \
  X(cuTensorMapEncodeTiled, "cuTensorMapEncodeTiled")

#endif
