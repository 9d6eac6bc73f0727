// Decode sparse MQA attention, warp-specialized (variants 11: 64-key tiles in a 2-slot ring, 12:
// 32-key tiles in a 4-slot ring, 13: 48-key tiles in a 3-slot ring), bf16 KV pools. Included by attention_dec.cu inside its anonymous
// namespace after attention_dec_wg.cuh (it uses that file's swizzled operand layout op7_off, Q
// staging constants and diagnostic switch, and attention_dec.cu's cp.async, PDL, ex2 and bf16
// helpers); the launcher is sparse_attention_dec.
//
// Why (issue 7, docs/cuda.md §Variants 9 … 13): in variants 7 … 10 both warpgroups run the same
// lock-step sequence per tile — copies, QK, S exchange, softmax, P·V — separated by CTA-wide
// barriers, so the tensor cores idle through the softmax and the barriers, and the loads of the
// next tile are issued by the same warps between their MMAs. Variant 9 at batch 64 (HCA 1M) runs
// 1.89× its byte floor; without its copies it still takes 1.41× (the compute chain), without its
// wgmma 1.66× (the load chain) (bench/results/cuda-attention-wg-swizzle.md). Here, in the shape of
// FlashMLA's Hopper decode kernel (its design, not its code):
//   warpgroup 0 (threads 0–127): S = Q·Kᵀ over all 512 dims (32 wgmma m64nNk16, both operands
//       128-byte-swizzled in shared memory), the online softmax (variant 6's lazy log2 rule), P
//       (bf16) and the per-head rescale factors to shared memory for warpgroup 1, then
//       O[:, 0 … 255] += P·V with P from registers;
//   warpgroup 1 (threads 128–255): the producer as well — it looks the key rows up 2–3 tiles
//       ahead and copies them (cp.async, 16 bytes a lane, into the swizzled layout) into a ring
//       of kStages slots, each slot's mbarrier signalled when its copies land
//       (cp.async.mbarrier.arrive); then waits for P, rescales its O and adds
//       O[:, 256 … 511] += P·V with P from shared memory — overlapping warpgroup 0's QK of the
//       next tile. (A separate producer warp would make 9 warps: 3 on one SM sub-partition, whose
//       16K registers then cap every thread at 168 and spill warpgroup 0.)
// Synchronization: full[s] (warpgroup 1 → all: 128 cp.async arrivals + 128 plain arrivals after
// the valid-key byte stores), empty[s] (all 256 threads after their last read of the slot),
// named barriers kBarPReady / kBarPFree between the two warpgroups around the P buffer, and
// kBarFinal for the Q staging and the final normalization factors. Results: the attention.h
// layout, as variant 7.

constexpr int kWs11Threads = 256;  // 2 warpgroups
/// L2 prefetch distance of variants 11 … 13 in tiles beyond the tile being copied (0: none, the
/// default; 1, 2); set_attention_dec11_prefetch (bench A/B). Off because it slowed the kernel:
/// batch 64, HCA 1M 221 µs with 1 tile, 236 with 2, 214 without (cuda-attention-wg-ws.md).
__constant__ int c_attn11_prefetch = 0;
constexpr int kBarPReady = 1, kBarPFree = 2, kBarFinal = 3;  // named barrier ids (0: syncthreads)

