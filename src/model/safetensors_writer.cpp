#include "model/safetensors_writer.h"

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

namespace v4::model {

WriteTensor make_f32_tensor(const std::string& name, const std::vector<int64_t>& shape,
                            const std::vector<float>& values) {
  WriteTensor t{name, DType::kF32, shape, {}};
  t.bytes.resize(values.size() * 4);
  if (!values.empty()) std::memcpy(t.bytes.data(), values.data(), t.bytes.size());
  return t;
}

WriteTensor make_i64_tensor(const std::string& name, const std::vector<int64_t>& values) {
  WriteTensor t{name, DType::kI64, {int64_t(values.size())}, {}};
  t.bytes.resize(values.size() * 8);
  if (!values.empty()) std::memcpy(t.bytes.data(), values.data(), t.bytes.size());
  return t;
}

Status write_safetensors(const std::string& path, const std::vector<WriteTensor>& tensors) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  uint64_t off = 0;
  for (const auto& t : tensors) {
    int64_t numel = 1;
    for (auto d : t.shape) numel *= d;
    if (uint64_t(numel) * dtype_size(t.dtype) != t.bytes.size())
      return make_error(ErrorCode::kInvalidArgument, "{}: tensor '{}' has {} bytes, shape needs {}",
                        path, t.name, t.bytes.size(), uint64_t(numel) * dtype_size(t.dtype));
    header[t.name] = {{"dtype", std::string(dtype_name(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {off, off + t.bytes.size()}}};
    off += t.bytes.size();
  }
  std::string h = header.dump();
  while (h.size() % 8) h += ' ';
  std::ofstream out(path, std::ios::binary);
  if (!out) return make_error(ErrorCode::kIoError, "{}: cannot open for writing", path);
  const uint64_t n = h.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out.write(h.data(), std::streamsize(h.size()));
  for (const auto& t : tensors)
    out.write(reinterpret_cast<const char*>(t.bytes.data()), std::streamsize(t.bytes.size()));
  if (!out) return make_error(ErrorCode::kIoError, "{}: write failed", path);
  return Status::Ok();
}

}  // namespace v4::model
