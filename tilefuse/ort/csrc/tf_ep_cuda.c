/* The CUDA execution provider's device side: which device it serves, its memory, and the
 * copies between that memory and the host (onnxruntime >= 1.23 plugin API).
 *
 * Devices. GetSupportedDevices takes each NVIDIA GPU (vendor 0x10de) that onnxruntime
 * offers; the n-th becomes CUDA device n. onnxruntime finds GPUs on Linux through
 * /sys/class/drm/cardN, which exists only where the driver's DRM module is loaded; where
 * it offers no GPU but the CUDA driver sees one, the provider pairs CUDA device 0 with
 * the CPU hardware device instead: onnxruntime takes a plugin provider's memory from the
 * device memory info registered on its OrtEpDevice, not from the hardware device. (On
 * the project's H200 machine, onnxruntime 1.30 offered the GPU itself on 2026-11-29.)
 *
 * Memory. Each device has a device memory info (GPU, NVIDIA, DEFAULT memory);
 * onnxruntime asks CreateAllocator for its allocator, whose Alloc and Free are cuMemAlloc
 * and cuMemFree in the device's primary context. The data transfer copies host<->device
 * and device<->device with the synchronous cuMemcpy functions.
 *
 * Streams. The provider is stream aware: onnxruntime asks CreateSyncStreamForDevice for
 * its compute streams, each a non-blocking CUstream of the device's primary context (so
 * nothing else on the legacy default stream, torch's say, is ordered with a run), and
 * hands them back to the kernels (KernelContext_GetGPUComputeStream) and to the copies
 * (CopyTensors' streams). Ordering between streams and with the host is onnxruntime's, by
 * notifications (an event recorded on the producer, waited for by the consumer's stream or
 * by the host) and Flush (the stream waited for, as onnxruntime does at the end of a run
 * unless `disable_synchronize_execution_providers` is set). A copy onnxruntime gives no
 * stream (an initializer placed at session creation) waits for the whole context first.
 *
 * Without a driver (no libcuda.so.1) the library still loads and registers; creating a
 * session for this provider fails with an error status that names the problem.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tf_cuda.h"
#include "tf_ep.h"

#define TF_MAX_GPUS 8

struct tf_gpu {
  OrtDataTransferImpl transfer;
  tf_factory* factory;
  pthread_mutex_t lock;
  int n;                                     /* devices handed to onnxruntime */
  const OrtHardwareDevice* hw[TF_MAX_GPUS];  /* the hardware device of CUDA device i */
  OrtMemoryInfo* memory[TF_MAX_GPUS];        /* its device memory info */
  tf_CUcontext ctx[TF_MAX_GPUS];             /* its primary context, once retained */
};

/* A compute stream handed to onnxruntime, and the notifications made on it. */
typedef struct {
  OrtSyncStreamImpl base;
  tf_factory* factory;
  tf_CUcontext ctx;
  tf_CUstream stream;
} tf_gpu_stream;

typedef struct {
  OrtSyncNotificationImpl base;
  tf_gpu_stream* on;
  tf_CUevent event;
} tf_gpu_notification;

typedef struct {
  OrtAllocator base;
  tf_factory* factory;
  const OrtMemoryInfo* info;
  int ordinal;
} tf_gpu_allocator;

#define EP_FN(f, slot, type) ORT_FN((f)->ep_api, slot, type)

/* ---------------------------------------------------------------- contexts */

/* The primary context of CUDA device `ordinal`, retained once; NULL status on success. */
static OrtStatus* device_context(tf_factory* f, int ordinal, tf_CUcontext* out) {
  const char* why = tf_cuda_open();
  if (why) return tf_status(f->api, ORT_FAIL, "%s: %s", f->name, why);
  tf_gpu* g = f->gpu;
  OrtStatus* st = NULL;
  pthread_mutex_lock(&g->lock);
  if (!g->ctx[ordinal]) {
    tf_CUdevice dev;
    int count = 0;
    tf_CUresult r = tf_cu.cuDeviceGetCount(&count);
    if (!r && ordinal >= count)
      st = tf_status(f->api, ORT_FAIL, "%s: CUDA device %d asked for, the driver sees %d", f->name, ordinal, count);
    else if (r || (r = tf_cu.cuDeviceGet(&dev, ordinal)) || (r = tf_cu.cuDevicePrimaryCtxRetain(&g->ctx[ordinal], dev)))
      st = tf_status(f->api, ORT_FAIL, "%s: opening CUDA device %d failed: %s (%u)", f->name, ordinal,
                     tf_cuda_error_name(r), (unsigned)r);
  }
  *out = g->ctx[ordinal];
  pthread_mutex_unlock(&g->lock);
  return st;
}

