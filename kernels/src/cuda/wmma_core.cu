//@ tensortune WMMA core: the block-level GEMM of the WMMA templates (wmma_gemm, wmma_conv2d), a
//@ template with named holes that kernels::cuda::fill_holes fills from a template's fills file
//@ (wmma_gemm.cu, wmma_conv2d.cu). Lines starting with //@ are notes on the template and never reach
//@ a generated source; a `// @hole(name)` line is replaced by the fill of that name (possibly no lines).
//@
//@ This text is wmma_gemm v6's kernel as verified on the GPU: with wmma_gemm's fills it must stay
//@ byte-identical (kernels/tests/gemm_unchanged.rs checks it). Changing it changes every wmma_gemm
//@ kernel: bump wmma_gemm's version and re-verify on a GPU.
//@
//@ Holes:
//@ - title: the first comment line(s): what the kernel computes.
//@ - load_stage: namespace-scope code in tt, after the tile constants, that provides what the K loop
//@   calls as load_stage(As, Bs, A, B, stage, kt, m0, n0): fill ring slot `stage` with A's and B's
//@   tiles of K tile `kt` for the output tile at (m0, n0), with cp.async where CP_ASYNC.
//@ - block_setup: statements in the kernel once the block's tile (m0, n0), split and warp roles are
//@   known, before the K loop; `smem` is the dynamic shared memory. A loader that keeps per-block
//@   state declares it here as a local object named load_stage, which the K loop's calls then find.
//@ - fragments: in compute_stage, the declarations of one K step's A fragments af[FRAGS_M] and B
//@   fragments bf[FRAGS_N] (their element type: T_IN, or wmma::precision::tf32 for f32 data).
//@ - fragment_fix: in compute_stage, statements between loading af/bf and the MMAs (TF32's
//@   rounding of the loaded floats), possibly none.
// @hole(title)
//
// One block computes a BM x BN tile of D over one split of K. Its warps form a
// WARPS_M x WARPS_N x WARPS_K grid: each (m, n) warp owns a WM x WN sub-tile held in
// FRAGS_M x FRAGS_N WMMA accumulators, and the WARPS_K warps that share it take alternate 16-deep
// steps of every K tile ("sliced K", for tiles too small to keep every warp busy otherwise).
// A and B stream through a ring of STAGES shared-memory buffers filled by cp.async; the tiles in
// shared memory keep the global contiguity (K-contiguous operands are stored [row][k], the others
// [k][row]) so every global load is one vector, and the WMMA fragment layout follows from it.
//
// The epilogue stages accumulators through shared memory (one slice per K-warp) so D is written
// in wide, coalesced vectors. With SPLIT_K > 1 the K splits of a tile meet in one of two ways:
//   REDUCE_CLUSTER (sm_90): the splits of a tile form a thread-block cluster; after a cluster
//     barrier each block sums a share of the tile straight from its peers' shared memory.
//   otherwise: each split writes its partial tile to the workspace and the last to arrive sums
//     them, then resets the tile's counter for the next launch.
// Both sum in split order, so results do not depend on scheduling.

