#include "sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace hyflash {

int64_t argmax(const float* logits, int64_t vocab) {
  return std::max_element(logits, logits + vocab) - logits;  // the first of equal maxima, as numpy's
}

std::vector<double> probs(const float* logits, int64_t vocab, const Sampling& sampling) {
  std::vector<double> z(logits, logits + vocab);
  for (double& x : z) x /= sampling.temperature;
  if (sampling.top_k > 0 && sampling.top_k < vocab) {
    std::vector<double> sorted = z;
    std::nth_element(sorted.begin(), sorted.begin() + (sampling.top_k - 1), sorted.end(), std::greater<double>());
    const double kth = sorted[sampling.top_k - 1];
    for (double& x : z)
      if (x < kth) x = -INFINITY;
  }
  const double top = *std::max_element(z.begin(), z.end());
  double total = 0.0;
  for (double& x : z) total += x = std::exp(x - top);
  for (double& x : z) x /= total;
  if (sampling.top_p < 1.0) {  // keep a token if the mass sorted strictly before it is below top_p
    std::vector<int64_t> order(vocab);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return z[a] > z[b]; });
    double before = 0.0, kept = 0.0;
    std::vector<double> p(vocab, 0.0);
    for (int64_t i : order) {
      if (before < sampling.top_p) p[i] = z[i], kept += z[i];
      before += z[i];
    }
    for (double& x : p) x /= kept;
    return p;
  }
  return z;
}

int64_t draw(const std::vector<double>& p, Rng& rng) {
  const double total = std::accumulate(p.begin(), p.end(), 0.0);
  const double u = rng.uniform() * total;
  double cumulative = 0.0;
  int64_t last = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] <= 0.0) continue;
    cumulative += p[i];
    last = static_cast<int64_t>(i);
    if (u < cumulative) return last;
  }
  return last;  // rounding at the very end of the cumulative sum
}

int64_t choose(const float* logits, int64_t vocab, const Sampling& sampling, Rng& rng) {
  if (sampling.greedy()) return argmax(logits, vocab);
  return draw(probs(logits, vocab, sampling), rng);
}

std::pair<int, int64_t> accept(const int64_t* drafts, int block, const float* logits, int64_t vocab,
                               const Sampling& sampling, Rng& rng) {
  if (sampling.greedy()) {
    int k = 0;
    while (k < block && drafts[k] == argmax(logits + k * vocab, vocab)) ++k;
    return {k, argmax(logits + k * vocab, vocab)};
  }
  for (int i = 0; i < block; ++i) {
    std::vector<double> p = probs(logits + i * vocab, vocab, sampling);
    if (rng.uniform() < p[drafts[i]]) continue;  // accept d_{i+1} with probability p_i(d_{i+1})
    p[drafts[i]] = 0.0;                          // the residual: p_i without the rejected draft
    return {i, draw(p, rng)};
  }
  return {block, draw(probs(logits + block * vocab, vocab, sampling), rng)};
}

}  // namespace hyflash
