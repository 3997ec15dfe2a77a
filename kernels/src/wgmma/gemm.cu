//@ tensortune wgmma_gemm: the Hopper (sm_90a) matmul body. kernels::wgmma generates the header (the
//@ `cfg` constants, types, KERNEL_NAME, TT_CLUSTER_ATTR) and the `mma_tile` function that wraps the
//@ one wgmma instruction a config uses; this text is fixed. Lines starting with //@ never reach a
//@ generated source.
//@
//@ The GEMM is computed transposed: D is column-major M x N, i.e. row-major N x M, so the kernel
//@ works in a (P, Q) view with P = N (wgmma's M, accumulator rows) and Q = M (wgmma's N, accumulator
//@ columns). Each thread's accumulator pairs are then adjacent in D. Operand X (wgmma's A) is the
//@ user's B, operand Y (wgmma's B) the user's A; each is K-major or MN-major in shared memory as it is
//@ in global memory (TMA copies tiles as they are; wgmma's transpose bits read MN-major tiles).
//
// A block computes BP x BQ tiles of the (P, Q) view. Tiles of X and Y arrive by TMA into a ring of
// STAGES shared-memory stages with 128-byte swizzle, each stage completing on a `full` mbarrier;
// CONSUMERS warpgroups each own BP / CONSUMERS rows of the tile and multiply with wgmma straight
// from shared memory, keeping one group of wgmmas in flight, and free a stage on its `empty`
// mbarrier once the wgmmas that read it are done. With SPECIALIZED, a producer warpgroup (its
// registers given to the consumers with setmaxnreg) runs ahead through every tile of the block;
// otherwise thread 0 of the first consumer issues each load STAGES tiles ahead.
// With CLUSTER == 2, the two blocks of a cluster own vertically adjacent tiles that share Y: each
// loads half of Y and multicasts it to both, so a stage is free only when both blocks' consumers
// have released it. With PINGPONG the two consumers take alternate tiles of the block whole, so
// one stores its results while the other multiplies. With PERSISTENT the grid is one wave (of
// BLOCKS_PER_SM blocks per SM) and each block walks tiles; tiles are
// ordered in groups of GROUP cluster rows, so the Y panels a wave shares stay in L2.

namespace tt {
using namespace cfg;

// A CUtensorMap, opaque: cuda.h cannot be included under NVRTC.
struct __align__(64) TmaDesc {
  unsigned long long v[16];
};

constexpr int ROW_BYTES = 128;  // one K row of a stage: BK elements, the width of the swizzle
constexpr int X_STAGE = BP * ROW_BYTES;
constexpr int Y_STAGE = BQ * ROW_BYTES;
constexpr int STAGE_BYTES = X_STAGE + Y_STAGE;
constexpr int CHUNK_BYTES = BK * ROW_BYTES;  // one 64-wide MN column block of an MN-major tile
constexpr int WG_P = PINGPONG ? BP : BP / CONSUMERS;  // rows of a tile one consumer computes
constexpr int MT = WG_P / 64;                // wgmma row tiles per consumer
constexpr int KSTEP_BYTES = 32;              // K of one wgmma, in bytes of a K-major row
constexpr int KSTEPS = ROW_BYTES / KSTEP_BYTES;
constexpr int MN_KSTEP_BYTES = 16 * ROW_BYTES;  // the same K step in an MN-major tile: 16 K rows (16-bit types)
constexpr int KTILES = (K + BK - 1) / BK;
constexpr int CP = TILES_P / CLUSTER;  // cluster rows
constexpr int CLUSTER_TILES = CP * TILES_Q;
constexpr int THREADS = 128 * (CONSUMERS + (SPECIALIZED ? 1 : 0));
// Warpgroups that release each stage: every consumer (cooperative) or the tile's owner (ping-pong),
// in every block of the cluster.
constexpr int RELEASES = (PINGPONG ? 1 : CONSUMERS) * CLUSTER;
constexpr int Y_ROWS = BQ / CLUSTER;  // rows of Y (K-major) each block of a cluster loads
constexpr int Y_CHUNKS = BQ / 64 / CLUSTER;  // chunks of Y (MN-major) each block loads
static_assert(BK * (int)sizeof(T_IN) == ROW_BYTES, "a stage row is one 128-byte swizzle span");
static_assert(WG_P % 64 == 0, "a consumer owns whole 64-row wgmma tiles");

__device__ __forceinline__ unsigned smem_u32(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// --- mbarriers -------------------------------------------------------------------------------
__device__ __forceinline__ void bar_init(unsigned long long* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count));
}

__device__ __forceinline__ void bar_expect(unsigned long long* bar, int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes)
               : "memory");
}

