#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <mma.h>
using namespace nvcuda;

// Fault injection (worker tests only): a statement run first in every generated kernel.
#ifndef TT_FAULT_HOOK
#define TT_FAULT_HOOK
#endif

// wgmma_gemm v20: D = act(alpha * sa * sb * scale[m] * op(A) op(B) + beta * C + bias[m])
// workload matmul/m1000n1000k1024/tn/bf16,f32,bf16/alpha=1,beta=1,epi=scale+bias+relu
#define KERNEL_NAME tt_wgmma_gemm_v20_bf16f32bf16_tn_m128n128_c2_s4_cl1_grid_g1_ws_ks2_0bbfa62a
#define TT_CLUSTER_ATTR __cluster_dims__(2, 1, 1)
#define TT_MAP_D 
#define TT_MAP_D_PTR nullptr
#define TT_MAP_C 
#define TT_MAP_C_PTR nullptr
#define TT_X_PARAM const __grid_constant__ tt::TmaDesc mapX
#define TT_X_MAP &mapX
#define TT_X_IN nullptr
#define TT_EPI_PARAMS , const T_OUT* __restrict__ bias_v, const float* __restrict__ rscale_v
#define TT_EPI_BIAS bias_v
#define TT_EPI_RSCALE rscale_v
#define TT_EPI_AB 1.0f
#define TT_GROUPED 0
namespace ns_tt_wgmma_gemm_v20_bf16f32bf16_tn_m128n128_c2_s4_cl1_grid_g1_ws_ks2_0bbfa62a {
typedef __nv_bfloat16 T_IN;
typedef __nv_bfloat16 T_OUT;
typedef float T_EPI;
typedef float T_ACCR;

namespace cfg {
constexpr int P = 1000;
constexpr int Q = 1000;
constexpr int K = 1024;
constexpr int BP = 128;
constexpr int BQ = 128;
constexpr int BK = 64;
constexpr int STAGES = 4;
constexpr int CONSUMERS = 2;
constexpr int CLUSTER = 1;
constexpr int GROUP = 1;
constexpr bool RASTER_M = false;
constexpr int TILES_P = 8;
constexpr int TILES_Q = 8;
constexpr int ACC_REGS = 64;
constexpr int PRODUCER_REGS = 40;
constexpr int BLOCKS_PER_SM = 1;
constexpr int GRID_CLUSTERS = 64;
constexpr int SPLIT = 2;
constexpr int SK_DP_TILES = 0;
constexpr int SK_ITERS = 0;
constexpr int CONSUMER_REGS = 232;
constexpr bool SPECIALIZED = true;
constexpr bool PINGPONG = false;
constexpr bool STREAM_K = false;
constexpr bool TMA_STORE = false;
constexpr bool Y_RESIDENT = false;
constexpr bool X_ONCE = false;
constexpr bool Y_ONCE = false;
constexpr int EPI_COLS = 64;
constexpr int C_SLOTS = 0;
constexpr bool C_ONCE = false;
constexpr bool GATHER = false;
constexpr bool IM2COL = false;
constexpr int GATHER_LAG = 2;
constexpr int CONV_C = 8;
constexpr int CONV_S = 1;
constexpr int IN_H = 1;
constexpr int IN_W = 1;
constexpr int OUT_H = 1;
constexpr int OUT_W = 1;
constexpr int PAD_H = 0;
constexpr int PAD_W = 0;
constexpr int STRIDE_H = 1;
constexpr int STRIDE_W = 1;
constexpr int DIL_H = 1;
constexpr int DIL_W = 1;
constexpr bool X_KMAJOR = true;
constexpr bool Y_KMAJOR = true;
constexpr bool EVEN_P = false;
constexpr bool EVEN_Q = false;
constexpr bool PAIRS_ALIGNED = true;
constexpr bool VEC_ALIGNED = true;
constexpr bool READ_C = true;
constexpr bool SWAP = false;
constexpr T_EPI ALPHA = 1.0f;
constexpr T_EPI BETA = 1.0f;
constexpr bool EPI_SCALE = true;
constexpr bool EPI_BIAS = true;
constexpr int EPI_ACT = 1;
constexpr bool TENSOR_SCALE = false;
constexpr bool FUSED = true;
constexpr int BATCH = 1;
constexpr int GROUPS = 0;
constexpr int LDQ = 1000;
}  // namespace cfg

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

//
// A block computes BP x BQ tiles of the (P, Q) view. Tiles of X and Y arrive by TMA into a ring of
// STAGES shared-memory stages with 128-byte swizzle, each stage completing on a `full` mbarrier;
// CONSUMERS warpgroups each own BP / CONSUMERS rows of the tile and multiply with wgmma straight
// from shared memory, keeping one group of wgmmas in flight, and free a stage on its `empty`
// mbarrier once the wgmmas that read it are done. With SPECIALIZED, a producer warpgroup (its
// registers given to the consumers with setmaxnreg) runs ahead through every tile of the block;
// otherwise thread 0 of the first consumer issues each load STAGES tiles ahead.
// With CLUSTER == 2, the two blocks of a cluster own vertically adjacent tiles that share Y: each
// loads half of Y (of an MN-major Y of three 64-column chunks, two and one) and multicasts it to
// both, so a stage is free only when both blocks' consumers have released it. With PINGPONG the
// two consumers take alternate tiles of the block whole, so one stores its results while the
// other multiplies. With PERSISTENT the grid is one wave (of BLOCKS_PER_SM blocks per SM) and each
// block walks tiles; tiles are ordered in bands of GROUP cluster rows (or, with RASTER_M, of
// GROUP tile columns), so the panels a wave shares stay in L2.
// With STREAM_K (persistent, cooperative) the tiles that would leave the last wave ragged are
// shared out by K tiles instead: all but the last whole wave go tile by tile as above, and the
// K tiles of the rest are cut into equal ranges, one per cluster (with at most half a wave of
// tiles, the grid holds the same whole number of clusters per tile, so that each range is one
// share of one tile: split-K through the workspace). A cluster runs its range first,
// then its whole tiles: the ranges are equal, so every cluster starts its whole tiles at the same
// moment and a wave's blocks walk K in step, reading the panels they share while those are in L2
// (v7 ran the whole tiles between the two ends of the range; blocks then drifted apart by up to a
// tile's K, and 8192^3 ran 1.7x slower than without stream-K). A range that ends inside a tile
// leaves a partial sum in the workspace (its first job, so nobody waits long for it); the block
// whose range ends a tile (the range's last job) adds the partials of the clusters before it and
// stores the tile.
// With IM2COL (wgmma_conv2d, CONV_C a multiple of BK) X is the im2col matrix of a convolution,
// loaded by TMA in its im2col mode: one copy per K tile brings BP output pixels' BK channels of
// one filter tap, zeros where the window leaves the input.
// With Y_RESIDENT (one column of tiles, a persistent grid: a pointwise convolution's filter, a GEMM
// whose M fits one tile) Y is loaded once per block, every K tile of it, and the ring carries X.
// With SWAP (a skinny GEMM, block_n 16 or 32: a decode step's few tokens) the view is the other
// way round: P = M rows of the user's A (X, 64-row wgmma tiles), Q = N columns of the user's B (Y,
// wgmma's n of 16 or 32), both K-major; D's element (p, q) is then at q * P + p, and the
// per-row epilogue vectors are indexed by p.
// With SPLIT > 1 (a grid of one tile per block that would leave most SMs idle) SPLIT blocks of a
// cluster share one tile, each summing a run of its K tiles; each leaves its sums in its ring
// (idle by then), the cluster meets, and each block adds its peers' sums of its share of the tile
// over distributed shared memory and stores that share. With CLUSTER == 2 as well, the cluster
// holds both tiles of a pair that shares Y, split alike: the two blocks of each run load their K
// tiles together and multicast Y between them.
// With BATCH > 1 or GROUPS > 0 the grid runs several problems (see `problems.rs`): cluster tiles
// are numbered problem after problem, a tile's problem shifts the outer TMA coordinate of the
// operands it has its own of and the offset of its D (tile_at); a group's columns are a run of
// the packed M, stored up to the group's end (EpiIn::q_end).
// With GATHER (wgmma_conv2d, any other channel count) no tensor map describes X: the whole
// producer warpgroup copies it 16 bytes at a time with cp.async
// into the same swizzled layout the TMA would have written (zeros outside the input), and
// releases a stage's full barrier GATHER_LAG tiles later, once those copies have landed.

namespace tt {
using namespace cfg;

// A CUtensorMap, opaque: cuda.h cannot be included under NVRTC.
struct __align__(64) TmaDesc {
  unsigned long long v[16];
};

constexpr int ROW_BYTES = 128;  // one K row of a stage: BK elements, the width of the swizzle
constexpr int X_STAGE = BP * ROW_BYTES;
constexpr int Y_STAGE = BQ * ROW_BYTES;
// Y_RESIDENT: the grid has one column of tiles, so every tile reads the same Y; each block loads
// all of Y's K tiles once, into a region of their own, and the ring carries X alone.
constexpr int STAGE_BYTES = X_STAGE + (Y_RESIDENT ? 0 : Y_STAGE);
constexpr int Y_SLOTS = Y_RESIDENT ? (K + BK - 1) / BK : STAGES;  // Y tiles shared memory holds
constexpr int CHUNK_BYTES = BK * ROW_BYTES;  // one 64-wide MN column block of an MN-major tile
constexpr int WG_P = PINGPONG ? BP : BP / CONSUMERS;  // rows of a tile one consumer computes
constexpr int MT = WG_P / 64;                // wgmma row tiles per consumer
constexpr int KSTEP_BYTES = 32;              // K of one wgmma, in bytes of a K-major row
constexpr int KSTEPS = ROW_BYTES / KSTEP_BYTES;
constexpr int MN_KSTEP_BYTES = 16 * ROW_BYTES;  // the same K step in an MN-major tile: 16 K rows (16-bit types)
constexpr int KTILES = (K + BK - 1) / BK;
constexpr int CP = TILES_P / CLUSTER;  // cluster rows
constexpr int CLUSTER_TILES = CP * TILES_Q * BATCH;  // grouped: TILES_Q counts every group's columns
constexpr int THREADS = 128 * (CONSUMERS + (SPECIALIZED ? 1 : 0));
// Warpgroups that release each stage: every consumer (cooperative) or the tile's owner (ping-pong),
// in every block of the cluster.
constexpr int RELEASES = (PINGPONG ? 1 : CONSUMERS) * CLUSTER;
constexpr int Y_ROWS = BQ / CLUSTER;  // rows of Y (K-major) each block of a cluster loads
constexpr int Y_CHUNKS = BQ / 64;  // 64-column chunks of an MN-major Y tile
constexpr int Y_PER_BLOCK = (Y_CHUNKS + CLUSTER - 1) / CLUSTER;  // of which each block of a cluster loads
constexpr int ACC_ALL = MT * ACC_REGS;         // accumulator registers of a consumer thread
static_assert(ACC_ALL % 4 == 0, "partial sums move in 16-byte vectors");
static_assert(EPI_COLS * sizeof(T_OUT) == 128, "a TMA-store piece is one 128-byte swizzle span wide");
static_assert(BK * (int)sizeof(T_IN) == ROW_BYTES, "a stage row is one 128-byte swizzle span");
static_assert(WG_P % 64 == 0, "a consumer owns whole 64-row wgmma tiles");
// SPLIT: each block of the cluster adds and stores SPLIT_NV of a thread's ACC_ALL / 4 register
// vectors; the partial sums of every consumer fit in the ring.
constexpr int SPLIT_NV = ACC_ALL / 4 / SPLIT;
constexpr int REGS_PER_J = ACC_REGS / (BQ / 8);  // accumulator registers of 8 columns of a row tile
static_assert(!SWAP || !TMA_STORE, "a swapped view's rows are columns of D: stored from registers");
static_assert(SPLIT == 1 || (!STREAM_K && !PINGPONG && !TMA_STORE && !Y_RESIDENT),
              "a K split is a grid of one tile per block and stores from registers");
static_assert(SPLIT == 1 || (SPLIT_NV * SPLIT * 4 == ACC_ALL &&
                             CONSUMERS * ACC_ALL * 128 * 4 <= STAGES * (X_STAGE + Y_STAGE)),
              "a K split's shares are whole vectors and its partial sums fit in the ring");

__device__ __forceinline__ unsigned smem_u32(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// 4, 8 or 16 bytes into shared memory at a shared-space address: an STS, where a store through a
// generic pointer (which ptxas cannot prove shared) costs an address translation.
template <typename V>
__device__ __forceinline__ void st_shared(unsigned addr, const V& v) {
  static_assert(sizeof(V) == 4 || sizeof(V) == 8 || sizeof(V) == 16, "STS moves 4, 8 or 16 bytes");
  if constexpr (sizeof(V) == 4) {
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(*reinterpret_cast<const unsigned*>(&v)) : "memory");
  } else if constexpr (sizeof(V) == 8) {
    const uint2 u = *reinterpret_cast<const uint2*>(&v);
    asm volatile("st.shared.v2.b32 [%0], {%1, %2};\n" ::"r"(addr), "r"(u.x), "r"(u.y) : "memory");
  } else {
    const uint4 u = *reinterpret_cast<const uint4*>(&v);
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(u.x), "r"(u.y), "r"(u.z), "r"(u.w)
                 : "memory");
  }
}

// 4 or 8 bytes from shared memory at a shared-space address: an LDS.
template <typename V>
__device__ __forceinline__ V ld_shared(unsigned addr) {
  static_assert(sizeof(V) == 4 || sizeof(V) == 8, "LDS of 4 or 8 bytes");
  V v;
  if constexpr (sizeof(V) == 4) {
    unsigned u;
    asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(u) : "r"(addr) : "memory");
    *reinterpret_cast<unsigned*>(&v) = u;
  } else {
    uint2 u;
    asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];\n" : "=r"(u.x), "=r"(u.y) : "r"(addr) : "memory");
    *reinterpret_cast<uint2*>(&v) = u;
  }
  return v;
}

