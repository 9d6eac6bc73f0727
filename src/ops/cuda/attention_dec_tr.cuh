// Decode sparse MQA attention, variant 14: whole-row bulk copies and the transposed products.
// bf16 KV pools. Included by attention_dec.cu inside its anonymous namespace after
// attention_dec_ws.cuh (it uses that file's mbarrier / named-barrier helpers, wg7_keys,
// wg7_stage_q, ws_cluster_merge, and tma.cuh's bulk copy); the launcher is sparse_attention_dec.
//
// Why (issue 7, docs/cuda.md §Variant 14): variant 11's load chain copies each 1 KiB key row as
// 64 cp.async of 16 bytes into the 128-byte-swizzle operand layout that its wgmma B operands need
// (a row's 64-dim blocks 8 KiB apart). The gather probe (bench/results/cuda-attention-gather.md)
// measured, for batch 64 × 8,320 random rows: cp.async 78.6% of the copy bandwidth on all SMs,
// TMA boxes of 128 bytes (the only TMA shape that lands in that layout) 53%, and one bulk copy
// (cp.async.bulk) per whole row 99%. A whole-row copy lands the row contiguously, which no wgmma
// shared-memory operand layout accepts for keys. So this kernel keeps the keys out of the
// descriptors: K and V are the register (A) operand, loaded with ldmatrix from rows of 1,040
// bytes (1 KiB + 16: the 8 rows of an 8 × 8 ldmatrix tile fall in 8 different bank groups), and
// the products are transposed:
//   warpgroup 0 (threads 0–127): Sᵀ[64 keys, 64 heads] = K · Qᵀ (32 wgmma m64n64k16, A = K rows
//       from ldmatrix, B = Q from shared memory in variant 11's swizzled layout); the lazy log2
//       softmax per head (a column: the max over the tile's keys crosses the 4 warps through
//       shared memory); Pᵀ (bf16) to shared memory (the 128-byte-swizzle N-major B operand of
//       P·V) and the per-head rescale factors; then Oᵀ[dims 0 … 255, 64 heads] += Vᵀ · Pᵀ
//       (16 wgmma m64n64k16, A = Vᵀ from ldmatrix.trans of the same rows);
//   warpgroup 1 (threads 128–255): the producer (threads 128–191 each bulk-copy one key row of the
//       next tile into the ring, completing its bytes on the slot's `full` mbarrier; a masked
//       key's row is zero-filled), then Oᵀ[dims 256 … 511] += Vᵀ · Pᵀ after rescaling.
// Synchronization as variant 11 (full / empty mbarriers per slot, kBarPReady / kBarPFree around
// the Pᵀ buffer), plus kBarRed (warpgroup 0: the per-head maxima of a tile) and kBarP0
// (warpgroup 0: Pᵀ complete before its own P·V). The rescale factors and the max exchange are
// double-buffered by tile parity, so no barrier waits for a reader of the previous tile.
// Epilogue: both warpgroups store Oᵀ as o[head][dim] rows (stride kTr14Ld) over the Q + ring
// space; then the normalized output (1 split), the cluster merge (2 … 8 splits,
// ws_cluster_merge) or the workspace partials (the combine kernel), each with coalesced rows.

constexpr int kTr14Keys = 64, kTr14Stages = 2;
constexpr int kTr14RowBytes = kHd * 2 + 16;  // a key row in the ring: 1 KiB + 16 bytes
constexpr int kTr14Ld = kHd + 4;  // o[head][dim] row stride (floats) in the epilogue
constexpr int kBarRed = 4, kBarP0 = 5;  // named barriers of warpgroup 0 (128 threads)

