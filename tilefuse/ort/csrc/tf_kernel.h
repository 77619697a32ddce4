/* One tilefuse kernel as onnxruntime runs it: loaded from the descriptor that
 * `tilefuse export-ort` writes beside the model, called on a kernel context.
 *
 * A descriptor (kernels/NAME.tfk) is a few lines of text:
 *
 *   tilefuse-kernel 1
 *   target cpu                        (or cuda)
 *   name k3_add_mul_1a2b3c
 *   library k3_add_mul_1a2b3c.so      (relative to the descriptor's folder; a .cubin for cuda)
 *   symbol k3_add_mul_1a2b3c
 *   input 1 2 2 16                    (element type, rank, dims: one line per input, in order)
 *   output 1 3 2 16 64
 *   status 7 1 2                      (a kernel that checks indices: its status word, int64[2])
 *   check 100 input 'ids' (...)       (per check site, in order: its range [-100, 100), what it checks)
 *   requires avx avx2 fma ...         (cpu: extensions the kernel may use, as /proc/cpuinfo names them;
 *                                      a machine that lacks one the compiler can test refuses the node)
 *
 * and, for cuda, the launch recorded at compile time (see tf_cuda.c):
 *
 *   grid 4 1 1
 *   block 128 1 1
 *   smem 0
 *   arg pointer 0                     (kernel argument: the data pointer of param 0)
 *   arg tensormap 1 ...               (a TMA descriptor over param 1)
 *
 * The CPU kernel ABI is that of tilefuse.codegen.cpu: void SYMBOL(void** argv), argv
 * holding the data pointers of the inputs then the outputs, all dense and row-major, with
 * the dtypes and shapes fixed when the kernel was compiled, then, for a kernel that checks
 * indices read at run time, its status word: zero before the call, and after it word 0 is
 * the site + 1 of an index found outside its range (the kernel read position 0 instead),
 * word 1 that index. The node then fails with the site's message.
 *
 * A CPU kernel with a parallel loop also exports tf_threads_host (codegen/cpu/threads.py):
 * around each call, from the calling thread, the kernel's parallel regions are handed to
 * onnxruntime's intra-op pool through KernelContext_ParallelFor, so the kernel runs with
 * the session's intra_op_num_threads and starts no thread of its own. A kernel built
 * before that hook (or an onnxruntime without the function) runs its regions on
 * tilefuse's pool, as before.
 */
#ifndef TILEFUSE_ORT_KERNEL_H
#define TILEFUSE_ORT_KERNEL_H

#include "ort_abi.h"

#define TF_MAX_RANK 16
#define TF_MAX_ARGS 256
#define TF_ERR_LEN 1024

typedef enum { TF_TARGET_CPU = 0, TF_TARGET_CUDA = 1 } tf_target;

typedef struct {
  int elem; /* ONNX element type */
  int rank;
  int64_t dims[TF_MAX_RANK];
} tf_spec;

typedef struct tf_cuda tf_cuda; /* launch data and loaded module of a cuda kernel (tf_cuda.c) */

typedef struct {
  int64_t extent; /* valid indices lie in [-extent, extent) */
  char what[512]; /* what the check checks, for the message */
} tf_site;

typedef struct {
  tf_target target;
  char name[128];
  char node[256];
  char path[4096];     /* the descriptor, for messages */
  char library[8192];  /* the .so or .cubin */
  char symbol[256];
  char sha256[65];     /* of the library's bytes, as exported: what is loaded must have it */
  void* lib;
  void (*fn)(void**);
  /* the kernel library's tf_threads_host, NULL where it has none: sets (NULL run: clears)
   * the calling thread's host of parallel regions */
  void (*set_host)(void (*run)(void* host, void (*share)(void*, size_t), size_t n, void* arg), void* host);
  tf_cuda* cuda;
  int n_in, n_out;
  tf_spec in[TF_MAX_ARGS];
  tf_spec out[TF_MAX_ARGS];
  int checked; /* takes a status word after its outputs */
  int n_sites;
  tf_site* sites;
  /* Where each kernel argument sits among the node's inputs and outputs. The identity for
   * a custom op; a fused node of the execution provider lists its inputs once each, in
   * an order of onnxruntime's choosing. */
  int in_index[TF_MAX_ARGS];
  int out_index[TF_MAX_ARGS];
} tf_kernel;

#define TF_MAX_KERNEL_BYTES ((size_t)1 << 30) /* a kernel file above this is not one */

/* The lowercase hex SHA-256 of `n` bytes (tf_sha256.c). */
void tf_sha256_hex(const unsigned char* data, size_t n, char hex[65]);
/* `path`'s bytes, read once, if their SHA-256 is `sha256` (malloc'd into *out); 0 with a
 * message in `err` if the file cannot be read or differs. */
int tf_read_verified(const char* path, const char* sha256, unsigned char** out, size_t* size, char* err,
                     size_t errlen);

/* Load the descriptor `rel` (relative to `base_dir` unless absolute) and its library,
 * which must be for `target`. Returns NULL with a message in `err` on failure. */
tf_kernel* tf_kernel_load(const char* base_dir, const char* rel, const char* node, tf_target target, char* err,
                          size_t errlen);
void tf_kernel_free(tf_kernel* k);

/* Check the context's inputs against the kernel's, allocate the outputs, and put the
 * data pointers of inputs then outputs into argv (2 * TF_MAX_ARGS entries). */
OrtStatus* tf_kernel_bind(const OrtApi* api, const tf_kernel* k, OrtKernelContext* ctx, void** argv);

/* bind, then call the CPU kernel; its parallel regions run on the context's intra-op pool
 * through `parallel_for` (NULL, or a kernel without the hook: on tilefuse's pool). */
OrtStatus* tf_kernel_run(const OrtApi* api, const tf_kernel* k, OrtKernelContext* ctx,
                         KernelContext_ParallelFor_fn parallel_for);

/* NULL for a clear status word, else the error of the index it reports. */
OrtStatus* tf_index_error(const OrtApi* api, const tf_kernel* k, const int64_t status[2]);

/* An ORT status carrying "tilefuse: <message>". */
OrtStatus* tf_status(const OrtApi* api, int code, const char* fmt, ...) __attribute__((format(printf, 3, 4)));

/* The message of a status (and release it) into buf; "" for NULL. */
void tf_take_message(const OrtApi* api, OrtStatus* st, char* buf, size_t len);

#ifdef TF_WITH_CUDA
/* Read one cuda-only descriptor line ("grid", "block", "smem", "arg"); 0 if malformed. */
int tf_cuda_parse_line(tf_kernel* k, const char* key, char* rest);
/* Check the cubin is readable; 0 with a message in err if not. */
int tf_cuda_prepare(tf_kernel* k, char* err, size_t errlen);
/* bind, then launch on the context's GPU compute stream. */
OrtStatus* tf_cuda_run(const OrtApi* api, tf_kernel* k, OrtKernelContext* ctx);
void tf_cuda_free(tf_kernel* k);
#endif

#endif