// --- cluster ranks ---------------------------------------------------------------------------
// A cluster holds SPLIT runs of CLUSTER blocks: the block of hardware rank r is block r % CLUSTER
// of the tiles that share Y (its `cluster_rank`) and sums run r / CLUSTER of their K tiles (its
// `split_rank`); the pairs that load Y together are the blocks of one run.
__device__ __forceinline__ unsigned cta_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}

// SPLIT: which run of the tile's K tiles this block sums.
__device__ __forceinline__ int split_rank() {
  if constexpr (SPLIT == 1) {
    return 0;
  } else {
    return (int)(cta_rank() / CLUSTER);
  }
}

__device__ __forceinline__ unsigned cluster_rank() {
  if constexpr (CLUSTER == 1) {
    return 0;
  } else if constexpr (SPLIT == 1) {
    return cta_rank();
  } else {
    return cta_rank() % CLUSTER;
  }
}

// The hardware rank of block 0 of this block's run (0 without a K split).
__device__ __forceinline__ unsigned run_base() { return (unsigned)split_rank() * CLUSTER; }

// --- mbarriers -------------------------------------------------------------------------------
__device__ __forceinline__ void bar_init(unsigned long long* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count));
}

__device__ __forceinline__ void bar_expect(unsigned long long* bar, int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes)
               : "memory");
}

// Waits until the phase of `bar` with parity `parity` has completed.
__device__ __forceinline__ void bar_wait(unsigned long long* bar, int parity) {
  const unsigned addr = smem_u32(bar);
  unsigned done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(addr), "r"(parity)
        : "memory");
  } while (!done);
}

// Arrives on `bar` in every block of this block's run (the same shared-memory offset in each). The
// arrive releases at CTA scope only: what it orders are this warpgroup's wgmma reads of the stage,
// already complete (wgmma.wait_group), before the producers' TMA writes that wait on `bar`. A
// `.release.cluster` arrive costs a full GPU memory barrier (MEMBAR.ALL.GPU) per stage and made
// 2-block clusters half again slower than single blocks (H200, 2026-11-23).
__device__ __forceinline__ void bar_arrive_cluster(unsigned long long* bar) {
  if constexpr (CLUSTER == 1) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
  } else {
#pragma unroll
    for (int r = 0; r < CLUSTER; ++r) {
      asm volatile(
          "{\n.reg .b32 remote;\nmapa.shared::cluster.u32 remote, %0, %1;\n"
          "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n" ::"r"(smem_u32(bar)),
          "r"(run_base() + r)
          : "memory");
    }
  }
}

// Ping-pong order between the two consumers (named barriers 1 and 2, both warpgroups counted):
// a consumer starts a tile's K loop only once the other has finished the K loop of the tile
// before. Without it the second consumer, whose first ring slot is a whole tile ahead, would wait
// on a full barrier several phases early, where the parity of its phase is still ambiguous.
__device__ __forceinline__ void order_wait(int cw) {
  if constexpr (PINGPONG) asm volatile("bar.sync %0, 256;\n" ::"r"(2 - cw) : "memory");
}
__device__ __forceinline__ void order_signal(int cw) {
  if constexpr (PINGPONG) asm volatile("bar.arrive %0, 256;\n" ::"r"(1 + cw) : "memory");
}

// The cluster's first meeting, once thread 0 has set up the barriers. fence.mbarrier_init orders
// the inits before a relaxed arrive, which is all the peers need to see them; an arrive.release
// would add a full GPU memory barrier (MEMBAR.ALL.GPU) to every block's start.
__device__ __forceinline__ void cluster_sync_init() {
  if constexpr (CLUSTER > 1) {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
  } else {
    __syncthreads();
  }
}

// SPLIT: every thread of every block of the cluster, the producer warpgroup too; release and acquire
// order the partial sums written to shared memory before the peers read them.
__device__ __forceinline__ void split_sync() {
  if constexpr (SPLIT > 1) {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
  }
}

// --- TMA ---------------------------------------------------------------------------------------
// Copies the box at (c0, c1) (innermost first) of `map` into `dst`, completing on `bar`. ONCE
// (X_ONCE or Y_ONCE: an operand that streams through the L2 once, see Plan::reads_once) adds an L2
// evict-first hint to the copy.
template <bool ONCE>
__device__ __forceinline__ void tma_load(void* dst, const TmaDesc* map, int c0, int c1, unsigned long long* bar) {
  if constexpr (ONCE) {
    asm volatile(
        "{\n.reg .b64 policy;\ncreatepolicy.fractional.L2::evict_first.b64 policy, 1.0;\n"
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, "
        "%3}], [%4], policy;\n}\n" ::"r"(smem_u32(dst)),
        "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(smem_u32(bar))
        : "memory");
  } else {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
            smem_u32(dst)),
        "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(smem_u32(bar))
        : "memory");
  }
}

// The same into `dst` and `bar` of every block of this block's run (the whole cluster without a
// K split).
__device__ __forceinline__ void tma_load_multicast(void* dst, const TmaDesc* map, int c0, int c1,
                                                   unsigned long long* bar) {
  const unsigned short mask = (unsigned short)(((1u << CLUSTER) - 1) << run_base());
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%2, "
      "%3}], [%4], %5;\n" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(smem_u32(bar)), "h"(mask)
      : "memory");
}

// IM2COL: copies BP output pixels' channels c.. of one filter tap from a 4-D im2col map of an NHWC
// input into `dst`. (w, h, n) is the input position the first pixel's window starts at (it may
// lie in the padding), (ow, oh) the tap's offset in that window; the copy walks the pixels of the
// map's bounding box from there, W fastest, by the layer's strides, and reads what lies outside
// the input as zeros.
__device__ __forceinline__ void tma_load_im2col(void* dst, const TmaDesc* map, int c, int w, int h, int n,
                                                unsigned short ow, unsigned short oh, unsigned long long* bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, "
      "%5}], [%6], {%7, %8};\n" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<unsigned long long>(map)), "r"(c), "r"(w), "r"(h), "r"(n), "r"(smem_u32(bar)), "h"(ow),
      "h"(oh)
      : "memory");
}

// Brings a tensor map (a kernel parameter) into the TMA unit's descriptor cache ahead of the first
// copy through it, which would otherwise wait for the fetch; nullptr (no such map) does nothing.
__device__ __forceinline__ void prefetch_map(const TmaDesc* map) {
  if (map != nullptr) asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<unsigned long long>(map)) : "memory");
}

// Stores the box at (c0, c1) of `map` from 128-byte-swizzled `src` (this thread's bulk group).
// ONCE adds an L2 evict-first hint to the copy.
template <bool ONCE>
__device__ __forceinline__ void tma_store(const TmaDesc* map, const void* src, int c0, int c1) {
  if constexpr (ONCE) {
    asm volatile(
        "{\n.reg .b64 policy;\ncreatepolicy.fractional.L2::evict_first.b64 policy, 1.0;\n"
        "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group.L2::cache_hint [%0, {%2, %3}], [%1], policy;\n}\n" ::"l"(
            reinterpret_cast<unsigned long long>(map)),
        "r"(smem_u32(src)), "r"(c0), "r"(c1)
        : "memory");
  } else {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(
                     reinterpret_cast<unsigned long long>(map)),
                 "r"(smem_u32(src)), "r"(c0), "r"(c1)
                 : "memory");
  }
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's bulk groups still read shared memory.
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
// Makes this thread's shared-memory writes visible to the TMA (the async proxy).
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// --- wgmma -------------------------------------------------------------------------------------
// A shared-memory matrix descriptor for a 128-byte-swizzled tile at `addr` (1024-byte aligned
// swizzle atoms). K-major: rows of 128 bytes, 8-row groups SBO = 1024 apart (LBO unused).
// MN-major: 64-element columns blocks LBO = CHUNK_BYTES apart, 8-K-row groups SBO = 1024 apart.
__device__ __forceinline__ unsigned long long make_desc(unsigned addr, unsigned lbo) {
  return (unsigned long long)((addr & 0x3FFFF) >> 4) | ((unsigned long long)(lbo >> 4) << 16) |
         ((unsigned long long)(1024 >> 4) << 32) | (1ull << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// wgmma.m64n128k16.f32.bf16.bf16: X K-major, Y K-major.
__device__ __forceinline__ void mma_tile(T_ACCR (&d)[ACC_REGS], unsigned long long dx, unsigned long long dy) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(dx), "l"(dy), "r"(1));
}

