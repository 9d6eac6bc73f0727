// Weight memory and load progress:
// - estimate_weight_footprint equals what Weights::dummy really allocates (CPU backend: all f32;
//   a counting backend claiming every native format: FP8 / MXFP4 / BF16 with their scales).
// - check_weights_fit refuses up front (kResourceExhausted, no allocation, no tensor read) a
//   model whose weights exceed the backend's free memory, for load_dummy and load, with a message
//   naming the model and both byte counts; a backend that reports no memory is not checked;
//   --num-layers cuts lower the need; a real checkpoint's need is capped at its stored bytes on a
//   native-format backend (never refused on the word of a config claiming larger formats).
//   V4-Flash on the CPU backend is refused at once.
// - LoadObserver: progress reports are monotone and end at bytes_total / tensors_total for a real
//   checkpoint (full and cut by --num-layers; totals = the checkpoint's tensor bytes) and for
//   dummy weights (totals = the footprint); the log gets "bytes / total, tensors / total" lines.
#include <gtest/gtest.h>

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "model/deepseek_v4.h"
#include "ops/null_ops.h"

namespace v4::model {
namespace {

std::string fixture(const char* name) {
  return std::string(V4_SOURCE_DIR) + "/tests/fixtures/" + name;
}
std::string flash_config() { return std::string(V4_SOURCE_DIR) + "/models/configs/v4-flash"; }

/// Counts allocations (placeholder addresses, never dereferenced), reports the memory it is told
/// to, optionally claims every native weight format. Computes nothing.
class MemOps : public ops::NullOps {
 public:
  MemOps(int64_t free_b, int64_t total_b, bool native) : m_{free_b, total_b}, native_(native) {}
  std::string name() const override { return "mem"; }
  bool supports(ops::WFormat f) const override { return native_ || f == ops::WFormat::kF32; }
  ops::MemoryInfo memory_info() override { return m_; }
  void* alloc(size_t bytes) override {
    if (bytes == 0) return nullptr;
    allocated += int64_t(bytes);
    next_ += (bytes + 255) / 256 * 256;
    return reinterpret_cast<void*>(next_);
  }
  void fill_random(void*, int64_t, ops::RandomFill, float, uint64_t) override {}
  int64_t allocated = 0;

 private:
  ops::MemoryInfo m_;
  bool native_;
  uintptr_t next_ = uintptr_t(1) << 40;
};

constexpr int64_t GiB = int64_t(1) << 30;

int64_t weight_bytes(const Weights& w) {
  int64_t b = w.vector_bytes();
  for (const auto& [f, n] : w.bytes_by_format()) b += n;
  return b;
}

TEST(WeightMemory, EstimateEqualsDummyAllocationOnCpu) {
  auto ops = ops::make_cpu_ops();
  for (const char* fx : {"tiny-kinds-fp32", "tiny-fp8-mxfp4", "tiny-bf16"}) {
    auto cfg = ModelConfig::load(fixture(fx));
    ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
    const WeightFootprint est = estimate_weight_footprint(*cfg, *ops);
    auto w = Weights::dummy(*cfg, ops.get());
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    EXPECT_EQ(est.bytes, weight_bytes(*w)) << fx;
    EXPECT_GT(est.tensors, 10 * cfg->num_hidden_layers) << fx;
  }
}

TEST(WeightMemory, EstimateEqualsAllocationWithNativeFormats) {
  for (const char* fx : {"tiny-fp8-mxfp4", "tiny-fp8-base", "tiny-bf16"}) {
    auto cfg = ModelConfig::load(fixture(fx));
    ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
    MemOps native(0, 0, true), f32_only(0, 0, false);
    const WeightFootprint est = estimate_weight_footprint(*cfg, native);
    auto w = Weights::dummy(*cfg, &native);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    EXPECT_EQ(est.bytes, weight_bytes(*w)) << fx;
    EXPECT_EQ(est.bytes, native.allocated) << fx;
    // Native formats are smaller than f32 (every matrix of these fixtures is bf16/fp8/fp4).
    EXPECT_LT(est.bytes, estimate_weight_footprint(*cfg, f32_only).bytes) << fx;
  }
}

TEST(WeightMemory, RefusesDummyThatDoesNotFitBeforeAllocating) {
  const std::string path = fixture("tiny-kinds-fp32");
  auto cfg = ModelConfig::load(path);
  ASSERT_TRUE(cfg.ok());
  MemOps probe(0, 0, false);
  const int64_t need = estimate_weight_footprint(*cfg, probe).bytes;
  ASSERT_GT(need, 1000);

  MemOps small(need - 1, 4 * need, false);
  auto m = DeepseekV4::load_dummy(path, &small);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), ErrorCode::kResourceExhausted);
  const std::string msg = m.status().message();
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::to_string(need) + " bytes"), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::to_string(need - 1) + " bytes"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--num-layers"), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
  EXPECT_EQ(small.allocated, 0) << "refused before allocating any weight";

  // Exactly enough fits; a backend that does not report its memory is not checked.
  MemOps exact(need, 4 * need, false), unknown(0, 0, false);
  EXPECT_TRUE(DeepseekV4::load_dummy(path, &exact).ok());
  EXPECT_TRUE(DeepseekV4::load_dummy(path, &unknown).ok());
  // A --num-layers cut needs less: 2 of 4 layers fit where all 4 do not.
  MemOps cut(need - 1, 4 * need, false);
  EXPECT_TRUE(DeepseekV4::load_dummy(path, &cut, {}, 2).ok());
}

