#include "model/step_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <new>
#include <stdexcept>

namespace v4::model {

HostStepPlan plan_on_host(const ForwardBatch& batch, const cache::KvCache& kv,
                          const PlanShape& shape) {
  HostStepPlan st;
  const size_t n_slices = batch.slices.size();
  st.row0.assign(n_slices + 1, 0);
  const int W = shape.window;
  for (size_t i = 0; i < n_slices; ++i) {
    const SeqSlice& sl = batch.slices[i];
    const int64_t s0 = sl.start_pos, n = int64_t(sl.tokens.size());
    st.row0[i + 1] = st.row0[i] + n;
    const int64_t lo = std::max<int64_t>(0, s0 - W + 1);
    const int64_t base = int64_t(st.swa.rows.size());
    for (int64_t p = lo; p < s0 + n; ++p) st.swa.rows.push_back(kv.swa_row(sl.seq, p));
    for (int64_t j = 0; j < n; ++j) {
      const int64_t t = s0 + j;
      st.ids.push_back(sl.tokens[j]);
      st.pos.push_back(t);
      st.swa_dst.push_back(kv.swa_row(sl.seq, t));
      const int64_t first = std::max<int64_t>(0, t - W + 1);
      st.swa.offset.push_back(base + (first - lo));
      st.swa.count.push_back(int32_t(t - first + 1));
    }
  }
  st.S = st.row0.back();

  auto build_compress = [&](int m, int cc, HostCompressPlan* plan) {
    plan->ratio = m;
    plan->overlap = cc;
    const int ring_rows = cc * m;
    for (size_t i = 0; i < n_slices; ++i) {
      const SeqSlice& sl = batch.slices[i];
      const int64_t s0 = sl.start_pos, n = int64_t(sl.tokens.size()), end = s0 + n;
      const int64_t row0 = st.row0[i];
      // Source slot of token p: fresh batch row, or its ring row in the sequence's state.
      auto source = [&](int64_t p) -> int32_t {
        if (p < 0) return -1;
        if (p >= s0) return int32_t(row0 + (p - s0));
        return -(kv.ring_row(sl.seq, p, ring_rows) + 2);
      };
      for (int64_t w = s0 / m; w < end / m; ++w) {
        if (cc == 2)
          for (int j = 0; j < m; ++j) plan->src.push_back(w == 0 ? -1 : source((w - 1) * m + j));
        for (int j = 0; j < m; ++j) plan->src.push_back(source(w * m + j));
        plan->positions.push_back(w * m);
        plan->dst.push_back(kv.compressed_row(sl.seq, w, m));
        plan->out_slice.push_back(int32_t(i));
      }
      for (int64_t p = std::max(s0, end - ring_rows); p < end; ++p) {
        plan->ring_src.push_back(int32_t(row0 + (p - s0)));
        plan->ring_dst.push_back(kv.ring_row(sl.seq, p, ring_rows));
      }
      const int64_t base = int64_t(plan->cand.rows.size());
      for (int64_t e = 0; e < end / m; ++e)
        plan->cand.rows.push_back(kv.compressed_row(sl.seq, e, m));
      for (int64_t j = 0; j < n; ++j) {
        plan->cand.offset.push_back(base);
        plan->cand.count.push_back(int32_t((s0 + j + 1) / m));
        plan->max_cand = std::max<int64_t>(plan->max_cand, (s0 + j + 1) / m);
      }
    }
  };
  if (shape.csa_ratio > 0) {
    st.has_csa = true;
    build_compress(shape.csa_ratio, 2, &st.csa);
    st.topk_offset.resize(size_t(st.S));
    for (int64_t t = 0; t < st.S; ++t) st.topk_offset[t] = t * shape.index_topk;
  }
  if (shape.hca_ratio > 0) {
    st.has_hca = true;
    build_compress(shape.hca_ratio, 1, &st.hca);
  }
  return st;
}

int64_t decode_bucket(int64_t n) {
  int64_t b = 1;
  while (b < n) b *= 2;
  return b;
}

int64_t decode_table_pages(const cache::KvCache& kv, int64_t max_positions) {
  const int64_t ps = kv.options().page_size;
  return std::max<int64_t>(1,
                           std::min<int64_t>(kv.options().n_pages, (max_positions + ps - 1) / ps));
}

DecodeStager::DecodeStager(int table_rows, int64_t max_pages)
    : P_(max_pages),
      host_(size_t(kDeltaRows + int64_t(kMaxDecodeRows) * 2 * max_pages), 0),
      version_(size_t(table_rows), 0) {}

void DecodeStager::invalidate() {
  std::fill(version_.begin(), version_.end(), 0);
}

int64_t DecodeStager::stage(const ForwardBatch& batch, const cache::KvCache& kv, int64_t B) {
  const int64_t n = int64_t(batch.slices.size());
  if (n > B || B > kMaxDecodeRows)
    throw std::invalid_argument(fmt::format("DecodeStager: {} rows in a bucket of {}", n, B));
  int32_t* h = host_.data();
  int64_t n_delta = 0;
  for (int64_t b = 0; b < B; ++b) {
    if (b >= n) {
      h[kIds + b] = 0;
      h[kSeq + b] = -1;
      h[kSlot + b] = 0;
      h[kPos + b] = 0;
      continue;
    }
    const SeqSlice& sl = batch.slices[size_t(b)];
    const int32_t seq = sl.seq;
    if (seq < 0 || seq >= table_rows())
      throw std::invalid_argument(
          fmt::format("DecodeStager: sequence {} outside the {} table rows", seq, table_rows()));
    h[kIds + b] = sl.tokens.at(0);
    h[kSeq + b] = seq;
    h[kSlot + b] = kv.state_slot(seq);
    h[kPos + b] = int32_t(sl.start_pos);
    const uint64_t v = kv.addressing_version(seq);
    if (version_[size_t(seq)] == v) continue;
    const auto& pages = kv.pages(seq);
    const auto& swa = kv.swa_pages(seq);
    if (int64_t(pages.size()) > P_)
      throw std::invalid_argument(fmt::format(
          "DecodeStager: sequence {} holds {} pages, the tables {}", seq, pages.size(), P_));
    int32_t* row = h + kDeltaRows + n_delta * 2 * P_;
    std::fill(row, row + 2 * P_, -1);
    std::copy(pages.begin(), pages.end(), row);
    std::copy(swa.begin(), swa.end(), row + P_);
    h[kDeltaSeq + n_delta] = seq;
    version_[size_t(seq)] = v;
    ++n_delta;
  }
  h[kDeltaCount] = int32_t(n_delta);
  last_deltas_ = n_delta;
  return kDeltaRows + n_delta * 2 * P_;
}

ops::DecodePlanArgs decode_plan_inputs(const int32_t* staging, int32_t* page_table,
                                       int32_t* swa_table, int64_t max_pages, int page_size,
                                       int window, int64_t B) {
  ops::DecodePlanArgs a;
  a.n_rows = B;
  a.seq = staging + DecodeStager::kSeq;
  a.slot = staging + DecodeStager::kSlot;
  a.pos = staging + DecodeStager::kPos;
  a.page_table = page_table;
  a.swa_table = swa_table;
  a.max_pages = max_pages;
  a.page_size = page_size;
  a.window = window;
  a.delta_count = staging + DecodeStager::kDeltaCount;
  a.delta_seq = staging + DecodeStager::kDeltaSeq;
  a.delta_rows = staging + DecodeStager::kDeltaRows;
  a.delta_cap = B;  // one row per batch row at most
  return a;
}

StepMemory::~StepMemory() {
  release(Mark{});
}

void* StepMemory::alloc(size_t bytes) {
  if (bytes == 0) return nullptr;
  const size_t off = (top_ + kAlign - 1) / kAlign * kAlign;
  void* p = nullptr;
  if (base_) {
    if (off + bytes > cap_)
      throw std::length_error(
          fmt::format("step workspace overflow: block {} of {} bytes at offset {} exceeds {} bytes",
                      n_allocs_, bytes, off, cap_));
    p = base_ + off;
  } else {
    p = ops_->alloc(bytes);
  }
  blocks_.push_back(base_ ? nullptr : p);
  top_ = off + bytes;
  peak_ = std::max(peak_, top_);
  ++n_allocs_;
  return p;
}

void StepMemory::release(Mark m) {
  while (blocks_.size() > m.blocks) {
    if (blocks_.back()) ops_->free(blocks_.back());
    blocks_.pop_back();
  }
  top_ = m.top;
}

}  // namespace v4::model