/// Shared memory of variant 14: Q (bf16, 64 KiB, 1,024-aligned, variant 11's swizzled layout) |
/// ring of 2 tiles × 64 rows × 1,040 bytes | Pᵀ (64 keys × 64 heads bf16, swizzled, 1,024-aligned)
/// | max / sum exchange 2 × 4 warps × 64 f32 | rescale factors 2 × 64 f32 | final m2 64 f32 |
/// valid-key bits 2 × 64 bytes | full, empty mbarriers 2 × 2 × 8 bytes; + 1 KiB of alignment.
struct Tr14Shape {
  static constexpr int kTileBytes = kTr14Keys * kTr14RowBytes;
  static constexpr size_t kOffRing = kQ7Bytes;
  static constexpr size_t kOffP = kOffRing + size_t(kTr14Stages) * kTileBytes;
  static constexpr size_t kOffRed = kOffP + 64 * 64 * 2;
  static constexpr size_t kOffScale = kOffRed + 2 * 4 * 64 * 4;
  static constexpr size_t kOffM = kOffScale + 2 * 64 * 4;
  static constexpr size_t kOffValid = kOffM + 64 * 4;
  static constexpr size_t kOffBar = kOffValid + size_t(kTr14Stages) * 64;
  static constexpr size_t kSmem = kOffBar + size_t(2) * kTr14Stages * 8 + 1024;
};
static_assert(Tr14Shape::kOffP % 1024 == 0, "Pᵀ operand must be 1,024-aligned (swizzle atoms)");
static_assert(Tr14Shape::kSmem <= 232448, "smem over the 227 KiB limit");
static_assert(size_t(64) * kTr14Ld * 4 + (2 * 64 + 64 * kMaxCluster11) * 4 <= Tr14Shape::kOffP,
              "epilogue rows must fit the Q + ring space");

