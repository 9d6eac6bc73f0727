// Decode sparse MQA attention on warpgroup MMA (wgmma): variants 7 (64-key tiles) and 8 (32-key
// tiles), bf16 KV pools. Included by attention_dec.cu inside its anonymous namespace (it uses that
// file's cp.async, PDL, ex2 and bf16 helpers and kHd); the launcher is sparse_attention_dec.
//
// Why (issue 7, docs/cuda.md §Variant 7): the mma.sync kernels (v2 … v6) spend their time issuing
// instructions (ldmatrix of both operands, 16-row tiles per warp), not moving bytes — at batch 64
// v2 runs ~3.5× its byte floor. Here the tensor cores read Q and the key tile straight from shared
// memory, a whole 64-head × kN-key product per instruction, and P·V is one m64n256k16 per 16 keys
// per warpgroup with P taken from registers.
//
// One CTA = 2 warpgroups (256 threads) on one (query row t, key split s, group of 64 heads):
//   QK: warpgroup w computes the partial S_w[64 heads, kN keys] = Q[:, 256w … 256w + 255] ·
//       K[:, same dims]ᵀ (16 wgmma m64nNk16, both operands K-major in shared memory); the two
//       partials meet in shared memory, and both warpgroups hold S = S_0 + S_1 (bit-identical:
//       the same two floats added), so they take the same softmax decisions;
//   softmax: online, in log2 units (p = 2^(s·scale·log2 e − m2)) with the lazy reference max of
//       variant 6 (m2 moves only when a row's tile max exceeds it by more than 8: p ≤ 2^8); keys
//       with pool row −1 (masked entries, past the split) get p = 0;
//   PV: O_w[64 heads, dims 256w … 256w + 255] += P · V (wgmma m64n256k16, A = P from the S
//       accumulators as bf16 registers, B = the same key tile read N-major: K = V).
// Shared memory (dynamic): Q as bf16 (64 KiB) | kStages key tiles (kN × 1 KiB each) | the S
// exchange (2 × 128 threads × kN / 2 floats). Q and the tiles use one layout, the canonical
// no-swizzle core-matrix layout of wgmma.cuh with 512 dims per row: element (row, dim) at byte
//
//   (row / 8) · 8192 + (dim / 8) · 128 + (row % 8) · 16 + (dim % 8) · 2
//
// As a K-major operand (Q, and the tile in QK: rows = heads / keys, K = dims) LBO = 128 (next 8
// dims), SBO = 8192 (next 8 rows). As the N-major B of PV (K = keys, N = dims) the same bytes are
// core matrices of 8 keys × 8 dims: 8 keys further is 8192 bytes, 8 dims further 128. Its
// descriptor takes the K stride (8192) in LBO and the N stride (128) in SBO, as for a K-major
// operand (checked on the H200 at 93be9ca: the variant 7 / 8 tests match the CPU op; the fields
// the other way round read past the CTA's shared memory and fault).
// Copies: a warp copies 8 key rows × 64 contiguous bytes per cp.async instruction (lane: key
// 8·group + lane % 8, 16-byte piece c = 4·i + lane / 8 …), and each quarter-warp fills one
// 128-byte core matrix (conflict-free). Key-list lookups run one tile ahead of the issue.
// Pipeline (kStages tiles in the ring): iteration it waits for tile it (cp.async.wait_group
// kStages − 2), fence.proxy.async, barrier A (tile it visible; every warp is done with tile
// it − 1), then issues tile it + kStages − 1 into the slot tile it − 1 used; QK; barrier B
// (partial S exchanged); softmax; PV (wgmma.wait_group 0 before the next iteration).
// Output: the attention.h layout — normalized with the sink for 1 split, else the (max in nats,
// sum, unnormalized o) partials merged by attn_dec_combine3_kernel.

constexpr int kWg7Threads = 256;       // 2 warpgroups
constexpr int kOp7Sbo = 8192;          // bytes from 8 rows of a 512-dim operand to the next 8
constexpr int kOp7Lbo = 128;           // bytes from 8 dims to the next 8 (one core matrix)
constexpr int kQ7Bytes = 64 * kHd * 2;  // Q of 64 heads, bf16

