// The memory roofline of a streaming layer on this GPU: kernels that read READ_MB and write
// WRITE_MB of 16-byte vectors in the ratio of the two sizes, as a 1x1 convolution reads its input
// channels and writes its output channels. The data is laid out as planes: U units, RD input
// planes and WR output planes of U vectors each (RD or WR is 1). Every variant is timed warm, the
// same buffers replayed by a CUDA graph of REPS launches, as the worker times a kernel. Built and
// run by `lab/gpu-lab.sh membw`:
//   membw READ_MB WRITE_MB   ->   one line a variant: us per launch, TB/s moved
// Variants:
//   strided   one unit a thread, its RD vectors adjacent (each warp load spans RD x 512 bytes)
//   planes    one unit a thread, plane by plane (every warp load is 512 contiguous bytes)
//   planes4   the same, four units a thread with every load issued before the first use
//   planesLD  planes with plain loads and stores (no streaming cache hints)
//   bulk      a persistent block per SM: one thread copies tiles of every plane into a ring of
//             shared-memory stages with cp.async.bulk (completing on mbarriers, as the TMA loads of
//             the wgmma kernels do); the block reduces them and stores with 16-byte stores;
//             bulk6ef: its copies carry an L2 evict-first hint; bulk6h: 16 KB tiles; bulk6hst:
//             the same, each output tile staged in shared memory and written by cp.async.bulk
//             (as the TMA-store epilogue writes)
//   memcpy    cudaMemcpyAsync of the larger of the two sizes (read + write counted)
#ifndef __CUDACC_RTC__
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#endif

// Distinct input words, so that a wrong plane or offset shows in the XOR.
__global__ void fill(uint4* p, long n) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
    const unsigned h = (unsigned)(i * 2654435761u);
    p[i] = make_uint4(h, h ^ 0x9e3779b9u, (unsigned)i, h >> 7);
  }
}

__global__ void strided(const uint4* __restrict__ in, uint4* __restrict__ out, long units, int rd, int wr) {
  const long stride = (long)gridDim.x * blockDim.x;
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < units; i += stride) {
    uint4 acc = make_uint4(0, 0, 0, 0);
    for (int r = 0; r < rd; ++r) {
      const uint4 v = in[i * rd + r];
      acc.x ^= v.x; acc.y ^= v.y; acc.z ^= v.z; acc.w ^= v.w;
    }
    for (int w = 0; w < wr; ++w) out[i * wr + w] = acc;
  }
}

template <int RD, int WR, int UN, bool CS = true>
__global__ void planes(const uint4* __restrict__ in, uint4* __restrict__ out, long units) {
  const long stride = (long)gridDim.x * blockDim.x;
  for (long i0 = blockIdx.x * (long)blockDim.x + threadIdx.x; i0 < units; i0 += stride * UN) {
    uint4 v[UN][RD];
#pragma unroll
    for (int u = 0; u < UN; ++u) {
      const long i = i0 + u * stride;
#pragma unroll
      for (int r = 0; r < RD; ++r)
        v[u][r] = i < units ? (CS ? __ldcs(in + r * units + i) : __ldg(in + r * units + i)) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < UN; ++u) {
      const long i = i0 + u * stride;
      uint4 acc = v[u][0];
#pragma unroll
      for (int r = 1; r < RD; ++r) {
        acc.x ^= v[u][r].x; acc.y ^= v[u][r].y; acc.z ^= v[u][r].z; acc.w ^= v[u][r].w;
      }
      if (i < units) {
#pragma unroll
        for (int w = 0; w < WR; ++w) {
          if (CS) __stcs(out + w * units + i, acc);
          else out[w * units + i] = acc;
        }
      }
    }
  }
}