namespace tt {
using namespace cfg;

constexpr int WM = BM / WARPS_M;
constexpr int WN = BN / WARPS_N;
constexpr int FRAGS_M = WM / FM;
constexpr int FRAGS_N = WN / FN;
constexpr int THREADS = WARPS_M * WARPS_N * WARPS_K * 32;
constexpr int TILES_M = (M + BM - 1) / BM;
constexpr int TILES_N = (N + BN - 1) / BN;
constexpr int KTILES = (K + BK - 1) / BK;
constexpr int KT_PER_SPLIT = (KTILES + SPLIT_K - 1) / SPLIT_K;
// Tiles that divide the matrix need no bounds checks on loads.
constexpr bool EVEN_M = M % BM == 0;
constexpr bool EVEN_N = N % BN == 0;
constexpr bool EVEN_K = K % BK == 0;

constexpr int A_ROWS = A_K_CONTIG ? BM : BK;
constexpr int A_COLS = A_K_CONTIG ? BK : BM;
constexpr int A_LD = A_COLS + SKEW;
constexpr int B_ROWS = B_K_CONTIG ? BN : BK;
constexpr int B_COLS = B_K_CONTIG ? BK : BN;
constexpr int B_LD = B_COLS + SKEW;
constexpr int A_STAGE = A_ROWS * A_LD;
constexpr int B_STAGE = B_ROWS * B_LD;
// Accumulator staging: per K-warp slice, column-major BM x BN, columns padded by 16 bytes.
constexpr int C_LD = BM + 16 / (int)sizeof(T_ACC);
constexpr int C_SLICE = BN * C_LD;
// Workspace split-K: one counter per output tile, then SPLIT_K dense partial tiles per tile.
constexpr int COUNTERS_BYTES = ((TILES_M * TILES_N * 4 + 255) / 256) * 256;
constexpr int VD = VEC_D / (int)sizeof(T_OUT);
constexpr int PER_COL = BM / VD;
constexpr int TILE_VECS = BN * PER_COL;

static_assert(BM % (WARPS_M * FM) == 0 && BN % (WARPS_N * FN) == 0 && BK % (FK * WARPS_K) == 0, "tile shape");
static_assert(STAGES >= 1 && (STAGES == 1 || CP_ASYNC), "multi-stage pipelines need cp.async");
static_assert(BM % VD == 0 && M % VD == 0, "epilogue vectors");
static_assert(!REDUCE_CLUSTER || (SPLIT_K > 1 && SPLIT_K <= 8), "cluster split-K takes 2 to 8 splits");

// @hole(load_stage)

typedef wmma::fragment<wmma::accumulator, FM, FN, FK, T_ACC> AccFrag;

// This warp's 16-deep steps of one K tile: wk, wk + WARPS_K, ...
__device__ __forceinline__ void compute_stage(const T_IN* as, const T_IN* bs, int wm0, int wn0, int wk,
                                              AccFrag (&acc)[FRAGS_M][FRAGS_N]) {
#pragma unroll
  for (int step = 0; step < BK / (FK * WARPS_K); ++step) {
    const int kk = (step * WARPS_K + wk) * FK;
// @hole(fragments)
#pragma unroll
    for (int i = 0; i < FRAGS_M; ++i) {
      const int mm = wm0 + i * FM;
      const T_IN* p = A_K_CONTIG ? as + mm * A_LD + kk : as + kk * A_LD + mm;
      wmma::load_matrix_sync(af[i], p, A_LD);
    }
#pragma unroll
    for (int j = 0; j < FRAGS_N; ++j) {
      const int nn = wn0 + j * FN;
      const T_IN* p = B_K_CONTIG ? bs + nn * B_LD + kk : bs + kk * B_LD + nn;
      wmma::load_matrix_sync(bf[j], p, B_LD);
    }
// @hole(fragment_fix)
#pragma unroll
    for (int i = 0; i < FRAGS_M; ++i) {
#pragma unroll
      for (int j = 0; j < FRAGS_N; ++j) {
        wmma::mma_sync(acc[i][j], af[i], bf[j], acc[i][j]);
      }
    }
  }
}

// Sum over the K-warp slices of VD staged accumulators at (m, n) of a block's staging area.
__device__ __forceinline__ void gather(const T_ACC* Cs, int n, int m, T_EPI (&a)[VD]) {
#pragma unroll
  for (int e = 0; e < VD; ++e) a[e] = to_epi(Cs[n * C_LD + m + e]);
#pragma unroll
  for (int s = 1; s < WARPS_K; ++s) {
#pragma unroll
    for (int e = 0; e < VD; ++e) a[e] += to_epi(Cs[s * C_SLICE + n * C_LD + m + e]);
  }
}

// Applies alpha/beta to VD accumulators and stores them at D(gm .. gm+VD, gn).
__device__ __forceinline__ void store_out(const T_OUT* __restrict__ C, T_OUT* __restrict__ D, int gm, int gn,
                                          T_EPI (&a)[VD]) {
  const size_t off = (size_t)gn * M + gm;
  OutVec<T_OUT, VD> o;
  if constexpr (READ_C) {
    OutVec<T_OUT, VD> c;
    c.v = *reinterpret_cast<const decltype(c.v)*>(C + off);
#pragma unroll
    for (int e = 0; e < VD; ++e) o.e[e] = from_epi<T_OUT>(ALPHA * a[e] + BETA * to_epi(c.e[e]));
  } else {
#pragma unroll
    for (int e = 0; e < VD; ++e) o.e[e] = from_epi<T_OUT>(ALPHA == (T_EPI)1 ? a[e] : ALPHA * a[e]);
  }
  *reinterpret_cast<decltype(o.v)*>(D + off) = o.v;
}

}  // namespace tt