/// Shapes of the variant-7 / 9 (kN = 64) and variant-8 / 10 (kN = 32) kernels (the layout does
/// not change the sizes; 1 KiB of slack aligns the operands to 1,024 bytes for the swizzle).
template <int kN>
struct Wg7Shape {
  static_assert(kN == 32 || kN == 64, "keys per tile");
  static constexpr int kStages = kN == 64 ? 2 : 4;          // ring of key tiles (128 KiB)
  static constexpr int kTileBytes = kN * kHd * 2;
  static constexpr int kSAcc = kN / 2;                      // S accumulators per thread
  static constexpr int kKeyGroups = kN / 8;                 // 8-key groups of a tile
  static constexpr int kWarpsPerGroup = 8 / kKeyGroups;     // warps copying one key group
  static constexpr int kPieceIters = 16 / kWarpsPerGroup;   // cp.async per thread per tile
  static constexpr size_t kSmem =
      size_t(kQ7Bytes) + size_t(kStages) * kTileBytes + size_t(2) * 128 * kSAcc * 4 + 1024;
};
static_assert(Wg7Shape<64>::kSmem == 230400 && Wg7Shape<32>::kSmem == 214016);
static_assert(Wg7Shape<64>::kSmem + 64 <= 232448, "smem over the 227 KiB limit");

/// Byte offset of (row, 16-byte piece c = dims 8c … 8c + 7) in a 512-dim operand of kRows rows:
/// the no-swizzle layout above (kSw false; variants 7 / 8), or (kSw true; variants 9 / 10) the
/// 128-byte-swizzle layout: 8 blocks of 64 dims, each kRows × 128 bytes (a row's 64 dims in one
/// 128-byte line, its 16-byte chunk j at j ^ (row % 8)):
///
///   (c / 8) · kRows · 128 + row · 128 + ((c % 8) ^ (row % 8)) · 16
template <bool kSw, int kRows>
__device__ __forceinline__ uint32_t op7_off(int row, int c) {
  if constexpr (kSw)
    return uint32_t((c >> 3) * (kRows * 128) + row * 128 + (((c & 7) ^ (row & 7)) << 4));
  else
    return uint32_t((row >> 3) * kOp7Sbo + c * kOp7Lbo + (row & 7) * 16);
}

/// Diagnostic switch of the variant 7 … 13 kernels (bench only; set_attention_dec7_diag):
/// 0 normal, 1 no key-row copies (the ring holds zeros), 2 no wgmma (S and o stay 0).
__constant__ int c_attn7_diag = 0;

/// Q[t, hb … hb + 63, :] (f32) → the bf16 operand at `smem` (layout op7_off<kSw, 64>; heads
/// ≥ a.n_heads as zeros), by the 256 threads `tid` of a CTA: 4,096 pieces of 8 dims, 16 per thread;
/// a warp reads 8 heads × 128 contiguous bytes and writes whole 128-byte units. All 32 loads of a
/// thread are issued before the first store: one memory round trip, not 16 (ncu at 93be9ca: the
/// conversions stalled on the loads of a 4-deep unroll).
template <bool kSw>
__device__ __forceinline__ void wg7_stage_q(unsigned char* smem, const ops::AttentionArgs& a,
                                            int64_t t, int hb, int tid) {
  const int H = a.n_heads;
  float4 qv[16][2];
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const int u = tid + 256 * i;
    const int h = 8 * ((u >> 5) & 7) + (u & 7), c = 4 * (u >> 8) + ((u >> 3) & 3);
    qv[i][0] = qv[i][1] = make_float4(0.f, 0.f, 0.f, 0.f);
    if (hb + h < H) {
      const float4* src =
          reinterpret_cast<const float4*>(a.q + (t * H + hb + h) * int64_t(kHd) + 8 * c);
      qv[i][0] = __ldg(src);
      qv[i][1] = __ldg(src + 1);
    }
  }
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const int u = tid + 256 * i;
    const int h = 8 * ((u >> 5) & 7) + (u & 7), c = 4 * (u >> 8) + ((u >> 3) & 3);
    const float4 lo = qv[i][0], hi = qv[i][1];
    *reinterpret_cast<uint4*>(smem + op7_off<kSw, 64>(h, c)) =
        make_uint4(pack_bf16(lo.x, lo.y), pack_bf16(lo.z, lo.w), pack_bf16(hi.x, hi.y),
                   pack_bf16(hi.z, hi.w));
  }
}

