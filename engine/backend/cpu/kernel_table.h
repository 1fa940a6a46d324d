// The CPU kernels of one instruction-set level as a table of functions (signatures and maths in
// kernels.h). kernels.cpp forwards each hg::cpu call to the table of the active level
// (active_cpu_isa()).
#pragma once
#include <cstdint>

#include "engine/core/dtype.h"

namespace hg::cpu {

struct KernelTable {
  float (*dot)(const float*, const float*, int64_t);
  float (*sum)(const float*, int64_t);
  float (*sum_one_stream)(const float*, int64_t);
  void (*rms_norm_row)(const float*, const float*, int64_t, float, float*);
  void (*layer_norm_row)(const float*, const float*, const float*, int64_t, float, float*);
  void (*swiglu)(const float*, const float*, int64_t, float*);
  void (*relu)(float*, int64_t);
  void (*add)(float*, const float*, int64_t);
  float (*max_value)(const float*, int64_t);
  float (*exp_shift_sum)(float*, int64_t, float);
  void (*f32_to_bf16_row)(const float*, uint16_t*, int64_t);
  void (*bf16_to_f32_row)(const uint16_t*, float*, int64_t);
  void (*f16_to_f32_row)(const uint16_t*, float*, int64_t);
  void (*attention_group)(const float*, const void*, const void*, DType, int64_t, int, int, float, float*, float*,
                          float*, float*, int64_t, float*, const int32_t*);
  void (*group_logits)(const float*, int, const void*, DType, int64_t, int64_t, int64_t, int, float, float*);
  void (*group_logit_max)(const float*, int, const void*, DType, int64_t, int64_t, int, float, float*);
  void (*gemv)(const float*, int, const void*, DType, int64_t, int64_t, int64_t, float*, int64_t);
  bool (*gemv_rounds_bf16_activations)();
  void (*gather_rows)(void*, const void*, int64_t, int64_t, const int32_t*, int64_t);
  float (*sum_rows)(const float*, int64_t, int64_t, const int32_t*, int64_t);
  void (*group_weighted_v)(const float*, int, const void*, DType, int64_t, int, float*);
  void (*to_f32)(const void*, DType, float*, int64_t);
  void (*gumbel_noise)(uint64_t, const int32_t*, int64_t, double*);
  int32_t (*logit_top_k)(const float*, int, int64_t, int32_t, int32_t, int32_t*);
};

namespace portable {
const KernelTable& kernel_table();
}
namespace avx512 {
const KernelTable& kernel_table();
}
namespace avx512_bf16 {
const KernelTable& kernel_table();
}

}  // namespace hg::cpu