__device__ __forceinline__ void acc_pair(const T_ACCR (&a)[ACC_REGS], int j, int h, T_EPI& v0, T_EPI& v1) {
  v0 = to_epi(a[4 * j + 2 * h]);
  v1 = to_epi(a[4 * j + 2 * h + 1]);
}

// Pins every accumulator register at this point of the program: the compiler may not move a read
// or write of them across it (wgmma's wait has no register operands, so without this a read of
// the sums could be scheduled before the wait, and ptxas then serializes the wgmmas, C7514).
__device__ __forceinline__ void pin(float& r) { asm volatile("" : "+f"(r)::"memory"); }
__device__ __forceinline__ void pin(int& r) { asm volatile("" : "+r"(r)::"memory"); }
__device__ __forceinline__ void pin(unsigned& r) { asm volatile("" : "+r"(r)::"memory"); }
template <int ROWS, int REGS>
__device__ __forceinline__ void pin_all(T_ACCR (&acc)[ROWS][REGS]) {
#pragma unroll
  for (int t = 0; t < ROWS; ++t) {
#pragma unroll
    for (int i = 0; i < REGS; ++i) pin(acc[t][i]);
  }
}

// --- tiles -------------------------------------------------------------------------------------
// Position (along, across) of step `ct` of a walk over an ALONG x ACROSS grid that goes along its
// first dimension first: with BAND > 1 in bands of BAND lines, each band walked across the whole
// second dimension before the next (every band but the last has BAND lines, the last ALONG % BAND
// when that is not zero); with BAND 1 down the whole first dimension, then one step across. Every
// divisor is a constant, so no division is computed at run time.
template <int ALONG, int ACROSS, int BAND>
__device__ __forceinline__ void banded(int ct, int& along, int& across) {
  if constexpr (BAND > 1) {
    constexpr int PER_BAND = BAND * ACROSS;
    constexpr int LAST_LINES = ALONG % BAND == 0 ? BAND : ALONG % BAND;
    const int first = (ct / PER_BAND) * BAND, r = ct % PER_BAND;
    if (first + BAND <= ALONG) {
      along = first + r % BAND;
      across = r / BAND;
    } else {
      along = first + r % LAST_LINES;
      across = r / LAST_LINES;
    }
  } else {
    along = ct % ALONG;
    across = ct / ALONG;
  }
}

// The (P, Q) tile of cluster tile `ct` for the block of cluster rank `rank`: the walk goes down
// the cluster rows first (RASTER_M false, bands of GROUP cluster rows) or along the tile columns
// first (RASTER_M, bands of GROUP columns).
__device__ __forceinline__ void tile_of(int ct, int rank, int& tp, int& tq) {
  int pc;
  if constexpr (RASTER_M) {
    banded<TILES_Q, CP, GROUP>(ct, tq, pc);
  } else {
    banded<CP, TILES_Q, GROUP>(ct, pc, tq);
  }
  tp = pc * CLUSTER + rank;
}

// --- problems (BATCH > 1 or GROUPS > 0) -----------------------------------------------------
// `banded`'s walk with extents known at run time only (a group's tile columns).
__device__ __forceinline__ void banded_rt(int ct, int along_n, int across_n, int band, int& along, int& across) {
  if (band > 1) {
    const int per_band = band * across_n, first = (ct / per_band) * band, r = ct % per_band;
    const int lines = first + band <= along_n ? band : along_n - first;
    along = first + r % lines;
    across = r / lines;
  } else {
    along = ct % along_n;
    across = ct / along_n;
  }
}

// The tile of cluster tile `ct` for the block of cluster rank `rank`: its row tp and column tq
// (within its group when grouped), its problem, the first column of its problem (grouped: its
// group's start in the packed M; otherwise 0, so that a single problem's code is as it was) and
// the end of that problem's columns.
// Batched: each problem has CP * TILES_Q cluster tiles in a row, walked as a single problem's.
// Grouped: group g has cluster tiles CP * GROUP_COLS[g] .. CP * GROUP_COLS[g + 1], walked as a
// problem of its own columns (the schedule of kernels::grouped::TileSchedule); its group is found
// by an unrolled comparison with every boundary, so the table stays in constants.
__device__ __forceinline__ void tile_at(int ct, int rank, int& tp, int& tq, int& prob, int& qb, int& q_end) {
#if TT_GROUPED
  int c0 = 0, c1 = GROUP_COLS[1], m1 = GROUP_M0[1];
  qb = 0;
  prob = 0;
#pragma unroll
  for (int i = 1; i < GROUPS; ++i) {
    if (ct >= CP * GROUP_COLS[i]) {
      prob = i;
      c0 = GROUP_COLS[i];
      c1 = GROUP_COLS[i + 1];
      qb = GROUP_M0[i];
      m1 = GROUP_M0[i + 1];
    }
  }
  int pc;
  if constexpr (RASTER_M) {
    banded_rt(ct - CP * c0, c1 - c0, CP, GROUP, tq, pc);
  } else {
    banded_rt(ct - CP * c0, CP, c1 - c0, GROUP, pc, tq);
  }
  tp = pc * CLUSTER + rank;
  q_end = m1;
#else
  prob = 0;
  if constexpr (BATCH > 1) {
    prob = ct / (CP * TILES_Q);
    ct -= prob * (CP * TILES_Q);
  }
  tile_of(ct, rank, tp, tq);
  qb = 0;
  q_end = Q;
#endif
}

// The first row (within its problem) of consumer cw's share of row tile tp.
__device__ __forceinline__ int share_p0(int tp, int cw) { return tp * BP + (PINGPONG ? 0 : cw * WG_P); }

// The outer TMA coordinate of problem `prob`'s operands: X (the user's B, one per problem) is
// stacked along its rows (K-major: N rows each) or its K (MN-major: K rows each); a batched Y (the
// user's A) likewise, while a grouped Y is the packed A, whose rows tile_at's qb already counts.
__device__ __forceinline__ int x_outer(int prob) { return prob * (X_KMAJOR ? P : K); }
__device__ __forceinline__ int y_outer_q(int prob) { return BATCH > 1 && Y_KMAJOR ? prob * Q : 0; }
__device__ __forceinline__ int y_outer_k(int prob) { return BATCH > 1 && !Y_KMAJOR ? prob * K : 0; }
// Where problem `prob`'s D (and C) starts: a batched problem's P x Q one after another; the groups
// share the packed D (row stride LDQ).
__device__ __forceinline__ size_t d_offset(int prob) { return BATCH > 1 ? (size_t)prob * P * Q : 0; }

// --- work list -------------------------------------------------------------------------------
// A job: K tiles [k0, k1) of cluster tile `ct`. FULL covers the whole K extent; PARTIAL leaves its
// sum in the workspace; TAIL ends the tile and adds the partials of the clusters before it.
enum { WORK_FULL = 0, WORK_PARTIAL = 1, WORK_TAIL = 2 };
struct Work {
  int ct, k0, k1, kind;
};

// The first stream-K iteration (a K tile of the shared-out region) of cluster c.
__device__ __forceinline__ long long sk_begin(int c) { return (long long)c * SK_ITERS / GRID_CLUSTERS; }

// The jobs of one cluster, in the order it runs them: its stream-K range first (the partial sum
// of the tile it ends inside of, if any; the range's whole tiles; the tile it starts inside of,
// if any, which it finishes), then its tile-by-tile tiles. Without STREAM_K, just the tiles
// first, first + GRID_CLUSTERS, ... Recomputed from (cluster, job) where needed rather
// than kept: registers are what the consumers are short of. The grid is fixed at compile time,
// so the divisions here are by constants.
struct WorkList {
  int c, kr;  // the cluster, and with SPLIT the block's rank in it

  __device__ __forceinline__ void init(int cluster, int split_rank) {
    c = cluster;
    kr = split_rank;
  }

  // Stream-K bounds of this cluster: its range [s, e), the tiles it starts and ends in, and
  // whether it starts or ends inside one; and from them its jobs there: a partial first when the
  // range ends inside a tile, the whole tiles from full_lo(), a tail when it starts inside one.
  struct Range {
    long long s, e;
    int t_first, t_last;
    bool starts_inside, ends_inside;

    __device__ __forceinline__ bool empty() const { return e <= s; }
    __device__ __forceinline__ int front() const { return !empty() && ends_inside ? 1 : 0; }
    __device__ __forceinline__ int full_lo() const { return t_first + (starts_inside ? 1 : 0); }
    __device__ __forceinline__ int n_full() const {
      return empty() ? 0 : max(0, t_last + 1 - (ends_inside ? 1 : 0) - full_lo());
    }
    __device__ __forceinline__ int tail() const {
      return !empty() && starts_inside && (t_first < t_last || !ends_inside) ? 1 : 0;
    }
  };

  __device__ __forceinline__ Range range() const {
    Range r;
    r.s = sk_begin(c);
    r.e = sk_begin(c + 1);
    r.t_first = (int)(r.s / KTILES);
    r.t_last = (int)((r.e - 1) / KTILES);
    r.starts_inside = r.s % KTILES != 0;
    r.ends_inside = r.e % KTILES != 0;
    return r;
  }

  __device__ __forceinline__ int n_dp() const {
    if constexpr (STREAM_K) return SK_DP_TILES / GRID_CLUSTERS;
    return c < CLUSTER_TILES ? (CLUSTER_TILES - c + GRID_CLUSTERS - 1) / GRID_CLUSTERS : 0;
  }

  __device__ __forceinline__ int count() const {
    if constexpr (!STREAM_K) return n_dp();
    const Range r = range();
    return r.front() + n_dp() + r.n_full() + r.tail();
  }

  // The segment of stream-K tile t (counted from the first shared-out tile) within [s, e).
  __device__ __forceinline__ static Work segment(const Range& r, int t, int kind) {
    const long long t0 = (long long)t * KTILES;
    Work w;
    w.ct = SK_DP_TILES + t;
    w.k0 = (int)(max(r.s, t0) - t0);
    w.k1 = (int)(min(r.e, t0 + KTILES) - t0);
    w.kind = kind;
    return w;
  }

  __device__ __forceinline__ Work at(int i) const {
    Work w;
    w.k0 = 0;
    w.k1 = KTILES;
    w.kind = WORK_FULL;
    if constexpr (STREAM_K) {
      const Range r = range();
      if (r.front()) {
        if (i == 0) return segment(r, r.t_last, WORK_PARTIAL);
        --i;
      }
      if (i < r.n_full()) return segment(r, r.full_lo() + i, WORK_FULL);
      i -= r.n_full();
      if (r.tail()) {
        if (i == 0) return segment(r, r.t_first, WORK_TAIL);
        --i;
      }
    }
    w.ct = c + i * GRID_CLUSTERS;
    if constexpr (SPLIT > 1) {
      w.k0 = kr * KTILES / SPLIT;
      w.k1 = (kr + 1) * KTILES / SPLIT;
    }
    return w;
  }
};

// Where the loads of this block are: the next (job, K tile) and the ring slot it fills.
struct Loader {
  int jobs, job, kt, stage, phase;
  Work w;
};

