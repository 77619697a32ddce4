/* Launching a tilefuse CUDA kernel from an onnxruntime custom op.
 *
 * The op runs on onnxruntime's CUDA provider: inputs and outputs are device pointers,
 * and the kernel goes on the provider's compute stream (KernelContext_GetGPUComputeStream),
 * in the stream's context. The cubin is read when the session is created and loaded as a
 * module on first run (a module belongs to a context). TMA descriptors hold addresses, so
 * they are encoded on every run from the arguments TileLang recorded at compile time; that
 * is a host-side call of a microsecond or so. libcuda is opened with dlopen.
 *
 * A kernel that checks indices gets a status word in device memory (one per kernel and
 * context, zeroed when allocated): after the launch the stream is waited for and the word
 * read back, under the kernel's lock, so that concurrent runs of the node each read their
 * own result; a word that reports a bad index is cleared and fails the node.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tf_cuda.h"

#define TF_MAX_TMA_RANK 5
#define TF_MAX_LAUNCH_ARGS 64

typedef struct {
  int tensormap; /* else a plain pointer */
  int param;     /* index into the kernel's params: inputs, then outputs */
  unsigned dtype, interleave, swizzle, l2, oob;
  uint32_t rank;
  uint64_t dims[TF_MAX_TMA_RANK], strides[TF_MAX_TMA_RANK];
  uint32_t box[TF_MAX_TMA_RANK], elem[TF_MAX_TMA_RANK];
} tf_cuda_arg;

struct tf_cuda {
  unsigned grid[3], block[3], smem;
  int have_grid, have_block;
  int n_args;
  tf_cuda_arg args[TF_MAX_LAUNCH_ARGS];
  void* image;
  pthread_mutex_t lock;
  tf_CUcontext ctx; /* where module and fn were loaded */
  tf_CUmodule module;
  tf_CUfunction fn;
  tf_CUdeviceptr status; /* the status word in ctx, for a kernel that checks indices */
};

/* ------------------------------------------------------------------ the driver */

tf_driver tf_cu;
static char g_cu_error[512];
static pthread_once_t g_cu_once = PTHREAD_ONCE_INIT;

static void open_driver(void) {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    snprintf(g_cu_error, sizeof g_cu_error, "cannot open the CUDA driver (libcuda.so.1): %s", dlerror());
    return;
  }
#define TF_LOAD(name, symbol)                                                                              \
  if (!(*(void**)&tf_cu.name = dlsym(lib, symbol))) {                                                      \
    snprintf(g_cu_error, sizeof g_cu_error, "the CUDA driver has no %s (driver too old for sm_90 kernels?)", symbol); \
    return;                                                                                                \
  }
  TF_CUDA_SYMBOLS(TF_LOAD)
#undef TF_LOAD
  tf_CUresult r = tf_cu.cuInit(0);
  if (r != 0)
    snprintf(g_cu_error, sizeof g_cu_error, "cuInit failed: %s (%u); is there an NVIDIA GPU and a working driver?",
             tf_cuda_error_name(r), (unsigned)r);
}

const char* tf_cuda_open(void) {
  pthread_once(&g_cu_once, open_driver);
  return g_cu_error[0] ? g_cu_error : NULL;
}

const char* tf_cuda_error_name(tf_CUresult r) {
  const char* name = NULL;
  if (tf_cu.cuGetErrorName) tf_cu.cuGetErrorName(r, &name);
  return name ? name : "unknown CUDA error";
}

static OrtStatus* cu_status(const OrtApi* api, const tf_kernel* k, tf_CUresult r, const char* what) {
  return tf_status(api, ORT_FAIL, "node %s: kernel %s: %s failed: %s (%u)", k->node, k->name, what,
                   tf_cuda_error_name(r), (unsigned)r);
}

/* ------------------------------------------------------------------ the descriptor */

static int read_u32s(char** rest, uint32_t* out, int n) {
  for (int i = 0; i < n; i++) {
    char* end;
    unsigned long v = strtoul(*rest, &end, 10);
    if (end == *rest) return 0;
    out[i] = (uint32_t)v;
    *rest = end;
  }
  return 1;
}

static int read_u64s(char** rest, uint64_t* out, int n) {
  for (int i = 0; i < n; i++) {
    char* end;
    unsigned long long v = strtoull(*rest, &end, 10);
    if (end == *rest) return 0;
    out[i] = (uint64_t)v;
    *rest = end;
  }
  return 1;
}

