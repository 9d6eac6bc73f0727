// The contract between the engine and the model: one step's ragged batch and its output.
// A step mixes prefill chunks and decode rows of many sequences ("plan, then run": the engine
// builds this once per step; the model derives every per-layer index array from it).
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

namespace v4::model {

/// Asks for a slice's next token to be chosen on the backend (`ops::Ops::sample`) instead of
/// returning its logits row: only the token (and logprobs when asked) is downloaded. Same meaning
/// as engine::SamplingParams for a request WITHOUT penalties (the engine keeps those on the
/// host); the draw is ops::sample_uniform(seed, step).
struct DeviceSampling {
  float temperature = 0.f;  // 0 = greedy
  int32_t top_k = 0;        // <= 0 or >= vocab = off
  float top_p = 1.f;        // (0, 1]
  float min_p = 0.f;        // [0, 1]
  uint64_t seed = 0;
  int64_t step = 0;           // index of the token being generated (0 = first)
  int32_t top_logprobs = -1;  // -1: no logprobs; 0..20: the token's logprob + that many top
};

/// One sequence's part of a step.
/// `seq` is a handle returned by the KV cache (`KvCache::create_sequence`); `start_pos` is the
/// number of tokens of this sequence already in the cache (positions are contiguous from 0), and
/// `tokens` are the new token ids at positions start_pos .. start_pos + tokens.size() - 1.
/// A decode row is a slice with one token. `logits_all` asks for logits at every new position
/// (golden tests, prompt logprobs); otherwise only the last new position returns logits.
/// `sample` (ignored with logits_all) asks for the last position's token to be sampled on the
/// backend when it can (ForwardOutput::tokens); otherwise its logits row is returned as usual.
struct SeqSlice {
  int32_t seq = -1;
  int64_t start_pos = 0;
  std::vector<int32_t> tokens;
  bool logits_all = false;
  std::optional<DeviceSampling> sample = std::nullopt;
};

/// A ragged batch: slices of distinct sequences, in any order.
struct ForwardBatch {
  std::vector<SeqSlice> slices;
};

/// Logits of one step, f32, row-major [n_rows, vocab]. Rows follow the batch's slice order;
/// slice i owns rows [row_begin[i], row_begin[i+1]). A slice sampled on the backend owns no
/// rows (row_begin[i] == row_begin[i+1]) and has its token in `tokens[i]` instead.
struct ForwardOutput {
  int64_t vocab = 0;
  std::vector<float> logits;
  std::vector<int64_t> row_begin;  // size slices + 1
  /// Empty when no slice was sampled on the backend; else one per slice: the sampled token, or
  /// -1 for a slice that returns logits rows.
  std::vector<int32_t> tokens;
  /// Raw log-softmax of sampled slices that asked (DeviceSampling::top_logprobs >= 0), else
  /// empty: token_logprob [slices] (the token's); top_tokens / top_logprobs [slices, top_n]
  /// (descending, lower id first on ties; a slice's first top_logprobs entries are valid).
  std::vector<float> token_logprob;
  int32_t top_n = 0;
  std::vector<int32_t> top_tokens;
  std::vector<float> top_logprobs;
};

}  // namespace v4::model