static int is_our_memory(tf_factory* f, const OrtMemoryDevice* m) {
  return m && EP_FN(f, EPSLOT_MemoryDevice_GetDeviceType, MemoryDevice_GetEnum_fn)(m) == ORT_MEM_DEVICE_GPU &&
         EP_FN(f, EPSLOT_MemoryDevice_GetVendorId, MemoryDevice_GetId_fn)(m) == TF_NVIDIA_VENDOR_ID;
}

static int is_host_memory(tf_factory* f, const OrtMemoryDevice* m) {
  return m && (EP_FN(f, EPSLOT_MemoryDevice_GetDeviceType, MemoryDevice_GetEnum_fn)(m) == ORT_MEM_DEVICE_CPU ||
               EP_FN(f, EPSLOT_MemoryDevice_GetMemoryType, MemoryDevice_GetEnum_fn)(m) ==
                   ORT_DEVICE_MEMORY_HOST_ACCESSIBLE);
}

static int memory_ordinal(tf_factory* f, const OrtMemoryDevice* m) {
  uint32_t id = EP_FN(f, EPSLOT_MemoryDevice_GetDeviceId, MemoryDevice_GetId_fn)(m);
  return id < TF_MAX_GPUS ? (int)id : 0;
}

/* ---------------------------------------------------------------- devices */

/* Hand onnxruntime an OrtEpDevice for `hw` as CUDA device g->n, with its device memory. */
static OrtStatus* add_device(tf_factory* f, const OrtHardwareDevice* hw, OrtEpDevice** out) {
  tf_gpu* g = f->gpu;
  int ordinal = g->n;
  OrtStatus* st = NULL;
  if (!g->memory[ordinal])
    st = ORT_FN(f->api, SLOT_CreateMemoryInfo_V2, CreateMemoryInfo_V2_fn)(
        "TilefuseCuda", ORT_MEM_DEVICE_GPU, TF_NVIDIA_VENDOR_ID, ordinal, ORT_DEVICE_MEMORY_DEFAULT, 0,
        ORT_DEVICE_ALLOCATOR, &g->memory[ordinal]);
  OrtEpDevice* d = NULL;
  if (!st) st = EP_FN(f, EPSLOT_CreateEpDevice, CreateEpDevice_fn)(&f->base, hw, NULL, NULL, &d);
  if (!st) st = EP_FN(f, EPSLOT_EpDevice_AddAllocatorInfo, EpDevice_AddAllocatorInfo_fn)(d, g->memory[ordinal]);
  if (st) {
    if (d) EP_FN(f, EPSLOT_ReleaseEpDevice, ReleaseEpDevice_fn)(d);
    return st;
  }
  g->hw[g->n++] = hw;
  *out = d;
  return NULL;
}

static OrtStatus* gpu_devices(OrtEpFactory* this_ptr, const OrtHardwareDevice* const* devices, size_t n,
                              OrtEpDevice** ep_devices, size_t max_ep_devices, size_t* num_ep_devices) {
  tf_factory* f = (tf_factory*)this_ptr;
  HardwareDevice_Type_fn type = ORT_FN(f->api, SLOT_HardwareDevice_Type, HardwareDevice_Type_fn);
  HardwareDevice_Id_fn vendor = ORT_FN(f->api, SLOT_HardwareDevice_VendorId, HardwareDevice_Id_fn);
  *num_ep_devices = 0;
  f->gpu->n = 0;
  for (size_t i = 0; i < n && *num_ep_devices < max_ep_devices && f->gpu->n < TF_MAX_GPUS; i++) {
    if (type(devices[i]) != ORT_HW_GPU || vendor(devices[i]) != TF_NVIDIA_VENDOR_ID) continue;
    OrtStatus* st = add_device(f, devices[i], &ep_devices[*num_ep_devices]);
    if (st) return st;
    (*num_ep_devices)++;
  }
  if (*num_ep_devices || !max_ep_devices || tf_cuda_open()) return NULL;
  /* No NVIDIA GPU among onnxruntime's hardware devices, but the driver sees one. */
  int count = 0;
  if (tf_cu.cuDeviceGetCount(&count) || count < 1) return NULL;
  for (size_t i = 0; i < n; i++) {
    if (type(devices[i]) != ORT_HW_CPU) continue;
    OrtStatus* st = add_device(f, devices[i], &ep_devices[0]);
    if (st) return st;
    *num_ep_devices = 1;
    break;
  }
  return NULL;
}