__device__ __forceinline__ void loader_init(Loader& L, const WorkList& wl) {
  L.jobs = wl.count();
  L.job = 0;
  L.stage = 0;
  L.phase = 0;
  if (L.jobs > 0) {
    L.w = wl.at(0);
    L.kt = L.w.k0;
  }
}

__device__ __forceinline__ bool loader_more(const Loader& L) { return L.job < L.jobs; }

// Loads this block's part of the Y tile at columns q0.., K k0.. (all of it, or with a cluster its
// share, multicast to every block of the cluster).
__device__ __forceinline__ void load_y(unsigned char* y, const TmaDesc* mapY, int q0, int k0,
                                       unsigned long long* bar, int rank) {
  if constexpr (Y_KMAJOR) {
    const int r0 = rank * Y_ROWS;
    if constexpr (CLUSTER == 1) {
      tma_load<Y_ONCE>(y, mapY, k0, q0, bar);
    } else {
      tma_load_multicast(y + r0 * ROW_BYTES, mapY, k0, q0 + r0, bar);
    }
  } else {
    // Each block loads a run of Y_PER_BLOCK chunks; with an odd number of chunks (192 columns)
    // the last block's run is shorter.
#pragma unroll
    for (int i = 0; i < Y_PER_BLOCK; ++i) {
      const int c = rank * Y_PER_BLOCK + i;
      if constexpr (CLUSTER == 1) {
        tma_load<Y_ONCE>(y + c * CHUNK_BYTES, mapY, q0 + 64 * c, k0, bar);
      } else if (Y_CHUNKS % CLUSTER == 0 || c < Y_CHUNKS) {
        tma_load_multicast(y + c * CHUNK_BYTES, mapY, q0 + 64 * c, k0, bar);
      }
    }
  }
}

// The ring slot after `stage`, and the parity of its phase (flipped when the ring wraps).
__device__ __forceinline__ void ring_next(int& stage, int& phase) {
  if (++stage == STAGES) {
    stage = 0;
    phase ^= 1;
  }
}

// Moves the loader to its next K tile and ring slot.
__device__ __forceinline__ void loader_advance(Loader& L, const WorkList& wl) {
  if (++L.kt == L.w.k1) {
    if (++L.job < L.jobs) {
      L.w = wl.at(L.job);
      L.kt = L.w.k0;
    }
  }
  ring_next(L.stage, L.phase);
}

// With a cluster, a block must not exit while a peer may still arrive on its barriers: the peers'
// consumers release every stage this block's producer filled (bar_arrive_cluster). Once each ring
// slot's last fill has been released by every consumer of the cluster (the wait the next fill
// would make), no arrive is on its way here any more, and the peers' multicast copies into this
// block's ring were all awaited by its own consumers. This tail replaces a closing cluster
// meeting, whose arrive.release put a GPU-wide memory barrier (MEMBAR.ALL.GPU) in every thread.
// Called by the thread that issued the loads, after its last one.
__device__ __forceinline__ void loader_tail(Loader& L, unsigned long long* empty) {
  if constexpr (CLUSTER > 1) {
#pragma unroll 1
    for (int s = 0; s < STAGES; ++s) {
      bar_wait(&empty[L.stage], L.phase ^ 1);
      ring_next(L.stage, L.phase);
    }
  }
}

// Issues the loads of the loader's next K tile into its stage (waiting until the stage is free in
// every block of the cluster), then advances it. Called by one thread.
__device__ __forceinline__ void load_next(Loader& L, const WorkList& wl, const TmaDesc* mapX, const TmaDesc* mapY,
                                          unsigned char* sX, unsigned char* sY, unsigned long long* full,
                                          unsigned long long* empty, int rank) {
  bar_wait(&empty[L.stage], L.phase ^ 1);
  unsigned long long* bar = &full[L.stage];
  bar_expect(bar, STAGE_BYTES);
  int tp, tq, prob, qb, q_end;
  tile_at(L.w.ct, rank, tp, tq, prob, qb, q_end);
  const int p0 = tp * BP, q0 = qb + tq * BQ, k0 = L.kt * BK, xo = x_outer(prob);
  unsigned char* x = sX + L.stage * X_STAGE;
  if constexpr (IM2COL) {
    // K index k0 = (r * CONV_S + s) * CONV_C + c; a K tile lies within one tap (CONV_C % BK == 0).
    const int tap = k0 / CONV_C, c = k0 % CONV_C;
    const int img = p0 / (OUT_H * OUT_W), pix = p0 % (OUT_H * OUT_W);
    tma_load_im2col(x, mapX, c, (pix % OUT_W) * STRIDE_W - PAD_W, (pix / OUT_W) * STRIDE_H - PAD_H, img,
                    (unsigned short)((tap % CONV_S) * DIL_W), (unsigned short)((tap / CONV_S) * DIL_H), bar);
  } else if constexpr (X_KMAJOR) {
    tma_load<X_ONCE>(x, mapX, k0, p0 + xo, bar);
  } else {
#pragma unroll
    for (int c = 0; c < BP / 64; ++c) tma_load<X_ONCE>(x + c * CHUNK_BYTES, mapX, p0 + 64 * c, k0 + xo, bar);
  }
  if constexpr (!Y_RESIDENT) load_y(sY + L.stage * Y_STAGE, mapY, q0 + y_outer_q(prob), k0 + y_outer_k(prob), bar, rank);
  loader_advance(L, wl);
}

// Y_RESIDENT: loads every K tile of Y (the grid's one column of tiles) into its slot, completing on
// `bar`. Called by one thread, before the first X tile.
__device__ __forceinline__ void load_y_resident(const TmaDesc* mapY, unsigned char* sY, unsigned long long* bar,
                                                int rank) {
  if constexpr (Y_RESIDENT) {
    bar_expect(bar, Y_SLOTS * Y_STAGE);
#pragma unroll 1
    for (int kt = 0; kt < Y_SLOTS; ++kt) load_y(sY + kt * Y_STAGE, mapY, 0, kt * BK, bar, rank);
  }
}

// --- im2col gather (GATHER) -------------------------------------------------------------------
// Copies 16 bytes from `src` into `dst`, or writes 16 zero bytes when !valid (nothing is read).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void bar_arrive(unsigned long long* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}

// Thread t of the producer warpgroup copies 16-byte unit t % 8 of rows t / 8, t / 8 + 16, ... of
// the BP x BK tile of X at pixel rows p0.. and K k0..: row p is output pixel p = (n, oh, ow), K
// index kk = (r * CONV_S + s) * CONV_C + c. A unit holds 16 bytes of channels of one filter tap
// (CONV_C is a multiple of the unit), so its tap is computed once per tile. Unit u of row r lands
// at unit u ^ (r % 8) of the row: the 128-byte swizzle of a K-major stage.
__device__ __forceinline__ void gather_x(unsigned char* x, const T_IN* __restrict__ in, int p0, int k0, int t) {
  constexpr int UNIT = 16 / (int)sizeof(T_IN);
  const int u = t % 8;
  const int kk = k0 + u * UNIT;
  const int tap = kk / CONV_C, c = kk % CONV_C;
  const int dh = (tap / CONV_S) * DIL_H - PAD_H, dw = (tap % CONV_S) * DIL_W - PAD_W;
  const bool k_in = kk < K;
#pragma unroll 1
  for (int row = t / 8; row < BP; row += 16) {
    const int p = p0 + row;
    const int img = p / (OUT_H * OUT_W), pix = p % (OUT_H * OUT_W);
    const int ih = (pix / OUT_W) * STRIDE_H + dh, iw = (pix % OUT_W) * STRIDE_W + dw;
    const bool ok = k_in && p < P && ih >= 0 && ih < IN_H && iw >= 0 && iw < IN_W;
    const T_IN* src = ok ? in + (((size_t)img * IN_H + ih) * IN_W + iw) * CONV_C + c : in;
    cp_async16(x + row * ROW_BYTES + ((u ^ (row & 7)) << 4), src, ok);
  }
}

// The producer warpgroup of a GATHER kernel, every thread: thread 0 loads Y by TMA as load_next
// does; all gather X. The full barrier of a stage counts thread 0's expect_tx arrive and one arrive
// per thread, made once the thread's copies into the stage have completed and been made visible
// to the async proxy (wgmma reads shared memory through it). Copies of GATHER_LAG tiles stay in
// flight; GATHER_LAG <= STAGES - 2, because a consumer frees a stage only once the next one is
// full, so a larger lag waits forever.
__device__ __forceinline__ void gather_all(Loader& L, const WorkList& wl, const T_IN* __restrict__ in,
                                           const TmaDesc* mapY, unsigned char* sX, unsigned char* sY,
                                           unsigned long long* full, unsigned long long* empty, int rank) {
  const int t = threadIdx.x % 128;
  int issued = 0;
#pragma unroll 1
  while (loader_more(L)) {
    const int stage = L.stage;
    bar_wait(&empty[stage], L.phase ^ 1);
    int tp, tq;
    tile_of(L.w.ct, rank, tp, tq);
    if (t == 0) {
      bar_expect(&full[stage], Y_STAGE);
      load_y(sY + stage * Y_STAGE, mapY, tq * BQ, L.kt * BK, &full[stage], rank);
    }
    gather_x(sX + stage * X_STAGE, in, tp * BP, L.kt * BK, t);
    cp_async_commit();
    if (++issued > GATHER_LAG) {
      cp_async_wait<GATHER_LAG>();
      fence_async_smem();
      bar_arrive(&full[(stage + STAGES - GATHER_LAG) % STAGES]);
    }
    loader_advance(L, wl);
  }
  cp_async_wait<0>();
  fence_async_smem();
#pragma unroll 1
  for (int i = min(issued, GATHER_LAG); i >= 1; --i) bar_arrive(&full[(L.stage + STAGES - i) % STAGES]);
}

// --- stream-K partial sums -------------------------------------------------------------------
// The workspace: a flag per (block, consumer), padded to 256 bytes, then a slot per (block,
// consumer) of ACC_ALL registers of its 128 threads, stored register-vector-major so that each
// 16-byte access of a warp is contiguous. A flag is 1 while its slot holds a sum nobody has added
// yet; the reader sets it back to 0, so a launch leaves the flags as it found them (zero).
constexpr int SK_FLAGS_BYTES = ((GRID_CLUSTERS * CLUSTER * CONSUMERS * 4 + 255) / 256) * 256;

__device__ __forceinline__ uint4* sk_slot(unsigned char* ws, int block, int cw) {
  return reinterpret_cast<uint4*>(ws + SK_FLAGS_BYTES) + (size_t)(block * CONSUMERS + cw) * (ACC_ALL / 4) * 128;
}
__device__ __forceinline__ int* sk_flag(unsigned char* ws, int block, int cw) {
  return reinterpret_cast<int*>(ws) + block * CONSUMERS + cw;
}

// Named barrier of consumer cw's warpgroup alone (ids 1 and 2 are ping-pong's, 5 the K split's
// meeting of the consumers): 3 and 4, and 6 for a third consumer.
__device__ __forceinline__ void consumer_sync(int cw) {
  if constexpr (CONSUMERS > 2) {
    asm volatile("bar.sync %0, 128;\n" ::"r"(cw < 2 ? 3 + cw : 4 + cw) : "memory");
  } else {
    asm volatile("bar.sync %0, 128;\n" ::"r"(3 + cw) : "memory");
  }
}

