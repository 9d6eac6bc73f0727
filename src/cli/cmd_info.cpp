// `v4serve info --model DIR`: config summary, parameter count by part, weight formats and KV
// bytes per token by pool. Reads only config.json and the safetensors headers (mmap; no weight
// decoding), so it works on full-size checkpoints too. With --load-format dummy only config.json
// is read (DIR or the file itself) and the parameters / bytes by format are those the dummy
// weights would have; --num-layers cuts the model first.
#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "cache/pools.h"
#include "cli/command.h"
#include "cli/model_args.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/weights.h"

namespace {

// Part of the model an official tensor name belongs to.
std::string part_of(const std::string& n) {
  auto has = [&](const char* s) { return n.find(s) != std::string::npos; };
  if (n.rfind("mtp.", 0) == 0) return "mtp";
  if (n == "embed.weight") return "embedding";
  if (n == "head.weight") return "lm_head";
  if (has(".attn.indexer.")) return "indexer";
  if (has(".attn.compressor.")) return "compressor";
  if (has(".attn.")) return "attention";
  if (has(".ffn.experts.")) return "routed experts";
  if (has(".ffn.shared_experts.")) return "shared expert";
  if (has(".ffn.gate.")) return "router";
  return "norms + mHC";
}

bool ends_with(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

int print_kv(const v4::model::ModelConfig& c);

// Layer index of an official tensor name "layers.N.…" (-1 for others).
int layer_of(const std::string& n) {
  if (n.rfind("layers.", 0) != 0) return -1;
  return std::atoi(n.c_str() + 7);
}

// --load-format dummy: parameters by part and bytes by format that Weights::dummy generates on
// a backend reading every format (no memory is allocated: model::make_shape_only_ops).
int print_dummy_weights(const v4::model::ModelConfig& cfg) {
  using namespace v4;
  auto ops = model::make_shape_only_ops();
  // Shapes only: nothing is generated, so no "generating dummy weights … 0.00 s" lines.
  model::LoadObserver quiet;
  quiet.log = false;
  auto w = model::Weights::dummy(cfg, ops.get(), {}, 0, quiet);
  if (!w.ok()) {
    std::fprintf(stderr, "error: %s\n", w.status().message().c_str());
    return 1;
  }
  const auto& c = w->counts;
  std::printf("\n== dummy weights (--load-format dummy: random, real shapes; MTP not generated)\n");
  std::printf("%-16s %16s\n", "part", "parameters");
  for (auto [name, n] : std::initializer_list<std::pair<const char*, int64_t>>{
           {"embedding", c.embed},
           {"lm_head", c.head},
           {"attention", c.attention},
           {"compressor", c.compressor},
           {"indexer", c.indexer},
           {"routed experts", c.routed_experts},
           {"shared expert", c.shared_experts},
           {"router", c.router},
           {"norms + mHC", c.norms_and_mhc}})
    std::printf("%-16s %16lld\n", name, (long long)n);
  std::printf("%-16s %16lld\n", "total", (long long)c.total());
  const double gib = double(int64_t(1) << 30);
  int64_t total = w->vector_bytes();
  std::printf("stored bytes on a backend reading every format:\n");
  for (const auto& [f, b] : w->bytes_by_format()) {
    std::printf("  %-10s %10.3f GiB (matrices)\n", f.c_str(), double(b) / gib);
    total += b;
  }
  std::printf("  %-10s %10.3f GiB (embedding, norms, mHC, router, tables)\n", "f32/i32",
              double(w->vector_bytes()) / gib);
  std::printf("  %-10s %10.3f GiB\n", "total", double(total) / gib);
  return 0;
}

int run_info(const std::string& dir, const std::string& load_format, int num_layers) {
  using namespace v4;
  const bool dummy = load_format == "dummy";
  auto cfg = dummy ? model::ModelConfig::load_path(dir) : model::ModelConfig::load(dir);
  if (!cfg.ok()) {
    // As generate / serve: 2 for an invalid config, 1 for one that cannot be read.
    std::fprintf(stderr, "error: %s\n", cfg.status().message().c_str());
    return cfg.status().code() == ErrorCode::kInvalidArgument ? 2 : 1;
  }
  if (num_layers > 0) {
    if (Status st = cfg->truncate_layers(num_layers); !st.ok()) {
      std::fprintf(stderr, "error: %s\n", st.message().c_str());
      return 2;
    }
  }
  // The checkpoint is opened before anything is printed: a directory without weights gives its
  // one-line error alone, not a config summary followed by the error.
  std::optional<model::Checkpoint> ck;
  if (!dummy) {
    auto opened = model::Checkpoint::open(dir);
    if (!opened.ok()) {
      // The dummy-weights hint only when there are no weights at all, not for a file that is
      // there but unreadable.
      const bool no_weights = opened.status().code() == ErrorCode::kNotFound;
      std::fprintf(stderr, "error: %s%s\n", opened.status().message().c_str(),
                   no_weights ? " (for a config.json alone use --load-format dummy)" : "");
      return 1;
    }
    ck.emplace(std::move(opened).value());
  }
  std::printf("== config (%s%s)%s\n%s", dir.c_str(),
              std::filesystem::is_regular_file(dir) ? "" : "/config.json",
              num_layers > 0 ? fmt::format(" cut to the first {} layers", num_layers).c_str()
                             : "",
              cfg->summary().c_str());
  if (dummy) {
    if (int rc = print_dummy_weights(*cfg); rc != 0) return rc;
    return print_kv(*cfg);
  }

  std::map<std::string, int64_t> params;
  std::map<std::string, std::map<std::string, int>> formats;  // part -> dtype -> tensors
  int64_t scale_values = 0, total = 0;
  for (const auto& [name, t] : ck->tensors()) {
    if (num_layers > 0 && layer_of(name) >= num_layers) continue;
    int64_t numel = 1;
    for (auto d : t.shape) numel *= d;
    if (ends_with(name, ".scale")) {
      scale_values += numel;
      continue;
    }
    std::string fmt = std::string(dtype_name(t.dtype));
    if (t.dtype == DType::kI8 || t.dtype == DType::kU8) {
      numel *= 2;  // packed FP4 e2m1: two values per byte
      fmt = "FP4 e2m1 (I8 packed)";
    } else if (t.dtype == DType::kF8E4M3) {
      fmt = ck->has(name.substr(0, name.size() - 7) + ".scale") ? "F8_E4M3 + block scales"
                                                                : "F8_E4M3";
    }
    const std::string part = part_of(name);
    params[part] += numel;
    formats[part][fmt]++;
    total += numel;
  }
  std::printf("\n== checkpoint: %zu tensors, naming %s\n", ck->tensors().size(),
              model::naming_scheme_name(ck->scheme()));
  std::printf("%-16s %16s   formats\n", "part", "parameters");
  for (const auto& [part, n] : params) {
    std::string f;
    for (const auto& [fmt, count] : formats[part])
      f += (f.empty() ? "" : ", ") + fmt + " ×" + std::to_string(count);
    std::printf("%-16s %16lld   %s\n", part.c_str(), (long long)n, f.c_str());
  }
  std::printf("%-16s %16lld   (+%lld scale values)\n", "total", (long long)total,
              (long long)scale_values);
  std::string dt;
  for (const auto& [d, c] : ck->dtype_counts())
    dt += (dt.empty() ? "" : ", ") + d + " " + std::to_string(c);
  std::printf("stored dtypes: %s\n", dt.c_str());
  if (cfg->has_quantization_config)
    std::printf("quantization_config: present (expert_dtype %s)\n",
                cfg->expert_dtype.empty() ? "-" : cfg->expert_dtype.c_str());
  return print_kv(*cfg);
}

int print_kv(const v4::model::ModelConfig& c) {
  using namespace v4;
  const model::ModelConfig* cfg = &c;
  cache::CacheSpec spec;
  spec.sliding_window = cfg->sliding_window;
  for (auto k : cfg->layer_types) {
    cache::LayerCacheSpec l;
    l.kind = k == model::LayerKind::kSliding ? cache::AttnKind::kSliding
             : k == model::LayerKind::kCsa   ? cache::AttnKind::kCsa
                                             : cache::AttnKind::kHca;
    l.ratio = cfg->compress_rate(k);
    l.kv_dim = cfg->head_dim;
    l.index_dim = k == model::LayerKind::kCsa ? cfg->index_head_dim : 0;
    spec.layers.push_back(l);
  }
  spec.rope_dim = cfg->rope_dim();
  // One column per --kv-cache-dtype (f32 is the default): fp8 = 608-byte-class attention rows
  // (kv_fp8_layout) and indexer keys of index_head_dim e4m3 + one f32 scale, 16-byte padded (144 B for V4).
  const KvDtype dts[3] = {KvDtype::kF32, KvDtype::kBf16, KvDtype::kFp8};
  std::vector<std::pair<std::string, double>> per[3];
  for (int i = 0; i < 3; ++i) {
    spec.kv_dtype = dts[i];
    per[i] = cache::KvCache::bytes_per_token(spec);
  }
  std::printf("\n== KV cache bytes per token by --kv-cache-dtype (f32 default; fp8: e4m3 attention "
              "rows of %lld B, indexer keys of %lld B)\n",
              (long long)kv_row_bytes(KvDtype::kFp8, cfg->head_dim, cfg->rope_dim()),
              (long long)kv_row_bytes(kv_index_dtype(KvDtype::kFp8), cfg->index_head_dim, 0));
  // fp8 pools need shapes this model may not have (ModelConfig::check_kv_dtype): n/a then.
  const Status fp8_ok = cfg->check_kv_dtype(KvDtype::kFp8);
  const auto cell = [&](int i, double v) {
    return i == 2 && !fp8_ok.ok() ? std::string("n/a") : fmt::format("{:.2f}", v);
  };
  const auto cell_int = [&](int i, double v) {
    return i == 2 && !fp8_ok.ok() ? std::string("n/a") : fmt::format("{}", (long long)v);
  };
  std::printf("%-10s %12s %12s %12s\n", "pool", "f32", "bf16", "fp8");
  double growing[3] = {0, 0, 0};
  for (size_t p = 0; p < per[0].size(); ++p) {
    const std::string& pool = per[0][p].first;
    std::printf("%-10s %12s %12s %12s B/token", pool.c_str(), cell(0, per[0][p].second).c_str(),
                cell(1, per[1][p].second).c_str(), cell(2, per[2][p].second).c_str());
    if (pool == "swa") {
      std::printf(" while in the window; fixed %s / %s / %s B per sequence (%d-token window × "
                  "%d layers)\n",
                  cell_int(0, per[0][p].second * cfg->sliding_window).c_str(),
                  cell_int(1, per[1][p].second * cfg->sliding_window).c_str(),
                  cell_int(2, per[2][p].second * cfg->sliding_window).c_str(), cfg->sliding_window,
                  cfg->num_hidden_layers);
    } else {
      std::printf("\n");
      for (int i = 0; i < 3; ++i) growing[i] += per[i][p].second;
    }
  }
  std::printf("%-10s %12s %12s %12s B/token (compressed pools); compressor state %lld B per "
              "sequence (f32 in every mode)\n",
              "total", cell(0, growing[0]).c_str(), cell(1, growing[1]).c_str(),
              cell(2, growing[2]).c_str(), (long long)cache::KvCache::state_slot_bytes(spec));
  if (!fp8_ok.ok()) std::printf("fp8: n/a for this model (%s)\n", fp8_ok.message().c_str());
  // --index-cache-dtype fp8: the fp8 column's indexer keys next to f32 / bf16 attention rows.
  const Status idx_ok = cfg->check_index_cache_dtype(IndexCacheDtype::kFp8);
  if (!idx_ok.ok()) {
    std::printf("--index-cache-dtype fp8: n/a for this model (%s)\n", idx_ok.message().c_str());
    return 0;
  }
  double idx_tok[2] = {0, 0}, idx_total[2] = {0, 0};
  spec.index_cache_dtype = IndexCacheDtype::kFp8;
  for (int i = 0; i < 2; ++i) {
    spec.kv_dtype = dts[i];
    for (const auto& [pool, b] : cache::KvCache::bytes_per_token(spec)) {
      if (pool == "c4_index") idx_tok[i] = b;
      if (pool != "swa") idx_total[i] += b;
    }
  }
  std::printf("--index-cache-dtype fp8 (indexer keys as in the fp8 column) with f32 / bf16 KV: "
              "c4_index %.2f / %.2f B/token, total %.2f / %.2f B/token (compressed pools)\n",
              idx_tok[0], idx_tok[1], idx_total[0], idx_total[1]);
  return 0;
}

}  // namespace

V4_REGISTER_COMMAND(info, "info",
                    "print config summary, parameter counts, weight formats, KV bytes/token",
                    [](CLI::App& app) {
                      auto o = std::make_shared<v4::cli::ModelArgs>();
                      app.add_option("--model", o->model,
                                     "checkpoint directory (with --load-format dummy also a "
                                     "config.json file)")
                          ->required();
                      v4::cli::add_model_options(app, o.get(), /*with_precision=*/false);
                      return std::function<int()>([o] {
                        return run_info(o->model, o->load_format, o->num_layers);
                      });
                    });