OrtStatus* tf_gpu_session_context(tf_factory* f, const OrtHardwareDevice* const* devices, size_t n, void** ctx) {
  int ordinal = 0;
  for (int i = 0; n && i < f->gpu->n; i++)
    if (f->gpu->hw[i] == devices[0]) ordinal = i;
  return device_context(f, ordinal, (tf_CUcontext*)ctx);
}

/* ---------------------------------------------------------------- the allocator */

/* The context of an allocator's device; NULL without a driver or device (session creation
 * has reported why already: tf_gpu_session_context). */
static tf_CUcontext allocator_context(tf_gpu_allocator* a) {
  tf_CUcontext ctx = NULL;
  char ignored[16];
  tf_take_message(a->factory->api, device_context(a->factory, a->ordinal, &ctx), ignored, sizeof ignored);
  return ctx;
}

static void* alloc_device(OrtAllocator* this_ptr, size_t size) {
  tf_CUcontext ctx = allocator_context((tf_gpu_allocator*)this_ptr), popped;
  tf_CUdeviceptr p = 0;
  if (!ctx || tf_cu.cuCtxPushCurrent(ctx)) return NULL;
  if (tf_cu.cuMemAlloc(&p, size ? size : 1)) p = 0;
  tf_cu.cuCtxPopCurrent(&popped);
  return (void*)(uintptr_t)p;
}

static void free_device(OrtAllocator* this_ptr, void* p) {
  tf_CUcontext ctx = p ? allocator_context((tf_gpu_allocator*)this_ptr) : NULL, popped;
  if (!ctx || tf_cu.cuCtxPushCurrent(ctx)) return;
  tf_cu.cuMemFree((tf_CUdeviceptr)(uintptr_t)p);
  tf_cu.cuCtxPopCurrent(&popped);
}

static const OrtMemoryInfo* allocator_info(const OrtAllocator* this_ptr) {
  return ((const tf_gpu_allocator*)this_ptr)->info;
}

static OrtStatus* gpu_create_allocator(OrtEpFactory* this_ptr, const OrtMemoryInfo* info, const OrtKeyValuePairs* o,
                                       OrtAllocator** out) {
  (void)o;
  tf_factory* f = (tf_factory*)this_ptr;
  *out = NULL;
  const OrtMemoryDevice* m = info ? EP_FN(f, EPSLOT_MemoryInfo_GetMemoryDevice, MemoryInfo_GetMemoryDevice_fn)(info) : NULL;
  if (!is_our_memory(f, m))
    return tf_status(f->api, ORT_INVALID_ARGUMENT, "%s: asked for an allocator of memory that is not an NVIDIA GPU's",
                     f->name);
  /* The driver is not opened here: onnxruntime creates shared allocators when the library
   * is registered, and a machine without a driver must still register it (the CPU
   * provider lives in it too). The device is opened on first use. */
  int ordinal = memory_ordinal(f, m);
  tf_gpu_allocator* a = calloc(1, sizeof *a);
  if (!a) return tf_status(f->api, ORT_FAIL, "out of memory");
  a->base.version = 18; /* Alloc, Free, Info; Reserve NULL (onnxruntime then calls Alloc) */
  a->base.Alloc = alloc_device;
  a->base.Free = free_device;
  a->base.Info = allocator_info;
  a->info = f->gpu->memory[ordinal] ? f->gpu->memory[ordinal] : info;
  a->factory = f;
  a->ordinal = ordinal;
  *out = &a->base;
  return NULL;
}

static void gpu_release_allocator(OrtEpFactory* f, OrtAllocator* a) {
  (void)f;
  free(a);
}

/* ---------------------------------------------------------------- the data transfer */

static void transfer_release(OrtDataTransferImpl* t) {
  (void)t; /* lives as long as the factory */
}

static bool transfer_can_copy(const OrtDataTransferImpl* t, const OrtMemoryDevice* src, const OrtMemoryDevice* dst) {
  tf_factory* f = ((const tf_gpu*)t)->factory;
  int from_gpu = is_our_memory(f, src), to_gpu = is_our_memory(f, dst);
  return (from_gpu && (to_gpu || is_host_memory(f, dst))) || (to_gpu && is_host_memory(f, src));
}

