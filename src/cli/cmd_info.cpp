// `v4serve info --model DIR`: config summary, parameter count by part, weight formats and KV
// bytes per token by pool. Reads only config.json and the safetensors headers (mmap; no weight
// decoding), so it works on full-size checkpoints too.
#include <cstdio>
#include <map>

#include "cache/pools.h"
#include "cli/command.h"
#include "model/checkpoint.h"
#include "model/config.h"

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

int run_info(const std::string& dir) {
  using namespace v4;
  auto cfg = model::ModelConfig::load(dir);
  if (!cfg.ok()) {
    std::fprintf(stderr, "error: %s\n", cfg.status().message().c_str());
    return 1;
  }
  auto ck = model::Checkpoint::open(dir);
  if (!ck.ok()) {
    std::fprintf(stderr, "error: %s\n", ck.status().message().c_str());
    return 1;
  }
  std::printf("== config (%s/config.json)\n%s", dir.c_str(), cfg->summary().c_str());

  std::map<std::string, int64_t> params;
  std::map<std::string, std::map<std::string, int>> formats;  // part -> dtype -> tensors
  int64_t scale_values = 0, total = 0;
  for (const auto& [name, t] : ck->tensors()) {
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
  std::printf("\n== KV cache bytes per token (f32 as stored by the CPU backend; bf16 = half)\n");
  double growing = 0;
  for (const auto& [pool, b] : cache::KvCache::bytes_per_token(spec)) {
    if (pool == "swa") {
      std::printf(
          "%-10s %10.2f B/token while in the window; fixed %lld B per sequence (%d-token window × "
          "%d layers)\n",
          pool.c_str(), b, (long long)(b * cfg->sliding_window), cfg->sliding_window,
          cfg->num_hidden_layers);
    } else {
      std::printf("%-10s %10.2f B/token\n", pool.c_str(), b);
      growing += b;
    }
  }
  std::printf("%-10s %10.2f B/token (compressed pools); compressor state %lld B per sequence\n",
              "total", growing, (long long)cache::KvCache::state_slot_bytes(spec));
  return 0;
}

}  // namespace

V4_REGISTER_COMMAND(info, "info",
                    "print config summary, parameter counts, weight formats, KV bytes/token",
                    [](CLI::App& app) {
                      auto dir = std::make_shared<std::string>();
                      app.add_option("--model", *dir, "checkpoint directory")->required();
                      return std::function<int()>([dir] { return run_info(*dir); });
                    });
