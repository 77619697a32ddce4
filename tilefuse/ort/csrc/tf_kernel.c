/* Loading and calling tilefuse kernels inside onnxruntime (see tf_kernel.h). */
#define _GNU_SOURCE
#include "tf_kernel.h"

#include <dlfcn.h>
#include <link.h>
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

OrtStatus* tf_status(const OrtApi* api, int code, const char* fmt, ...) {
  char msg[TF_ERR_LEN];
  int n = snprintf(msg, sizeof msg, "tilefuse: ");
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg + n, sizeof msg - n, fmt, ap);
  va_end(ap);
  return ORT_FN(api, SLOT_CreateStatus, CreateStatus_fn)(code, msg);
}

void tf_take_message(const OrtApi* api, OrtStatus* st, char* buf, size_t len) {
  if (!st) {
    buf[0] = 0;
    return;
  }
  snprintf(buf, len, "%s", ORT_FN(api, SLOT_GetErrorMessage, GetErrorMessage_fn)(st));
  ORT_FN(api, SLOT_ReleaseStatus, ReleaseStatus_fn)(st);
}

static const char* shape_str(const int64_t* dims, int rank, char* buf, size_t len) {
  size_t n = (size_t)snprintf(buf, len, "[");
  for (int i = 0; i < rank && n < len; i++) n += (size_t)snprintf(buf + n, len - n, i ? ",%lld" : "%lld", (long long)dims[i]);
  if (n < len) snprintf(buf + n, len - n, "]");
  return buf;
}

/* A path inside the descriptor's folder: relative, without "..". */
static int safe_relative(const char* p) {
  if (!*p || p[0] == '/') return 0;
  for (const char* s = p; *s; s = strchr(s, '/') ? strchr(s, '/') + 1 : s + strlen(s))
    if (strncmp(s, "..", 2) == 0 && (s[2] == '/' || s[2] == 0)) return 0;
  return 1;
}

/* Whether this CPU has the extension /proc/cpuinfo calls `name` (1 where it cannot tell:
 * the compiler's feature test knows only some names; the rest come with those on real CPUs). */
static int cpu_has(const char* name) {
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
  __builtin_cpu_init();
#define TF_EXT(proc, gcc) if (!strcmp(name, proc)) return __builtin_cpu_supports(gcc) != 0;
  TF_EXT("pni", "sse3") TF_EXT("ssse3", "ssse3") TF_EXT("sse4_1", "sse4.1") TF_EXT("sse4_2", "sse4.2")
  TF_EXT("popcnt", "popcnt") TF_EXT("avx", "avx") TF_EXT("avx2", "avx2") TF_EXT("fma", "fma")
  TF_EXT("bmi1", "bmi") TF_EXT("bmi2", "bmi2") TF_EXT("aes", "aes") TF_EXT("pclmulqdq", "pclmul")
  TF_EXT("avx512f", "avx512f") TF_EXT("avx512bw", "avx512bw") TF_EXT("avx512cd", "avx512cd")
  TF_EXT("avx512dq", "avx512dq") TF_EXT("avx512vl", "avx512vl") TF_EXT("avx512_vnni", "avx512vnni")
  TF_EXT("avx512vbmi", "avx512vbmi") TF_EXT("avx512_vbmi2", "avx512vbmi2") TF_EXT("avx512ifma", "avx512ifma")
  TF_EXT("avx512_bitalg", "avx512bitalg") TF_EXT("avx512_vpopcntdq", "avx512vpopcntdq") TF_EXT("gfni", "gfni")
  TF_EXT("vpclmulqdq", "vpclmulqdq") TF_EXT("fma4", "fma4") TF_EXT("xop", "xop") TF_EXT("sse4a", "sse4a")
#undef TF_EXT
#endif
  (void)name;
  return 1;
}

/* the names in the space-separated list `names` this CPU lacks, appended to `out` */
static void cpu_lacks(const char* names, char* out, size_t outlen) {
  char name[64];
  for (const char* s = names; *s;) {
    size_t n = strcspn(s, " ");
    if (n && n < sizeof name) {
      memcpy(name, s, n);
      name[n] = 0;
      if (!cpu_has(name)) {
        size_t used = strlen(out);
        snprintf(out + used, outlen - used, "%s%s", used ? " " : "", name);
      }
    }
    s += n;
    while (*s == ' ') s++;
  }
}

static int is_sha256(const char* s) {
  int n = 0;
  for (; s[n]; n++)
    if (!((s[n] >= '0' && s[n] <= '9') || (s[n] >= 'a' && s[n] <= 'f'))) return 0;
  return n == 64;
}

