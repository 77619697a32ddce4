/* One tilefuse kernel as onnxruntime runs it: loaded from the descriptor that
 * `tilefuse export-ort` writes beside the model, called on a kernel context.
 *
 * A descriptor (kernels/NAME.tfk) is a few lines of text:
 *
 *   tilefuse-kernel 1
 *   target cpu
 *   name k3_add_mul_1a2b3c
 *   library k3_add_mul_1a2b3c.so      (relative to the descriptor's folder)
 *   symbol k3_add_mul_1a2b3c
 *   input 1 2 2 16                    (element type, rank, dims: one line per input, in order)
 *   output 1 3 2 16 64
 *
 * The kernel ABI is the CPU one of tilefuse.codegen.cpu: void SYMBOL(void** argv), argv
 * holding the data pointers of the inputs then the outputs, all dense and row-major, with
 * the dtypes and shapes fixed when the kernel was compiled.
 */
#ifndef TILEFUSE_ORT_KERNEL_H
#define TILEFUSE_ORT_KERNEL_H

#include "ort_abi.h"

#define TF_MAX_RANK 16
#define TF_MAX_ARGS 256
#define TF_ERR_LEN 1024

typedef struct {
  int elem;  /* ONNX element type */
  int rank;
  int64_t dims[TF_MAX_RANK];
} tf_spec;

typedef struct {
  char name[128];
  char node[256];
  char path[4096];  /* the descriptor, for messages */
  void* lib;
  void (*fn)(void**);
  int n_in, n_out;
  tf_spec in[TF_MAX_ARGS];
  tf_spec out[TF_MAX_ARGS];
  /* Where each kernel argument sits among the node's inputs and outputs. The identity for
   * a custom op; a fused node of the execution provider lists its inputs once each, in
   * an order of onnxruntime's choosing. */
  int in_index[TF_MAX_ARGS];
  int out_index[TF_MAX_ARGS];
} tf_kernel;

/* Load the descriptor `rel` (relative to `base_dir` unless absolute) and its library.
 * Returns NULL with a message in `err` on failure. */
tf_kernel* tf_kernel_load(const char* base_dir, const char* rel, const char* node, char* err, size_t errlen);
void tf_kernel_free(tf_kernel* k);

/* Check the context's inputs against the kernel's, allocate the outputs, call the kernel. */
OrtStatus* tf_kernel_run(const OrtApi* api, const tf_kernel* k, OrtKernelContext* ctx);

/* An ORT status carrying "tilefuse: <message>". */
OrtStatus* tf_status(const OrtApi* api, int code, const char* fmt, ...) __attribute__((format(printf, 3, 4)));

/* The message of a status (and release it) into buf; "" for NULL. */
void tf_take_message(const OrtApi* api, OrtStatus* st, char* buf, size_t len);

#endif