extern "C" __global__ void __launch_bounds__(tt::THREADS, cfg::MIN_BLOCKS) TT_CLUSTER_ATTR
    KERNEL_NAME(const T_IN* __restrict__ A, const T_IN* __restrict__ B, const T_OUT* __restrict__ C,
                T_OUT* __restrict__ D, unsigned char* __restrict__ workspace) {
  using namespace tt;
  TT_FAULT_HOOK;
  extern __shared__ __align__(128) unsigned char smem[];
  T_IN* As = reinterpret_cast<T_IN*>(smem);
  T_IN* Bs = As + STAGES * A_STAGE;

  // Block -> output tile. With SWIZZLE > 1, groups of SWIZZLE row tiles sweep the columns together,
  // so the A panels they share stay in L2.
  int tm, tn;
  {
    const int pid = blockIdx.x;
    if constexpr (SWIZZLE > 1) {
      const int per_group = SWIZZLE * TILES_N;
      const int first_m = (pid / per_group) * SWIZZLE;
      const int rows = min(TILES_M - first_m, SWIZZLE);
      tm = first_m + (pid % per_group) % rows;
      tn = (pid % per_group) / rows;
    } else {
      tm = pid % TILES_M;
      tn = pid / TILES_M;
    }
  }
  const int m0 = tm * BM;
  const int n0 = tn * BN;
  const int split = blockIdx.z;
  const int kt0 = split * KT_PER_SPLIT;
  const int nk = min(KTILES - kt0, KT_PER_SPLIT);

  const int warp = threadIdx.x / 32;
  const int wk = warp / (WARPS_M * WARPS_N);
  const int wmn = warp % (WARPS_M * WARPS_N);
  const int wm0 = (wmn % WARPS_M) * WM;
  const int wn0 = (wmn / WARPS_M) * WN;
// @hole(block_setup)

  AccFrag acc[FRAGS_M][FRAGS_N];
#pragma unroll
  for (int i = 0; i < FRAGS_M; ++i) {
#pragma unroll
    for (int j = 0; j < FRAGS_N; ++j) {
#pragma unroll
      for (int t = 0; t < acc[i][j].num_elements; ++t) acc[i][j].x[t] = opaque_zero<T_ACC>();
    }
  }

  if constexpr (STAGES == 1) {
    for (int i = 0; i < nk; ++i) {
      load_stage(As, Bs, A, B, 0, kt0 + i, m0, n0);
      cp_async_commit<CP_ASYNC>();
      cp_async_wait<0, CP_ASYNC>();
      __syncthreads();
      compute_stage(As, Bs, wm0, wn0, wk, acc);
      __syncthreads();
    }
  } else {
    // Prologue: STAGES - 1 tiles in flight before the first compute.
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s < nk) load_stage(As, Bs, A, B, s, kt0 + s, m0, n0);
      cp_async_commit<CP_ASYNC>();
    }
    for (int i = 0; i < nk; ++i) {
      // Tile i has landed once at most STAGES - 2 newer groups are pending; the barrier also
      // tells every warp that the buffer computed in iteration i - 1 may be overwritten.
      cp_async_wait<STAGES - 2, CP_ASYNC>();
      __syncthreads();
      const int next = i + STAGES - 1;
      if (next < nk) load_stage(As, Bs, A, B, next % STAGES, kt0 + next, m0, n0);
      cp_async_commit<CP_ASYNC>();
      const int stage = i % STAGES;
      compute_stage(As + stage * A_STAGE, Bs + stage * B_STAGE, wm0, wn0, wk, acc);
    }
  }
  cp_async_wait<0, CP_ASYNC>();
  __syncthreads();

  // Stage the accumulators in shared memory (the pipeline buffers are free now).
  T_ACC* Cs = reinterpret_cast<T_ACC*>(smem);
