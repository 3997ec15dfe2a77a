// simt_conv2d's fill of simt_gemm.cu's hole: B is the im2col view of the NHWC input. The GEMM
// is D^T = filter x im2col(input): its M is the output channels, its N the output pixels
// gn = (n * P + p) * Q + q, its K the taps gk = (r * S + s) * CI + c, so B is K-contiguous along a
// tap's channels and D (column-major M x N) is the NPQK output. CI is a multiple of VEC, so a
// vector never straddles two taps; a tap in the padding reads zeros. (The geometry's names are
// `support::conv_geometry`'s.)
// @fill(load_b)
template <typename V>
__device__ __forceinline__ void load_b(const float* __restrict__ X, int gn, int gk, V& v) {
  const int q = gn % Q;
  const int p = (gn / Q) % P;
  const int n = gn / (Q * P);
  const int c = gk % CI;
  const int s = (gk / CI) % S;
  const int r = gk / (CI * S);
  const int h = p * STRIDE_H - PAD_H + r * DIL_H;
  const int w = q * STRIDE_W - PAD_W + s * DIL_W;
  if (h >= 0 && h < H && w >= 0 && w < W) {
    v = *reinterpret_cast<const V*>(X + (((size_t)n * H + h) * W + w) * CI + c);
  }
}
