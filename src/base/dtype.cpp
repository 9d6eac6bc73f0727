#include "base/dtype.h"

#include <cstring>

namespace v4 {

bool parse_kv_dtype(std::string_view name, KvDtype* out) {
  if (name == "auto" || name == "f32" || name == "float32" || name == "fp32") {
    *out = KvDtype::kF32;
    return true;
  }
  if (name == "bf16" || name == "bfloat16") {
    *out = KvDtype::kBf16;
    return true;
  }
  if (name == "fp8" || name == "fp8_e4m3") {
    *out = KvDtype::kFp8;
    return true;
  }
  return false;
}

bool parse_index_cache_dtype(std::string_view name, IndexCacheDtype* out) {
  if (name == "auto") {
    *out = IndexCacheDtype::kAuto;
    return true;
  }
  if (name == "fp8") {
    *out = IndexCacheDtype::kFp8;
    return true;
  }
  return false;
}

int dtype_size(DType t) {
  switch (t) {
    case DType::kF32: case DType::kI32: return 4;
    case DType::kF16: case DType::kBF16: return 2;
    case DType::kF8E4M3: case DType::kF8E8M0: case DType::kI8: case DType::kU8:
    case DType::kBool: return 1;
    case DType::kI64: case DType::kF64: return 8;
  }
  return 0;
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kF8E4M3: return "F8_E4M3";
    case DType::kF8E8M0: return "F8_E8M0";
    case DType::kI8: return "I8";
    case DType::kU8: return "U8";
    case DType::kI32: return "I32";
    case DType::kI64: return "I64";
    case DType::kF64: return "F64";
    case DType::kBool: return "BOOL";
  }
  return "?";
}

bool parse_dtype(std::string_view n, DType* out) {
  static constexpr struct { std::string_view name; DType t; } kTable[] = {
      {"F32", DType::kF32},         {"F16", DType::kF16},         {"BF16", DType::kBF16},
      {"F8_E4M3", DType::kF8E4M3},  {"F8_E8M0", DType::kF8E8M0},  {"I8", DType::kI8},
      {"U8", DType::kU8},           {"I32", DType::kI32},         {"I64", DType::kI64},
      {"F64", DType::kF64},         {"BOOL", DType::kBool}};
  for (auto& e : kTable) {
    if (e.name == n) { *out = e.t; return true; }
  }
  return false;
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  if (exp == 0) {
    float f = std::ldexp(float(man), -24);
    return sign ? -f : f;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (man << 13));
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t f32_to_f16(float f) {
  // Round-to-nearest-even via double arithmetic on the magnitude.
  uint32_t u = std::bit_cast<uint32_t>(f);
  uint16_t sign = uint16_t((u >> 16) & 0x8000);
  float a = std::fabs(f);
  if (std::isnan(f)) return sign | 0x7e00;
  if (a >= 65520.f) return sign | 0x7c00;
  if (a < 6.103515625e-05f) {  // subnormal: multiples of 2^-24
    return sign | uint16_t(std::nearbyint(double(a) * 16777216.0));
  }
  int e;
  double m = std::frexp(double(a), &e);  // a = m * 2^e, m in [0.5,1)
  uint32_t mant = uint32_t(std::nearbyint((m * 2.0 - 1.0) * 1024.0));
  int exp = e - 1 + 15;
  if (mant == 1024) { mant = 0; ++exp; }
  if (exp >= 31) return sign | 0x7c00;
  return sign | uint16_t(exp << 10) | uint16_t(mant);
}

float fp8e4m3_to_f32(uint8_t v) {
  uint32_t sign = v >> 7, exp = (v >> 3) & 0xf, man = v & 0x7;
  float r;
  if (exp == 0xf && man == 0x7) return NAN;
  if (exp == 0) r = std::ldexp(float(man), -9);
  else r = std::ldexp(1.0f + float(man) / 8.0f, int(exp) - 7);
  return sign ? -r : r;
}

uint8_t f32_to_fp8e4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  uint8_t sign = std::signbit(f) ? 0x80 : 0;
  double a = std::fabs(double(f));
  if (a >= 448.0) return sign | 0x7e;
  if (a < std::ldexp(1.0, -6)) {  // subnormal: multiples of 2^-9
    return sign | uint8_t(std::nearbyint(a * 512.0));
  }
  int e;
  double m = std::frexp(a, &e);
  uint32_t mant = uint32_t(std::nearbyint((m * 2.0 - 1.0) * 8.0));
  int exp = e - 1 + 7;
  if (mant == 8) { mant = 0; ++exp; }
  if (exp > 15 || (exp == 15 && mant == 7)) return sign | 0x7e;
  return sign | uint8_t(exp << 3) | uint8_t(mant);
}

}  // namespace v4
