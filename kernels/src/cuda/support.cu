// tensortune support kernels: input generation, output poisoning, the float64 reference and the
// full-output comparison. One module per workload; the header defines the shape constants.
//
// Inputs come in two sets. The check set draws multiples of 1/8 in [-1, 1] (integers in
// [-128, 127] for i8): products are then exact, and so are f32 sums up to K = 2^18, so a correct
// f32-accumulating kernel matches the float64 reference to the last bit before its epilogue. The
// timing set draws full-precision uniform values, so timings see realistic bit patterns.
//
// Exact f32 inputs (FINE_CHECK) draw multiples of 1/2048 instead: twelve significant bits, one
// more than TF32 keeps, so a kernel that rounds its inputs to TF32 misses the reference by far
// more than f32 accumulation can. Their products are still exact in f32; their sums round, and
// the tolerance allows for it.
//
// Packed inputs (IN_BITS < 8: s4, u4, b1) are 32-bit words of 32 / IN_BITS elements, the first
// in the lowest bits; both sets are random words (integer products are exact). IN_OP says how
// two elements multiply: 0 a * b, 1 a ^ b (b1xor), 2 a & b (b1and).

namespace tt {

__device__ __forceinline__ unsigned hash32(unsigned x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}

// Uniform in [-1, 1): quantised to multiples of 1/8 for the check set (of 1/2048 when `fine`).
__device__ __forceinline__ float draw(unsigned long long i, unsigned seed, bool check, bool fine = false) {
  const unsigned h = hash32((unsigned)i * 0x9e3779b9U ^ hash32(seed + (unsigned)(i >> 32)));
  if (check && fine) return (float)((int)(h % 4097u) - 2048) / 2048.0f;
  if (check) return (float)((int)(h % 17u) - 8) / 8.0f;
  return (float)(h >> 8) * (2.0f / 16777216.0f) - 1.0f;
}

template <typename T> __device__ __forceinline__ T make(unsigned long long i, unsigned seed, bool check);
template <> __device__ __forceinline__ half make<half>(unsigned long long i, unsigned seed, bool check) {
  return __float2half_rn(draw(i, seed, check));
}
template <> __device__ __forceinline__ __nv_bfloat16 make<__nv_bfloat16>(unsigned long long i, unsigned seed, bool check) {
  return __float2bfloat16_rn(draw(i, seed, check));
}
#ifdef __CUDA_FP8_TYPES_EXIST__
// FP8 inputs: the check set's multiples of 1/8 in [-1, 1] are exact in e4m3 and e5m2 (at most
// three significant bits).
template <> __device__ __forceinline__ __nv_fp8_e4m3 make<__nv_fp8_e4m3>(unsigned long long i, unsigned seed, bool check) {
  return __nv_fp8_e4m3(draw(i, seed, check));
}
template <> __device__ __forceinline__ __nv_fp8_e5m2 make<__nv_fp8_e5m2>(unsigned long long i, unsigned seed, bool check) {
  return __nv_fp8_e5m2(draw(i, seed, check));
}
__device__ __forceinline__ double to_f64(__nv_fp8_e4m3 x) { return (double)(float)x; }
__device__ __forceinline__ double to_f64(__nv_fp8_e5m2 x) { return (double)(float)x; }
#endif
template <> __device__ __forceinline__ float make<float>(unsigned long long i, unsigned seed, bool check) {
  return draw(i, seed, check);
}
template <> __device__ __forceinline__ signed char make<signed char>(unsigned long long i, unsigned seed, bool) {
  return (signed char)(int)(hash32((unsigned)i * 0x9e3779b9U ^ hash32(seed + (unsigned)(i >> 32))) & 0xffu) ;
}
template <> __device__ __forceinline__ int make<int>(unsigned long long i, unsigned seed, bool) {
  return (int)(hash32((unsigned)i * 0x9e3779b9U ^ hash32(seed + (unsigned)(i >> 32))) % 2001u) - 1000;
}
template <> __device__ __forceinline__ unsigned make<unsigned>(unsigned long long i, unsigned seed, bool) {
  return hash32((unsigned)i * 0x9e3779b9U ^ hash32(seed + (unsigned)(i >> 32)));
}


__device__ __forceinline__ double to_f64(half x) { return (double)__half2float(x); }
__device__ __forceinline__ double to_f64(__nv_bfloat16 x) { return (double)__bfloat162float(x); }
__device__ __forceinline__ double to_f64(float x) { return (double)x; }
__device__ __forceinline__ double to_f64(signed char x) { return (double)x; }
__device__ __forceinline__ double to_f64(int x) { return (double)x; }
__device__ __forceinline__ double to_f64(unsigned x) { return (double)x; }

// Element `idx` of an input operand, as a double: packed elements are unpacked (s4 sign-extended).
__device__ __forceinline__ double in_elem(const T_IN* p, long long idx) {
  if constexpr (cfg::IN_BITS < 8) {
    const unsigned long long bit = (unsigned long long)idx * cfg::IN_BITS;
    const unsigned word = reinterpret_cast<const unsigned*>(p)[bit / 32];
    const unsigned v = (word >> (bit % 32)) & ((1u << cfg::IN_BITS) - 1u);
    if constexpr (cfg::IN_SIGNED) return (double)((int)(v << (32 - cfg::IN_BITS)) >> (32 - cfg::IN_BITS));
    return (double)v;
  } else {
    return to_f64(p[idx]);
  }
}

// The product of two input elements: a * b, or for bits XOR / AND.
__device__ __forceinline__ double in_mul(double a, double b) {
  if constexpr (cfg::IN_OP == 1) return (double)((int)a ^ (int)b);
  if constexpr (cfg::IN_OP == 2) return (double)((int)a & (int)b);
  return a * b;
}

// Output poison: NaN for float types, a sentinel for integers.
template <typename T> __device__ __forceinline__ T poison_value();
template <> __device__ __forceinline__ half poison_value<half>() { return __ushort_as_half((unsigned short)0x7fffU); }
template <> __device__ __forceinline__ __nv_bfloat16 poison_value<__nv_bfloat16>() {
  return __ushort_as_bfloat16((unsigned short)0x7fffU);
}
template <> __device__ __forceinline__ float poison_value<float>() { return __int_as_float(0x7fffffff); }
template <> __device__ __forceinline__ int poison_value<int>() { return (int)0x80000001; }

__device__ __forceinline__ bool is_poison(half x) { return __hisnan(x); }
__device__ __forceinline__ bool is_poison(__nv_bfloat16 x) { return __hisnan(x); }
__device__ __forceinline__ bool is_poison(float x) { return isnan(x); }
__device__ __forceinline__ bool is_poison(int x) { return x == (int)0x80000001; }

// An f32 value rounded to an output type (nearest even).
template <typename T> __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ half from_f32<half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ int from_f32<int>(float v) { return __float2int_rn(v); }

}  // namespace tt