static tf_gpu_stream* our_stream(tf_factory* f, const OrtSyncStream* stream);

/* Copy src to dst: on `stream` (ours, else NULL) when onnxruntime gives one, else
 * synchronously, once the device's earlier work on every stream is done. */
static OrtStatus* copy_one(tf_factory* f, const OrtValue* src, OrtValue* dst, tf_gpu_stream* stream) {
  const OrtApi* api = f->api;
  Value_GetMemoryDevice_fn device_of = EP_FN(f, EPSLOT_Value_GetMemoryDevice, Value_GetMemoryDevice_fn);
  const OrtMemoryDevice *ms = device_of(src), *md = device_of(dst);
  size_t bytes = 0, dst_bytes = 0;
  void *from = NULL, *to = NULL;
  OrtStatus* st = ORT_FN(api, SLOT_GetTensorSizeInBytes, GetTensorSizeInBytes_fn)(src, &bytes);
  if (!st) st = ORT_FN(api, SLOT_GetTensorSizeInBytes, GetTensorSizeInBytes_fn)(dst, &dst_bytes);
  if (!st) st = ORT_FN(api, SLOT_GetTensorMutableData, GetTensorMutableData_fn)((OrtValue*)src, &from);
  if (!st) st = ORT_FN(api, SLOT_GetTensorMutableData, GetTensorMutableData_fn)(dst, &to);
  if (st) return st;
  if (bytes != dst_bytes)
    return tf_status(api, ORT_INVALID_ARGUMENT, "%s: copy of %zu bytes into a tensor of %zu", f->name, bytes, dst_bytes);
  if (!bytes) return NULL;
  int from_gpu = is_our_memory(f, ms), to_gpu = is_our_memory(f, md);
  if (!from_gpu && !to_gpu) {
    memcpy(to, from, bytes);
    return NULL;
  }
  tf_CUcontext ctx, popped;
  st = device_context(f, memory_ordinal(f, from_gpu ? ms : md), &ctx);
  if (st) return st;
  tf_CUresult r = tf_cu.cuCtxPushCurrent(ctx);
  const char* what = "cuCtxPushCurrent";
  if (!r) {
    tf_CUdeviceptr d_from = (tf_CUdeviceptr)(uintptr_t)from, d_to = (tf_CUdeviceptr)(uintptr_t)to;
    tf_CUstream s = stream ? stream->stream : NULL;
    if (!s && (r = tf_cu.cuCtxSynchronize())) {
      what = "cuCtxSynchronize (work queued before the copy)";
    } else if (from_gpu && to_gpu) {
      r = s ? tf_cu.cuMemcpyDtoDAsync(d_to, d_from, bytes, s) : tf_cu.cuMemcpyDtoD(d_to, d_from, bytes);
      what = "cuMemcpyDtoD";
    } else if (from_gpu) { /* into pageable memory: returns once the copy is done */
      r = s ? tf_cu.cuMemcpyDtoHAsync(to, d_from, bytes, s) : tf_cu.cuMemcpyDtoH(to, d_from, bytes);
      what = "cuMemcpyDtoH";
    } else { /* from pageable memory: staged before it returns, so `from` may change after */
      r = s ? tf_cu.cuMemcpyHtoDAsync(d_to, from, bytes, s) : tf_cu.cuMemcpyHtoD(d_to, from, bytes);
      what = "cuMemcpyHtoD";
    }
    tf_cu.cuCtxPopCurrent(&popped);
  }
  /* A kernel that failed earlier on the stream reports here, at the next copy. */
  return r ? tf_status(api, ORT_FAIL, "%s: %s of %zu bytes failed: %s (%u)", f->name, what, bytes,
                       tf_cuda_error_name(r), (unsigned)r)
           : NULL;
}

static OrtStatus* transfer_copy(OrtDataTransferImpl* t, const OrtValue** src, OrtValue** dst, OrtSyncStream** streams,
                                size_t n) {
  tf_factory* f = ((tf_gpu*)t)->factory;
  for (size_t i = 0; i < n; i++) {
    OrtStatus* st = copy_one(f, src[i], dst[i], streams ? our_stream(f, streams[i]) : NULL);
    if (st) return st;
  }
  return NULL;
}

static OrtStatus* gpu_create_data_transfer(OrtEpFactory* this_ptr, OrtDataTransferImpl** out) {
  *out = &((tf_factory*)this_ptr)->gpu->transfer;
  return NULL;
}

/* ---------------------------------------------------------------- running */

