//@ wmma_gemm's fills of wmma_core.cu's holes (see that file).
// @fill(title)
// tensortune wmma_gemm: D = alpha * op(A) * op(B) + beta * C, C and D column-major M x N.
// @fill(load_stage)
__device__ __forceinline__ void load_stage(T_IN* As, T_IN* Bs, const T_IN* __restrict__ A, const T_IN* __restrict__ B,
                                           int stage, int kt, int m0, int n0) {
  const int k0 = kt * BK;
  T_IN* as = As + stage * A_STAGE;
  T_IN* bs = Bs + stage * B_STAGE;
  if constexpr (A_K_CONTIG) {
    load_tile<T_IN, A_ROWS, A_COLS, A_LD, VEC_A, THREADS, CP_ASYNC, EVEN_M, EVEN_K>(as, A, K, m0, k0, M, K);
  } else {
    load_tile<T_IN, A_ROWS, A_COLS, A_LD, VEC_A, THREADS, CP_ASYNC, EVEN_K, EVEN_M>(as, A, M, k0, m0, K, M);
  }
  if constexpr (B_K_CONTIG) {
    load_tile<T_IN, B_ROWS, B_COLS, B_LD, VEC_B, THREADS, CP_ASYNC, EVEN_N, EVEN_K>(bs, B, K, n0, k0, N, K);
  } else {
    load_tile<T_IN, B_ROWS, B_COLS, B_LD, VEC_B, THREADS, CP_ASYNC, EVEN_K, EVEN_N>(bs, B, N, k0, n0, K, N);
  }
}
// @fill(block_setup)
// @fill(fragments)
    wmma::fragment<wmma::matrix_a, FM, FN, FK, T_IN, A_FRAG_LAYOUT> af[FRAGS_M];
    wmma::fragment<wmma::matrix_b, FM, FN, FK, T_IN, B_FRAG_LAYOUT> bf[FRAGS_N];
// @fill(fragment_fix)
