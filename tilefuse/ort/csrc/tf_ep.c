/* tilefuse as onnxruntime plugin execution providers (onnxruntime >= 1.23).
 *
 * Two factories: TilefuseExecutionProvider runs CPU kernels on the CPU device;
 * TilefuseCudaExecutionProvider runs CUDA kernels on an NVIDIA GPU, with its own device
 * memory, allocator and copies (tf_ep_cuda.c). Each one's GetCapability claims the
 * EPContext nodes (domain com.microsoft) whose `source` is its name, one fused node each;
 * Compile opens the kernel named by the node's `ep_cache_context` (a descriptor path
 * relative to the model) and Compute calls or launches it (a CPU kernel's parallel loops on
 * the session's intra-op pool: see tf_kernel.h). Everything else in the model
 * stays with onnxruntime's own providers.
 *
 * Exported: CreateEpFactories and ReleaseEpFactory, nothing else (-fvisibility=hidden).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tf_ep.h"

#ifndef TF_VERSION
#define TF_VERSION "0.0.0"
#endif

typedef struct {
  OrtEp base;
  tf_factory* factory;
  void* cu_ctx; /* the CUDA provider's device context */
} tf_ep;

typedef struct {
  OrtNodeComputeInfo base;
  const OrtApi* api;
  KernelContext_ParallelFor_fn parallel_for;
  tf_kernel* kernel;
  void* cu_ctx;
} tf_compute;

/* ---------------------------------------------------------------- reading the graph */

/* The string attribute `name` of `node` into buf; 0 if the node has none. */
static int node_string_attr(const OrtApi* api, const OrtNode* node, const char* name, char* buf, size_t len) {
  const OrtOpAttr* attr = NULL;
  OrtStatus* st = ORT_FN(api, SLOT_Node_GetAttributeByName, Node_GetAttributeByName_fn)(node, name, &attr);
  char ignored[16];
  if (st || !attr) {  /* onnxruntime versions differ: a missing attribute is an error or a NULL */
    tf_take_message(api, st, ignored, sizeof ignored);
    return 0;
  }
  size_t got = 0;
  st = ORT_FN(api, SLOT_ReadOpAttr, ReadOpAttr_fn)(attr, ORT_OP_ATTR_STRING, buf, len - 1, &got);
  if (st || got >= len) {
    tf_take_message(api, st, ignored, sizeof ignored);
    return 0;
  }
  buf[got] = 0;
  return 1;
}

static int node_int_attr(const OrtApi* api, const OrtNode* node, const char* name, int64_t* out) {
  const OrtOpAttr* attr = NULL;
  OrtStatus* st = ORT_FN(api, SLOT_Node_GetAttributeByName, Node_GetAttributeByName_fn)(node, name, &attr);
  char ignored[16];
  if (st || !attr) {
    tf_take_message(api, st, ignored, sizeof ignored);
    return 0;
  }
  size_t got = 0;
  st = ORT_FN(api, SLOT_ReadOpAttr, ReadOpAttr_fn)(attr, ORT_OP_ATTR_INT, out, sizeof *out, &got);
  tf_take_message(api, st, ignored, sizeof ignored);
  return !st;
}

static int is_ours(const OrtApi* api, const OrtNode* node, const char* ep_name) {
  const char* op = NULL;
  const char* domain = NULL;
  char source[256];
  OrtStatus* st = ORT_FN(api, SLOT_Node_GetOperatorType, Node_GetString_fn)(node, &op);
  if (!st) st = ORT_FN(api, SLOT_Node_GetDomain, Node_GetString_fn)(node, &domain);
  if (st) {
    char ignored[16];
    tf_take_message(api, st, ignored, sizeof ignored);
    return 0;
  }
  return op && domain && !strcmp(op, "EPContext") && !strcmp(domain, "com.microsoft") &&
         node_string_attr(api, node, "source", source, sizeof source) && !strcmp(source, ep_name);
}

/* ---------------------------------------------------------------- OrtEp */

static const char* ep_get_name(const OrtEp* ep) {
  return ((const tf_ep*)ep)->factory->name;
}

