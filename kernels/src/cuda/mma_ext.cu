// tensortune mma_ext_gemm: D = alpha * op(A) * op(B) + beta * C on the tensor cores for the types
// wmma_gemm does not take: tf32 (f32 data rounded to TF32 in the fragments, WMMA m16n16k8, any
// layout) and the packed s4 / u4 / b1 types (tn only: mma.sync m8n8k32 and m8n8k128, the
// instructions WMMA's experimental sub-byte fragments lower to, with XOR or AND popcount for
// bits). C and D column-major M x N.
//
// One block computes a BM x BN tile over the whole of K; its WARPS_M x WARPS_N warps each own a
// WM x WN sub-tile of FM x FN fragments. A and B stream through a ring of STAGES shared-memory
// slots filled by cp.async (sm_80+). Tiles keep the global contiguity; every size along a row is
// in bytes (rows of packed operands hold several elements per byte), rows padded by SKEW_BYTES.
// The epilogue stages the accumulators through shared memory so D is written in wide vectors.

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
constexpr bool EVEN_M = M % BM == 0;
constexpr bool EVEN_N = N % BN == 0;
constexpr bool EVEN_K = K % BK == 0;
// Bytes of a K extent of `k` elements.
constexpr int kbytes(long long k) { return (int)(k * IN_BITS / 8); }

// Staged tiles, in bytes along their rows.
constexpr int A_ROWS = A_K_CONTIG ? BM : BK;
constexpr int A_COLS = A_K_CONTIG ? kbytes(BK) : BM * 4;
constexpr int A_LD = A_COLS + SKEW_BYTES;
constexpr int B_ROWS = B_K_CONTIG ? BN : BK;
constexpr int B_COLS = B_K_CONTIG ? kbytes(BK) : BN * 4;
constexpr int B_LD = B_COLS + SKEW_BYTES;
constexpr int A_STAGE = A_ROWS * A_LD;
constexpr int B_STAGE = B_ROWS * B_LD;
// Accumulator staging: column-major BM x BN, columns padded by 16 bytes.
constexpr int C_LD = BM + 4;
constexpr int VD = VEC_D / 4;
constexpr int PER_COL = BM / VD;
constexpr int TILE_VECS = BN * PER_COL;

static_assert(BM % (WARPS_M * FM) == 0 && BN % (WARPS_N * FN) == 0 && BK % FK == 0, "tile shape");
static_assert(A_LD % 16 == 0 && B_LD % 16 == 0, "16-byte rows");
static_assert(!TT_PACKED || (A_K_CONTIG && B_K_CONTIG), "packed operands are K-contiguous (tn)");
static_assert(STAGES == 1 || CP_ASYNC, "multi-stage pipelines need cp.async");

// Fills ring slot `stage` with K tile kt of A and B for the output tile at (m0, n0).
__device__ __forceinline__ void load_stage(unsigned char* As, unsigned char* Bs, const unsigned char* __restrict__ A,
                                           const unsigned char* __restrict__ B, int stage, int kt, int m0, int n0) {
  unsigned char* as = As + stage * A_STAGE;
  unsigned char* bs = Bs + stage * B_STAGE;
  const int k0 = kt * BK;
  if constexpr (A_K_CONTIG) {
    load_tile<unsigned char, A_ROWS, A_COLS, A_LD, VEC_A, THREADS, CP_ASYNC, EVEN_M, EVEN_K>(
        as, A, kbytes(K), m0, kbytes(k0), M, kbytes(K));
  } else {
    load_tile<unsigned char, A_ROWS, A_COLS, A_LD, VEC_A, THREADS, CP_ASYNC, EVEN_K, EVEN_M>(as, A, M * 4, k0, m0 * 4,
                                                                                           K, M * 4);
  }
  if constexpr (B_K_CONTIG) {
    load_tile<unsigned char, B_ROWS, B_COLS, B_LD, VEC_B, THREADS, CP_ASYNC, EVEN_N, EVEN_K>(
        bs, B, kbytes(K), n0, kbytes(k0), N, kbytes(K));
  } else {
    load_tile<unsigned char, B_ROWS, B_COLS, B_LD, VEC_B, THREADS, CP_ASYNC, EVEN_K, EVEN_N>(bs, B, N * 4, k0, n0 * 4,
                                                                                           K, N * 4);
  }
}

#if !TT_PACKED
// TF32 through WMMA: f32 fragments loaded from shared memory, rounded to TF32, m16n16k8.
typedef wmma::fragment<wmma::accumulator, FM, FN, FK, float> Acc;
typedef wmma::fragment<wmma::matrix_a, FM, FN, FK, wmma::precision::tf32, A_FRAG_LAYOUT> FragA;
typedef wmma::fragment<wmma::matrix_b, FM, FN, FK, wmma::precision::tf32, B_FRAG_LAYOUT> FragB;

__device__ __forceinline__ void zero(Acc& c) {
#pragma unroll
  for (int t = 0; t < c.num_elements; ++t) c.x[t] = opaque_zero<float>();
}

