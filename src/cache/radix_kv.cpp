#include "cache/radix_kv.h"

#include <algorithm>
#include <climits>
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
      const int width =
          which == 0 ? (L.kind == AttnKind::kCsa ? 2 : 1) * L.kv_dim : 2 * L.index_dim;
      s->rings_.push_back({l, which, rows, width});
      s->floats_per_slot_ += 2 * int64_t(rows) * width;  // kv + gate
    }
  }
  s->n_slots_ = n;
  const size_t bytes = size_t(s->floats_per_slot_) * size_t(n) * sizeof(float);
  if (bytes > 0) {
    s->data_ = static_cast<float*>(kv.alloc_bytes(bytes));
    s->free_ = kv.free_fn();
  }
  return s;
}

StateSnapshots::~StateSnapshots() {
  if (data_ && free_) free_(data_);
}

Status StateSnapshots::save(const KvCache& kv, int32_t seq, int32_t id, CopyList* list) {
  if (id < 0 || id >= n_slots_ || !kv.valid(seq))
    return make_error(ErrorCode::kInvalidArgument, "snapshots: bad slot {} or sequence {}", id,
                      seq);
  CopyList own;
  CopyList& out = list ? *list : own;
  float* dst = data_ + int64_t(id) * floats_per_slot_;
  for (const Ring& r : rings_) {
    const int64_t base = kv.ring_row(seq, 0, r.rows), n = int64_t(r.rows) * r.width;
    out.add(dst, kv.ring_kv(r.layer, r.which) + base * r.width, size_t(n) * sizeof(float));
    dst += n;
    out.add(dst, kv.ring_gate(r.layer, r.which) + base * r.width, size_t(n) * sizeof(float));
    dst += n;
  }
  own.flush(kv);
  return Status::Ok();
}

Status StateSnapshots::load(KvCache& kv, int32_t id, int32_t seq, CopyList* list) const {
  if (id < 0 || id >= n_slots_ || !kv.valid(seq))
    return make_error(ErrorCode::kInvalidArgument, "snapshots: bad slot {} or sequence {}", id,
                      seq);
  CopyList own;
  CopyList& out = list ? *list : own;
  const float* src = data_ + int64_t(id) * floats_per_slot_;
  for (const Ring& r : rings_) {
    const int64_t base = kv.ring_row(seq, 0, r.rows), n = int64_t(r.rows) * r.width;
    out.add(kv.ring_kv(r.layer, r.which) + base * r.width, src, size_t(n) * sizeof(float));
    src += n;
    out.add(kv.ring_gate(r.layer, r.which) + base * r.width, src, size_t(n) * sizeof(float));
    src += n;
  }
  own.flush(kv);
  return Status::Ok();
}

Status copy_prefix_state(KvCache& kv, int32_t src, int32_t dst, int64_t n) {
  if (!kv.valid(src) || !kv.valid(dst) || src == dst)
    return make_error(ErrorCode::kInvalidArgument, "copy_prefix_state: bad sequences {} -> {}", src,
                      dst);
  if (kv.length(src) < n || kv.length(dst) != 0)
    return make_error(ErrorCode::kInvalidArgument,
                      "copy_prefix_state: source holds {} tokens (need >= {}), target holds {} "
                      "(need 0)",
                      kv.length(src), n, kv.length(dst));
  const auto& spec = kv.spec();
  const int64_t W = spec.sliding_window;
  const int64_t eb = 1;  // d, di below are row sizes in bytes (kv_row)
  CopyList list;  // src rows → dst rows: distinct sequences, so no copy reads another's target
  for (int l = 0; l < int(spec.layers.size()); ++l) {
    const auto& L = spec.layers[size_t(l)];
    const int64_t d = kv.attn_row_bytes(l);
    for (int64_t p = std::max<int64_t>(0, n - (W - 1)); p < n; ++p) {
      const int32_t a = kv.swa_row(src, p), b = kv.swa_row(dst, p);
      if (a < 0 || b < 0)
        return make_error(ErrorCode::kInvalidArgument,
                          "copy_prefix_state: SWA row of position {} not live (src {}, dst {})", p,
                          a, b);
      list.add(kv.kv_row(kv.swa_pool(l), b, d), kv.kv_row(kv.swa_pool(l), a, d), size_t(d * eb));
    }
    if (L.kind == AttnKind::kSliding) continue;
    const int m = L.ratio;
    for (int64_t e = 0; e < n / m; ++e) {
      const int64_t a = kv.compressed_row(src, e, m), b = kv.compressed_row(dst, e, m);
      list.add(kv.kv_row(kv.comp_pool(l), b, d), kv.kv_row(kv.comp_pool(l), a, d), size_t(d * eb));
    }
    if (L.kind == AttnKind::kCsa) {
      const int64_t di = kv.index_row_bytes(l);
      for (int64_t e = 0; e < n / m; ++e) {
        const int64_t a = kv.compressed_row(src, e, m), b = kv.compressed_row(dst, e, m);
        list.add(kv.kv_row(kv.index_pool(l), b, di), kv.kv_row(kv.index_pool(l), a, di),
                 size_t(di * eb));
      }
    }
  }
  list.flush(kv);
  return Status::Ok();
}

