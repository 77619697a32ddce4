/* Built by test_launch_descriptor.py: reads one kernel descriptor (.tfk) with the very
 * parser the onnxruntime libraries use (tf_kernel_load, tf_cuda_parse_line) and prints
 * what it understood as JSON, so the test can hold it against the launch record the
 * descriptor was written from. Includes tf_cuda.c to see its private launch struct. */
#include "tf_cuda.c" /* with -I tilefuse/ort/csrc */

static void print_u64s(const char* key, const uint64_t* xs, int n) {
  printf("\"%s\": [", key);
  for (int i = 0; i < n; i++) printf("%s%llu", i ? ", " : "", (unsigned long long)xs[i]);
  printf("]");
}

static void print_u32s(const char* key, const uint32_t* xs, int n) {
  printf("\"%s\": [", key);
  for (int i = 0; i < n; i++) printf("%s%u", i ? ", " : "", xs[i]);
  printf("]");
}

int main(int argc, char** argv) {
  char err[TF_ERR_LEN] = "";
  if (argc != 2) return 2;
  tf_kernel* k = tf_kernel_load(NULL, argv[1], "node", TF_TARGET_CUDA, err, sizeof err);
  if (!k) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  tf_cuda* c = k->cuda;
  printf("{\"symbol\": \"%s\", \"inputs\": %d, \"outputs\": %d, \"checked\": %d, ", k->symbol, k->n_in, k->n_out,
         k->checked);
  print_u32s("grid", c->grid, 3);
  printf(", ");
  print_u32s("block", c->block, 3);
  printf(", \"smem\": %u, \"args\": [", c->smem);
  for (int i = 0; i < c->n_args; i++) {
    const tf_cuda_arg* a = &c->args[i];
    printf("%s{\"param\": %d, \"tma\": ", i ? ", " : "", a->param);
    if (!a->tensormap) {
      printf("null}");
      continue;
    }
    printf("{\"dtype\": %u, \"interleave\": %u, \"swizzle\": %u, \"l2_promotion\": %u, \"oob_fill\": %u, ", a->dtype,
           a->interleave, a->swizzle, a->l2, a->oob);
    print_u64s("dims", a->dims, (int)a->rank);
    printf(", ");
    print_u64s("strides", a->strides, (int)a->rank - 1);
    printf(", ");
    print_u32s("box", a->box, (int)a->rank);
    printf(", ");
    print_u32s("element_strides", a->elem, (int)a->rank);
    printf("}}");
  }
  printf("]}\n");
  tf_kernel_free(k);
  return 0;
}
