// End-to-end checks of the embedded default model (models/default) against the transformers
// 5.17.0 reference data in tests/data/model/ (written by tools/export_embedded.py, see
// models/README.md), through v4serve's public APIs and the real `v4serve` binary:
//   (a) held-out perplexity / mean NLL of one full forward (logits at every position) equals
//       transformers' heldout_ppl.json within 1e-3 relative (issue 3, "Must show");
//   (b) the greedy continuations of generations.json are reproduced token by token through the
//       KV cache (prefill, then one decode step per token);
//   (c) the tokenizer (src/text) gives exactly the reference ids of heldout.txt and of every prompt;
//   (d) `v4serve generate --model models/default --prompt ... --temperature 0` exits 0 and prints
//       English words (and the reference greedy tokens).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/wait.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "model/deepseek_v4.h"
#include "ops/ops.h"
#include "text/tokenizer.h"

namespace v4 {
namespace {

const std::string kSrc = V4_SOURCE_DIR;
const std::string kModelDir = kSrc + "/models/default";
const std::string kDataDir = kSrc + "/tests/data/model";

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << "cannot open " << path;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

nlohmann::json read_json(const std::string& path) {
  return nlohmann::json::parse(read_file(path));
}

std::vector<int32_t> ids_of(const nlohmann::json& j) {
  std::vector<int32_t> v;
  for (const auto& x : j) v.push_back(x.get<int32_t>());
  return v;
}

/// Top-1 index and top-1 minus top-2 logit of one row.
struct Top2 {
  int32_t top1 = -1, top2 = -1;
  double gap = 0;
};
Top2 top2(const float* row, int64_t V) {
  Top2 t;
  for (int64_t i = 0; i < V; ++i) {
    if (t.top1 < 0 || row[i] > row[t.top1]) {
      t.top2 = t.top1;
      t.top1 = int32_t(i);
    } else if (t.top2 < 0 || row[i] > row[t.top2]) {
      t.top2 = int32_t(i);
    }
  }
  t.gap = double(row[t.top1]) - double(row[t.top2]);
  return t;
}

/// −log softmax(row)[target], in double.
double nll(const float* row, int64_t V, int32_t target) {
  double mx = row[0];
  for (int64_t i = 1; i < V; ++i) mx = std::max(mx, double(row[i]));
  double s = 0;
  for (int64_t i = 0; i < V; ++i) s += std::exp(double(row[i]) - mx);
  return -(double(row[target]) - mx - std::log(s));
}

class EmbeddedModel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ops_ = ops::make_cpu_ops().release();
    auto m = model::DeepseekV4::load(kModelDir, ops_);
    ASSERT_TRUE(m.ok()) << "loading " << kModelDir << ": " << m.status().to_string();
    model_ = std::move(m).value().release();
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
    delete ops_;
    ops_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(model_, nullptr) << "model failed to load"; }

  static std::unique_ptr<cache::KvCache> make_cache() {
    auto kv = model_->make_cache(int64_t(256) << 20, 2);
    EXPECT_TRUE(kv.ok()) << kv.status().to_string();
    return kv.ok() ? std::move(kv).value() : nullptr;
  }

  static ops::Ops* ops_;
  static model::DeepseekV4* model_;
};
ops::Ops* EmbeddedModel::ops_ = nullptr;
model::DeepseekV4* EmbeddedModel::model_ = nullptr;

// The loader reads the real-naming F32 checkpoint: six layers of the three attention kinds, hash
// MoE on layers 0-1, score MoE after, no MTP.
TEST_F(EmbeddedModel, ConfigMatchesCheckpoint) {
  const auto& c = model_->config();
  EXPECT_EQ(c.vocab_size, 4096);
  EXPECT_EQ(c.hidden_size, 192);
  ASSERT_EQ(c.num_hidden_layers, 6);
  ASSERT_EQ(c.layer_types.size(), 6u);
  EXPECT_EQ(c.layer_types[0], model::LayerKind::kSliding);
  EXPECT_EQ(c.layer_types[1], model::LayerKind::kCsa);
  EXPECT_EQ(c.layer_types[2], model::LayerKind::kHca);
  ASSERT_EQ(c.mlp_layer_types.size(), 6u);
  EXPECT_EQ(c.mlp_layer_types[0], model::MlpKind::kHashMoe);
  EXPECT_EQ(c.mlp_layer_types[1], model::MlpKind::kHashMoe);
  EXPECT_EQ(c.mlp_layer_types[2], model::MlpKind::kMoe);
  EXPECT_EQ(c.num_nextn_predict_layers, 0);
  EXPECT_EQ(c.compress_rate_csa, 4);
  EXPECT_EQ(c.compress_rate_hca, 16);
}

