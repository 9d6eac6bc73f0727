#include "cache/radix_kv.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "base/log.h"

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
    kv.copy_bytes(dst, kv.ring_kv(r.layer, r.which) + base * r.width, size_t(n) * sizeof(float), KvCache::CopyKind::kPoolToHost);
    dst += n;
    kv.copy_bytes(dst, kv.ring_gate(r.layer, r.which) + base * r.width, size_t(n) * sizeof(float), KvCache::CopyKind::kPoolToHost);
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
    kv.copy_bytes(kv.ring_kv(r.layer, r.which) + base * r.width, src, size_t(n) * sizeof(float), KvCache::CopyKind::kHostToPool);
    src += n;
    kv.copy_bytes(kv.ring_gate(r.layer, r.which) + base * r.width, src, size_t(n) * sizeof(float), KvCache::CopyKind::kHostToPool);
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
      kv.copy_bytes(kv.swa_pool(l) + int64_t(b) * d, kv.swa_pool(l) + int64_t(a) * d, size_t(d) * sizeof(float), KvCache::CopyKind::kPoolToPool);
    }
    if (L.kind == AttnKind::kSliding) continue;
    const int m = L.ratio;
    for (int64_t e = 0; e < n / m; ++e) {
      const int64_t a = kv.compressed_row(src, e, m), b = kv.compressed_row(dst, e, m);
      kv.copy_bytes(kv.comp_pool(l) + b * d, kv.comp_pool(l) + a * d, size_t(d) * sizeof(float), KvCache::CopyKind::kPoolToPool);
      if (L.kind == AttnKind::kCsa) {
        const int64_t di = L.index_dim;
        kv.copy_bytes(kv.index_pool(l) + b * di, kv.index_pool(l) + a * di, size_t(di) * sizeof(float), KvCache::CopyKind::kPoolToPool);
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
      kv.copy_bytes(kv.swa_pool(l) + (int64_t(swa_dst) * P + c.swa_begin) * d, kv.swa_pool(l) + (int64_t(swa_src) * P + c.swa_begin) * d, size_t((c.n_tokens - c.swa_begin) * d) * sizeof(float), KvCache::CopyKind::kPoolToPool);
    }
    if (L.kind == AttnKind::kSliding) continue;
    const int64_t m = L.ratio, per_page = P / m, n = c.n_tokens / m;
    kv.copy_bytes(kv.comp_pool(l) + int64_t(c.dst_page) * per_page * d, kv.comp_pool(l) + int64_t(c.src_page) * per_page * d, size_t(n * d) * sizeof(float), KvCache::CopyKind::kPoolToPool);
    if (L.kind == AttnKind::kCsa)
      kv.copy_bytes(kv.index_pool(l) + int64_t(c.dst_page) * per_page * L.index_dim, kv.index_pool(l) + int64_t(c.src_page) * per_page * L.index_dim, size_t(n * L.index_dim) * sizeof(float), KvCache::CopyKind::kPoolToPool);
  }
  return Status::Ok();
}

// ---- PrefixCache ------------------------------------------------------------------------------

Result<std::unique_ptr<PrefixCache>> PrefixCache::create(const KvCache& kv,
                                                         const ShadowRadixConfig& cfg_in) {
  ShadowRadixConfig cfg = cfg_in;
  const auto& spec = kv.spec();
  // A query at L reads the W - 1 rows before it: that is the window a boundary keeps.
  cfg.window_tokens = std::max(1, spec.sliding_window - 1);
  for (const auto& L : spec.layers)
    if (L.kind != AttnKind::kSliding && (L.ratio <= 0 || cfg.page_tokens % L.ratio != 0))
      return make_error(ErrorCode::kInvalidArgument,
                        "prefix cache: page size {} is not a multiple of compression ratio {}",
                        cfg.page_tokens, L.ratio);
  V4_ASSIGN_OR_RETURN(auto radix, ShadowRadix::create(cfg));
  V4_ASSIGN_OR_RETURN(auto snaps, StateSnapshots::create(kv, cfg.n_snapshots));
  auto pc = std::unique_ptr<PrefixCache>(new PrefixCache());
  pc->radix_ = std::move(radix);
  pc->snaps_ = std::move(snaps);
  pc->window_ = cfg.window_tokens;
  const int64_t slots = int64_t(cfg.n_pages) * cfg.page_tokens;
  const int64_t swa_rows = int64_t(cfg.n_swa_pages) * cfg.swa_page_tokens;
  for (const auto& L : spec.layers) {
    const int m = L.kind == AttnKind::kSliding ? 0 : L.ratio;
    const int di = L.kind == AttnKind::kCsa ? L.index_dim : 0;
    pc->ratio_.push_back(m);
    pc->dim_.push_back(L.kv_dim);
    pc->idim_.push_back(di);
    pc->swa_.emplace_back(size_t(swa_rows * L.kv_dim), 0.f);
    pc->comp_.emplace_back(m ? size_t(slots / m * L.kv_dim) : 0, 0.f);
    pc->index_.emplace_back(m ? size_t(slots / m * di) : 0, 0.f);
  }
  return pc;
}

