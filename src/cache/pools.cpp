#include "cache/pools.h"

#include <cstring>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>

namespace v4::cache {
namespace {
constexpr int64_t kF32 = 4;
// Process-wide counter behind KvCache::id() and addressing_version(): values never repeat, so a
// mirror keyed by (cache id, version) can never mistake a new state for an old one.
std::atomic<uint64_t> g_counter{0};
uint64_t next_stamp() {
  return g_counter.fetch_add(1, std::memory_order_relaxed) + 1;
}
int overlap_of(AttnKind k) {
  return k == AttnKind::kCsa ? 2 : 1;
}
}  // namespace

int64_t KvCache::virtual_page_bytes(const CacheSpec& spec, int page_size) {
  int64_t b = 0;
  for (const auto& l : spec.layers) {
    if (l.kind == AttnKind::kSliding || l.ratio <= 0) continue;
    const int64_t rows = page_size / l.ratio;
    b += rows * (spec.attn_row_bytes(l) + (l.kind == AttnKind::kCsa ? spec.index_row_bytes(l) : 0));
  }
  return b;
}

int64_t KvCache::swa_page_bytes(const CacheSpec& spec, int page_size) {
  int64_t b = 0;
  for (const auto& l : spec.layers)
    b += int64_t(page_size) * spec.attn_row_bytes(l);
  return b;
}

int64_t KvCache::state_slot_bytes(const CacheSpec& spec) {
  int64_t b = 0;
  for (const auto& l : spec.layers) {
    if (l.kind == AttnKind::kSliding) continue;
    const int c = overlap_of(l.kind);
    b += 2 * int64_t(c) * l.ratio * c * l.kv_dim * kF32;  // main kv + gate
    if (l.kind == AttnKind::kCsa)
      b += 2 * int64_t(2) * l.ratio * 2 * l.index_dim * kF32;  // indexer
  }
  return b;
}

std::vector<std::pair<std::string, double>> KvCache::bytes_per_token(const CacheSpec& spec) {
  double c4 = 0, idx = 0, c128 = 0, swa = 0;
  for (const auto& l : spec.layers) {
    const double row = double(spec.attn_row_bytes(l));
    swa += row;
    if (l.kind == AttnKind::kCsa) {
      c4 += row / l.ratio;
      idx += double(spec.index_row_bytes(l)) / l.ratio;
    } else if (l.kind == AttnKind::kHca) {
      c128 += row / l.ratio;
    }
  }
  return {{"c4_kv", c4}, {"c4_index", idx}, {"c128_kv", c128}, {"swa", swa}};
}

Result<KvCacheOptions> KvCache::options_from_budget(const CacheSpec& spec, int64_t budget_bytes,
                                                    int page_size, int max_seqs,
                                                    int64_t max_chunk_tokens) {
  KvCacheOptions o;
  o.page_size = page_size;
  o.max_seqs = max_seqs;
  const int64_t state = state_slot_bytes(spec) * max_seqs;
  const int64_t per_page = virtual_page_bytes(spec, page_size) + swa_page_bytes(spec, page_size);
  const int64_t pages = per_page > 0 ? (budget_bytes - state) / per_page : 0;
  if (pages < 1)
    return make_error(ErrorCode::kResourceExhausted,
                      "KV cache budget {} bytes is too small: {} sequences need {} bytes of "
                      "compressor state plus {} bytes per {}-token page",
                      budget_bytes, max_seqs, state, per_page, page_size);
  o.n_pages = pages;
  o.n_swa_pages = pages;
  if (max_chunk_tokens > 0) {
    const int64_t per_seq =
        (max_chunk_tokens + spec.sliding_window - 1 + page_size - 1) / page_size + 1;
    const int64_t swa_pages = per_seq * max_seqs;
    const int64_t swa_bytes = swa_pages * swa_page_bytes(spec, page_size);
    const int64_t vpage = virtual_page_bytes(spec, page_size);
    const int64_t vpages = vpage > 0 ? (budget_bytes - state - swa_bytes) / vpage : pages;
    if (swa_pages < pages && vpages > pages) {
      o.n_swa_pages = swa_pages;
      o.n_pages = vpages;
    }
  }
  return o;
}

Result<std::unique_ptr<KvCache>> KvCache::create(const CacheSpec& spec, const KvCacheOptions& opt,
                                                 AllocFn alloc, FreeFn free) {
  if (opt.page_size <= 0 || opt.page_size % 128 != 0)
    return make_error(ErrorCode::kInvalidArgument,
                      "KV cache: page_size {} must be a positive multiple of 128", opt.page_size);
  for (size_t i = 0; i < spec.layers.size(); ++i) {
    const auto& l = spec.layers[i];
    if (l.kind != AttnKind::kSliding && (l.ratio <= 0 || opt.page_size % l.ratio != 0))
      return make_error(ErrorCode::kInvalidArgument,
                        "KV cache: layer {} compression rate {} must divide page_size {}", i,
                        l.ratio, opt.page_size);
  }
  if (opt.n_pages <= 0 || opt.n_swa_pages <= 0 || opt.max_seqs <= 0)
    return make_error(ErrorCode::kInvalidArgument,
                      "KV cache: n_pages, n_swa_pages and max_seqs must be > 0");
  std::unique_ptr<KvCache> kv(new KvCache());
  kv->id_ = next_stamp();
  kv->spec_ = spec;
  kv->opt_ = opt;
  kv->alloc_ = std::move(alloc);
  kv->free_ = std::move(free);
  int layer = 0;
  // KV pools hold spec.kv_dtype values (indexer keys: spec.index_dtype()); the compressor-state
  // rings stay f32.
  auto get_as = [&](int64_t n_values, const char* name, KvDtype dt) {
    void* p = kv->alloc_(size_t(n_values) * size_t(kv_dtype_size(dt)));
    kv->allocations_.push_back(p);
    kv->buffers_.push_back({name, layer, p, n_values, dt});
    return p;
  };
  // Attention pools: n_rows rows of attn_row_bytes (kFp8: one "value" per byte).
  auto get_kv = [&](int64_t n_rows, const LayerCacheSpec& l, const char* name) {
    const int64_t rb = spec.attn_row_bytes(l);
    return get_as(n_rows * rb / kv_dtype_size(spec.kv_dtype), name, spec.kv_dtype);
  };
  auto get = [&](int64_t n_values, const char* name) {
    return static_cast<float*>(get_as(n_values, name, KvDtype::kF32));
  };
  const int64_t tokens = opt.n_pages * opt.page_size;
  const int64_t swa_tokens = opt.n_swa_pages * opt.page_size;
  for (const auto& l : spec.layers) {
    LayerPools p;
    p.swa = get_kv(swa_tokens, l, "swa");
    if (l.kind != AttnKind::kSliding) {
      const int c = overlap_of(l.kind);
      const bool csa = l.kind == AttnKind::kCsa;
      p.comp = get_kv(tokens / l.ratio, l, csa ? "c4_kv" : "c128_kv");
      const int64_t ring = int64_t(opt.max_seqs) * c * l.ratio;
      p.ring_kv[0] = get(ring * c * l.kv_dim, "ring_kv");
      p.ring_gate[0] = get(ring * c * l.kv_dim, "ring_gate");
      if (csa) {
        // Indexer keys: index_row_bytes per row (kFp8Index: n codes + a scale, one "value" per
        // byte).
        const KvDtype idt = spec.index_dtype();
        p.index = get_as(tokens / l.ratio * spec.index_row_bytes(l) / kv_dtype_size(idt),
                         "c4_index", idt);
        const int64_t iring = int64_t(opt.max_seqs) * 2 * l.ratio;
        p.ring_kv[1] = get(iring * 2 * l.index_dim, "index_ring_kv");
        p.ring_gate[1] = get(iring * 2 * l.index_dim, "index_ring_gate");
      }
    }
    kv->layers_.push_back(p);
    ++layer;
  }
  for (int64_t i = opt.n_pages - 1; i >= 0; --i) kv->free_pages_.push_back(int32_t(i));
  for (int64_t i = opt.n_swa_pages - 1; i >= 0; --i) kv->free_swa_pages_.push_back(int32_t(i));
  for (int i = opt.max_seqs - 1; i >= 0; --i) kv->free_slots_.push_back(i);
  return kv;
}

KvCache::~KvCache() {
  for (void* p : allocations_)
    if (p) free_(p);
}

Result<int32_t> KvCache::create_sequence() {
  if (free_slots_.empty())
    return make_error(ErrorCode::kResourceExhausted, "KV cache: all {} sequence slots are in use",
                      opt_.max_seqs);
  Seq s;
  s.live = true;
  s.version = next_stamp();
  s.state_slot = free_slots_.back();
  free_slots_.pop_back();
  for (size_t i = 0; i < seqs_.size(); ++i)
    if (!seqs_[i].live) {
      seqs_[i] = std::move(s);
      return int32_t(i);
    }
  seqs_.push_back(std::move(s));
  return int32_t(seqs_.size() - 1);
}

bool KvCache::valid(int32_t seq) const {
  return seq >= 0 && size_t(seq) < seqs_.size() && seqs_[seq].live;
}

void KvCache::free_sequence(int32_t seq) {
  if (!valid(seq)) return;
  Seq& s = seqs_[seq];
  for (int32_t p : s.pages) free_pages_.push_back(p);
  for (int32_t p : s.swa_pages)
    if (p >= 0) free_swa_pages_.push_back(p);
  free_slots_.push_back(s.state_slot);
  s = Seq();
  s.version = next_stamp();
}

uint64_t KvCache::addressing_version(int32_t seq) const {
  return valid(seq) ? seqs_[seq].version : 0;
}

int64_t KvCache::length(int32_t seq) const {
  return valid(seq) ? seqs_[seq].length : 0;
}

std::pair<int64_t, int64_t> KvCache::pages_needed(int32_t seq, int64_t n_tokens) const {
  const int64_t want = (n_tokens + opt_.page_size - 1) / opt_.page_size;
  const int64_t have = valid(seq) ? int64_t(seqs_[seq].pages.size()) : 0;
  const int64_t more = std::max<int64_t>(0, want - have);
  return {more, more};
}

Status KvCache::reserve(int32_t seq, int64_t n_tokens) {
  if (!valid(seq))
    return make_error(ErrorCode::kInvalidArgument, "KV cache: unknown sequence {}", seq);
  Seq& s = seqs_[seq];
  const int64_t want = (n_tokens + opt_.page_size - 1) / opt_.page_size;
  const int64_t more = want - int64_t(s.pages.size());
  if (more <= 0) return Status::Ok();
  if (int64_t(free_pages_.size()) < more || int64_t(free_swa_pages_.size()) < more)
    return make_error(
        ErrorCode::kResourceExhausted,
        "KV cache full: sequence {} needs {} more pages ({} virtual and {} SWA pages free)", seq,
        more, free_pages_.size(), free_swa_pages_.size());
  for (int64_t i = 0; i < more; ++i) {
    s.pages.push_back(free_pages_.back());
    free_pages_.pop_back();
    s.swa_pages.push_back(free_swa_pages_.back());
    free_swa_pages_.pop_back();
  }
  s.version = next_stamp();
  return Status::Ok();
}

void KvCache::commit(int32_t seq, int64_t new_length) {
  if (!valid(seq)) return;
  Seq& s = seqs_[seq];
  s.length = new_length;
  // Tokens < new_length - (W - 1) are never read again by this sequence.
  const int64_t first_needed = std::max<int64_t>(0, new_length - (spec_.sliding_window - 1));
  // Pages below the watermark were freed by an earlier commit (SWA pages are only ever appended),
  // so a decode step's commit looks at the pages that died since then, not the whole context.
  const int64_t dead_pages =
      std::min<int64_t>(first_needed / opt_.page_size, int64_t(s.swa_pages.size()));
  for (int64_t p = s.swa_freed; p < dead_pages; ++p)
    if (s.swa_pages[p] >= 0) {
      free_swa_pages_.push_back(s.swa_pages[p]);
      s.swa_pages[p] = -1;
      s.version = next_stamp();
    }
  s.swa_freed = std::max(s.swa_freed, dead_pages);
}

std::pair<int64_t, int64_t> KvCache::fast_forward_pages(int64_t n) const {
  const int64_t P = opt_.page_size;
  const int64_t pages = (n + P - 1) / P;
  const int64_t first_swa = std::max<int64_t>(0, n - (spec_.sliding_window - 1)) / P;
  return {pages, std::max<int64_t>(0, pages - first_swa)};
}

Status KvCache::fast_forward(int32_t seq, int64_t n) {
  if (!valid(seq))
    return make_error(ErrorCode::kInvalidArgument, "KV cache: unknown sequence {}", seq);
  Seq& s = seqs_[seq];
  if (s.length != 0 || !s.pages.empty() || n < 0)
    return make_error(ErrorCode::kInvalidArgument,
                      "KV cache: fast_forward needs an empty sequence and n_tokens >= 0 (sequence "
                      "{} holds {} tokens, n_tokens {})",
                      seq, s.length, n);
  const auto [pages, swa] = fast_forward_pages(n);
  if (int64_t(free_pages_.size()) < pages || int64_t(free_swa_pages_.size()) < swa)
    return make_error(ErrorCode::kResourceExhausted,
                      "KV cache full: fast_forward of sequence {} to {} tokens needs {} virtual and "
                      "{} SWA pages ({} and {} free)",
                      seq, n, pages, swa, free_pages_.size(), free_swa_pages_.size());
  for (int64_t p = 0; p < pages; ++p) {
    s.pages.push_back(free_pages_.back());
    free_pages_.pop_back();
    if (p >= pages - swa) {
      s.swa_pages.push_back(free_swa_pages_.back());
      free_swa_pages_.pop_back();
    } else {
      s.swa_pages.push_back(-1);
    }
  }
  s.length = n;
  s.version = next_stamp();  // the pages changed: device mirrors must re-read this sequence
  return Status::Ok();
}

std::vector<PoolUsage> KvCache::usage() const {
  return {
      {"virtual_pages", opt_.n_pages - int64_t(free_pages_.size()), opt_.n_pages,
       virtual_page_bytes(spec_, opt_.page_size)},
      {"swa_pages", opt_.n_swa_pages - int64_t(free_swa_pages_.size()), opt_.n_swa_pages,
       swa_page_bytes(spec_, opt_.page_size)},
      {"state_slots", int64_t(opt_.max_seqs) - int64_t(free_slots_.size()), opt_.max_seqs,
       state_slot_bytes(spec_)},
  };
}

int32_t KvCache::swa_row(int32_t seq, int64_t pos) const {
  const Seq& s = seqs_[seq];
  const int32_t page = s.swa_pages[pos / opt_.page_size];
  if (page < 0) return -1;
  return int32_t(int64_t(page) * opt_.page_size + pos % opt_.page_size);
}

int32_t KvCache::compressed_row(int32_t seq, int64_t entry, int ratio) const {
  const Seq& s = seqs_[seq];
  const int64_t pos = entry * ratio;
  const int64_t slot =
      int64_t(s.pages[pos / opt_.page_size]) * opt_.page_size + pos % opt_.page_size;
  return int32_t(slot / ratio);
}

int32_t KvCache::ring_row(int32_t seq, int64_t pos, int ring_rows) const {
  return int32_t(int64_t(seqs_[seq].state_slot) * ring_rows + pos % ring_rows);
}

int KvCache::ring_rows(int l, int which) const {
  const auto& sp = spec_.layers[l];
  if (sp.kind == AttnKind::kSliding) return 0;
  if (which == 1) return sp.kind == AttnKind::kCsa ? 2 * sp.ratio : 0;
  return overlap_of(sp.kind) * sp.ratio;
}

void KvCache::copy_batch(const CopySegment* segs, int64_t n) const {
  if (n <= 0) return;
  if (copy_) {
    copy_(segs, n);
    return;
  }
  for (int64_t i = 0; i < n; ++i)
    if (segs[i].bytes) std::memcpy(segs[i].dst, segs[i].src, segs[i].bytes);
}

}  // namespace v4::cache
