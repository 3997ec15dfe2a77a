// tensortune simt_gemm: D = alpha * op(A) * op(B) + beta * C in exact f32 on the CUDA cores (no
// tensor cores, no TF32), C and D column-major M x N. The body of simt_gemm and simt_conv2d: the
// hole `load_b` says where B's vectors come from (simt_gemm: a dense matrix, `simt_dense.cu`;
// simt_conv2d: the im2col view of an NHWC input, `simt_conv2d.cu`).
//
// One block computes a BM x BN tile of D over one split of K. Its THREADS_M x THREADS_N threads
// each own TM x TN accumulators in registers. With VT = 1 a thread's rows are TM consecutive
// ones; with VT = 2 ("virtual threads") they are two runs of TM / 2, half a tile apart (the same
// for columns), so neighbouring threads read neighbouring 16-byte vectors of shared memory and
// write neighbouring vectors of D.
//
// Which thread owns which thread tile: with WARP_TM = 0 threads are numbered along M across the
// whole block (tx = tid % THREADS_M), so a warp spans up to 32 thread tiles along M and reads as
// many distinct A vectors per k. With WARP_TM x WARP_TN = 32 a warp's lanes form a WARP_TM x
// WARP_TN grid of thread tiles and the warps tile the block, so a warp reads WARP_TM distinct A
// vectors and WARP_TN distinct B vectors per k (the rest are broadcasts): fewer shared-memory
// wavefronts per multiply-add.
//
// A and B move through shared memory BK deep per step, stored K-major ([k][m] and [k][n]) so a
// thread reads its TM + TN operands of one k as vectors. An operand stored K-contiguous in global
// memory is transposed on the way in (its rows padded by PAD floats against bank conflicts).
// Global loads are VEC floats wide. With DOUBLE_BUFFER the next step's tiles are loaded into
// registers while the current one is computed, then stored into the other half of a two-step
// ring: one barrier per step. Without it the next step's loads are still issued before the
// current step's multiply-adds (into the same registers), so their latency hides behind them.
// MIN_BLOCKS goes to __launch_bounds__: 2 holds ptxas to the registers that let two blocks share
// an SM.
//
// With SPLIT_K > 1 each split writes its partial tile to the workspace and the last split to
// arrive sums them in split order (results do not depend on scheduling), then resets the tile's
// counter for the next launch.