/// Shapes of the variant-11 (kN = 64, 2 slots), variant-12 (kN = 32, 4 slots) and variant-13
/// (kN = 48, 3 slots: 50% more bytes in flight than variant 11, 221 KB of shared memory against
/// 206 KB) kernels.
template <int kN, int kStages>
struct Ws11Shape {
  static_assert((kN == 32 || kN == 48 || kN == 64) && kStages >= 2, "keys per tile, ring depth");
  static constexpr int kTileBytes = kN * kHd * 2;
  static constexpr int kSAcc = kN / 2;  // S accumulators per warpgroup-0 thread
  static constexpr int kPBytes = 64 * kN * 2;  // P (bf16, 64 heads × kN keys)
  // Q | ring | P | rescale (64 f32) | final factor (64 f32) | valid bytes (kStages × 64) | full,
  // empty mbarriers (kStages × 8 each); + 1 KiB of alignment slack.
  static constexpr size_t kOffRing = kQ7Bytes;
  static constexpr size_t kOffP = kOffRing + size_t(kStages) * kTileBytes;
  static constexpr size_t kOffScale = kOffP + kPBytes;
  static constexpr size_t kOffFinal = kOffScale + 64 * 4;
  static constexpr size_t kOffValid = kOffFinal + 64 * 4;
  static constexpr size_t kOffBar = kOffValid + size_t(kStages) * 64;
  static constexpr size_t kSmem = kOffBar + size_t(2) * kStages * 8 + 1024;
};
static_assert(Ws11Shape<64, 2>::kSmem <= 232448 && Ws11Shape<32, 4>::kSmem <= 232448 &&
                  Ws11Shape<48, 3>::kSmem <= 232448,
              "smem over the 227 KiB limit");


/// Largest split count merged inside a thread-block cluster by the variant-11 … 13 kernels
/// (portable cluster size).
constexpr int kMaxCluster11 = 8;
/// Row stride (floats) of a CTA's partial o in its own shared memory for the cluster merge: 512 +
/// 8, so the float2 stores of a warp's 8 head rows (g = 0 … 7) hit 4 bank groups twice — the two
/// wavefronts 256 bytes need anyway (a 512 stride put all 8 rows on the same banks).
constexpr int kCp11Ld = kHd + 8;

// kCl (launched as clusters of n_splits CTAs, 2 ≤ n_splits ≤ kMaxCluster11: the splits of one
// (row, head block)): the split partials are merged through distributed shared memory instead of
// the workspace and the combine kernel. After the tile loop every CTA stores its unnormalized o
// (64 heads × 512, f32, row stride kCp11Ld), m (nats) and l into its own shared memory (the Q /
// ring space, free by then); a cluster barrier; CTA s merges heads [s·hs, s·hs + hs) (hs =
// ⌈64 / n_splits⌉) over all ranks in rank order (fixed order: deterministic) with the sink, the
// combine kernel's formula (weights w_q = e^(m_q − M) / (Σ_q l_q·e^(m_q − M) + e^(sink − M)), M =
// max(sink, m_q)), reading the other CTAs' partials, and writes the output rows; a second cluster
// barrier keeps every CTA's shared memory alive until every rank has read it.
/// A variant-11 … 14 CTA's place in its grid (blockIdx.x = t · n_splits + s, blockIdx.y = the
/// block of 64 heads): query row t, key split s, first head hb.
struct WsCta {
  int64_t t;
  int s, hb;
};
/// Kernel entry of variants 11 … 14: waits for the previous kernel's writes (PDL), lets the next
/// kernel launch, and returns the CTA's place in the grid.
__device__ __forceinline__ WsCta ws_cta_begin(int n_splits) {
  pdl_wait();
  pdl_trigger();
  WsCta c;
  c.t = blockIdx.x / n_splits;
  c.s = int(blockIdx.x % n_splits);
  c.hb = blockIdx.y * 64;
  return c;
}

