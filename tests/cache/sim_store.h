// A fake tensor owner for ShadowRadix tests. It "computes" a sequence like the model would:
// the compressed entry and the SWA row of position p hold H(tokens[0..p]) (a hash of the whole
// prefix), and a compressor snapshot holds (length, H). Reading any wrong page, a dead SWA row or
// a stale snapshot therefore shows up as a mismatch. Every read the model would do is checked:
// at admission (restored state, copied tail page) and at each new position (its SWA window).
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "cache/shadow_radix.h"

namespace v4::cache::testing {

inline uint64_t mix(uint64_t h, int32_t tok) {
  uint64_t x = h ^ (uint64_t(uint32_t(tok)) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2));
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 29;
  return x | 1;  // never 0 (0 = never written)
}

class SimStore {
 public:
  /// `swa_tail` >= 0 emulates a write-back binding (PrefixCache): only the SWA rows of the last
  /// `swa_tail` positions of each step reach the pages (the rest lived in the sequence's private
  /// pool); reads of rows written in the same step are then not checked here.
  explicit SimStore(ShadowRadix& r, int64_t swa_tail = -1)
      : r_(r),
        swa_tail_(swa_tail),
        cval_(size_t(r.config().n_pages) * size_t(r.config().page_tokens), 0),
        swa_(size_t(r.config().n_swa_pages) * size_t(r.config().swa_page_tokens), 0),
        snap_(size_t(r.config().n_snapshots), {-1, 0}) {}

  struct SeqData {
    std::vector<int32_t> prompt;   // full prompt
    std::vector<uint64_t> prefix;  // prefix[p] = H(tokens[0..p])
    std::vector<int32_t> tokens;   // computed tokens so far
    std::vector<int64_t> points;   // snapshot points not reached yet (ascending)
    int64_t ring_len = 0;
    uint64_t ring = 0;
  };

  /// Admits `prompt`; on success applies the plan and checks everything a resumed prefill reads.
  /// Returns the sequence id or -1 (resource exhausted). Test failures are reported via gtest.
  int32_t admit(const std::vector<int32_t>& prompt, int64_t max_cached, int64_t* cached = nullptr) {
    auto plan = r_.admit(prompt, max_cached);
    if (!plan.ok()) {
      EXPECT_EQ(plan.status().code(), ErrorCode::kResourceExhausted) << plan.status().to_string();
      return -1;
    }
    const int64_t P = r_.config().page_tokens, Ps = r_.config().swa_page_tokens;
    const int64_t W = r_.config().window_tokens;
    const int64_t R = plan->cached_tokens;
    if (cached) *cached = R;
    SeqData d;
    d.prompt = prompt;
    d.tokens.assign(prompt.begin(), prompt.begin() + R);
    uint64_t h = 0;
    for (int64_t p = 0; p < R; ++p) d.prefix.push_back(h = mix(h, prompt[size_t(p)]));
    d.points = plan->snapshot_points;
    if (plan->has_copy) {
      const auto& c = plan->copy;
      EXPECT_EQ(c.n_tokens, R % P);
      for (int64_t off = 0; off < c.n_tokens; ++off)
        cval_[size_t(c.dst_page * P + off)] = cval_[size_t(c.src_page * P + off)];
      for (int64_t off = c.swa_begin; off < c.n_tokens; ++off) {
        const int32_t sp = r_.swa_map().page((c.src_page * P + off) / Ps);
        const int32_t dp = r_.swa_map().page((c.dst_page * P + off) / Ps);
        if (sp < 0 || dp < 0) {
          ADD_FAILURE() << "tail copy: SWA row not live at offset " << off;
          continue;
        }
        swa_[size_t(dp * Ps + off % Ps)] = swa_[size_t(sp * Ps + off % Ps)];
      }
    }
    if (plan->restore_snapshot >= 0) {
      auto [len, hv] = snap_[size_t(plan->restore_snapshot)];
      EXPECT_EQ(len, R) << "restored snapshot has the wrong length";
      EXPECT_EQ(hv, R > 0 ? d.prefix[size_t(R - 1)] : 0) << "restored snapshot is stale";
      d.ring_len = len;
      d.ring = hv;
    } else {
      EXPECT_EQ(R, 0) << "a hit without a snapshot";
    }
    // Everything a prefill starting at R reads: compressed entries [0, R) and SWA [R-W, R).
    for (int64_t p = 0; p < R; ++p) {
      const int64_t sl = r_.slot(plan->seq, p);
      if (sl < 0 || cval_[size_t(sl)] != d.prefix[size_t(p)]) {
        ADD_FAILURE() << "seq " << plan->seq << ": compressed entry of position " << p
                      << " is wrong after a hit at " << R;
        break;
      }
    }
    for (int64_t p = std::max<int64_t>(0, R - W); p < R; ++p) {
      const int64_t row = r_.swa_row(plan->seq, p);
      if (row < 0 || swa_[size_t(row)] != d.prefix[size_t(p)]) {
        ADD_FAILURE() << "seq " << plan->seq << ": SWA row of position " << p
                      << " is wrong after a hit at " << R;
        break;
      }
    }
    seqs_[plan->seq] = std::move(d);
    return plan->seq;
  }