void PrefixCache::detach(PrefixSeq& h) {
  if (h.radix_seq < 0) return;
  if (detached_total_++ == 0) {
    const auto st = radix_->stats();
    V4_LOG_WARN("prefix cache: store full of state locked by running requests (pages {}/{}, SWA "
                "{}/{}); request runs uncached. Raise the prefix cache budget.",
                st.pages_used, st.pages_total, st.swa_used, st.swa_total);
  }
  (void)radix_->finish(h.radix_seq, /*insert=*/false);
  h.radix_seq = -1;
}

Result<PrefixSeq> PrefixCache::admit(KvCache& kv, std::span<const int32_t> prompt) {
  V4_ASSIGN_OR_RETURN(int32_t seq, kv.create_sequence());
  PrefixSeq h;
  h.kv_seq = seq;
  const int64_t n = int64_t(prompt.size());
  auto plan = radix_->admit(prompt, std::max<int64_t>(0, n - 1));
  if (!plan.ok()) {  // the tree is full of locked state: run cold, detached
    ++detached_total_;
    live_[seq] = h;
    return h;
  }
  const int32_t rs = plan->seq;
  h.radix_seq = rs;
  h.snapshot_points = plan->snapshot_points;
  const auto& cfg = radix_->config();
  const int64_t P = cfg.page_tokens, Ps = cfg.swa_page_tokens, W = window_;
  if (plan->has_copy) {  // the tail page of the hit, inside the store
    const PageCopy& c = plan->copy;
    for (size_t l = 0; l < dim_.size(); ++l) {
      const int64_t d = dim_[l];
      for (int64_t off = c.swa_begin; off < c.n_tokens; ++off) {
        const int32_t a = radix_->swa_map().page((c.src_page * P + off) / Ps);
        const int32_t b = radix_->swa_map().page((c.dst_page * P + off) / Ps);
        if (a < 0 || b < 0) continue;  // not needed by any reader (outside the window)
        std::memcpy(&swa_[l][size_t((int64_t(b) * Ps + off % Ps) * d)],
                    &swa_[l][size_t((int64_t(a) * Ps + off % Ps) * d)], size_t(d) * sizeof(float));
      }
      if (!ratio_[l]) continue;
      const int64_t m = ratio_[l], per = P / m, ne = c.n_tokens / m, di = idim_[l];
      std::memcpy(&comp_[l][size_t(c.dst_page * per * d)], &comp_[l][size_t(c.src_page * per * d)],
                  size_t(ne * d) * sizeof(float));
      if (di)
        std::memcpy(&index_[l][size_t(c.dst_page * per * di)],
                    &index_[l][size_t(c.src_page * per * di)], size_t(ne * di) * sizeof(float));
    }
  }
  const int64_t R = plan->cached_tokens;
  h.cached_tokens = R;
  if (R == 0) {
    live_[seq] = h;
    return h;
  }
  // Reserve the prefix a page at a time, committing as we go, so KvCache frees the SWA pages
  // that fall out of the window at once (a long hit never needs more SWA pages than a chunk).
  Status st;
  const int64_t kvP = kv.options().page_size;
  for (int64_t p = 0; p < R && st.ok();) {
    const int64_t q = std::min(R, p + kvP);
    st = kv.reserve(seq, q);
    if (st.ok() && q < R) kv.commit(seq, q);
    p = q;
  }
  if (!st.ok()) {
    detach(h);
    kv.free_sequence(seq);
    return st;
  }
  for (size_t l = 0; l < dim_.size(); ++l) {
    const int64_t d = dim_[l];
    for (int64_t p = std::max<int64_t>(0, R - W); p < R; ++p) {
      const int64_t a = radix_->swa_row(rs, p);
      const int32_t b = kv.swa_row(seq, p);
      kv.copy_bytes(kv.swa_pool(int(l)) + int64_t(b) * d, &swa_[l][size_t(a * d)], size_t(d) * sizeof(float), KvCache::CopyKind::kHostToPool);
    }
    if (!ratio_[l]) continue;
    const int64_t m = ratio_[l], di = idim_[l];
    for (int64_t e = 0; e < R / m; ++e) {
      const int64_t a = radix_->slot(rs, e * m) / m;
      const int64_t b = kv.compressed_row(seq, e, int(m));
      kv.copy_bytes(kv.comp_pool(int(l)) + b * d, &comp_[l][size_t(a * d)], size_t(d) * sizeof(float), KvCache::CopyKind::kHostToPool);
      if (di)
        kv.copy_bytes(kv.index_pool(int(l)) + b * di, &index_[l][size_t(a * di)], size_t(di) * sizeof(float), KvCache::CopyKind::kHostToPool);
    }
  }
  st = snaps_->load(kv, plan->restore_snapshot, seq);
  if (!st.ok()) {
    detach(h);
    kv.free_sequence(seq);
    return st;
  }
  kv.commit(seq, R);
  live_[seq] = h;
  return h;
}