/* dlopen the verified bytes of a library: written to a file of a private directory (0700)
 * that is removed as soon as it is loaded, so what runs is what was checked, whatever
 * happens to the export's file meanwhile. A fresh directory per load: the loader never
 * mistakes it for a library loaded before. TMPDIR first, then /tmp. */
static void* dlopen_private(const unsigned char* data, size_t n, const char* sha256, char* err, size_t errlen) {
  const char* bases[] = {getenv("TMPDIR"), "/tmp"};
  err[0] = 0;
  for (size_t b = 0; b < sizeof bases / sizeof *bases; b++) {
    if (!bases[b] || !*bases[b]) continue;
    char dir[4096], path[4200];
    snprintf(dir, sizeof dir, "%s/tilefuse-ort-XXXXXX", bases[b]);
    if (!mkdtemp(dir)) {
      snprintf(err, errlen, "cannot make a directory in %s: %s", bases[b], strerror(errno));
      continue;
    }
    snprintf(path, sizeof path, "%s/%s.so", dir, sha256);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0700);
    size_t done = 0;
    while (fd >= 0 && done < n) {
      ssize_t w = write(fd, data + done, n - done);
      if (w <= 0) break;
      done += (size_t)w;
    }
    if (fd >= 0) close(fd);
    void* lib = done == n && fd >= 0 ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : NULL;
    if (!lib) snprintf(err, errlen, "%s", fd < 0 || done != n ? strerror(errno) : dlerror());
    unlink(path);
    rmdir(dir);
    if (lib) return lib;
  }
  return NULL;
}

static int parse_spec(char* rest, tf_spec* spec) {
  char* end;
  spec->elem = (int)strtol(rest, &end, 10);
  if (end == rest) return 0;
  rest = end;
  spec->rank = (int)strtol(rest, &end, 10);
  if (end == rest || spec->rank < 0 || spec->rank > TF_MAX_RANK) return 0;
  for (int i = 0; i < spec->rank; i++) {
    rest = end;
    spec->dims[i] = strtoll(rest, &end, 10);
    if (end == rest || spec->dims[i] < 0) return 0;
  }
  return 1;
}

/* "status 7 1 2": the status word, int64[2] (ONNX element type 7). */
static int parse_status(char* rest, tf_kernel* k) {
  tf_spec spec;
  if (!parse_spec(rest, &spec) || spec.elem != 7 || spec.rank != 1 || spec.dims[0] != 2) return 0;
  return k->checked = 1;
}

/* "check EXTENT WHAT...": one index check site. */
static int parse_check(char* rest, tf_kernel* k) {
  char* end;
  long long extent = strtoll(rest, &end, 10);
  if (end == rest || extent < 1 || *end != ' ') return 0;
  tf_site* grown = realloc(k->sites, (size_t)(k->n_sites + 1) * sizeof *grown);
  if (!grown) return 0;
  k->sites = grown;
  grown[k->n_sites].extent = extent;
  snprintf(grown[k->n_sites].what, sizeof grown[k->n_sites].what, "%s", end + 1);
  k->n_sites++;
  return 1;
}

static tf_kernel* fail(tf_kernel* k, char* err, size_t errlen, const char* fmt, ...) __attribute__((format(printf, 4, 5)));
static tf_kernel* fail(tf_kernel* k, char* err, size_t errlen, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  tf_kernel_free(k);
  return NULL;
}

static const char* target_name(tf_target t) { return t == TF_TARGET_CUDA ? "cuda" : "cpu"; }

/* A symbol of the form the code generators give a kernel's entry: a stem of a letter and
 * up to 63 letters, digits or '_', then '_' and 10 lowercase hex digits (the content hash),
 * then `suffix` ("" on the CPU, "_kernel" for CUDA). Anything else (abort, exit, free, the
 * step driver) is never called, whatever the descriptor says. */