// The refusal's --num-layers hint names a cut that fits (the most leading layers whose weights
// fit), and when not even one layer fits (V4-Pro on a CPU) it says so instead of suggesting a cut
// that cannot help.
TEST(WeightMemory, NumLayersHintNamesACutThatFits) {
  const std::string path = fixture("tiny-kinds-fp32");
  auto cfg = ModelConfig::load(path);
  ASSERT_TRUE(cfg.ok());
  ASSERT_EQ(cfg->num_hidden_layers, 4);
  MemOps probe(0, 0, false);
  auto need_of = [&](int n) {
    ModelConfig c = *cfg;
    EXPECT_TRUE(c.truncate_layers(n).ok());
    return estimate_weight_footprint(c, probe).bytes;
  };
  ASSERT_LT(need_of(2), need_of(3));
  MemOps two(need_of(2), 4 * need_of(4), false);
  auto m = DeepseekV4::load_dummy(path, &two);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("use --num-layers 2 (or fewer)"), std::string::npos)
      << m.status().message();
  MemOps two_again(need_of(2), 4 * need_of(4), false);
  EXPECT_TRUE(DeepseekV4::load_dummy(path, &two_again, {}, 2).ok());  // the hint works

  MemOps none(need_of(1) - 1, 4 * need_of(4), false);
  m = DeepseekV4::load_dummy(path, &none);
  ASSERT_FALSE(m.ok());
  const std::string msg = m.status().message();
  EXPECT_NE(msg.find("even 1 layer needs"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--num-layers cannot make it fit"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("--num-layers N"), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
}

TEST(WeightMemory, RefusesCheckpointThatDoesNotFit) {
  const std::string dir = fixture("tiny-kinds-fp32");
  MemOps small(1 << 10, 1 << 20, false);
  auto m = DeepseekV4::load(dir, &small);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), ErrorCode::kResourceExhausted);
  EXPECT_NE(m.status().message().find(dir), std::string::npos) << m.status().message();
  EXPECT_EQ(small.allocated, 0);
}

