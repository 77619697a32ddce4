/* The CUDA driver as the launcher (tf_cuda.c) and the CUDA execution provider
 * (tf_ep_cuda.c) share it: opened once with dlopen, its functions in one table. */
#ifndef TILEFUSE_ORT_CUDA_H
#define TILEFUSE_ORT_CUDA_H

#include "cuda_abi.h"
#include "tf_kernel.h"

typedef struct {
#define TF_FIELD(name, symbol) tf_##name##_fn name;
  TF_CUDA_SYMBOLS(TF_FIELD)
#undef TF_FIELD
} tf_driver;

extern tf_driver tf_cu;

/* Open libcuda.so.1 and cuInit (once per process). NULL when the driver is ready, else a
 * sentence saying why it is not (no libcuda, a symbol missing, cuInit failing). */
const char* tf_cuda_open(void);

/* The name of a CUresult ("CUDA_ERROR_OUT_OF_MEMORY"), or "unknown CUDA error". */
const char* tf_cuda_error_name(tf_CUresult r);

/* Bind the context's tensors (device pointers), then launch `k` on `stream` in `cu_ctx`,
 * loading its module there first if needed. */
OrtStatus* tf_cuda_launch_in(const OrtApi* api, tf_kernel* k, OrtKernelContext* ctx, tf_CUcontext cu_ctx,
                             tf_CUstream stream);

#endif
