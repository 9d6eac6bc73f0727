// Backend-independent parts of ops.h: weight formats and the default `linear_w`.
#include <stdexcept>
#include <string>

#include "ops/ops.h"

namespace v4::ops {

const char* wformat_name(WFormat f) {
  switch (f) {
    case WFormat::kF32:
      return "f32";
    case WFormat::kBF16:
      return "bf16";
    case WFormat::kFP8Block:
      return "fp8-block";
    case WFormat::kMXFP4:
      return "mxfp4";
  }
  return "?";
}

int64_t wformat_bytes(WFormat f, int64_t n, int64_t k) {
  switch (f) {
    case WFormat::kF32:
      return n * k * 4;
    case WFormat::kBF16:
      return n * k * 2;
    case WFormat::kFP8Block:
      return n * k + ((n + 127) / 128) * ((k + 127) / 128) * 4;
    case WFormat::kMXFP4:
      return n * (k / 2) + n * (k / 32);
  }
  return 0;
}

void Ops::linear_w(const float* x, int64_t ldx, const WeightView& w, int64_t M, float* y,
                   int64_t ldy) {
  if (w.format != WFormat::kF32)
    throw std::invalid_argument(std::string("linear_w: backend '") + name() +
                                "' does not read weights stored as " + wformat_name(w.format));
  linear(x, ldx, w.f32_rows(), M, w.n, w.k, y, ldy);
}

}  // namespace v4::ops
