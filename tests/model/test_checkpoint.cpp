// Checkpoint loading: quantized formats, the three naming schemes, and bad checkpoints (missing
// tensor, wrong shape, truncated file, bad JSON header, unknown dtype, unsupported model_type),
// each giving a one-line error that names the problem.
#include <gtest/gtest.h>

#include <unistd.h>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>

#include "base/dtype.h"
#include "model/checkpoint.h"
#include "model/deepseek_v4.h"
#include "model/safetensors_writer.h"
#include "model_test_util.h"
#include "ops/ops.h"

namespace v4::model {
namespace {
namespace fs = std::filesystem;

// A fresh temp dir per test, removed at the end.
struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() /
           ("v4model-" + std::to_string(::getpid()) + "-" + std::to_string(counter()++));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  static int& counter() {
    static int c = 0;
    return c;
  }
  std::string str() const { return path.string(); }
};

// The fp32 fixture with transformers' mixed names and per-expert tensors.
std::string first_fixture() {
  for (const auto& d : testing::fixture_dirs())
    if (fs::path(d).filename() == "tiny-kinds-fp32") return d;
  return std::string();
}

// All tensors of a checkpoint dir as WriteTensors, under their stored names.
std::vector<WriteTensor> read_all(const std::string& dir) {
  auto ck = Checkpoint::open(dir);
  EXPECT_TRUE(ck.ok()) << ck.status().to_string();
  std::vector<WriteTensor> out;
  if (!ck.ok()) return out;
  for (const auto& [off, t] : ck->tensors())
    out.push_back({t.name, t.dtype, t.shape, std::vector<uint8_t>(t.data, t.data + t.bytes)});
  return out;
}

// Copies config.json of `src` and writes `tensors` as model.safetensors into `dst`.
void write_checkpoint(const std::string& src, const std::string& dst,
                      const std::vector<WriteTensor>& tensors) {
  fs::copy_file(src + "/config.json", dst + "/config.json", fs::copy_options::overwrite_existing);
  ASSERT_TRUE(write_safetensors(dst + "/model.safetensors", tensors).ok());
}

void write_raw(const std::string& path, const std::string& header, size_t data_bytes) {
  std::ofstream out(path, std::ios::binary);
  const uint64_t n = header.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out.write(header.data(), std::streamsize(header.size()));
  std::string zeros(data_bytes, '\0');
  out.write(zeros.data(), std::streamsize(zeros.size()));
}

void expect_one_line(const Status& s, const std::string& needle) {
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find(needle), std::string::npos) << "message: " << s.message();
  EXPECT_EQ(s.message().find('\n'), std::string::npos) << s.message();
}

TEST(Checkpoint, NameMappingAllSchemes) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"model.embed_tokens.weight", "embed.weight"},
      {"lm_head.weight", "head.weight"},
      {"head.weight", "head.weight"},
      {"model.hc_head.hc_fn", "hc_head_fn"},
      {"model.layers.3.input_layernorm.weight", "layers.3.attn_norm.weight"},
      {"model.layers.3.ffn_hc.base", "layers.3.hc_ffn_base"},
      {"model.layers.3.self_attn.q_a_proj.weight", "layers.3.attn.wq_a.weight"},
      {"model.layers.3.self_attn.q_a_proj.weight_scale_inv", "layers.3.attn.wq_a.scale"},
      {"model.layers.3.self_attn.sinks", "layers.3.attn.attn_sink"},
      {"model.layers.3.self_attn.kv_norm.weight", "layers.3.attn.kv_norm.weight"},
      {"model.layers.3.attn.norm.weight", "layers.3.attn.kv_norm.weight"},
      {"model.layers.3.self_attn.compressor.position_bias", "layers.3.attn.compressor.ape"},
      {"model.layers.3.self_attn.compressor.kv_norm.weight",
       "layers.3.attn.compressor.norm.weight"},
      {"model.layers.3.self_attn.compressor.indexer.gate_proj.weight",
       "layers.3.attn.indexer.compressor.wgate.weight"},
      {"model.layers.3.self_attn.compressor.indexer.q_b_proj.weight",
       "layers.3.attn.indexer.wq_b.weight"},
      {"model.layers.3.self_attn.compressor.indexer.scorer.weights_proj.weight",
       "layers.3.attn.indexer.weights_proj.weight"},
      {"model.layers.3.mlp.gate.e_score_correction_bias", "layers.3.ffn.gate.bias"},
      {"model.layers.3.mlp.shared_experts.up_proj.weight", "layers.3.ffn.shared_experts.w3.weight"},
      {"model.layers.3.mlp.experts.gate_up_proj", "layers.3.ffn.experts.gate_up_proj"},
      {"layers.3.ffn.experts.7.w2.scale", "layers.3.ffn.experts.7.w2.scale"},
      {"mtp.0.e_proj.weight", "mtp.0.e_proj.weight"},
  };
  for (const auto& [in, want] : cases) EXPECT_EQ(to_official_name(in), want) << in;
}

