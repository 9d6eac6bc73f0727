// Model-loading options shared by `serve`, `generate`, `info` and `bench`:
//   --load-format auto|dummy   auto = the checkpoint's safetensors; dummy = random weights of the
//                              real shapes and formats generated on the device (only config.json
//                              is read; --model may name the file itself)
//   --num-layers N             keep the first N decoder layers (fit a V4-Flash/Pro shape on one
//   GPU)
//   --precision auto|fp32|bf16 arithmetic of the weight GEMMs (model::BackendOptions)
//   --dummy-seed S             seed of the dummy weights (same seed → same weights on any backend)
//   --kv-cache-dtype auto|f32|bf16|fp8  element type of the KV pools (auto = f32 for now; bf16
//                              halves KV memory; fp8 = e4m3 nope + bf16 rope rows; not for `info`)
//   --index-cache-dtype auto|fp8  element type of the indexer-key pools (auto = as the KV pools;
//                              fp8 = e4m3 + one f32 scale per key with any --kv-cache-dtype;
//                              not for `info`)
#pragma once
#include <CLI/CLI.hpp>

#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"
#include "model/deepseek_v4.h"
#include "ops/ops.h"

namespace v4 {
class ThreadPool;
}

namespace v4::cli {

/// Printed next to every number measured with --load-format dummy.
inline constexpr const char* kDummyRoutingNote =
    "weights are random (--load-format dummy): expert routing is roughly uniform over the "
    "experts, unlike a trained model's";

struct ModelArgs {
  std::string model;  // --model: checkpoint directory; with dummy also a config.json file
  std::string device = "cpu";
  std::string load_format = "auto";
  int num_layers = 0;  // 0 = all
  std::string precision = "auto";
  uint64_t dummy_seed = 0;
  std::string kv_cache_dtype = "auto";     // --kv-cache-dtype
  std::string index_cache_dtype = "auto";  // --index-cache-dtype
  bool dummy() const { return load_format == "dummy"; }
  /// The KV pool element type --kv-cache-dtype names (auto → kF32 until bf16 is measured).
  KvDtype kv_dtype() const {
    KvDtype d = KvDtype::kF32;
    (void)parse_kv_dtype(kv_cache_dtype, &d);  // the option's check admits only valid names
    return d;
  }
  /// What --index-cache-dtype asks of the indexer-key pools (auto → follow --kv-cache-dtype).
  IndexCacheDtype index_cache() const {
    IndexCacheDtype d = IndexCacheDtype::kAuto;
    (void)parse_index_cache_dtype(index_cache_dtype, &d);  // checked by the option, as above
    return d;
  }
  /// The indexer-key pools' element type: kv_index_dtype(kv_dtype(), index_cache()).
  KvDtype index_dtype() const { return kv_index_dtype(kv_dtype(), index_cache()); }
};

/// Adds --load-format, --num-layers, --precision, --kv-cache-dtype, --index-cache-dtype (the
/// last three only with `with_precision`) and --dummy-seed to `app` (--model and --device stay with each command:
/// their help texts differ).
void add_model_options(CLI::App& app, ModelArgs* a, bool with_precision = true);

struct LoadedModel {
  std::unique_ptr<ops::Ops> ops;
  std::unique_ptr<model::DeepseekV4> model;  // declared after ops: destroyed first
};

/// Creates the backend (model::make_backend with the precision) and loads the model as the
/// options say. Errors: those of make_backend, DeepseekV4::load / load_dummy; a directory with
/// config.json but no safetensors under --load-format auto gets a hint naming
/// --load-format dummy.
Result<LoadedModel> load_model(const ModelArgs& a, ThreadPool* pool = nullptr);

/// The backend load_model creates (--device, --precision), for a command that must query it
/// before the weights load (bench --profile). Errors: those of model::make_backend.
Result<std::unique_ptr<ops::Ops>> make_model_backend(const ModelArgs& a, ThreadPool* pool = nullptr);

/// load_model on a backend from make_model_backend (not null).
Result<LoadedModel> load_model(const ModelArgs& a, std::unique_ptr<ops::Ops> ops);

/// The directory a --model argument refers to (itself, or the parent of a config file).
std::string model_dir_of(const std::string& model);

}  // namespace v4::cli
