#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "ops/sample_math.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace v4::engine {

namespace {

// Greater-than on (value, -id): descending value, ascending id on ties (deterministic order).
struct ByValueDesc {
  const float* v;
  bool operator()(int32_t a, int32_t b) const { return v[a] > v[b] || (v[a] == v[b] && a < b); }
};

// Writes biased (logit_bias) and penalized logits into `out` (size vocab).
void apply_penalties(const float* logits, int64_t vocab, const SamplingParams& p,
                     const PenaltyState& st, float* out) {
  std::copy(logits, logits + vocab, out);
  for (const auto& [t, b] : p.logit_bias)
    if (t >= 0 && t < vocab) out[t] += b;
  if (p.repetition_penalty != 1.0f) {
    auto rep = [&](int32_t t) {
      if (t < 0 || t >= vocab) return;
      float& l = out[t];
      l = l > 0 ? l / p.repetition_penalty : l * p.repetition_penalty;
    };
    for (int32_t t : st.prompt_tokens_unique) rep(t);
    for (const auto& [t, c] : st.output_counts) {
      if (!std::binary_search(st.prompt_tokens_unique.begin(), st.prompt_tokens_unique.end(), t))
        rep(t);
    }
  }
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    for (const auto& [t, c] : st.output_counts) {
      if (t < 0 || t >= vocab || c <= 0) continue;
      out[t] -= p.frequency_penalty * float(c) + p.presence_penalty;
    }
  }
}

// Largest non-NaN value (NaNs are ignored; −inf when there is none).
float max_value(const float* v, int64_t n) {
  int64_t i = 0;
  float m = -std::numeric_limits<float>::infinity();
#if defined(__SSE2__)
  // Four independent 4-wide accumulators (vocabularies are ~10^5: this is the hot loop of greedy).
  // MAXPS returns its second operand when either is NaN: the loaded values go first so a NaN
  // never replaces the running maximum.
  __m128 a0 = _mm_set1_ps(m), a1 = a0, a2 = a0, a3 = a0;
  for (; i + 16 <= n; i += 16) {
    a0 = _mm_max_ps(_mm_loadu_ps(v + i), a0);
    a1 = _mm_max_ps(_mm_loadu_ps(v + i + 4), a1);
    a2 = _mm_max_ps(_mm_loadu_ps(v + i + 8), a2);
    a3 = _mm_max_ps(_mm_loadu_ps(v + i + 12), a3);
  }
  alignas(16) float t[4];
  _mm_store_ps(t, _mm_max_ps(_mm_max_ps(a0, a1), _mm_max_ps(a2, a3)));
  m = std::max(std::max(t[0], t[1]), std::max(t[2], t[3]));
#endif
  for (; i < n; ++i) m = std::max(m, v[i]);  // (m < NaN) is false: NaN ignored
  return m;
}

// Lowest index holding the maximum (ties go to the lowest id; −0 == +0). NaNs are ignored; a row
// of NaNs only gives 0. The device sampler (ops/cuda/sampling.cu) follows the same policy.
int32_t argmax(const float* v, int64_t n) {
  const float m = max_value(v, n);
  for (int64_t i = 0; i < n; ++i)
    if (v[i] == m) return int32_t(i);
  return 0;  // only NaNs
}

// x = logits / T in place, as logit · fl(1/T) (the device does the same), NaN → −inf (a NaN
// logit, or 0 · inf for a denormal T, never gets probability). Returns max x.
float scale_logits(float* x, int64_t vocab, float temperature) {
  const float inv_t = 1.0f / temperature;
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < vocab; ++i) {
    x[i] *= inv_t;
    if (std::isnan(x[i])) x[i] = -std::numeric_limits<float>::infinity();
    mx = std::max(mx, x[i]);
  }
  return mx;
}