int tf_cuda_parse_line(tf_kernel* k, const char* key, char* rest) {
  if (!k->cuda) {
    k->cuda = calloc(1, sizeof *k->cuda);
    if (!k->cuda) return 0;
    pthread_mutex_init(&k->cuda->lock, NULL);
  }
  tf_cuda* c = k->cuda;
  if (!strcmp(key, "grid")) return c->have_grid = read_u32s(&rest, c->grid, 3);
  if (!strcmp(key, "block")) return c->have_block = read_u32s(&rest, c->block, 3);
  if (!strcmp(key, "smem")) return read_u32s(&rest, &c->smem, 1);
  if (strcmp(key, "arg") != 0) return 1; /* unknown keys are for newer readers */
  if (c->n_args >= TF_MAX_LAUNCH_ARGS) return 0;
  tf_cuda_arg* a = &c->args[c->n_args++];
  char kind[32];
  int used = 0;
  if (sscanf(rest, "%31s %d%n", kind, &a->param, &used) != 2 || a->param < 0) return 0;
  rest += used;
  if (!strcmp(kind, "pointer")) return 1;
  if (strcmp(kind, "tensormap") != 0) return 0;
  a->tensormap = 1;
  uint32_t head[6];
  if (!read_u32s(&rest, head, 6)) return 0; /* dtype rank interleave swizzle l2 oob */
  a->dtype = head[0], a->rank = head[1], a->interleave = head[2], a->swizzle = head[3], a->l2 = head[4], a->oob = head[5];
  if (a->rank < 1 || a->rank > TF_MAX_TMA_RANK) return 0;
  return read_u64s(&rest, a->dims, (int)a->rank) && read_u64s(&rest, a->strides, (int)a->rank - 1) &&
         read_u32s(&rest, a->box, (int)a->rank) && read_u32s(&rest, a->elem, (int)a->rank);
}

int tf_cuda_prepare(tf_kernel* k, char* err, size_t errlen) {
  tf_cuda* c = k->cuda;
  if (!c || !c->have_grid || !c->have_block || !c->n_args) {
    snprintf(err, errlen, "%s: a cuda kernel descriptor needs grid, block and arg lines", k->path);
    return 0;
  }
  int n_params = k->n_in + k->n_out + k->checked;
  for (int i = 0; i < c->n_args; i++)
    if (c->args[i].param >= n_params) {
      snprintf(err, errlen, "%s: argument %d names param %d of %d", k->path, i, c->args[i].param, n_params);
      return 0;
    }
  unsigned char* image = NULL;
  size_t size = 0;
  char why[1024];
  int ok = tf_read_verified(k->library, k->sha256, &image, &size, why, sizeof why);
  c->image = image;  /* the verified bytes are what cuModuleLoadData gets */
  if (!ok) snprintf(err, errlen, "node %s: kernel %s: %s", k->node, k->name, why);
  return ok;
}

void tf_cuda_free(tf_kernel* k) {
  if (!k->cuda) return;
  if (k->cuda->status && !tf_cuda_open() && !tf_cu.cuCtxPushCurrent(k->cuda->ctx)) { /* in its own context */
    tf_CUcontext popped;
    tf_cu.cuMemFree(k->cuda->status);
    tf_cu.cuCtxPopCurrent(&popped);
  }
  /* The module stays loaded: unloading needs its context current, and a session ends once. */
  pthread_mutex_destroy(&k->cuda->lock);
  free(k->cuda->image);
  free(k->cuda);
  k->cuda = NULL;
}

/* ------------------------------------------------------------------ running */

static OrtStatus* load_function(const OrtApi* api, tf_kernel* k, tf_CUcontext ctx) {
  tf_cuda* c = k->cuda;
  OrtStatus* st = NULL;
  pthread_mutex_lock(&c->lock);
  if (!c->fn || c->ctx != ctx) {
    tf_CUresult r = tf_cu.cuModuleLoadData(&c->module, c->image);
    if (r) st = cu_status(api, k, r, "cuModuleLoadData");
    if (!st && (r = tf_cu.cuModuleGetFunction(&c->fn, c->module, k->symbol))) st = cu_status(api, k, r, "cuModuleGetFunction");
    if (!st && c->smem &&
        (r = tf_cu.cuFuncSetAttribute(c->fn, TF_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)c->smem)))
      st = cu_status(api, k, r, "cuFuncSetAttribute(dynamic shared memory)");
    if (!st && k->checked) { /* a word of the old context, if any, went with it */
      static const int64_t zero[2] = {0, 0};
      if ((r = tf_cu.cuMemAlloc(&c->status, sizeof zero))) st = cu_status(api, k, r, "cuMemAlloc(status word)");
      else if ((r = tf_cu.cuMemcpyHtoD(c->status, zero, sizeof zero))) st = cu_status(api, k, r, "cuMemcpyHtoD(status word)");
    }
    if (st) c->fn = NULL;
    else c->ctx = ctx;
  }
  pthread_mutex_unlock(&c->lock);
  return st;
}

