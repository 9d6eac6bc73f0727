// The contract between the engine and the model: one step's ragged batch and its output.
// A step mixes prefill chunks and decode rows of many sequences ("plan, then run": the engine
// builds this once per step; the model derives every per-layer index array from it).
#pragma once
#include <cstdint>
#include <vector>

namespace v4::model {

/// One sequence's part of a step.
/// `seq` is a handle returned by the KV cache (`KvCache::create_sequence`); `start_pos` is the
/// number of tokens of this sequence already in the cache (positions are contiguous from 0), and
/// `tokens` are the new token ids at positions start_pos .. start_pos + tokens.size() - 1.
/// A decode row is a slice with one token. `logits_all` asks for logits at every new position
/// (golden tests, prompt logprobs); otherwise only the last new position returns logits.
struct SeqSlice {
  int32_t seq = -1;
  int64_t start_pos = 0;
  std::vector<int32_t> tokens;
  bool logits_all = false;
};

/// A ragged batch: slices of distinct sequences, in any order.
struct ForwardBatch {
  std::vector<SeqSlice> slices;
};

/// Logits of one step, f32, row-major [n_rows, vocab]. Rows follow the batch's slice order;
/// slice i owns rows [row_begin[i], row_begin[i+1]).
struct ForwardOutput {
  int64_t vocab = 0;
  std::vector<float> logits;
  std::vector<int64_t> row_begin;  // size slices + 1
};

}  // namespace v4::model