// Builds the kept candidate set for non-greedy sampling from the scaled logits `x` (scale_logits;
// `mx` = max x, finite). On return `idx` holds the kept ids in drawing order: (x desc, id asc)
// when top-k or top-p is on, else ascending id; `e` (size vocab, indexed by id) holds their
// unnormalized probabilities exp(x − mx). Returns the sum of kept weights (summed in that order).
double build_candidates(int64_t vocab, const SamplingParams& p, float mx, const float* x, float* e,
                        std::vector<int32_t>& idx) {
  idx.resize(size_t(vocab));
  std::iota(idx.begin(), idx.end(), 0);
  const bool use_k = p.top_k > 0 && p.top_k < vocab;
  const bool use_p = p.top_p < 1.0f;
  if (use_k) {
    std::nth_element(idx.begin(), idx.begin() + (p.top_k - 1), idx.end(), ByValueDesc{x});
    idx.resize(size_t(p.top_k));
    std::sort(idx.begin(), idx.end(), ByValueDesc{x});
  }
  // Weights of the candidates only (nothing else is read later).
  double sum = 0;
  for (int32_t i : idx) {
    e[i] = std::exp(x[i] - mx);
    sum += e[i];
  }
  if (use_p) {
    // Sort only as many of the most likely tokens as needed to reach the mass: select the top m
    // (m = 256, 1024, ...), sort them, and stop once their mass reaches top_p. The comparator is
    // a strict total order, so the kept set equals that of a full sort.
    const double target = double(p.top_p) * sum;
    size_t m = std::min<size_t>(idx.size(), 256);
    size_t keep = 0;
    double cum = 0;
    for (;;) {
      if (m < idx.size())
        std::nth_element(idx.begin(), idx.begin() + ptrdiff_t(m - 1), idx.end(), ByValueDesc{x});
      std::sort(idx.begin(), idx.begin() + ptrdiff_t(m), ByValueDesc{x});
      cum = 0;
      keep = 0;
      bool reached = false;
      while (keep < m) {
        cum += e[idx[keep]];
        ++keep;
        if (cum >= target) {
          reached = true;
          break;
        }
      }
      if (reached || m == idx.size()) break;
      m = std::min(idx.size(), m * 4);
    }
    idx.resize(std::max<size_t>(keep, 1));
    sum = cum;
  }
  if (p.min_p > 0.0f) {
    float pmax = 0;
    for (int32_t i : idx) pmax = std::max(pmax, e[i]);
    const float thr = p.min_p * pmax;  // relative to the max, so normalization cancels
    size_t o = 0;
    double s = 0;
    for (int32_t i : idx)
      if (e[i] >= thr) {
        idx[o++] = i;
        s += e[i];
      }
    idx.resize(o);
    sum = s;
  }
  return sum;
}

void raw_logprobs(const float* logits, int64_t vocab, int32_t token, int32_t top_n,
                  TokenLogprobs* lp, std::vector<int32_t>& idx) {
  const float mx = max_value(logits, vocab);
  double s = 0;
  for (int64_t i = 0; i < vocab; ++i) s += std::exp(double(logits[i]) - mx);
  const double lse = double(mx) + std::log(s);
  lp->token = token;
  lp->logprob = float(double(logits[token]) - lse);
  lp->top.clear();
  if (top_n <= 0) return;
  const int64_t n = std::min<int64_t>(top_n, vocab);
  idx.resize(size_t(vocab));
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + n, idx.end(), ByValueDesc{logits});
  for (int64_t i = 0; i < n; ++i) lp->top.push_back({idx[i], float(double(logits[idx[i]]) - lse)});
}

}  // namespace

void token_logprobs(const float* logits, int64_t vocab, int32_t token, int32_t top_n,
                    TokenLogprobs* lp, std::vector<int32_t>* scratch_idx) {
  raw_logprobs(logits, vocab, token, top_n, lp, *scratch_idx);
}

double sampler_uniform(uint64_t seed, uint64_t index) {
  return ops::sample_uniform(seed, index);
}

void normalize_sampling(SamplingParams* p) {
  if (p->temperature > 0.0f && p->temperature < kMinSampledTemperature) p->temperature = 0.0f;
}