// Waits until the phase of `bar` with parity `parity` has completed.
__device__ __forceinline__ void bar_wait(unsigned long long* bar, int parity) {
  const unsigned addr = smem_u32(bar);
  unsigned done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(addr), "r"(parity)
        : "memory");
  } while (!done);
}

// Arrives on `bar` in every block of the cluster (the same shared-memory offset in each).
__device__ __forceinline__ void bar_arrive_cluster(unsigned long long* bar) {
  if constexpr (CLUSTER == 1) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
  } else {
#pragma unroll
    for (int r = 0; r < CLUSTER; ++r) {
      asm volatile(
          "{\n.reg .b32 remote;\nmapa.shared::cluster.u32 remote, %0, %1;\n"
          "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [remote];\n}\n" ::"r"(smem_u32(bar)),
          "r"(r)
          : "memory");
    }
  }
}

// Ping-pong order between the two consumers (named barriers 1 and 2, both warpgroups counted):
// a consumer starts a tile's K loop only once the other has finished the K loop of the tile
// before. Without it the second consumer, whose first ring slot is a whole tile ahead, would wait
// on a full barrier several phases early, where the parity of its phase is still ambiguous.
__device__ __forceinline__ void order_wait(int cw) {
  if constexpr (PINGPONG) asm volatile("bar.sync %0, 256;\n" ::"r"(2 - cw) : "memory");
}
__device__ __forceinline__ void order_signal(int cw) {
  if constexpr (PINGPONG) asm volatile("bar.arrive %0, 256;\n" ::"r"(1 + cw) : "memory");
}

__device__ __forceinline__ void cluster_sync() {
  if constexpr (CLUSTER > 1) {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
  } else {
    __syncthreads();
  }
}

__device__ __forceinline__ unsigned cluster_rank() {
  if constexpr (CLUSTER == 1) {
    return 0;
  } else {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
  }
}

// --- TMA ---------------------------------------------------------------------------------------
// Copies the box at (c0, c1) (innermost first) of `map` into `dst`, completing on `bar`.
__device__ __forceinline__ void tma_load(void* dst, const TmaDesc* map, int c0, int c1, unsigned long long* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          smem_u32(dst)),
      "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(smem_u32(bar))
      : "memory");
}

// The same into `dst` and `bar` of every block of the cluster.
__device__ __forceinline__ void tma_load_multicast(void* dst, const TmaDesc* map, int c0, int c1,
                                                   unsigned long long* bar) {
  const unsigned short mask = (1u << CLUSTER) - 1;
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%2, "
      "%3}], [%4], %5;\n" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(smem_u32(bar)), "h"(mask)
      : "memory");
}

