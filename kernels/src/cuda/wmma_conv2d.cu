// tensortune wmma_conv2d: forward convolution as an implicit GEMM. NHWC input (A), KRSC filter (B),
// NPQK output (D).
//
// GEMM view (wmma_core.cuh does the block-level GEMM): M = batch*P*Q output pixels,
// N = output channels, K = R*S*CI in (r, s, c) order. D(m, n) lives at m * N + n
// (D_ROW_MAJOR). B(kk, n) = filter[n][r][s][c] = B[n * K + kk] is a plain K-contiguous matrix.
// A(m, kk) = in[b][p*STRIDE_H - PAD_H + r*DIL_H][q*STRIDE_W - PAD_W + s*DIL_W][c] for
// m = (b*P + p)*Q + q, kk = (r*S + s)*CI + c, and zero outside the input.
//
// PATH_POINTWISE (1x1, stride 1, no padding): A is the dense [M][CI] matrix and loads as
// wmma_gemm's does. Otherwise A is gathered a 16-byte vector of channels at a time (CI is a
// multiple of the vector, so a vector never straddles two taps; a K tile may). In every A tile a
// thread loads the same column `col` of rows row0, row0 + ROW_STEP, ... (A_ITERS rows, as
// load_tile would): per stage it decomposes its kk = k0 + col into (r, s, c) once, and per row adds
// that tap's offset to the row's origin. The origins (offset of in[b][h0][w0][0], h0, w0) are
// computed once per block, kept in registers or (GATHER_SMEM) in a table after the ring.

namespace tt {

constexpr int VE = VEC_A / (int)sizeof(T_IN);
constexpr int A_PER_ROW = BK / VE;
constexpr int ROW_STEP = THREADS / A_PER_ROW;
constexpr int A_ITERS = (BM + ROW_STEP - 1) / ROW_STEP;
constexpr int PQ = P * Q;
constexpr int HWC = H * W * CI;
// The origin of a row past M (a ragged last tile): no tap brings it inside the input.
constexpr int OUTSIDE = -(1 << 24);
// Without padding every tap of a real output pixel lies inside the input (P and Q are defined so),
// so only a ragged tile's rows past M need the check.
constexpr bool CHECK_H = PAD_H > 0 || !EVEN_M;
constexpr bool CHECK_W = PAD_W > 0 || !EVEN_M;
// Shared memory: the ring (or, after the K loop, the epilogue's staging), then the row table.
constexpr int RING_BYTES = STAGES * (A_STAGE + B_STAGE) * (int)sizeof(T_IN);
constexpr int STAGING_BYTES = WARPS_K * C_SLICE * (int)sizeof(T_ACC);
constexpr int TABLE_OFFSET = RING_BYTES > STAGING_BYTES ? RING_BYTES : STAGING_BYTES;

static_assert(A_K_CONTIG && B_K_CONTIG && D_ROW_MAJOR && M % PQ == 0 && N == KO && K == R * S * CI,
              "the conv GEMM view");
static_assert(VEC_A == 16 && CI % VE == 0, "16-byte vectors of channels");
static_assert(THREADS % A_PER_ROW == 0, "each thread loads one column of the A tile");
static_assert(!PATH_POINTWISE || (R == 1 && S == 1 && STRIDE_H == 1 && STRIDE_W == 1 && PAD_H == 0 &&
                                  PAD_W == 0 && K == CI),
              "the pointwise path is for 1x1, stride 1, unpadded convs");
static_assert(TABLE_OFFSET % 16 == 0 && TABLE_OFFSET + (GATHER_SMEM ? BM * 16 : 0) <= SMEM_BYTES,
              "shared memory layout");

// Where output pixel gm's receptive field starts: x = the offset of in[b][h0][w0][0] (as unsigned,
// wrapping below zero for a padded origin; every offset actually read lies inside the input), y = h0,
// z = w0. 32-bit offsets suffice: the input has under 2^31 elements (kernels::workload::MAX_ELEMENTS).
__device__ __forceinline__ int4 row_origin(int gm) {
  if (!EVEN_M && gm >= M) return make_int4(0, OUTSIDE, OUTSIDE, 0);
  const int b = gm / PQ;
  const int pq = gm - b * PQ;
  const int p = pq / Q;
  const int q = pq - p * Q;
  const int h0 = p * STRIDE_H - PAD_H;
  const int w0 = q * STRIDE_W - PAD_W;
  const unsigned base = (unsigned)b * (unsigned)HWC + (unsigned)(h0 * W + w0) * (unsigned)CI;
  return make_int4((int)base, h0, w0, 0);
}

// The implicit path's loader: gathers A's tile, loads B's as the dense matrix it is.
struct GatherLoader {
  int4 rows[GATHER_SMEM ? 1 : A_ITERS];  // this thread's row origins (GATHER_SMEM: unused)
  const int4* table;                     // the block's row origins (GATHER_SMEM only)
  int row0, col;                         // this thread's first row and its column in the A tile