static int generated_entry(const char* s, const char* suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  if (n < m || strcmp(s + n - m, suffix) != 0) return 0;
  n -= m;
  if (n < 12 || n > 75 || s[n - 11] != '_') return 0;
  for (size_t i = n - 10; i < n; i++)
    if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
  if (!((s[0] >= 'A' && s[0] <= 'Z') || (s[0] >= 'a' && s[0] <= 'z'))) return 0;
  for (size_t i = 1; i < n - 11; i++)
    if (!((s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_'))
      return 0;
  return 1;
}

/* Whether `fn` is defined by the library `lib` itself, not by one it depends on (libc). */
static int defined_by(void* lib, void* fn) {
  struct link_map *own = NULL, *owner = NULL;
  Dl_info info;
  if (dlinfo(lib, RTLD_DI_LINKMAP, &own) != 0) return 0;
  if (!dladdr1(fn, &info, (void**)&owner, RTLD_DL_LINKMAP)) return 0;
  return own == owner;
}

tf_kernel* tf_kernel_load(const char* base_dir, const char* rel, const char* node, tf_target target, char* err,
                          size_t errlen) {
  tf_kernel* k = calloc(1, sizeof *k);
  if (!k) return fail(NULL, err, errlen, "out of memory loading kernel %s", rel);
  snprintf(k->node, sizeof k->node, "%s", node ? node : "");
  if (rel[0] == '/' || !base_dir || !*base_dir)
    snprintf(k->path, sizeof k->path, "%s", rel);
  else
    snprintf(k->path, sizeof k->path, "%s/%s", base_dir, rel);
  FILE* f = fopen(k->path, "r");
  if (!f)
    return fail(k, err, errlen, "node %s: kernel descriptor %s cannot be opened (%s); export-ort writes it beside "
                "the model, keep the model's folder together", k->node, k->path, strerror(errno));
  char line[8192], library[4096] = "", target_text[64] = "", lacking[1024] = "";
  int version = 0, ok = 1, lineno = 0;
  while (ok && fgets(line, sizeof line, f)) {
    lineno++;
    line[strcspn(line, "\r\n")] = 0;
    char* sp = strchr(line, ' ');
    if (!sp) continue;
    *sp = 0;
    char* rest = sp + 1;
    if (!strcmp(line, "tilefuse-kernel")) version = atoi(rest);
    else if (!strcmp(line, "target")) snprintf(target_text, sizeof target_text, "%s", rest);
    else if (!strcmp(line, "name")) snprintf(k->name, sizeof k->name, "%s", rest);
    else if (!strcmp(line, "library")) snprintf(library, sizeof library, "%s", rest);
    else if (!strcmp(line, "symbol")) snprintf(k->symbol, sizeof k->symbol, "%s", rest);
    else if (!strcmp(line, "sha256")) ok = is_sha256(rest) && snprintf(k->sha256, sizeof k->sha256, "%s", rest) == 64;
    else if (!strcmp(line, "input")) ok = k->n_in < TF_MAX_ARGS && parse_spec(rest, &k->in[k->n_in++]);
    else if (!strcmp(line, "output")) ok = k->n_out < TF_MAX_ARGS && parse_spec(rest, &k->out[k->n_out++]);
    else if (!strcmp(line, "status")) ok = parse_status(rest, k);
    else if (!strcmp(line, "check")) ok = parse_check(rest, k);
    else if (!strcmp(line, "requires")) cpu_lacks(rest, lacking, sizeof lacking);
#ifdef TF_WITH_CUDA
    else ok = tf_cuda_parse_line(k, line, rest);
#endif
  }
  fclose(f);
  if (version != 1) return fail(k, err, errlen, "%s: not a tilefuse kernel descriptor of format 1", k->path);
  if (!ok || !*library || !*k->symbol || !k->n_out)
    return fail(k, err, errlen, "%s: malformed descriptor (line %d)", k->path, lineno);
  if (!*k->sha256)
    return fail(k, err, errlen, "%s: no sha256 line: the kernel's bytes cannot be checked (export the model again)",
                k->path);
  if (k->checked != (k->n_sites > 0))
    return fail(k, err, errlen, "%s: a status word needs check lines, and check lines a status word", k->path);
  if (*lacking)
    return fail(k, err, errlen, "node %s: kernel %s was built for CPU extensions this machine lacks (%s); export "
                "the model on this machine or with --cpu-isa set to a level it has (x86-64-v3: AVX2 and FMA)",
                k->node, k->name, lacking);
  if (strcmp(target_text, target_name(target)) != 0)
    return fail(k, err, errlen, "node %s: kernel %s was compiled for target '%s', but this node runs %s kernels%s",
                k->node, k->name, target_text, target_name(target),
                target == TF_TARGET_CPU ? " (export with --target cpu)" : "");
  k->target = target;
  /* CUDA descriptors name the module's function (NAME_kernel) or, written by older tools, NAME */
  if (!generated_entry(k->symbol, "") && !(target == TF_TARGET_CUDA && generated_entry(k->symbol, "_kernel")))
    return fail(k, err, errlen, "%s: symbol '%s' is not a generated kernel entry; a descriptor names its own kernel only",
                k->path, k->symbol);
  for (int i = 0; i < k->n_in; i++) k->in_index[i] = i;
  for (int i = 0; i < k->n_out; i++) k->out_index[i] = i;
  if (!safe_relative(library))
    return fail(k, err, errlen, "%s: library '%s' must be a path inside the kernel's folder", k->path, library);
  const char* slash = strrchr(k->path, '/');
  if (slash)
    snprintf(k->library, sizeof k->library, "%.*s/%s", (int)(slash - k->path), k->path, library);
  else
    snprintf(k->library, sizeof k->library, "./%s", library);
  if (target == TF_TARGET_CUDA) {
#ifdef TF_WITH_CUDA
    if (tf_cuda_prepare(k, err, errlen)) return k;
    tf_kernel_free(k);
    return NULL;
#else
    return fail(k, err, errlen, "node %s: this library was built without CUDA support", k->node);
#endif
  }
  unsigned char* bytes = NULL;
  size_t size = 0;
  char why[1024];
  if (!tf_read_verified(k->library, k->sha256, &bytes, &size, why, sizeof why))
    return fail(k, err, errlen, "node %s: kernel %s: %s", k->node, k->name, why);
  k->lib = dlopen_private(bytes, size, k->sha256, why, sizeof why);
  free(bytes);
  if (!k->lib)
    return fail(k, err, errlen, "node %s: kernel %s: cannot load %s: %s", k->node, k->name, k->library, why);
  *(void**)&k->fn = dlsym(k->lib, k->symbol);
  if (!k->fn) {
    dlclose(k->lib);
    return fail(k, err, errlen, "node %s: kernel %s: %s has no symbol %s", k->node, k->name, k->library, k->symbol);
  }
  if (!defined_by(k->lib, *(void**)&k->fn)) {
    dlclose(k->lib);
    return fail(k, err, errlen, "node %s: kernel %s: %s is not defined by %s itself", k->node, k->name, k->symbol,
                k->library);
  }
  /* optional: kernels without a parallel loop, or built before the hook, have none */
  *(void**)&k->set_host = dlsym(k->lib, "tf_threads_host");
  if (k->set_host && !defined_by(k->lib, *(void**)&k->set_host)) k->set_host = NULL;
  return k;
}

void tf_kernel_free(tf_kernel* k) {
  if (!k) return;
#ifdef TF_WITH_CUDA
  tf_cuda_free(k);
#endif
  /* A CPU kernel's library stays loaded: OpenMP worker threads may still reference it. */
  free(k->sites);
  free(k);
}

/* The element type and shape of a value; NULL status on success. */
static OrtStatus* value_spec(const OrtApi* api, const OrtValue* v, tf_spec* spec) {
  OrtTensorTypeAndShapeInfo* info = NULL;
  OrtStatus* st = ORT_FN(api, SLOT_GetTensorTypeAndShape, GetTensorTypeAndShape_fn)(v, &info);
  if (st) return st;
  size_t rank = 0;
  st = ORT_FN(api, SLOT_GetTensorElementType, GetTensorElementType_fn)(info, &spec->elem);
  if (!st) st = ORT_FN(api, SLOT_GetDimensionsCount, GetDimensionsCount_fn)(info, &rank);
  if (!st && rank > TF_MAX_RANK) st = tf_status(api, ORT_INVALID_ARGUMENT, "rank %zu is above %d", rank, TF_MAX_RANK);
  if (!st) st = ORT_FN(api, SLOT_GetDimensions, GetDimensions_fn)(info, spec->dims, rank);
  spec->rank = (int)rank;
  ORT_FN(api, SLOT_ReleaseTensorTypeAndShapeInfo, ReleaseTensorTypeAndShapeInfo_fn)(info);
  return st;
}

static int same_spec(const tf_spec* a, const tf_spec* b) {
  if (a->elem != b->elem || a->rank != b->rank) return 0;
  for (int i = 0; i < a->rank; i++)
    if (a->dims[i] != b->dims[i]) return 0;
  return 1;
}

OrtStatus* tf_kernel_bind(const OrtApi* api, const tf_kernel* k, OrtKernelContext* ctx, void** argv) {
  size_t n_in = 0, n_out = 0;
  OrtStatus* st = ORT_FN(api, SLOT_KernelContext_GetInputCount, KernelContext_GetCount_fn)(ctx, &n_in);
  if (!st) st = ORT_FN(api, SLOT_KernelContext_GetOutputCount, KernelContext_GetCount_fn)(ctx, &n_out);
  if (st) return st;
  for (int i = 0; i < k->n_in; i++)
    if ((size_t)k->in_index[i] >= n_in)
      return tf_status(api, ORT_INVALID_GRAPH, "node %s: kernel %s takes %d inputs, the node has %zu", k->node, k->name,
                       k->n_in, n_in);
  for (int i = 0; i < k->n_out; i++)
    if ((size_t)k->out_index[i] >= n_out)
      return tf_status(api, ORT_INVALID_GRAPH, "node %s: kernel %s makes %d outputs, the node has %zu", k->node,
                       k->name, k->n_out, n_out);
  for (int i = 0; i < k->n_in; i++) {
    const OrtValue* v = NULL;
    tf_spec got;
    st = ORT_FN(api, SLOT_KernelContext_GetInput, KernelContext_GetInput_fn)(ctx, (size_t)k->in_index[i], &v);
    if (!st && !v) st = tf_status(api, ORT_INVALID_ARGUMENT, "node %s: input %d is missing", k->node, i);
    if (!st) st = value_spec(api, v, &got);
    if (st) return st;
    if (!same_spec(&got, &k->in[i])) {
      char a[256], b[256];
      return tf_status(api, ORT_INVALID_ARGUMENT,
                       "node %s: kernel %s was exported for input %d of type %d and shape %s, got type %d and shape %s; "
                       "export the model again for these shapes (tilefuse export-ort --shape ...)",
                       k->node, k->name, i, k->in[i].elem, shape_str(k->in[i].dims, k->in[i].rank, a, sizeof a),
                       got.elem, shape_str(got.dims, got.rank, b, sizeof b));
    }
    st = ORT_FN(api, SLOT_GetTensorMutableData, GetTensorMutableData_fn)((OrtValue*)v, &argv[i]);
    if (st) return st;
  }
  for (int i = 0; i < k->n_out; i++) {
    OrtValue* v = NULL;
    st = ORT_FN(api, SLOT_KernelContext_GetOutput, KernelContext_GetOutput_fn)(ctx, (size_t)k->out_index[i], k->out[i].dims,
                                                                               (size_t)k->out[i].rank, &v);
    if (!st) st = ORT_FN(api, SLOT_GetTensorMutableData, GetTensorMutableData_fn)(v, &argv[k->n_in + i]);
    if (st) return st;
  }
  return NULL;
}

OrtStatus* tf_index_error(const OrtApi* api, const tf_kernel* k, const int64_t status[2]) {
  if (!status[0]) return NULL;
  int64_t site = status[0] - 1;
  if (site < 0 || site >= k->n_sites)
    return tf_status(api, ORT_FAIL, "node %s: kernel %s reported index check %lld, but has %d", k->node, k->name,
                     (long long)site, k->n_sites);
  const tf_site* s = &k->sites[site];
  return tf_status(api, ORT_INVALID_ARGUMENT, "node %s: index %lld is outside [-%lld, %lld) in %s", k->node,
                   (long long)status[1], (long long)s->extent, (long long)s->extent, s->what);
}

/* The host of a kernel's parallel regions during one call: onnxruntime's intra-op pool. */
typedef struct {
  const OrtApi* api;
  KernelContext_ParallelFor_fn parallel_for;
  const OrtKernelContext* ctx;
  const tf_kernel* kernel;
} tf_host;

static void host_run(void* host, void (*share)(void*, size_t), size_t n, void* arg) {
  const tf_host* h = host;
  OrtStatus* st = h->parallel_for(h->ctx, share, n, 0, arg);
  if (!st) return;
  /* the pool runs the shares not begun on this thread when this returns: say so, once */
  static _Atomic int told;
  char msg[TF_ERR_LEN];
  tf_take_message(h->api, st, msg, sizeof msg);
  if (!atomic_exchange(&told, 1))
    fprintf(stderr, "tilefuse: node %s: KernelContext_ParallelFor failed (%s); kernel %s runs its parallel loops "
            "on the calling thread (reported once)\n", h->kernel->node, msg, h->kernel->name);
}

OrtStatus* tf_kernel_run(const OrtApi* api, const tf_kernel* k, OrtKernelContext* ctx,
                         KernelContext_ParallelFor_fn parallel_for) {
  void* argv[2 * TF_MAX_ARGS + 1];
  int64_t status[2] = {0, 0}; /* this call's own: concurrent runs never share it */
  OrtStatus* st = tf_kernel_bind(api, k, ctx, argv);
  if (st) return st;
  argv[k->n_in + k->n_out] = status;
  tf_host host = {api, parallel_for, ctx, k};
  int hosted = k->set_host && parallel_for;
  if (hosted) k->set_host(host_run, &host);  /* this thread's regions, during this call only */
  k->fn(argv);
  if (hosted) k->set_host(NULL, NULL);
  return k->checked ? tf_index_error(api, k, status) : NULL;
}
