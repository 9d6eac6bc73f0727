// Declarative per-layer cache specs and byte accounting for ShadowRadix (docs/cache.md).
//
// Every pool is built from one table: one `LayerSpecRow` row per decoder layer, derived from a
// handful of numbers (`CacheDims`) that the model's ModelConfig fills in. Adding an attention kind
// is one new row kind here, not a third copy of page tables / eviction / matching.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "base/status.h"

namespace v4::cache {

/// What the compressor of a layer must carry between steps (dsv4-model.md §5).
enum class StateKind {
  kNone,         // sliding-only layer: no compressor
  kOverlapRing,  // C4 (CSA attention + indexer): previous group's series-a half + open group
  kRawRing,      // C128 raw rows of the open group (up to ratio-1 tokens)
  kOnlineAccum,  // C128 online-softmax accumulator: running max, sum, weighted sum (3 rows)
};
const char* state_kind_name(StateKind k);

/// The numbers the cache needs from config.json. Units: values (elements) unless named `_bytes`.
struct CacheDims {
  std::vector<int> compress_ratios;  // [L] per layer: 0 (sliding only), 4 (CSA), 128 (HCA)
  int csa_ratio = 4;                 // layers with this ratio are CSA (overlapping + indexer);
                                     // any other ratio dividing 128 is HCA-like (tiny models: 16)
  int head_dim = 512;                // hd: SWA KV and compressed KV entry width
  int index_head_dim = 128;          // dI: indexer key width (CSA layers)
  int sliding_window = 128;          // W, tokens including the query itself
  DType kv_dtype = DType::kBF16;     // SWA KV, C4/C128 KV and indexer key storage
  DType state_dtype = DType::kF32;   // compressor state rows
  bool c128_online_accum = true;     // HCA state as 3-row accumulator instead of raw rows
};

/// One layer's row of the table. Widths in values, sizes in bytes.
struct LayerSpecRow {
  int layer = 0;
  int ratio = 0;             // 0 (sliding only), CSA ratio (4) or HCA ratio (128)
  bool csa = false;          // overlapping compressor + indexer
  int swa_width = 0;         // SWA KV values per token
  int ckv_width = 0;         // compressed KV values per entry (one entry per `ratio` tokens)
  int index_width = 0;       // indexer key values per entry (CSA only)
  int kv_bytes = 2;          // bytes per stored KV value
  StateKind state = StateKind::kNone;
  int64_t state_bytes = 0;   // bytes of one compressor-state snapshot of this layer
};

/// The whole table plus derived per-token byte counts. (Named apart from pools.h's CacheSpec,
/// the physical pools' table; `from_dims` takes the same numbers.)
struct LayerSpecTable {
  std::vector<LayerSpecRow> layers;
  int sliding_window = 128;

  /// Builds the table. Errors (kInvalidArgument): empty ratios, a ratio that does not divide 128,
  /// non-positive widths or window.
  static Result<LayerSpecTable> from_dims(const CacheDims& d);

  /// SWA KV bytes for one token over all layers (the SWA page pool).
  int64_t swa_bytes_per_token() const;
  /// C4 KV + indexer bytes per 128 tokens over all CSA layers (exact, no rounding).
  int64_t csa_bytes_per_128_tokens() const;
  /// C128 KV bytes per 128 tokens over all HCA layers (exact).
  int64_t hca_bytes_per_128_tokens() const;
  /// Compressed bytes per virtual page of `page_tokens` tokens (C4 + indexer + C128).
  int64_t compressed_bytes_per_page(int64_t page_tokens) const;
  /// Bytes of one compressor-state snapshot (all layers).
  int64_t snapshot_bytes() const;
  int n_layers_of_ratio(int ratio) const;
  int n_csa_layers() const;
};

/// Options of the memory split (from the CLI / engine).
struct PoolPlanOptions {
  int64_t budget_bytes = 0;        // --kv-cache-bytes (CPU) or mem-fraction × free (GPU)
  int64_t page_tokens = 256;       // virtual page size, a multiple of 128
  int64_t swa_page_tokens = 64;    // SWA page size, divides page_tokens
  int64_t max_running = 16;        // sequences running at once
  int64_t chunk_tokens = 2048;     // largest prefill chunk of one sequence in one step
  int64_t cached_windows = 0;      // boundary windows kept for reuse; 0 = 4 × max_running
};

/// Resulting pool sizes. `explanation` is the startup line.
struct PoolPlan {
  int64_t page_tokens = 0, swa_page_tokens = 0;
  int64_t n_pages = 0;            // virtual pages (each carries its C4/indexer/C128 entries)
  int64_t n_swa_pages = 0;
  int64_t n_snapshots = 0;        // compressor-state snapshot slots
  int64_t capacity_tokens = 0;    // n_pages × page_tokens
  int64_t bytes_compressed = 0, bytes_swa = 0, bytes_snapshots = 0;
  std::string explanation;
};

/// SWA pages one running sequence needs at most: window + one chunk, rounded out to pages.
int64_t swa_pages_per_running(int64_t window, int64_t chunk_tokens, int64_t swa_page_tokens);
/// SWA pages one kept boundary window spans at most.
int64_t swa_pages_per_window(int64_t window, int64_t swa_page_tokens);

/// Splits a byte budget: first the SWA pages and snapshots the running sequences and
/// `cached_windows` kept boundaries need, then the rest as virtual pages.
/// Errors (kInvalidArgument): bad page sizes; a budget too small for the fixed part or for at
/// least one page per running sequence (message says how many bytes are needed).
Result<PoolPlan> plan_pools(const LayerSpecTable& spec, const PoolPlanOptions& opt);

/// "1.50 GiB" style formatting of a byte count.
std::string format_bytes(int64_t bytes);

}  // namespace v4::cache