Status PrefixCache::on_step(KvCache& kv, int32_t kv_seq, std::span<const int32_t> tokens) {
  auto it = live_.find(kv_seq);
  if (it == live_.end() || it->second.radix_seq < 0) return Status::Ok();
  PrefixSeq& h = it->second;
  const int32_t rs = h.radix_seq;
  const int64_t before = radix_->seq_len(rs), n = int64_t(tokens.size()), after = before + n;
  if (kv.length(h.kv_seq) != after)
    return make_error(ErrorCode::kInvalidArgument,
                      "prefix cache: sequence {} holds {} tokens, expected {} after this step",
                      h.kv_seq, kv.length(h.kv_seq), after);
  if (!radix_->reserve(rs, n).ok()) {
    detach(h);  // the tree cannot take this request's state now; it keeps running
    return Status::Ok();
  }
  V4_RETURN_IF_ERROR(radix_->commit(rs, tokens, window_));
  // Write-back of what the step computed: SWA rows of the new tokens, completed entries.
  for (size_t l = 0; l < dim_.size(); ++l) {
    const int64_t d = dim_[l];
    for (int64_t p = std::max(before, after - window_); p < after; ++p) {
      const int32_t a = kv.swa_row(h.kv_seq, p);
      const int64_t b = radix_->swa_row(rs, p);
      if (a < 0 || b < 0) continue;
      kv.copy_bytes(&swa_[l][size_t(b * d)], kv.swa_pool(int(l)) + int64_t(a) * d, size_t(d) * sizeof(float), KvCache::CopyKind::kPoolToHost);
    }
    if (!ratio_[l]) continue;
    const int64_t m = ratio_[l], di = idim_[l];
    for (int64_t e = before / m; e < after / m; ++e) {
      const int64_t a = kv.compressed_row(h.kv_seq, e, int(m));
      const int64_t b = radix_->slot(rs, e * m) / m;
      kv.copy_bytes(&comp_[l][size_t(b * d)], kv.comp_pool(int(l)) + a * d, size_t(d) * sizeof(float), KvCache::CopyKind::kPoolToHost);
      if (di)
        kv.copy_bytes(&index_[l][size_t(b * di)], kv.index_pool(int(l)) + a * di, size_t(di) * sizeof(float), KvCache::CopyKind::kPoolToHost);
    }
  }
  for (int64_t p : h.snapshot_points)
    if (p == after) (void)snapshot(kv, h);
  return Status::Ok();
}

