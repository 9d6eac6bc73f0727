#include "model/checkpoint.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

namespace v4::model {
namespace fs = std::filesystem;
using nlohmann::json;

struct Checkpoint::MappedFile {
  std::string path;
  int fd = -1;
  void* base = nullptr;
  size_t size = 0;
  ~MappedFile() {
    if (base && size) munmap(base, size);
    if (fd >= 0) close(fd);
  }
};

Checkpoint::Checkpoint() = default;
Checkpoint::~Checkpoint() = default;
Checkpoint::Checkpoint(Checkpoint&&) noexcept = default;
Checkpoint& Checkpoint::operator=(Checkpoint&&) noexcept = default;

const char* naming_scheme_name(NamingScheme s) {
  switch (s) {
    case NamingScheme::kOfficial:
      return "official (DeepSeek)";
    case NamingScheme::kHfMixed:
      return "transformers original-format save (mixed)";
    case NamingScheme::kHfInternal:
      return "transformers internal";
  }
  return "?";
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

namespace {

bool starts_with(const std::string& s, const std::string& p) {
  return s.rfind(p, 0) == 0;
}
bool ends_with(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

// Per-layer tails (after "layers.N." / "mtp.N."): transformers internal ↔ official, one table for
// both directions (to_official_name and from_official_name). Entries are prefixes, or whole names
// with `exact`; the first match wins, so the specific ones come before their fallbacks.
struct TailName {
  const char* hf;
  const char* official;
  bool exact = false;
};
constexpr TailName kTailNames[] = {
    {"input_layernorm.weight", "attn_norm.weight", true},
    {"post_attention_layernorm.weight", "ffn_norm.weight", true},
    {"attn_hc.", "hc_attn_"},
    {"ffn_hc.", "hc_ffn_"},
    {"self_attn.compressor.indexer.scorer.weights_proj.", "attn.indexer.weights_proj."},
    {"self_attn.compressor.indexer.q_b_proj.", "attn.indexer.wq_b."},
    {"self_attn.compressor.indexer.kv_proj.", "attn.indexer.compressor.wkv."},
    {"self_attn.compressor.indexer.gate_proj.", "attn.indexer.compressor.wgate."},
    {"self_attn.compressor.indexer.kv_norm.", "attn.indexer.compressor.norm."},
    {"self_attn.compressor.indexer.position_bias", "attn.indexer.compressor.ape", true},
    {"self_attn.compressor.indexer.", "attn.indexer.compressor."},
    {"self_attn.compressor.kv_proj.", "attn.compressor.wkv."},
    {"self_attn.compressor.gate_proj.", "attn.compressor.wgate."},
    {"self_attn.compressor.kv_norm.", "attn.compressor.norm."},
    {"self_attn.compressor.position_bias", "attn.compressor.ape", true},
    {"self_attn.compressor.", "attn.compressor."},
    {"self_attn.q_a_proj.", "attn.wq_a."},
    {"self_attn.q_a_norm.", "attn.q_norm."},
    {"self_attn.q_b_proj.", "attn.wq_b."},
    {"self_attn.kv_proj.", "attn.wkv."},
    {"self_attn.o_a_proj.", "attn.wo_a."},
    {"self_attn.o_b_proj.", "attn.wo_b."},
    {"self_attn.sinks", "attn.attn_sink", true},
    {"self_attn.", "attn."},
    {"mlp.gate.e_score_correction_bias", "ffn.gate.bias", true},
    {"mlp.shared_experts.gate_proj.", "ffn.shared_experts.w1."},
    {"mlp.shared_experts.up_proj.", "ffn.shared_experts.w3."},
    {"mlp.shared_experts.down_proj.", "ffn.shared_experts.w2."},
    {"mlp.", "ffn."},
};

// Rewrites tail `r` through kTailNames, from the hf side (to_official = true) or the official
// side; a tail no entry matches is returned as it is.
std::string map_tail(const std::string& r, bool to_official) {
  for (const TailName& t : kTailNames) {
    const std::string from = to_official ? t.hf : t.official;
    const char* to = to_official ? t.official : t.hf;
    if (t.exact ? r == from : starts_with(r, from)) return to + r.substr(from.size());
  }
  return r;
}

// Per-layer tail: HF internal / mixed → official.
std::string layer_tail(const std::string& r) {
  if (r == "attn.norm.weight") return "attn.kv_norm.weight";  // mixed-save quirk (P16)
  return map_tail(r, true);
}

}  // namespace

std::string to_official_name(const std::string& name) {
  std::string s = name;
  if (ends_with(s, ".weight_scale_inv")) s = s.substr(0, s.size() - 17) + ".scale";
  if (starts_with(s, "model.")) s = s.substr(6);
  if (s == "embed_tokens.weight") return "embed.weight";
  if (s == "lm_head.weight") return "head.weight";
  if (starts_with(s, "hc_head.hc_")) return "hc_head_" + s.substr(11);
  for (const char* prefix : {"layers.", "mtp."}) {
    if (!starts_with(s, prefix)) continue;
    const size_t p = strlen(prefix);
    const size_t dot = s.find('.', p);
    if (dot == std::string::npos) return s;
    const std::string head = s.substr(0, dot + 1);
    const std::string tail = s.substr(dot + 1);
    if (std::string(prefix) == "mtp.") {
      // MTP modules nest a full block; map its members the same way.
      return head + layer_tail(tail);
    }
    return head + layer_tail(tail);
  }
  return s;
}

Status Checkpoint::add_file(const std::string& path) {
  auto mf = std::make_unique<MappedFile>();
  mf->path = path;
  mf->fd = ::open(path.c_str(), O_RDONLY);
  if (mf->fd < 0)
    return make_error(ErrorCode::kNotFound, "{}: cannot open: {}", path, strerror(errno));
  struct stat st {};
  if (fstat(mf->fd, &st) != 0) return make_error(ErrorCode::kIoError, "{}: cannot stat", path);
  if (!S_ISREG(st.st_mode))
    return make_error(ErrorCode::kCorruptData, "{}: is a {}, not a safetensors file", path,
                      S_ISDIR(st.st_mode) ? "directory" : "special file");
  mf->size = size_t(st.st_size);
  if (mf->size < 8)
    return make_error(
        ErrorCode::kCorruptData,
        "{}: truncated file ({} bytes; a safetensors file starts with an 8-byte header length)",
        path, mf->size);
  mf->base = mmap(nullptr, mf->size, PROT_READ, MAP_PRIVATE, mf->fd, 0);
  if (mf->base == MAP_FAILED) {
    mf->base = nullptr;
    return make_error(ErrorCode::kIoError, "{}: mmap failed: {}", path, strerror(errno));
  }
  const uint8_t* base = static_cast<const uint8_t*>(mf->base);
  uint64_t header_len = 0;
  std::memcpy(&header_len, base, 8);
  if (header_len > mf->size - 8)
    return make_error(ErrorCode::kCorruptData,
                      "{}: truncated file: header length {} exceeds the {} bytes after it", path,
                      header_len, mf->size - 8);
  json header;
  try {
    header = json::parse(std::string(reinterpret_cast<const char*>(base + 8), header_len));
  } catch (const std::exception& e) {
    std::string msg = e.what();
    std::replace(msg.begin(), msg.end(), '\n', ' ');
    return make_error(ErrorCode::kCorruptData,
                      "{}: header is not valid JSON: {} (the {}-byte header after the 8-byte length)",
                      path, msg, header_len);
  }
  if (!header.is_object())
    return make_error(ErrorCode::kCorruptData, "{}: header is not a JSON object (it is {} {})",
                      path, header.type_name() == std::string("array") ? "an" : "a",
                      header.type_name());
  const uint8_t* data = base + 8 + header_len;
  const size_t data_size = mf->size - 8 - header_len;
  // A header value quoted in an error: at most 80 characters.
  auto quoted = [](const json& v) {
    std::string d = v.dump(-1, ' ', false, json::error_handler_t::replace);
    return d.size() > 80 ? d.substr(0, 77) + "..." : d;
  };
  for (auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    if (!entry.is_object())
      return make_error(ErrorCode::kCorruptData,
                        "{}: tensor '{}': header entry is not an object ({}); expected "
                        "{{\"dtype\", \"shape\", \"data_offsets\"}}",
                        path, name, quoted(entry));
    for (const char* field : {"dtype", "shape", "data_offsets"})
      if (!entry.contains(field))
        return make_error(ErrorCode::kCorruptData, "{}: tensor '{}': header entry has no '{}'",
                          path, name, field);
    TensorInfo ti;
    ti.name = name;
    ti.file = path;
    const auto& dt = entry["dtype"];
    if (!dt.is_string())
      return make_error(ErrorCode::kCorruptData,
                        "{}: tensor '{}': 'dtype' must be a string such as \"BF16\", got {}", path,
                        name, quoted(dt));
    if (!parse_dtype(dt.get<std::string>(), &ti.dtype))
      return make_error(ErrorCode::kUnsupported, "{}: tensor '{}': unknown dtype {}", path, name,
                        dt.dump());
    const auto& shape = entry["shape"];
    if (!shape.is_array())
      return make_error(ErrorCode::kCorruptData,
                        "{}: tensor '{}': 'shape' must be an array of non-negative integers, got {}",
                        path, name, quoted(shape));
    // Bytes the shape needs, with overflow checked: [2^32, 2^32] F32 wrapped to 0, so a tensor
    // with data_offsets [0, 0] passed this check and `info` counted its wrapped element count.
    uint64_t need = uint64_t(dtype_size(ti.dtype));
    bool overflow = false;
    for (auto& d : shape) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0 ||
          (d.is_number_unsigned() && d.get<uint64_t>() > uint64_t(INT64_MAX)))
        return make_error(ErrorCode::kCorruptData,
                          "{}: tensor '{}': 'shape' must be an array of non-negative integers, "
                          "got {}",
                          path, name, quoted(shape));
      ti.shape.push_back(d.get<int64_t>());
      overflow = overflow || __builtin_mul_overflow(need, uint64_t(ti.shape.back()), &need);
    }
    if (overflow || need > uint64_t(INT64_MAX))
      return make_error(ErrorCode::kCorruptData,
                        "{}: tensor '{}': shape {} of {} needs more than 2^63 bytes", path, name,
                        shape_str(ti.shape), dtype_name(ti.dtype));
    const auto& off = entry["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
        !off[1].is_number_unsigned())
      return make_error(ErrorCode::kCorruptData,
                        "{}: tensor '{}': 'data_offsets' must be [begin, end] (two non-negative "
                        "integers), got {}",
                        path, name, quoted(off));
    const uint64_t b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
    if (b > e)
      return make_error(ErrorCode::kCorruptData,
                        "{}: tensor '{}': 'data_offsets' [{}, {}] ends before it begins", path,
                        name, b, e);
    if (e > data_size)
      return make_error(
          ErrorCode::kCorruptData,
          "{}: truncated file: tensor '{}' needs bytes [{}, {}) but the data section has {} bytes",
          path, name, b, e, data_size);
    const uint64_t expect = need;
    if (e - b != expect)
      return make_error(ErrorCode::kCorruptData,
                        "{}: tensor '{}': {} bytes stored but {} {} needs {}", path, name, e - b,
                        dtype_name(ti.dtype), shape_str(ti.shape), expect);
    ti.data = data + b;
    ti.bytes = e - b;
    const std::string official = to_official_name(name);
    if (tensors_.count(official))
      return make_error(ErrorCode::kCorruptData, "{}: tensor '{}' duplicates '{}' from {}", path,
                        name, tensors_[official].name, tensors_[official].file);
    tensors_.emplace(official, std::move(ti));
  }
  files_.push_back(std::move(mf));
  return Status::Ok();
}

std::string from_official_name(const std::string& official, NamingScheme scheme) {
  if (scheme == NamingScheme::kOfficial) return official;
  const bool internal = scheme == NamingScheme::kHfInternal;
  if (official == "embed.weight") return "model.embed_tokens.weight";
  if (official == "head.weight") return internal ? "lm_head.weight" : "head.weight";
  if (starts_with(official, "hc_head_")) return "model.hc_head.hc_" + official.substr(8);
  for (const char* prefix : {"layers.", "mtp."}) {
    if (!starts_with(official, prefix)) continue;
    const size_t dot = official.find('.', strlen(prefix));
    if (dot == std::string::npos) break;
    const std::string head = official.substr(0, dot + 1), tail = official.substr(dot + 1);
    if (internal) return "model." + head + map_tail(tail, false);
    // The mixed save keeps official names but for the main kv_norm (P16).
    return "model." + head + (tail == "attn.kv_norm.weight" ? "attn.norm.weight" : tail);
  }
  return "model." + official;
}

std::string Checkpoint::stored_name(const std::string& official_name) const {
  if (const TensorInfo* t = find(official_name)) return t->name;
  std::string n = from_official_name(official_name, scheme_);
  // Scales: `.weight_scale_inv` when this checkpoint writes its scales that way.
  if (ends_with(official_name, ".scale") && ends_with(n, ".scale") && any_scale_inv_)
    n = n.substr(0, n.size() - 6) + ".weight_scale_inv";
  return n;
}

Status Checkpoint::missing_tensor(const std::string& official_name) const {
  const std::string stored = stored_name(official_name);
  if (stored == official_name)
    return make_error(ErrorCode::kNotFound, "{}: missing tensor '{}' ({} naming detected)", dir_,
                      stored, naming_scheme_name(scheme_));
  return make_error(ErrorCode::kNotFound,
                    "{}: missing tensor '{}' ({} naming detected; v4serve's official name '{}')",
                    dir_, stored, naming_scheme_name(scheme_), official_name);
}

Result<Checkpoint> Checkpoint::open(const std::string& dir) {
  Checkpoint ck;
  ck.dir_ = dir;
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return make_error(ErrorCode::kNotFound, "{}: not a directory", dir);
  const std::string index_path = dir + "/model.safetensors.index.json";
  const std::string single = dir + "/model.safetensors";
  if (fs::exists(index_path)) {
    std::ifstream in(index_path);
    std::stringstream ss;
    ss << in.rdbuf();
    json idx;
    try {
      idx = json::parse(ss.str());
    } catch (const std::exception& e) {
      std::string msg = e.what();
      std::replace(msg.begin(), msg.end(), '\n', ' ');
      return make_error(ErrorCode::kCorruptData, "{}: bad JSON: {}", index_path, msg);
    }
    if (!idx.contains("weight_map") || !idx["weight_map"].is_object())
      return make_error(ErrorCode::kCorruptData, "{}: missing object 'weight_map'", index_path);
    std::set<std::string> shards;
    for (auto& [name, file] : idx["weight_map"].items()) {
      if (!file.is_string())
        return make_error(ErrorCode::kCorruptData, "{}: weight_map['{}'] is not a file name",
                          index_path, name);
      shards.insert(file.get<std::string>());
    }
    for (const auto& s : shards) V4_RETURN_IF_ERROR(ck.add_file(dir + "/" + s));
    for (auto& [name, file] : idx["weight_map"].items()) {
      const TensorInfo* t = ck.find(to_official_name(name));
      if (!t || t->name != name)
        return make_error(ErrorCode::kCorruptData,
                          "{}: tensor '{}' is listed in the index but absent from {}", index_path,
                          name, file.get<std::string>());
    }
  } else if (fs::exists(single)) {
    V4_RETURN_IF_ERROR(ck.add_file(single));
  } else {
    std::vector<std::string> files;
    for (auto& e : fs::directory_iterator(dir, ec))
      if (e.path().extension() == ".safetensors" && e.path().filename() != "golden.safetensors")
        files.push_back(e.path().string());
    std::sort(files.begin(), files.end());
    if (files.empty())
      return make_error(ErrorCode::kNotFound,
                        "{}: no model.safetensors, model.safetensors.index.json or *.safetensors",
                        dir);
    for (const auto& f : files) V4_RETURN_IF_ERROR(ck.add_file(f));
  }
  // Detect the naming scheme (informational).
  bool any_model_prefix = false, any_internal = false;
  for (auto& [off, t] : ck.tensors_) {
    any_model_prefix |= starts_with(t.name, "model.");
    any_internal |= t.name.find("self_attn.") != std::string::npos ||
                    t.name.find(".mlp.") != std::string::npos || t.name == "lm_head.weight";
    ck.any_scale_inv_ |= ends_with(t.name, ".weight_scale_inv");
  }
  ck.scheme_ = any_internal       ? NamingScheme::kHfInternal
               : any_model_prefix ? NamingScheme::kHfMixed
                                  : NamingScheme::kOfficial;
  return ck;
}

Result<Checkpoint> Checkpoint::open_file(const std::string& path) {
  Checkpoint ck;
  ck.dir_ = path;
  V4_RETURN_IF_ERROR(ck.add_file(path));
  return ck;
}

const TensorInfo* Checkpoint::find(const std::string& official_name) const {
  auto it = tensors_.find(official_name);
  return it == tensors_.end() ? nullptr : &it->second;
}

std::map<std::string, int> Checkpoint::dtype_counts() const {
  std::map<std::string, int> m;
  for (auto& [n, t] : tensors_) m[std::string(dtype_name(t.dtype))]++;
  return m;
}

namespace {

std::string scale_name_for(const std::string& weight_name) {
  if (ends_with(weight_name, ".weight"))
    return weight_name.substr(0, weight_name.size() - 7) + ".scale";
  return weight_name + ".scale";
}

Status shape_error(const TensorInfo& t, const std::vector<int64_t>& expect,
                   const std::string& note) {
  return make_error(ErrorCode::kInvalidArgument,
                    "{}: tensor '{}': expected shape {}{}, found {} {}", t.file, t.name,
                    shape_str(expect), note, dtype_name(t.dtype), shape_str(t.shape));
}

// Reads scale value s[i, j] of a scale tensor (F8_E8M0 or F32 or BF16).
float scale_at(const TensorInfo& s, int64_t i, int64_t j) {
  const int64_t idx = i * s.shape[1] + j;
  switch (s.dtype) {
    case DType::kF8E8M0:
      return ue8m0_to_f32(s.data[idx]);
    case DType::kF32: {
      float v;
      std::memcpy(&v, s.data + idx * 4, 4);
      return v;
    }
    case DType::kBF16: {
      uint16_t v;
      std::memcpy(&v, s.data + idx * 2, 2);
      return bf16_to_f32(v);
    }
    default:
      return NAN;
  }
}

}  // namespace

Result<std::vector<float>> Checkpoint::read_f32(const std::string& name,
                                                const std::vector<int64_t>& shape) const {
  const TensorInfo* t = find(name);
  if (!t) return missing_tensor(name);
  int64_t numel = 1;
  for (auto d : shape) numel *= d;
  std::vector<float> out(static_cast<size_t>(numel));
  const uint8_t* p = t->data;
  switch (t->dtype) {
    case DType::kF32:
    case DType::kBF16:
    case DType::kF16:
    case DType::kF8E4M3: {
      if (t->shape != shape) return shape_error(*t, shape, "");
      for (int64_t i = 0; i < numel; ++i) {
        switch (t->dtype) {
          case DType::kF32:
            std::memcpy(&out[i], p + 4 * i, 4);
            break;
          case DType::kBF16: {
            uint16_t v;
            std::memcpy(&v, p + 2 * i, 2);
            out[i] = bf16_to_f32(v);
            break;
          }
          case DType::kF16: {
            uint16_t v;
            std::memcpy(&v, p + 2 * i, 2);
            out[i] = f16_to_f32(v);
            break;
          }
          default:
            out[i] = fp8e4m3_to_f32(p[i]);
            break;
        }
      }
      if (t->dtype == DType::kF8E4M3) {
        const TensorInfo* s = find(scale_name_for(name));
        if (s) {
          if (shape.size() != 2 || s->shape.size() != 2 || s->shape[0] <= 0 || s->shape[1] <= 0)
            return make_error(ErrorCode::kInvalidArgument,
                              "{}: tensor '{}': FP8 block scale must be 2-D, found {} {}", s->file,
                              s->name, dtype_name(s->dtype), shape_str(s->shape));
          // Block size from the scale grid: DeepSeek's 128-blocks (ceil grid, the last block may be
          // partial), else an exact division of the dim by the grid (transformers' rule).
          auto block = [](int64_t dim, int64_t grid) -> int64_t {
            if ((dim + 127) / 128 == grid) return 128;
            if (dim % grid == 0) return dim / grid;
            return 0;
          };
          const int64_t b0 = block(shape[0], s->shape[0]);
          const int64_t b1 = block(shape[1], s->shape[1]);
          if (b0 == 0 || b1 == 0)
            return make_error(ErrorCode::kInvalidArgument,
                              "{}: tensor '{}': scale grid {} does not tile weight {}", s->file,
                              s->name, shape_str(s->shape), shape_str(shape));
          if (s->dtype != DType::kF8E8M0 && s->dtype != DType::kF32 && s->dtype != DType::kBF16)
            return make_error(
                ErrorCode::kUnsupported,
                "{}: tensor '{}': scale dtype {} not supported (expected F8_E8M0 or F32)", s->file,
                s->name, dtype_name(s->dtype));
          for (int64_t i = 0; i < shape[0]; ++i)
            for (int64_t j = 0; j < shape[1]; ++j)
              out[i * shape[1] + j] *= scale_at(*s, i / b0, j / b1);
        }
      }
      return out;
    }
    case DType::kI8:
    case DType::kU8: {
      // Packed FP4 e2m1: logical [.., in], stored [.., in/2], scale [.., in/32].
      std::vector<int64_t> stored = shape;
      if (stored.empty() || stored.back() % 2) return shape_error(*t, shape, " (packed FP4)");
      stored.back() /= 2;
      if (t->shape != stored)
        return shape_error(*t, stored,
                           fmt::format(" (packed FP4 of logical {})", shape_str(shape)));
      const int64_t in = shape.back();
      const int64_t rows = numel / in;
      const TensorInfo* s = find(scale_name_for(name));
      if (!s)
        return make_error(ErrorCode::kNotFound,
                          "{}: tensor '{}' is packed FP4 but its scale '{}' is missing", t->file,
                          t->name, stored_name(scale_name_for(name)));
      if (s->shape.size() != 2 || s->shape[0] != rows || s->shape[1] * 32 != in)
        return make_error(ErrorCode::kInvalidArgument,
                          "{}: tensor '{}': expected FP4 scale shape [{}, {}], found {} {}",
                          s->file, s->name, rows, in / 32, dtype_name(s->dtype),
                          shape_str(s->shape));
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < in; ++c) {
          const uint8_t byte = p[(r * in + c) / 2];
          const uint8_t nib = (c % 2 == 0) ? (byte & 0xf) : (byte >> 4);
          out[r * in + c] = fp4e2m1_to_f32(nib) * scale_at(*s, r, c / 32);
        }
      return out;
    }
    default:
      return make_error(ErrorCode::kUnsupported,
                        "{}: tensor '{}': dtype {} cannot be read as a float weight", t->file,
                        t->name, dtype_name(t->dtype));
  }
}

