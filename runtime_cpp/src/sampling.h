// Token choice and the acceptance rule (docs/design.md, section 5; runtime_py/sampling.py).
//
// Greedy: accept d_i while it equals the target's argmax c_{i-1}; the bonus is c_k.
// Sampled: p_r is row r's distribution after temperature, then top-k (ties kept), then top-p
// (float64). Accept d_i if u < p_{i-1}(d_i); at the first rejection draw the bonus from p_{i-1}
// with d_i removed; after 7 acceptances draw it from p_7. The drafts are an argmax chain (a
// one-hot proposal), so this is the standard lossless rule.
#pragma once

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace hyflash {

struct Sampling {
  double temperature = 0.0;  // 0 = greedy
  double top_p = 1.0;
  int64_t top_k = 0;  // 0 = off
  bool greedy() const { return temperature == 0.0; }
};

// Uniform doubles in [0, 1) from a 64-bit Mersenne Twister: the same draws on every platform
// (std::uniform_real_distribution's algorithm is the library's choice).
class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}
  double uniform() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }

 private:
  std::mt19937_64 engine_;
};

std::vector<double> probs(const float* logits, int64_t vocab, const Sampling& sampling);
int64_t argmax(const float* logits, int64_t vocab);
int64_t draw(const std::vector<double>& p, Rng& rng);  // an index with probability p[i] / sum(p)
int64_t choose(const float* logits, int64_t vocab, const Sampling& sampling, Rng& rng);
// drafts (block,) for positions pos+1..; logits (block + 1, vocab) from verifying [anchor, drafts].
// -> (k accepted drafts, bonus token)
std::pair<int, int64_t> accept(const int64_t* drafts, int block, const float* logits, int64_t vocab,
                               const Sampling& sampling, Rng& rng);

}  // namespace hyflash
