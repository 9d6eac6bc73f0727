// Key-row gather probe for the decode attention kernels (issue 7; bench only, never run by the
// engine). Included by attention_dec.cu inside its anonymous namespace after
// attention_dec_ws.cuh (it uses op7_off, the mbarrier helpers and cp_async16_sa); the launcher is
// attention_gather_probe (attention_dec.h).
//
// Question (docs/cuda.md §Variants 11 … 13): variant 11's load chain alone reaches ~2.9 TB/s for
// random 1 KiB bf16 rows copied by the LSU (cp.async, 16 bytes a lane). Would the TMA engine
// carry the gather faster? The probe runs variant 11's ring without any math: warpgroup 1 copies
// 64-key tiles (64 KiB) into kStages slots, warpgroup 0 waits for each slot and hands it back
// (optionally hashing its bytes, to check that every mode puts the same values at the same
// logical places), one CTA per SM over a list of random pool rows. Modes:
//   0  cp.async 16 B per lane into the 128-byte-swizzle operand layout (variant 11's copies);
//   1  TMA 2-D boxes of 64 dims × 1 row (128 B) into the same layout, 8 per key row, 256-byte
//      L2 promotion;
//   2  as 1 without L2 promotion;
//   3  one bulk copy (cp.async.bulk, no tensor map) of each whole 1 KiB row, contiguous (not an
//      MMA operand layout: the ceiling of a row-granular async copy);
//   4  TMA 3-D box of one whole row (8 × 128-byte lines, contiguous, 128-byte swizzle).

constexpr int kGpKeys = 64, kGpTileBytes = kGpKeys * kHd * 2;

template <int kMode, int kStages>
__global__ void __launch_bounds__(256, 1)
    attn_gather_probe_kernel(const __nv_bfloat16* __restrict__ pool,
                             const int32_t* __restrict__ rows, int64_t n_tiles,
                             const __grid_constant__ CUtensorMap map, uint32_t* __restrict__ sink,
                             int check) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
  const unsigned char* const smem = smem_raw + (base - smem_addr(smem_raw));
  const uint32_t full0 = base + uint32_t(kStages * kGpTileBytes), empty0 = full0 + 8 * kStages;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  constexpr bool kCpAsync = kMode == 0;
  if (tid == 0) {
    for (int i = 0; i < kStages; ++i) {
      mbar_init(full0 + 8 * i, kCpAsync ? 256 : 128);  // mode 0: as variant 11
      mbar_init(empty0 + 8 * i, 128);
    }
    fence_mbarrier_init();
  }
  __syncthreads();
  const int64_t n_my = (n_tiles - blockIdx.x + gridDim.x - 1) / gridDim.x;
  if (tid >= 128) {  // warpgroup 1: the copies
    const int p = tid - 128;
    for (int64_t k = 0; k < n_my; ++k) {
      const int slot = int(k % kStages);
      const int64_t tile = blockIdx.x + k * gridDim.x;
      if (k >= kStages) mbar_wait(empty0 + 8 * slot, uint32_t((k / kStages - 1) & 1));
      const uint32_t dst = base + uint32_t(slot * kGpTileBytes), full = full0 + 8 * slot;
      const int32_t* trow = rows + tile * kGpKeys;
      if constexpr (kMode == 0) {
        const int pw = warp & 3, kl = lane & 7, sub = lane >> 3;
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          const int key = 8 * (pw + 4 * q) + kl;
          const unsigned char* src =
              reinterpret_cast<const unsigned char*>(pool + int64_t(trow[key]) * kHd) + 16 * sub;
#pragma unroll
          for (int i = 0; i < 16; ++i)
            cp_async16_sa(dst + op7_off<true, kGpKeys>(key, sub + 4 * i), src + 64 * i, 16);
        }
        mbar_arrive_cp_async(full);
        mbar_arrive(full);
      } else if constexpr (kMode == 1 || kMode == 2) {
        const int key = p >> 1, b0 = 4 * (p & 1);
        const int row = trow[key];
        mbar_arrive_expect_tx(full, 4 * 128);
#pragma unroll
        for (int b = b0; b < b0 + 4; ++b)
          tma_load_2d(dst + uint32_t(b * kGpKeys * 128 + key * 128), &map, 64 * b, row, full);
      } else {
        if (p < kGpKeys) {
          const int row = trow[p];
          mbar_arrive_expect_tx(full, kHd * 2);
          if constexpr (kMode == 3)
            bulk_g2s(dst + uint32_t(p * kHd * 2), pool + int64_t(row) * kHd, kHd * 2, full);
          else
            tma_load_3d(dst + uint32_t(p * kHd * 2), &map, 0, 0, row, full);
        } else {
          mbar_arrive(full);
        }
      }
    }
  } else {  // warpgroup 0: takes each tile and hands the slot back
    uint32_t h = 0;
    for (int64_t k = 0; k < n_my; ++k) {
      const int slot = int(k % kStages);
      const int64_t tile = blockIdx.x + k * gridDim.x;
      mbar_wait(full0 + 8 * slot, uint32_t((k / kStages) & 1));
      if (check) {
        const unsigned char* t = smem + size_t(slot) * kGpTileBytes;
        for (int j = 0; j < kGpKeys * 64 / 128; ++j) {
          const int idx = tid + 128 * j, key = idx >> 6, c = idx & 63;
          uint32_t off;
          if constexpr (kMode <= 2)
            off = op7_off<true, kGpKeys>(key, c);
          else if constexpr (kMode == 3)
            off = uint32_t(key * kHd * 2 + c * 16);
          else
            off = uint32_t(key * kHd * 2 + (c >> 3) * 128 + (((c & 7) ^ (c >> 3)) << 4));
          const uint4 v = *reinterpret_cast<const uint4*>(t + off);
          h += (v.x + 3u * v.y + 5u * v.z + 7u * v.w) *
               uint32_t(2 * ((tile * kGpKeys + key) * 64 + c) + 1);
        }
      }
      if constexpr (!kCpAsync) fence_proxy_async_smem();  // generic reads before async writes
      mbar_arrive(empty0 + 8 * slot);
    }
    if (check) atomicAdd(sink, h);
  }
}
