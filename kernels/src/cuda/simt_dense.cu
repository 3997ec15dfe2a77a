// simt_gemm's fill of simt_gemm.cu's hole: B is a dense matrix, K-contiguous (gn * K + gk) or
// N-contiguous (gk * N + gn).
// @fill(load_b)
template <typename V>
__device__ __forceinline__ void load_b(const float* __restrict__ B, int gn, int gk, V& v) {
  v = *reinterpret_cast<const V*>(B + (B_K_CONTIG ? (size_t)gn * K + gk : (size_t)gk * N + gn));
}