namespace tt {
using namespace cfg;

constexpr int THREADS_M = BM / TM;
constexpr int THREADS_N = BN / TN;
constexpr int THREADS = THREADS_M * THREADS_N;
constexpr int SUB_M = TM / VT;
constexpr int SUB_N = TN / VT;
constexpr int TILES_M = (M + BM - 1) / BM;
constexpr int TILES_N = (N + BN - 1) / BN;
constexpr int KTILES = (K + BK - 1) / BK;
constexpr int KT_PER_SPLIT = (KTILES + SPLIT_K - 1) / SPLIT_K;
constexpr int AS_LD = BM + A_PAD;
constexpr int BS_LD = BN + B_PAD;
constexpr int A_STAGE = BK * AS_LD;
constexpr int B_STAGE = BK * BS_LD;
// Global vectors of one step's tiles, and how many each thread moves.
constexpr int A_VECS = BM * BK / VEC;
constexpr int B_VECS = BN * BK / VEC;
constexpr int A_ITERS = (A_VECS + THREADS - 1) / THREADS;
constexpr int B_ITERS = (B_VECS + THREADS - 1) / THREADS;
constexpr int COUNTERS_BYTES = ((TILES_M * TILES_N * 4 + 255) / 256) * 256;
// Tiles that divide the matrix need no bounds checks (the shape is compiled in).
constexpr bool EVEN_M = M % BM == 0;
constexpr bool EVEN_N = N % BN == 0;
constexpr bool EVEN_K = K % BK == 0;
constexpr bool WARP_TILED = WARP_TM > 0;
constexpr int WARPS_M = WARP_TILED ? THREADS_M / WARP_TM : 1;

static_assert(BM % TM == 0 && BN % TN == 0 && TM % VT == 0 && TN % VT == 0, "thread tile");
static_assert(SUB_M % VS_A == 0 && SUB_N % VS_B == 0 && SUB_M % VD == 0, "vector widths");
static_assert((A_K_CONTIG ? K : M) % VEC == 0 && (B_K_CONTIG ? K : N) % VEC == 0, "global vectors");
static_assert(!WARP_TILED || (WARP_TM * WARP_TN == 32 && THREADS_M % WARP_TM == 0 && THREADS_N % WARP_TN == 0),
              "warp tile");

union FVec {
  typename vec_t<VEC * 4>::type v;
  float e[VEC];
};

template <int W>
union SVec {
  typename vec_t<W * 4>::type v;
  float e[W];
};

// load_b(B, gn, gk, v): reads B's VEC floats from (gk, gn) on into v, which holds zeros, for gn < N
// and gk < K (the caller checks); a loader may leave zeros where its operand has none.
// @hole(load_b)

// Reads step kt's A and B vectors into registers (zeros outside the matrices).
__device__ __forceinline__ void load_global(const float* __restrict__ A, const float* __restrict__ B, int kt, int m0,
                                            int n0, FVec (&ra)[A_ITERS], FVec (&rb)[B_ITERS]) {
  const int k0 = kt * BK;
#pragma unroll
  for (int it = 0; it < A_ITERS; ++it) {
    const int v = it * THREADS + (int)threadIdx.x;
    FVec x;
    x.v = {};
    if (A_VECS % THREADS == 0 || v < A_VECS) {
      // K-contiguous A: BM rows of BK; otherwise BK rows of BM.
      constexpr int PER_ROW = (A_K_CONTIG ? BK : BM) / VEC;
      const int r = v / PER_ROW;
      const int c = (v % PER_ROW) * VEC;
      const int gm = m0 + (A_K_CONTIG ? r : c);
      const int gk = k0 + (A_K_CONTIG ? c : r);
      if ((EVEN_M || gm < M) && (EVEN_K || gk < K)) {
        x.v = *reinterpret_cast<const decltype(x.v)*>(A + (A_K_CONTIG ? (size_t)gm * K + gk : (size_t)gk * M + gm));
      }
    }
    ra[it] = x;
  }
#pragma unroll
  for (int it = 0; it < B_ITERS; ++it) {
    const int v = it * THREADS + (int)threadIdx.x;
    FVec x;
    x.v = {};
    if (B_VECS % THREADS == 0 || v < B_VECS) {
      constexpr int PER_ROW = (B_K_CONTIG ? BK : BN) / VEC;
      const int r = v / PER_ROW;
      const int c = (v % PER_ROW) * VEC;
      const int gn = n0 + (B_K_CONTIG ? r : c);
      const int gk = k0 + (B_K_CONTIG ? c : r);
      if ((EVEN_N || gn < N) && (EVEN_K || gk < K)) load_b(B, gn, gk, x.v);
    }
    rb[it] = x;
  }
}

// Stores the registers of load_global into one K-major slot of the ring.
__device__ __forceinline__ void store_shared(float* as, float* bs, const FVec (&ra)[A_ITERS],
                                             const FVec (&rb)[B_ITERS]) {
#pragma unroll
  for (int it = 0; it < A_ITERS; ++it) {
    const int v = it * THREADS + (int)threadIdx.x;
    if (A_VECS % THREADS == 0 || v < A_VECS) {
      constexpr int PER_ROW = (A_K_CONTIG ? BK : BM) / VEC;
      const int r = v / PER_ROW;
      const int c = (v % PER_ROW) * VEC;
      if constexpr (A_K_CONTIG) {
#pragma unroll
        for (int e = 0; e < VEC; ++e) as[(c + e) * AS_LD + r] = ra[it].e[e];
      } else {
        *reinterpret_cast<decltype(ra[it].v)*>(as + r * AS_LD + c) = ra[it].v;
      }
    }
  }
#pragma unroll
  for (int it = 0; it < B_ITERS; ++it) {
    const int v = it * THREADS + (int)threadIdx.x;
    if (B_VECS % THREADS == 0 || v < B_VECS) {
      constexpr int PER_ROW = (B_K_CONTIG ? BK : BN) / VEC;
      const int r = v / PER_ROW;
      const int c = (v % PER_ROW) * VEC;
      if constexpr (B_K_CONTIG) {
#pragma unroll
        for (int e = 0; e < VEC; ++e) bs[(c + e) * BS_LD + r] = rb[it].e[e];
      } else {
        *reinterpret_cast<decltype(rb[it].v)*>(bs + r * BS_LD + c) = rb[it].v;
      }
    }
  }
}

// One step: BK rank-1 updates of the thread's TM x TN accumulators.
__device__ __forceinline__ void compute_step(const float* as, const float* bs, int tx, int ty,
                                             float (&acc)[TM][TN]) {
#pragma unroll
  for (int kk = 0; kk < BK; ++kk) {
    float a[TM];
    float b[TN];
#pragma unroll
    for (int v = 0; v < VT; ++v) {
#pragma unroll
      for (int i = 0; i < SUB_M; i += VS_A) {
        SVec<VS_A> x;
        x.v = *reinterpret_cast<const decltype(x.v)*>(as + kk * AS_LD + v * (BM / VT) + tx * SUB_M + i);
#pragma unroll
        for (int e = 0; e < VS_A; ++e) a[v * SUB_M + i + e] = x.e[e];
      }
#pragma unroll
      for (int j = 0; j < SUB_N; j += VS_B) {
        SVec<VS_B> x;
        x.v = *reinterpret_cast<const decltype(x.v)*>(bs + kk * BS_LD + v * (BN / VT) + ty * SUB_N + j);
#pragma unroll
        for (int e = 0; e < VS_B; ++e) b[v * SUB_N + j + e] = x.e[e];
      }
    }
#pragma unroll
    for (int i = 0; i < TM; ++i) {
#pragma unroll
      for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
  }
}

// The thread tile (tx, ty) of this thread in the THREADS_M x THREADS_N grid.
__device__ __forceinline__ int2 thread_tile() {
  const int tid = (int)threadIdx.x;
  if constexpr (WARP_TILED) {
    const int lane = tid % 32;
    const int warp = tid / 32;
    return make_int2((warp % WARPS_M) * WARP_TM + lane % WARP_TM, (warp / WARPS_M) * WARP_TN + lane / WARP_TM);
  } else {
    return make_int2(tid % THREADS_M, tid / THREADS_M);
  }
}

// The tile-local row of accumulator row i and column of accumulator column j.
__device__ __forceinline__ int row_of(int tx, int i) { return (i / SUB_M) * (BM / VT) + tx * SUB_M + i % SUB_M; }
__device__ __forceinline__ int col_of(int ty, int j) { return (j / SUB_N) * (BN / VT) + ty * SUB_N + j % SUB_N; }

// Applies alpha/beta to the thread's accumulators and stores them, VD rows per vector.
__device__ __forceinline__ void epilogue(const float* __restrict__ C, float* __restrict__ D, int m0, int n0, int tx,
                                         int ty, const float (&acc)[TM][TN]) {
#pragma unroll
  for (int j = 0; j < TN; ++j) {
    const int gn = n0 + col_of(ty, j);
#pragma unroll
    for (int i = 0; i < TM; i += VD) {
      const int gm = m0 + row_of(tx, i);
      if ((EVEN_N || gn < N) && (EVEN_M || gm < M)) {
        const size_t off = (size_t)gn * M + gm;
        SVec<VD> o;
        if constexpr (READ_C) {
          SVec<VD> c;
          c.v = *reinterpret_cast<const decltype(c.v)*>(C + off);
#pragma unroll
          for (int e = 0; e < VD; ++e) o.e[e] = ALPHA * acc[i + e][j] + BETA * c.e[e];
        } else {
#pragma unroll
          for (int e = 0; e < VD; ++e) o.e[e] = ALPHA == 1.0f ? acc[i + e][j] : ALPHA * acc[i + e][j];
        }
        *reinterpret_cast<decltype(o.v)*>(D + off) = o.v;
      }
    }
  }
}

}  // namespace tt

extern "C" __global__ void __launch_bounds__(tt::THREADS, tt::MIN_BLOCKS)
    KERNEL_NAME(const float* __restrict__ A, const float* __restrict__ B, const float* __restrict__ C,
                float* __restrict__ D, unsigned char* __restrict__ workspace) {
  using namespace tt;
  TT_FAULT_HOOK;
  extern __shared__ __align__(16) unsigned char smem[];
  float* As = reinterpret_cast<float*>(smem);
  float* Bs = As + (DOUBLE_BUFFER ? 2 : 1) * A_STAGE;

  const int pid = blockIdx.x;
  const int tm = pid % TILES_M;
  const int tn = pid / TILES_M;
  const int m0 = tm * BM;
  const int n0 = tn * BN;
  const int split = blockIdx.z;
  const int kt0 = split * KT_PER_SPLIT;
  const int nk = min(KTILES - kt0, KT_PER_SPLIT);
  const int2 t = thread_tile();
  const int tx = t.x;
  const int ty = t.y;

  float acc[TM][TN];
#pragma unroll
  for (int i = 0; i < TM; ++i) {
#pragma unroll
    for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;
  }

  FVec ra[A_ITERS];
  FVec rb[B_ITERS];
  if (nk > 0) {
    load_global(A, B, kt0, m0, n0, ra, rb);
    store_shared(As, Bs, ra, rb);
  }
  __syncthreads();
  for (int i = 0; i < nk; ++i) {
    if constexpr (DOUBLE_BUFFER) {
      const int cur = i & 1;
      if (i + 1 < nk) load_global(A, B, kt0 + i + 1, m0, n0, ra, rb);
      compute_step(As + cur * A_STAGE, Bs + cur * B_STAGE, tx, ty, acc);
      // The other slot was last read in step i - 1, before the barrier that ended it.
      if (i + 1 < nk) store_shared(As + (cur ^ 1) * A_STAGE, Bs + (cur ^ 1) * B_STAGE, ra, rb);
      __syncthreads();
    } else {
      // The loads fly while this step computes; the one slot is refilled between two barriers.
      if (i + 1 < nk) load_global(A, B, kt0 + i + 1, m0, n0, ra, rb);
      compute_step(As, Bs, tx, ty, acc);
      if (i + 1 < nk) {
        __syncthreads();
        store_shared(As, Bs, ra, rb);
      }
      __syncthreads();
    }
  }

  if constexpr (SPLIT_K == 1) {
    epilogue(C, D, m0, n0, tx, ty, acc);
  } else {
    const int tile = tm + tn * TILES_M;
    // The thread's elements of a partial tile sit at fixed offsets from one base per split.
    float* base = reinterpret_cast<float*>(workspace + COUNTERS_BYTES) + (size_t)tile * SPLIT_K * (BM * BN) +
                  ty * SUB_N * BM + tx * SUB_M;
    float* mine = base + (size_t)split * (BM * BN);
#pragma unroll
    for (int i = 0; i < TM; ++i) {
#pragma unroll
      for (int j = 0; j < TN; ++j) mine[col_of(0, j) * BM + row_of(0, i)] = acc[i][j];
    }
    __threadfence();
    __syncthreads();
    __shared__ int s_last;
    unsigned* counters = reinterpret_cast<unsigned*>(workspace);
    if (threadIdx.x == 0) s_last = atomicAdd(&counters[tile], 1u) == (unsigned)(SPLIT_K - 1);
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    // Every element summed over the splits in split order, from zero.
#pragma unroll
    for (int i = 0; i < TM; ++i) {
#pragma unroll
      for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;
    }
    for (int sp = 0; sp < SPLIT_K; ++sp) {
      const float* p = base + (size_t)sp * (BM * BN);
#pragma unroll
      for (int i = 0; i < TM; ++i) {
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] += load_cg(p + col_of(0, j) * BM + row_of(0, i));
      }
    }
    epilogue(C, D, m0, n0, tx, ty, acc);
    __syncthreads();
    if (threadIdx.x == 0) counters[tile] = 0;
  }
}
