// tensortune: device helpers shared by every generated kernel.
//
// Expects the generated header to define T_IN, T_OUT, T_EPI and the namespace `cfg` with
// THREADS-independent knobs, and CP_ASYNC (true only when compiling for sm_80 or newer).

namespace tt {

// A plain vector type of exactly BYTES bytes, for copies that must not be split.
template <int BYTES> struct vec_t;
template <> struct vec_t<16> { typedef uint4 type; };
template <> struct vec_t<8> { typedef uint2 type; };
template <> struct vec_t<4> { typedef unsigned int type; };
template <> struct vec_t<2> { typedef unsigned short type; };
template <> struct vec_t<1> { typedef unsigned char type; };

// Copies BYTES from global to shared memory, writing zeros when `pred` is false. With cp.async the
// copy is asynchronous and completes at the next cp_async_wait; otherwise it goes through registers.
template <int BYTES, bool ASYNC>
__device__ __forceinline__ void copy_vec(void* smem, const void* gmem, bool pred) {
  if constexpr (ASYNC && BYTES >= 4) {
#if __CUDA_ARCH__ >= 800
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    const int src_bytes = pred ? BYTES : 0;
    if constexpr (BYTES == 16) {
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes));
    } else {
      asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(s), "l"(gmem), "n"(BYTES), "r"(src_bytes));
    }
#else
    static_assert(!ASYNC, "cp.async needs sm_80 or newer");
#endif
  } else {
    typedef typename vec_t<BYTES>::type V;
    V v = V();
    if (pred) v = *reinterpret_cast<const V*>(gmem);
    *reinterpret_cast<V*>(smem) = v;
  }
}

template <bool ASYNC>
__device__ __forceinline__ void cp_async_commit() {
#if __CUDA_ARCH__ >= 800
  if constexpr (ASYNC) asm volatile("cp.async.commit_group;\n" ::);
#endif
}

// Waits until at most N committed groups of this thread are still in flight.
template <int N, bool ASYNC>
__device__ __forceinline__ void cp_async_wait() {
#if __CUDA_ARCH__ >= 800
  if constexpr (ASYNC) asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// Loads a ROWS x COLS tile (COLS contiguous in global memory and in shared memory, row pitch LD)
// whose top-left element is (row0, col0) of a matrix with leading dimension g_ld. Elements outside
// (row_lim, col_lim) read as zero. VEC_BYTES divides col_lim * sizeof(T), so a vector never
// straddles the edge.
// EVEN_ROWS / EVEN_COLS say the tiles divide the matrix along that axis (the shape is compiled in),
// so no element of any tile is out of bounds and the bounds checks and clamps compile away.
template <typename T, int ROWS, int COLS, int LD, int VEC_BYTES, int NTHREADS, bool ASYNC, bool EVEN_ROWS,
          bool EVEN_COLS>
__device__ __forceinline__ void load_tile(T* smem, const T* __restrict__ g, int g_ld, int row0, int col0, int row_lim,
                                          int col_lim) {
  constexpr int VE = VEC_BYTES / (int)sizeof(T);
  constexpr int PER_ROW = COLS / VE;
  constexpr int TOTAL = ROWS * PER_ROW;
  constexpr int ITERS = (TOTAL + NTHREADS - 1) / NTHREADS;
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    const int v = it * NTHREADS + (int)threadIdx.x;
    if (TOTAL % NTHREADS == 0 || v < TOTAL) {
      const int r = v / PER_ROW;
      const int c = (v % PER_ROW) * VE;
      const int gr = row0 + r;
      const int gc = col0 + c;
      const bool pred = (EVEN_ROWS || gr < row_lim) && (EVEN_COLS || gc < col_lim);
      // Clamped rather than selected: the address stays valid whatever `pred` says (with pred
      // false nothing is read), and no branch-free select of a kernel parameter is needed, which
      // made the compiler reload the base pointer from the constant bank for every vector.
      // 32-bit offsets suffice: no operand exceeds 2^31 elements (kernels::workload::MAX_ELEMENTS).
      const int off = (EVEN_ROWS ? gr : min(gr, row_lim - 1)) * g_ld + (EVEN_COLS ? gc : min(gc, col_lim - VE));
      copy_vec<VEC_BYTES, ASYNC>(smem + r * LD + c, g + off, pred);
    }
  }
}

// A zero the compiler cannot see through, one register per call. Accumulators start from these
// rather than from fill_fragment(0): NVRTC 13.0 gives fill_fragment's single zero register to every
// C element of the first wmma.mma and also to D[0]; ptxas then splits an f16 m16n16k16 MMA into two
// HMMAs and the second reads C[2..3] = D[0] after the first has written it (seen on sm_90: a
// config whose warps run a single MMA step got half its outputs wrong).
template <typename T> __device__ __forceinline__ T opaque_zero();
template <> __device__ __forceinline__ float opaque_zero<float>() {
  float z;
  asm volatile("mov.b32 %0, 0;" : "=f"(z));
  return z;
}
template <> __device__ __forceinline__ int opaque_zero<int>() {
  int z;
  asm volatile("mov.b32 %0, 0;" : "=r"(z));
  return z;
}
template <> __device__ __forceinline__ half opaque_zero<half>() {
  unsigned short z;
  asm volatile("mov.b16 %0, 0;" : "=h"(z));
  return __ushort_as_half(z);
}

// Conversions to and from the epilogue's arithmetic type.
__device__ __forceinline__ T_EPI to_epi(float x) { return (T_EPI)x; }
__device__ __forceinline__ T_EPI to_epi(int x) { return (T_EPI)x; }
__device__ __forceinline__ T_EPI to_epi(half x) { return (T_EPI)__half2float(x); }
__device__ __forceinline__ T_EPI to_epi(__nv_bfloat16 x) { return (T_EPI)__bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_epi(T_EPI x);
template <> __device__ __forceinline__ float from_epi<float>(T_EPI x) { return (float)x; }
template <> __device__ __forceinline__ int from_epi<int>(T_EPI x) { return (int)x; }
template <> __device__ __forceinline__ half from_epi<half>(T_EPI x) { return __float2half_rn((float)x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_epi<__nv_bfloat16>(T_EPI x) {
  return __float2bfloat16_rn((float)x);
}

// A load that bypasses L1: other blocks wrote this memory during the same launch.
template <typename T>
__device__ __forceinline__ T load_cg(const T* p) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 2, "4- or 2-byte accumulators");
  union {
    T t;
    unsigned u;
    unsigned short h;
  } bits;
  if constexpr (sizeof(T) == 4) {
    bits.u = __ldcg(reinterpret_cast<const unsigned*>(p));
  } else {
    bits.h = __ldcg(reinterpret_cast<const unsigned short*>(p));
  }
  return bits.t;
}

// VD consecutive outputs as one vector of VD * sizeof(T) bytes.
template <typename T, int VD>
union OutVec {
  typename vec_t<VD * (int)sizeof(T)>::type v;
  T e[VD];
};

}  // namespace tt