/// The cluster merge of variants 11 … 14 (kCl instances), by every thread `tid` of a CTA once its
/// partial is in its own shared memory: o at `cp` ([64 heads][kLd] f32, unnormalized), m (nats;
/// −inf: no keys) at `cm`, l at `cl`; `wts` ([64][kMaxCluster11] f32) is scratch. A cluster
/// barrier; CTA s merges heads [s·hs, s·hs + hs) (hs = ⌈64 / n_splits⌉) over all ranks in rank
/// order with the sink (the combine kernel's formula, cluster_merge_weights) and writes their
/// output rows (dims 2·tid, 2·tid + 1 per thread: 256 threads); a second barrier keeps the
/// shared memory alive until every rank has read it.
template <int kLd>
__device__ __forceinline__ void ws_cluster_merge(const float* cp, const float* cm, const float* cl,
                                                 float* wts, const ops::AttentionArgs& a,
                                                 int64_t t, int hb, int s, int n_splits,
                                                 int tid) {
  static_assert(kLd % 2 == 0, "float2 rows");
  const int H = a.n_heads;
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();  // every rank's partial written and visible cluster-wide
  const int hs = (64 + n_splits - 1) / n_splits;
  const int h_lo = s * hs, h_hi = min(min(64, h_lo + hs), H - hb);  // my heads [h_lo, h_hi)
  if (tid < h_hi - h_lo) {  // one thread per head: the merge weights
    const int hl = h_lo + tid;
    cluster_merge_weights<kMaxCluster11>(cluster, cm, cl, hl, n_splits, a.sinks[hb + hl],
                                         wts + (hl - h_lo) * kMaxCluster11);
  }
  __syncthreads();  // weights ready
  // out[h][d] = Σ_q o_q[h][d] · w_q[h] in rank order; thread: dims 2·tid, 2·tid + 1 of 8 heads
  // at a time (8 · n_splits float2 reads of distributed shared memory in flight).
  for (int h0 = h_lo; h0 < h_hi; h0 += 8) {
    float2 acc[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] = make_float2(0.f, 0.f);
#pragma unroll
    for (int q = 0; q < kMaxCluster11; ++q) {
      if (q >= n_splits) break;
      const float* rank_cp = cluster.map_shared_rank(cp, q);
      float2 v[8];
#pragma unroll
      for (int i = 0; i < 8; ++i)
        if (h0 + i < h_hi)
          v[i] = *reinterpret_cast<const float2*>(rank_cp + (h0 + i) * kLd + 2 * tid);
#pragma unroll
      for (int i = 0; i < 8; ++i)
        if (h0 + i < h_hi) {
          const float w = wts[(h0 + i - h_lo) * kMaxCluster11 + q];
          acc[i].x = fmaf(v[i].x, w, acc[i].x);
          acc[i].y = fmaf(v[i].y, w, acc[i].y);
        }
    }
#pragma unroll
    for (int i = 0; i < 8; ++i)
      if (h0 + i < h_hi)
        *reinterpret_cast<float2*>(a.out + (t * H + hb + h0 + i) * int64_t(kHd) + 2 * tid) = acc[i];
  }
  cluster.sync();  // keep this CTA's shared memory until every rank has read it
}

