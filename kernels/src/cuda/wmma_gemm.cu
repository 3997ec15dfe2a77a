// tensortune wmma_gemm: D = alpha * op(A) * op(B) + beta * C, C and D column-major M x N.
//
// The block-level work (pipeline, warps, epilogue, split-K) is wmma_core.cuh's; this kernel maps
// blocks to output tiles and loads A and B as the plain matrices they are.

namespace tt {

__device__ __forceinline__ void kernel_body(unsigned char* smem, const T_IN* __restrict__ A,
                                            const T_IN* __restrict__ B, const T_OUT* __restrict__ C,
                                            T_OUT* __restrict__ D, unsigned char* __restrict__ workspace) {
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
  block_tile(smem, DenseLoader(), A, B, C, D, workspace, tm, tn);
}

}  // namespace tt