/* On the compute stream onnxruntime hands the node (one of ours), in the session's context. */
OrtStatus* tf_gpu_run(const OrtApi* api, tf_kernel* k, OrtKernelContext* kctx, void* ctx) {
  void* stream = NULL;
  OrtStatus* st = ORT_FN(api, SLOT_KernelContext_GetGPUComputeStream, KernelContext_GetGPUComputeStream_fn)(kctx, &stream);
  if (st) return st;
  return tf_cuda_launch_in(api, k, kctx, (tf_CUcontext)ctx, (tf_CUstream)stream);
}

/* ---------------------------------------------------------------- streams */

static OrtStatus* cu_fail(tf_factory* f, tf_CUresult r, const char* what) {
  return tf_status(f->api, ORT_FAIL, "%s: %s failed: %s (%u)", f->name, what, tf_cuda_error_name(r), (unsigned)r);
}

static void stream_release(OrtSyncStreamImpl* this_ptr) {
  tf_gpu_stream* s = (tf_gpu_stream*)this_ptr;
  tf_CUcontext popped;
  if (!tf_cu.cuCtxPushCurrent(s->ctx)) {
    tf_cu.cuStreamDestroy(s->stream); /* queued work still completes */
    tf_cu.cuCtxPopCurrent(&popped);
  }
  free(s);
}

static void* stream_handle(OrtSyncStreamImpl* this_ptr) { return ((tf_gpu_stream*)this_ptr)->stream; }

/* The stream waited for: onnxruntime's way to end a run that synchronises its providers. */
static OrtStatus* stream_flush(OrtSyncStreamImpl* this_ptr) {
  tf_gpu_stream* s = (tf_gpu_stream*)this_ptr;
  tf_CUresult r = tf_cu.cuStreamSynchronize(s->stream);
  return r ? cu_fail(s->factory, r, "cuStreamSynchronize (a kernel or copy of the run)") : NULL;
}

static OrtStatus* stream_run_end(OrtSyncStreamImpl* this_ptr) {
  (void)this_ptr; /* nothing is held per run */
  return NULL;
}

/* The stream behind an OrtSyncStream, when it is one of this provider's. */
static tf_gpu_stream* our_stream(tf_factory* f, const OrtSyncStream* stream) {
  const OrtSyncStreamImpl* impl = stream ? EP_FN(f, EPSLOT_SyncStream_GetImpl, SyncStream_GetImpl_fn)(stream) : NULL;
  return impl && impl->Release == stream_release ? (tf_gpu_stream*)impl : NULL;
}

static void notification_release(OrtSyncNotificationImpl* this_ptr) {
  tf_gpu_notification* n = (tf_gpu_notification*)this_ptr;
  tf_CUcontext popped;
  if (!tf_cu.cuCtxPushCurrent(n->on->ctx)) {
    tf_cu.cuEventDestroy(n->event);
    tf_cu.cuCtxPopCurrent(&popped);
  }
  free(n);
}

/* Enter the stream's context; pop_status leaves it with the result of the call between. */
static tf_CUresult push(const tf_gpu_stream* s) { return tf_cu.cuCtxPushCurrent(s->ctx); }

static OrtStatus* pop_status(const tf_gpu_stream* s, tf_CUresult r, const char* what) {
  tf_CUcontext popped;
  tf_cu.cuCtxPopCurrent(&popped);
  return r ? cu_fail(s->factory, r, what) : NULL;
}

static OrtStatus* notification_activate(OrtSyncNotificationImpl* this_ptr) {
  tf_gpu_notification* n = (tf_gpu_notification*)this_ptr;
  tf_CUresult r = push(n->on);
  if (r) return cu_fail(n->on->factory, r, "cuCtxPushCurrent");
  return pop_status(n->on, tf_cu.cuEventRecord(n->event, n->on->stream), "cuEventRecord");
}

static OrtStatus* notification_wait_on_host(OrtSyncNotificationImpl* this_ptr) {
  tf_gpu_notification* n = (tf_gpu_notification*)this_ptr;
  tf_CUresult r = push(n->on);
  if (r) return cu_fail(n->on->factory, r, "cuCtxPushCurrent");
  return pop_status(n->on, tf_cu.cuEventSynchronize(n->event), "cuEventSynchronize (a kernel or copy of the run)");
}