Result<Checkpoint::NativeTensor> Checkpoint::read_native(const std::string& name,
                                                        const std::vector<int64_t>& shape) const {
  const TensorInfo* t = find(name);
  if (!t) return missing_tensor(name);
  if (shape.size() != 2)
    return make_error(ErrorCode::kUnsupported, "read_native: '{}' is not 2-D", name);
  const int64_t N = shape[0], K = shape[1];
  NativeTensor nt;
  switch (t->dtype) {
    case DType::kBF16:
      if (t->shape != shape) return shape_error(*t, shape, "");
      nt.format = 1;
      nt.data.assign(t->data, t->data + t->bytes);
      return nt;
    case DType::kF8E4M3: {
      if (t->shape != shape) return shape_error(*t, shape, "");
      const int64_t gr = (N + 127) / 128, gc = (K + 127) / 128;
      std::vector<float> sc(size_t(gr * gc), 1.f);
      if (const TensorInfo* s = find(scale_name_for(name))) {
        if (s->shape != std::vector<int64_t>{gr, gc} ||
            (s->dtype != DType::kF8E8M0 && s->dtype != DType::kF32 && s->dtype != DType::kBF16))
          return make_error(ErrorCode::kUnsupported, "read_native: '{}' scale grid {} {}", name,
                            dtype_name(s->dtype), shape_str(s->shape));
        for (int64_t i = 0; i < gr; ++i)
          for (int64_t j = 0; j < gc; ++j) sc[size_t(i * gc + j)] = scale_at(*s, i, j);
      }
      nt.format = 2;
      nt.data.assign(t->data, t->data + t->bytes);
      nt.scale.resize(sc.size() * 4);
      std::memcpy(nt.scale.data(), sc.data(), nt.scale.size());
      return nt;
    }
    case DType::kI8:
    case DType::kU8: {
      if (K % 32 || t->shape != std::vector<int64_t>{N, K / 2})
        return shape_error(*t, {N, K / 2}, fmt::format(" (packed FP4 of logical {})", shape_str(shape)));
      const TensorInfo* s = find(scale_name_for(name));
      if (!s || s->dtype != DType::kF8E8M0 || s->shape != std::vector<int64_t>{N, K / 32})
        return make_error(ErrorCode::kUnsupported, "read_native: '{}' FP4 scale not ue8m0 [N, K/32]",
                          name);
      nt.format = 3;
      nt.data.assign(t->data, t->data + t->bytes);
      nt.scale.assign(s->data, s->data + s->bytes);
      return nt;
    }
    default:
      return make_error(ErrorCode::kUnsupported, "read_native: '{}' is {}", name,
                        dtype_name(t->dtype));
  }
}

Result<std::vector<int32_t>> Checkpoint::read_i32(const std::string& name,
                                                  const std::vector<int64_t>& shape) const {
  const TensorInfo* t = find(name);
  if (!t) return missing_tensor(name);
  if (t->shape != shape) return shape_error(*t, shape, "");
  int64_t numel = 1;
  for (auto d : shape) numel *= d;
  std::vector<int32_t> out(static_cast<size_t>(numel));
  if (t->dtype == DType::kI64) {
    for (int64_t i = 0; i < numel; ++i) {
      int64_t v;
      std::memcpy(&v, t->data + 8 * i, 8);
      out[i] = int32_t(v);
    }
  } else if (t->dtype == DType::kI32) {
    std::memcpy(out.data(), t->data, size_t(numel) * 4);
  } else {
    return make_error(ErrorCode::kInvalidArgument,
                      "{}: tensor '{}': expected dtype I64 or I32, found {} {}", t->file, t->name,
                      dtype_name(t->dtype), shape_str(t->shape));
  }
  return out;
}

}  // namespace v4::model
