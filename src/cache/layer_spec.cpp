#include "cache/layer_spec.h"

#include <fmt/format.h>

#include <algorithm>

namespace v4::cache {

const char* state_kind_name(StateKind k) {
  switch (k) {
    case StateKind::kNone: return "none";
    case StateKind::kOverlapRing: return "c4-overlap-ring";
    case StateKind::kRawRing: return "c128-raw-ring";
    case StateKind::kOnlineAccum: return "c128-online-accumulator";
  }
  return "?";
}

Result<LayerSpecTable> LayerSpecTable::from_dims(const CacheDims& d) {
  if (d.compress_ratios.empty())
    return make_error(ErrorCode::kInvalidArgument, "cache spec: compress_ratios is empty");
  if (d.head_dim <= 0 || d.index_head_dim <= 0 || d.sliding_window <= 0)
    return make_error(ErrorCode::kInvalidArgument,
                      "cache spec: head_dim {}, index_head_dim {}, sliding_window {} must be > 0",
                      d.head_dim, d.index_head_dim, d.sliding_window);
  LayerSpecTable s;
  s.sliding_window = d.sliding_window;
  const int kvb = dtype_size(d.kv_dtype);
  const int stb = dtype_size(d.state_dtype);
  for (size_t i = 0; i < d.compress_ratios.size(); ++i) {
    const int r = d.compress_ratios[i];
    LayerSpecRow l;
    l.layer = int(i);
    l.ratio = r;
    l.swa_width = d.head_dim;
    l.kv_bytes = kvb;
    if (r == 0) {
      l.state = StateKind::kNone;
    } else if (r > 0 && 128 % r == 0 && r == d.csa_ratio) {
      l.csa = true;
      // Overlapping compressor (c = 2): kv and gate rings of [2m, 2d], for the attention
      // compressor (d = hd) and the indexer's (d = dI). dsv4-model.md §5, official layout.
      l.ckv_width = d.head_dim;
      l.index_width = d.index_head_dim;
      l.state = StateKind::kOverlapRing;
      l.state_bytes = int64_t(2) * (2 * r) * (2 * d.head_dim) * stb +
                      int64_t(2) * (2 * r) * (2 * d.index_head_dim) * stb;
    } else if (r > 0 && 128 % r == 0) {
      l.ckv_width = d.head_dim;
      if (d.c128_online_accum) {
        l.state = StateKind::kOnlineAccum;  // running max, sum, weighted sum
        l.state_bytes = int64_t(3) * d.head_dim * stb;
      } else {
        l.state = StateKind::kRawRing;  // kv and gate rows of the open group
        l.state_bytes = int64_t(2) * r * d.head_dim * stb;
      }
    } else {
      return make_error(ErrorCode::kInvalidArgument,
                        "cache spec: layer {} has compress ratio {}; expected 0 or a divisor of 128 "
                        "(4, 128)",
                        i, r);
    }
    s.layers.push_back(l);
  }
  return s;
}

int64_t LayerSpecTable::swa_bytes_per_token() const {
  int64_t b = 0;
  for (const auto& l : layers) b += int64_t(l.swa_width) * l.kv_bytes;
  return b;
}

int64_t LayerSpecTable::csa_bytes_per_128_tokens() const {
  int64_t b = 0;
  for (const auto& l : layers)
    if (l.csa) b += int64_t(l.ckv_width + l.index_width) * l.kv_bytes * (128 / l.ratio);
  return b;
}

int64_t LayerSpecTable::hca_bytes_per_128_tokens() const {
  int64_t b = 0;
  for (const auto& l : layers)
    if (l.ratio > 0 && !l.csa) b += int64_t(l.ckv_width) * l.kv_bytes * (128 / l.ratio);
  return b;
}

int64_t LayerSpecTable::compressed_bytes_per_page(int64_t page_tokens) const {
  return (csa_bytes_per_128_tokens() + hca_bytes_per_128_tokens()) * (page_tokens / 128);
}

int64_t LayerSpecTable::snapshot_bytes() const {
  int64_t b = 0;
  for (const auto& l : layers) b += l.state_bytes;
  return b;
}

int LayerSpecTable::n_layers_of_ratio(int ratio) const {
  int n = 0;
  for (const auto& l : layers) n += l.ratio == ratio;
  return n;
}

int LayerSpecTable::n_csa_layers() const {
  int n = 0;
  for (const auto& l : layers) n += l.csa;
  return n;
}

std::string format_bytes(int64_t bytes) {
  const double b = double(bytes);
  if (bytes >= (int64_t(1) << 30)) return fmt::format("{:.2f} GiB", b / double(1 << 30));
  if (bytes >= (int64_t(1) << 20)) return fmt::format("{:.2f} MiB", b / double(1 << 20));
  if (bytes >= (int64_t(1) << 10)) return fmt::format("{:.2f} KiB", b / double(1 << 10));
  return fmt::format("{} B", bytes);
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

int64_t swa_pages_per_running(int64_t window, int64_t chunk_tokens, int64_t swa_page_tokens) {
  // Held range [pos - W, pos + chunk) may start mid-page: one extra page.
  return ceil_div(window + chunk_tokens, swa_page_tokens) + 1;
}

int64_t swa_pages_per_window(int64_t window, int64_t swa_page_tokens) {
  return ceil_div(window, swa_page_tokens) + 1;
}

Result<PoolPlan> plan_pools(const LayerSpecTable& spec, const PoolPlanOptions& o) {
  if (o.page_tokens <= 0 || o.page_tokens % 128 != 0)
    return make_error(ErrorCode::kInvalidArgument,
                      "cache: page size {} tokens must be a positive multiple of 128", o.page_tokens);
  if (o.swa_page_tokens <= 0 || o.page_tokens % o.swa_page_tokens != 0)
    return make_error(ErrorCode::kInvalidArgument,
                      "cache: SWA page size {} tokens must divide the page size {}",
                      o.swa_page_tokens, o.page_tokens);
  if (o.page_tokens < spec.sliding_window)
    return make_error(ErrorCode::kInvalidArgument,
                      "cache: page size {} must be >= sliding window {}", o.page_tokens,
                      spec.sliding_window);
  if (o.max_running <= 0 || o.chunk_tokens <= 0)
    return make_error(ErrorCode::kInvalidArgument,
                      "cache: max_running {} and chunk_tokens {} must be > 0", o.max_running,
                      o.chunk_tokens);
  PoolPlan p;
  p.page_tokens = o.page_tokens;
  p.swa_page_tokens = o.swa_page_tokens;
  const int64_t W = spec.sliding_window;
  const int64_t windows = o.cached_windows > 0 ? o.cached_windows : 4 * o.max_running;
  const int64_t swa_page_bytes = spec.swa_bytes_per_token() * o.swa_page_tokens;
  // Each running sequence: window + chunk, plus a tail-copy page's window and a few pending
  // boundary windows (branch point, prompt end) until it finishes.
  p.n_swa_pages = o.max_running * (swa_pages_per_running(W, o.chunk_tokens, o.swa_page_tokens) +
                                   3 * swa_pages_per_window(W, o.swa_page_tokens)) +
                  windows * swa_pages_per_window(W, o.swa_page_tokens);
  p.n_snapshots = windows + 3 * o.max_running;
  p.bytes_swa = p.n_swa_pages * swa_page_bytes;
  p.bytes_snapshots = p.n_snapshots * spec.snapshot_bytes();
  const int64_t page_bytes = spec.compressed_bytes_per_page(o.page_tokens);
  const int64_t fixed = p.bytes_swa + p.bytes_snapshots;
  const int64_t min_budget = fixed + o.max_running * 2 * std::max<int64_t>(page_bytes, 1);
  if (o.budget_bytes < min_budget)
    return make_error(ErrorCode::kInvalidArgument,
                      "cache: budget {} is too small: SWA pages ({}) + snapshots ({}) + 2 pages "
                      "per running sequence need at least {} ({} B) for max_running {}, chunk {}",
                      format_bytes(o.budget_bytes), format_bytes(p.bytes_swa),
                      format_bytes(p.bytes_snapshots), format_bytes(min_budget), min_budget,
                      o.max_running, o.chunk_tokens);
  // Pure sliding models have no compressed bytes: pages then only bound the address space.
  p.n_pages = page_bytes > 0 ? (o.budget_bytes - fixed) / page_bytes
                             : ceil_div(int64_t(1) << 20, o.page_tokens) * o.max_running;
  p.capacity_tokens = p.n_pages * o.page_tokens;
  p.bytes_compressed = p.n_pages * page_bytes;
  p.explanation = fmt::format(
      "KV cache {}: {} layers ({} SWA-only, {} CSA, {} HCA); compressed (C4 KV + indexer + C128 "
      "KV) {:.1f} B/token -> {} pages x {} tokens = {} tokens ({}); SWA {} B/token -> {} pages "
      "x {} tokens ({}, for {} running x (window {} + chunk {}) and {} kept windows); compressor "
      "snapshot {} each -> {} slots ({})",
      format_bytes(o.budget_bytes), spec.layers.size(), spec.n_layers_of_ratio(0),
      spec.n_csa_layers(), int(spec.layers.size()) - spec.n_layers_of_ratio(0) - spec.n_csa_layers(),
      double(page_bytes) / double(o.page_tokens), p.n_pages, o.page_tokens, p.capacity_tokens,
      format_bytes(p.bytes_compressed), spec.swa_bytes_per_token(), p.n_swa_pages,
      o.swa_page_tokens, format_bytes(p.bytes_swa), o.max_running, W, o.chunk_tokens, windows,
      format_bytes(spec.snapshot_bytes()), p.n_snapshots, format_bytes(p.bytes_snapshots));
  return p;
}

}  // namespace v4::cache