__device__ __forceinline__ unsigned smem_u32(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// Tiles of TILE vectors a plane; STAGES of them in flight a block. EVICT_FIRST: the copies carry
// an L2 evict-first cache hint (the input is read once). BULK_STORE: the block writes each output
// tile into one of two staging buffers in shared memory and one thread hands it to the bulk-copy
// engine (cp.async.bulk global <- shared), as the wgmma kernels' TMA-store epilogue does; a buffer
// is written again once the engine has read it.
template <int RD, int WR, int TILE, int STAGES, bool EVICT_FIRST = false, bool BULK_STORE = false>
__global__ void bulk(const uint4* __restrict__ in, uint4* __restrict__ out, long units) {
  extern __shared__ __align__(128) unsigned char smem[];
  uint4* ring = reinterpret_cast<uint4*>(smem);
  uint4* staging = ring + (size_t)STAGES * RD * TILE;  // BULK_STORE: 2 x WR tiles
  unsigned long long* full =
      reinterpret_cast<unsigned long long*>(smem + ((size_t)STAGES * RD + (BULK_STORE ? 2 * WR : 0)) * TILE * 16);
  const long tiles = (units + TILE - 1) / TILE;
  auto issue = [&](long tile, int s) {
    const long first = tile * TILE;
    const int n = (int)(units - first < TILE ? units - first : TILE);
    const unsigned bar = smem_u32(&full[s]);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(n * 16 * RD) : "memory");
    for (int r = 0; r < RD; ++r) {
      if (EVICT_FIRST) {
        unsigned long long policy;
        asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;\n" ::"r"(
                smem_u32(ring + ((size_t)s * RD + r) * TILE)),
            "l"(in + r * units + first), "r"(n * 16), "r"(bar), "l"(policy)
            : "memory");
      } else {
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                         smem_u32(ring + ((size_t)s * RD + r) * TILE)),
                     "l"(in + r * units + first), "r"(n * 16), "r"(bar)
                     : "memory");
      }
    }
  };
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_u32(&full[s])));
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    for (int s = 0; s < STAGES; ++s) {
      const long tile = blockIdx.x + (long)s * gridDim.x;
      if (tile < tiles) issue(tile, s);
    }
  }
  __syncthreads();
  for (long k = 0;; ++k) {
    const long tile = blockIdx.x + k * gridDim.x;
    if (tile >= tiles) break;
    const int s = (int)(k % STAGES);
    const unsigned parity = (unsigned)((k / STAGES) & 1);
    unsigned done = 0;
    do {
      asm volatile(
          "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
          : "=r"(done)
          : "r"(smem_u32(&full[s])), "r"(parity)
          : "memory");
    } while (!done);
    const long first = tile * TILE;
    const int n = (int)(units - first < TILE ? units - first : TILE);
    uint4* st = staging + (size_t)(k & 1) * WR * TILE;
    if (BULK_STORE) {
      // The buffer written two tiles ago must have been read by the engine.
      if (threadIdx.x == 0) asm volatile("cp.async.bulk.wait_group.read 1;\n" ::: "memory");
      __syncthreads();
    }
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
      uint4 acc = ring[(size_t)s * RD * TILE + j];
#pragma unroll
      for (int r = 1; r < RD; ++r) {
        const uint4 v = ring[((size_t)s * RD + r) * TILE + j];
        acc.x ^= v.x; acc.y ^= v.y; acc.z ^= v.z; acc.w ^= v.w;
      }
#pragma unroll
      for (int w = 0; w < WR; ++w) {
        if (BULK_STORE) st[w * TILE + j] = acc;
        else __stcs(out + w * units + first + j, acc);
      }
    }
    if (BULK_STORE) asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();  // the stage is read: it may be refilled
    if (BULK_STORE && threadIdx.x == 0) {
      for (int w = 0; w < WR; ++w)
        asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(out + w * units + first),
                     "r"(smem_u32(st + w * TILE)), "r"(n * 16)
                     : "memory");
      asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
    }
    if (threadIdx.x == 0) {
      const long next = tile + (long)STAGES * gridDim.x;
      if (next < tiles) issue(next, s);
    }
  }
  if (BULK_STORE && threadIdx.x == 0) asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}