static OrtStatus* ep_get_capability(OrtEp* this_ptr, const OrtGraph* graph, OrtEpGraphSupportInfo* info) {
  tf_ep* ep = (tf_ep*)this_ptr;
  const OrtApi* api = ep->factory->api;
  size_t n = 0;
  OrtStatus* st = ORT_FN(api, SLOT_Graph_GetNumNodes, Graph_GetNumNodes_fn)(graph, &n);
  if (st || n == 0) return st;
  const OrtNode** nodes = malloc(n * sizeof *nodes);
  if (!nodes) return tf_status(api, ORT_FAIL, "out of memory");
  st = ORT_FN(api, SLOT_Graph_GetNodes, Graph_GetNodes_fn)(graph, nodes, n);
  AddNodesToFuse_fn add = ORT_FN(ep->factory->ep_api, EPSLOT_EpGraphSupportInfo_AddNodesToFuse, AddNodesToFuse_fn);
  for (size_t i = 0; !st && i < n; i++)
    if (is_ours(api, nodes[i], ep->factory->name)) st = add(info, &nodes[i], 1, NULL);  /* one fused node per kernel */
  free(nodes);
  return st;
}

static OrtStatus* compute_create_state(OrtNodeComputeInfo* info, OrtNodeComputeContext* ctx, void** state) {
  (void)ctx;
  *state = ((tf_compute*)info)->kernel;
  return NULL;
}

static OrtStatus* compute_run(OrtNodeComputeInfo* info, void* state, OrtKernelContext* ctx) {
  tf_compute* c = (tf_compute*)info;
#ifdef TF_WITH_CUDA
  if (c->kernel->target == TF_TARGET_CUDA) return tf_gpu_run(c->api, (tf_kernel*)state, ctx, c->cu_ctx);
#endif
  return tf_kernel_run(c->api, (const tf_kernel*)state, ctx, c->parallel_for);
}

static void compute_release_state(OrtNodeComputeInfo* info, void* state) {
  (void)info;
  (void)state;
}

static void release_compute(tf_compute* c) {
  if (!c) return;
  tf_kernel_free(c->kernel);
  free(c);
}

/* Position of each of `node`'s inputs (or outputs) among `fused`'s, matched by value name. */
static OrtStatus* match_values(const OrtApi* api, const OrtNode* node, const OrtNode* fused, int outputs, int expected,
                               int* index, const char* what) {
  Node_GetCount_fn count = ORT_FN(api, outputs ? SLOT_Node_GetNumOutputs : SLOT_Node_GetNumInputs, Node_GetCount_fn);
  Node_GetValueInfos_fn get = ORT_FN(api, outputs ? SLOT_Node_GetOutputs : SLOT_Node_GetInputs, Node_GetValueInfos_fn);
  GetValueInfoName_fn name_of = ORT_FN(api, SLOT_GetValueInfoName, GetValueInfoName_fn);
  size_t n = 0, m = 0;
  OrtStatus* st = count(node, &n);
  if (!st) st = count(fused, &m);
  if (st) return st;
  if (n != (size_t)expected)
    return tf_status(api, ORT_INVALID_GRAPH, "node %s has %zu %ss, its kernel takes %d", what, n,
                     outputs ? "output" : "input", expected);
  const OrtValueInfo** mine = calloc(n + m + 1, sizeof *mine);
  if (!mine) return tf_status(api, ORT_FAIL, "out of memory");
  const OrtValueInfo** theirs = mine + n;
  st = get(node, mine, n);
  if (!st) st = get(fused, theirs, m);
  for (size_t i = 0; !st && i < n; i++) {
    const char* a = NULL;
    index[i] = -1;
    if (mine[i]) st = name_of(mine[i], &a);
    for (size_t j = 0; !st && a && j < m && index[i] < 0; j++) {
      const char* b = NULL;
      if (theirs[j]) st = name_of(theirs[j], &b);
      if (!st && b && !strcmp(a, b)) index[i] = (int)j;
    }
    if (!st && index[i] < 0)
      st = tf_status(api, ORT_INVALID_GRAPH, "node %s: %s %zu (%s) is not among the fused node's", what,
                     outputs ? "output" : "input", i, a ? a : "(none)");
  }
  free(mine);
  return st;
}

