// A deterministic fake Executor for scheduler tests only (lives under tests/, never linked into
// the CLI). Logits at a position are a pure function of the sequence's tokens up to and
// including that position, so any correct batching/chunking/preemption gives the same outputs
// as running a request alone. It keeps a real per-sequence "cache" (the tokens) and checks the
// scheduler's contract: start_pos equals the cached length, sequences are distinct in a batch,
// and pages never exceed the pools' capacity.
#pragma once
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "engine/executor.h"

namespace v4::engine::testing {

inline uint64_t fake_mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// Hash of a prefix after appending `token` to a prefix hashed `h`.
inline uint64_t fake_extend(uint64_t h, int32_t token) {
  return fake_mix(h ^ uint64_t(uint32_t(token)) * 0x100000001B3ull);
}

/// Logits row for a prefix hash: values in [-4, 4).
inline void fake_logits(uint64_t h, int64_t vocab, float* out) {
  for (int64_t v = 0; v < vocab; ++v)
    out[v] = float(double(fake_mix(h + uint64_t(v) * 0x632BE59BD9B4E019ull) >> 40) /
                       double(1ull << 24) * 8.0 -
                   4.0);
}

/// Greedy continuation computed straight from the logits function (no scheduler).
inline std::vector<int32_t> fake_greedy(const std::vector<int32_t>& prompt, int64_t vocab,
                                        int64_t n_new) {
  uint64_t h = 0;
  for (int32_t t : prompt) h = fake_extend(h, t);
  std::vector<int32_t> out;
  std::vector<float> row(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < n_new; ++i) {
    fake_logits(h, vocab, row.data());
    int32_t best = int32_t(std::max_element(row.begin(), row.end()) - row.begin());
    out.push_back(best);
    h = fake_extend(h, best);
  }
  return out;
}

struct FakeConfig {
  int64_t vocab = 97;
  int64_t max_context = 4096;
  int64_t page_tokens = 16;
  int64_t kv_pages = 1024;
  int64_t state_pages = 64;  // one page per live non-empty sequence (like a compressor ring)
  int32_t max_sequences = 256;
  int64_t step_delay_us = 0;   // sleep in every forward (to give other threads time in tests)
  bool prefix_cache = false;   // keep ended sequences' tokens; start new ones at the longest match
  int64_t snapshot_every = 0;  // with prefix_cache: snapshot points at multiples of this
  int64_t fail_at_forward = -1;  // the forward call with this index (0-based) returns kInternal
};

class FakeExecutor : public Executor {
 public:
  explicit FakeExecutor(FakeConfig c = {}) : c_(c) {}

  int64_t vocab_size() const override { return c_.vocab; }
  int64_t max_context() const override { return c_.max_context; }
  std::vector<PoolSpec> pools() const override {
    return {{"kv", c_.kv_pages, c_.page_tokens}, {"state", c_.state_pages, 0}};
  }
  std::vector<int64_t> pages_for(int64_t n) const override {
    return {(n + c_.page_tokens - 1) / c_.page_tokens, n > 0 ? 1 : 0};
  }
  std::vector<PoolUsage> pool_usage() const override {
    int64_t kv = 0, st = 0;
    for (const auto& [id, s] : seqs_) {
      auto p = pages_for(int64_t(s.tokens.size()));
      kv += p[0];
      st += p[1];
    }
    return {{"kv", kv, c_.kv_pages}, {"state", st, c_.state_pages}};
  }
  Result<int32_t> create_sequence() override {
    if (int32_t(seqs_.size()) >= c_.max_sequences)
      return make_error(ErrorCode::kResourceExhausted, "fake: no sequence slot");
    int32_t id = next_++;
    seqs_[id] = {};
    return id;
  }
  void free_sequence(int32_t seq) override { seqs_.erase(seq); }