// (a) Held-out perplexity: one prefill over input_ids = [BOS] + text_ids with logits at every
// position; NLL of input_ids[t+1] from row t. Reference: transformers fp32 eager, one forward.
//
// The mean (and so the perplexity) must equal transformers' heldout_ppl.json within 1e-3
// relative. Per position we compare with data/heldout_nll_lowest_index_ties.json: the same
// transformers forward with only the top-k tie order pinned to "lower index first" (written by
// make_tiebreak_reference.py). Reason: the lightning indexer's scores are sums of ReLUs, so rows
// often score exactly 0.0 and at 8 of the 1,942 positions the top-16 boundary falls inside an
// exact tie (dsv4-model.md P19); torch.topk's tie order is unspecified, v4serve takes the lower
// row first. Those ties move single tokens' NLL by up to 0.11 against heldout_ppl.json's
// token_nll (and the mean by 7e-6 relative); with the tie order pinned every position agrees.
TEST_F(EmbeddedModel, HeldoutPerplexityEqualsTransformers) {
  const auto ids_j = read_json(kDataDir + "/heldout_ids.json");
  const auto ref = read_json(kDataDir + "/heldout_ppl.json");
  const auto pinned = read_json(kSrc + "/tests/integration/data/heldout_nll_lowest_index_ties.json");
  const std::vector<int32_t> ids = ids_of(ids_j.at("input_ids"));
  ASSERT_GT(ids.size(), 1000u);
  const std::vector<double> ref_tok = ref.at("token_nll").get<std::vector<double>>();
  const std::vector<double> pin_tok = pinned.at("token_nll").get<std::vector<double>>();
  ASSERT_EQ(ref_tok.size(), ids.size() - 1);
  ASSERT_EQ(pin_tok.size(), ids.size() - 1);
  ASSERT_EQ(ref.at("n_tokens").get<size_t>(), ids.size() - 1);

  auto kv = make_cache();
  ASSERT_TRUE(kv);
  auto seq = kv->create_sequence();
  ASSERT_TRUE(seq.ok()) << seq.status().to_string();
  model::ForwardBatch b;
  b.slices.push_back({*seq, 0, ids, /*logits_all=*/true});
  auto out = model_->forward(b, *kv);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  const int64_t V = model_->config().vocab_size;
  ASSERT_EQ(out->vocab, V);
  ASSERT_EQ(out->logits.size(), ids.size() * size_t(V));

  double sum = 0, max_ref_diff = 0, max_pin_diff = 0;
  size_t worst_ref = 0, worst_pin = 0;
  int n_ref_off = 0;  // positions more than 1e-3 away from heldout_ppl.json's token_nll
  for (size_t t = 0; t + 1 < ids.size(); ++t) {
    const double n = nll(out->logits.data() + t * V, V, ids[t + 1]);
    ASSERT_TRUE(std::isfinite(n)) << "position " << t;
    sum += n;
    const double dr = std::fabs(n - ref_tok[t]), dp = std::fabs(n - pin_tok[t]);
    n_ref_off += dr > 1e-3;
    if (dr > max_ref_diff) max_ref_diff = dr, worst_ref = t;
    if (dp > max_pin_diff) max_pin_diff = dp, worst_pin = t;
  }
  const double mean_nll = sum / double(ids.size() - 1);
  const double ppl = std::exp(mean_nll);
  const double ref_mean = ref.at("mean_nll").get<double>();
  const double ref_ppl = ref.at("ppl").get<double>();
  const double pin_mean = pinned.at("mean_nll").get<double>();
  std::printf("held-out: %zu tokens, mean NLL %.6f (transformers %.6f), ppl %.4f (transformers %.4f), "
              "rel diff ppl %.2e, mean NLL %.2e\n",
              ids.size() - 1, mean_nll, ref_mean, ppl, ref_ppl, std::fabs(ppl - ref_ppl) / ref_ppl,
              std::fabs(mean_nll - ref_mean) / ref_mean);
  std::printf("per token: max |dNLL| %.2e at %zu vs transformers (%d positions > 1e-3, tie order), "
              "%.2e at %zu vs transformers with pinned tie order (mean %.6f)\n",
              max_ref_diff, worst_ref, n_ref_off, max_pin_diff, worst_pin, pin_mean);
  EXPECT_LE(std::fabs(ppl - ref_ppl) / ref_ppl, 1e-3);
  EXPECT_LE(std::fabs(mean_nll - ref_mean) / ref_mean, 1e-3);
  // Every position against the pinned-tie-order reference (written with 6 decimals).
  EXPECT_LE(max_pin_diff, 1e-4) << "worst position " << worst_pin;
  EXPECT_LE(std::fabs(mean_nll - pin_mean) / pin_mean, 1e-6);
  // Against torch's own tie order only a few positions downstream of the ties may differ.
  EXPECT_LE(n_ref_off, 40);
}