__device__ __forceinline__ void ldsm_x4_sa(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void ldsm_x4_trans_sa(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

/// Oᵀ[dims d0 … d0 + 255, 64 heads] += Vᵀ · Pᵀ for one 64-key tile, by one warpgroup (warp wq of
/// it): 4 m64 blocks of dims × 4 16-key steps, A = Vᵀ fragments by ldmatrix.trans from the ring
/// rows at `tile_s` (row stride kTr14RowBytes), B = Pᵀ at descriptor `pt_desc` (+ 2 KiB per 16
/// keys). Fragments of one dim block are loaded while the previous block's wgmma run.
__device__ __forceinline__ void tr14_pv(float (&o)[4][32], uint32_t tile_s, int d0, int wq,
                                        int lane, uint64_t pt_desc) {
  // Lane address: key 16ks + (lane & 7) + 8·(lane / 16), dim d0 + 64mt + 16wq + 8·((lane / 8) & 1).
  const uint32_t base = tile_s + uint32_t(((lane & 7) + 8 * (lane >> 4)) * kTr14RowBytes) +
                        uint32_t((d0 + 16 * wq + 8 * ((lane >> 3) & 1)) * 2);
  uint32_t af[2][4][4];
#pragma unroll
  for (int mt = 0; mt < 4; ++mt) {
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
      ldsm_x4_trans_sa(af[mt & 1][ks], base + uint32_t(16 * ks * kTr14RowBytes + 128 * mt));
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
      wgmma_rs_m64n64k16_tb(o[mt], af[mt & 1][ks], pt_desc + uint64_t(ks * (2048 >> 4)));
    wgmma_commit();
    if (mt > 0) wgmma_wait<1>();  // block mt − 1 done: its fragment buffer is free
  }
  wgmma_wait0();
}

template <bool kCl = false>
__global__ void __launch_bounds__(kWs11Threads, 1)
    attn_dec14_kernel(ops::AttentionArgs a, const __nv_bfloat16* __restrict__ swa_pool,
                      const __nv_bfloat16* __restrict__ comp_pool, int n_splits,
                      float* __restrict__ ws) {
  using Sh = Tr14Shape;
  constexpr int kN = kTr14Keys, kS = kTr14Stages;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const WsCta cta = ws_cta_begin(n_splits);
  const int64_t t = cta.t;
  const int s = cta.s, hb = cta.hb;
  const int H = a.n_heads;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wg = tid >> 7;
  const int wq = warp & 3, g = lane >> 2, tq = lane & 3;
  const Wg7Keys ks7 = wg7_keys<kN>(a, swa_pool != nullptr, comp_pool != nullptr, t, s, n_splits);
  const int n_swa = ks7.n_swa, n_comp = ks7.n_comp, k0 = ks7.k0, k1 = ks7.k1;
  const int n_tiles = ks7.n_tiles;

  const uint32_t q_s = (smem_addr(smem_raw) + 1023u) & ~1023u;
  unsigned char* const smem = smem_raw + (q_s - smem_addr(smem_raw));
  const uint32_t ring_s = q_s + uint32_t(Sh::kOffRing), pt_s = q_s + uint32_t(Sh::kOffP);
  float* const sred = reinterpret_cast<float*>(smem + Sh::kOffRed);      // [2][4 warps][64]
  float* const sscale = reinterpret_cast<float*>(smem + Sh::kOffScale);  // [2][64]
  float* const sm2 = reinterpret_cast<float*>(smem + Sh::kOffM);         // [64] (log2 units)
  uint8_t* const svalid = smem + Sh::kOffValid;                          // [kS][64] bits
  const uint32_t full0 = q_s + uint32_t(Sh::kOffBar), empty0 = full0 + 8 * kS;
  if (tid == 0) {
    for (int i = 0; i < kS; ++i) {
      mbar_init(full0 + 8 * i, 128);   // warpgroup 1: 128 arrivals (+ the row bytes)
      mbar_init(empty0 + 8 * i, 256);  // every thread, after its last read of the slot
    }
    fence_mbarrier_init();
  }
  __syncthreads();

  // ---- producer (warpgroup 1): thread p < 64 copies key p of each tile ---------------------------
  const int p = tid - 128;
  const int64_t swa_off = n_swa > 0 ? a.swa.offset[t] : 0;
  const int64_t comp_off = n_comp > 0 ? a.comp.offset[t] : 0;
  auto lookup = [&](int tile) -> int32_t {
    const int j = k0 + tile * kN + p;
    if (p < 0 || p >= kN || tile >= n_tiles || j >= k1) return -1;
    return j < n_swa ? a.swa.rows[swa_off + j] : a.comp.rows[comp_off + (j - n_swa)];
  };
  auto produce = [&](int tile, int32_t row) {
    const int slot = tile % kS;
    const uint32_t full = full0 + 8 * slot;
    if (p < kN) {  // warps 4, 5 (warp-uniform)
      const unsigned bal = __ballot_sync(0xffffffffu, row >= 0);
      if (lane == 0) *reinterpret_cast<uint32_t*>(svalid + slot * 64 + 4 * (p >> 5)) = bal;
      const uint32_t dst = ring_s + uint32_t(slot * Sh::kTileBytes + p * kTr14RowBytes);
      if (row >= 0) {
        const int j = k0 + tile * kN + p;
        mbar_arrive_expect_tx(full, kHd * 2);
        bulk_g2s(dst, (j < n_swa ? swa_pool : comp_pool) + int64_t(row) * kHd, kHd * 2, full);
      } else {  // masked key: zeros (p = 0 must not meet stale NaN bits in V); a later bulk
                // copy into this row is issued by this same thread after its fence.proxy.async
                // of the empty-barrier handshake, so the generic stores are ordered before it
        uint4* z = reinterpret_cast<uint4*>(smem + (dst - q_s));
#pragma unroll 8
        for (int i = 0; i < kHd * 2 / 16; ++i) z[i] = make_uint4(0u, 0u, 0u, 0u);
        mbar_arrive(full);
      }
    } else {
      mbar_arrive(full);
    }
  };
  int32_t row_next = -1;
  if (wg == 1 && n_tiles > 0) {  // prologue: tile 0 in flight before the Q staging
    produce(0, lookup(0));
    row_next = lookup(1);
  }

  // ---- Q → bf16 swizzled operand (both warpgroups) ----
  if (n_tiles > 0) {
    wg7_stage_q<true>(smem, a, t, hb, tid);
    fence_proxy_async_smem();
  }
  named_sync(kBarFinal, 256);  // Q complete

  float o[4][32];
#pragma unroll
  for (int mt = 0; mt < 4; ++mt)
#pragma unroll
    for (int i = 0; i < 32; ++i) o[mt][i] = 0.f;
  // Pᵀ as the N-major B of P·V: key k's 64 heads in one 128-byte line (k · 128, 16-byte chunk c
  // of heads 8c … 8c + 7 at c ^ (k % 8)); 8 keys further is 1,024 bytes (SBO), 16 keys 2 KiB.
  const uint64_t pt_desc = wgmma_desc_sw128(pt_s, 8192, 1024);
  float m2[16], lsum[16];  // warpgroup 0: heads 8j + 2tq + e at index 2j + e (log2 units)
#pragma unroll
  for (int i = 0; i < 16; ++i) m2[i] = -INFINITY, lsum[i] = 0.f;

  if (wg == 0) {
    const float c2 = a.scale * 1.4426950408889634f;
    const uint64_t q_desc = wgmma_desc_sw128(q_s, 16, 1024);
    constexpr uint32_t kBlkQ = 64 * 128;
    for (int it = 0; it < n_tiles; ++it) {
      const int slot = it % kS;
      const uint32_t tile_s = ring_s + uint32_t(slot * Sh::kTileBytes);
      mbar_wait(full0 + 8 * slot, uint32_t((it / kS) & 1));
      // Sᵀ = K · Qᵀ: A = keys 16wq … 16wq + 15 of the tile, dims 16kk … 16kk + 15 (lane address:
      // key 16wq + (lane & 7) + 8·((lane / 8) & 1), dim 8·(lane / 16)); 2 k-steps per batch,
      // the next batch's fragments loaded while the previous one runs.
      float sacc[32];
#pragma unroll
      for (int i = 0; i < 32; ++i) sacc[i] = 0.f;
      const uint32_t a_row = tile_s +
                             uint32_t((16 * wq + (lane & 7) + 8 * ((lane >> 3) & 1)) * kTr14RowBytes) +
                             uint32_t(16 * (lane >> 4));
      uint32_t kf[2][2][4];
#pragma unroll
      for (int b = 0; b < 16; ++b) {
#pragma unroll
        for (int i = 0; i < 2; ++i) ldsm_x4_sa(kf[b & 1][i], a_row + uint32_t(32 * (2 * b + i)));
        wgmma_fence();
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int kk = 2 * b + i;
          wgmma_rs_k16<64>(sacc, kf[b & 1][i],
                           q_desc + uint64_t(((kk >> 2) * kBlkQ + (kk & 3) * 32) >> 4));
        }
        wgmma_commit();
        if (b > 0) wgmma_wait<1>();
      }
      wgmma_wait0();
      wgmma_fence_acc(sacc);
      // sacc[4j + 2r + e]: key 16wq + g + 8r, head 8j + 2tq + e. Mask and scale to log2 units.
      const uint64_t vm = *reinterpret_cast<const uint64_t*>(svalid + slot * 64);
      const bool ok0 = (vm >> (16 * wq + g)) & 1, ok1 = (vm >> (16 * wq + g + 8)) & 1;
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          sacc[4 * j + e] = ok0 ? sacc[4 * j + e] * c2 : -INFINITY;
          sacc[4 * j + 2 + e] = ok1 ? sacc[4 * j + 2 + e] * c2 : -INFINITY;
        }
      // Per-head max of the tile: the thread's 2 keys, the 8 g lanes, then the 4 warps.
      float* const red = sred + (it & 1) * 256;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        float mx[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          mx[e] = fmaxf(sacc[4 * j + e], sacc[4 * j + 2 + e]);
          mx[e] = fmaxf(mx[e], __shfl_xor_sync(0xffffffffu, mx[e], 4));
          mx[e] = fmaxf(mx[e], __shfl_xor_sync(0xffffffffu, mx[e], 8));
          mx[e] = fmaxf(mx[e], __shfl_xor_sync(0xffffffffu, mx[e], 16));
        }
        if (g == 0)
          *reinterpret_cast<float2*>(red + wq * 64 + 8 * j + 2 * tq) = make_float2(mx[0], mx[1]);
      }
      named_sync(kBarRed, 128);
      // Lazy reference max (variant 6's rule; every thread holding a head takes the same
      // decision), the rescale of lsum and of this warpgroup's Oᵀ columns, the factors for
      // warpgroup 1, and p = 2^(s − m2) in place.
      float* const scl = sscale + (it & 1) * 64;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        float tm[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          const float2 v = *reinterpret_cast<const float2*>(red + w * 64 + 8 * j + 2 * tq);
          tm[0] = fmaxf(tm[0], v.x);
          tm[1] = fmaxf(tm[1], v.y);
        }
        float corr[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int i = 2 * j + e;
          corr[e] = 1.f;
          if (tm[e] > m2[i] + kTau6) {
            corr[e] = ex2_ftz(m2[i] - tm[e]);  // m2 = −inf: 0 (o and l are 0 then)
            lsum[i] *= corr[e];
            m2[i] = tm[e];
          }
          const float mref = m2[i] == -INFINITY ? INFINITY : m2[i];  // no valid key yet: p = 0
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const float pv = ex2_ftz(sacc[4 * j + 2 * r + e] - mref);
            sacc[4 * j + 2 * r + e] = pv;
            lsum[i] += pv;
          }
        }
#pragma unroll
        for (int mt = 0; mt < 4; ++mt)
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            o[mt][4 * j + 2 * r] *= corr[0];
            o[mt][4 * j + 2 * r + 1] *= corr[1];
          }
        // Written before this tile's kBarPFree sync: safe only through the parity buffers —
        // warpgroup 1 read buffer (it & 1) for tile it − 2 before its kBarPFree arrive of tile
        // it − 2, which warpgroup 0 passed at tile it − 1. A deeper ring or another PFree rule
        // must move this store after the sync.
        if (wq == 0 && g == 0)
          *reinterpret_cast<float2*>(scl + 8 * j + 2 * tq) = make_float2(corr[0], corr[1]);
      }
      // Pᵀ → shared memory once warpgroup 1 is done with the previous one.
      if (it > 0) named_sync(kBarPFree, 256);
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int key = 16 * wq + g + 8 * r;  // key % 8 == g
          *reinterpret_cast<uint32_t*>(smem + Sh::kOffP + key * 128 + ((j ^ g) << 4) + 4 * tq) =
              pack_bf16(sacc[4 * j + 2 * r], sacc[4 * j + 2 * r + 1]);
        }
      fence_proxy_async_smem();
      named_arrive(kBarPReady, 256);
      named_sync(kBarP0, 128);  // this warpgroup's Pᵀ complete before its own P·V
      wgmma_fence_acc(o[0]);
      wgmma_fence_acc(o[1]);
      wgmma_fence_acc(o[2]);
      wgmma_fence_acc(o[3]);
      tr14_pv(o, tile_s, 0, wq, lane, pt_desc);
      wgmma_fence_acc(o[0]);
      wgmma_fence_acc(o[1]);
      wgmma_fence_acc(o[2]);
      wgmma_fence_acc(o[3]);
      fence_proxy_async_smem();  // the reads of Pᵀ and the slot before their reuse
      mbar_arrive(empty0 + 8 * slot);
    }
    // Final l per head: the 8 g lanes, then the 4 warps (in the epilogue); m2 through sm2.
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      lsum[i] += __shfl_xor_sync(0xffffffffu, lsum[i], 4);
      lsum[i] += __shfl_xor_sync(0xffffffffu, lsum[i], 8);
      lsum[i] += __shfl_xor_sync(0xffffffffu, lsum[i], 16);
    }
    float* const red = sred + (n_tiles & 1) * 256;  // not read since tile n_tiles − 2
    if (g == 0)
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        *reinterpret_cast<float2*>(red + wq * 64 + 8 * j + 2 * tq) =
            make_float2(lsum[2 * j], lsum[2 * j + 1]);
        if (wq == 0)
          *reinterpret_cast<float2*>(sm2 + 8 * j + 2 * tq) = make_float2(m2[2 * j], m2[2 * j + 1]);
      }
  } else {
    // Warpgroup 1: the copies of the next tile, then Oᵀ[dims 256 … 511] += Vᵀ · Pᵀ.
    for (int it = 0; it < n_tiles; ++it) {
      const int slot = it % kS;
      if (const int nt = it + kS - 1; nt < n_tiles) {  // into the slot tile it − 1 used
        if (nt >= kS) mbar_wait(empty0 + 8 * (nt % kS), uint32_t((nt / kS - 1) & 1));
        produce(nt, row_next);
        row_next = lookup(nt + 1);
      }
      mbar_wait(full0 + 8 * slot, uint32_t((it / kS) & 1));
      named_sync(kBarPReady, 256);
      const float* const scl = sscale + (it & 1) * 64;
#pragma unroll
      for (int j = 0; j < 8; ++j) {  // unconditional (see variant 11: C7515)
        const float2 c = *reinterpret_cast<const float2*>(scl + 8 * j + 2 * tq);
#pragma unroll
        for (int mt = 0; mt < 4; ++mt)
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            o[mt][4 * j + 2 * r] *= c.x;
            o[mt][4 * j + 2 * r + 1] *= c.y;
          }
      }
      wgmma_fence_acc(o[0]);
      wgmma_fence_acc(o[1]);
      wgmma_fence_acc(o[2]);
      wgmma_fence_acc(o[3]);
      tr14_pv(o, ring_s + uint32_t(slot * Sh::kTileBytes), 256, wq, lane, pt_desc);
      wgmma_fence_acc(o[0]);
      wgmma_fence_acc(o[1]);
      wgmma_fence_acc(o[2]);
      wgmma_fence_acc(o[3]);
      fence_proxy_async_smem();
      if (it + 1 < n_tiles) named_arrive(kBarPFree, 256);
      mbar_arrive(empty0 + 8 * slot);
    }
  }
  if (wg == 0) named_sync(kBarRed, 128);  // the l partials and m2 written

  // ---- epilogue: o[head][dim] rows over the Q + ring space, then coalesced output ----
  constexpr float kLn2 = 0.6931471805599453f;
  float* const cp = reinterpret_cast<float*>(smem);  // [64][kTr14Ld] unnormalized o
  float* const cm = cp + 64 * kTr14Ld;               // [64] m (nats; −inf: no keys)
  float* const cl = cm + 64;                         // [64] l
  float* const wts = cl + 64;                        // [64][kMaxCluster11] (cluster merge)
  __syncthreads();  // every wgmma and ring read done