Status apply_page_copy(KvCache& kv, const PageCopy& c, int32_t swa_src, int32_t swa_dst) {
  const auto& o = kv.options();
  const int64_t P = o.page_size;
  if (c.src_page < 0 || c.dst_page < 0 || c.src_page >= o.n_pages || c.dst_page >= o.n_pages ||
      c.src_page == c.dst_page || c.n_tokens > P || c.swa_begin < 0)
    return make_error(ErrorCode::kInvalidArgument,
                      "apply_page_copy: bad pages {} -> {} ({} tokens)", c.src_page, c.dst_page,
                      c.n_tokens);
  const auto& spec = kv.spec();
  const int64_t eb = 1;  // d, di below are row sizes in bytes (kv_row)
  CopyList list;
  for (int l = 0; l < int(spec.layers.size()); ++l) {
    const auto& L = spec.layers[size_t(l)];
    const int64_t d = kv.attn_row_bytes(l), di = kv.index_row_bytes(l);
    if (c.swa_begin < c.n_tokens) {
      if (swa_src < 0 || swa_dst < 0 || swa_src == swa_dst || swa_src >= o.n_swa_pages ||
          swa_dst >= o.n_swa_pages)
        return make_error(ErrorCode::kInvalidArgument, "apply_page_copy: SWA pages {} -> {}",
                          swa_src, swa_dst);
      list.add(kv.kv_row(kv.swa_pool(l), int64_t(swa_dst) * P + c.swa_begin, d),
               kv.kv_row(kv.swa_pool(l), int64_t(swa_src) * P + c.swa_begin, d),
               size_t((c.n_tokens - c.swa_begin) * d * eb));
    }
    if (L.kind == AttnKind::kSliding) continue;
    const int64_t m = L.ratio, per_page = P / m, n = c.n_tokens / m;
    list.add(kv.kv_row(kv.comp_pool(l), int64_t(c.dst_page) * per_page, d),
             kv.kv_row(kv.comp_pool(l), int64_t(c.src_page) * per_page, d), size_t(n * d * eb));
    if (L.kind == AttnKind::kCsa)
      list.add(kv.kv_row(kv.index_pool(l), int64_t(c.dst_page) * per_page, di),
               kv.kv_row(kv.index_pool(l), int64_t(c.src_page) * per_page, di),
               size_t(n * di * eb));
  }
  list.flush(kv);
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
  // One block for the whole store; each buffer starts on a 256-byte boundary. Rows are stored
  // in the KvCache's row format: dim_ / idim_ hold row sizes in bytes (eb_ = 1).
  const int64_t eb = 1;
  pc->eb_ = eb;
  auto round = [eb](int64_t values) { return (values * eb + 255) / 256 * 256; };
  std::vector<int64_t> off;
  int64_t total = 0;
  for (const auto& L : spec.layers) {
    const int m = L.kind == AttnKind::kSliding ? 0 : L.ratio;
    const int di = L.kind == AttnKind::kCsa ? L.index_dim : 0;
    const int64_t rb = spec.attn_row_bytes(L), rbi = di ? spec.index_row_bytes(L) : 0;
    pc->ratio_.push_back(m);
    pc->dim_.push_back(rb);
    pc->idim_.push_back(rbi);
    for (int64_t floats : {swa_rows * rb, m ? slots / m * rb : int64_t(0),
                           m ? slots / m * rbi : int64_t(0)}) {
      off.push_back(floats ? total : -1);
      total += floats ? round(floats) : 0;
    }
  }
  if (total > 0) {
    pc->store_ = kv.alloc_bytes(size_t(total));
    pc->free_ = kv.free_fn();
  }
  pc->store_bytes_ = total;
  char* base = static_cast<char*>(pc->store_);
  auto at = [&](size_t i) {
    return off[i] < 0 ? nullptr : base + off[i];
  };
  for (size_t l = 0; l < spec.layers.size(); ++l) {
    pc->swa_.push_back(at(3 * l));
    pc->comp_.push_back(at(3 * l + 1));
    pc->index_.push_back(at(3 * l + 2));
  }
  return pc;
}