// (b) Greedy continuations through the KV cache: prefill the prompt, then decode one token per
// step, each step feeding our own greedy pick (what `generate()` does).
//
// Near-ties: the entries record the smallest top-1/top-2 logit gap along the reference
// continuation. Where that gap is tiny (< 1e-2), fp32 summation-order differences may legitimately
// flip the argmax. For such an entry we allow divergence only from a position whose gap is tiny
// on: all tokens before it must be identical, at the diverging position our top-1/top-2 gap must
// be below the threshold (+ tolerance) and the reference's token must be our second choice; after
// it the continuations may differ freely (different contexts), so we stop comparing. Until the
// first divergence our context equals the reference's, so our gap at a position is the reference
// gap up to the logit tolerance; an entry reproduced in full must also show the recorded minimum
// gap. Entries without a tiny gap (the 4 of 5 plain ones) must be reproduced exactly, every token.
TEST_F(EmbeddedModel, GreedyContinuationsThroughKvCache) {
  constexpr double kTiny = 1e-2;
  constexpr double kGapTol = 2e-3;  // |our gap − reference gap| at identical contexts
  const auto gen = read_json(kDataDir + "/generations.json");
  ASSERT_GE(gen.at("generations").size(), 5u);
  const int64_t V = model_->config().vocab_size;
  int exact_entries = 0, checked_tokens = 0;
  for (const auto& e : gen.at("generations")) {
    const std::string prompt = e.at("prompt");
    SCOPED_TRACE(prompt);
    const std::vector<int32_t> ids = ids_of(e.at("ids"));
    const std::vector<int32_t> ref = ids_of(e.at("continuation_ids"));
    const double ref_min_gap = e.at("min_top1_top2_logit_margin").get<double>();
    const bool has_tiny_gap = ref_min_gap < kTiny;
    ASSERT_FALSE(ref.empty());

    auto kv = make_cache();
    ASSERT_TRUE(kv);
    auto seq = kv->create_sequence();
    ASSERT_TRUE(seq.ok());
    model::ForwardBatch b;
    b.slices.push_back({*seq, 0, ids, false});
    auto out = model_->forward(b, *kv);
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    ASSERT_EQ(out->logits.size(), size_t(V));

    std::vector<int32_t> ours;
    double our_min_gap = 1e30;
    int diverged_at = -1;
    int64_t pos = int64_t(ids.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      const Top2 t = top2(out->logits.data(), V);
      ours.push_back(t.top1);
      our_min_gap = std::min(our_min_gap, t.gap);
      ++checked_tokens;
      if (t.top1 != ref[i]) {
        diverged_at = int(i);
        break;
      }
      if (i + 1 == ref.size()) break;
      model::ForwardBatch d;
      d.slices.push_back({*seq, pos, {t.top1}, false});
      out = model_->forward(d, *kv);
      ASSERT_TRUE(out.ok()) << out.status().to_string();
      ++pos;
    }
    if (diverged_at < 0) {
      // Identical contexts all the way: our smallest gap must be the recorded one.
      EXPECT_NEAR(our_min_gap, ref_min_gap, kGapTol);
      ++exact_entries;
      std::printf("  %-55s %zu/%zu tokens identical, min gap %.6f (ref %.6f)\n",
                  ("\"" + prompt + "\"").c_str(), ref.size(), ref.size(), our_min_gap, ref_min_gap);
      continue;
    }
    // Diverged: only allowed at the first tiny-gap position of a near-tie entry.
    const size_t i = size_t(diverged_at);
    const Top2 t = top2(out->logits.data(), V);
    std::printf("  %-55s diverged at %zu (ours %d, ref %d, gap %.6f, ref min gap %.6f)\n",
                ("\"" + prompt + "\"").c_str(), i, t.top1, ref[i], t.gap, ref_min_gap);
    EXPECT_TRUE(has_tiny_gap) << "diverged at " << i << " although the reference has no near-tie";
    EXPECT_LT(t.gap, kTiny + kGapTol) << "diverged at a position with a clear winner";
    EXPECT_EQ(t.top2, ref[i]) << "reference token is not our second choice";
    // The recorded minimum gap is at most this position's gap (same context up to here).
    EXPECT_LE(ref_min_gap, t.gap + kGapTol);
  }
  std::printf("greedy: %d of %zu entries identical over all tokens, %d tokens compared\n",
              exact_entries, gen.at("generations").size(), checked_tokens);
  // Every entry whose reference has no near-tie must have been reproduced exactly (checked above);
  // make sure that is most of them, so the test cannot pass by diverging everywhere.
  EXPECT_GE(exact_entries, 4);
}