Status validate_sampling(const SamplingParams& p, int64_t vocab) {
  auto bad = [](const char* f, double v, const char* want) {
    return make_error(ErrorCode::kInvalidArgument, "{} = {} is invalid: must be {}", f, v, want);
  };
  if (p.max_tokens < 1) return bad("max_tokens", double(p.max_tokens), ">= 1");
  if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature))
    return bad("temperature", p.temperature, ">= 0");
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) return bad("top_p", p.top_p, "in (0, 1]");
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) return bad("min_p", p.min_p, "in [0, 1]");
  if (!(p.presence_penalty >= -2.0f && p.presence_penalty <= 2.0f))
    return bad("presence_penalty", p.presence_penalty, "in [-2, 2]");
  if (!(p.frequency_penalty >= -2.0f && p.frequency_penalty <= 2.0f))
    return bad("frequency_penalty", p.frequency_penalty, "in [-2, 2]");
  if (!(p.repetition_penalty > 0.0f) || !std::isfinite(p.repetition_penalty))
    return bad("repetition_penalty", p.repetition_penalty, "> 0");
  if (p.top_logprobs < 0 || p.top_logprobs > 20)
    return bad("top_logprobs", p.top_logprobs, "in [0, 20]");
  if (p.prompt_logprobs < -1 || p.prompt_logprobs > 20)
    return bad("prompt_logprobs", p.prompt_logprobs, "-1 (off) or in [0, 20]");
  for (int32_t t : p.stop_token_ids)
    if (t < 0 || t >= vocab) return bad("stop_token_ids entry", t, "a token id in the vocabulary");
  for (size_t i = 0; i < p.logit_bias.size(); ++i) {
    const auto& [t, b] = p.logit_bias[i];
    for (size_t j = 0; j < i; ++j)
      if (p.logit_bias[j].first == t) return bad("logit_bias token", t, "listed once");
    if (t < 0 || t >= vocab) return bad("logit_bias token", t, "a token id in the vocabulary");
    if (!(b >= -100.0f && b <= 100.0f)) return bad("logit_bias value", b, "in [-100, 100]");
  }
  return Status::Ok();
}

int32_t sample_token(const float* logits, int64_t vocab, const SamplingParams& p, uint64_t seed,
                     int64_t step, const PenaltyState& penalties, TokenLogprobs* lp,
                     std::vector<float>* scratch, std::vector<int32_t>* scratch_idx) {
  std::vector<float>& w = *scratch;
  std::vector<int32_t>& idx = *scratch_idx;
  const bool penalize = !p.logit_bias.empty() ||
                        (p.repetition_penalty != 1.0f && !(penalties.prompt_tokens_unique.empty() &&
                                                           penalties.output_counts.empty())) ||
                        ((p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) &&
                         !penalties.output_counts.empty());
  int32_t token;
  if (p.temperature == 0.0f && !penalize) {
    token = argmax(logits, vocab);  // no copy on the common greedy path
  } else if (p.temperature == 0.0f) {
    w.resize(size_t(vocab));
    apply_penalties(logits, vocab, p, penalties, w.data());
    token = argmax(w.data(), vocab);
  } else {
    w.resize(size_t(vocab) * 2);  // [0, V): scaled logits x; [V, 2V): weights
    float* x = w.data();
    float* e = w.data() + vocab;
    apply_penalties(logits, vocab, p, penalties, x);
    const float mx = scale_logits(x, vocab, p.temperature);
    if (!std::isfinite(mx)) {
      token = argmax(x, vocab);  // no distribution (all −inf, or +inf present)
    } else {
      const double sum = build_candidates(vocab, p, mx, x, e, idx);
      const double u = sampler_uniform(seed, uint64_t(step)) * sum;
      double cum = 0;
      token = idx.empty() ? argmax(logits, vocab) : idx.back();
      for (int32_t i : idx) {
        cum += e[i];
        if (u < cum) {
          token = i;
          break;
        }
      }
    }
  }
  if (lp && p.logprobs) raw_logprobs(logits, vocab, token, p.top_logprobs, lp, idx);
  return token;
}

std::vector<float> sampling_distribution(const float* logits, int64_t vocab,
                                         const SamplingParams& p, const PenaltyState& penalties) {
  std::vector<float> out(static_cast<size_t>(vocab), 0.0f);
  std::vector<float> x(static_cast<size_t>(vocab)), e(static_cast<size_t>(vocab));
  apply_penalties(logits, vocab, p, penalties, x.data());
  if (p.temperature == 0.0f) {
    out[size_t(argmax(x.data(), vocab))] = 1.0f;
    return out;
  }
  const float mx = scale_logits(x.data(), vocab, p.temperature);
  if (!std::isfinite(mx)) {
    out[size_t(argmax(x.data(), vocab))] = 1.0f;
    return out;
  }
  std::vector<int32_t> idx;
  const double sum = build_candidates(vocab, p, mx, x.data(), e.data(), idx);
  for (int32_t i : idx) out[size_t(i)] = float(e[i] / sum);
  return out;
}

}  // namespace v4::engine
