/* Compiled by test_cuda_build.py with TF_CHECK_CUDA_H: with cuda.h's own types in place,
 * every function type tilefuse declares must be the type of cuda.h's prototype. */
#define TF_CHECK_CUDA_H
#include "cuda_abi.h"

#define TF_SAME_TYPE(name, symbol) \
  _Static_assert(__builtin_types_compatible_p(tf_##name##_fn, __typeof__(name)*), #name " prototype");
TF_CUDA_SYMBOLS(TF_SAME_TYPE)
