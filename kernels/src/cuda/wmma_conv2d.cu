//@ wmma_conv2d's fills of wmma_core.cu's holes (see that file): its title, its loaders (a filter
//@ tile loaded as a plain matrix, an input tile gathered or, on the pointwise path, loaded as a
//@ plain matrix too), the per-block setup of the gather, and the fragments: T_IN's, or with TT_TF32
//@ (tf32 workloads only; other types' kernels preprocess to what they were) tf32 fragments whose
//@ loaded floats are rounded to TF32 before the MMAs.
// @fill(title)
// tensortune wmma_conv2d: forward convolution as an implicit GEMM; NHWC input, KRSC filter, NPQK
// output. The GEMM is computed transposed, so that the NPQK output is the column-major D below:
// M = KO output channels, N = batch*P*Q output pixels, K = R*S*CI in (r, s, c) order.
// A(m, kk) = filter[m][r][s][c] = A[m * K + kk] is a plain K-contiguous matrix, and
// B(kk, n) = in[b][p*STRIDE_H - PAD_H + r*DIL_H][q*STRIDE_W - PAD_W + s*DIL_W][c] for
// n = (b*P + p)*Q + q, kk = (r*S + s)*CI + c, zero outside the input: the im2col matrix, never built.
// With SWIZZLE 1 the blocks run along the output channels first, so the blocks that share a tile
// of input pixels run together and read it from DRAM about once.
//
// PATH_POINTWISE (1x1, stride 1, no padding): B is the dense [N][CI] input and loads as a matrix.
// Otherwise B's tile is gathered a vector of channels at a time (CI is a multiple of the vector, so
// a vector never straddles two taps; a K tile may). Each thread loads the same column `col` of rows
// row0, row0 + ROW_STEP, ... of the tile (as load_tile would): per stage it decomposes its
// kk = k0 + col into (r, s, c) once, and per row adds that tap's offset to the row's origin. The
// origins (offset of in[b][h0][w0][0], h0, w0) are computed once per block, kept in registers or
// (GATHER_SMEM) in a table in shared memory after the ring.
// @fill(load_stage)
constexpr int VE = VEC_B / (int)sizeof(T_IN);
constexpr int B_PER_ROW = BK / VE;
constexpr int ROW_STEP = THREADS / B_PER_ROW;
constexpr int B_ITERS = (BN + ROW_STEP - 1) / ROW_STEP;
constexpr int PQ = P * Q;
constexpr int HWC = H * W * CI;
// The origin of a row past N (a ragged last tile): no tap brings it inside the input.
constexpr int OUTSIDE = -(1 << 24);
// Without padding every tap of a real output pixel lies inside the input (P and Q are defined so),
// so only a ragged tile's rows past N need the check.
constexpr bool CHECK_H = PAD_H > 0 || !EVEN_N;
constexpr bool CHECK_W = PAD_W > 0 || !EVEN_N;
// Shared memory: the ring, then (GATHER_SMEM) the row table; the epilogue's staging reuses both.
constexpr int RING_BYTES = STAGES * (A_STAGE + B_STAGE) * (int)sizeof(T_IN);

static_assert(A_K_CONTIG && B_K_CONTIG && M == KO && N % PQ == 0 && K == R * S * CI, "the conv GEMM view");
static_assert(CI % VE == 0, "vectors of channels within one tap");
static_assert(THREADS % B_PER_ROW == 0, "each thread loads one column of the B tile");
static_assert(!PATH_POINTWISE || (R == 1 && S == 1 && STRIDE_H == 1 && STRIDE_W == 1 && PAD_H == 0 &&
                                  PAD_W == 0 && K == CI),
              "the pointwise path is for 1x1, stride 1, unpadded convs");
static_assert(RING_BYTES % 16 == 0 && RING_BYTES + (GATHER_SMEM ? BN * 16 : 0) <= SMEM_BYTES,
              "shared memory layout");

// Where output pixel gn's receptive field starts: x = the offset of in[b][h0][w0][0] (as unsigned,
// wrapping below zero for a padded origin; every offset actually read lies inside the input), y = h0,
// z = w0. 32-bit offsets suffice: the input has under 2^31 elements (kernels::workload::MAX_ELEMENTS).
__device__ __forceinline__ int4 row_origin(int gn) {
  if (!EVEN_N && gn >= N) return make_int4(0, OUTSIDE, OUTSIDE, 0);
  const int b = gn / PQ;
  const int pq = gn - b * PQ;
  const int p = pq / Q;
  const int q = pq - p * Q;
  const int h0 = p * STRIDE_H - PAD_H;
  const int w0 = q * STRIDE_W - PAD_W;
  const unsigned base = (unsigned)b * (unsigned)HWC + (unsigned)(h0 * W + w0) * (unsigned)CI;
  return make_int4((int)base, h0, w0, 0);
}