PrefixCache::~PrefixCache() {
  snaps_.reset();
  if (store_ && free_) free_(store_);
}

void PrefixCache::detach(PrefixSeq& h) {
  if (h.radix_seq < 0) return;
  if (detached_total_++ == 0) {
    const auto st = radix_->stats();
    V4_LOG_WARN(
        "prefix cache: store full of state locked by running requests (pages {}/{}, SWA "
        "{}/{}); request runs uncached. Raise the prefix cache budget.",
        st.pages_used, st.pages_total, st.swa_used, st.swa_total);
  }
  (void)radix_->finish(h.radix_seq, /*insert=*/false);
  h.radix_seq = -1;
}

Result<PrefixSeq> PrefixCache::admit(KvCache& kv, std::span<const int32_t> prompt,
                                     int64_t max_cached) {
  V4_ASSIGN_OR_RETURN(int32_t seq, kv.create_sequence());
  PrefixSeq h;
  h.kv_seq = seq;
  const int64_t n = int64_t(prompt.size());
  auto plan = radix_->admit(prompt, std::clamp<int64_t>(max_cached, 0, std::max<int64_t>(0, n - 1)));
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
  CopyList list;
  if (plan->has_copy) {  // the tail page of the hit, inside the store (its own phase: the
                         // copies into the KvCache sequence below read the new page)
    const PageCopy& c = plan->copy;
    for (size_t l = 0; l < dim_.size(); ++l) {
      const int64_t d = dim_[l];
      for (int64_t off = c.swa_begin; off < c.n_tokens; ++off) {
        const int32_t a = radix_->swa_map().page((c.src_page * P + off) / Ps);
        const int32_t b = radix_->swa_map().page((c.dst_page * P + off) / Ps);
        if (a < 0 || b < 0) continue;  // not needed by any reader (outside the window)
        list.add(srow(swa_[l], int64_t(b) * Ps + off % Ps, d),
                 srow(swa_[l], int64_t(a) * Ps + off % Ps, d), size_t(d * eb_));
      }
      if (!ratio_[l]) continue;
      const int64_t m = ratio_[l], per = P / m, ne = c.n_tokens / m, di = idim_[l];
      list.add(srow(comp_[l], c.dst_page * per, d), srow(comp_[l], c.src_page * per, d),
               size_t(ne * d * eb_));
      if (di)
        list.add(srow(index_[l], c.dst_page * per, di), srow(index_[l], c.src_page * per, di),
                 size_t(ne * di * eb_));
    }
    list.flush(kv, &copies_);
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
  // Store → the new sequence's rows: SWA rows [R − W, R), compressed entries < R/m, the rings.
  for (size_t l = 0; l < dim_.size(); ++l) {
    const int64_t d = dim_[l];
    for (int64_t p = std::max<int64_t>(0, R - W); p < R; ++p) {
      const int64_t a = radix_->swa_row(rs, p);
      const int32_t b = kv.swa_row(seq, p);
      list.add(kv.kv_row(kv.swa_pool(int(l)), b, d), srow(swa_[l], a, d), size_t(d * eb_));
    }
    if (!ratio_[l]) continue;
    const int64_t m = ratio_[l], di = idim_[l];
    for (int64_t e = 0; e < R / m; ++e) {
      const int64_t a = radix_->slot(rs, e * m) / m;
      const int64_t b = kv.compressed_row(seq, e, int(m));
      list.add(kv.kv_row(kv.comp_pool(int(l)), b, d), srow(comp_[l], a, d), size_t(d * eb_));
    }
    if (di)
      for (int64_t e = 0; e < R / m; ++e) {
        const int64_t a = radix_->slot(rs, e * m) / m;
        const int64_t b = kv.compressed_row(seq, e, int(m));
        list.add(kv.kv_row(kv.index_pool(int(l)), b, di), srow(index_[l], a, di),
                 size_t(di * eb_));
      }
  }
  st = snaps_->load(kv, plan->restore_snapshot, seq, &list);
  if (!st.ok()) {
    detach(h);
    kv.free_sequence(seq);
    return st;
  }
  list.flush(kv, &copies_);
  kv.commit(seq, R);
  live_[seq] = h;
  return h;
}

Status PrefixCache::on_step(KvCache& kv, int32_t kv_seq, std::span<const int32_t> tokens) {
  const StepAppend one{kv_seq, tokens};
  return on_steps(kv, std::span<const StepAppend>(&one, 1));
}

Status PrefixCache::on_steps(KvCache& kv, std::span<const StepAppend> steps) {
  // Every sequence's copies target its own store pages, SWA blocks and snapshot slots (held by
  // it alone) and read KvCache rows, so they can all run as one batch. A sequence detached
  // half-way contributes nothing (its pages may be handed to the next sequence of the loop).
  CopyList list, one;
  Status first;
  for (const StepAppend& st : steps) {
    Status s = step_one(kv, st, &one);
    if (!s.ok() && first.ok()) first = s;
    list.append(one);
  }
  list.flush(kv, &copies_);
  return first;
}

Status PrefixCache::step_one(KvCache& kv, const StepAppend& step, CopyList* list) {
  auto it = live_.find(step.kv_seq);
  if (it == live_.end() || it->second.radix_seq < 0) return Status::Ok();
  PrefixSeq& h = it->second;
  const int32_t rs = h.radix_seq;
  const std::span<const int32_t> tokens = step.tokens;
  const int64_t before = radix_->seq_len(rs), n = int64_t(tokens.size()), after = before + n;
  if (kv.length(h.kv_seq) != after)
    return make_error(ErrorCode::kInvalidArgument,
                      "prefix cache: sequence {} holds {} tokens, expected {} after this step",
                      h.kv_seq, kv.length(h.kv_seq), after);
  // Take the step into the tree a page at a time: reserve + commit release the SWA blocks that
  // leave the window at once, so a long chunk holds one page of SWA blocks beyond the window.
  // Only the rows of the final window [after − window, after) are written back (and marked).
  const int64_t P = radix_->config().page_tokens;
  for (int64_t done = 0; done < n;) {
    const int64_t lo = before + done, k = std::min(n - done, P - lo % P), hi = lo + k;
    if (!radix_->reserve(rs, k).ok()) {
      list->clear();
      detach(h);  // the tree cannot take this request's state now; it keeps running
      return Status::Ok();
    }
    const int64_t written = std::max<int64_t>(0, hi - std::max(lo, after - window_));
    V4_RETURN_IF_ERROR(radix_->commit(rs, tokens.subspan(size_t(done), size_t(k)), written));
    done += k;
  }
  // Write-back of what the step computed: SWA rows of the new tokens, completed entries.
  for (size_t l = 0; l < dim_.size(); ++l) {
    const int64_t d = dim_[l];
    for (int64_t p = std::max(before, after - window_); p < after; ++p) {
      const int32_t a = kv.swa_row(h.kv_seq, p);
      const int64_t b = radix_->swa_row(rs, p);
      if (a < 0 || b < 0) continue;
      list->add(srow(swa_[l], b, d), kv.kv_row(kv.swa_pool(int(l)), a, d), size_t(d * eb_));
    }
    if (!ratio_[l]) continue;
    const int64_t m = ratio_[l], di = idim_[l];
    for (int64_t e = before / m; e < after / m; ++e) {
      const int64_t a = kv.compressed_row(h.kv_seq, e, int(m));
      const int64_t b = radix_->slot(rs, e * m) / m;
      list->add(srow(comp_[l], b, d), kv.kv_row(kv.comp_pool(int(l)), a, d), size_t(d * eb_));
    }
    if (di)
      for (int64_t e = before / m; e < after / m; ++e) {
        const int64_t a = kv.compressed_row(h.kv_seq, e, int(m));
        const int64_t b = radix_->slot(rs, e * m) / m;
        list->add(srow(index_[l], b, di), kv.kv_row(kv.index_pool(int(l)), a, di),
                  size_t(di * eb_));
      }
  }
  for (int64_t p : h.snapshot_points)
    if (p == after) (void)snapshot(kv, h, list);
  return Status::Ok();
}

Status PrefixCache::snapshot(KvCache& kv, PrefixSeq& h, CopyList* list) {
  V4_ASSIGN_OR_RETURN(int32_t id, radix_->begin_snapshot(h.radix_seq));
  return snaps_->save(kv, h.kv_seq, id, list);
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
    CopyList list;
    if (insert && radix_->seq_len(h.radix_seq) > 0) (void)snapshot(kv, h, &list);
    list.flush(kv, &copies_);  // before the KvCache sequence's rings can be reused
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
  // page_floats / swa_row_floats count KV bytes (row sizes of the pools' format); snapshots
  // are f32.
  const int64_t eb = 1;
  int64_t page_floats = 0, swa_row_floats = 0;
  const auto& spec = kv.spec();
  for (const auto& L : spec.layers) {
    swa_row_floats += spec.attn_row_bytes(L);
    if (L.kind == AttnKind::kSliding) continue;
    page_floats += P / L.ratio * (spec.attn_row_bytes(L) +
                                  (L.kind == AttnKind::kCsa ? spec.index_row_bytes(L) : 0));
  }
  auto probe = StateSnapshots::create(kv, 0);
  const int64_t snap_bytes = (*probe)->floats_per_slot() * 4;
  const int64_t swa_per_window = (c.window_tokens + Ps - 1) / Ps + 1;
  const int64_t page_bytes = std::max<int64_t>(page_floats * eb, 1);
  // The store's buffers start on 256-byte boundaries (3 per layer).
  const int64_t slack = int64_t(kv.spec().layers.size()) * 3 * 256;
  // SWA windows: the kept boundaries, 16 more for running sequences (their own window and
  // pending boundaries), and one page of positions beyond a window (on_steps takes a step a page
  // at a time). Fewer kept boundaries (down to 8) when the budget cannot hold `kept` of them
  // with one page each.
  int64_t fixed = 0;
  for (;;) {
    c.n_swa_pages = int32_t(swa_per_window * (int64_t(kept) + 16) + P / Ps);
    c.n_snapshots = kept + 16;
    fixed = int64_t(c.n_swa_pages) * Ps * swa_row_floats * eb + int64_t(c.n_snapshots) * snap_bytes +
            slack;
    if (budget - fixed >= page_bytes * kept || kept <= 8) break;
    kept = std::max<int32_t>(8, kept / 2);
  }
  if (budget - fixed < page_bytes * kept)
    return make_error(ErrorCode::kInvalidArgument,
                      "prefix cache: budget {} B too small: {} kept boundaries need {} B of SWA "
                      "windows and snapshots plus {} B per {}-token page (raise the budget, "
                      "--prefix-cache-bytes, or turn the cache off, --disable-prefix-cache)",
                      budget, kept, fixed, page_bytes, P);
  c.n_pages = int32_t(std::min<int64_t>((budget - fixed) / page_bytes, INT32_MAX));
  return c;
}

int64_t PrefixCache::store_bytes() const {
  return store_bytes_ + snaps_->floats_per_slot() * snaps_->n_slots() * 4;
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
