// GGUF: header, key/values, tensor table (offsets, types and shapes against the file size), the
// embedded tokenizer, and a whole model load from the file.
//
// Mutation is structure-aware: the input is walked as GGUF (header, key/values, tensor infos) and
// one of its numeric fields (counts, a hyperparameter, a string or array length, a tensor's rank,
// dimensions, type or offset) is set to a boundary value, so that mutations reach the hyperparameter
// and tensor-table checks instead of dying in the magic or the first length. Inputs that do not
// walk, and a third of the others, get libFuzzer's byte mutations (with the GGUF dictionary).
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "engine/formats/formats.h"
#include "engine/formats/gguf.h"
#include "engine/tokenizer/tokenizer.h"
#include "fuzz_util.h"

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

namespace {

// A numeric field of the input: where it is, its width in bytes, and whether it holds a float.
struct Field {
  size_t at;
  int width;
  bool real;
};

// The numeric fields of a GGUF header, key/values and tensor infos, as far as the input walks.
class Walker {
 public:
  Walker(const uint8_t* d, size_t n) : d_(d), n_(n) {}
  std::vector<Field> fields;

  bool walk() {
    if (n_ < 24 || std::memcmp(d_, "GGUF", 4) != 0) return false;
    pos_ = 4;
    field(4);  // version
    uint64_t n_tensors = 0, n_kv = 0;
    if (!u64(&n_tensors, true) || !u64(&n_kv, true)) return false;
    for (uint64_t i = 0; i < n_kv && i < 4096; ++i) {
      uint32_t type = 0;
      if (!string() || !u32(&type, true) || !value(type, 0)) return !fields.empty();
    }
    for (uint64_t i = 0; i < n_tensors && i < 4096; ++i) {
      uint32_t dims = 0;
      if (!string() || !u32(&dims, true) || dims > 8) return !fields.empty();
      for (uint32_t k = 0; k < dims; ++k)
        if (!u64(nullptr, true)) return !fields.empty();
      if (!u32(nullptr, true) || !u64(nullptr, true)) return !fields.empty();  // type, offset
    }
    return true;
  }

 private:
  bool have(size_t k) const { return k <= n_ - pos_; }
  void field(int width, bool real = false) { fields.push_back({pos_, width, real}), pos_ += size_t(width); }
  // A little-endian integer of `width` bytes, read into v when given, recorded as a field or skipped.
  bool num(void* v, int width, bool record) {
    if (!have(size_t(width))) return false;
    if (v) std::memcpy(v, d_ + pos_, size_t(width));
    if (record) field(width);
    else pos_ += size_t(width);
    return true;
  }
  bool u32(uint32_t* v, bool record) { return num(v, 4, record); }
  bool u64(uint64_t* v, bool record) { return num(v, 8, record); }
  bool string() {
    uint64_t len = 0;
    if (!u64(&len, true) || !have(len)) return false;
    pos_ += size_t(len);
    return true;
  }
  // GGUF value types: 0 u8, 1 i8, 2 u16, 3 i16, 4 u32, 5 i32, 6 f32, 7 bool, 8 string, 9 array,
  // 10 u64, 11 i64, 12 f64.
  bool value(uint32_t type, int depth) {
    static constexpr int kWidth[13] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    if (type > 12) return false;
    if (type == 8) return string();
    if (type == 9) {
      uint32_t elem = 0;
      uint64_t count = 0;
      if (depth > 1 || !u32(&elem, true) || !u64(&count, true)) return false;
      // A long array (a vocabulary) is skipped over, its elements not recorded one by one.
      for (uint64_t i = 0; i < count; ++i) {
        const size_t before = fields.size();
        if (!value(elem, depth + 1)) return false;
        if (i >= 4) fields.resize(before);
      }
      return true;
    }
    if (!have(size_t(kWidth[type]))) return false;
    field(kWidth[type], type == 6 || type == 12);
    return true;
  }
  const uint8_t* d_;
  size_t n_;
  size_t pos_ = 0;
};

void set_boundary(uint8_t* at, const Field& f, std::minstd_rand& rng) {
  if (f.real) {
    const double vals[] = {0.0, -1.0, 1e-30, 1e30, std::numeric_limits<double>::infinity(),
                           std::numeric_limits<double>::quiet_NaN(), -0.0, 1e-5};
    const double v = vals[rng() % std::size(vals)];
    if (f.width == 4) {
      const float x = float(v);
      std::memcpy(at, &x, 4);
    } else {
      std::memcpy(at, &v, 8);
    }
    return;
  }
  uint64_t old = 0;
  std::memcpy(&old, at, size_t(f.width));
  const uint64_t vals[] = {0,          1,           2,           3,          7,         8,           64,
                           0x7f,       0xff,        0x7fff,      0xffff,     10000000,  100000000,   0x7fffffff,
                           0x80000000, 0xffffffff,  0x100000005, ~0ull,      1ull << 62, old + 1,    old - 1,
                           old * 2,    old + 4096,  uint64_t(rng())};
  const uint64_t v = vals[rng() % std::size(vals)];
  std::memcpy(at, &v, size_t(f.width));  // little-endian: the low bytes
}

}  // namespace

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  std::minstd_rand rng(seed | 1u);
  Walker w(data, size);
  if (rng() % 3 == 0 || !w.walk() || w.fields.empty()) return LLVMFuzzerMutate(data, size, max_size);
  // One to three fields, so that related checks (a count and the table it sizes) can both be hit.
  for (unsigned k = 1 + rng() % 3; k > 0; --k) {
    const Field& f = w.fields[rng() % w.fields.size()];
    set_boundary(data + f.at, f, rng);
  }
  return size;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t n) {
  hg::fuzz::MemFile f(data, n);
  hg::fuzz::expect_clean([&] {
    hg::GgufFile g(f.path());
    for (auto& t : g.tensors()) (void)g.load(t, hg::DType::kF32);
  });
  hg::fuzz::expect_clean([&] { (void)hg::load_gguf_tokenizer(f.path())->encode("Hello world, 123!"); });
  hg::fuzz::expect_clean([&] { (void)hg::load_model("gguf:" + f.path()); });
  return 0;
}
