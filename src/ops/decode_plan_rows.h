// The per-row arithmetic of `Ops::build_decode_plan` (ops.h, DecodePlanArgs), shared by the CPU
// reference (cpu/cpu_ops.cpp) and the CUDA kernel (cuda/decode_plan.cu) so both backends compute
// the same integers. The independent check is the host planner (model/step_plan.cpp), which
// reads KvCache's own addressing functions: tests/model/test_decode_plan.cpp compares the two.
#pragma once
#include <cstdint>

#include "ops/ops.h"

namespace v4::ops::plan {

/// SWA row of position p given the sequence's SWA page row (−1 if its page was freed).
V4_HOST_DEVICE inline int32_t swa_row(const int32_t* swa_pages, int page_size, int64_t p) {
  const int32_t page = swa_pages[p / page_size];
  return page < 0 ? -1 : int32_t(int64_t(page) * page_size + p % page_size);
}

/// Row of compressed entry e (tokens [e·m, (e+1)·m)) in a pool of ratio m.
V4_HOST_DEVICE inline int32_t compressed_row(const int32_t* pages, int page_size, int64_t e,
                                             int m) {
  const int64_t p = e * m;
  return int32_t((int64_t(pages[p / page_size]) * page_size + p % page_size) / m);
}

/// Ring row of position p for a sequence in state slot `slot` (ring_rows = c·m per sequence).
V4_HOST_DEVICE inline int32_t ring_row(int32_t slot, int ring_rows, int64_t p) {
  return int32_t(int64_t(slot) * ring_rows + p % ring_rows);
}

/// CompressArgs::src slot j of the window closing at `pos` for batch row b (the caller checks
/// (pos + 1) % m == 0): slots [0, m) of the overlapping compressor are the previous window
/// (−1 for w = 0), then the own window; a token at pos is this step's fresh row b, earlier tokens
/// are ring rows (encoded −(row + 2)).
V4_HOST_DEVICE inline int32_t compress_src(int64_t b, int64_t pos, int32_t slot, int m, int c,
                                           int j) {
  const int64_t w = pos / m;
  int64_t p;
  if (c == 2 && j < m) {
    if (w == 0) return -1;
    p = (w - 1) * m + j;
  } else {
    p = w * m + (c == 2 ? j - m : j);
  }
  if (p == pos) return int32_t(b);
  return -(ring_row(slot, c * m, p) + 2);
}

/// Phase 1 of the op: table row delta_seq[r] ← delta_rows[r], entries i = first, first+step, ...
V4_HOST_DEVICE inline void decode_plan_delta(const DecodePlanArgs& a, int64_t r, int64_t first,
                                             int64_t step) {
  const int64_t P = a.max_pages;
  const int64_t s = a.delta_seq[r];
  const int32_t* src = a.delta_rows + r * 2 * P;
  for (int64_t i = first; i < P; i += step) {
    a.page_table[s * P + i] = src[i];
    a.swa_table[s * P + i] = src[P + i];
  }
}

/// Phase 2 for batch row b. The caller with first == 0 also writes the row's scalars; list
/// entries are split over callers as i = first, first + step, ... (CPU: first 0, step 1).
V4_HOST_DEVICE inline void decode_plan_row(const DecodePlanArgs& a, int64_t b, int64_t first,
                                           int64_t step) {
  const int32_t s = a.seq[b];
  const bool live = s >= 0;
  const int64_t pos = live ? a.pos[b] : 0;
  const int32_t slot = live ? a.slot[b] : 0;
  const int W = a.window, ps = a.page_size;
  const int32_t* pages = live ? a.page_table + int64_t(s) * a.max_pages : nullptr;
  const int32_t* swa = live ? a.swa_table + int64_t(s) * a.max_pages : nullptr;
  const int64_t n_swa = live ? (pos + 1 < W ? pos + 1 : W) : 0;
  if (first == 0) {
    a.positions[b] = pos;
    a.swa_dst[b] = live ? swa_row(swa, ps, pos) : -1;
    a.swa_offset[b] = b * W;
    a.swa_count[b] = int32_t(n_swa);
    if (a.topk_offset) a.topk_offset[b] = b * a.topk;
  }
  const int64_t lo = pos - n_swa + 1;
  for (int64_t i = first; i < n_swa; i += step) a.swa_rows[b * W + i] = swa_row(swa, ps, lo + i);
  for (int r = 0; r < a.n_rates; ++r) {
    const DecodePlanRate& R = a.rates[r];
    const int m = R.ratio, c = R.overlap, slots = c * m;
    const bool closes = live && (pos + 1) % m == 0;
    int64_t n_cand = live ? (pos + 1) / m : 0;
    if (n_cand > R.cand_stride) n_cand = R.cand_stride;  // planner bug guard: never overflow
    if (first == 0) {
      R.positions[b] = closes ? pos / m * m : 0;
      R.dst[b] = closes ? compressed_row(pages, ps, pos / m, m) : -1;
      R.ring_src[b] = int32_t(b);
      R.ring_dst[b] = live ? ring_row(slot, slots, pos) : -1;
      R.cand_offset[b] = b * R.cand_stride;
      R.cand_count[b] = int32_t(n_cand);
    }
    for (int64_t j = first; j < slots; j += step)
      R.src[b * slots + j] = closes ? compress_src(b, pos, slot, m, c, int(j)) : -1;
    for (int64_t e = first; e < n_cand; e += step)
      R.cand_rows[b * R.cand_stride + e] = compressed_row(pages, ps, e, m);
  }
}

}  // namespace v4::ops::plan