Status PrefixCache::snapshot(KvCache& kv, PrefixSeq& h) {
  V4_ASSIGN_OR_RETURN(int32_t id, radix_->begin_snapshot(h.radix_seq));
  return snaps_->save(kv, h.kv_seq, id);
}

Result<int64_t> PrefixCache::finish(KvCache& kv, int32_t kv_seq, bool insert) {
  auto it = live_.find(kv_seq);
  if (it == live_.end()) {
    kv.free_sequence(kv_seq);
    return int64_t(0);
  }
  PrefixSeq h = it->second;
  live_.erase(it);
  int64_t added = 0;
  if (h.radix_seq >= 0) {
    if (insert && radix_->seq_len(h.radix_seq) > 0) (void)snapshot(kv, h);
    auto r = radix_->finish(h.radix_seq, insert);
    h.radix_seq = -1;
    if (!r.ok()) {
      kv.free_sequence(h.kv_seq);
      return r.status();
    }
    added = *r;
  }
  kv.free_sequence(h.kv_seq);
  return added;
}

Result<ShadowRadixConfig> PrefixCache::config_for_budget(const KvCache& kv, int64_t budget,
                                                         int64_t P, int64_t Ps, int32_t kept) {
  ShadowRadixConfig c;
  c.page_tokens = P;
  c.swa_page_tokens = Ps;
  c.window_tokens = std::max(1, kv.spec().sliding_window - 1);
  if (P <= 0 || P % 128 != 0 || Ps <= 0 || P % Ps != 0 || c.window_tokens > P)
    return make_error(ErrorCode::kInvalidArgument,
                      "prefix cache: page {} / SWA page {} tokens invalid (P multiple of 128, "
                      "SWA page dividing it, P >= window)",
                      P, Ps);
  int64_t page_floats = 0, swa_row_floats = 0;
  for (const auto& L : kv.spec().layers) {
    swa_row_floats += L.kv_dim;
    if (L.kind == AttnKind::kSliding) continue;
    page_floats += P / L.ratio * (L.kv_dim + (L.kind == AttnKind::kCsa ? L.index_dim : 0));
  }
  auto probe = StateSnapshots::create(kv, 0);
  const int64_t snap_bytes = (*probe)->floats_per_slot() * 4;
  const int64_t swa_per_window = (c.window_tokens + Ps - 1) / Ps + 1;
  // Running sequences also hold SWA pages for their own window + step (up to 8 × window).
  c.n_swa_pages = int32_t(swa_per_window * (int64_t(kept) + 8) + 8 * (4096 / Ps));
  c.n_snapshots = kept + 16;
  const int64_t fixed = int64_t(c.n_swa_pages) * Ps * swa_row_floats * 4 +
                        int64_t(c.n_snapshots) * snap_bytes;
  const int64_t page_bytes = std::max<int64_t>(page_floats * 4, 1);
  if (budget - fixed < page_bytes * kept)
    return make_error(ErrorCode::kInvalidArgument,
                      "prefix cache: budget {} B too small: {} kept boundaries need {} B of SWA "
                      "windows and snapshots plus {} B per {}-token page",
                      budget, kept, fixed, page_bytes, P);
  c.n_pages = int32_t((budget - fixed) / page_bytes);
  return c;
}

int64_t PrefixCache::store_bytes() const {
  int64_t f = snaps_->floats_per_slot() * snaps_->n_slots();
  for (size_t l = 0; l < comp_.size(); ++l) f += int64_t(comp_[l].size() + index_[l].size() + swa_[l].size());
  return f * 4;
}

std::string PrefixCache::explain() const {
  const auto& c = radix_->config();
  return fmt::format(
      "prefix cache: {} MiB store, {} pages x {} tokens ({} tokens of compressed state), {} SWA "
      "pages x {} tokens, {} compressor snapshots ({} KiB each); a boundary keeps {} SWA rows",
      store_bytes() >> 20, c.n_pages, c.page_tokens, int64_t(c.n_pages) * c.page_tokens,
      c.n_swa_pages, c.swa_page_tokens, c.n_snapshots, snaps_->floats_per_slot() * 4 / 1024,
      c.window_tokens);
}

}  // namespace v4::cache