/* The kernel of one claimed graph: its single EPContext node names the descriptor. */
static OrtStatus* compile_one(const tf_ep* ep, const OrtGraph* graph, const OrtNode* fused, tf_compute** out) {
  const OrtApi* api = ep->factory->api;
  size_t n = 0;
  const OrtNode* node = NULL;
  const char* node_name = "";
  OrtStatus* st = ORT_FN(api, SLOT_Graph_GetNumNodes, Graph_GetNumNodes_fn)(graph, &n);
  if (st) return st;
  if (n != 1) return tf_status(api, ORT_INVALID_GRAPH, "expected one EPContext node per fused graph, got %zu", n);
  st = ORT_FN(api, SLOT_Graph_GetNodes, Graph_GetNodes_fn)(graph, &node, 1);
  if (!st) st = ORT_FN(api, SLOT_Node_GetName, Node_GetString_fn)(node, &node_name);
  if (st) return st;
  char rel[4096];
  int64_t embed = 1;
  if (!node_string_attr(api, node, "ep_cache_context", rel, sizeof rel) || !rel[0])
    return tf_status(api, ORT_INVALID_GRAPH, "EPContext node %s has no ep_cache_context naming its kernel", node_name);
  if (!node_int_attr(api, node, "embed_mode", &embed)) embed = 1;  /* the operator's default */
  if (embed != 0)
    return tf_status(api, ORT_INVALID_GRAPH,
                     "EPContext node %s has embed_mode %lld; tilefuse kernels are files (embed_mode 0)", node_name,
                     (long long)embed);
  const char* model_path = NULL;
  st = ORT_FN(api, SLOT_Graph_GetModelPath, Graph_GetModelPath_fn)(graph, &model_path);
  if (st) return st;
  char dir[4096] = "";
  if (model_path && *model_path) {
    snprintf(dir, sizeof dir, "%s", model_path);
    char* slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    else snprintf(dir, sizeof dir, ".");
  } else if (rel[0] != '/') {
    return tf_status(api, ORT_INVALID_GRAPH,
                     "node %s: the model has no path (loaded from bytes?), so its kernel %s cannot be found; "
                     "load the model from its file", node_name, rel);
  }
  char err[TF_ERR_LEN];
  tf_kernel* k = tf_kernel_load(dir, rel, node_name, ep->factory->target, err, sizeof err);
  if (!k) return tf_status(api, ORT_NO_SUCHFILE, "%s", err);
  st = match_values(api, node, fused, 0, k->n_in, k->in_index, node_name);
  if (!st) st = match_values(api, node, fused, 1, k->n_out, k->out_index, node_name);
  if (st) {
    tf_kernel_free(k);
    return st;
  }
  tf_compute* c = calloc(1, sizeof *c);
  if (!c) {
    tf_kernel_free(k);
    return tf_status(api, ORT_FAIL, "out of memory");
  }
  c->base.ort_version_supported = TF_EP_API;
  c->base.CreateState = compute_create_state;
  c->base.Compute = compute_run;
  c->base.ReleaseState = compute_release_state;
  c->api = api;
  c->parallel_for = ep->factory->parallel_for;
  c->kernel = k;
  c->cu_ctx = ep->cu_ctx;
  *out = c;
  return NULL;
}

static OrtStatus* ep_compile(OrtEp* this_ptr, const OrtGraph** graphs, const OrtNode** fused, size_t count,
                             OrtNodeComputeInfo** infos, OrtNode** ep_context_nodes) {
  const tf_ep* ep = (const tf_ep*)this_ptr;
  for (size_t i = 0; i < count; i++) infos[i] = NULL;
  for (size_t i = 0; i < count; i++) {
    if (ep_context_nodes) ep_context_nodes[i] = NULL;  /* already an EPContext model: nothing to write */
    tf_compute* c = NULL;
    OrtStatus* st = compile_one(ep, graphs[i], fused[i], &c);
    if (st) {
      for (size_t j = 0; j < i; j++) {
        release_compute((tf_compute*)infos[j]);
        infos[j] = NULL;
      }
      return st;
    }
    infos[i] = &c->base;
  }
  return NULL;
}

