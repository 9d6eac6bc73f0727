// Checkpoint: the safetensors files of a DeepSeek-V4 checkpoint directory, memory-mapped, with
// tensor names normalized to DeepSeek's official scheme (dsv4-model.md §11) and decoding of the
// stored formats to f32.
//
// Layout accepted: `<dir>/model.safetensors`, or `<dir>/model.safetensors.index.json` + the shards
// it names, or (no index) every `*.safetensors` in the directory.
// Names accepted (all normalized to official names such as `layers.3.attn.wq_a.weight`):
//   official (`embed.weight`, `layers.L.attn.wq_a.weight`, `layers.L.ffn.experts.E.w1.weight`,
//   `mtp.0.*`), transformers' mixed "original format" save (`model.` prefix,
//   `model.embed_tokens.weight`, `attn.norm.weight` = main kv_norm), and transformers' internal
//   names (`model.layers.L.self_attn.q_a_proj.weight`, fused `mlp.experts.gate_up_proj` which is
//   kept as `layers.L.ffn.experts.gate_up_proj` / `.down_proj`). Scale tensors `.scale` and HF's
//   `.weight_scale_inv` both map to `<module>.scale`.
// Stored formats decoded by `read_f32`: F32, BF16, F16; F8_E4M3 with a block-scale tensor
// (`.scale`, F8_E8M0 or F32, grid [ceil(out/b0), ceil(in/b1)], usually 128×128); packed FP4 e2m1
// in I8 (two values per byte, low nibble first; logical [out, in] stored [out, in/2]) with one
// scale per 32 inputs ([out, in/32], F8_E8M0 or F32). F8_E4M3 without a scale tensor is decoded
// unscaled.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "base/status.h"

namespace v4::model {

/// One tensor as stored: dtype, shape, bytes inside a mapped file.
struct TensorInfo {
  std::string name;  // name as written in the file
  std::string file;  // path of the file holding it
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t bytes = 0;
};

/// Naming scheme detected from the tensor names.
enum class NamingScheme { kOfficial, kHfMixed, kHfInternal };
const char* naming_scheme_name(NamingScheme s);

/// Normalizes a checkpoint tensor name (any of the three schemes) to the official name.
std::string to_official_name(const std::string& name);

/// The name `official` has in a checkpoint written with naming `scheme` (the inverse of
/// to_official_name; scales keep the `.scale` suffix, see Checkpoint::stored_name).
std::string from_official_name(const std::string& official, NamingScheme scheme);

/// "[2, 3]".
std::string shape_str(const std::vector<int64_t>& shape);

class Checkpoint {
 public:
  Checkpoint();
  ~Checkpoint();
  Checkpoint(Checkpoint&&) noexcept;
  Checkpoint& operator=(Checkpoint&&) noexcept;

  /// Opens and indexes every shard of `dir`. Errors name the file and problem: missing files,
  /// truncated file (header length or data offsets past its end), header not valid JSON (with
  /// the parser's message), a header entry missing or mistyping dtype / shape / data_offsets
  /// (naming tensor and field), unknown dtype, byte size not matching dtype × shape, duplicate tensors, index naming a tensor absent from its shard.
  static Result<Checkpoint> open(const std::string& dir);
  /// Opens one safetensors file (any tensors, e.g. golden.safetensors); same checks as `open`.
  static Result<Checkpoint> open_file(const std::string& path);

  /// Tensor by official name (nullptr if absent).
  const TensorInfo* find(const std::string& official_name) const;
  bool has(const std::string& official_name) const { return find(official_name) != nullptr; }
  /// All tensors by official name.
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  NamingScheme scheme() const { return scheme_; }
  const std::string& dir() const { return dir_; }
  /// The name tensor `official_name` has in this checkpoint's files, or, when absent, the name
  /// it would have under the detected naming scheme (for error messages).
  std::string stored_name(const std::string& official_name) const;
  /// The kNotFound error for an absent tensor: the directory, the checkpoint-side name that was
  /// expected (stored_name), the naming scheme and, when they differ, the official name.
  Status missing_tensor(const std::string& official_name) const;
  /// Counts of stored dtypes, e.g. {"BF16": 12, "F8_E4M3": 40}.
  std::map<std::string, int> dtype_counts() const;

  /// Decodes tensor `official_name` to f32 row-major with logical shape `shape` (dequantizing
  /// FP8 / FP4 with their `.scale` tensors). Errors: missing tensor, dtype not decodable, shape
  /// mismatch (message: file, stored name, expected vs found shape and dtype).
  Result<std::vector<float>> read_f32(const std::string& official_name,
                                      const std::vector<int64_t>& shape) const;
  /// A 2-D weight in a format a GPU backend reads directly (ops::WFormat numbering):
  /// format 1 = BF16 bits, 2 = FP8 e4m3 with a 128×128 block-scale grid (scales decoded to f32;
  /// an FP8 tensor without a scale gets scale 1), 3 = packed MXFP4 with ue8m0 scale bytes.
  struct NativeTensor {
    int format = 0;
    std::vector<uint8_t> data;   // stored bytes, row-major
    std::vector<uint8_t> scale;  // FP8: f32 [ceil(N/128), ceil(K/128)]; MXFP4: u8 [N, K/32]
  };
  /// The native bytes of weight `official_name` with logical shape {N, K}. Returns kUnsupported
  /// (not an error for the caller: decode with read_f32 instead) when the tensor is F32/F16, or
  /// its scales are not 128×128 blocks (FP8) / ue8m0 (MXFP4); other errors as read_f32.
  Result<NativeTensor> read_native(const std::string& official_name,
                                   const std::vector<int64_t>& shape) const;
  /// Reads an integer tensor (I64 or I32) as int32 with shape `shape` (e.g. tid2eid).
  Result<std::vector<int32_t>> read_i32(const std::string& official_name,
                                        const std::vector<int64_t>& shape) const;

 private:
  struct MappedFile;
  Status add_file(const std::string& path);
  std::string dir_;
  std::vector<std::unique_ptr<MappedFile>> files_;
  std::map<std::string, TensorInfo> tensors_;
  NamingScheme scheme_ = NamingScheme::kOfficial;
  bool any_scale_inv_ = false;  // some scale is stored as `.weight_scale_inv` (HF)
};

}  // namespace v4::model