#pragma unroll
  for (int mt = 0; mt < 4; ++mt)
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          cp[(8 * j + 2 * tq + e) * kTr14Ld + 256 * wg + 64 * mt + 16 * wq + g + 8 * r] =
              o[mt][4 * j + 2 * r + e];
  if (tid < 64) {
    const float* red = sred + (n_tiles & 1) * 256;
    cl[tid] = red[tid] + red[64 + tid] + red[128 + tid] + red[192 + tid];
    cm[tid] = sm2[tid] == -INFINITY ? -INFINITY : sm2[tid] * kLn2;
  }
  __syncthreads();
  if constexpr (kCl) {
    ws_cluster_merge<kTr14Ld>(cp, cm, cl, wts, a, t, hb, s, n_splits, tid);
    return;
  }
  const int nh = min(64, H - hb);
  if (n_splits == 1) {
    if (tid < nh) {  // the normalization with the sink
      const float m = cm[tid], sink = a.sinks[hb + tid];
      const float M = fmaxf(m, sink);
      const float f = m == -INFINITY ? 0.f : __expf(m - M);
      wts[tid] = f / (cl[tid] * f + __expf(sink - M));
    }
    __syncthreads();
    for (int h = 0; h < nh; ++h) {
      const float2 v = *reinterpret_cast<const float2*>(cp + h * kTr14Ld + 2 * tid);
      const float f = wts[h];
      *reinterpret_cast<float2*>(a.out + (t * H + hb + h) * int64_t(kHd) + 2 * tid) =
          make_float2(v.x * f, v.y * f);
    }
    return;
  }
  for (int h = 0; h < nh; ++h) {  // workspace partials: (m, l, o) per (row, head, split)
    float* pwo = ws + ((t * H + hb + h) * n_splits + s) * int64_t(kHd + 2);
    if (tid == 0) {
      pwo[0] = cm[h];
      pwo[1] = cl[h];
    }
    *reinterpret_cast<float2*>(pwo + 2 + 2 * tid) =
        *reinterpret_cast<const float2*>(cp + h * kTr14Ld + 2 * tid);
  }
}