#ifndef __CUDACC_RTC__
static int check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    printf("membw: %s: %s\n", what, cudaGetErrorString(e));
    exit(1);
  }
  return 0;
}

// Times `launch` warm: a graph of `reps` launches, replayed once to warm up and then `rounds`
// times; returns microseconds per launch.
template <typename F>
static double time_graph(F launch, int reps = 50, int rounds = 5) {
  cudaStream_t st;
  check(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");
  cudaGraph_t g;
  check(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal), "capture");
  for (int i = 0; i < reps; ++i) launch(st);
  check(cudaStreamEndCapture(st, &g), "end capture");
  cudaGraphExec_t ge;
  check(cudaGraphInstantiate(&ge, g, 0), "instantiate");
  check(cudaGraphLaunch(ge, st), "warm-up");
  check(cudaStreamSynchronize(st), "warm-up sync");
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cudaEventRecord(a, st);
  for (int i = 0; i < rounds; ++i) cudaGraphLaunch(ge, st);
  cudaEventRecord(b, st);
  check(cudaEventSynchronize(b), "timing");
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  cudaStreamDestroy(st);
  return ms * 1e3 / ((double)reps * rounds);
}

template <int RD, int WR>
static void run(const uint4* in, uint4* out, long units, int sms, double bytes) {
  auto report = [&](const char* name, int grid, int block, double us) {
    printf("membw %-8s read %.2f MB write %.2f MB grid %5d x %3d: %7.2f us, %.2f TB/s\n", name, units * 16.0 * RD / 1e6,
           units * 16.0 * WR / 1e6, grid, block, us, bytes / us / 1e6);
  };
  for (int per_sm : {4, 8, 16}) {
    const int grid = sms * per_sm;
    report("strided", grid, 256, time_graph([&](cudaStream_t st) { strided<<<grid, 256, 0, st>>>(in, out, units, RD, WR); }));
  }
  for (int per_sm : {2, 4, 8, 16}) {
    const int grid = sms * per_sm;
    report("planes", grid, 256, time_graph([&](cudaStream_t st) { planes<RD, WR, 1><<<grid, 256, 0, st>>>(in, out, units); }));
    report("planes4", grid, 256, time_graph([&](cudaStream_t st) { planes<RD, WR, 4><<<grid, 256, 0, st>>>(in, out, units); }));
    report("planesLD", grid, 256, time_graph([&](cudaStream_t st) { planes<RD, WR, 1, false><<<grid, 256, 0, st>>>(in, out, units); }));
  }
  // The output of the plane kernel (ours to check the bulk kernel against: both XOR the same planes).
  const size_t out_bytes = (size_t)units * WR * 16;
  unsigned char* want = (unsigned char*)malloc(out_bytes);
  unsigned char* got = (unsigned char*)malloc(out_bytes);
  check(cudaMemcpy(want, out, out_bytes, cudaMemcpyDeviceToHost), "read planes");
  auto verify = [&](const char* name) {
    check(cudaMemcpy(got, out, out_bytes, cudaMemcpyDeviceToHost), "read bulk");
    size_t bad = 0;
    for (size_t i = 0; i < out_bytes; ++i) bad += got[i] != want[i];
    if (bad) printf("membw %s: %zu of %zu output bytes differ from the plane kernel's\n", name, bad, out_bytes);
    cudaMemset(out, 0, out_bytes);
  };
  cudaMemset(out, 0, out_bytes);
  // bulk: about 32 KB a stage, 6 stages, one block an SM; and 3 stages, two blocks an SM.
  constexpr int TILE = 2048 / RD;
  {
    constexpr int S = 6;
    const size_t smem = (size_t)S * RD * TILE * 16 + 8 * S;
    check(cudaFuncSetAttribute(bulk<RD, WR, TILE, S>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem), "smem");
    report("bulk6", sms, 256, time_graph([&](cudaStream_t st) { bulk<RD, WR, TILE, S><<<sms, 256, smem, st>>>(in, out, units); }));
    verify("bulk6");
    check(cudaFuncSetAttribute(bulk<RD, WR, TILE, S, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem), "smem");
    report("bulk6ef", sms, 256, time_graph([&](cudaStream_t st) { bulk<RD, WR, TILE, S, true><<<sms, 256, smem, st>>>(in, out, units); }));
    verify("bulk6ef");
  }
  {
    // Half-size tiles (16 KB a plane), 6 stages: stores straight from registers (bulk6h), or
    // staged and handed to the bulk-copy engine (bulk6hst), as the TMA-store epilogue does.
    constexpr int S = 6, HT = TILE / 2;
    const size_t smem = (size_t)S * RD * HT * 16 + 8 * S;
    check(cudaFuncSetAttribute(bulk<RD, WR, HT, S>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem), "smem");
    report("bulk6h", sms, 256, time_graph([&](cudaStream_t st) { bulk<RD, WR, HT, S><<<sms, 256, smem, st>>>(in, out, units); }));
    verify("bulk6h");
    const size_t smem_st = smem + (size_t)2 * WR * HT * 16;
    check(cudaFuncSetAttribute(bulk<RD, WR, HT, S, false, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_st),
          "smem");
    report("bulk6hst", sms, 256,
           time_graph([&](cudaStream_t st) { bulk<RD, WR, HT, S, false, true><<<sms, 256, smem_st, st>>>(in, out, units); }));
    verify("bulk6hst");
  }
  {
    constexpr int S = 3;
    const size_t smem = (size_t)S * RD * TILE * 16 + 8 * S;
    check(cudaFuncSetAttribute(bulk<RD, WR, TILE, S>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem), "smem");
    const int grid = sms * 2;
    report("bulk3x2", grid, 256, time_graph([&](cudaStream_t st) { bulk<RD, WR, TILE, S><<<grid, 256, smem, st>>>(in, out, units); }));
    verify("bulk3x2");
  }
  free(want);
  free(got);
  check(cudaGetLastError(), "kernels");
}