/* A consumer stream of this provider waits on the device; any other, on the host. */
static OrtStatus* notification_wait_on_device(OrtSyncNotificationImpl* this_ptr, OrtSyncStream* consumer) {
  tf_gpu_notification* n = (tf_gpu_notification*)this_ptr;
  tf_gpu_stream* c = our_stream(n->on->factory, consumer);
  if (!c) return notification_wait_on_host(this_ptr);
  tf_CUresult r = push(n->on);
  if (r) return cu_fail(n->on->factory, r, "cuCtxPushCurrent");
  return pop_status(n->on, tf_cu.cuStreamWaitEvent(c->stream, n->event, 0), "cuStreamWaitEvent");
}

static OrtStatus* stream_notification(OrtSyncStreamImpl* this_ptr, OrtSyncNotificationImpl** out) {
  tf_gpu_stream* s = (tf_gpu_stream*)this_ptr;
  *out = NULL;
  tf_gpu_notification* n = calloc(1, sizeof *n);
  if (!n) return tf_status(s->factory->api, ORT_FAIL, "out of memory");
  tf_CUresult r = push(s);
  OrtStatus* st = r ? cu_fail(s->factory, r, "cuCtxPushCurrent")
                    : pop_status(s, tf_cu.cuEventCreate(&n->event, TF_CU_EVENT_DISABLE_TIMING), "cuEventCreate");
  if (st) {
    free(n);
    return st;
  }
  n->base.ort_version_supported = TF_EP_API;
  n->base.Release = notification_release;
  n->base.Activate = notification_activate;
  n->base.WaitOnDevice = notification_wait_on_device;
  n->base.WaitOnHost = notification_wait_on_host;
  n->on = s;
  *out = &n->base;
  return NULL;
}

static bool gpu_stream_aware(const OrtEpFactory* this_ptr) {
  (void)this_ptr;
  return true;
}

static OrtStatus* gpu_create_stream(OrtEpFactory* this_ptr, const OrtMemoryDevice* m, const OrtKeyValuePairs* o,
                                    OrtSyncStreamImpl** out) {
  (void)o;
  tf_factory* f = (tf_factory*)this_ptr;
  *out = NULL;
  if (!is_our_memory(f, m)) return NULL; /* not this provider's device: no stream of ours */
  tf_gpu_stream* s = calloc(1, sizeof *s);
  if (!s) return tf_status(f->api, ORT_FAIL, "out of memory");
  s->factory = f;
  OrtStatus* st = device_context(f, memory_ordinal(f, m), &s->ctx);
  tf_CUresult r = st ? 0 : push(s);
  if (!st) st = r ? cu_fail(f, r, "cuCtxPushCurrent")
                  : pop_status(s, tf_cu.cuStreamCreate(&s->stream, TF_CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  if (st) {
    free(s);
    return st;
  }
  s->base.ort_version_supported = TF_EP_API;
  s->base.Release = stream_release;
  s->base.GetHandle = stream_handle;
  s->base.CreateNotification = stream_notification;
  s->base.Flush = stream_flush;
  s->base.OnSessionRunEnd = stream_run_end;
  *out = &s->base;
  return NULL;
}

/* ---------------------------------------------------------------- the factory */

int tf_gpu_init(tf_factory* f) {
  tf_gpu* g = calloc(1, sizeof *g);
  if (!g) return 0;
  g->factory = f;
  pthread_mutex_init(&g->lock, NULL);
  g->transfer.ort_version_supported = TF_EP_API;
  g->transfer.Release = transfer_release;
  g->transfer.CanCopy = transfer_can_copy;
  g->transfer.CopyTensors = transfer_copy;
  f->gpu = g;
  f->base.GetSupportedDevices = gpu_devices;
  f->base.CreateAllocator = gpu_create_allocator;
  f->base.ReleaseAllocator = gpu_release_allocator;
  f->base.CreateDataTransfer = gpu_create_data_transfer;
  f->base.IsStreamAware = gpu_stream_aware;
  f->base.CreateSyncStreamForDevice = gpu_create_stream;
  return 1;
}

void tf_gpu_free(tf_factory* f) {
  tf_gpu* g = f->gpu;
  if (!g) return;
  for (int i = 0; i < TF_MAX_GPUS; i++)
    if (g->memory[i]) ORT_FN(f->api, SLOT_ReleaseMemoryInfo, ReleaseMemoryInfo_fn)(g->memory[i]);
  /* Primary contexts stay retained: memory onnxruntime still holds may live in them. */
  pthread_mutex_destroy(&g->lock);
  free(g);
  f->gpu = NULL;
}
