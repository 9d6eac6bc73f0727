#include "cli/model_args.h"

#include <filesystem>

#include "base/log.h"
#include "cli/validators.h"
#include "model/backend.h"
#include "model/config.h"

namespace v4::cli {

namespace fs = std::filesystem;

void add_model_options(CLI::App& app, ModelArgs* a, bool with_precision) {
  app.add_option("--load-format", a->load_format,
                 "auto (the checkpoint's safetensors) or dummy (random weights of the real shapes "
                 "and formats, generated on the device; only config.json is read)")
      ->check(CLI::IsMember({"auto", "dummy"}));
  app.add_option("--num-layers", a->num_layers,
                 "keep only the first N decoder layers (e.g. a V4-Flash shape cut to one GPU)")
      ->check(int_at_least(1, INT32_MAX))
      ->default_str("all");
  if (with_precision)
    app.add_option("--precision", a->precision,
                   "weight GEMM arithmetic: auto (fp32 on cpu, bf16 on cuda), fp32 or bf16")
        ->check(CLI::IsMember({"auto", "fp32", "bf16"}));
  if (with_precision)
    app.add_option("--kv-cache-dtype", a->kv_cache_dtype,
                   "element type of the KV cache pools (SWA, compressed, indexer keys unless "
                   "--index-cache-dtype fp8) and the prefix-cache store: auto (= f32 for now), f32, bf16 (halves KV memory: "
                   "twice the tokens per budget; rows rounded to bf16 as the bf16 reference "
                   "model stores them), or fp8 / fp8_e4m3 (attention rows as e4m3 nope values "
                   "with per-64 f32 scales + bf16 rope: 608 bytes a V4 row; indexer keys as e4m3 "
                   "+ one f32 scale, 16-byte padded: 144 bytes)")
        ->check(CLI::IsMember({"auto", "f32", "bf16", "fp8", "fp8_e4m3"}));
  if (with_precision)
    app.add_option("--index-cache-dtype", a->index_cache_dtype,
                   "element type of the lightning indexer's key pools (and their prefix-cache "
                   "rows): auto (as --kv-cache-dtype: fp8 keys with fp8 pools, otherwise the KV "
                   "dtype) or fp8 (e4m3 + one f32 scale per key, 16-byte padded: 144 bytes a V4 "
                   "key, with any --kv-cache-dtype, e.g. bf16 attention rows + fp8 keys as SGLang "
                   "and vLLM store them)")
        ->check(CLI::IsMember({"auto", "fp8"}));
  app.add_option("--dummy-seed", a->dummy_seed, "seed of --load-format dummy weights")
      ->check(int_at_least(0));
}

std::string model_dir_of(const std::string& model) {
  std::error_code ec;
  if (fs::is_regular_file(model, ec)) {
    const fs::path parent = fs::path(model).parent_path();
    return parent.empty() ? "." : parent.string();
  }
  return model;
}

Result<std::unique_ptr<ops::Ops>> make_model_backend(const ModelArgs& a, ThreadPool* pool) {
  model::BackendOptions bo;
  bo.precision = a.precision;
  return model::make_backend(a.device, pool, bo);
}

Result<LoadedModel> load_model(const ModelArgs& a, ThreadPool* pool) {
  V4_ASSIGN_OR_RETURN(auto ops, make_model_backend(a, pool));
  return load_model(a, std::move(ops));
}

Result<LoadedModel> load_model(const ModelArgs& a, std::unique_ptr<ops::Ops> ops) {
  // A KV element type this model's shapes cannot hold is refused before any weight is read or
  // generated (a config that does not load is reported by the load below).
  if (auto c = a.dummy() ? model::ModelConfig::load_path(a.model) : model::ModelConfig::load(a.model);
      c.ok()) {
    const Status st = c.value().check_kv_dtype(a.kv_dtype());
    if (!st.ok())
      return make_error(st.code(), "--kv-cache-dtype {}: {}", a.kv_cache_dtype, st.message());
    const Status si = c.value().check_index_cache_dtype(a.index_cache());
    if (!si.ok())
      return make_error(si.code(), "--index-cache-dtype {}: {}", a.index_cache_dtype,
                        si.message());
  }
  LoadedModel lm;
  lm.ops = std::move(ops);
  if (a.dummy()) {
    V4_ASSIGN_OR_RETURN(lm.model, model::DeepseekV4::load_dummy(a.model, lm.ops.get(), {},
                                                                a.num_layers, a.dummy_seed));
    V4_LOG_WARN("{}", kDummyRoutingNote);
    return lm;
  }
  std::error_code ec;
  if (fs::is_regular_file(a.model, ec))
    return make_error(ErrorCode::kInvalidArgument,
                      "--model {}: a file; --load-format auto needs a checkpoint directory "
                      "(or use --load-format dummy for a config.json alone)",
                      a.model);
  auto m = model::DeepseekV4::load(a.model, lm.ops.get(), {}, a.num_layers);
  if (!m.ok()) {
    bool has_weights = false;
    for (auto& e : fs::directory_iterator(a.model, ec))
      has_weights |= e.path().extension() == ".safetensors";
    if (fs::exists(fs::path(a.model) / "config.json", ec) && !has_weights)
      return make_error(m.status().code(),
                        "{} (config.json only: use --load-format dummy for "
                        "random weights of this shape)",
                        m.status().message());
    return m.status();
  }
  lm.model = std::move(m).value();
  return lm;
}

}  // namespace v4::cli
