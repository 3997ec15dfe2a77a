// tensortune: the entry point of a WMMA template's kernel, after the template's body, which defines
// tt::kernel_body (block -> output tile, then wmma_core.cuh's block_tile). The arguments are
// KernelSpec::args: A, B, C, D, workspace.

extern "C" __global__ void __launch_bounds__(tt::THREADS, cfg::MIN_BLOCKS) TT_CLUSTER_ATTR
    KERNEL_NAME(const T_IN* __restrict__ A, const T_IN* __restrict__ B, const T_OUT* __restrict__ C,
                T_OUT* __restrict__ D, unsigned char* __restrict__ workspace) {
  TT_FAULT_HOOK;
  extern __shared__ __align__(128) unsigned char smem[];
  tt::kernel_body(smem, A, B, C, D, workspace);
}
