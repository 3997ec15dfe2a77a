// tensortune wmma_gemm: D = alpha * op(A) * op(B) + beta * C, C and D column-major M x N.
//
// One block computes a BM x BN tile of D over one split of K; its WARPS_M x WARPS_N warps each own
// a WM x WN sub-tile held in FRAGS_M x FRAGS_N WMMA accumulators. A and B stream through a ring
// of STAGES shared-memory buffers filled by cp.async; the tiles in shared memory keep the global
// contiguity (K-contiguous operands are stored [row][k], the others [k][row]) so every global load
// is one vector, and the WMMA fragment layout follows from it. The epilogue stages accumulators
// through shared memory so D is written in wide, coalesced vectors; with SPLIT_K > 1 each split
// writes its partial tile to the workspace and the last split to arrive sums them in split order
// (deterministic) and resets the tile's counter for the next launch.

namespace tt {
using namespace cfg;

constexpr int WM = BM / WARPS_M;
constexpr int WN = BN / WARPS_N;
constexpr int FRAGS_M = WM / FM;
constexpr int FRAGS_N = WN / FN;
constexpr int THREADS = WARPS_M * WARPS_N * 32;
constexpr int TILES_M = (M + BM - 1) / BM;
constexpr int TILES_N = (N + BN - 1) / BN;
constexpr int KTILES = (K + BK - 1) / BK;
constexpr int KT_PER_SPLIT = (KTILES + SPLIT_K - 1) / SPLIT_K;

constexpr int A_ROWS = A_K_CONTIG ? BM : BK;
constexpr int A_COLS = A_K_CONTIG ? BK : BM;
constexpr int A_LD = A_COLS + SKEW;
constexpr int B_ROWS = B_K_CONTIG ? BN : BK;
constexpr int B_COLS = B_K_CONTIG ? BK : BN;
constexpr int B_LD = B_COLS + SKEW;
constexpr int A_STAGE = A_ROWS * A_LD;
constexpr int B_STAGE = B_ROWS * B_LD;
// Accumulator staging: column-major BM x BN, each column padded by 16 bytes against bank conflicts.
constexpr int C_LD = BM + 16 / (int)sizeof(T_ACC);
// Split-K scratch: one counter per output tile, then SPLIT_K dense partial tiles per output tile.
constexpr int COUNTERS_BYTES = ((TILES_M * TILES_N * 4 + 255) / 256) * 256;
constexpr int VD = VEC_D / (int)sizeof(T_OUT);

static_assert(BM % (WARPS_M * FM) == 0 && BN % (WARPS_N * FN) == 0 && BK % FK == 0, "tile shape");
static_assert(STAGES >= 1 && (STAGES == 1 || CP_ASYNC), "multi-stage pipelines need cp.async");
static_assert(BM % VD == 0 && M % VD == 0, "epilogue vectors");

__device__ __forceinline__ void load_stage(T_IN* As, T_IN* Bs, const T_IN* __restrict__ A, const T_IN* __restrict__ B,
                                           int stage, int kt, int m0, int n0) {
  const int k0 = kt * BK;
  T_IN* as = As + stage * A_STAGE;
  T_IN* bs = Bs + stage * B_STAGE;
  if constexpr (A_K_CONTIG) {
    load_tile<T_IN, A_ROWS, A_COLS, A_LD, VEC_A, THREADS, CP_ASYNC>(as, A, K, m0, k0, M, K);
  } else {
    load_tile<T_IN, A_ROWS, A_COLS, A_LD, VEC_A, THREADS, CP_ASYNC>(as, A, M, k0, m0, K, M);
  }
  if constexpr (B_K_CONTIG) {
    load_tile<T_IN, B_ROWS, B_COLS, B_LD, VEC_B, THREADS, CP_ASYNC>(bs, B, K, n0, k0, N, K);
  } else {
    load_tile<T_IN, B_ROWS, B_COLS, B_LD, VEC_B, THREADS, CP_ASYNC>(bs, B, N, k0, n0, K, N);
  }
}

typedef wmma::fragment<wmma::accumulator, FM, FN, FK, T_ACC> AccFrag;

__device__ __forceinline__ void compute_stage(const T_IN* as, const T_IN* bs, int wm0, int wn0,
                                              AccFrag (&acc)[FRAGS_M][FRAGS_N]) {
#pragma unroll
  for (int kk = 0; kk < BK; kk += FK) {
    wmma::fragment<wmma::matrix_a, FM, FN, FK, T_IN, A_FRAG_LAYOUT> af[FRAGS_M];
    wmma::fragment<wmma::matrix_b, FM, FN, FK, T_IN, B_FRAG_LAYOUT> bf[FRAGS_N];
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
#pragma unroll
    for (int i = 0; i < FRAGS_M; ++i) {
#pragma unroll
      for (int j = 0; j < FRAGS_N; ++j) {
        wmma::mma_sync(acc[i][j], af[i], bf[j], acc[i][j]);
      }
    }
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

extern "C" __global__ void __launch_bounds__(tt::THREADS, 1)
    KERNEL_NAME(const T_IN* __restrict__ A, const T_IN* __restrict__ B, const T_OUT* __restrict__ C,
                T_OUT* __restrict__ D, unsigned char* __restrict__ workspace) {
  using namespace tt;
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
  const int wm0 = (warp % WARPS_M) * WM;
  const int wn0 = (warp / WARPS_M) * WN;

  AccFrag acc[FRAGS_M][FRAGS_N];
#pragma unroll
  for (int i = 0; i < FRAGS_M; ++i) {
#pragma unroll
    for (int j = 0; j < FRAGS_N; ++j) wmma::fill_fragment(acc[i][j], static_cast<T_ACC>(0.0f));
  }

  if constexpr (STAGES == 1) {
    for (int i = 0; i < nk; ++i) {
      load_stage(As, Bs, A, B, 0, kt0 + i, m0, n0);
      cp_async_commit<CP_ASYNC>();
      cp_async_wait<0, CP_ASYNC>();
      __syncthreads();
      compute_stage(As, Bs, wm0, wn0, acc);
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
      compute_stage(As + stage * A_STAGE, Bs + stage * B_STAGE, wm0, wn0, acc);
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
      wmma::store_matrix_sync(Cs + (wn0 + j * FN) * C_LD + (wm0 + i * FM), acc[i][j], C_LD, wmma::mem_col_major);
    }
  }
  __syncthreads();

  constexpr int PER_COL = BM / VD;
  constexpr int TOTAL = BN * PER_COL;
  if constexpr (SPLIT_K == 1) {
    for (int v = threadIdx.x; v < TOTAL; v += THREADS) {
      const int n = v / PER_COL;
      const int m = (v % PER_COL) * VD;
      const int gm = m0 + m;
      const int gn = n0 + n;
      if (gm < M && gn < N) {
        T_EPI a[VD];
#pragma unroll
        for (int e = 0; e < VD; ++e) a[e] = to_epi(Cs[n * C_LD + m + e]);
        store_out(C, D, gm, gn, a);
      }
    }
  } else {
    const int tile = tm + tn * TILES_M;
    T_ACC* parts = reinterpret_cast<T_ACC*>(workspace + COUNTERS_BYTES);
    T_ACC* mine = parts + ((size_t)tile * SPLIT_K + split) * (BM * BN);
    constexpr int CH = 16 / (int)sizeof(T_ACC);
    for (int v = threadIdx.x; v < BN * BM / CH; v += THREADS) {
      const int n = v / (BM / CH);
      const int m = (v % (BM / CH)) * CH;
      *reinterpret_cast<uint4*>(mine + n * BM + m) = *reinterpret_cast<const uint4*>(Cs + n * C_LD + m);
    }
    __threadfence();
    __syncthreads();
    __shared__ int s_last;
    unsigned* counters = reinterpret_cast<unsigned*>(workspace);
    if (threadIdx.x == 0) s_last = atomicAdd(&counters[tile], 1u) == (unsigned)(SPLIT_K - 1);
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    for (int v = threadIdx.x; v < TOTAL; v += THREADS) {
      const int n = v / PER_COL;
      const int m = (v % PER_COL) * VD;
      const int gm = m0 + m;
      const int gn = n0 + n;
      if (gm < M && gn < N) {
        T_EPI a[VD];
#pragma unroll
        for (int e = 0; e < VD; ++e) a[e] = (T_EPI)0;
        for (int s = 0; s < SPLIT_K; ++s) {
          const T_ACC* p = parts + ((size_t)tile * SPLIT_K + s) * (BM * BN) + n * BM + m;
#pragma unroll
          for (int e = 0; e < VD; ++e) a[e] += to_epi(load_cg(p + e));
        }
        store_out(C, D, gm, gn, a);
      }
    }
    if (threadIdx.x == 0) counters[tile] = 0;
  }
}