// A checkpoint storing smaller formats than its config implies (FP8 / MXFP4 tensors, a config
// without quantization_config and f32 dtype): on a native-format backend the need is capped at
// the stored bytes, so a model that fits is never refused on the config's word.
TEST(WeightMemory, NativeCheckpointSmallerThanConfigIsNotRefused) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("v4-fit-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::copy_file(fixture("tiny-fp8-mxfp4") + "/model.safetensors", dir / "model.safetensors",
                fs::copy_options::overwrite_existing);
  nlohmann::json j;
  std::ifstream(fixture("tiny-fp8-mxfp4") + "/config.json") >> j;
  j.erase("quantization_config");
  j["torch_dtype"] = "float32";
  std::ofstream(dir / "config.json") << j.dump();

  auto cfg = ModelConfig::load(dir.string());
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  auto ck = Checkpoint::open(dir.string());
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  const int64_t stored = checkpoint_load_bytes(*ck, *cfg);
  MemOps probe(0, 0, true);
  const int64_t from_config = estimate_weight_footprint(*cfg, probe).bytes;
  ASSERT_GT(from_config, stored) << "the config claims f32 everywhere";

  MemOps fits(stored, 4 * from_config, true);
  auto m = DeepseekV4::load(dir.string(), &fits);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  MemOps tight(stored - 1, 4 * from_config, true);
  auto r = DeepseekV4::load(dir.string(), &tight);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kResourceExhausted);
  EXPECT_NE(r.status().message().find(std::to_string(stored) + " bytes"), std::string::npos)
      << r.status().message();
  // On an f32-only backend (everything decoded) the config's f32 estimate stands.
  MemOps f32_only(stored, 4 * from_config, false);
  EXPECT_FALSE(DeepseekV4::load(dir.string(), &f32_only).ok());
  fs::remove_all(dir);
}

TEST(WeightMemory, FlashOnCpuIsRefusedAtOnce) {
  auto ops = ops::make_cpu_ops();
  auto cfg = ModelConfig::load(flash_config());
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  const int64_t need = estimate_weight_footprint(*cfg, *ops).bytes;
  // ~284 B parameters decoded to f32 on the CPU.
  EXPECT_GT(need, 1000 * GiB);
  ModelConfig one = *cfg;
  ASSERT_TRUE(one.truncate_layers(1).ok());
  const int64_t need1 = estimate_weight_footprint(one, *ops).bytes;
  EXPECT_LT(need1, need / 20);
  EXPECT_GT(need1, 20 * GiB);  // 256 experts × 3 × 2048 × 4096 f32 alone are 24 GiB
  const ops::MemoryInfo mi = ops->memory_info();
  ASSERT_GT(mi.free_bytes, 0) << "/proc/meminfo MemAvailable";
  if (mi.free_bytes >= need) GTEST_SKIP() << "this machine has the memory for V4-Flash in f32";
  auto m = DeepseekV4::load_dummy(flash_config(), ops.get());
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), ErrorCode::kResourceExhausted);
  EXPECT_NE(m.status().message().find("MemAvailable"), std::string::npos) << m.status().message();
  // On a native-format GPU-like backend the same model needs far less (FP8 / MXFP4 / BF16).
  MemOps native(0, 0, true);
  EXPECT_LT(estimate_weight_footprint(*cfg, native).bytes, need / 2);
}

/// Records every report; checks monotonicity.
struct Recorder {
  std::vector<LoadProgress> seen;
  LoadObserver observer(double log_interval_s = 0) {
    LoadObserver o;
    o.log_interval_s = log_interval_s;
    o.on_progress = [this](const LoadProgress& p) { seen.push_back(p); };
    return o;
  }
  void check_complete(const char* what) {
    ASSERT_GE(seen.size(), 3u) << what;
    for (size_t i = 1; i < seen.size(); ++i) {
      EXPECT_GE(seen[i].bytes_done, seen[i - 1].bytes_done) << what;
      EXPECT_GE(seen[i].tensors_done, seen[i - 1].tensors_done) << what;
      EXPECT_EQ(seen[i].bytes_total, seen[0].bytes_total) << what;
      EXPECT_FALSE(seen[i - 1].finished) << what;
    }
    const LoadProgress& last = seen.back();
    EXPECT_TRUE(last.finished) << what;
    EXPECT_GT(last.bytes_total, 0) << what;
    EXPECT_EQ(last.bytes_done, last.bytes_total) << what;
    EXPECT_EQ(last.tensors_done, last.tensors_total) << what;
  }
};

