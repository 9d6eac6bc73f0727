#include "cache/radix_kv.h"

#include <algorithm>
#include <cstring>

namespace v4::cache {

Result<std::unique_ptr<StateSnapshots>> StateSnapshots::create(const KvCache& kv, int32_t n) {
  if (n < 0) return make_error(ErrorCode::kInvalidArgument, "snapshots: negative slot count {}", n);
  auto s = std::unique_ptr<StateSnapshots>(new StateSnapshots());
  const auto& spec = kv.spec();
  for (int l = 0; l < int(spec.layers.size()); ++l) {
    const auto& L = spec.layers[size_t(l)];
    if (L.kind == AttnKind::kSliding) continue;
    for (int which = 0; which < 2; ++which) {
      const int rows = kv.ring_rows(l, which);
      if (rows <= 0) continue;
      // Ring widths as allocated by KvCache: main c·hd (c = 2 for CSA), indexer 2·dI.
      const int width = which == 0 ? (L.kind == AttnKind::kCsa ? 2 : 1) * L.kv_dim : 2 * L.index_dim;
      s->rings_.push_back({l, which, rows, width});
      s->floats_per_slot_ += 2 * int64_t(rows) * width;  // kv + gate
    }
  }
  s->n_slots_ = n;
  s->data_.assign(size_t(s->floats_per_slot_) * size_t(n), 0.f);
  return s;
}

Status StateSnapshots::save(const KvCache& kv, int32_t seq, int32_t id) {
  if (id < 0 || id >= n_slots_ || !kv.valid(seq))
    return make_error(ErrorCode::kInvalidArgument, "snapshots: bad slot {} or sequence {}", id, seq);
  float* dst = data_.data() + int64_t(id) * floats_per_slot_;
  for (const Ring& r : rings_) {
    const int64_t base = kv.ring_row(seq, 0, r.rows), n = int64_t(r.rows) * r.width;
    std::memcpy(dst, kv.ring_kv(r.layer, r.which) + base * r.width, size_t(n) * sizeof(float));
    dst += n;
    std::memcpy(dst, kv.ring_gate(r.layer, r.which) + base * r.width, size_t(n) * sizeof(float));
    dst += n;
  }
  return Status::Ok();
}

Status StateSnapshots::load(KvCache& kv, int32_t id, int32_t seq) const {
  if (id < 0 || id >= n_slots_ || !kv.valid(seq))
    return make_error(ErrorCode::kInvalidArgument, "snapshots: bad slot {} or sequence {}", id, seq);
  const float* src = data_.data() + int64_t(id) * floats_per_slot_;
  for (const Ring& r : rings_) {
    const int64_t base = kv.ring_row(seq, 0, r.rows), n = int64_t(r.rows) * r.width;
    std::memcpy(kv.ring_kv(r.layer, r.which) + base * r.width, src, size_t(n) * sizeof(float));
    src += n;
    std::memcpy(kv.ring_gate(r.layer, r.which) + base * r.width, src, size_t(n) * sizeof(float));
    src += n;
  }
  return Status::Ok();
}

Status copy_prefix_state(KvCache& kv, int32_t src, int32_t dst, int64_t n) {
  if (!kv.valid(src) || !kv.valid(dst) || src == dst)
    return make_error(ErrorCode::kInvalidArgument, "copy_prefix_state: bad sequences {} -> {}",
                      src, dst);
  if (kv.length(src) < n || kv.length(dst) != 0)
    return make_error(ErrorCode::kInvalidArgument,
                      "copy_prefix_state: source holds {} tokens (need >= {}), target holds {} "
                      "(need 0)",
                      kv.length(src), n, kv.length(dst));
  const auto& spec = kv.spec();
  const int64_t W = spec.sliding_window;
  for (int l = 0; l < int(spec.layers.size()); ++l) {
    const auto& L = spec.layers[size_t(l)];
    const int64_t d = L.kv_dim;
    for (int64_t p = std::max<int64_t>(0, n - (W - 1)); p < n; ++p) {
      const int32_t a = kv.swa_row(src, p), b = kv.swa_row(dst, p);
      if (a < 0 || b < 0)
        return make_error(ErrorCode::kInvalidArgument,
                          "copy_prefix_state: SWA row of position {} not live (src {}, dst {})",
                          p, a, b);
      std::memcpy(kv.swa_pool(l) + int64_t(b) * d, kv.swa_pool(l) + int64_t(a) * d,
                  size_t(d) * sizeof(float));
    }
    if (L.kind == AttnKind::kSliding) continue;
    const int m = L.ratio;
    for (int64_t e = 0; e < n / m; ++e) {
      const int64_t a = kv.compressed_row(src, e, m), b = kv.compressed_row(dst, e, m);
      std::memcpy(kv.comp_pool(l) + b * d, kv.comp_pool(l) + a * d, size_t(d) * sizeof(float));
      if (L.kind == AttnKind::kCsa) {
        const int64_t di = L.index_dim;
        std::memcpy(kv.index_pool(l) + b * di, kv.index_pool(l) + a * di,
                    size_t(di) * sizeof(float));
      }
    }
  }
  return Status::Ok();
}

Status apply_page_copy(KvCache& kv, const PageCopy& c, int32_t swa_src, int32_t swa_dst) {
  const auto& o = kv.options();
  const int64_t P = o.page_size;
  if (c.src_page < 0 || c.dst_page < 0 || c.src_page >= o.n_pages || c.dst_page >= o.n_pages ||
      c.n_tokens > P || c.swa_begin < 0)
    return make_error(ErrorCode::kInvalidArgument, "apply_page_copy: bad pages {} -> {} ({} tokens)",
                      c.src_page, c.dst_page, c.n_tokens);
  const auto& spec = kv.spec();
  for (int l = 0; l < int(spec.layers.size()); ++l) {
    const auto& L = spec.layers[size_t(l)];
    const int64_t d = L.kv_dim;
    if (c.swa_begin < c.n_tokens) {
      if (swa_src < 0 || swa_dst < 0 || swa_src >= o.n_swa_pages || swa_dst >= o.n_swa_pages)
        return make_error(ErrorCode::kInvalidArgument, "apply_page_copy: SWA pages {} -> {}",
                          swa_src, swa_dst);
      std::memcpy(kv.swa_pool(l) + (int64_t(swa_dst) * P + c.swa_begin) * d,
                  kv.swa_pool(l) + (int64_t(swa_src) * P + c.swa_begin) * d,
                  size_t((c.n_tokens - c.swa_begin) * d) * sizeof(float));
    }
    if (L.kind == AttnKind::kSliding) continue;
    const int64_t m = L.ratio, per_page = P / m, n = c.n_tokens / m;
    std::memcpy(kv.comp_pool(l) + int64_t(c.dst_page) * per_page * d,
                kv.comp_pool(l) + int64_t(c.src_page) * per_page * d,
                size_t(n * d) * sizeof(float));
    if (L.kind == AttnKind::kCsa)
      std::memcpy(kv.index_pool(l) + int64_t(c.dst_page) * per_page * L.index_dim,
                  kv.index_pool(l) + int64_t(c.src_page) * per_page * L.index_dim,
                  size_t(n * L.index_dim) * sizeof(float));
  }
  return Status::Ok();
}

}  // namespace v4::cache