static void ep_release_compute_infos(OrtEp* ep, OrtNodeComputeInfo** infos, size_t n) {
  (void)ep;
  for (size_t i = 0; i < n; i++) release_compute((tf_compute*)infos[i]);
}

/* ---------------------------------------------------------------- OrtEpFactory */

static const char* factory_name(const OrtEpFactory* f) {
  return ((const tf_factory*)f)->name;
}

static const char* factory_vendor(const OrtEpFactory* f) {
  (void)f;
  return "tilefuse";
}

static uint32_t factory_vendor_id(const OrtEpFactory* f) {
  (void)f;
  return 0;
}

static const char* factory_version(const OrtEpFactory* f) {
  (void)f;
  return TF_VERSION;
}

static OrtStatus* factory_devices(OrtEpFactory* this_ptr, const OrtHardwareDevice* const* devices, size_t n,
                                  OrtEpDevice** ep_devices, size_t max_ep_devices, size_t* num_ep_devices) {
  tf_factory* f = (tf_factory*)this_ptr;
  *num_ep_devices = 0;
  for (size_t i = 0; i < n && *num_ep_devices < max_ep_devices; i++) {
    if (ORT_FN(f->api, SLOT_HardwareDevice_Type, HardwareDevice_Type_fn)(devices[i]) != ORT_HW_CPU) continue;
    OrtEpDevice* d = NULL;
    OrtStatus* st = ORT_FN(f->ep_api, EPSLOT_CreateEpDevice, CreateEpDevice_fn)(this_ptr, devices[i], NULL, NULL, &d);
    if (st) return st;
    ep_devices[(*num_ep_devices)++] = d;
    break;  /* one CPU device is all a CPU provider needs */
  }
  return NULL;
}

static OrtStatus* factory_create_ep(OrtEpFactory* this_ptr, const OrtHardwareDevice* const* devices,
                                    const OrtKeyValuePairs* const* metadata, size_t n, const OrtSessionOptions* so,
                                    const OrtLogger* logger, OrtEp** out) {
  (void)metadata, (void)so, (void)logger;
  tf_factory* f = (tf_factory*)this_ptr;
  void* cu_ctx = NULL;
#ifdef TF_WITH_CUDA
  if (f->target == TF_TARGET_CUDA) {
    OrtStatus* st = tf_gpu_session_context(f, devices, n, &cu_ctx);
    if (st) return st;
  }
#else
  (void)devices, (void)n;
#endif
  tf_ep* ep = calloc(1, sizeof *ep);
  if (!ep) return tf_status(f->api, ORT_FAIL, "out of memory");
  ep->cu_ctx = cu_ctx;
  ep->base.ort_version_supported = TF_EP_API;
  ep->base.GetName = ep_get_name;
  ep->base.GetCapability = ep_get_capability;
  ep->base.Compile = ep_compile;
  ep->base.ReleaseNodeComputeInfos = ep_release_compute_infos;
  ep->factory = f;
  *out = &ep->base;
  return NULL;
}

static void factory_release_ep(OrtEpFactory* f, OrtEp* ep) {
  (void)f;
  free(ep);
}

static OrtStatus* factory_validate(OrtEpFactory* f, const OrtHardwareDevice* const* d, size_t n, const char* info,
                                   int* compatibility) {
  (void)f, (void)d, (void)n, (void)info;
  *compatibility = 0;  /* not applicable: tilefuse checks each kernel's shapes when it runs */
  return NULL;
}

static OrtStatus* factory_create_allocator(OrtEpFactory* f, const OrtMemoryInfo* m, const OrtKeyValuePairs* o,
                                           OrtAllocator** out) {
  (void)f, (void)m, (void)o;
  *out = NULL;  /* onnxruntime's CPU allocator */
  return NULL;
}

static void factory_release_allocator(OrtEpFactory* f, OrtAllocator* a) {
  (void)f, (void)a;
}