// from_official_name inverts to_official_name: every tensor of every fixture (official, mixed
// and transformers-internal saves) maps back to the name stored in its file.
TEST(Checkpoint, OfficialNamesMapBackToStoredNames) {
  std::set<NamingScheme> schemes;
  for (const auto& dir : testing::fixture_dirs()) {
    auto ck = Checkpoint::open(dir);
    ASSERT_TRUE(ck.ok()) << ck.status().to_string();
    schemes.insert(ck->scheme());
    for (const auto& [off, t] : ck->tensors())
      EXPECT_EQ(from_official_name(off, ck->scheme()), t.name) << dir << ": " << off;
  }
  EXPECT_EQ(schemes.size(), 3u) << "the fixtures cover all three naming schemes";
  EXPECT_EQ(from_official_name("layers.3.attn.wq_a.scale", NamingScheme::kHfInternal),
            "model.layers.3.self_attn.q_a_proj.scale");
  EXPECT_EQ(from_official_name("layers.3.attn.kv_norm.weight", NamingScheme::kHfMixed),
            "model.layers.3.attn.norm.weight");
  EXPECT_EQ(from_official_name("head.weight", NamingScheme::kHfInternal), "lm_head.weight");
}

TEST(Checkpoint, DecodesFp8BlockScalesAndFp4) {
  TempDir tmp;
  std::mt19937 g(3);
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  // FP8 [130, 200] with a 2×2 grid of 128×128 blocks, ue8m0 scales.
  const int64_t O = 130, I = 200;
  std::vector<uint8_t> q(O * I);
  std::vector<float> fp8_val(O * I);
  for (int64_t i = 0; i < O * I; ++i) {
    q[i] = f32_to_fp8e4m3(u(g));
    fp8_val[i] = fp8e4m3_to_f32(q[i]);
  }
  const uint8_t sc[4] = {127, 128, 126, 130};  // 1, 2, 0.5, 8
  // FP4 [4, 64]: stored [4, 32], scales [4, 2] (one per 32 inputs), as F32 containers.
  std::vector<uint8_t> p4(4 * 32);
  for (auto& b : p4) b = uint8_t(g() & 0xff);
  const std::vector<float> s4 = {1, 2, 0.25f, 4, 1, 1, 8, 0.5f};
  std::vector<WriteTensor> ts = {
      {"w.weight", DType::kF8E4M3, {O, I}, q},
      {"w.scale", DType::kF8E8M0, {2, 2}, {sc, sc + 4}},
      {"e.weight", DType::kI8, {4, 32}, p4},
      make_f32_tensor("e.scale", {4, 2}, s4),
  };
  ASSERT_TRUE(write_safetensors(tmp.str() + "/model.safetensors", ts).ok());
  auto ck = Checkpoint::open(tmp.str());
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  auto w = ck->read_f32("w.weight", {O, I});
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  const float scale_of[2][2] = {{1, 2}, {0.5f, 8}};
  for (int64_t i = 0; i < O; ++i)
    for (int64_t j = 0; j < I; ++j)
      ASSERT_EQ((*w)[i * I + j], fp8_val[i * I + j] * scale_of[i / 128][j / 128]) << i << "," << j;
  auto e = ck->read_f32("e.weight", {4, 64});
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 64; ++c) {
      const uint8_t byte = p4[r * 32 + c / 2];
      const float want = fp4e2m1_to_f32(c % 2 ? byte >> 4 : byte & 0xf) * s4[r * 2 + c / 32];
      ASSERT_EQ((*e)[r * 64 + c], want) << r << "," << c;
    }
  // Wrong logical shape for the packed FP4 tensor names expected vs found.
  auto bad = ck->read_f32("e.weight", {4, 32});
  ASSERT_FALSE(bad.ok());
  expect_one_line(bad.status(), "e.weight");
  EXPECT_NE(bad.status().message().find("expected shape [4, 16]"), std::string::npos)
      << bad.status().message();
  EXPECT_NE(bad.status().message().find("found I8 [4, 32]"), std::string::npos)
      << bad.status().message();
}