  /// Computes the next `n` tokens (prompt first, then `gen`), stopping early at a snapshot point.
  /// Returns tokens computed, or -1 when reserve failed (kResourceExhausted).
  int64_t step(int32_t id, int64_t n, const std::vector<int32_t>& gen = {}) {
    SeqData& d = seqs_.at(id);
    const int64_t len = int64_t(d.tokens.size());
    while (!d.points.empty() && d.points.front() <= len) d.points.erase(d.points.begin());
    if (!d.points.empty()) n = std::min(n, d.points.front() - len);
    if (n <= 0) return 0;
    Status st = r_.reserve(id, n);
    if (!st.ok()) {
      EXPECT_EQ(st.code(), ErrorCode::kResourceExhausted) << st.to_string();
      return -1;
    }
    const int64_t W = r_.config().window_tokens;
    std::vector<int32_t> toks;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t p = len + i;
      const int32_t t = p < int64_t(d.prompt.size())
                            ? d.prompt[size_t(p)]
                            : (gen.empty() ? int32_t(p % 7) : gen[size_t(p) % gen.size()]);
      toks.push_back(t);
      d.tokens.push_back(t);
      d.prefix.push_back(mix(p > 0 ? d.prefix[size_t(p - 1)] : 0, t));
      // Reads of position p: its SWA window [p-W+1, p).
      for (int64_t q = std::max<int64_t>(0, p - W + 1); q < p; ++q) {
        if (swa_tail_ >= 0 && q >= len) continue;  // private copy in a write-back binding
        const int64_t row = r_.swa_row(id, q);
        if (row < 0 || swa_[size_t(row)] != d.prefix[size_t(q)]) {
          ADD_FAILURE() << "seq " << id << " at " << p << ": SWA row of " << q << " wrong";
          return 0;
        }
      }
      const int64_t sl = r_.slot(id, p), row = r_.swa_row(id, p);
      if (sl < 0 || row < 0) {
        ADD_FAILURE() << "seq " << id << ": position " << p << " not reserved";
        return 0;
      }
      cval_[size_t(sl)] = d.prefix[size_t(p)];
      if (swa_tail_ < 0 || p >= len + n - swa_tail_) swa_[size_t(row)] = d.prefix[size_t(p)];
      else swa_[size_t(row)] = 0xdeadULL;  // stale garbage: must never be read
    }
    d.ring_len = len + n;
    d.ring = d.prefix.back();
    EXPECT_TRUE(r_.commit(id, toks, swa_tail_).ok());
    if (!d.points.empty() && d.points.front() == len + n) snapshot(id);
    return n;
  }

  /// Saves the current compressor state as a boundary snapshot; false if no slot.
  bool snapshot(int32_t id) {
    SeqData& d = seqs_.at(id);
    auto s = r_.begin_snapshot(id);
    if (!s.ok()) return false;
    snap_[size_t(*s)] = {d.ring_len, d.ring};
    return true;
  }

  /// Runs the whole prompt (and `extra` generated tokens) in chunks of `chunk`.
  bool run(int32_t id, int64_t extra = 0, int64_t chunk = 1 << 30) {
    SeqData& d = seqs_.at(id);
    const int64_t target = int64_t(d.prompt.size()) + extra;
    while (int64_t(d.tokens.size()) < target) {
      const int64_t k = step(id, std::min(chunk, target - int64_t(d.tokens.size())));
      if (k < 0) return false;
      if (k == 0 && ::testing::Test::HasFailure()) return false;
    }
    return true;
  }

  int64_t finish(int32_t id, bool insert = true, bool final_snapshot = true) {
    if (insert && final_snapshot && !seqs_.at(id).tokens.empty()) snapshot(id);
    auto r = r_.finish(id, insert);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    seqs_.erase(id);
    return r.ok() ? *r : -1;
  }

  std::unordered_map<int32_t, SeqData>& seqs() { return seqs_; }

 private:
  ShadowRadix& r_;
  int64_t swa_tail_ = -1;
  std::vector<uint64_t> cval_;
  std::vector<uint64_t> swa_;
  std::vector<std::pair<int64_t, uint64_t>> snap_;
  std::unordered_map<int32_t, SeqData> seqs_;
};

}  // namespace v4::cache::testing