static OrtStatus* factory_create_data_transfer(OrtEpFactory* f, OrtDataTransferImpl** out) {
  (void)f;
  *out = NULL;  /* CPU memory only: nothing to copy */
  return NULL;
}

static bool factory_stream_aware(const OrtEpFactory* f) {
  (void)f;
  return false;
}

static OrtStatus* factory_create_stream(OrtEpFactory* f, const OrtMemoryDevice* m, const OrtKeyValuePairs* o,
                                        OrtSyncStreamImpl** out) {
  (void)f, (void)m, (void)o;
  *out = NULL;
  return NULL;
}

TF_EXPORT OrtStatus* ReleaseEpFactory(OrtEpFactory* factory);

static tf_factory* new_factory(const OrtApi* api, const char* name, tf_target target) {
  tf_factory* f = calloc(1, sizeof *f);
  if (!f) return NULL;
  f->api = api;
  f->ep_api = ORT_FN(api, SLOT_GetEpApi, GetEpApi_fn)();
  f->parallel_for = ORT_FN(api, SLOT_KernelContext_ParallelFor, KernelContext_ParallelFor_fn);
  f->name = name;
  f->target = target;
  f->base.ort_version_supported = TF_EP_API;
  f->base.GetName = factory_name;
  f->base.GetVendor = factory_vendor;
  f->base.GetSupportedDevices = factory_devices;
  f->base.CreateEp = factory_create_ep;
  f->base.ReleaseEp = factory_release_ep;
  f->base.GetVendorId = factory_vendor_id;
  f->base.GetVersion = factory_version;
  f->base.ValidateCompiledModelCompatibilityInfo = factory_validate;
  f->base.CreateAllocator = factory_create_allocator;
  f->base.ReleaseAllocator = factory_release_allocator;
  f->base.CreateDataTransfer = factory_create_data_transfer;
  f->base.IsStreamAware = factory_stream_aware;
  f->base.CreateSyncStreamForDevice = factory_create_stream;
#ifdef TF_WITH_CUDA
  if (target == TF_TARGET_CUDA && !tf_gpu_init(f)) {
    free(f);
    return NULL;
  }
#endif
  return f;
}

TF_EXPORT OrtStatus* CreateEpFactories(const char* registered_name, const OrtApiBase* base, const OrtLogger* logger,
                                       OrtEpFactory** factories, size_t max_factories, size_t* num_factories) {
  (void)registered_name, (void)logger;
  *num_factories = 0;
  const OrtApi* api = base->GetApi(TF_EP_API);
  if (!api) {
    const OrtApi* v1 = base->GetApi(1);
    if (!v1) return NULL;
    return tf_status(v1, ORT_FAIL,
                     "the plugin execution provider needs onnxruntime 1.23 or newer (C API %d); this onnxruntime is %s. "
                     "Upgrade onnxruntime, or export with --as custom-ops and use the custom-op library",
                     TF_EP_API, base->GetVersionString());
  }
  if (max_factories < 1) return tf_status(api, ORT_FAIL, "onnxruntime offered no room for a factory");
  static const struct {
    const char* name;
    tf_target target;
  } kinds[] = {
    {TF_EP_NAME, TF_TARGET_CPU},
#ifdef TF_WITH_CUDA
    {TF_CUDA_EP_NAME, TF_TARGET_CUDA},
#endif
  };
  size_t wanted = sizeof kinds / sizeof kinds[0];
  for (size_t i = 0; i < wanted && i < max_factories; i++) {
    tf_factory* f = new_factory(api, kinds[i].name, kinds[i].target);
    if (!f) {
      for (size_t j = 0; j < *num_factories; j++) ReleaseEpFactory(factories[j]);
      *num_factories = 0;
      return tf_status(api, ORT_FAIL, "out of memory");
    }
    factories[(*num_factories)++] = &f->base;
  }
  return NULL;
}

TF_EXPORT OrtStatus* ReleaseEpFactory(OrtEpFactory* factory) {
#ifdef TF_WITH_CUDA
  tf_gpu_free((tf_factory*)factory);
#endif
  free(factory);
  return NULL;
}
