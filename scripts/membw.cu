// The memory roofline of a streaming layer on this GPU: a kernel that reads READ_MB and writes
// WRITE_MB with 16-byte accesses (per unit of work, R vectors read and W written, in the ratio of
// the two sizes, as a 1x1 convolution reads its input channels and writes its output channels),
// timed warm (the same buffers replayed, as the worker times) over many launches. Built and run by `gpu-check.sh membw`:
//   membw READ_MB WRITE_MB   ->   us per launch, TB/s moved
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

__global__ void stream(const uint4* __restrict__ in, uint4* __restrict__ out, long units, int rd, int wr) {
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

int main(int argc, char** argv) {
  const double read_mb = argc > 1 ? atof(argv[1]) : 51.38;
  const double write_mb = argc > 2 ? atof(argv[2]) : 12.85;
  const int rd = read_mb >= write_mb ? (int)(read_mb / write_mb + 0.5) : 1;
  const int wr = write_mb > read_mb ? (int)(write_mb / read_mb + 0.5) : 1;
  const long units = (long)((read_mb < write_mb ? read_mb : write_mb) * 1e6 / 16);
  uint4 *in, *out;
  cudaMalloc(&in, units * rd * 16);
  cudaMalloc(&out, units * wr * 16);
  cudaMemset(in, 1, units * rd * 16);
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int blocks_per_sm : {2, 4, 8, 16}) {
    const int grid = sms * blocks_per_sm;
    for (int i = 0; i < 20; ++i) stream<<<grid, 256>>>(in, out, units, rd, wr);
    const int reps = 200;
    cudaEventRecord(a);
    for (int i = 0; i < reps; ++i) stream<<<grid, 256>>>(in, out, units, rd, wr);
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    const double us = ms * 1e3 / reps;
    const double bytes = (double)units * 16 * (rd + wr);
    printf("membw read %.2f MB write %.2f MB grid %d x 256: %.2f us, %.2f TB/s\n", units * 16.0 * rd / 1e6,
           units * 16.0 * wr / 1e6, grid, us, bytes / us / 1e6);
  }
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