__device__ __forceinline__ void compute_stage(const unsigned char* as, const unsigned char* bs, int wm0, int wn0,
                                              Acc (&acc)[FRAGS_M][FRAGS_N]) {
  const float* af32 = reinterpret_cast<const float*>(as);
  const float* bf32 = reinterpret_cast<const float*>(bs);
  constexpr int ALD = A_LD / 4;
  constexpr int BLD = B_LD / 4;
#pragma unroll
  for (int kk = 0; kk < BK; kk += FK) {
    FragA af[FRAGS_M];
    FragB bf[FRAGS_N];
#pragma unroll
    for (int i = 0; i < FRAGS_M; ++i) {
      const int mm = wm0 + i * FM;
      wmma::load_matrix_sync(af[i], A_K_CONTIG ? af32 + mm * ALD + kk : af32 + kk * ALD + mm, ALD);
#pragma unroll
      for (int t = 0; t < af[i].num_elements; ++t) af[i].x[t] = wmma::__float_to_tf32(af[i].x[t]);
    }
#pragma unroll
    for (int j = 0; j < FRAGS_N; ++j) {
      const int nn = wn0 + j * FN;
      wmma::load_matrix_sync(bf[j], B_K_CONTIG ? bf32 + nn * BLD + kk : bf32 + kk * BLD + nn, BLD);
#pragma unroll
      for (int t = 0; t < bf[j].num_elements; ++t) bf[j].x[t] = wmma::__float_to_tf32(bf[j].x[t]);
    }
#pragma unroll
    for (int i = 0; i < FRAGS_M; ++i) {
#pragma unroll
      for (int j = 0; j < FRAGS_N; ++j) wmma::mma_sync(acc[i][j], af[i], bf[j], acc[i][j]);
    }
  }
}

__device__ __forceinline__ void stage_acc(float* Cs, int wm0, int wn0, const Acc (&acc)[FRAGS_M][FRAGS_N]) {
#pragma unroll
  for (int i = 0; i < FRAGS_M; ++i) {
#pragma unroll
    for (int j = 0; j < FRAGS_N; ++j) {
      wmma::store_matrix_sync(Cs + (wn0 + j * FN) * C_LD + (wm0 + i * FM), acc[i][j], C_LD, wmma::mem_col_major);
    }
  }
}
#else
// Packed types through mma.sync m8n8k32 (4-bit) or m8n8k128 (1-bit): per 8x8 fragment each lane
// holds one 32-bit word of A (row lane / 4, word lane % 4 of the step), one of B (column lane / 4)
// and two i32 accumulators (row lane / 4, columns 2 * (lane % 4) and the next).
struct Acc {
  int x[2];
};

__device__ __forceinline__ void zero(Acc& c) {
  c.x[0] = opaque_zero<int>();
  c.x[1] = opaque_zero<int>();
}

__device__ __forceinline__ void mma(Acc& c, unsigned a, unsigned b) {
#if __CUDA_ARCH__ >= 750
  if constexpr (IN_OP == 1) {
    asm volatile("mma.sync.aligned.m8n8k128.row.col.s32.b1.b1.s32.xor.popc {%0, %1}, {%2}, {%3}, {%0, %1};\n"
                 : "+r"(c.x[0]), "+r"(c.x[1])
                 : "r"(a), "r"(b));
  } else if constexpr (IN_OP == 2) {
    asm volatile("mma.sync.aligned.m8n8k128.row.col.s32.b1.b1.s32.and.popc {%0, %1}, {%2}, {%3}, {%0, %1};\n"
                 : "+r"(c.x[0]), "+r"(c.x[1])
                 : "r"(a), "r"(b));
  } else if constexpr (IN_SIGNED) {
    asm volatile("mma.sync.aligned.m8n8k32.row.col.s32.s4.s4.s32 {%0, %1}, {%2}, {%3}, {%0, %1};\n"
                 : "+r"(c.x[0]), "+r"(c.x[1])
                 : "r"(a), "r"(b));
  } else {
    asm volatile("mma.sync.aligned.m8n8k32.row.col.s32.u4.u4.s32 {%0, %1}, {%2}, {%3}, {%0, %1};\n"
                 : "+r"(c.x[0]), "+r"(c.x[1])
                 : "r"(a), "r"(b));
  }
#endif
}

__device__ __forceinline__ void compute_stage(const unsigned char* as, const unsigned char* bs, int wm0, int wn0,
                                              Acc (&acc)[FRAGS_M][FRAGS_N]) {
  const int lane = (int)threadIdx.x % 32;
  const int word = (lane % 4) * 4;
  constexpr int STEP_BYTES = FK * IN_BITS / 8;
#pragma unroll
  for (int kb = 0; kb < A_COLS; kb += STEP_BYTES) {
    unsigned a[FRAGS_M];
    unsigned b[FRAGS_N];
#pragma unroll
    for (int i = 0; i < FRAGS_M; ++i)
      a[i] = *reinterpret_cast<const unsigned*>(as + (wm0 + i * FM + lane / 4) * A_LD + kb + word);
#pragma unroll
    for (int j = 0; j < FRAGS_N; ++j)
      b[j] = *reinterpret_cast<const unsigned*>(bs + (wn0 + j * FN + lane / 4) * B_LD + kb + word);
#pragma unroll
    for (int i = 0; i < FRAGS_M; ++i) {
#pragma unroll
      for (int j = 0; j < FRAGS_N; ++j) mma(acc[i][j], a[i], b[j]);
    }
  }
}

