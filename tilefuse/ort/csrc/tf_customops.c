/* tilefuse kernels as onnxruntime custom ops (any onnxruntime with C API 16, 1.16 on).
 *
 * Two ops in domain ai.tilefuse, with variadic inputs and outputs of any type:
 * FusedKernel runs a CPU kernel on the CPU provider; FusedKernelCuda runs a CUDA kernel on
 * the CUDA provider, on its compute stream (tf_cuda.c); a CPU kernel's parallel loops run
 * on the session's intra-op pool where the C API has KernelContext_ParallelFor (17, 1.17
 * on; see tf_kernel.h). The string attribute `kernel`
 * names the kernel descriptor, relative to the folder this library sits in (export-ort
 * --as custom-ops copies the library beside the model).
 *
 * Exported: RegisterCustomOps, nothing else (-fvisibility=hidden).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tf_kernel.h"

#define TF_OPS_API 16
#define TF_DOMAIN "ai.tilefuse"
#define TF_OP "FusedKernel"
#define TF_OP_CUDA "FusedKernelCuda"

typedef struct {
  const OrtApi* api;
  KernelContext_ParallelFor_fn parallel_for; /* NULL before C API 17 */
  tf_kernel* kernel;
} tf_op_kernel;

static char g_dir[4096];  /* this library's folder */
/* onnxruntime's KernelContext_ParallelFor where its C API has it (17, 1.17 on), else NULL:
 * the same for every registration, as there is one onnxruntime per process */
static KernelContext_ParallelFor_fn g_parallel_for;

static void find_own_folder(void) {
  Dl_info info;
  if (g_dir[0] || !dladdr((void*)find_own_folder, &info) || !info.dli_fname) return;
  snprintf(g_dir, sizeof g_dir, "%s", info.dli_fname);
  char* slash = strrchr(g_dir, '/');
  if (slash) *slash = 0;
  else snprintf(g_dir, sizeof g_dir, ".");
}

static OrtStatus* string_attr(const OrtApi* api, const OrtKernelInfo* info, const char* name, char* buf, size_t len) {
  size_t size = len;
  return ORT_FN(api, SLOT_KernelInfoGetAttribute_string, KernelInfoGetAttribute_string_fn)(info, name, buf, &size);
}

static int is_cuda(const OrtCustomOp* op);

static OrtStatus* op_create_kernel(const OrtCustomOp* op, const OrtApi* api, const OrtKernelInfo* info, void** out) {
  char node[256] = "", rel[4096], err[TF_ERR_LEN];
  size_t size = sizeof node;
  OrtStatus* st = ORT_FN(api, SLOT_KernelInfo_GetNodeName, KernelInfo_GetNodeName_fn)(info, node, &size);
  if (st) tf_take_message(api, st, err, sizeof err);
  st = string_attr(api, info, "kernel", rel, sizeof rel);
  if (st) {
    tf_take_message(api, st, err, sizeof err);
    return tf_status(api, ORT_INVALID_GRAPH, "node %s: no string attribute 'kernel' naming its kernel (%s)", node, err);
  }
  tf_kernel* k = tf_kernel_load(g_dir, rel, node, is_cuda(op) ? TF_TARGET_CUDA : TF_TARGET_CPU, err, sizeof err);
  if (!k)
    return tf_status(api, ORT_NO_SUCHFILE, "%s (kernels are looked up beside this library, in %s: register the "
                     "library that export-ort wrote beside the model)", err, g_dir);
  tf_op_kernel* kernel = malloc(sizeof *kernel);
  if (!kernel) {
    tf_kernel_free(k);
    return tf_status(api, ORT_FAIL, "out of memory");
  }
  kernel->api = api;
  kernel->parallel_for = g_parallel_for;
  kernel->kernel = k;
  *out = kernel;
  return NULL;
}

static OrtStatus* op_compute(void* kernel, OrtKernelContext* ctx) {
  tf_op_kernel* k = kernel;
  if (k->kernel->target == TF_TARGET_CUDA) return tf_cuda_run(k->api, k->kernel, ctx);
  return tf_kernel_run(k->api, k->kernel, ctx, k->parallel_for);
}