// What the K loop calls as load_stage (block_setup names an instance so): the filter's tile as the
// plain matrix it is, the input's gathered or, on the pointwise path, as a plain matrix too.
struct ConvLoader {
  int4 rows[GATHER_SMEM || PATH_POINTWISE ? 1 : B_ITERS];  // this thread's row origins (gather regs)
  const int4* table;                                       // the block's row origins (gather smem)
  int row0, col;                                           // this thread's first row and its column

  // Computes the origins of the block's rows (n0 ..); with GATHER_SMEM every thread must call it.
  __device__ __forceinline__ ConvLoader(unsigned char* smem, int n0) {
    row0 = (int)threadIdx.x / B_PER_ROW;
    col = ((int)threadIdx.x % B_PER_ROW) * VE;
    table = nullptr;
    if constexpr (PATH_POINTWISE) {
      return;
    } else if constexpr (GATHER_SMEM) {
      int4* t = reinterpret_cast<int4*>(smem + RING_BYTES);
      for (int i = threadIdx.x; i < BN; i += THREADS) t[i] = row_origin(n0 + i);
      __syncthreads();
      table = t;
    } else {
#pragma unroll
      for (int it = 0; it < B_ITERS; ++it) {
        const int row = row0 + it * ROW_STEP;
        if (BN % ROW_STEP == 0 || row < BN) rows[it] = row_origin(n0 + row);
      }
    }
  }

  __device__ __forceinline__ void operator()(T_IN* As, T_IN* Bs, const T_IN* __restrict__ A,
                                             const T_IN* __restrict__ B, int stage, int kt, int m0,
                                             int n0) const {
    const int k0 = kt * BK;
    T_IN* bs = Bs + stage * B_STAGE;
    load_tile<T_IN, A_ROWS, A_COLS, A_LD, VEC_A, THREADS, CP_ASYNC, EVEN_M, EVEN_K>(As + stage * A_STAGE, A, K, m0,
                                                                                     k0, M, K);
    if constexpr (PATH_POINTWISE) {
      load_tile<T_IN, B_ROWS, B_COLS, B_LD, VEC_B, THREADS, CP_ASYNC, EVEN_N, EVEN_K>(bs, B, K, n0, k0, N, K);
    } else {
      // This thread's column of the K tile: one tap (r, s) and channel c for all its rows.
      const int kk = k0 + col;
      const int rs = kk / CI;
      const int c = kk - rs * CI;
      const int r = rs / S;
      const int s = rs - r * S;
      const int dh = r * DIL_H;
      const int dw = s * DIL_W;
      const unsigned tap = (unsigned)(dh * W + dw) * (unsigned)CI + (unsigned)c;
      const bool k_inside = EVEN_K || kk < K;
#pragma unroll
      for (int it = 0; it < B_ITERS; ++it) {
        const int row = row0 + it * ROW_STEP;
        if (BN % ROW_STEP == 0 || row < BN) {
          int4 o;
          if constexpr (GATHER_SMEM) {
            o = table[row];
          } else {
            o = rows[it];
          }
          const int h = o.y + dh;
          const int w = o.z + dw;
          const bool pred = k_inside && (!CHECK_H || (unsigned)h < (unsigned)H) &&
                            (!CHECK_W || (unsigned)w < (unsigned)W);
          // A selected offset, not a selected pointer: the address stays valid with pred false.
          const unsigned off = pred ? (unsigned)o.x + tap : 0u;
          copy_vec<VEC_B, CP_ASYNC>(bs + row * B_LD + col, B + off, pred);
        }
      }
    }
  }
};
// @fill(block_setup)

  // The loader of this block; the K loop's calls to load_stage find it before any function.
  const ConvLoader load_stage(smem, n0);
// @fill(fragments)
#ifdef TT_TF32
    // TF32: f32 tiles in shared memory, read into m16n16k8 tf32 fragments.
    wmma::fragment<wmma::matrix_a, FM, FN, FK, wmma::precision::tf32, A_FRAG_LAYOUT> af[FRAGS_M];
    wmma::fragment<wmma::matrix_b, FM, FN, FK, wmma::precision::tf32, B_FRAG_LAYOUT> bf[FRAGS_N];
#else
    wmma::fragment<wmma::matrix_a, FM, FN, FK, T_IN, A_FRAG_LAYOUT> af[FRAGS_M];
    wmma::fragment<wmma::matrix_b, FM, FN, FK, T_IN, B_FRAG_LAYOUT> bf[FRAGS_N];
#endif
// @fill(fragment_fix)
#ifdef TT_TF32
    // Round the loaded floats to TF32 (to nearest) rather than let the MMA drop their low bits.
#pragma unroll
    for (int i = 0; i < FRAGS_M; ++i) {
#pragma unroll
      for (int t = 0; t < af[i].num_elements; ++t) af[i].x[t] = wmma::__float_to_tf32(af[i].x[t]);
    }
#pragma unroll
    for (int j = 0; j < FRAGS_N; ++j) {
#pragma unroll
      for (int t = 0; t < bf[j].num_elements; ++t) bf[j].x[t] = wmma::__float_to_tf32(bf[j].x[t]);
    }
#endif