__device__ __forceinline__ void acc_add(float& a, unsigned b) { a += __uint_as_float(b); }
__device__ __forceinline__ void acc_add(int& a, unsigned b) { a += (int)b; }
__device__ __forceinline__ void acc_add(unsigned& a, unsigned b) {
  __half2 x = *reinterpret_cast<__half2*>(&a);
  const __half2 y = *reinterpret_cast<const __half2*>(&b);
  x = __hadd2(x, y);
  a = *reinterpret_cast<unsigned*>(&x);
}
__device__ __forceinline__ unsigned acc_bits(float a) { return __float_as_uint(a); }
__device__ __forceinline__ unsigned acc_bits(int a) { return (unsigned)a; }
__device__ __forceinline__ unsigned acc_bits(unsigned a) { return a; }

// Accumulator registers 4v..4v+3 of a consumer thread (across its row tiles) as one 16-byte vector,
// the unit in which partial sums move; and a vector of partial sums added back into them.
__device__ __forceinline__ uint4 acc_vec(const T_ACCR (&acc)[MT][ACC_REGS], int v) {
  const int r = 4 * v;
  uint4 u;
  u.x = acc_bits(acc[(r + 0) / ACC_REGS][(r + 0) % ACC_REGS]);
  u.y = acc_bits(acc[(r + 1) / ACC_REGS][(r + 1) % ACC_REGS]);
  u.z = acc_bits(acc[(r + 2) / ACC_REGS][(r + 2) % ACC_REGS]);
  u.w = acc_bits(acc[(r + 3) / ACC_REGS][(r + 3) % ACC_REGS]);
  return u;
}
__device__ __forceinline__ void acc_add_vec(T_ACCR (&acc)[MT][ACC_REGS], int v, uint4 u) {
  const int r = 4 * v;
  acc_add(acc[(r + 0) / ACC_REGS][(r + 0) % ACC_REGS], u.x);
  acc_add(acc[(r + 1) / ACC_REGS][(r + 1) % ACC_REGS], u.y);
  acc_add(acc[(r + 2) / ACC_REGS][(r + 2) % ACC_REGS], u.z);
  acc_add(acc[(r + 3) / ACC_REGS][(r + 3) % ACC_REGS], u.w);
}

// Leaves consumer cw's accumulators in this block's slot and raises its flag.
__device__ __forceinline__ void sk_store(unsigned char* ws, int block, int cw, const T_ACCR (&acc)[MT][ACC_REGS]) {
  uint4* slot = sk_slot(ws, block, cw);
  const int t = threadIdx.x % 128;
#pragma unroll
  for (int v = 0; v < ACC_ALL / 4; ++v) __stcg(slot + v * 128 + t, acc_vec(acc, v));
  consumer_sync(cw);
  if (t == 0) {
    asm volatile("fence.acq_rel.gpu;\nst.relaxed.gpu.global.b32 [%0], 1;\n" ::"l"(sk_flag(ws, block, cw)) : "memory");
  }
}

// Waits for the sum in `block`'s slot, adds it to consumer cw's accumulators and lowers the flag.
__device__ __forceinline__ void sk_add(unsigned char* ws, int block, int cw, T_ACCR (&acc)[MT][ACC_REGS]) {
  const int t = threadIdx.x % 128;
  int* flag = sk_flag(ws, block, cw);
  if (t == 0) {
    int ready = 0;
    do {
      asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(ready) : "l"(flag) : "memory");
    } while (ready != 1);
  }
  consumer_sync(cw);
  const uint4* slot = sk_slot(ws, block, cw);
  // In batches of SK_BATCH vectors, so the loads in flight do not crowd out the accumulators.
  constexpr int SK_BATCH = 8;
#pragma unroll
  for (int v0 = 0; v0 < ACC_ALL / 4; v0 += SK_BATCH) {
    uint4 u[SK_BATCH];
#pragma unroll
    for (int b = 0; b < SK_BATCH; ++b) {
      if (v0 + b < ACC_ALL / 4) u[b] = __ldcg(slot + (v0 + b) * 128 + t);
    }
#pragma unroll
    for (int b = 0; b < SK_BATCH; ++b) {
      if (v0 + b < ACC_ALL / 4) acc_add_vec(acc, v0 + b, u[b]);
    }
    asm volatile("" ::: "memory");
  }
  consumer_sync(cw);
  if (t == 0) asm volatile("st.relaxed.gpu.global.b32 [%0], 0;\n" ::"l"(flag) : "memory");
}

// --- K split in a cluster (SPLIT) ---------------------------------------------------------------
// Leaves consumer cw's sums in this block's ring (vector v of thread t at [cw][v][t], 16 bytes),
// meets the cluster, and adds every peer's sums of vectors [kr * SPLIT_NV, (kr + 1) * SPLIT_NV),
// the share of the tile this block stores. The ring is idle: every consumer has waited for its
// last wgmmas and the producer loads nothing more (named barrier 5, the consumers alone).
__device__ __forceinline__ void split_add(unsigned char* ring, int cw, int kr, int rank, T_ACCR (&acc)[MT][ACC_REGS]) {
  const int t = threadIdx.x % 128;
  asm volatile("bar.sync 5, %0;\n" ::"n"(CONSUMERS * 128) : "memory");
  uint4* mine = reinterpret_cast<uint4*>(ring) + cw * (ACC_ALL / 4) * 128;
  const unsigned mine_s = smem_u32(mine);
#pragma unroll
  for (int v = 0; v < ACC_ALL / 4; ++v) st_shared(mine_s + (unsigned)((v * 128 + t) * 16), acc_vec(acc, v));
  split_sync();
#pragma unroll 1
  for (int d = 1; d < SPLIT; ++d) {
    unsigned peer;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n"
                 : "=r"(peer)
                 : "r"(smem_u32(mine)), "r"((kr + d) % SPLIT * CLUSTER + rank));
#pragma unroll
    for (int v = 0; v < ACC_ALL / 4; ++v) {
      if (v / SPLIT_NV != kr) continue;
      uint4 u;
      asm volatile("ld.shared::cluster.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w)
                   : "r"(peer + (unsigned)((v * 128 + t) * 16))
                   : "memory");
      acc_add_vec(acc, v, u);
    }
  }
  // No block leaves (its shared memory with it) while a peer may still read it.
  split_sync();
}

// Whether this block stores the pair of row tile t, column group j, half h: always, or with SPLIT
// when the register vector holding it is in the block's share.
__device__ __forceinline__ bool stores_pair(int t, int j, int h, int kr) {
  if constexpr (SPLIT == 1) {
    return true;
  } else {
    return (t * ACC_REGS + j * REGS_PER_J + h * (REGS_PER_J / 2)) / 4 / SPLIT_NV == kr;
  }
}

// --- epilogue ----------------------------------------------------------------------------------
template <typename T> struct Pair;
template <> struct Pair<float> { typedef float2 type; };
template <> struct Pair<int> { typedef int2 type; };
template <> struct Pair<half> { typedef __half2 type; };
template <> struct Pair<__nv_bfloat16> { typedef __nv_bfloat162 type; };

// What the epilogue reads besides the accumulators: C, the per-row bias and scale vectors (indexed
// by the view's column q, the user's row m) and the product of the FP8 inputs' tensor scales.
struct EpiIn {
  const T_OUT* __restrict__ c;
  const T_OUT* __restrict__ bias;
  const float* __restrict__ rscale;
  float ab;
  // GROUPS: the end of the tile's group in the packed M, where its stores end (`GROUPS > 0 ?
  // C.q_end : Q` at each bound: a helper function there changed single problems' machine code).
  int q_end;
};

// GELU, tanh form (as cuBLASLt's CUBLASLT_EPILOGUE_GELU).
__device__ __forceinline__ float gelu_tanh(float x) {
  return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}

// GELU, exact (erf) form (PyTorch's nn.GELU() default; cuBLASLt has no such epilogue).
__device__ __forceinline__ float gelu_erf(float x) { return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f)); }

// D = act(alpha * ab * scale[m] * acc + beta * C + bias[m]) for the element at offset `off`, row m
// of the user's D (column q of the view, or with SWAP its row p); vectors are read only for rows
// inside D. C_GIVEN: the caller read C's element (16 bytes at a time) and passes it as `c`.
template <bool C_GIVEN = false>
__device__ __forceinline__ T_EPI epilogue(T_EPI acc, const EpiIn& C, size_t off, int m, T_EPI c = (T_EPI)0) {
  T_EPI v = ALPHA == (T_EPI)1 ? acc : ALPHA * acc;
  if constexpr (TENSOR_SCALE) v = v * C.ab;
  const bool in_q = SWAP ? EVEN_P || m < P : EVEN_Q || m < Q;
  if constexpr (EPI_SCALE) v = v * (in_q ? C.rscale[m] : 0.0f);
  if constexpr (READ_C) v = v + BETA * (C_GIVEN ? c : to_epi(C.c[off]));
  if constexpr (EPI_BIAS) v = v + (in_q ? to_epi(C.bias[m]) : (T_EPI)0);
  if constexpr (EPI_ACT == 1) v = v > (T_EPI)0 ? v : (T_EPI)0;
  if constexpr (EPI_ACT == 2) v = gelu_tanh(v);
  if constexpr (EPI_ACT == 3) v = gelu_erf(v);
  return v;
}

// The pair (v0, v1) at row p, columns q and q + 1 after the epilogue, as it is stored: C is read
// only for elements inside D. WHOLE: the caller knows q is even and Q even, so q < Q covers q + 1.
template <bool WHOLE = false>
__device__ __forceinline__ typename Pair<T_OUT>::type epi_pair(T_EPI v0, T_EPI v1, const EpiIn& C, int p,
                                                               int q) {
  typename Pair<T_OUT>::type o;
  T_OUT* e = reinterpret_cast<T_OUT*>(&o);
  if constexpr (READ_C) {
    const size_t off = (size_t)p * LDQ + q;
    const bool in_p = EVEN_P || p < P;
    e[0] = from_epi<T_OUT>(in_p && (EVEN_Q || q < (GROUPS > 0 ? C.q_end : Q)) ? epilogue(v0, C, off, q) : v0);
    if constexpr (WHOLE) {
      e[1] = from_epi<T_OUT>(in_p && (EVEN_Q || q < (GROUPS > 0 ? C.q_end : Q)) ? epilogue(v1, C, off + 1, q + 1) : v1);
    } else {
      e[1] = from_epi<T_OUT>(in_p && (EVEN_Q || q + 1 < (GROUPS > 0 ? C.q_end : Q)) ? epilogue(v1, C, off + 1, q + 1) : v1);
    }
  } else {
    e[0] = from_epi<T_OUT>(epilogue(v0, C, 0, q));
    e[1] = from_epi<T_OUT>(epilogue(v1, C, 0, q + 1));
  }
  return o;
}