/// One tile of variant 6's lazy online softmax in log2 units, for a thread of a 64-row wgmma
/// accumulator: sv[4j + 2r + e] = the logit (log2 units, −inf when masked) of head row r (g,
/// g + 8) and key 8j + 2·tq + e. A row's reference max m2 moves only when the tile's max exceeds
/// it by more than kTau6 (p ≤ 2^8): then lsum and the thread's o (128 accumulators of the
/// m64n256 P·V, rows as sv) are rescaled by corr = 2^(m2_old − m2_new), else corr = 1. Turns sv
/// into p = 2^(sv − m2) (masked: 0), adds them to lsum, and packs P as the bf16 A fragments of
/// the kNA / 8 16-key steps of P·V.
template <int kNA>
__device__ __forceinline__ void wg7_softmax_tile(float (&sv)[kNA], float (&m2)[2],
                                                 float (&lsum)[2], float (&o)[128],
                                                 float (&corr)[2], uint32_t (&pa)[kNA / 8][4]) {
  float mref[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < kNA / 4; ++j)
      mx = fmaxf(mx, fmaxf(sv[4 * j + 2 * r], sv[4 * j + 2 * r + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    corr[r] = 1.f;
    if (mx > m2[r] + kTau6) {  // lazy (variant 6): p stays ≤ 2^8 against the reference
      corr[r] = ex2_ftz(m2[r] - mx);  // m2 = −inf: 0 (o and l are 0 then)
      lsum[r] *= corr[r];
      m2[r] = mx;
    }
    mref[r] = m2[r] == -INFINITY ? INFINITY : m2[r];  // no valid key yet: every p = 2^−inf = 0
  }
  if (__any_sync(0xffffffffu, corr[0] != 1.f || corr[1] != 1.f)) {
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      o[4 * j] *= corr[0];
      o[4 * j + 1] *= corr[0];
      o[4 * j + 2] *= corr[1];
      o[4 * j + 3] *= corr[1];
    }
  }
#pragma unroll
  for (int i = 0; i < kNA; ++i) {
    const int r = (i >> 1) & 1;
    const float p = ex2_ftz(sv[i] - mref[r]);  // masked (−inf) → 0
    sv[i] = p;
    lsum[r] += p;
  }
#pragma unroll
  for (int ks = 0; ks < kNA / 8; ++ks) {  // keys 16ks … 16ks + 15
    pa[ks][0] = pack_bf16(sv[8 * ks], sv[8 * ks + 1]);
    pa[ks][1] = pack_bf16(sv[8 * ks + 2], sv[8 * ks + 3]);
    pa[ks][2] = pack_bf16(sv[8 * ks + 4], sv[8 * ks + 5]);
    pa[ks][3] = pack_bf16(sv[8 * ks + 6], sv[8 * ks + 7]);
  }
}

/// The keys of split s (of n_splits) of query row t with kN-key tiles: the row has n_swa SWA keys
/// then n_comp compressed keys (0 when its pool is absent), the split takes whole tiles and
/// covers keys [k0, k1) in n_tiles tiles (the last may be partial).
struct Wg7Keys {
  int n_swa, n_comp, k0, k1, n_tiles;
};
template <int kN>
__device__ __forceinline__ Wg7Keys wg7_keys(const ops::AttentionArgs& a, bool has_swa,
                                            bool has_comp, int64_t t, int s, int n_splits) {
  Wg7Keys r;
  r.n_swa = (has_swa && a.swa.count) ? a.swa.count[t] : 0;
  r.n_comp = (has_comp && a.comp.count) ? a.comp.count[t] : 0;
  const int n = r.n_swa + r.n_comp;
  const int tiles_per = ((n + kN - 1) / kN + n_splits - 1) / n_splits;
  r.k0 = min(n, s * tiles_per * kN);
  r.k1 = min(n, r.k0 + tiles_per * kN);
  r.n_tiles = (r.k1 - r.k0 + kN - 1) / kN;
  return r;
}

template <int kN>
__device__ __forceinline__ void wg7_qk_step(float (&d)[kN / 2], uint64_t qd, uint64_t kd, int acc) {
  if constexpr (kN == 64)
    wgmma_ss_m64n64k16(d, qd, kd, acc);
  else if constexpr (kN == 48)
    wgmma_ss_m64n48k16(d, qd, kd, acc);
  else
    wgmma_ss_m64n32k16(d, qd, kd, acc);
}

template <int kN, bool kSw>
__global__ void __launch_bounds__(kWg7Threads, 1)
    attn_dec7_kernel(ops::AttentionArgs a, const __nv_bfloat16* __restrict__ swa_pool,
                     const __nv_bfloat16* __restrict__ comp_pool, int n_splits,
                     float* __restrict__ ws) {
  using Sh = Wg7Shape<kN>;
  constexpr int kS = Sh::kStages, kNA = Sh::kSAcc;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  // Per ring slot: bit k of byte b = key 8b + k of the tile has a pool row (kN / 8 bytes).
  __shared__ __align__(8) uint8_t valid_s[kS][8];
  pdl_wait();     // the previous kernel's q, key lists and workspace reads are done
  pdl_trigger();  // the combine (PDL) may be scheduled; it waits for this grid's completion

  const int64_t t = blockIdx.x / n_splits;
  const int s = int(blockIdx.x % n_splits);
  const int hb = blockIdx.y * 64;
  const int H = a.n_heads;
  const int tid = threadIdx.x, wg = tid >> 7, wt = tid & 127;
  const int warp = tid >> 5, lane = tid & 31, wq = warp & 3, g = lane >> 2, tq = lane & 3;
  const Wg7Keys ks7 = wg7_keys<kN>(a, swa_pool != nullptr, comp_pool != nullptr, t, s, n_splits);
  const int n_swa = ks7.n_swa, n_comp = ks7.n_comp, k0 = ks7.k0, k1 = ks7.k1;
  const int n_tiles = ks7.n_tiles;
  const int64_t swa_off = n_swa > 0 ? a.swa.offset[t] : 0;
  const int64_t comp_off = n_comp > 0 ? a.comp.offset[t] : 0;

  // Operands start on a 1,024-byte boundary (the swizzle atoms' alignment; kSmem has the slack).
  const uint32_t q_s = (smem_addr(smem_raw) + 1023u) & ~1023u;
  unsigned char* const smem = smem_raw + (q_s - smem_addr(smem_raw));
  const int diag = c_attn7_diag;
  const uint32_t ring_s = q_s + kQ7Bytes;
  float* sx = reinterpret_cast<float*>(smem + kQ7Bytes + size_t(kS) * Sh::kTileBytes);

  // This thread's copies: key my_key of a tile, pieces pc0 + 4·i (i < kPieceIters).
  const int kg = warp / Sh::kWarpsPerGroup;
  const int my_key = 8 * kg + (lane & 7);
  const int pc0 = (warp % Sh::kWarpsPerGroup) * (4 * Sh::kPieceIters) + (lane >> 3);
  auto lookup = [&](int tile) -> int32_t {
    const int j = k0 + tile * kN + my_key;
    if (tile >= n_tiles || j >= k1) return -1;
    return j < n_swa ? a.swa.rows[swa_off + j] : a.comp.rows[comp_off + (j - n_swa)];
  };
  // Issues tile `tile` (if it exists; r = lookup(tile)) into slot tile % kS and always commits
  // one group, so that "groups committed" counts tiles for cp_async_wait.
  auto issue = [&](int tile, int32_t r) {
    if (tile < n_tiles) {
      const int slot = tile % kS;
      const int j = k0 + tile * kN + my_key;
      const __nv_bfloat16* pool = j < n_swa ? swa_pool : comp_pool;
      const bool ok = r >= 0;
      const unsigned char* src =
          ok ? reinterpret_cast<const unsigned char*>(pool + int64_t(r) * kHd) + 16 * pc0
             : reinterpret_cast<const unsigned char*>(a.q);  // not read (0 source bytes)
      const uint32_t dst = ring_s + uint32_t(slot * Sh::kTileBytes);
      if (diag != 1) {
#pragma unroll
        for (int i = 0; i < Sh::kPieceIters; ++i)
          cp_async16_sa(dst + op7_off<kSw, kN>(my_key, pc0 + 4 * i), src + (ok ? 64 * i : 0),
                        ok ? 16 : 0);
      }
      const unsigned bal = __ballot_sync(0xffffffffu, ok);
      if (warp % Sh::kWarpsPerGroup == 0 && lane == 0) valid_s[slot][kg] = uint8_t(bal & 0xffu);
    }
    cp_async_commit();
  };

  const float c2 = a.scale * 1.4426950408889634f;  // logits in log2 units
  int32_t next_r = -1;  // lookup(it + kS − 1), one tile ahead of its issue
  if (n_tiles > 0) {
#pragma unroll
    for (int p = 0; p < kS - 1; ++p) issue(p, lookup(p));
    next_r = lookup(kS - 1);
    wg7_stage_q<kSw>(smem, a, t, hb, tid);  // before o is live
  }

  if (diag == 1) {  // diagnostic: no copies; the tiles hold zeros
    for (int i = tid; i < kS * Sh::kTileBytes / 16; i += kWg7Threads)
      reinterpret_cast<uint4*>(smem + kQ7Bytes)[i] = make_uint4(0u, 0u, 0u, 0u);
  }
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  float m2[2] = {-INFINITY, -INFINITY}, lsum[2] = {0.f, 0.f};
  // Descriptors of k-step 0 / slot 0; a k-step (16 dims: 256 bytes), a slot and 16 keys (2 row
  // groups: 16 KiB) add their byte offset >> 4 to the start-address field (no carry: shared
  // addresses stay below 256 KiB).
  // Swizzled (kSw): warpgroup w's dims are the 64-dim blocks 4w … 4w + 3; a k-step moves 32
  // bytes inside a block's 128-byte lines (the hardware applies the XOR to the final address),
  // every fourth one to the next block; a 16-key step of P·V is 2 row groups (2 KiB).
  constexpr uint32_t kBlkQ = 64 * 128, kBlkK = kN * 128;
  const uint64_t q_desc =
      kSw ? wgmma_desc_sw128(q_s + 4 * kBlkQ * wg, 16, 1024)
          : wgmma_desc(q_s + uint32_t(4096 * wg), kOp7Lbo, kOp7Sbo);
  const uint64_t k_desc0 =
      kSw ? wgmma_desc_sw128(ring_s + 4 * kBlkK * wg, 16, 1024)
          : wgmma_desc(ring_s + uint32_t(4096 * wg), kOp7Lbo, kOp7Sbo);
  const uint64_t v_desc0 =
      kSw ? wgmma_desc_sw128(ring_s + 4 * kBlkK * wg, kBlkK, 1024)
          : wgmma_desc(ring_s + uint32_t(4096 * wg), kOp7Sbo, kOp7Lbo);
  // Descriptor increments (bytes >> 4) of k-step kk (QK: q, k) and 16-key step ks (P·V).
  auto q_step = [](int kk) -> uint64_t {
    return kSw ? uint64_t(((kk >> 2) * kBlkQ + (kk & 3) * 32) >> 4) : uint64_t(16 * kk);
  };
  auto k_step = [](int kk) -> uint64_t {
    return kSw ? uint64_t(((kk >> 2) * kBlkK + (kk & 3) * 32) >> 4) : uint64_t(16 * kk);
  };
  auto v_step = [](int ks) -> uint64_t {
    return kSw ? uint64_t(ks * (2048 >> 4)) : uint64_t(ks * (2 * kOp7Sbo >> 4));
  };
  // S accumulators: written only by the QK wgmma (k-step 0 does not accumulate); the softmax
  // works on copies (sv).
  float sacc[kNA];
#pragma unroll
  for (int i = 0; i < kNA; ++i) sacc[i] = 0.f;
  for (int it = 0; it < n_tiles; ++it) {
    const int slot = it % kS;
    const uint64_t slot_off = uint64_t(slot * (Sh::kTileBytes >> 4));
    cp_async_wait<kS - 2>();   // this thread's pieces of tile it landed
    fence_proxy_async_smem();  // … and (with the Q stores) visible to wgmma
    __syncthreads();           // A: every thread's pieces of tile it; every warp done with it − 1
    // QK over this warpgroup's dims: 16 k-steps of 16 dims, on the tensor cores while this
    // thread issues its copies of tile it + kS − 1 (into the slot tile it − 1 used).
    wgmma_fence();
    if (diag != 2) {
#pragma unroll
      for (int kk = 0; kk < 16; ++kk)
        wg7_qk_step<kN>(sacc, q_desc + q_step(kk), k_desc0 + slot_off + k_step(kk), kk > 0);
    }
    wgmma_commit();
    issue(it + kS - 1, next_r);
    next_r = lookup(it + kS);
    wgmma_wait0();
    wgmma_fence_acc(sacc);
    // Exchange the partials: sx[w][i][thread] (consecutive threads, consecutive words).
#pragma unroll
    for (int i = 0; i < kNA; ++i) sx[(wg * kNA + i) * 128 + wt] = sacc[i];
    __syncthreads();  // B: both partials visible
    // This thread's keys 8j + 2·tq + e are bits 8j + e of vm.
    const uint64_t vm =
        (kN == 64 ? *reinterpret_cast<const uint64_t*>(valid_s[slot])
                  : uint64_t(*reinterpret_cast<const uint32_t*>(valid_s[slot]))) >> (2 * tq);
    // sacc[4j + 2r + e] = (head 16·wq + g + 8r, key 8j + 2·tq + e) → log2-unit logits.
    float sv[kNA];
#pragma unroll
    for (int i = 0; i < kNA; ++i) {
      const float v = (sacc[i] + sx[((wg ^ 1) * kNA + i) * 128 + wt]) * c2;
      sv[i] = (vm & (uint64_t(1) << (8 * (i >> 2) + (i & 1)))) ? v : -INFINITY;
    }
    float corr[2];
    uint32_t pa[kN / 16][4];  // P as the A fragments of the kN / 16 k-steps
    wg7_softmax_tile<kNA>(sv, m2, lsum, o, corr, pa);
    wgmma_fence_acc(o);  // the rescale of o stays before the fence …
    wgmma_fence();       // … which orders o and pa before the wgmma reads them
    if (diag != 2) {
#pragma unroll
      for (int ks = 0; ks < kN / 16; ++ks)  // keys 16ks … 16ks + 15
        wgmma_rs_m64n256k16_tb(o, pa[ks], v_desc0 + slot_off + v_step(ks));
    }
    wgmma_commit();
    wgmma_wait0();
    wgmma_fence_acc(o);
  }
  cp_async_wait<0>();  // only empty groups can remain
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    lsum[r] += __shfl_xor_sync(0xffffffffu, lsum[r], 1);
    lsum[r] += __shfl_xor_sync(0xffffffffu, lsum[r], 2);
  }
  constexpr float kLn2 = 0.6931471805599453f;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int h = hb + 16 * wq + g + 8 * r;
    if (h >= H) continue;
    const float m = m2[r] == -INFINITY ? -INFINITY : m2[r] * kLn2;  // nats
    const int d0 = 256 * wg + 2 * tq;
    if (n_splits == 1) {
      const float sink = a.sinks[h];
      const float M = fmaxf(m, sink);
      const float f = m == -INFINITY ? 0.f : __expf(m - M);  // no keys → sink only
      const float inv = f / (lsum[r] * f + __expf(sink - M));
      float* out = a.out + (t * H + h) * int64_t(kHd) + d0;
#pragma unroll
      for (int j = 0; j < 32; ++j)
        *reinterpret_cast<float2*>(out + 8 * j) =
            make_float2(o[4 * j + 2 * r] * inv, o[4 * j + 2 * r + 1] * inv);
    } else {
      float* pwo = ws + ((t * H + h) * n_splits + s) * int64_t(kHd + 2);
      if (wg == 0 && tq == 0) {
        pwo[0] = m;
        pwo[1] = lsum[r];
      }
#pragma unroll
      for (int j = 0; j < 32; ++j)
        *reinterpret_cast<float2*>(pwo + 2 + d0 + 8 * j) =
            make_float2(o[4 * j + 2 * r], o[4 * j + 2 * r + 1]);
    }
  }
}
