// Backend registry and RoPE frequency tables. The only place outside backend/cuda/ that knows
// whether CUDA was compiled in (HG_WITH_CUDA is a private definition of this file's target).
#include "engine/backend/backend.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numbers>

#include "engine/core/error.h"
#include "engine/core/tensor.h"

namespace hg {

#if HG_WITH_CUDA
int cuda_device_count();  // backend/cuda/cuda_device.cu
#endif

bool cuda_compiled() {
#if HG_WITH_CUDA
  return true;
#else
  return false;
#endif
}

int cuda_device_count_or_zero() {
#if HG_WITH_CUDA
  return cuda_device_count();
#else
  return 0;
#endif
}

void* Backend::alloc(size_t bytes) {
  void* p = host_alloc(bytes);
  if (!p) throw OutOfMemoryError(fmt::format("{} backend: cannot allocate {} bytes", name(), bytes));
  return p;
}
void Backend::free(void* p) { std::free(p); }
void Backend::upload(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }
void Backend::download(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }
void Backend::copy(void* dst, const void* src, size_t bytes) { std::memmove(dst, src, bytes); }
void Backend::upload_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                        size_t rows) {
  for (size_t r = 0; r < rows; ++r)
    upload(static_cast<char*>(dst) + r * dst_pitch, static_cast<const char*>(src) + r * src_pitch, width);
}
void Backend::download_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                          size_t rows) {
  for (size_t r = 0; r < rows; ++r)
    download(static_cast<char*>(dst) + r * dst_pitch, static_cast<const char*>(src) + r * src_pitch, width);
}

void Backend::convert_to_f32(const void* src, DType st, int64_t n, float* dst) {
  HG_CHECK(host_memory());
  to_f32(st, src, dst, size_t(n));
}

void write_kv_host(const float* src, int64_t n, int H_kv, int D, const int32_t* pos, void* dst, int64_t head_stride,
                   DType dt) {
  const int64_t es = int64_t(dtype_size(dt));
  char* out = static_cast<char*>(dst);
  for (int64_t i = 0; i < n; ++i)
    for (int g = 0; g < H_kv; ++g)
      from_f32(dt, src + (i * H_kv + g) * D, out + (g * head_stride + int64_t(pos[i]) * D) * es, size_t(D));
}

void Backend::write_kv(const float* src, int64_t n, int H_kv, int D, const int32_t* pos, void* dst,
                       int64_t head_stride, DType dt) {
  write_kv_host(src, n, H_kv, D, pos, dst, head_stride, dt);
}

AttentionArgs attention_args(int H, int H_kv, int D, float scale, const float* q, std::span<const AttnRow> rows,
                             float* out, DType kv_dtype) {
  AttentionArgs a;
  a.n_rows = int(rows.size());
  a.H = H;
  a.H_kv = H_kv;
  a.D = D;
  a.scale = scale;
  a.q = q;
  a.rows = rows.data();
  a.out = out;
  a.kv_dtype = kv_dtype;
  return a;
}

std::vector<std::string> backend_names() { return {"cpu", "ref", "cuda", "null"}; }

std::unique_ptr<Backend> make_backend(std::string_view name) {
  if (name == "cpu") return make_cpu_backend();
  if (name == "ref") return make_ref_backend();
  if (name == "null") return make_null_backend();
  if (name == "cuda") {
#if HG_WITH_CUDA
    if (cuda_device_count() <= 0) throw UnsupportedError("backend cuda: no CUDA device is visible on this machine");
    return make_cuda_backend();
#else
    throw UnsupportedError("backend cuda: this build was not compiled with CUDA support (configure with HG_CUDA=ON)");
#endif
  }
  input_error("unknown backend '{}' (expected cpu, ref, cuda or null)", name);
}

RopeTable make_rope_table(const HParams& hp, const std::vector<float>& freq_factors) {
  RopeTable t;
  t.style = hp.rope_style;
  const int half = hp.head_dim / 2;
  t.inv_freq.resize(size_t(half));
  for (int i = 0; i < half; ++i) t.inv_freq[size_t(i)] = std::pow(hp.rope_theta, -2.0 * i / hp.head_dim);
  if (!freq_factors.empty()) {
    for (int i = 0; i < half; ++i) t.inv_freq[size_t(i)] /= double(freq_factors[size_t(i)]);
  } else if (hp.rope_scaling.type == "llama3") {
    // Llama-3.1 frequency scaling: long wavelengths divided by `factor`, short ones kept, a
    // smooth blend between original/low_freq_factor and original/high_freq_factor.
    const RopeScaling& s = hp.rope_scaling;
    const double low_wl = s.original_max_pos / s.low_freq_factor;
    const double high_wl = s.original_max_pos / s.high_freq_factor;
    for (auto& f : t.inv_freq) {
      const double wl = 2.0 * std::numbers::pi / f;
      if (wl < high_wl) continue;
      if (wl > low_wl) {
        f /= s.factor;
      } else {
        const double smooth = (s.original_max_pos / wl - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        f = (1 - smooth) * f / s.factor + smooth * f;
      }
    }
  }
  return t;
}

}  // namespace hg