// The pair (v0, v1) at columns q and q + 1 after the epilogue, with C's pair (c0, c1) given
// (C_VECTORS: C read 16 bytes a thread, zero outside D, whose stores leave those out).
__device__ __forceinline__ typename Pair<T_OUT>::type epi_pair_c(T_EPI v0, T_EPI v1, const EpiIn& C, int q, T_EPI c0,
                                                                 T_EPI c1) {
  typename Pair<T_OUT>::type o;
  T_OUT* e = reinterpret_cast<T_OUT*>(&o);
  e[0] = from_epi<T_OUT>(epilogue<true>(v0, C, 0, q, c0));
  e[1] = from_epi<T_OUT>(epilogue<true>(v1, C, 0, q + 1, c1));
  return o;
}

// Stores the two adjacent accumulators (v0, v1) of D at row p, columns q and q + 1 of the view.
// With SWAP the view's row p is D's row and its columns D's columns: the two are M elements apart,
// each stored alone (a quad's threads write 8 adjacent rows of a column).
__device__ __forceinline__ void store_pair(const EpiIn& C, T_OUT* __restrict__ D, int p, int q,
                                           T_EPI v0, T_EPI v1) {
  if (!EVEN_P && p >= P) return;
  if constexpr (SWAP) {
    const size_t off = (size_t)q * P + p;
    if (EVEN_Q || q < Q) D[off] = from_epi<T_OUT>(epilogue(v0, C, off, p));
    if (EVEN_Q || q + 1 < Q) D[off + P] = from_epi<T_OUT>(epilogue(v1, C, off + P, p));
    return;
  }
  const size_t off = (size_t)p * LDQ + q;
  if (PAIRS_ALIGNED && (EVEN_Q || q + 1 < (GROUPS > 0 ? C.q_end : Q))) {
    typename Pair<T_OUT>::type o;
    T_OUT* e = reinterpret_cast<T_OUT*>(&o);
    e[0] = from_epi<T_OUT>(epilogue(v0, C, off, q));
    e[1] = from_epi<T_OUT>(epilogue(v1, C, off + 1, q + 1));
    *reinterpret_cast<typename Pair<T_OUT>::type*>(D + off) = o;
  } else {
    if (EVEN_Q || q < (GROUPS > 0 ? C.q_end : Q)) D[off] = from_epi<T_OUT>(epilogue(v0, C, off, q));
    if (EVEN_Q || q + 1 < (GROUPS > 0 ? C.q_end : Q)) D[off + 1] = from_epi<T_OUT>(epilogue(v1, C, off + 1, q + 1));
  }
}

// One 64-row wgmma tile of this consumer's 2-byte outputs stored from registers, 16 bytes a
// thread. The wgmma layout gives each thread pairs of adjacent outputs, so a quad covers 8 columns
// (16 bytes) of a row: half a 32-byte sector, whose other half the next column group's store
// writes. The quad instead transposes its 4 x 4 pairs of two column groups by shuffles, so that
// each thread holds 8 columns of one row and a row's sector is written whole by one instruction.
// The epilogue (alpha, beta, C) is applied where the pair was computed, before the exchange. Needs
// Q a multiple of 8, so that a vector is wholly in D or wholly out. (4-byte outputs gain nothing
// from it: a quad's pairs already cover a sector.)
template <typename T> struct IsHalf { static constexpr bool value = false; };
template <> struct IsHalf<half> { static constexpr bool value = true; };
// Under a K split, the four pairs must be in this block's share: two register vectors with f32
// accumulators, which an even share size keeps together.
constexpr bool STORE_VECTORS = sizeof(T_OUT) == 2 && VEC_ALIGNED && (SPLIT == 1 || REGS_PER_J == 2 || SPLIT_NV % 2 == 0);
// Packed f16 accumulators stored as they are (f16 out, alpha 1, no C): register 2j + h holds the
// pair (j, h), so no conversion is needed.
constexpr bool RAW_HALVES = REGS_PER_J == 2 && IsHalf<T_OUT>::value && !READ_C && ALPHA == (T_EPI)1 && !FUSED;

// READ_C where rows of D are stored whole (16-byte vectors from registers, or the TMA store; Q and
// every group a multiple of 8, so a vector is wholly in D or wholly out): C is read 16 bytes a
// thread, as wide as D is written, instead of one element at a time in the accumulator layout.
constexpr bool C_VECTORS = READ_C && VEC_ALIGNED && (TMA_STORE || STORE_VECTORS);
// C's elements a 16-byte vector holds.
constexpr int C_VEC = 16 / (int)sizeof(T_OUT);
// C_TMA (C_SLOTS > 0: C_VECTORS with the TMA store and a producer warpgroup that loads by TMA):
// C's tile comes by TMA through its own tensor map, as CUTLASS's sm90 epilogue loads its source.
// Each consumer has a ring of C_SLOTS blocks of 64 rows x 128 bytes (the TMA store's piece,
// 128-byte swizzle), filled by a loader thread of the producer warpgroup (lane 0 of warp 1 + cw)
// that walks the consumer's jobs as the consumer does, C_SLOTS blocks ahead of its epilogue: the
// reads of C overlap the K loops instead of following them. The epilogue takes its pairs of C from
// the ring and frees each block once the piece of D that replaces it is staged.
constexpr bool C_TMA = C_SLOTS > 0;
constexpr int C_RING = C_TMA ? C_SLOTS : 1;  // C_SLOTS as a divisor
constexpr int C_BLOCK = 64 * 128;
static_assert(!C_TMA || (C_VECTORS && TMA_STORE && SPECIALIZED && !GATHER && !SWAP),
              "C by TMA is the TMA store's companion, loaded by the producer warpgroup");
static_assert(!C_ONCE || C_TMA, "the evict-first hint on C and D is C by TMA's (Plan::c_once)");

// C_TMA: a consumer's ring of C blocks, its barriers (full: the block has landed; empty: the
// consumer has read it) and the count of blocks it has taken.
struct CRing {
  unsigned char* buf;
  unsigned long long* full;
  unsigned long long* empty;
  int n;
};

// C's 16 bytes at row p, column q of the view, or zeros outside D (never stored).
__device__ __forceinline__ uint4 load_c_vec(const EpiIn& C, int p, int q) {
  if ((EVEN_P || p < P) && (EVEN_Q || q < (GROUPS > 0 ? C.q_end : Q)))
    return *reinterpret_cast<const uint4*>(C.c + (size_t)p * LDQ + q);
  return make_uint4(0, 0, 0, 0);
}

// C_VECTORS: as a tile starts, each thread of its consumer asks the L2 for one of the consumer's
// rows of C (the tile's columns inside D, one bulk prefetch a row), so the reads of C after the K
// loop find it there instead of waiting on device memory with nothing else in flight.
__device__ __forceinline__ void prefetch_c(const EpiIn& C, int p_first, int q_first) {
  const int q_stop = min(q_first + BQ, GROUPS > 0 ? C.q_end : Q);
  if (q_first >= q_stop) return;
#pragma unroll
  for (int r = threadIdx.x % 128; r < WG_P; r += 128) {
    if (p_first + r < P)
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(C.c + (size_t)(p_first + r) * LDQ + q_first),
                   "r"((q_stop - q_first) * (int)sizeof(T_OUT)));
  }
}

// The pair of C in the 4 bytes `w`, as T_EPI.
__device__ __forceinline__ void c_pair(unsigned w, T_EPI& c0, T_EPI& c1) {
  typename Pair<T_OUT>::type o = *reinterpret_cast<const typename Pair<T_OUT>::type*>(&w);
  const T_OUT* e = reinterpret_cast<const T_OUT*>(&o);
  c0 = to_epi(e[0]);
  c1 = to_epi(e[1]);
}

// Transposes the quad's 4 x 4 items (lane c's item e becomes lane e's item c), one index bit at a
// time: lane c sends the items whose bit b differs from its own and receives its partner's in
// their place. Its own inverse.
__device__ __forceinline__ void quad_transpose(unsigned (&x)[4], int c) {
#pragma unroll
  for (int b = 1; b <= 2; b *= 2) {
    const bool hi = c & b;
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int lo_e = b == 1 ? 2 * k : k, hi_e = lo_e + b;
      const unsigned recv = __shfl_xor_sync(0xffffffff, hi ? x[lo_e] : x[hi_e], b);
      if (hi) {
        x[lo_e] = recv;
      } else {
        x[hi_e] = recv;
      }
    }
  }
}

// C_VECTORS: the C vector of column-group pair j (columns 8j to 8j + 15 of the tile) that this
// thread's row-of-8 store covers, or zeros where the block does not store it (a K split's share).
__device__ __forceinline__ uint4 c_vec_of(const EpiIn& C, int t, int kr, int j, int p_r, int q0) {
  const int c = threadIdx.x % 4;
  if (!stores_pair(t, j, 0, kr)) return make_uint4(0, 0, 0, 0);
  return load_c_vec(C, p_r + 8 * (c & 1), q0 + 8 * (j + c / 2));
}

// p_r: this thread's first row (the row of h = 0); q0: the tile's first column.
// C_VECTORS: lane c reads the C vector of the row and columns it will store (the transposed
// layout), up to C_AHEAD vectors ahead of the math so their latencies overlap, and the quad
// transposes them back to the pair layout (the same exchange, its own inverse); the epilogue then
// takes C from registers, the same f32 math as from memory.
template <int REGS>
__device__ __forceinline__ void store_tile_vec(const T_ACCR (&acc)[REGS], int t, int kr, int p_r, int q0,
                                               const EpiIn& C, T_OUT* __restrict__ D) {
  const int c = threadIdx.x % 4;
  constexpr int C_NV = BQ / 16;  // vectors a thread stores (and reads of C) per row tile
  // Vectors of C in flight: 4 registers each, beside the accumulators in the thread's budget. At
  // 128 registers with 64 accumulators (an inline producer, 2 blocks an SM) 8 spilled 8-12 bytes,
  // and with GELU's math 4 or 2 spilled 20-32 bytes.
  constexpr int C_FREE = CONSUMER_REGS - ACC_ALL;
  constexpr int C_MOST = C_FREE > 96 ? 8 : C_FREE > 56 && EPI_ACT < 2 ? 4 : 1;
  constexpr int C_AHEAD = C_NV < C_MOST ? C_NV : C_MOST;
  uint4 cv[C_VECTORS ? C_AHEAD : 1];
  if constexpr (C_VECTORS) {
#pragma unroll
    for (int i = 0; i < C_AHEAD; ++i) cv[i] = c_vec_of(C, t, kr, 2 * i, p_r, q0);
  }
#pragma unroll
  for (int j = 0; j < BQ / 8; j += 2) {
    unsigned cx[4];  // C_VECTORS: item e's pair of C, as x[e] below
    if constexpr (C_VECTORS) {
      const uint4 now = cv[(j / 2) % C_AHEAD];
      if (j / 2 + C_AHEAD < C_NV) cv[(j / 2) % C_AHEAD] = c_vec_of(C, t, kr, j + 2 * C_AHEAD, p_r, q0);
      cx[0] = now.x;
      cx[1] = now.y;
      cx[2] = now.z;
      cx[3] = now.w;
    }
    if (!stores_pair(t, j, 0, kr)) continue;  // pairs (j, 0..1) and (j + 1, 0..1) share a share
    if constexpr (C_VECTORS) quad_transpose(cx, c);
    unsigned x[4];  // item e: column group j + e / 2, row h = e % 2
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if constexpr (RAW_HALVES) {
        x[e] = acc[2 * j + e];
      } else if constexpr (C_VECTORS) {
        // Outside D, C is zero and the result is not stored.
        T_EPI v0, v1, c0, c1;
        acc_pair(acc, j + e / 2, e % 2, v0, v1);
        c_pair(cx[e], c0, c1);
        const int q = q0 + 8 * (j + e / 2) + 2 * c;
        const typename Pair<T_OUT>::type o = epi_pair_c(v0, v1, C, q, c0, c1);
        x[e] = *reinterpret_cast<const unsigned*>(&o);
      } else {
        T_EPI v0, v1;
        acc_pair(acc, j + e / 2, e % 2, v0, v1);
        const typename Pair<T_OUT>::type o = epi_pair<true>(v0, v1, C, p_r + 8 * (e % 2), q0 + 8 * (j + e / 2) + 2 * c);
        x[e] = *reinterpret_cast<const unsigned*>(&o);
      }
    }
    quad_transpose(x, c);
    // Lane c now holds item c's row across the quad: 8 columns, 16 bytes.
    const int p = p_r + 8 * (c & 1), q = q0 + 8 * (j + c / 2);
    if ((EVEN_P || p < P) && (EVEN_Q || q < (GROUPS > 0 ? C.q_end : Q)))
      *reinterpret_cast<uint4*>(D + (size_t)p * LDQ + q) = make_uint4(x[0], x[1], x[2], x[3]);
  }
}