int main(int argc, char** argv) {
  const double read_mb = argc > 1 ? atof(argv[1]) : 51.38;
  const double write_mb = argc > 2 ? atof(argv[2]) : 12.85;
  const int rd = read_mb >= write_mb ? (int)(read_mb / write_mb + 0.5) : 1;
  const int wr = write_mb > read_mb ? (int)(write_mb / read_mb + 0.5) : 1;
  const long units = (long)((read_mb < write_mb ? read_mb : write_mb) * 1e6 / 16);
  uint4 *in, *out;
  check(cudaMalloc(&in, units * rd * 16), "malloc in");
  check(cudaMalloc(&out, units * wr * 16), "malloc out");
  fill<<<1024, 256>>>(in, units * rd);
  check(cudaDeviceSynchronize(), "fill");
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const double bytes = (double)units * 16 * (rd + wr);
  if (rd == 4 && wr == 1) run<4, 1>(in, out, units, sms, bytes);
  else if (rd == 1 && wr == 2) run<1, 2>(in, out, units, sms, bytes);
  else if (rd == 1 && wr == 1) run<1, 1>(in, out, units, sms, bytes);
  else if (rd == 2 && wr == 1) run<2, 1>(in, out, units, sms, bytes);
  else {
    printf("membw: read/write ratio %d:%d has no kernel here (1:1, 2:1, 4:1, 1:2)\n", rd, wr);
    return 1;
  }
  // A device-to-device copy of the larger size, bytes read and written counted.
  const long big = units * (rd > wr ? rd : wr);
  uint4* copy;
  check(cudaMalloc(&copy, big * 16), "malloc copy");
  const uint4* src = rd >= wr ? in : out;
  const double us = time_graph([&](cudaStream_t st) { cudaMemcpyAsync(copy, src, big * 16, cudaMemcpyDeviceToDevice, st); });
  printf("membw memcpy   %.2f MB device to device: %7.2f us, %.2f TB/s\n", big * 16.0 / 1e6, us, 2.0 * big * 16 / us / 1e6);
  return 0;
}
#endif