static void op_destroy(void* kernel) {
  tf_op_kernel* k = kernel;
  if (!k) return;
  tf_kernel_free(k->kernel);
  free(k);
}

static const char* op_name(const OrtCustomOp* op) {
  (void)op;
  return TF_OP;
}

static const char* op_cuda_name(const OrtCustomOp* op) {
  (void)op;
  return TF_OP_CUDA;
}

static const char* op_provider(const OrtCustomOp* op) {
  (void)op;
  return NULL; /* the CPU provider */
}

static const char* op_cuda_provider(const OrtCustomOp* op) {
  (void)op;
  return "CUDAExecutionProvider";
}

static int op_any_type(const OrtCustomOp* op, size_t i) {
  (void)op, (void)i;
  return TF_ELEM_UNDEFINED;
}

static size_t op_one(const OrtCustomOp* op) {
  (void)op;
  return 1;
}

static int op_variadic(const OrtCustomOp* op, size_t i) {
  (void)op, (void)i;
  return TF_IO_VARIADIC;
}

static int op_default_memory(const OrtCustomOp* op, size_t i) {
  (void)op, (void)i;
  return 0; /* OrtMemTypeDefault */
}

static int op_min_arity(const OrtCustomOp* op) {
  (void)op;
  return 1;
}

static int op_heterogeneous(const OrtCustomOp* op) {
  (void)op;
  return 0;
}

/* The two ops differ only in name and provider. */
#define TF_OP_FIELDS                                                                            \
  .version = TF_OPS_API, .GetInputType = op_any_type, .GetInputTypeCount = op_one,              \
  .GetOutputType = op_any_type, .GetOutputTypeCount = op_one, .KernelDestroy = op_destroy,      \
  .GetInputCharacteristic = op_variadic, .GetOutputCharacteristic = op_variadic,                \
  .GetInputMemoryType = op_default_memory, .GetVariadicInputMinArity = op_min_arity,            \
  .GetVariadicInputHomogeneity = op_heterogeneous, .GetVariadicOutputMinArity = op_min_arity,   \
  .GetVariadicOutputHomogeneity = op_heterogeneous, .CreateKernelV2 = op_create_kernel,         \
  .KernelComputeV2 = op_compute

static const OrtCustomOp g_op = {TF_OP_FIELDS, .GetName = op_name, .GetExecutionProviderType = op_provider};
static const OrtCustomOp g_op_cuda = {TF_OP_FIELDS, .GetName = op_cuda_name,
                                      .GetExecutionProviderType = op_cuda_provider};

static int is_cuda(const OrtCustomOp* op) { return op == &g_op_cuda; }

TF_EXPORT OrtStatus* RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* base) {
  const OrtApi* api = base->GetApi(TF_OPS_API);
  if (!api) {
    const OrtApi* v1 = base->GetApi(1);
    if (!v1) return NULL;
    return tf_status(v1, ORT_FAIL, "the custom-op library needs onnxruntime 1.16 or newer (C API %d); this onnxruntime is %s",
                     TF_OPS_API, base->GetVersionString());
  }
  find_own_folder();
  const OrtApi* newer = base->GetApi(TF_PARALLEL_FOR_API);
  g_parallel_for = newer ? ORT_FN(newer, SLOT_KernelContext_ParallelFor, KernelContext_ParallelFor_fn) : NULL;
  OrtCustomOpDomain* domain = NULL;  /* must outlive every session: never released */
  OrtStatus* st = ORT_FN(api, SLOT_CreateCustomOpDomain, CreateCustomOpDomain_fn)(TF_DOMAIN, &domain);
  if (!st) st = ORT_FN(api, SLOT_CustomOpDomain_Add, CustomOpDomain_Add_fn)(domain, &g_op);
  if (!st) st = ORT_FN(api, SLOT_CustomOpDomain_Add, CustomOpDomain_Add_fn)(domain, &g_op_cuda);
  if (!st) st = ORT_FN(api, SLOT_AddCustomOpDomain, AddCustomOpDomain_fn)(options, domain);
  return st;
}