TEST(LoadProgress, CheckpointLoadReportsBytesAndTensors) {
  auto ops = ops::make_cpu_ops();
  for (const char* fx : {"tiny-kinds-fp32", "tiny-fp8-mxfp4", "tiny-real-rates"}) {
    auto ck = Checkpoint::open(fixture(fx));
    ASSERT_TRUE(ck.ok()) << ck.status().to_string();
    auto cfg = ModelConfig::load(fixture(fx));
    ASSERT_TRUE(cfg.ok());
    int64_t file_bytes = 0, weights = 0;
    for (const auto& [name, t] : ck->tensors()) {
      file_bytes += int64_t(t.bytes);
      weights += name.size() < 6 || name.compare(name.size() - 6, 6, ".scale") != 0;
    }
    Recorder full;
    ASSERT_TRUE(Weights::load(*ck, *cfg, ops.get(), {}, full.observer()).ok()) << fx;
    full.check_complete(fx);
    EXPECT_EQ(full.seen.back().bytes_total, file_bytes) << fx;
    EXPECT_EQ(full.seen.back().tensors_total, weights) << fx;

    ModelConfig cut = *cfg;
    ASSERT_TRUE(cut.truncate_layers(1).ok());
    Recorder part;
    ASSERT_TRUE(Weights::load(*ck, cut, ops.get(), {}, part.observer()).ok()) << fx;
    part.check_complete(fx);
    EXPECT_LT(part.seen.back().bytes_total, file_bytes) << fx;
  }
}

TEST(LoadProgress, DummyReportsFootprint) {
  auto ops = ops::make_cpu_ops();
  auto cfg = ModelConfig::load(fixture("tiny-kinds-fp32"));
  ASSERT_TRUE(cfg.ok());
  Recorder r;
  auto w = Weights::dummy(*cfg, ops.get(), {}, 3, r.observer());
  ASSERT_TRUE(w.ok());
  r.check_complete("dummy");
  EXPECT_EQ(r.seen.back().bytes_total, weight_bytes(*w));
  EXPECT_EQ(r.seen.back().tensors_total, estimate_weight_footprint(*cfg, *ops).tensors);
}

TEST(LoadProgress, LogsBytesAndTensorsAtIntervals) {
  std::ostringstream log;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
  auto logger = spdlog::default_logger();
  logger->sinks().push_back(sink);
  const auto level = logger->level();
  logger->set_level(spdlog::level::info);
  auto ops = ops::make_cpu_ops();
  auto ck = Checkpoint::open(fixture("tiny-kinds-fp32"));
  auto cfg = ModelConfig::load(fixture("tiny-kinds-fp32"));
  ASSERT_TRUE(ck.ok() && cfg.ok());
  Recorder r;
  auto w = Weights::load(*ck, *cfg, ops.get(), {}, r.observer(1e-9));  // a line per tensor
  logger->sinks().pop_back();
  logger->set_level(level);
  ASSERT_TRUE(w.ok());
  const std::string text = log.str();
  const int64_t n = r.seen.back().tensors_total;
  EXPECT_NE(text.find("loading weights from"), std::string::npos) << text;
  EXPECT_NE(text.find("1 / " + std::to_string(n) + " tensors"), std::string::npos) << text;
  EXPECT_NE(text.find("done"), std::string::npos) << text;
  EXPECT_NE(text.find(std::to_string(n) + " / " + std::to_string(n) + " tensors"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("MiB / "), std::string::npos) << text;  // a tiny model: MiB
}

}  // namespace
}  // namespace v4::model
