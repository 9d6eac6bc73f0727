// CPU sampler: one row of logits + a request's SamplingParams -> one token (and logprobs).
//
// Order of processing (HF / vLLM order): logit_bias -> penalties (repetition, presence,
// frequency) -> temperature -> top-k -> top-p -> min-p -> draw. temperature == 0 means greedy: argmax of the
// penalized logits (lowest id wins ties), no randomness.
// Randomness is counter-based: the uniform draw for a request's i-th generated token is a hash of
// (seed, i). So a seeded request gives the same tokens whatever else is in the batch, and a
// preempted request recomputes to the same tokens.
// Logprobs are log-softmax of the RAW logits (before penalties, temperature and truncation).
// Exact rules (the device sampler, ops::Ops::sample, follows them for requests without
// penalties): x = logit · fl(1/T) with NaN → −inf; a row whose max x is not finite gives argmax x;
// top-k and top-p order tokens by (x desc, id asc); weights are exp(x − max x) in f32, summed in
// f64 in drawing order; min-p keeps weights ≥ min_p; the draw walks the kept tokens in that
// order (ascending id when neither top-k nor top-p is on). Greedy ignores NaN (an all-NaN row
// gives token 0).
#pragma once
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "engine/engine.h"

namespace v4::engine {

/// Counts of tokens a request has seen, for penalties. `output` holds generated tokens only
/// (presence/frequency penalties); `prompt` marks prompt tokens (repetition penalty only).
struct PenaltyState {
  std::unordered_map<int32_t, int32_t> output_counts;
  std::vector<int32_t> prompt_tokens_unique;  // sorted, deduplicated; empty unless needed
};

/// A uniform double in [0, 1) from (seed, index): splitmix64 of both, 53 mantissa bits
/// (ops::sample_uniform, shared with the device sampler).
double sampler_uniform(uint64_t seed, uint64_t index);

/// Temperatures below this are greedy (vLLM's _SAMPLING_EPS): logits · (1/T) overflows f32 for
/// T of about 1e-38 and less, every logit above ~3.4 becomes +inf and "argmax x" (the rule
/// for a row whose max is not finite, CPU and device alike) would pick the lowest such id — a
/// near-random token where the caller asked for the sharpest distribution.
constexpr float kMinSampledTemperature = 1e-5f;

/// Engine::submit's normalization: a temperature in (0, kMinSampledTemperature) becomes 0.
void normalize_sampling(SamplingParams* p);

/// Checks sampling values; kInvalidArgument with the field name on error.
Status validate_sampling(const SamplingParams& p, int64_t vocab);

/// Samples one token from `logits` (f32, [vocab]). `step` is the index of the token being
/// generated (0 for the first). Fills `lp` when p.logprobs (top list of p.top_logprobs entries).
/// `scratch` is reused between calls to avoid allocation (any contents).
int32_t sample_token(const float* logits, int64_t vocab, const SamplingParams& p, uint64_t seed,
                     int64_t step, const PenaltyState& penalties, TokenLogprobs* lp,
                     std::vector<float>* scratch, std::vector<int32_t>* scratch_idx);

/// Log-softmax of the raw `logits` (f32, [vocab]) at `token` into `lp`, with the `top_n` most
/// likely tokens (descending) in lp->top; `scratch_idx` is reused between calls (any contents).
void token_logprobs(const float* logits, int64_t vocab, int32_t token, int32_t top_n,
                    TokenLogprobs* lp, std::vector<int32_t>* scratch_idx);

/// The probability distribution `sample_token` draws from (after penalties, temperature and
/// truncation), as f32 [vocab] summing to 1 (zeros outside the kept set). Greedy gives a one-hot
/// row. For tests and debugging; O(vocab log vocab).
std::vector<float> sampling_distribution(const float* logits, int64_t vocab,
                                         const SamplingParams& p, const PenaltyState& penalties);

}  // namespace v4::engine