#pragma unroll
  for (int i = 0; i < FRAGS_M; ++i) {
#pragma unroll
    for (int j = 0; j < FRAGS_N; ++j) {
      wmma::store_matrix_sync(Cs + wk * C_SLICE + (wn0 + j * FN) * C_LD + (wm0 + i * FM), acc[i][j], C_LD,
                              wmma::mem_col_major);
    }
  }

  if constexpr (SPLIT_K == 1) {
    __syncthreads();
    for (int v = threadIdx.x; v < TILE_VECS; v += THREADS) {
      const int n = v / PER_COL;
      const int m = (v % PER_COL) * VD;
      const int gm = m0 + m;
      const int gn = n0 + n;
      if (gm < M && gn < N) {
        T_EPI a[VD];
        gather(Cs, n, m, a);
        store_out(C, D, gm, gn, a);
      }
    }
  } else if constexpr (REDUCE_CLUSTER) {
#if __CUDA_ARCH__ >= 900
    // Every block of the cluster has staged its tile once all have arrived; each then sums a
    // share of the vectors from every peer's shared memory, in split order.
    __cluster_barrier_arrive();
    __cluster_barrier_wait();
    constexpr int SHARE = (TILE_VECS + SPLIT_K - 1) / SPLIT_K;
    const int first = split * SHARE;
    const int last = min(TILE_VECS, first + SHARE);
    for (int v = first + (int)threadIdx.x; v < last; v += THREADS) {
      const int n = v / PER_COL;
      const int m = (v % PER_COL) * VD;
      const int gm = m0 + m;
      const int gn = n0 + n;
      if (gm < M && gn < N) {
        T_EPI a[VD];
#pragma unroll
        for (int e = 0; e < VD; ++e) a[e] = (T_EPI)0;
#pragma unroll
        for (int s = 0; s < SPLIT_K; ++s) {
          const T_ACC* peer = static_cast<const T_ACC*>(__cluster_map_shared_rank(Cs, (unsigned)s));
          T_EPI p[VD];
          gather(peer, n, m, p);
#pragma unroll
          for (int e = 0; e < VD; ++e) a[e] += p[e];
        }
        store_out(C, D, gm, gn, a);
      }
    }
    // No block may leave (and release its shared memory) while a peer still reads it.
    __cluster_barrier_arrive();
    __cluster_barrier_wait();
#else
    static_assert(!REDUCE_CLUSTER, "cluster split-K needs sm_90");
#endif
  } else {
    __syncthreads();
    const int tile = tm + tn * TILES_M;
    T_EPI* parts = reinterpret_cast<T_EPI*>(workspace + COUNTERS_BYTES);
    T_EPI* mine = parts + ((size_t)tile * SPLIT_K + split) * (BM * BN);
    for (int v = threadIdx.x; v < TILE_VECS; v += THREADS) {
      const int n = v / PER_COL;
      const int m = (v % PER_COL) * VD;
      T_EPI a[VD];
      gather(Cs, n, m, a);
#pragma unroll
      for (int e = 0; e < VD; ++e) mine[n * BM + m + e] = a[e];
    }
    __threadfence();
    __syncthreads();
    __shared__ int s_last;
    unsigned* counters = reinterpret_cast<unsigned*>(workspace);
    if (threadIdx.x == 0) s_last = atomicAdd(&counters[tile], 1u) == (unsigned)(SPLIT_K - 1);
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    for (int v = threadIdx.x; v < TILE_VECS; v += THREADS) {
      const int n = v / PER_COL;
      const int m = (v % PER_COL) * VD;
      const int gm = m0 + m;
      const int gn = n0 + n;
      if (gm < M && gn < N) {
        T_EPI a[VD];
#pragma unroll
        for (int e = 0; e < VD; ++e) a[e] = (T_EPI)0;
        for (int s = 0; s < SPLIT_K; ++s) {
          const T_EPI* p = parts + ((size_t)tile * SPLIT_K + s) * (BM * BN) + n * BM + m;
#pragma unroll
          for (int e = 0; e < VD; ++e) a[e] += load_cg(p + e);
        }
        store_out(C, D, gm, gn, a);
      }
    }
    if (threadIdx.x == 0) counters[tile] = 0;
  }
}