__device__ __forceinline__ void stage_acc(int* Cs, int wm0, int wn0, const Acc (&acc)[FRAGS_M][FRAGS_N]) {
  const int lane = (int)threadIdx.x % 32;
#pragma unroll
  for (int i = 0; i < FRAGS_M; ++i) {
#pragma unroll
    for (int j = 0; j < FRAGS_N; ++j) {
      const int m = wm0 + i * FM + lane / 4;
      const int n = wn0 + j * FN + (lane % 4) * 2;
      Cs[n * C_LD + m] = acc[i][j].x[0];
      Cs[(n + 1) * C_LD + m] = acc[i][j].x[1];
    }
  }
}
#endif

}  // namespace tt

extern "C" __global__ void __launch_bounds__(tt::THREADS, 1)
    KERNEL_NAME(const unsigned char* __restrict__ A, const unsigned char* __restrict__ B, const T_OUT* __restrict__ C,
                T_OUT* __restrict__ D, unsigned char* __restrict__ workspace) {
  using namespace tt;
  TT_FAULT_HOOK;
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char* As = smem;
  unsigned char* Bs = As + STAGES * A_STAGE;

  const int pid = blockIdx.x;
  const int tm = pid % TILES_M;
  const int tn = pid / TILES_M;
  const int m0 = tm * BM;
  const int n0 = tn * BN;
  const int warp = (int)threadIdx.x / 32;
  const int wm0 = (warp % WARPS_M) * WM;
  const int wn0 = (warp / WARPS_M) * WN;

  Acc acc[FRAGS_M][FRAGS_N];
#pragma unroll
  for (int i = 0; i < FRAGS_M; ++i) {
#pragma unroll
    for (int j = 0; j < FRAGS_N; ++j) zero(acc[i][j]);
  }

  if constexpr (STAGES == 1) {
    for (int kt = 0; kt < KTILES; ++kt) {
      load_stage(As, Bs, A, B, 0, kt, m0, n0);
      cp_async_commit<CP_ASYNC>();
      cp_async_wait<0, CP_ASYNC>();
      __syncthreads();
      compute_stage(As, Bs, wm0, wn0, acc);
      __syncthreads();
    }
  } else {
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s < KTILES) load_stage(As, Bs, A, B, s, s, m0, n0);
      cp_async_commit<CP_ASYNC>();
    }
    for (int kt = 0; kt < KTILES; ++kt) {
      // Tile kt has landed once at most STAGES - 2 newer groups are pending; the barrier also
      // frees the slot computed in the previous iteration.
      cp_async_wait<STAGES - 2, CP_ASYNC>();
      __syncthreads();
      const int next = kt + STAGES - 1;
      if (next < KTILES) load_stage(As, Bs, A, B, next % STAGES, next, m0, n0);
      cp_async_commit<CP_ASYNC>();
      const int stage = kt % STAGES;
      compute_stage(As + stage * A_STAGE, Bs + stage * B_STAGE, wm0, wn0, acc);
    }
  }
  cp_async_wait<0, CP_ASYNC>();
  __syncthreads();

  // Stage the accumulators (the ring is free now), then write D in vectors of VD.
  T_ACC* Cs = reinterpret_cast<T_ACC*>(smem);
  stage_acc(Cs, wm0, wn0, acc);
  __syncthreads();
  for (int v = threadIdx.x; v < TILE_VECS; v += THREADS) {
    const int n = v / PER_COL;
    const int m = (v % PER_COL) * VD;
    const int gm = m0 + m;
    const int gn = n0 + n;
    if (gm < M && gn < N) {
      const size_t off = (size_t)gn * M + gm;
      OutVec<T_OUT, VD> o;
      if constexpr (READ_C) {
        OutVec<T_OUT, VD> c;
        c.v = *reinterpret_cast<const decltype(c.v)*>(C + off);
#pragma unroll
        for (int e = 0; e < VD; ++e) o.e[e] = from_epi<T_OUT>(ALPHA * to_epi(Cs[n * C_LD + m + e]) + BETA * to_epi(c.e[e]));
      } else {
#pragma unroll
        for (int e = 0; e < VD; ++e) {
          const T_EPI a = to_epi(Cs[n * C_LD + m + e]);
          o.e[e] = from_epi<T_OUT>(ALPHA == (T_EPI)1 ? a : ALPHA * a);
        }
      }
      *reinterpret_cast<decltype(o.v)*>(D + off) = o.v;
    }
  }
}