// (c) Tokenizer: src/text on models/default/tokenizer.json equals HF tokenizers' ids.
TEST(EmbeddedTokenizer, EqualsHfIds) {
  auto tok_r = text::Tokenizer::from_file(kModelDir);
  ASSERT_TRUE(tok_r.ok()) << tok_r.status().to_string();
  const auto& tok = tok_r.value();
  ASSERT_TRUE(tok.bos_id().has_value());
  EXPECT_EQ(*tok.bos_id(), 0);

  const auto ids_j = read_json(kDataDir + "/heldout_ids.json");
  const std::string heldout = read_file(kDataDir + "/heldout.txt");
  ASSERT_GT(heldout.size(), 8000u);
  const std::vector<int32_t> want = ids_of(ids_j.at("text_ids"));
  const std::vector<int32_t> got = tok.encode(heldout, false);
  ASSERT_EQ(got.size(), want.size());
  size_t first_diff = got.size();
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i]) {
      first_diff = i;
      break;
    }
  EXPECT_EQ(first_diff, got.size()) << "first differing id at " << first_diff;
  EXPECT_EQ(tok.decode(got), heldout);  // byte-level round trip

  const auto gen = read_json(kDataDir + "/generations.json");
  for (const auto& e : gen.at("generations")) {
    const std::string prompt = e.at("prompt");
    SCOPED_TRACE(prompt);
    std::vector<int32_t> mine{*tok.bos_id()};
    for (auto id : tok.encode(prompt, false)) mine.push_back(id);
    EXPECT_EQ(mine, ids_of(e.at("ids")));
    const std::vector<int32_t> cont = ids_of(e.at("continuation_ids"));
    EXPECT_EQ(tok.decode(cont), e.at("continuation_text").get<std::string>());
  }
}

/// Runs a shell command; returns (exit status, stdout).
std::pair<int, std::string> run(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return {-1, out};
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int st = pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

std::vector<std::string> words_of(const std::string& s) {
  std::vector<std::string> w;
  std::string cur;
  for (char c : s + " ") {
    if (std::isalpha(static_cast<unsigned char>(c))) {
      cur += char(std::tolower(static_cast<unsigned char>(c)));
    } else {
      if (cur.size() >= 2) w.push_back(cur);
      cur.clear();
    }
  }
  return w;
}

// (d) The real binary, as a user runs it.
TEST(EmbeddedBinary, GenerateAnswersWithEnglishWords) {
  const std::string cmd = std::string("'") + V4_BINARY + "' generate --model '" + kModelDir +
                          "' --prompt \"The Python interpreter\" --max-new-tokens 16 --temperature 0"
                          " 2>/dev/null";
  auto [rc, out] = run(cmd);
  ASSERT_EQ(rc, 0) << cmd << "\n" << out;
  // stdout: the decoded continuation, then a "tokens: a,b,c" line.
  const size_t tpos = out.rfind("tokens: ");
  ASSERT_NE(tpos, std::string::npos) << out;
  const std::string text = out.substr(0, tpos);
  std::printf("generate printed: %s", out.c_str());

  const std::vector<std::string> vocab_words = words_of(read_file(kDataDir + "/heldout.txt"));
  const std::set<std::string> english(vocab_words.begin(), vocab_words.end());
  ASSERT_GT(english.size(), 300u);
  const auto words = words_of(text);
  int known = 0;
  for (const auto& w : words) known += english.count(w) ? 1 : 0;
  EXPECT_GE(known, 3) << "too few English words in: " << text;
  // Most of what it prints is words of the held-out text's vocabulary, not noise.
  EXPECT_GE(2 * known, int(words.size())) << text;

  // And they are the reference greedy tokens (generations.json entry "The Python interpreter",
  // whose smallest top-1/top-2 gap is 0.07: no near-tie).
  const auto gen = read_json(kDataDir + "/generations.json");
  std::vector<int32_t> want;
  for (const auto& e : gen.at("generations"))
    if (e.at("prompt") == "The Python interpreter") want = ids_of(e.at("continuation_ids"));
  ASSERT_GE(want.size(), 16u);
  want.resize(16);
  std::vector<int32_t> got;
  std::stringstream ss(out.substr(tpos + 8));
  std::string item;
  while (std::getline(ss, item, ',')) got.push_back(std::stoi(item));
  EXPECT_EQ(got, want);
}

}  // namespace
}  // namespace v4