// One 64-row wgmma tile of this consumer's accumulators through the TMA-store epilogue: per
// 128-byte column block (EPI_COLS elements), write the block into one of the consumer's two
// staging buffers (128-byte swizzle: 16-byte unit u of row r at u ^ (r % 8)), then thread 0 of
// the warpgroup hands it to the TMA and goes on; a buffer is written again only once the TMA has
// read it. Elements outside D are staged too and clipped by the TMA store. `p_map`: the first row
// of this tile's problem in the map (a batch's problems' rows one after another).
// C_VECTORS: the warpgroup reads the block's C 16 bytes a thread (4 units each, a warp 4 whole
// rows), the next block's before the wait for the buffer, stages it in the buffer where D's block
// goes, and each thread takes the pairs of C it overwrites from there; C's rows past P (a
// cluster's padding tile) are not read.
// C_TMA: the pairs of C come from the consumer's ring `cr` instead (see C_TMA).
template <int REGS>
__device__ __forceinline__ void store_tile_tma(const T_ACCR (&acc)[REGS], const TmaDesc* map_d,
                                               unsigned char* bufs, int& count, int cw, int p0, int q0,
                                               const EpiIn& C, CRing& cr, int p_map = 0) {
  const int t_in = threadIdx.x % 128, lane = threadIdx.x % 32, warp = t_in / 32;
  constexpr int EPI_BUF = 64 * 128;
  constexpr int CHUNKS = BQ / EPI_COLS;
  constexpr int C_UNITS = EPI_BUF / 16 / 128;  // 16-byte units of C a thread reads per block
  uint4 cv[C_VECTORS ? 2 : 1][C_UNITS];  // C of this block and the next
  // Unit i of a thread: row t_in / 8 + 16 i, 16-byte unit t_in % 8 of the block's row.
  auto load_c = [&](uint4 (&v)[C_UNITS], int ch) {
#pragma unroll
    for (int i = 0; i < C_UNITS; ++i) {
      const int p = p0 + t_in / 8 + 16 * i;
      v[i] = p < P ? load_c_vec(C, p, q0 + ch * EPI_COLS + (t_in % 8) * C_VEC) : make_uint4(0, 0, 0, 0);
    }
  };
  constexpr bool C_REGS = C_VECTORS && !C_TMA;  // C through registers, staged in the buffer
  if constexpr (C_REGS) load_c(cv[0], 0);
#pragma unroll
  for (int ch = 0; ch < CHUNKS; ++ch) {
    unsigned char* buf = bufs + (count & 1) * EPI_BUF;
    const unsigned buf_s = smem_u32(buf);
    if constexpr (C_REGS) {
      if (ch + 1 < CHUNKS) load_c(cv[(ch + 1) % 2], ch + 1);
    }
    // C_TMA: the ring block of this piece's C, once it has landed.
    const int c_slot = C_TMA ? cr.n % C_RING : 0;
    const unsigned c_s = C_TMA ? smem_u32(cr.buf + c_slot * C_BLOCK) : buf_s;
    if constexpr (C_TMA) bar_wait(&cr.full[c_slot], (cr.n / C_RING) & 1);
    if (t_in == 0) bulk_wait_read<1>();
    consumer_sync(cw);
    if constexpr (C_REGS) {
#pragma unroll
      for (int i = 0; i < C_UNITS; ++i) {
        const int row = t_in / 8 + 16 * i;
        st_shared(buf_s + row * 128 + (((t_in % 8) ^ (row & 7)) << 4), cv[ch % 2][i]);
      }
      consumer_sync(cw);
    }
#pragma unroll
    for (int jj = 0; jj < EPI_COLS / 8; ++jj) {
      const int j = ch * (EPI_COLS / 8) + jj;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = warp * 16 + lane / 4 + 8 * h, col = 8 * jj + 2 * (lane % 4);
        T_EPI v0, v1;
        acc_pair(acc, j, h, v0, v1);
        const int byte = col * (int)sizeof(T_OUT);
        const int phys = row * 128 + ((((byte >> 4) ^ (row & 7))) << 4) + (byte & 15);
        typename Pair<T_OUT>::type o;
        if constexpr (C_VECTORS) {
          // The pair of C this thread overwrites: zero outside D (clipped by the store).
          const typename Pair<T_OUT>::type cp = ld_shared<typename Pair<T_OUT>::type>(c_s + phys);
          const T_OUT* ce = reinterpret_cast<const T_OUT*>(&cp);
          o = epi_pair_c(v0, v1, C, q0 + ch * EPI_COLS + col, to_epi(ce[0]), to_epi(ce[1]));
        } else {
          o = epi_pair(v0, v1, C, p0 + row, q0 + ch * EPI_COLS + col);
        }
        st_shared(buf_s + phys, o);
      }
    }
    fence_async_smem();
    consumer_sync(cw);
    if (t_in == 0) {
      // C_TMA: every thread's reads of the block are done (the meeting above); the loader may refill it.
      if constexpr (C_TMA) bar_arrive(&cr.empty[c_slot]);
      tma_store<C_ONCE>(map_d, buf, q0 + ch * EPI_COLS, p0 + p_map);
      bulk_commit();
    }
    ++count;
    if constexpr (C_TMA) ++cr.n;
  }
}

// C_TMA: the C loader of consumer cw (lane 0 of the producer's warp 1 + cw). It walks the
// consumer's jobs as the consumer does (ping-pong: every other one; a stream-K partial sum has no
// epilogue) and, for each of the consumer's 64-row tiles and 128-byte column blocks in the order
// store_tile_tma takes them, waits for a free ring block and loads C's block into it by TMA
// (the box of D's store map, over C; rows and columns outside C arrive as zeros). C_ONCE (v19:
// the kernel's data overflows the L2, Plan::c_once) puts an L2 evict-first hint on these loads
// and on D's stores: C is read once and D written once, and the L2 keeps what tiles read again.
__device__ __forceinline__ void c_loader(const WorkList& wl, int rank, int cw, const TmaDesc* map_c, CRing cr) {
  if constexpr (C_TMA) {
    constexpr int CHUNKS = BQ / EPI_COLS;
    const int jobs = wl.count();
    int slot = 0, phase = 0;
#pragma unroll 1
    for (int job = PINGPONG ? cw : 0; job < jobs; job += PINGPONG ? CONSUMERS : 1) {
      const Work work = wl.at(job);
      if (STREAM_K && work.kind == WORK_PARTIAL) continue;
      int tp, tq, prob = 0, qb = 0, q_end = Q;
      if constexpr (BATCH > 1 || GROUPS > 0) {
        tile_at(work.ct, rank, tp, tq, prob, qb, q_end);
      } else {
        tile_of(work.ct, rank, tp, tq);
      }
      const int p0 = share_p0(tp, cw) + (BATCH > 1 ? prob * P : 0), q0 = qb + tq * BQ;
#pragma unroll 1
      for (int b = 0; b < MT * CHUNKS; ++b) {
        bar_wait(&cr.empty[slot], phase ^ 1);
        bar_expect(&cr.full[slot], C_BLOCK);
        tma_load<C_ONCE>(cr.buf + slot * C_BLOCK, map_c, q0 + (b % CHUNKS) * EPI_COLS, p0 + (b / CHUNKS) * 64,
                         &cr.full[slot]);
        if (++slot == C_SLOTS) {
          slot = 0;
          phase ^= 1;
        }
      }
    }
  }
}

}  // namespace tt