// --- wgmma -------------------------------------------------------------------------------------
// A shared-memory matrix descriptor for a 128-byte-swizzled tile at `addr` (1024-byte aligned
// swizzle atoms). K-major: rows of 128 bytes, 8-row groups SBO = 1024 apart (LBO unused).
// MN-major: 64-element columns blocks LBO = CHUNK_BYTES apart, 8-K-row groups SBO = 1024 apart.
__device__ __forceinline__ unsigned long long make_desc(unsigned addr, unsigned lbo) {
  return (unsigned long long)((addr & 0x3FFFF) >> 4) | ((unsigned long long)(lbo >> 4) << 16) |
         ((unsigned long long)(1024 >> 4) << 32) | (1ull << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// @hole(mma_tile)

// --- tiles -------------------------------------------------------------------------------------
// The (P, Q) tile of cluster tile `ct` for the block of cluster rank `rank`.
__device__ __forceinline__ void tile_of(int ct, int rank, int& tp, int& tq) {
  int pc;
  if constexpr (GROUP > 1) {
    const int per_group = GROUP * TILES_Q;
    const int first = (ct / per_group) * GROUP;
    const int rows = min(CP - first, GROUP);
    pc = first + (ct % per_group) % rows;
    tq = (ct % per_group) / rows;
  } else {
    pc = ct % CP;
    tq = ct / CP;
  }
  tp = pc * CLUSTER + rank;
}

// Where the loads of this block are: the next (cluster tile, K tile) and the ring slot it fills.
struct Loader {
  int ct, kt, stage, phase;
};

// Issues the loads of the loader's next K tile into its stage (waiting until the stage is free in
// every block of the cluster), then advances it. Called by one thread.
__device__ __forceinline__ void load_next(Loader& L, const TmaDesc* mapX, const TmaDesc* mapY, unsigned char* sX,
                                          unsigned char* sY, unsigned long long* full, unsigned long long* empty,
                                          int rank, int nclusters) {
  bar_wait(&empty[L.stage], L.phase ^ 1);
  unsigned long long* bar = &full[L.stage];
  bar_expect(bar, STAGE_BYTES);
  int tp, tq;
  tile_of(L.ct, rank, tp, tq);
  const int p0 = tp * BP, q0 = tq * BQ, k0 = L.kt * BK;
  unsigned char* x = sX + L.stage * X_STAGE;
  unsigned char* y = sY + L.stage * Y_STAGE;
  if constexpr (X_KMAJOR) {
    tma_load(x, mapX, k0, p0, bar);
  } else {
#pragma unroll
    for (int c = 0; c < BP / 64; ++c) tma_load(x + c * CHUNK_BYTES, mapX, p0 + 64 * c, k0, bar);
  }
  if constexpr (Y_KMAJOR) {
    const int r0 = rank * Y_ROWS;
    if constexpr (CLUSTER == 1) {
      tma_load(y, mapY, k0, q0, bar);
    } else {
      tma_load_multicast(y + r0 * ROW_BYTES, mapY, k0, q0 + r0, bar);
    }
  } else {
#pragma unroll
    for (int i = 0; i < Y_CHUNKS; ++i) {
      const int c = rank * Y_CHUNKS + i;
      if constexpr (CLUSTER == 1) {
        tma_load(y + c * CHUNK_BYTES, mapY, q0 + 64 * c, k0, bar);
      } else {
        tma_load_multicast(y + c * CHUNK_BYTES, mapY, q0 + 64 * c, k0, bar);
      }
    }
  }
  if (++L.kt == KTILES) {
    L.kt = 0;
    L.ct += nclusters;
  }
  if (++L.stage == STAGES) {
    L.stage = 0;
    L.phase ^= 1;
  }
}

// --- epilogue ----------------------------------------------------------------------------------
template <typename T> struct Pair;
template <> struct Pair<float> { typedef float2 type; };
template <> struct Pair<int> { typedef int2 type; };
template <> struct Pair<half> { typedef __half2 type; };
template <> struct Pair<__nv_bfloat16> { typedef __nv_bfloat162 type; };

__device__ __forceinline__ T_EPI epilogue(T_EPI acc, const T_OUT* __restrict__ C, size_t off) {
  if constexpr (READ_C) {
    return ALPHA * acc + BETA * to_epi(C[off]);
  } else {
    return ALPHA == (T_EPI)1 ? acc : ALPHA * acc;
  }
}

// Stores the two adjacent accumulators (v0, v1) of D at row p, columns q and q + 1.
__device__ __forceinline__ void store_pair(const T_OUT* __restrict__ C, T_OUT* __restrict__ D, int p, int q,
                                           T_EPI v0, T_EPI v1) {
  if (!EVEN_P && p >= P) return;
  const size_t off = (size_t)p * Q + q;
  if (PAIRS_ALIGNED && (EVEN_Q || q + 1 < Q)) {
    typename Pair<T_OUT>::type o;
    T_OUT* e = reinterpret_cast<T_OUT*>(&o);
    e[0] = from_epi<T_OUT>(epilogue(v0, C, off));
    e[1] = from_epi<T_OUT>(epilogue(v1, C, off + 1));
    *reinterpret_cast<typename Pair<T_OUT>::type*>(D + off) = o;
  } else {
    if (EVEN_Q || q < Q) D[off] = from_epi<T_OUT>(epilogue(v0, C, off));
    if (EVEN_Q || q + 1 < Q) D[off + 1] = from_epi<T_OUT>(epilogue(v1, C, off + 1));
  }
}

}  // namespace tt

extern "C" __global__ void __launch_bounds__(tt::THREADS, cfg::BLOCKS_PER_SM) TT_CLUSTER_ATTR
    KERNEL_NAME(const __grid_constant__ tt::TmaDesc mapX, const __grid_constant__ tt::TmaDesc mapY,
                const T_OUT* __restrict__ C, T_OUT* __restrict__ D) {
  using namespace tt;
  TT_FAULT_HOOK;
  extern __shared__ unsigned char smem_raw[];
  // Swizzle atoms must sit on 1024-byte boundaries; the launch asks for 1024 bytes of slack.
  unsigned char* smem =
      reinterpret_cast<unsigned char*>((reinterpret_cast<size_t>(smem_raw) + 1023) & ~static_cast<size_t>(1023));
  unsigned char* sX = smem;
  unsigned char* sY = smem + STAGES * X_STAGE;
  unsigned long long* full = reinterpret_cast<unsigned long long*>(sY + STAGES * Y_STAGE);
  unsigned long long* empty = full + STAGES;

  const int rank = (int)cluster_rank();
  const int nclusters = gridDim.x / CLUSTER;
  const int first_ct = blockIdx.x / CLUSTER;

  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {
      bar_init(&full[s], 1);
      bar_init(&empty[s], RELEASES);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  cluster_sync();

  const int wg = threadIdx.x / 128;
  Loader loader = {first_ct, 0, 0, 0};
  if constexpr (SPECIALIZED) {
    if (wg == 0) {
      asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(PRODUCER_REGS));
      if (threadIdx.x == 0) {
        while (loader.ct < CLUSTER_TILES) load_next(loader, &mapX, &mapY, sX, sY, full, empty, rank, nclusters);
      }
      // A block of a cluster stays until its peer is done: the peer still arrives on its barriers.
      if constexpr (CLUSTER > 1) cluster_sync();
      return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(CONSUMER_REGS));
  } else {
    if (threadIdx.x == 0) {
#pragma unroll 1
      for (int s = 0; s < STAGES && loader.ct < CLUSTER_TILES; ++s)
        load_next(loader, &mapX, &mapY, sX, sY, full, empty, rank, nclusters);
    }
  }

  const int cw = wg - (SPECIALIZED ? 1 : 0);  // consumer index
  const int lane = threadIdx.x % 32;
  const int warp = (threadIdx.x / 32) % 4;
  const bool issues = !SPECIALIZED && threadIdx.x == 0;
  T_ACCR acc[MT][ACC_REGS];
  // Ping-pong: consumer cw takes the block's tiles cw, cw + 2, ... and finds each one's stages at
  // its place in the ring (the producer fills the ring with every tile of the block in order).
  constexpr int TILE_STEP = PINGPONG ? CONSUMERS : 1;
  int local = PINGPONG ? cw : 0;  // the tile's index among this block's tiles
#pragma unroll 1
  for (int ct = first_ct + local * nclusters; ct < CLUSTER_TILES; ct += TILE_STEP * nclusters, local += TILE_STEP) {
    int tp, tq;
    tile_of(ct, rank, tp, tq);
    const long long ring = (long long)local * KTILES;
    int stage = (int)(ring % STAGES), phase = (int)((ring / STAGES) & 1);
    if (local > 0) order_wait(cw);
#pragma unroll
    for (int t = 0; t < MT; ++t) {
#pragma unroll
      for (int i = 0; i < ACC_REGS; ++i) acc[t][i] = 0;
    }
    int prev = 0;
#pragma unroll 1
    for (int kt = 0; kt < KTILES; ++kt) {
      bar_wait(&full[stage], phase);
      const unsigned x = smem_u32(sX + stage * X_STAGE);
      const unsigned y = smem_u32(sY + stage * Y_STAGE);
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < KSTEPS; ++ks) {
        const unsigned long long dy =
            Y_KMAJOR ? make_desc(y + ks * KSTEP_BYTES, 16) : make_desc(y + ks * MN_KSTEP_BYTES, CHUNK_BYTES);
#pragma unroll
        for (int t = 0; t < MT; ++t) {
          const int row_tile = (PINGPONG ? 0 : cw * MT) + t;
          const unsigned long long dx =
              X_KMAJOR ? make_desc(x + row_tile * 64 * ROW_BYTES + ks * KSTEP_BYTES, 16)
                       : make_desc(x + row_tile * CHUNK_BYTES + ks * MN_KSTEP_BYTES, CHUNK_BYTES);
          mma_tile(acc[t], dx, dy);
        }
      }
      wgmma_commit();
      wgmma_wait<1>();
      if (kt > 0) {
        if (threadIdx.x % 128 == 0) bar_arrive_cluster(&empty[prev]);
        if (issues && loader.ct < CLUSTER_TILES) load_next(loader, &mapX, &mapY, sX, sY, full, empty, rank, nclusters);
        __syncwarp();
      }
      prev = stage;
      if (++stage == STAGES) {
        stage = 0;
        phase ^= 1;
      }
    }
    order_signal(cw);
    wgmma_wait<0>();
    if (threadIdx.x % 128 == 0) bar_arrive_cluster(&empty[prev]);
    if (issues && loader.ct < CLUSTER_TILES) load_next(loader, &mapX, &mapY, sX, sY, full, empty, rank, nclusters);
    __syncwarp();

    // Accumulator layout of a 64 x BQ wgmma tile: warp w holds rows 16w + lane / 4 (+ 8), and each
    // thread holds columns 8j + 2 (lane % 4) (+ 1) of them, in registers [4j + 2h + e] (f32, s32)
    // or halves e of register [2j + h] (packed f16).
    const int p_base = tp * BP + (PINGPONG ? 0 : cw * WG_P) + warp * 16 + lane / 4;
    const int q_base = tq * BQ + 2 * (lane % 4);
#pragma unroll
    for (int t = 0; t < MT; ++t) {
#pragma unroll
      for (int j = 0; j < BQ / 8; ++j) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          T_EPI v0, v1;
          acc_pair(acc[t], j, h, v0, v1);
          store_pair(C, D, p_base + t * 64 + 8 * h, q_base + 8 * j, v0, v1);
        }
      }
    }
  }
  if constexpr (CLUSTER > 1) cluster_sync();
}
