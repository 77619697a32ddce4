/* A stand-in for libcuda.so.1, for testing the CUDA execution provider on a machine without
 * a GPU: "device" memory is host memory, copies are memcpy, and a "cubin" is a tilefuse CPU
 * kernel library (void SYMBOL(void** argv)) that cuLaunchKernel calls with the launch's
 * pointer arguments, grid x being their count. Work runs at once, so streams and events
 * only mark what was asked. Each call is counted in the file named by $TF_FAKE_CUDA_LOG
 * ("alloc", "free", "htod", "dtoh", "dtod", "launch"; "async" for each copy on a stream,
 * "legacy-launch" for a launch on the legacy default stream, "stream" and "event" for each
 * created, "stream-freed" and "event-freed" for each destroyed), one word a line.
 * Built by tests/ort/test_cuda_ep.py; only the symbols tilefuse loads. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef unsigned int CUresult;
typedef unsigned long long CUdeviceptr;
static int g_ctx; /* the one context: its address */

static void note(const char* what) {
  const char* path = getenv("TF_FAKE_CUDA_LOG");
  FILE* f = path ? fopen(path, "a") : NULL;
  if (f) fprintf(f, "%s\n", what), fclose(f);
}

CUresult cuInit(unsigned flags) { (void)flags; return 0; }
CUresult cuGetErrorName(CUresult r, const char** name) { *name = r ? "CUDA_ERROR_FAKE" : "CUDA_SUCCESS"; return 0; }
CUresult cuDeviceGetCount(int* n) { *n = 1; return 0; }
CUresult cuDeviceGet(int* dev, int ordinal) { *dev = ordinal; return ordinal ? 101 : 0; }
CUresult cuDevicePrimaryCtxRetain(void** ctx, int dev) { (void)dev; *ctx = &g_ctx; return 0; }
CUresult cuCtxSynchronize(void) { return 0; }
CUresult cuCtxPushCurrent_v2(void* ctx) { return ctx == &g_ctx ? 0 : 201; }
CUresult cuCtxPopCurrent_v2(void** ctx) { if (ctx) *ctx = &g_ctx; return 0; }
CUresult cuStreamGetCtx(void* stream, void** ctx) { (void)stream; *ctx = &g_ctx; return 0; }
CUresult cuStreamSynchronize(void* stream) { (void)stream; return 0; }
CUresult cuMemAlloc_v2(CUdeviceptr* p, size_t n) { note("alloc"); *p = (CUdeviceptr)(size_t)malloc(n); return *p ? 0 : 2; }
CUresult cuMemFree_v2(CUdeviceptr p) { note("free"); free((void*)(size_t)p); return 0; }
CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void* s, size_t n) { note("htod"); memcpy((void*)(size_t)d, s, n); return 0; }
CUresult cuMemcpyDtoH_v2(void* d, CUdeviceptr s, size_t n) { note("dtoh"); memcpy(d, (void*)(size_t)s, n); return 0; }
CUresult cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr s, size_t n) { note("dtod"); memcpy((void*)(size_t)d, (void*)(size_t)s, n); return 0; }

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void* s, size_t n, void* stream) {
  note("async");
  return stream ? cuMemcpyHtoD_v2(d, s, n) : 400;
}
CUresult cuMemcpyDtoHAsync_v2(void* d, CUdeviceptr s, size_t n, void* stream) {
  note("async");
  return stream ? cuMemcpyDtoH_v2(d, s, n) : 400;
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, void* stream) {
  note("async");
  return stream ? cuMemcpyDtoD_v2(d, s, n) : 400;
}
CUresult cuStreamCreate(void** stream, unsigned flags) { (void)flags; note("stream"); *stream = malloc(1); return 0; }
CUresult cuStreamDestroy_v2(void* stream) { note("stream-freed"); free(stream); return 0; }
CUresult cuStreamWaitEvent(void* stream, void* event, unsigned flags) { (void)flags; return stream && event ? 0 : 400; }
CUresult cuEventCreate(void** event, unsigned flags) { (void)flags; note("event"); *event = malloc(1); return 0; }
CUresult cuEventRecord(void* event, void* stream) { (void)stream; return event ? 0 : 400; }
CUresult cuEventSynchronize(void* event) { return event ? 0 : 400; }
CUresult cuEventDestroy_v2(void* event) { note("event-freed"); free(event); return 0; }

/* A module is the CPU library, written to a memory file and opened from there. */
CUresult cuModuleLoadData(void** module, const void* image) {
  const unsigned char* elf = image;
  if (memcmp(elf, "\x7f" "ELF", 4)) return 200;
  /* The section header table ends an ELF file built by the toolchain: its size bounds the image. */
  unsigned long long shoff = *(const unsigned long long*)(elf + 0x28);
  unsigned short shentsize = *(const unsigned short*)(elf + 0x3a), shnum = *(const unsigned short*)(elf + 0x3c);
  size_t size = shoff + (size_t)shentsize * shnum;
  int fd = memfd_create("fake-cubin", 0);
  if (fd < 0 || write(fd, image, size) != (ssize_t)size) return 200;
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  *module = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  return *module ? 0 : 200;
}

CUresult cuModuleGetFunction(void** fn, void* module, const char* name) { *fn = dlsym(module, name); return *fn ? 0 : 500; }
CUresult cuFuncSetAttribute(void* fn, int attr, int value) { (void)fn, (void)attr, (void)value; return 0; }

CUresult cuLaunchKernel(void* fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned smem, void* stream, void** params, void** extra) {
  (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)smem, (void)extra;
  void* argv[256];
  for (unsigned i = 0; i < gx && i < 256; i++) argv[i] = *(void**)params[i];
  note("launch");
  if (!stream) note("legacy-launch");
  ((void (*)(void**))fn)(argv);
  return 0;
}

CUresult cuTensorMapEncodeTiled(void* map, unsigned dtype, unsigned rank, void* address, const void* dims,
                                const void* strides, const void* box, const void* elem, unsigned interleave,
                                unsigned swizzle, unsigned l2, unsigned oob) {
  (void)map, (void)dtype, (void)rank, (void)address, (void)dims, (void)strides, (void)box, (void)elem;
  (void)interleave, (void)swizzle, (void)l2, (void)oob;
  return 1; /* the fake has no TMA */
}