  // Computes the origins of the block's rows (m0 ..); with GATHER_SMEM every thread must call it.
  __device__ __forceinline__ GatherLoader(unsigned char* smem, int m0) {
    row0 = (int)threadIdx.x / A_PER_ROW;
    col = ((int)threadIdx.x % A_PER_ROW) * VE;
    if constexpr (GATHER_SMEM) {
      int4* t = reinterpret_cast<int4*>(smem + TABLE_OFFSET);
      for (int i = threadIdx.x; i < BM; i += THREADS) t[i] = row_origin(m0 + i);
      __syncthreads();
      table = t;
    } else {
      table = nullptr;
#pragma unroll
      for (int it = 0; it < A_ITERS; ++it) {
        const int row = row0 + it * ROW_STEP;
        if (BM % ROW_STEP == 0 || row < BM) rows[it] = row_origin(m0 + row);
      }
    }
  }

  __device__ __forceinline__ void load_stage(T_IN* As, T_IN* Bs, const T_IN* __restrict__ A,
                                             const T_IN* __restrict__ B, int stage, int kt, int m0,
                                             int n0) const {
    const int k0 = kt * BK;
    T_IN* as = As + stage * A_STAGE;
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
    for (int it = 0; it < A_ITERS; ++it) {
      const int row = row0 + it * ROW_STEP;
      if (BM % ROW_STEP == 0 || row < BM) {
        const int4 o = GATHER_SMEM ? table[row] : rows[it];
        const int h = o.y + dh;
        const int w = o.z + dw;
        const bool pred = k_inside && (!CHECK_H || (unsigned)h < (unsigned)H) &&
                          (!CHECK_W || (unsigned)w < (unsigned)W);
        // A selected offset, not a selected pointer: the address stays valid with pred false.
        const unsigned off = pred ? (unsigned)o.x + tap : 0u;
        copy_vec<VEC_A, CP_ASYNC>(as + row * A_LD + col, A + off, pred);
      }
    }
    load_b_dense(Bs + stage * B_STAGE, B, k0, n0);
  }
};

__device__ __forceinline__ void kernel_body(unsigned char* smem, const T_IN* __restrict__ A,
                                            const T_IN* __restrict__ B, const T_OUT* __restrict__ C,
                                            T_OUT* __restrict__ D, unsigned char* __restrict__ workspace) {
  // Block -> output tile, output channels fastest: the blocks that share a tile of activations run
  // together, so it comes from DRAM about once.
  const int tm = blockIdx.x / TILES_N;
  const int tn = blockIdx.x % TILES_N;
  if constexpr (PATH_POINTWISE) {
    block_tile(smem, DenseLoader(), A, B, C, D, workspace, tm, tn);
  } else {
    block_tile(smem, GatherLoader(smem, tm * BM), A, B, C, D, workspace, tm, tn);
  }
}

}  // namespace tt