extern "C" __global__ void __launch_bounds__(tt::THREADS, cfg::BLOCKS_PER_SM) TT_CLUSTER_ATTR
    KERNEL_NAME(TT_X_PARAM, const __grid_constant__ tt::TmaDesc mapY, TT_MAP_D TT_MAP_C
                const T_OUT* __restrict__ C, T_OUT* __restrict__ D, unsigned char* __restrict__ ws TT_EPI_PARAMS) {
  using namespace tt;
  TT_FAULT_HOOK;
  EpiIn epi;
  epi.c = C;
  epi.bias = TT_EPI_BIAS;
  epi.rscale = TT_EPI_RSCALE;
  epi.ab = TT_EPI_AB;
  epi.q_end = Q;
  extern __shared__ unsigned char smem_raw[];
  // Swizzle atoms must sit on 1024-byte boundaries; the launch asks for 1024 bytes of slack.
  unsigned char* smem =
      reinterpret_cast<unsigned char*>((reinterpret_cast<size_t>(smem_raw) + 1023) & ~static_cast<size_t>(1023));
  unsigned char* sX = smem;
  unsigned char* sY = smem + STAGES * X_STAGE;
  // The TMA-store epilogue's staging: two 64 x 128-byte buffers per consumer warpgroup.
  unsigned char* sE = sY + Y_SLOTS * Y_STAGE;
  // C_TMA: each consumer's ring of C blocks, after the staging.
  unsigned char* sC = sE + (TMA_STORE ? CONSUMERS * 2 * 64 * 128 : 0);
  unsigned long long* full = reinterpret_cast<unsigned long long*>(sC + CONSUMERS * C_SLOTS * C_BLOCK);
  const TmaDesc* map_d = TT_MAP_D_PTR;
  unsigned long long* empty = full + STAGES;
  unsigned long long* y_full = empty + STAGES;  // Y_RESIDENT: all of Y has landed
  unsigned long long* c_full = y_full + 1;      // C_TMA: a ring block of each consumer has landed
  unsigned long long* c_empty = c_full + CONSUMERS * C_SLOTS;  // ... has been read

  const int rank = (int)cluster_rank();
  const int kr = split_rank();
  WorkList wl;
  wl.init(blockIdx.x / (CLUSTER * SPLIT), kr);

  if (threadIdx.x == 0) {
    // The maps are fetched while the barriers are set up and the cluster meets.
    prefetch_map(TT_X_MAP);
    prefetch_map(&mapY);
    prefetch_map(map_d);
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {
      bar_init(&full[s], GATHER ? 1 + 128 : 1);
      bar_init(&empty[s], RELEASES);
    }
    if constexpr (Y_RESIDENT) bar_init(y_full, 1);
    if constexpr (C_TMA) {
      prefetch_map(TT_MAP_C_PTR);
#pragma unroll
      for (int s = 0; s < CONSUMERS * C_SLOTS; ++s) {
        bar_init(&c_full[s], 1);
        bar_init(&c_empty[s], 1);
      }
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  cluster_sync_init();

  // The warpgroup, warp-uniform as far as the compiler can tell (a broadcast), so that what
  // derives from it (the consumer's wgmma descriptors) lives in uniform registers.
  const int wg = __shfl_sync(0xffffffff, (int)threadIdx.x / 128, 0);
  Loader loader;
  loader_init(loader, wl);
  if constexpr (SPECIALIZED) {
    if (wg == 0) {
      asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(PRODUCER_REGS));
      if constexpr (GATHER) {
        gather_all(loader, wl, TT_X_IN, &mapY, sX, sY, full, empty, rank);
      } else if (threadIdx.x == 0) {
        if (loader_more(loader)) load_y_resident(&mapY, sY, y_full, rank);
        while (loader_more(loader)) load_next(loader, wl, TT_X_MAP, &mapY, sX, sY, full, empty, rank);
      } else if (C_TMA && threadIdx.x % 32 == 0 && threadIdx.x / 32 <= CONSUMERS) {
        const int c = threadIdx.x / 32 - 1;
        c_loader(wl, rank, c, TT_MAP_C_PTR,
                 CRing{sC + c * C_SLOTS * C_BLOCK, c_full + c * C_SLOTS, c_empty + c * C_SLOTS, 0});
      }
      // A block of a cluster stays until its peers no longer arrive on its barriers. (No
      // __syncwarp after it: it kept the warp's other 31 threads alive, and ptxas then put a YIELD
      // in thread 0's barrier waits; a single block's 7x7 layer ran 18.8 us against 15.7-15.9.)
      if (threadIdx.x == 0) loader_tail(loader, empty);
      // The K split's two meetings (split_add) count every thread of the cluster.
      split_sync();
      split_sync();
      return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(CONSUMER_REGS));
  } else {
    if (threadIdx.x == 0) {
      if (loader_more(loader)) load_y_resident(&mapY, sY, y_full, rank);
#pragma unroll 1
      for (int s = 0; s < STAGES && loader_more(loader); ++s)
        load_next(loader, wl, TT_X_MAP, &mapY, sX, sY, full, empty, rank);
    }
  }

  const int cw = wg - (SPECIALIZED ? 1 : 0);  // consumer index
  const int lane = threadIdx.x % 32;
  const int warp = (threadIdx.x / 32) % 4;
  const bool issues = !SPECIALIZED && threadIdx.x == 0;
  T_ACCR acc[MT][ACC_REGS];
  // Ping-pong: consumer cw takes the block's jobs cw, cw + 2, ... (whole tiles) and finds each
  // one's stages at its place in the ring (the producer fills the ring with every job in order).
  // Cooperative: both consumers take every job, so the ring position just runs on.
  constexpr int JOB_STEP = PINGPONG ? CONSUMERS : 1;
  // Shared-memory descriptors of this consumer's first X rows and of Y in ring slot 0; a slot,
  // K step or row tile further is a constant added to the address field (addresses stay below
  // 2^18, so the 14-bit field never carries).
  const unsigned long long desc_x0 =
      X_KMAJOR ? make_desc(smem_u32(sX) + (PINGPONG ? 0 : cw * MT) * 64 * ROW_BYTES, 16)
               : make_desc(smem_u32(sX) + (PINGPONG ? 0 : cw * MT) * CHUNK_BYTES, CHUNK_BYTES);
  const unsigned long long desc_y0 = Y_KMAJOR ? make_desc(smem_u32(sY), 16) : make_desc(smem_u32(sY), CHUNK_BYTES);
  int stage = 0, phase = 0;
  int stored = 0;  // pieces this consumer handed to the TMA store (its staging buffers alternate)
  CRing cring{sC + cw * C_SLOTS * C_BLOCK, c_full + cw * C_SLOTS, c_empty + cw * C_SLOTS, 0};  // C_TMA
  const int jobs = wl.count();
  if constexpr (Y_RESIDENT) {
    if (jobs > (PINGPONG ? cw : 0)) bar_wait(y_full, 0);
  }
#pragma unroll 1
  for (int job = PINGPONG ? cw : 0; job < jobs; job += JOB_STEP) {
    const Work work = wl.at(job);
    // A single problem's tile as before problems existed (tile_at there changed its machine code).
    int tp, tq, prob = 0, qb = 0, q_end = Q;
    if constexpr (BATCH > 1 || GROUPS > 0) {
      tile_at(work.ct, rank, tp, tq, prob, qb, q_end);
    } else {
      tile_of(work.ct, rank, tp, tq);
    }
    T_OUT* Dp = D;
    if constexpr (BATCH > 1) {
      Dp = D + d_offset(prob);
      epi.c = C + d_offset(prob);
    }
    if constexpr (GROUPS > 0) epi.q_end = q_end;
    if constexpr (C_VECTORS && !C_TMA) {
      if (!STREAM_K || work.kind != WORK_PARTIAL) prefetch_c(epi, share_p0(tp, cw), qb + tq * BQ);
    }
    if constexpr (PINGPONG) {
      const long long ring = (long long)job * KTILES;
      stage = (int)(ring % STAGES);
      phase = (int)((ring / STAGES) & 1);
      if (job > 0) order_wait(cw);
    }
#pragma unroll
    for (int t = 0; t < MT; ++t) {
#pragma unroll
      for (int i = 0; i < ACC_REGS; ++i) acc[t][i] = 0;
    }
    pin_all(acc);
    int prev = 0;
#pragma unroll 1
    for (int kt = work.k0; kt < work.k1; ++kt) {
      bar_wait(&full[stage], phase);
      // With the loads issued inline, thread 0's branch into the loader leaves the compiler
      // unsure that the ring slot is warp-uniform; a broadcast says so, and the descriptors stay
      // in uniform registers (without it, each wgmma's came from vector registers by R2UR).
      const int slot = SPECIALIZED ? stage : __shfl_sync(0xffffffff, stage, 0);
      const unsigned long long desc_x = desc_x0 + (unsigned)(slot * (X_STAGE >> 4));
      const unsigned long long desc_y = desc_y0 + (unsigned)((Y_RESIDENT ? kt : slot) * (Y_STAGE >> 4));
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < KSTEPS; ++ks) {
        const unsigned long long dy = desc_y + (Y_KMAJOR ? ks * KSTEP_BYTES : ks * MN_KSTEP_BYTES) / 16;
#pragma unroll
        for (int t = 0; t < MT; ++t) {
          const unsigned long long dx =
              desc_x + (X_KMAJOR ? t * 64 * ROW_BYTES + ks * KSTEP_BYTES : t * CHUNK_BYTES + ks * MN_KSTEP_BYTES) / 16;
          mma_tile(acc[t], dx, dy);
        }
      }
      wgmma_commit();
      wgmma_wait<1>();
      if (kt > work.k0) {
        if (threadIdx.x % 128 == 0) bar_arrive_cluster(&empty[prev]);
        if (issues && loader_more(loader)) load_next(loader, wl, TT_X_MAP, &mapY, sX, sY, full, empty, rank);
        __syncwarp();
      }
      prev = stage;
      ring_next(stage, phase);
    }
    order_signal(cw);
    wgmma_wait<0>();
    pin_all(acc);
    if (threadIdx.x % 128 == 0) bar_arrive_cluster(&empty[prev]);
    if (issues && loader_more(loader)) load_next(loader, wl, TT_X_MAP, &mapY, sX, sY, full, empty, rank);
    __syncwarp();

    if constexpr (SPLIT > 1) split_add(sX, cw, kr, rank, acc);

    if constexpr (STREAM_K) {
      if (work.kind == WORK_PARTIAL) {
        sk_store(ws, blockIdx.x, cw, acc);
        continue;
      }
      if (work.kind == WORK_TAIL) {
        // Every cluster before this one whose range reaches into the tile left a partial sum.
        const long long tile_start = (long long)(work.ct - SK_DP_TILES) * KTILES;
        for (int c = wl.c - 1; c >= 0 && sk_begin(c + 1) > tile_start; --c) sk_add(ws, c * CLUSTER + rank, cw, acc);
      }
    }

    // Accumulator layout of a 64 x BQ wgmma tile: warp w holds rows 16w + lane / 4 (+ 8), and each
    // thread holds columns 8j + 2 (lane % 4) (+ 1) of them, in registers [4j + 2h + e] (f32, s32)
    // or halves e of register [2j + h] (packed f16).
    if constexpr (TMA_STORE) {
#pragma unroll
      for (int t = 0; t < MT; ++t)
        store_tile_tma(acc[t], map_d, sE + cw * 2 * 64 * 128, stored, cw,
                       share_p0(tp, cw) + t * 64, qb + tq * BQ, epi, cring,
                       BATCH > 1 ? prob * P : 0);
      continue;
    }
    const int p_base = share_p0(tp, cw) + warp * 16 + lane / 4;
    if constexpr (STORE_VECTORS) {
#pragma unroll
      for (int t = 0; t < MT; ++t) store_tile_vec(acc[t], t, kr, p_base + t * 64, qb + tq * BQ, epi, Dp);
      continue;
    }
    const int q_base = qb + tq * BQ + 2 * (lane % 4);
#pragma unroll
    for (int t = 0; t < MT; ++t) {
#pragma unroll
      for (int j = 0; j < BQ / 8; ++j) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if (!stores_pair(t, j, h, kr)) continue;
          T_EPI v0, v1;
          acc_pair(acc[t], j, h, v0, v1);
          store_pair(epi, Dp, p_base + t * 64 + 8 * h, q_base + 8 * j, v0, v1);
        }
      }
    }
  }
  // Shared memory must outlive the TMA stores that read it.
  if constexpr (TMA_STORE) {
    if (threadIdx.x % 128 == 0) bulk_wait_all();
  }
  if (issues) loader_tail(loader, empty);
}

}  // namespace ns_tt_wgmma_gemm_v20_bf16f32bf16_tn_m128n128_c2_s4_cl1_grid_g1_ws_ks2_0bbfa62a
#undef KERNEL_NAME
#undef TT_CLUSTER_ATTR
#undef TT_MAP_D
#undef TT_MAP_D_PTR
#undef TT_MAP_C
#undef TT_MAP_C_PTR
#undef TT_X_PARAM
#undef TT_X_MAP
#undef TT_X_IN
#undef TT_EPI_PARAMS
#undef TT_EPI_BIAS
#undef TT_EPI_RSCALE
#undef TT_EPI_AB
#undef TT_GROUPED
