/* The plugin execution providers' shared types: one factory per provider, the CPU one
 * (tf_ep.c) and the CUDA one, whose device, allocator and data transfer are in
 * tf_ep_cuda.c. */
#ifndef TILEFUSE_ORT_EP_H
#define TILEFUSE_ORT_EP_H

#include "tf_kernel.h"

#define TF_EP_NAME "TilefuseExecutionProvider"
#define TF_CUDA_EP_NAME "TilefuseCudaExecutionProvider"
#define TF_EP_API 23 /* plugin providers that compile nodes, allocate and copy: onnxruntime 1.23 */

typedef struct tf_gpu tf_gpu; /* the CUDA provider's devices (tf_ep_cuda.c) */

typedef struct {
  OrtEpFactory base;
  const OrtApi* api;
  const void* ep_api;
  KernelContext_ParallelFor_fn parallel_for; /* in every C API the providers accept (23 on) */
  const char* name; /* the EPContext nodes it claims have this `source` */
  tf_target target;
  tf_gpu* gpu;      /* CUDA factory only */
} tf_factory;

#ifdef TF_WITH_CUDA
/* Fill the CUDA factory's device, allocator and data-transfer entries; 0 if out of memory. */
int tf_gpu_init(tf_factory* f);
void tf_gpu_free(tf_factory* f);
/* The CUDA context of the device a session was given (its primary context, retained);
 * an error status when there is no usable driver or device. */
OrtStatus* tf_gpu_session_context(tf_factory* f, const OrtHardwareDevice* const* devices, size_t n, void** ctx);
/* Run a CUDA kernel in `ctx` (launched on the legacy default stream: see tf_ep_cuda.c). */
OrtStatus* tf_gpu_run(const OrtApi* api, tf_kernel* k, OrtKernelContext* kctx, void* ctx);
#endif

#endif