using namespace tt;
using namespace cfg;

// n counts elements; packed inputs are filled a word (32 / IN_BITS elements) at a time.
extern "C" __global__ void tt_fill_in(T_IN* p, unsigned long long n, unsigned seed, int check) {
  const unsigned long long units = IN_BITS < 8 ? n * IN_BITS / 32 : n;
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < units;
       i += (unsigned long long)gridDim.x * blockDim.x) {
    if constexpr (FINE_CHECK) {
      p[i] = T_IN(draw(i, seed, check != 0, true));
    } else {
      p[i] = make<T_IN>(i, seed, check != 0);
    }
  }
}

extern "C" __global__ void tt_fill_out(T_OUT* p, unsigned long long n, unsigned seed, int check) {
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
       i += (unsigned long long)gridDim.x * blockDim.x)
    p[i] = make<T_OUT>(i, seed, check != 0);
}

extern "C" __global__ void tt_poison(T_OUT* p, unsigned long long n) {
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
       i += (unsigned long long)gridDim.x * blockDim.x)
    p[i] = poison_value<T_OUT>();
}

// GELU, tanh form, in float64.
__device__ __forceinline__ double gelu_f64(double x) {
  return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

// GELU, exact (erf) form, in float64.
__device__ __forceinline__ double gelu_erf_f64(double x) { return 0.5 * x * (1.0 + erf(x * 0.7071067811865476)); }

// Reference: ref = act(alpha * sa * sb * scale[m] * sum + beta * c + bias[m]) in float64 (the
// epilogue's parts only where the workload has them; a convolution's row is its output channel),
// plus per element the scales the tolerance needs: sq = |alpha sa sb scale[m]| * sqrt(sum of squared products),
// mag = |alpha sa sb scale[m] * sum| + |beta * c| + |bias[m]|; both grow by 1.13 (GELU's
// steepest slope, 1.129 in either form) under GELU. Launch with one thread per output element
// (grid-stride), any block size.
extern "C" __global__ void tt_reference(const T_IN* __restrict__ A, const T_IN* __restrict__ B,
                                        const T_OUT* __restrict__ C, double* __restrict__ ref,
                                        double* __restrict__ sq, double* __restrict__ mag,
                                        const T_OUT* __restrict__ bias, const float* __restrict__ row_scale,
                                        const float* __restrict__ tensor_scales) {
  const unsigned long long total = (unsigned long long)OUT_ELEMS;
  for (unsigned long long o = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; o < total;
       o += (unsigned long long)gridDim.x * blockDim.x) {
    double sum = 0.0, sum_sq = 0.0;
#if TT_OP_CONV2D
    // Output NPQK (K fastest): o = ((n * P + p) * Q + q) * KO + k.
    const long long k = (long long)(o % KO);
    const long long q = (long long)((o / KO) % Q);
    const long long pp = (long long)((o / KO / Q) % P);
    const long long nb = (long long)(o / KO / Q / P);
    for (int r = 0; r < R; ++r) {
      const long long h = pp * STRIDE_H - PAD_H + (long long)r * DIL_H;
      if (h < 0 || h >= H) continue;
      for (int s = 0; s < S; ++s) {
        const long long w = q * STRIDE_W - PAD_W + (long long)s * DIL_W;
        if (w < 0 || w >= W) continue;
        const T_IN* x = A + ((nb * H + h) * W + w) * CI;
        const T_IN* f = B + ((k * R + r) * S + s) * CI;
        for (int c = 0; c < CI; ++c) {
          const double prod = in_mul(in_elem(x, c), in_elem(f, c));
          sum += prod;
          sum_sq += prod * prod;
        }
      }
    }
#else
    // Column-major M x N output: o = m + n * M; a batch's problems one after another. A grouped
    // matmul's M is its groups' packed M, and group g's B the g-th K x N matrix.
    const long long m = (long long)(o % M);
    const long long n = (long long)((o / M) % N);
    long long prob = (long long)(o / ((unsigned long long)M * N));
#if TT_GROUPED
#pragma unroll
    for (int g = 1; g < GROUPS; ++g) prob = m >= GROUP_M0[g] ? g : prob;
#endif
    const long long a0 = prob * (GROUPS > 0 ? 0 : M * K), b0 = prob * K * N;
    for (long long kk = 0; kk < K; ++kk) {
      const double a = in_elem(A, a0 + (A_K_CONTIG ? kk + m * K : m + kk * M));
      const double b = in_elem(B, b0 + (B_K_CONTIG ? kk + n * K : n + kk * N));
      const double prod = in_mul(a, b);
      sum += prod;
      sum_sq += prod * prod;
    }
#endif
    const double c = READ_C ? to_f64(C[o]) : 0.0;
#if TT_OP_CONV2D
    const long long row = k;
#else
    const long long row = m;
#endif
    double scale = ALPHA_F64;
    if (TENSOR_SCALE) scale *= (double)tensor_scales[0] * (double)tensor_scales[1];
    if (EPI_SCALE) scale *= (double)row_scale[row];
    const double b = EPI_BIAS ? to_f64(bias[row]) : 0.0;
    const double pre = scale * sum + BETA_F64 * c + b;
    const double slope = EPI_ACT >= 2 ? 1.13 : 1.0;
    ref[o] = EPI_ACT == 1 ? fmax(pre, 0.0) : EPI_ACT == 2 ? gelu_f64(pre) : EPI_ACT == 3 ? gelu_erf_f64(pre) : pre;
    sq[o] = slope * fabs(scale) * sqrt(sum_sq);
    mag[o] = slope * (fabs(scale * sum) + fabs(BETA_F64 * c) + fabs(b));
  }
}

// The unfused epilogue a framework runs after a vendor GEMM that cannot fuse it: D holds the
// plain product (alpha 1, beta 0, no input scales); this writes
// D = act(alpha * sa * sb * scale[m] * D + beta * C + bias[m]) in f32, one thread per element
// (grid-stride; a convolution's m is its output channel). The vendor baseline's second kernel
// where cuBLASLt or cuDNN has no such epilogue.
extern "C" __global__ void tt_epilogue(T_OUT* __restrict__ D, const T_OUT* __restrict__ C,
                                       const T_OUT* __restrict__ bias, const float* __restrict__ row_scale,
                                       const float* __restrict__ tensor_scales) {
  const unsigned long long total = (unsigned long long)OUT_ELEMS;
  for (unsigned long long o = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; o < total;
       o += (unsigned long long)gridDim.x * blockDim.x) {
#if TT_OP_CONV2D
    const long long row = (long long)(o % KO);
#else
    const long long row = (long long)(o % M);
#endif
    float s = (float)ALPHA_F64;
    if (TENSOR_SCALE) s *= tensor_scales[0] * tensor_scales[1];
    if (EPI_SCALE) s *= row_scale[row];
    float v = s * (float)to_f64(D[o]);
    if (READ_C) v += (float)BETA_F64 * (float)to_f64(C[o]);
    if (EPI_BIAS) v += (float)to_f64(bias[row]);
    if (EPI_ACT == 1) v = fmaxf(v, 0.0f);
    if (EPI_ACT == 2) v = 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
    if (EPI_ACT == 3) v = 0.5f * v * (1.0f + erff(v * 0.7071067811865476f));
    D[o] = from_f32<T_OUT>(v);
  }
}

// The activation alone, in place, in f32: the second kernel of a vendor baseline that fuses the
// rest of the epilogue but has no such activation (cuBLASLt and the exact, erf, GELU).
extern "C" __global__ void tt_activate(T_OUT* __restrict__ D) {
  const unsigned long long total = (unsigned long long)OUT_ELEMS;
  for (unsigned long long o = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; o < total;
       o += (unsigned long long)gridDim.x * blockDim.x) {
    float v = (float)to_f64(D[o]);
    if (EPI_ACT == 1) v = fmaxf(v, 0.0f);
    if (EPI_ACT == 2) v = 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
    if (EPI_ACT == 3) v = 0.5f * v * (1.0f + erff(v * 0.7071067811865476f));
    D[o] = from_f32<T_OUT>(v);
  }
}

// Compares every output element with the reference. An element passes when
// |out - ref| <= acc_tol * sq + out_tol * mag; poison (never written) and NaN always fail.
// stats: [0] max |err| (f64 bits), [1] max |err| / max(|ref|, 1e-30) (f64 bits), [2] failures,
// [3] first failing index (starts at ~0), [4] unwritten (poisoned) elements.
extern "C" __global__ void tt_compare(const T_OUT* __restrict__ out, const double* __restrict__ ref,
                                      const double* __restrict__ sq, const double* __restrict__ mag,
                                      double acc_tol, double out_tol, unsigned long long* stats) {
  const unsigned long long total = (unsigned long long)OUT_ELEMS;
  double worst_abs = 0.0, worst_rel = 0.0;
  unsigned long long fails = 0, unwritten = 0, first = ~0ull;
  for (unsigned long long o = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; o < total;
       o += (unsigned long long)gridDim.x * blockDim.x) {
    const T_OUT v = out[o];
    const bool poisoned = is_poison(v);
    const double x = to_f64(v);
    const double err = fabs(x - ref[o]);
    const bool bad = poisoned || !(err <= acc_tol * sq[o] + out_tol * mag[o]);
    if (poisoned) ++unwritten;
    if (bad) {
      ++fails;
      if (o < first) first = o;
    }
    if (!poisoned) {
      const double e = isnan(err) ? 1.0e300 : err;
      worst_abs = fmax(worst_abs, e);
      worst_rel = fmax(worst_rel, e / fmax(fabs(ref[o]), 1e-30));
    }
  }
  // Reduce across the warp first (the grid-stride loop keeps every lane alive to here).
  for (int off = 16; off > 0; off >>= 1) {
    worst_abs = fmax(worst_abs, __shfl_xor_sync(0xffffffffu, worst_abs, off));
    worst_rel = fmax(worst_rel, __shfl_xor_sync(0xffffffffu, worst_rel, off));
    fails += __shfl_xor_sync(0xffffffffu, fails, off);
    unwritten += __shfl_xor_sync(0xffffffffu, unwritten, off);
    const unsigned long long other = __shfl_xor_sync(0xffffffffu, first, off);
    first = other < first ? other : first;
  }
  if ((threadIdx.x & 31) != 0) return;
  // Non-negative doubles order like their bit patterns, so integer atomics find the maximum.
  atomicMax(&stats[0], (unsigned long long)__double_as_longlong(worst_abs));
  atomicMax(&stats[1], (unsigned long long)__double_as_longlong(worst_rel));
  if (fails) atomicAdd(&stats[2], fails);
  if (first != ~0ull) atomicMin(&stats[3], first);
  if (unwritten) atomicAdd(&stats[4], unwritten);
}
