// Scalar number formats used by DeepSeek-V4 checkpoints and caches, with exact conversions.
// Sources: IEEE 754 (f16), bfloat16 (truncated f32, round-to-nearest-even on store),
// OCP 8-bit floating point spec (e4m3fn: bias 7, no inf, 0x7f/0xff = NaN, max 448),
// OCP Microscaling spec (e2m1 fp4, ue8m0 scale = 2^(byte-127), 0xff = NaN).
#pragma once
#include <bit>
#include <cmath>
#include <cstdint>
#include <string_view>

namespace v4 {

/// Element types as named by safetensors ("F32", "BF16", "F8_E4M3", ...).
enum class DType { kF32, kF16, kBF16, kF8E4M3, kF8E8M0, kI8, kU8, kI32, kI64, kF64, kBool };

/// Storage format of the KV cache pools' rows (SWA, compressed C4/C128, indexer keys;
/// docs/cache.md). Values are computed in f32 and converted on store (bf16: round-to-nearest-
/// even) and on read. Compressor-state rings stay f32 in every mode. kFp8: attention rows (SWA,
/// C4, C128) as e4m3 nope values with per-64 f32 scales + bf16 rope values (base/kv_fp8.h,
/// KvFp8Layout); indexer keys as kFp8Index rows (kv_index_dtype).
/// kFp8Index: the indexer-key pool of --kv-cache-dtype fp8 or --index-cache-dtype fp8 (never a
/// --kv-cache-dtype value): rows of n e4m3 codes (every value, RoPE channels included) + one f32
/// scale, padded to 16 bytes (KvFp8IndexLayout; V4: 128 + 4 + 12 = 144 bytes).
enum class KvDtype : int { kF32 = 0, kBf16 = 1, kFp8 = 2, kFp8Index = 3 };
/// Bytes per stored KV value: 4 (kF32), 2 (kBf16), 1 (kFp8 / kFp8Index: the e4m3 codes; a
/// row's size is kv_row_bytes, which also counts scales and the bf16 rope part).
inline int kv_dtype_size(KvDtype t) {
  return t == KvDtype::kBf16 ? 2 : t == KvDtype::kFp8 || t == KvDtype::kFp8Index ? 1 : 4;
}
/// "f32", "bf16", "fp8" or "fp8_index".
inline const char* kv_dtype_name(KvDtype t) {
  return t == KvDtype::kBf16       ? "bf16"
         : t == KvDtype::kFp8      ? "fp8"
         : t == KvDtype::kFp8Index ? "fp8_index"
                                   : "f32";
}
/// How logs and reports name an indexer-key element type: "fp8" for kFp8Index rows (the value
/// --index-cache-dtype / --kv-cache-dtype take), otherwise kv_dtype_name.
inline const char* index_key_dtype_name(KvDtype t) {
  return t == KvDtype::kFp8Index ? "fp8" : kv_dtype_name(t);
}
/// Element type of the indexer-key pool for KV pools of `t`: kFp8 → kFp8Index (e4m3 codes + one
/// f32 scale per row), otherwise `t` (--index-cache-dtype auto).
inline KvDtype kv_index_dtype(KvDtype t) { return t == KvDtype::kFp8 ? KvDtype::kFp8Index : t; }
/// Parses a --kv-cache-dtype value: "auto" (= f32 until bf16 is measured on the GPU), "f32" /
/// "float32" / "fp32", "bf16" / "bfloat16", "fp8" / "fp8_e4m3". Returns false for anything else.
bool parse_kv_dtype(std::string_view name, KvDtype* out);

/// What --index-cache-dtype asks of the indexer-key pools. kAuto: follow the KV pools
/// (kv_index_dtype: kFp8 → kFp8Index, otherwise the KV dtype). kFp8: kFp8Index rows whatever the
/// KV dtype (SGLang and vLLM keep DeepSeek's indexer keys in fp8 with bf16 attention rows too).
enum class IndexCacheDtype : int { kAuto = 0, kFp8 = 1 };
/// Element type of the indexer-key pool for KV pools of `t` under `i`: kFp8Index when `i` is
/// kFp8, otherwise kv_index_dtype(t).
inline KvDtype kv_index_dtype(KvDtype t, IndexCacheDtype i) {
  return i == IndexCacheDtype::kFp8 ? KvDtype::kFp8Index : kv_index_dtype(t);
}
/// "auto" or "fp8".
inline const char* index_cache_dtype_name(IndexCacheDtype i) {
  return i == IndexCacheDtype::kFp8 ? "fp8" : "auto";
}
/// Parses an --index-cache-dtype value: "auto" or "fp8". Returns false for anything else.
bool parse_index_cache_dtype(std::string_view name, IndexCacheDtype* out);

/// Byte layout of one fp8 KV row (--kv-cache-dtype fp8; FlashMLA's V3.2 layout adapted to V4's
/// 448 nope + 64 rope split). A row of `dim` values whose last `rope` values are RoPE channels:
///   [0, nope)                      e4m3fn codes of the nope values, value i = code · scale[i/64]
///   [scale_off, +4·n_scales)       f32 scales, one per 64 nope values (the last block may be
///                                  shorter), then zero padding to 16 bytes
///   [rope_off, +2·rope)            bf16 rope values (round to nearest even)
///   padding to `bytes` (multiple of 16)
/// V4 (dim 512, rope 64): nope 448, 7 scales, scale_off 448, rope_off 480, bytes 608.
struct KvFp8Layout {
  static constexpr int kBlock = 64;  // nope values per scale
  int nope = 0, rope = 0, n_scales = 0;
  int scale_off = 0, rope_off = 0, bytes = 0;
};
/// The layout of a `dim`-value row with `rope_dim` trailing rope values (0 ≤ rope_dim ≤ dim).
constexpr KvFp8Layout kv_fp8_layout(int dim, int rope_dim) {
  KvFp8Layout l;
  l.nope = dim - rope_dim;
  l.rope = rope_dim;
  l.n_scales = (l.nope + KvFp8Layout::kBlock - 1) / KvFp8Layout::kBlock;
  l.scale_off = (l.nope + 15) / 16 * 16;
  l.rope_off = l.scale_off + (4 * l.n_scales + 15) / 16 * 16;
  l.bytes = (l.rope_off + 2 * l.rope + 15) / 16 * 16;
  return l;
}
static_assert(kv_fp8_layout(512, 64).bytes == 608 && kv_fp8_layout(512, 64).rope_off == 480);

/// Byte layout of one fp8 indexer-key row (KvDtype::kFp8Index; --kv-cache-dtype fp8 or
/// --index-cache-dtype fp8): all `n` values (RoPE channels included) share one scale.
///   [0, n)          e4m3fn codes, value i = code · scale
///   [n, n + 4)      the f32 scale
///   [n + 4, bytes) zero padding to a multiple of 16 bytes
/// bytes = n + 4 rounded up to 16 (V4's 128-dim keys: 144 bytes). n must be a multiple of 16, so
/// every row's codes start 16-byte aligned and the decode indexer reads them with 16-byte loads
/// (132-byte unpadded rows allowed only 4-byte loads: at 230,400 keys the fp8 scores kernel took
/// as long as the bf16 one with twice the bytes, bench/results/cuda-indexer.md). The padding
/// costs 9% of the indexer-key bytes.
struct KvFp8IndexLayout {
  int n = 0, scale_off = 0, bytes = 0;
};
/// The layout of an `n`-value indexer-key row (n > 0, n % 16 == 0: the caller checks).
constexpr KvFp8IndexLayout kv_fp8_index_layout(int n) {
  KvFp8IndexLayout l;
  l.n = n;
  l.scale_off = n;
  l.bytes = (n + 4 + 15) / 16 * 16;
  return l;
}
static_assert(kv_fp8_index_layout(128).bytes == 144);

/// Bytes of one stored row of `dim` values in a pool of `t` (kFp8: kv_fp8_layout(dim, rope_dim)
/// .bytes; kFp8Index: kv_fp8_index_layout(dim).bytes; otherwise dim · kv_dtype_size(t),
/// rope_dim unused).
constexpr int64_t kv_row_bytes(KvDtype t, int64_t dim, int rope_dim) {
  if (t == KvDtype::kFp8) return kv_fp8_layout(int(dim), rope_dim).bytes;
  if (t == KvDtype::kFp8Index) return kv_fp8_index_layout(int(dim)).bytes;
  return dim * (t == KvDtype::kBf16 ? 2 : 4);
}

/// Bytes per element (kI8 packed-fp4 containers report 1).
int dtype_size(DType t);
/// safetensors name of a dtype, e.g. "BF16".
std::string_view dtype_name(DType t);
/// Parses a safetensors dtype name; returns false for unknown names.
bool parse_dtype(std::string_view name, DType* out);

inline float bf16_to_f32(uint16_t v) { return std::bit_cast<float>(uint32_t(v) << 16); }
/// Round-to-nearest-even f32 -> bf16 (NaN stays NaN).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
/// Rounds f32 to the nearest bf16 value and back (what a bf16 store + load does).
inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

/// FP8 e4m3fn -> f32 (exact).
float fp8e4m3_to_f32(uint8_t v);
/// f32 -> FP8 e4m3fn, round-to-nearest-even, saturating to ±448.
uint8_t f32_to_fp8e4m3(float f);
/// ue8m0 scale byte -> 2^(b-127) (b = 255 -> NaN).
inline float ue8m0_to_f32(uint8_t b) {
  if (b == 0xff) return NAN;
  return std::ldexp(1.0f, int(b) - 127);
}
/// FP4 e2m1 nibble (low 4 bits) -> f32: {0,.5,1,1.5,2,3,4,6} with sign bit 3.
inline float fp4e2m1_to_f32(uint8_t nib) {
  static constexpr float kLut[16] = {0.f, .5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f,
                                     -0.f, -.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};
  return kLut[nib & 0xf];
}

}  // namespace v4