static OrtStatus* launch(const OrtApi* api, tf_kernel* k, void** data, tf_CUstream stream) {
  tf_cuda* c = k->cuda;
  void* params[TF_MAX_LAUNCH_ARGS];
  void* pointers[TF_MAX_LAUNCH_ARGS];
  tf_CUtensorMap maps[TF_MAX_LAUNCH_ARGS];
  for (int i = 0; i < c->n_args; i++) {
    const tf_cuda_arg* a = &c->args[i];
    void* address = data[a->param];
    if (!a->tensormap) {
      pointers[i] = address;
      params[i] = &pointers[i];
      continue;
    }
    if ((uintptr_t)address % 16)
      return tf_status(api, ORT_FAIL, "node %s: kernel %s: TMA needs 16-byte aligned tensors (param %d)", k->node,
                       k->name, a->param);
    tf_CUresult r = tf_cu.cuTensorMapEncodeTiled(&maps[i], a->dtype, a->rank, address, a->dims, a->strides, a->box,
                                                a->elem, a->interleave, a->swizzle, a->l2, a->oob);
    if (r) return cu_status(api, k, r, "cuTensorMapEncodeTiled");
    params[i] = &maps[i];
  }
  tf_CUresult r = tf_cu.cuLaunchKernel(c->fn, c->grid[0], c->grid[1], c->grid[2], c->block[0], c->block[1],
                                      c->block[2], c->smem, stream, params, NULL);
  return r ? cu_status(api, k, r, "cuLaunchKernel") : NULL;
}

/* Launch a kernel that checks indices and read its status word back (see the top). */
static OrtStatus* launch_checked(const OrtApi* api, tf_kernel* k, void** data, tf_CUstream stream) {
  tf_cuda* c = k->cuda;
  int64_t status[2] = {0, 0};
  pthread_mutex_lock(&c->lock);
  data[k->n_in + k->n_out] = (void*)(uintptr_t)c->status;
  OrtStatus* st = launch(api, k, data, stream);
  tf_CUresult r = 0;
  if (!st && stream && (r = tf_cu.cuStreamSynchronize(stream))) st = cu_status(api, k, r, "cuStreamSynchronize");
  if (!st && (r = tf_cu.cuMemcpyDtoH(status, c->status, sizeof status))) st = cu_status(api, k, r, "cuMemcpyDtoH(status word)");
  if (!st && status[0]) {
    static const int64_t zero[2] = {0, 0};
    if ((r = tf_cu.cuMemcpyHtoD(c->status, zero, sizeof zero))) st = cu_status(api, k, r, "cuMemcpyHtoD(status word)");
    else st = tf_index_error(api, k, status);
  }
  pthread_mutex_unlock(&c->lock);
  return st;
}

OrtStatus* tf_cuda_launch_in(const OrtApi* api, tf_kernel* k, OrtKernelContext* ctx, tf_CUcontext cu_ctx,
                             tf_CUstream stream) {
  void* data[2 * TF_MAX_ARGS + 1];
  OrtStatus* st = tf_kernel_bind(api, k, ctx, data);
  if (st) return st;
  const char* why = tf_cuda_open();
  if (why) return tf_status(api, ORT_FAIL, "node %s: %s", k->node, why);
  if (cu_ctx) {
    tf_CUresult r = tf_cu.cuCtxPushCurrent(cu_ctx);
    if (r) return cu_status(api, k, r, "cuCtxPushCurrent");
  }
  st = load_function(api, k, cu_ctx);
  if (!st && k->checked) st = launch_checked(api, k, data, stream);
  else if (!st) st = launch(api, k, data, stream);
  if (cu_ctx) {
    tf_CUcontext popped;
    tf_cu.cuCtxPopCurrent(&popped);
  }
  return st;
}

OrtStatus* tf_cuda_run(const OrtApi* api, tf_kernel* k, OrtKernelContext* ctx) {
  void* stream = NULL;
  OrtStatus* st = ORT_FN(api, SLOT_KernelContext_GetGPUComputeStream, KernelContext_GetGPUComputeStream_fn)(ctx, &stream);
  if (st) return st;
  tf_CUcontext cu_ctx = NULL;
  if (stream && !tf_cuda_open()) { /* the provider's stream: run in its context */
    tf_CUresult r = tf_cu.cuStreamGetCtx((tf_CUstream)stream, &cu_ctx);
    if (r) return cu_status(api, k, r, "cuStreamGetCtx");
  }
  return tf_cuda_launch_in(api, k, ctx, cu_ctx, (tf_CUstream)stream);
}