template <int kN, int kStages, bool kCl = false>
__global__ void __launch_bounds__(kWs11Threads, 1)
    attn_dec11_kernel(ops::AttentionArgs a, const __nv_bfloat16* __restrict__ swa_pool,
                      const __nv_bfloat16* __restrict__ comp_pool, int n_splits,
                      float* __restrict__ ws) {
  using Sh = Ws11Shape<kN, kStages>;
  constexpr int kS = kStages, kNA = Sh::kSAcc;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const WsCta cta = ws_cta_begin(n_splits);
  const int64_t t = cta.t;
  const int s = cta.s, hb = cta.hb;
  const int H = a.n_heads;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const Wg7Keys ks7 = wg7_keys<kN>(a, swa_pool != nullptr, comp_pool != nullptr, t, s, n_splits);
  const int n_swa = ks7.n_swa, n_comp = ks7.n_comp, k0 = ks7.k0, k1 = ks7.k1;
  const int n_tiles = ks7.n_tiles;
  const int diag = c_attn7_diag;

  const uint32_t q_s = (smem_addr(smem_raw) + 1023u) & ~1023u;
  unsigned char* const smem = smem_raw + (q_s - smem_addr(smem_raw));
  const uint32_t ring_s = q_s + uint32_t(Sh::kOffRing);
  const uint32_t p_s = q_s + uint32_t(Sh::kOffP);
  float* const sscale = reinterpret_cast<float*>(smem + Sh::kOffScale);
  float* const sfinal = reinterpret_cast<float*>(smem + Sh::kOffFinal);
  uint8_t* const svalid = smem + Sh::kOffValid;
  const uint32_t full0 = q_s + uint32_t(Sh::kOffBar), empty0 = full0 + 8 * kS;
  static_assert(kWs11Threads == 256, "barrier counts assume 2 warpgroups");
  if (tid == 0) {
    for (int i = 0; i < kS; ++i) {
      mbar_init(full0 + 8 * i, 256);   // warpgroup 1: 128 cp.async arrivals + 128 plain ones
      mbar_init(empty0 + 8 * i, 256);  // every thread, after its last read of the slot
    }
    // Valid-key bytes past kN / 8 are read (8-byte loads) but masked; zero them anyway.
    for (int i = 0; i < kS * 64; ++i) svalid[i] = 0;
  }
  __syncthreads();

  // ---- warpgroup 1 is also the producer: key lookups up to 3 tiles ahead, cp.async into the ring --
  // Warp w of warpgroup 1 copies the 8-key groups w, w + 4 (those < kG); lane: key
  // 8·group + lane % 8, 16-byte pieces lane / 8 + 4i (i < 16).
  constexpr int kG = kN / 8, kGW = (kG + 3) / 4;  // 8-key groups per tile, most per warp
  const int kl = lane & 7, sub = lane >> 3, pw = warp & 3;
  const int64_t swa_off = n_swa > 0 ? a.swa.offset[t] : 0;
  const int64_t comp_off = n_comp > 0 ? a.comp.offset[t] : 0;
  // Pool rows of the next tiles to copy: rq[0] = tile nt (the next cp.async), rq[1] = nt + 1,
  // rq[2] = nt + 2 (looked up a tile before they are needed, so that an L2 prefetch pf tiles
  // ahead of the copies finds its rows loaded).
  int32_t rq[3][kGW];
  const int pf = c_attn11_prefetch;  // 0: no L2 prefetch, else its distance in tiles (1 or 2)
  auto lookup = [&](int tile, int32_t (&r)[kGW]) {
#pragma unroll
    for (int q = 0; q < kGW; ++q) {
      const int j = k0 + tile * kN + 8 * (pw + 4 * q) + kl;
      r[q] = -1;
      if (pw + 4 * q < kG && tile < n_tiles && j < k1)
        r[q] = j < n_swa ? a.swa.rows[swa_off + j] : a.comp.rows[comp_off + (j - n_swa)];
    }
  };
  // The L2 prefetch: cp.async.bulk.prefetch.L2 of each whole 1 KiB row of tile `tile` (one lane
  // of 8 per key).
  auto prefetch = [&](int tile, const int32_t (&r)[kGW]) {
    if (tile >= n_tiles || sub != 0) return;
#pragma unroll
    for (int q = 0; q < kGW; ++q) {
      const int j = k0 + tile * kN + 8 * (pw + 4 * q) + kl;
      if (r[q] < 0) continue;
      const __nv_bfloat16* row = (j < n_swa ? swa_pool : comp_pool) + int64_t(r[q]) * kHd;
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(row), "r"(kHd * 2)
                   : "memory");
    }
  };
  // After tile nt was issued: prefetches tile nt + pf, shifts the row queue, looks up nt + 3.
  auto advance = [&](int nt) {
    if (pf == 1) prefetch(nt + 1, rq[1]);
    if (pf == 2) prefetch(nt + 2, rq[2]);
#pragma unroll
    for (int q = 0; q < kGW; ++q) {
      rq[0][q] = rq[1][q];
      rq[1][q] = rq[2][q];
    }
    lookup(nt + 3, rq[2]);
  };
  // Issues tile `tile` (< n_tiles; rows r) into its slot and arrives on the slot's full barrier
  // twice: once when this thread's copies land, once now (after its valid-byte stores).
  auto produce = [&](int tile, const int32_t (&r)[kGW]) {
    const int slot = tile % kS;
    const uint32_t dst = ring_s + uint32_t(slot * Sh::kTileBytes);
#pragma unroll
    for (int q = 0; q < kGW; ++q) {
      const int grp = pw + 4 * q, key = 8 * grp + kl;
      if (grp >= kG) continue;  // warp-uniform
      const int j = k0 + tile * kN + key;
      const __nv_bfloat16* pool = j < n_swa ? swa_pool : comp_pool;
      const bool ok = r[q] >= 0;
      const unsigned char* src =
          ok ? reinterpret_cast<const unsigned char*>(pool + int64_t(r[q]) * kHd) + 16 * sub
             : reinterpret_cast<const unsigned char*>(a.q);  // not read (0 source bytes)
      if (diag != 1) {
#pragma unroll
        for (int i = 0; i < 16; ++i)
          cp_async16_sa(dst + op7_off<true, kN>(key, sub + 4 * i), src + (ok ? 64 * i : 0),
                        ok ? 16 : 0);
      }
      const unsigned bal = __ballot_sync(0xffffffffu, ok);
      if (lane == 0) svalid[slot * 64 + grp] = uint8_t(bal & 0xffu);
    }
    mbar_arrive_cp_async(full0 + 8 * slot);
    mbar_arrive(full0 + 8 * slot);  // after the valid-byte stores (release)
  };
  const int wg = tid >> 7;
  if (wg == 1 && n_tiles > 0) {  // prologue: tiles 0 … kS − 2 in flight before the Q staging
    lookup(0, rq[0]);
    lookup(1, rq[1]);
    lookup(2, rq[2]);
    for (int p = 0; p < kS - 1 && p < n_tiles; ++p) {
      produce(p, rq[0]);
      advance(p);
    }
  }

  // ---- Q → bf16 swizzled operand (both warpgroups), then the roles ----
  const int wq = (tid >> 5) & 3, g = lane >> 2, tq = lane & 3;
  if (n_tiles > 0) {
    wg7_stage_q<true>(smem, a, t, hb, tid);
    if (diag == 1)  // diagnostic: no copies; the ring holds zeros
      for (int i = tid; i < kS * Sh::kTileBytes / 16; i += 256)
        reinterpret_cast<uint4*>(smem + Sh::kOffRing)[i] = make_uint4(0u, 0u, 0u, 0u);
    fence_proxy_async_smem();
  }
  named_sync(kBarFinal, 256);  // Q complete (both warpgroups)

  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  constexpr uint32_t kBlkQ = 64 * 128, kBlkK = kN * 128;
  // V of this warpgroup's dims (blocks 4wg … 4wg + 3): N-major, 64-dim blocks kBlkK apart, 8-key
  // groups 1 KiB apart; a 16-key step is 2 KiB.
  const uint64_t v_desc0 = wgmma_desc_sw128(ring_s + 4 * kBlkK * wg, kBlkK, 1024);
  float m2[2] = {-INFINITY, -INFINITY}, lsum[2] = {0.f, 0.f};

  if (wg == 0) {
    const float c2 = a.scale * 1.4426950408889634f;
    const uint64_t q_desc = wgmma_desc_sw128(q_s, 16, 1024);
    const uint64_t k_desc0 = wgmma_desc_sw128(ring_s, 16, 1024);
    float sacc[kNA];
#pragma unroll
    for (int i = 0; i < kNA; ++i) sacc[i] = 0.f;
    for (int it = 0; it < n_tiles; ++it) {
      const int slot = it % kS;
      const uint64_t slot_off = uint64_t(slot * (Sh::kTileBytes >> 4));
      mbar_wait(full0 + 8 * slot, uint32_t((it / kS) & 1));
      fence_proxy_async_smem();
      wgmma_fence();
      if (diag != 2) {
#pragma unroll
        for (int kk = 0; kk < 32; ++kk)
          wg7_qk_step<kN>(sacc,
                          q_desc + uint64_t(((kk >> 2) * kBlkQ + (kk & 3) * 32) >> 4),
                          k_desc0 + slot_off + uint64_t(((kk >> 2) * kBlkK + (kk & 3) * 32) >> 4),
                          kk > 0);
      }
      wgmma_commit();
      wgmma_wait0();
      wgmma_fence_acc(sacc);
      const uint64_t vm =
          (kN > 32 ? *reinterpret_cast<const uint64_t*>(svalid + slot * 64)
                    : uint64_t(*reinterpret_cast<const uint32_t*>(svalid + slot * 64))) >>
          (2 * tq);
      float sv[kNA];  // log2-unit logits, masked (a copy: sacc stays the wgmma's own registers)
#pragma unroll
      for (int i = 0; i < kNA; ++i)
        sv[i] = (vm & (uint64_t(1) << (8 * (i >> 2) + (i & 1)))) ? sacc[i] * c2 : -INFINITY;
      float corr[2];
      uint32_t pa[kN / 16][4];
      wg7_softmax_tile<kNA>(sv, m2, lsum, o, corr, pa);
      // Hand P and the rescale factors to warpgroup 1 (once it is done with the previous ones).
      if (it > 0) named_sync(kBarPFree, 256);
      if (tq == 0) {
        sscale[16 * wq + g] = corr[0];
        sscale[16 * wq + g + 8] = corr[1];
      }
      // P in the no-swizzle K-major layout: (head h, key k) at (h / 8)·kN·16 + (k / 8)·128 +
      // (h % 8)·16 + (k % 8)·2; this thread's pa[ks][q]: head 16wq + g + 8(q & 1), keys
      // 16ks + 8(q >> 1) + 2tq, +1.
#pragma unroll
      for (int ks = 0; ks < kN / 16; ++ks)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int h = 16 * wq + g + 8 * (q & 1), k = 16 * ks + 8 * (q >> 1) + 2 * tq;
          *reinterpret_cast<uint32_t*>(smem + Sh::kOffP + (h >> 3) * (kN * 16) + (k >> 3) * 128 +
                                       (h & 7) * 16 + (k & 7) * 2) = pa[ks][q];
        }
      fence_proxy_async_smem();
      named_arrive(kBarPReady, 256);
      wgmma_fence_acc(o);
      wgmma_fence();
      if (diag != 2) {
#pragma unroll
        for (int ks = 0; ks < kN / 16; ++ks)
          wgmma_rs_m64n256k16_tb(o, pa[ks], v_desc0 + slot_off + uint64_t(ks * (2048 >> 4)));
      }
      wgmma_commit();
      wgmma_wait0();
      wgmma_fence_acc(o);
      fence_proxy_async_smem();  // the async-proxy reads of the slot before its next generic writes
      mbar_arrive(empty0 + 8 * slot);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      lsum[r] += __shfl_xor_sync(0xffffffffu, lsum[r], 1);
      lsum[r] += __shfl_xor_sync(0xffffffffu, lsum[r], 2);
    }
  } else {
    // Warpgroup 1: P·V over dims 256 … 511 with P from shared memory.
    const uint64_t p_desc0 = wgmma_desc(p_s, 128, uint32_t(kN * 16));
    for (int it = 0; it < n_tiles; ++it) {
      const int slot = it % kS;
      const uint64_t slot_off = uint64_t(slot * (Sh::kTileBytes >> 4));
      if (const int nt = it + kS - 1; nt < n_tiles) {  // into the slot tile it − 1 used
        if (nt >= kS) mbar_wait(empty0 + 8 * (nt % kS), uint32_t((nt / kS - 1) & 1));
        produce(nt, rq[0]);
        advance(nt);
      }
      mbar_wait(full0 + 8 * slot, uint32_t((it / kS) & 1));  // all 128 producers' copies landed
      named_sync(kBarPReady, 256);
      // Unconditional (128 FMULs; a branch on "any factor ≠ 1" here made ptxas serialize the
      // P·V wgmma, C7515).
      const float c0 = sscale[16 * wq + g], c1 = sscale[16 * wq + g + 8];
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        o[4 * j] *= c0;
        o[4 * j + 1] *= c0;
        o[4 * j + 2] *= c1;
        o[4 * j + 3] *= c1;
      }
      fence_proxy_async_smem();
      wgmma_fence_acc(o);
      wgmma_fence();
      if (diag != 2) {
#pragma unroll
        for (int ks = 0; ks < kN / 16; ++ks)
          wgmma_ss_m64n256k16_tb(o, p_desc0 + uint64_t(ks * (256 >> 4)),
                                 v_desc0 + slot_off + uint64_t(ks * (2048 >> 4)));
      }
      wgmma_commit();
      wgmma_wait0();
      wgmma_fence_acc(o);
      fence_proxy_async_smem();  // the async-proxy reads of P and the slot before their reuse
      if (it + 1 < n_tiles) named_arrive(kBarPFree, 256);
      mbar_arrive(empty0 + 8 * slot);
    }
  }

  // ---- epilogue: warpgroup 0 owns (m, l); the normalization factor goes through sfinal ----
  constexpr float kLn2 = 0.6931471805599453f;
  if constexpr (kCl) {
    static_assert(size_t(64) * kCp11Ld * 4 + (2 * 64 + 64 * kMaxCluster11) * 4 <= Sh::kOffP,
                  "cluster partial must fit the Q + ring space");
    float* const cp = reinterpret_cast<float*>(smem);  // [64][kCp11Ld] unnormalized o
    float* const cm = cp + 64 * kCp11Ld;              // [64] m (nats; −inf: no keys)
    float* const cl = cm + 64;                        // [64] l
    float* const wts = cl + 64;                       // [64][kMaxCluster11] merge weights
    __syncthreads();  // both warpgroups past their last wgmma (Q, ring and P no longer read)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int hl = 16 * wq + g + 8 * r;
      if (wg == 0 && tq == 0) {
        cm[hl] = m2[r] == -INFINITY ? -INFINITY : m2[r] * kLn2;
        cl[hl] = lsum[r];
      }
      float* row = cp + hl * kCp11Ld + 256 * wg + 2 * tq;
#pragma unroll
      for (int j = 0; j < 32; ++j)
        *reinterpret_cast<float2*>(row + 8 * j) = make_float2(o[4 * j + 2 * r], o[4 * j + 2 * r + 1]);
    }
    ws_cluster_merge<kCp11Ld>(cp, cm, cl, wts, a, t, hb, s, n_splits, tid);
    return;
  }
  float scale_r[2] = {1.f, 1.f};
  if (wg == 0) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int hl = 16 * wq + g + 8 * r, h = hb + hl;
      const float m = m2[r] == -INFINITY ? -INFINITY : m2[r] * kLn2;  // nats
      if (n_splits == 1) {
        const float sink = h < H ? a.sinks[h] : 0.f;
        const float M = fmaxf(m, sink);
        const float f = m == -INFINITY ? 0.f : __expf(m - M);
        scale_r[r] = f / (lsum[r] * f + __expf(sink - M));
      } else if (h < H && tq == 0) {
        float* pwo = ws + ((t * H + h) * n_splits + s) * int64_t(kHd + 2);
        pwo[0] = m;
        pwo[1] = lsum[r];
      }
      if (tq == 0) sfinal[hl] = scale_r[r];
    }
    named_arrive(kBarFinal, 256);
  } else {
    named_sync(kBarFinal, 256);
    scale_r[0] = sfinal[16 * wq + g];
    scale_r[1] = sfinal[16 * wq + g + 8];
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int h = hb + 16 * wq + g + 8 * r;
    if (h >= H) continue;
    const int d0 = 256 * wg + 2 * tq;
    if (n_splits == 1) {
      float* out = a.out + (t * H + h) * int64_t(kHd) + d0;
#pragma unroll
      for (int j = 0; j < 32; ++j)
        *reinterpret_cast<float2*>(out + 8 * j) =
            make_float2(o[4 * j + 2 * r] * scale_r[r], o[4 * j + 2 * r + 1] * scale_r[r]);
    } else {
      float* pwo = ws + ((t * H + h) * n_splits + s) * int64_t(kHd + 2);
#pragma unroll
      for (int j = 0; j < 32; ++j)
        *reinterpret_cast<float2*>(pwo + 2 + d0 + 8 * j) =
            make_float2(o[4 * j + 2 * r], o[4 * j + 2 * r + 1]);
    }
  }
}
