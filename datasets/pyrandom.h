// CPython's `random.Random` (MT19937 seeded through init_by_array, getrandbits, _randbelow and
// sample), so that few-shot examples are drawn exactly as lm-evaluation-harness draws them with
// `random.Random(1234).sample(docs, n)`.
#pragma once
#include <array>
#include <cmath>
#include <cstdint>
#include <unordered_set>
#include <vector>

namespace hg {

class PyRandom {
 public:
  // random.Random(seed) for a non-negative integer seed below 2^64.
  explicit PyRandom(uint64_t seed) {
    std::vector<uint32_t> key = {uint32_t(seed)};
    if (seed >> 32) key.push_back(uint32_t(seed >> 32));
    init_by_array(key);
  }
  uint32_t next_u32() {
    if (i_ >= kN) twist();
    uint32_t y = mt_[size_t(i_++)];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
  }
  // getrandbits(k), 0 < k <= 32.
  uint32_t getrandbits(int k) { return next_u32() >> (32 - k); }
  // _randbelow_with_getrandbits(n), 0 < n < 2^32.
  uint32_t randbelow(uint32_t n) {
    int k = 0;
    while (k < 32 && (uint64_t(1) << k) <= n) ++k;  // n.bit_length()
    uint32_t r = getrandbits(k);
    while (r >= n) r = getrandbits(k);
    return r;
  }
  // The indices random.sample(range(n), k) returns, in order (k <= n).
  std::vector<uint32_t> sample(uint32_t n, uint32_t k) {
    std::vector<uint32_t> out(k);
    uint64_t setsize = 21;
    if (k > 5) setsize += uint64_t(std::pow(4.0, std::ceil(std::log(double(k) * 3) / std::log(4.0))));
    if (n <= setsize) {
      std::vector<uint32_t> pool(n);
      for (uint32_t i = 0; i < n; ++i) pool[i] = i;
      for (uint32_t i = 0; i < k; ++i) {
        const uint32_t j = randbelow(n - i);
        out[i] = pool[j];
        pool[j] = pool[n - i - 1];
      }
    } else {
      std::unordered_set<uint32_t> selected;
      for (uint32_t i = 0; i < k; ++i) {
        uint32_t j = randbelow(n);
        while (selected.count(j)) j = randbelow(n);
        selected.insert(j);
        out[i] = j;
      }
    }
    return out;
  }

 private:
  static constexpr int kN = 624, kM = 397;
  void init_genrand(uint32_t s) {
    mt_[0] = s;
    for (int i = 1; i < kN; ++i) mt_[size_t(i)] = 1812433253u * (mt_[size_t(i - 1)] ^ (mt_[size_t(i - 1)] >> 30)) + uint32_t(i);
    i_ = kN;
  }
  void init_by_array(const std::vector<uint32_t>& key) {
    init_genrand(19650218u);
    int i = 1, j = 0;
    const int len = int(key.size());
    for (int k = kN > len ? kN : len; k > 0; --k) {
      mt_[size_t(i)] = (mt_[size_t(i)] ^ ((mt_[size_t(i - 1)] ^ (mt_[size_t(i - 1)] >> 30)) * 1664525u)) + key[size_t(j)] + uint32_t(j);
      ++i, ++j;
      if (i >= kN) mt_[0] = mt_[kN - 1], i = 1;
      if (j >= len) j = 0;
    }
    for (int k = kN - 1; k > 0; --k) {
      mt_[size_t(i)] = (mt_[size_t(i)] ^ ((mt_[size_t(i - 1)] ^ (mt_[size_t(i - 1)] >> 30)) * 1566083941u)) - uint32_t(i);
      if (++i >= kN) mt_[0] = mt_[kN - 1], i = 1;
    }
    mt_[0] = 0x80000000u;
  }
  void twist() {
    for (int k = 0; k < kN; ++k) {
      const uint32_t y = (mt_[size_t(k)] & 0x80000000u) | (mt_[size_t((k + 1) % kN)] & 0x7fffffffu);
      mt_[size_t(k)] = mt_[size_t((k + kM) % kN)] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
    }
    i_ = 0;
  }
  std::array<uint32_t, kN> mt_{};
  int i_ = kN;
};

}  // namespace hg
