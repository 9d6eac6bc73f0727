// Shared helpers for tests/model: fixture discovery, golden loading, comparisons.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <filesystem>
#include <string>
#include <vector>

#include "model/checkpoint.h"
#include "model/deepseek_v4.h"

namespace v4::model::testing {

/// Every tests/fixtures/<name>/ directory holding a golden.safetensors (sorted).
inline std::vector<std::string> fixture_dirs() {
  std::vector<std::string> out;
  const std::filesystem::path root = std::filesystem::path(V4_SOURCE_DIR) / "tests" / "fixtures";
  std::error_code ec;
  for (auto& e : std::filesystem::directory_iterator(root, ec))
    if (e.is_directory() && std::filesystem::exists(e.path() / "golden.safetensors") &&
        std::filesystem::exists(e.path() / "config.json"))
      out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

/// n token ids drawn uniformly from [0, vocab) by a std::mt19937 seeded with `seed`.
inline std::vector<int32_t> random_ids(int64_t vocab, int n, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = int32_t(g() % uint32_t(vocab));
  return v;
}

/// First bitwise difference of two logits arrays of rows of V floats ("" if identical): the row,
/// the logit and both values.
inline std::string first_diff(const std::vector<float>& a, const std::vector<float>& b, int64_t V) {
  if (a.size() != b.size())
    return "sizes " + std::to_string(a.size()) + " vs " + std::to_string(b.size());
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "row %lld logit %lld: %.9g vs %.9g",
                    (long long)(int64_t(i) / V), (long long)(int64_t(i) % V), a[i], b[i]);
      return buf;
    }
  return "";
}

/// The oracle outputs of one fixture (tests/fixtures/README / testing.md).
struct Golden {
  std::vector<int32_t> prompt_ids, tokens, chunk_sizes;
  std::vector<float> prefill_logits, decode_logits, chunked_logits;
  int64_t vocab = 0;
};

inline Result<Golden> load_golden(const std::string& dir) {
  V4_ASSIGN_OR_RETURN(auto f, Checkpoint::open_file(dir + "/golden.safetensors"));
  Golden g;
  auto ints = [&](const std::string& n, std::vector<int32_t>* out) -> Status {
    const TensorInfo* t = f.find(n);
    if (!t) return make_error(ErrorCode::kNotFound, "golden: missing {}", n);
    V4_ASSIGN_OR_RETURN(*out, f.read_i32(n, t->shape));
    return Status::Ok();
  };
  auto floats = [&](const std::string& n, std::vector<float>* out) -> Status {
    const TensorInfo* t = f.find(n);
    if (!t) return make_error(ErrorCode::kNotFound, "golden: missing {}", n);
    g.vocab = t->shape.back();
    V4_ASSIGN_OR_RETURN(*out, f.read_f32(n, t->shape));
    return Status::Ok();
  };
  V4_RETURN_IF_ERROR(ints("prompt_ids", &g.prompt_ids));
  V4_RETURN_IF_ERROR(ints("tokens", &g.tokens));
  V4_RETURN_IF_ERROR(ints("chunk_sizes", &g.chunk_sizes));
  V4_RETURN_IF_ERROR(floats("prefill_logits", &g.prefill_logits));
  V4_RETURN_IF_ERROR(floats("decode_logits", &g.decode_logits));
  V4_RETURN_IF_ERROR(floats("chunked_logits", &g.chunked_logits));
  return g;
}

/// max|a − b| / max|b| over all values (b = reference).
inline double rel_err(const float* a, const float* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    num = std::max(num, double(std::fabs(a[i] - b[i])));
    den = std::max(den, double(std::fabs(b[i])));
  }
  return den > 0 ? num / den : num;
}

inline int32_t argmax(const float* v, int64_t n) {
  return int32_t(std::max_element(v, v + n) - v);
}

/// Logits of `g`'s prompt (every position; prefill) and of its teacher-forced decode (the last
/// prefill row, then one row per fed golden token) with KV pools of `dt` and indexer keys as
/// `index` asks (--index-cache-dtype; a fresh 96 MiB cache). Errors: the cache or a forward step
/// failing.
inline Status golden_logits(DeepseekV4& m, const Golden& g, KvDtype dt, std::vector<float>* prefill,
                            std::vector<float>* decode,
                            IndexCacheDtype index = IndexCacheDtype::kAuto) {
  const int64_t V = m.config().vocab_size;
  auto kv = m.make_cache(int64_t(96) << 20, 1, 0, 0, dt, index);
  if (!kv.ok()) return kv.status();
  auto s = (*kv)->create_sequence();
  if (!s.ok()) return s.status();
  ForwardBatch b;
  b.slices.push_back({*s, 0, g.prompt_ids, true});
  auto out = m.forward(b, **kv);
  if (!out.ok()) return out.status();
  *prefill = out->logits;
  decode->assign(prefill->end() - V, prefill->end());
  int64_t pos = int64_t(g.prompt_ids.size());
  for (size_t i = 1; i < g.tokens.size(); ++i) {
    ForwardBatch d;
    d.slices.push_back({*s, pos++, {g.tokens[i - 1]}, false});
    auto o = m.forward(d, **kv);
    if (!o.ok()) return o.status();
    decode->insert(decode->end(), o->logits.begin(), o->logits.end());
  }
  return Status::Ok();
}

}  // namespace v4::model::testing
