// Minimal safetensors writer (dump files for `v4serve generate --dump-logits`, test inputs).
// Format: 8-byte little-endian header length, JSON header {name: {dtype, shape, data_offsets}},
// then the raw little-endian tensor bytes.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "base/status.h"

namespace v4::model {

/// One tensor to write: raw bytes must equal prod(shape) · dtype_size(dtype).
struct WriteTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

WriteTensor make_f32_tensor(const std::string& name, const std::vector<int64_t>& shape,
                            const std::vector<float>& values);
WriteTensor make_i64_tensor(const std::string& name, const std::vector<int64_t>& values);

/// Writes `tensors` to `path`. Errors: kIoError (cannot write), kInvalidArgument (size mismatch).
Status write_safetensors(const std::string& path, const std::vector<WriteTensor>& tensors);

}  // namespace v4::model