// Renaming a fixture to transformers' internal names (fused experts) gives identical logits.
TEST(Checkpoint, HfInternalNamesGiveIdenticalLogits) {
  const std::string fx = first_fixture();
  ASSERT_FALSE(fx.empty());
  auto cfg = ModelConfig::load(fx);
  ASSERT_TRUE(cfg.ok());
  auto ck = Checkpoint::open(fx);
  ASSERT_TRUE(ck.ok());
  const int64_t E = cfg->n_routed_experts, Im = cfg->moe_intermediate_size, D = cfg->hidden_size;
  auto internal = [](std::string n) {
    static const std::vector<std::pair<std::string, std::string>> kRep = {
        {"attn.indexer.compressor.", "self_attn.compressor.indexer."},
        {"attn.indexer.wq_b.", "self_attn.compressor.indexer.q_b_proj."},
        {"attn.indexer.weights_proj.", "self_attn.compressor.indexer.scorer.weights_proj."},
        {"attn.compressor.", "self_attn.compressor."},
        {"attn.wq_a.", "self_attn.q_a_proj."},
        {"attn.q_norm.", "self_attn.q_a_norm."},
        {"attn.wq_b.", "self_attn.q_b_proj."},
        {"attn.wkv.", "self_attn.kv_proj."},
        {"attn.kv_norm.", "self_attn.kv_norm."},
        {"attn.wo_a.", "self_attn.o_a_proj."},
        {"attn.wo_b.", "self_attn.o_b_proj."},
        {"attn.attn_sink", "self_attn.sinks"},
        {"attn_norm.", "input_layernorm."},
        {"ffn_norm.", "post_attention_layernorm."},
        {"hc_attn_", "attn_hc."},
        {"hc_ffn_", "ffn_hc."},
        {"ffn.gate.bias", "mlp.gate.e_score_correction_bias"},
        {"ffn.gate.", "mlp.gate."},
        {"ffn.shared_experts.w1.", "mlp.shared_experts.gate_proj."},
        {"ffn.shared_experts.w3.", "mlp.shared_experts.up_proj."},
        {"ffn.shared_experts.w2.", "mlp.shared_experts.down_proj."},
    };
    for (auto& [a, b] : kRep) {
      const auto p = n.find(a);
      if (p != std::string::npos) {
        n.replace(p, a.size(), b);
        break;
      }
    }
    // compressor members
    for (auto [a, b] : std::vector<std::pair<std::string, std::string>>{
             {"compressor.wkv.", "compressor.kv_proj."},
             {"compressor.wgate.", "compressor.gate_proj."},
             {"compressor.norm.", "compressor.kv_norm."},
             {"compressor.ape", "compressor.position_bias"},
             {"indexer.wkv.", "indexer.kv_proj."},
             {"indexer.wgate.", "indexer.gate_proj."},
             {"indexer.norm.", "indexer.kv_norm."},
             {"indexer.ape", "indexer.position_bias"}}) {
      const auto p = n.find(a);
      if (p != std::string::npos) n.replace(p, a.size(), b);
    }
    if (n == "embed.weight") return std::string("model.embed_tokens.weight");
    if (n == "head.weight") return std::string("lm_head.weight");
    if (n.rfind("hc_head_", 0) == 0) return "model.hc_head.hc_" + n.substr(8);
    return "model." + n;
  };
  std::vector<WriteTensor> out;
  for (const auto& [off, t] : ck->tensors()) {
    if (off.find(".ffn.experts.") != std::string::npos) continue;
    out.push_back(
        {internal(off), t.dtype, t.shape, std::vector<uint8_t>(t.data, t.data + t.bytes)});
  }
  for (int l = 0; l < cfg->num_hidden_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".ffn.experts.";
    std::vector<float> gu, dn;
    for (int64_t e = 0; e < E; ++e) {
      auto w1 = ck->read_f32(p + std::to_string(e) + ".w1.weight", {Im, D});
      auto w3 = ck->read_f32(p + std::to_string(e) + ".w3.weight", {Im, D});
      auto w2 = ck->read_f32(p + std::to_string(e) + ".w2.weight", {D, Im});
      ASSERT_TRUE(w1.ok() && w3.ok() && w2.ok());
      gu.insert(gu.end(), w1->begin(), w1->end());
      gu.insert(gu.end(), w3->begin(), w3->end());
      dn.insert(dn.end(), w2->begin(), w2->end());
    }
    out.push_back(make_f32_tensor("model.layers." + std::to_string(l) + ".mlp.experts.gate_up_proj",
                                  {E, 2 * Im, D}, gu));
    out.push_back(make_f32_tensor("model.layers." + std::to_string(l) + ".mlp.experts.down_proj",
                                  {E, D, Im}, dn));
  }
  TempDir tmp;
  write_checkpoint(fx, tmp.str(), out);
  auto ck2 = Checkpoint::open(tmp.str());
  ASSERT_TRUE(ck2.ok()) << ck2.status().to_string();
  EXPECT_EQ(ck2->scheme(), NamingScheme::kHfInternal);

  auto ops = ops::make_cpu_ops();
  auto run = [&](const std::string& dir) {
    auto m = DeepseekV4::load(dir, ops.get());
    EXPECT_TRUE(m.ok()) << m.status().to_string();
    if (!m.ok()) return std::vector<float>();
    auto kv = (*m)->make_cache(int64_t(32) << 20, 1);
    EXPECT_TRUE(kv.ok());
    auto seq = (*kv)->create_sequence();
    ForwardBatch b;
    std::vector<int32_t> prompt(40);
    for (int i = 0; i < 40; ++i) prompt[i] = (i * 37 + 11) % int(cfg->vocab_size);
    b.slices.push_back({*seq, 0, prompt, true});
    auto r = (*m)->forward(b, **kv);
    EXPECT_TRUE(r.ok());
    return r.ok() ? r->logits : std::vector<float>();
  };
  const auto a = run(fx), b = run(tmp.str());
  ASSERT_FALSE(a.empty());
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

TEST(Checkpoint, MissingTensor) {
  const std::string fx = first_fixture();
  ASSERT_FALSE(fx.empty());
  auto ts = read_all(fx);
  const std::string victim_official = "layers.1.attn.wq_b.weight";
  std::string victim;
  for (size_t i = 0; i < ts.size(); ++i)
    if (to_official_name(ts[i].name) == victim_official) {
      victim = ts[i].name;
      ts.erase(ts.begin() + long(i));
      break;
    }
  ASSERT_FALSE(victim.empty());
  TempDir tmp;
  write_checkpoint(fx, tmp.str(), ts);
  auto ops = ops::make_cpu_ops();
  auto m = DeepseekV4::load(tmp.str(), ops.get());
  ASSERT_FALSE(m.ok());
  // The name the checkpoint would have stored (mixed save: `model.` prefix), the directory, and
  // the official name the loader asked for.
  expect_one_line(m.status(), tmp.str() + ": missing tensor '" + victim + "'");
  EXPECT_EQ(victim, "model.layers.1.attn.wq_b.weight");
  expect_one_line(m.status(), "official name 'layers.1.attn.wq_b.weight'");
}

// A transformers-internal checkpoint (tiny-bf16) missing a tensor: the error names the internal
// name that was expected (`self_attn.q_a_proj`), not only v4serve's `attn.wq_a`.
TEST(Checkpoint, MissingTensorNamedInTheCheckpointsScheme) {
  std::string fx;
  for (const auto& d : testing::fixture_dirs())
    if (fs::path(d).filename() == "tiny-bf16") fx = d;
  ASSERT_FALSE(fx.empty());
  auto ts = read_all(fx);
  const std::string victim = "model.layers.0.self_attn.q_a_proj.weight";
  const auto n0 = ts.size();
  ts.erase(std::remove_if(ts.begin(), ts.end(), [&](const WriteTensor& t) { return t.name == victim; }),
           ts.end());
  ASSERT_EQ(ts.size() + 1, n0) << "fixture lacks " << victim;
  TempDir tmp;
  write_checkpoint(fx, tmp.str(), ts);
  auto ck = Checkpoint::open(tmp.str());
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  ASSERT_EQ(ck->scheme(), NamingScheme::kHfInternal);
  EXPECT_EQ(ck->stored_name("layers.0.attn.wq_a.weight"), victim);
  auto ops = ops::make_cpu_ops();
  auto m = DeepseekV4::load(tmp.str(), ops.get());
  ASSERT_FALSE(m.ok());
  expect_one_line(m.status(), tmp.str() + ": missing tensor '" + victim + "'");
  expect_one_line(m.status(), "transformers internal naming");
  expect_one_line(m.status(), "'layers.0.attn.wq_a.weight'");
  EXPECT_EQ(m.status().code(), ErrorCode::kNotFound);
}

TEST(Checkpoint, WrongShape) {
  const std::string fx = first_fixture();
  ASSERT_FALSE(fx.empty());
  auto ts = read_all(fx);
  std::string victim;
  for (auto& t : ts)
    if (to_official_name(t.name) == "layers.0.attn.wkv.weight") {
      victim = t.name;
      t.shape = {t.shape[1], t.shape[0]};  // transposed: same bytes, wrong shape
    }
  ASSERT_FALSE(victim.empty());
  TempDir tmp;
  write_checkpoint(fx, tmp.str(), ts);
  auto ops = ops::make_cpu_ops();
  auto m = DeepseekV4::load(tmp.str(), ops.get());
  ASSERT_FALSE(m.ok());
  expect_one_line(m.status(), "tensor '" + victim + "': expected shape [");
  EXPECT_NE(m.status().message().find("model.safetensors"), std::string::npos)
      << m.status().message();
  EXPECT_NE(m.status().message().find(", found F"), std::string::npos) << m.status().message();
}

TEST(Checkpoint, HashTableEntryOutOfRange) {
  const std::string fx = first_fixture();
  ASSERT_FALSE(fx.empty());
  auto ts = read_all(fx);
  bool found = false;
  for (auto& t : ts)
    if (to_official_name(t.name) == "layers.0.ffn.gate.tid2eid") {
      ASSERT_EQ(t.dtype, DType::kI64);
      const int64_t bad = 99;
      std::memcpy(t.bytes.data() + 8 * 5, &bad, 8);
      found = true;
    }
  ASSERT_TRUE(found);
  TempDir tmp;
  write_checkpoint(fx, tmp.str(), ts);
  auto ops = ops::make_cpu_ops();
  auto m = DeepseekV4::load(tmp.str(), ops.get());
  expect_one_line(m.status(), "gate.tid2eid': entry 5 = 99 outside [0, 4)");
}

TEST(Checkpoint, TruncatedFile) {
  const std::string fx = first_fixture();
  ASSERT_FALSE(fx.empty());
  TempDir tmp;
  fs::copy_file(fx + "/config.json", tmp.str() + "/config.json");
  const std::string dst = tmp.str() + "/model.safetensors";
  fs::copy_file(fx + "/model.safetensors", dst);
  fs::resize_file(dst, fs::file_size(dst) - 1000);
  auto ck = Checkpoint::open(tmp.str());
  ASSERT_FALSE(ck.ok());
  expect_one_line(ck.status(), "truncated file");
  EXPECT_NE(ck.status().message().find(dst), std::string::npos);
  // Shorter than the header itself.
  fs::resize_file(dst, 100);
  ck = Checkpoint::open(tmp.str());
  expect_one_line(ck.status(), "truncated file: header length");
  fs::resize_file(dst, 3);
  ck = Checkpoint::open(tmp.str());
  expect_one_line(ck.status(), "truncated file (3 bytes");
}

// A header that is not JSON is reported as such (with the parser's message and the file), not as
// a truncated file; so is a header that is JSON but not an object.
TEST(Checkpoint, BadJsonHeader) {
  TempDir tmp;
  const std::string f = tmp.str() + "/model.safetensors";
  write_raw(f, "{\"a\": {\"dtype\": \"F32\", ", 0);
  auto ck = Checkpoint::open(tmp.str());
  expect_one_line(ck.status(), f + ": header is not valid JSON: ");
  expect_one_line(ck.status(), "parse error");
  EXPECT_EQ(ck.status().message().find("truncated"), std::string::npos) << ck.status().message();
  // Garbage of the declared length, with data after it.
  write_raw(f, "not json at all!", 64);
  expect_one_line(Checkpoint::open(tmp.str()).status(), f + ": header is not valid JSON: ");
  write_raw(f, "[1, 2]", 0);
  expect_one_line(Checkpoint::open(tmp.str()).status(),
                  f + ": header is not a JSON object (it is an array)");
}

// Missing or ill-typed header fields name the file, the tensor and the field.
TEST(Checkpoint, HeaderFieldErrorsNameTensorAndField) {
  TempDir tmp;
  const std::string f = tmp.str() + "/model.safetensors";
  const auto status = [&](const std::string& entry) {
    write_raw(f, R"({"__metadata__": {"format": "pt"}, "embed.weight": )" + entry + "}", 16);
    return Checkpoint::open(tmp.str()).status();
  };
  const std::string t = f + ": tensor 'embed.weight': ";
  expect_one_line(status(R"({"shape": [2, 2], "data_offsets": [0, 16]})"),
                  t + "header entry has no 'dtype'");
  expect_one_line(status(R"({"dtype": "F32", "data_offsets": [0, 16]})"),
                  t + "header entry has no 'shape'");
  expect_one_line(status(R"({"dtype": "F32", "shape": [2, 2]})"),
                  t + "header entry has no 'data_offsets'");
  expect_one_line(status("7"), t + "header entry is not an object (7)");
  expect_one_line(status(R"({"dtype": 4, "shape": [2, 2], "data_offsets": [0, 16]})"),
                  t + "'dtype' must be a string such as \"BF16\", got 4");
  expect_one_line(status(R"({"dtype": "F32", "shape": 4, "data_offsets": [0, 16]})"),
                  t + "'shape' must be an array of non-negative integers, got 4");
  expect_one_line(status(R"({"dtype": "F32", "shape": [2, -2], "data_offsets": [0, 16]})"),
                  t + "'shape' must be an array of non-negative integers, got [2,-2]");
  expect_one_line(status(R"({"dtype": "F32", "shape": [2, 2], "data_offsets": "0-16"})"),
                  t + "'data_offsets' must be [begin, end] (two non-negative integers), got \"0-16\"");
  expect_one_line(status(R"({"dtype": "F32", "shape": [2, 2], "data_offsets": [16, 0]})"),
                  t + "'data_offsets' [16, 0] ends before it begins");
  // Past the end of the data: that one is a truncated file.
  expect_one_line(status(R"({"dtype": "F32", "shape": [2, 4], "data_offsets": [0, 32]})"),
                  f + ": truncated file: tensor 'embed.weight' needs bytes [0, 32)");
  // The header length field larger than the file: truncated, naming the file.
  {
    std::ofstream out(f, std::ios::binary | std::ios::trunc);
    const uint64_t n = 1000;
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << "{}";
  }
  expect_one_line(Checkpoint::open(tmp.str()).status(),
                  f + ": truncated file: header length 1000 exceeds the 2 bytes after it");
}

TEST(Checkpoint, UnknownDtype) {
  TempDir tmp;
  write_raw(
      tmp.str() + "/model.safetensors",
      R"({"layers.0.attn.wq_a.weight": {"dtype": "F7", "shape": [2, 2], "data_offsets": [0, 4]}})",
      4);
  auto ck = Checkpoint::open(tmp.str());
  expect_one_line(ck.status(), "tensor 'layers.0.attn.wq_a.weight': unknown dtype \"F7\"");
}

TEST(Checkpoint, ByteCountMismatchAndDuplicates) {
  TempDir tmp;
  write_raw(tmp.str() + "/model.safetensors",
            R"({"x": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]}})", 12);
  expect_one_line(Checkpoint::open(tmp.str()).status(),
                  "tensor 'x': 12 bytes stored but F32 [2, 2] needs 16");
  // A shape whose byte count overflows 64 bits is refused as such, not wrapped: [2^32, 2^32]
  // F32 wrapped to 0 bytes and passed with data_offsets [0, 0] (`info` then printed the
  // parameter counts of the wrapped size), [2^62, 2^62] I64 reported "needs 0".
  TempDir tmp3;
  write_raw(tmp3.str() + "/model.safetensors",
            R"({"x": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}})", 0);
  expect_one_line(Checkpoint::open(tmp3.str()).status(),
                  "tensor 'x': shape [4294967296, 4294967296] of F32 needs more than 2^63 bytes");
  write_raw(tmp3.str() + "/model.safetensors",
            R"({"x": {"dtype": "I64", "shape": [4611686018427387904, 4611686018427387904], "data_offsets": [0, 16]}})", 16);
  expect_one_line(Checkpoint::open(tmp3.str()).status(), "needs more than 2^63 bytes");
  write_raw(tmp3.str() + "/model.safetensors",
            R"({"x": {"dtype": "F32", "shape": [18446744073709551615], "data_offsets": [0, 4]}})", 4);
  expect_one_line(Checkpoint::open(tmp3.str()).status(), "'shape' must be an array of non-negative integers");
  TempDir tmp2;
  write_raw(
      tmp2.str() + "/model.safetensors",
      R"({"model.embed_tokens.weight": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},)"
      R"( "embed.weight": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
      8);
  expect_one_line(Checkpoint::open(tmp2.str()).status(), "duplicates");
}

TEST(Checkpoint, UnsupportedModelType) {
  const std::string fx = first_fixture();
  ASSERT_FALSE(fx.empty());
  TempDir tmp;
  fs::copy_file(fx + "/model.safetensors", tmp.str() + "/model.safetensors");
  std::ofstream(tmp.str() + "/config.json")
      << R"({"model_type": "deepseek_v3", "num_hidden_layers": 2})";
  auto ops = ops::make_cpu_ops();
  auto m = DeepseekV4::load(tmp.str(), ops.get());
  expect_one_line(m.status(), "model_type \"deepseek_v3\" is not supported");
}

TEST(Checkpoint, ShardIndexNamesAbsentTensor) {
  TempDir tmp;
  ASSERT_TRUE(
      write_safetensors(tmp.str() + "/a.safetensors", {make_f32_tensor("x", {1}, {1.f})}).ok());
  std::ofstream(tmp.str() + "/model.safetensors.index.json")
      << R"({"weight_map": {"x": "a.safetensors", "y": "a.safetensors"}})";
  expect_one_line(Checkpoint::open(tmp.str()).status(),
                  "tensor 'y' is listed in the index but absent from a.safetensors");
  std::ofstream(tmp.str() + "/model.safetensors.index.json")
      << R"({"weight_map": {"x": "b.safetensors"}})";
  expect_one_line(Checkpoint::open(tmp.str()).status(), "b.safetensors: cannot open");
}

}  // namespace
}  // namespace v4::model