  Result<SequenceStart> start_sequence(std::span<const int32_t> tokens,
                                       int64_t max_cached) override {
    auto id = create_sequence();
    if (!id.ok()) return id.status();
    SequenceStart st;
    st.seq = *id;
    if (!c_.prefix_cache) return st;
    size_t best = 0;
    const std::vector<int32_t>* from = nullptr;
    for (const auto& k : kept_) {
      size_t l = 0;
      while (l < k.size() && l + 1 < tokens.size() && int64_t(l) < max_cached && k[l] == tokens[l])
        ++l;
      if (l > best) best = l, from = &k;
    }
    Seq& s = seqs_[*id];
    for (size_t i = 0; i < best; ++i) {
      s.tokens.push_back((*from)[i]);
      s.hashes.push_back(fake_extend(s.hashes.empty() ? 0 : s.hashes.back(), (*from)[i]));
    }
    st.cached_tokens = int64_t(best);
    if (c_.snapshot_every > 0)
      for (int64_t p = c_.snapshot_every; p < int64_t(tokens.size()); p += c_.snapshot_every)
        st.snapshot_points.push_back(p);
    return st;
  }
  void end_sequence(int32_t seq, SequenceEnd how, std::span<const int32_t> computed) override {
    auto it = seqs_.find(seq);
    if (c_.prefix_cache && it != seqs_.end() &&
        (how == SequenceEnd::kFinished || how == SequenceEnd::kPreempted)) {
      EXPECT_EQ(it->second.tokens, std::vector<int32_t>(computed.begin(), computed.end()));
      kept_.emplace_back(computed.begin(), computed.end());
    }
    free_sequence(seq);
  }

  Result<model::ForwardOutput> forward(const model::ForwardBatch& batch) override {
    if (c_.step_delay_us > 0)
      std::this_thread::sleep_for(std::chrono::microseconds(c_.step_delay_us));
    if (n_forward_++ == c_.fail_at_forward)
      return make_error(ErrorCode::kInternal, "fake: injected failure");
    model::ForwardOutput out;
    out.vocab = c_.vocab;
    out.row_begin.push_back(0);
    int64_t n_tokens = 0;
    std::vector<int32_t> seen;
    for (const auto& sl : batch.slices) {
      auto it = seqs_.find(sl.seq);
      if (it == seqs_.end())
        return make_error(ErrorCode::kInvalidArgument, "fake: unknown sequence {}", sl.seq);
      if (std::find(seen.begin(), seen.end(), sl.seq) != seen.end())
        return make_error(ErrorCode::kInvalidArgument, "fake: sequence {} twice", sl.seq);
      seen.push_back(sl.seq);
      Seq& s = it->second;
      if (sl.start_pos != int64_t(s.tokens.size()))
        return make_error(ErrorCode::kInvalidArgument, "fake: start_pos {} but {} cached",
                          sl.start_pos, s.tokens.size());
      if (sl.tokens.empty()) return make_error(ErrorCode::kInvalidArgument, "fake: empty slice");
      n_tokens += int64_t(sl.tokens.size());
      slices.push_back({sl.seq, sl.start_pos, int64_t(sl.tokens.size())});
      for (int32_t t : sl.tokens) {
        if (t < 0 || t >= c_.vocab)
          return make_error(ErrorCode::kInvalidArgument, "fake: token {} out of range", t);
        s.tokens.push_back(t);
        s.hashes.push_back(fake_extend(s.hashes.empty() ? 0 : s.hashes.back(), t));
        if (sl.logits_all) emit_row(s.hashes.back(), out);
      }
      if (!sl.logits_all) emit_row(s.hashes.back(), out);
      out.row_begin.push_back(int64_t(out.logits.size()) / c_.vocab);
    }
    auto use = pool_usage();
    for (const auto& u : use)
      if (u.used_pages > u.capacity_pages)
        return make_error(ErrorCode::kResourceExhausted, "fake: pool {} overflow {}/{}", u.name,
                          u.used_pages, u.capacity_pages);
    steps.push_back({n_tokens, int32_t(batch.slices.size())});
    return out;
  }

  struct Step {
    int64_t n_tokens;
    int32_t n_slices;
  };
  std::vector<Step> steps;  // one per forward call
  struct SliceLog {
    int32_t seq;
    int64_t start_pos, n_tokens;
  };
  std::vector<SliceLog> slices;  // every slice ever run
  int64_t live_sequences() const { return int64_t(seqs_.size()); }

 private:
  struct Seq {
    std::vector<int32_t> tokens;
    std::vector<uint64_t> hashes;
  };
  void emit_row(uint64_t h, model::ForwardOutput& out) {
    size_t o = out.logits.size();
    out.logits.resize(o + size_t(c_.vocab));
    fake_logits(h, c_.vocab, out.logits.data() + o);
  }
  FakeConfig c_;
  std::map<int32_t, Seq> seqs_;
  std::vector<std::vector<int32_t>> kept_;
  int64_t n_forward_ = 0;
  int32_t next_ = 0;
};

}  // namespace v4::engine::testing
