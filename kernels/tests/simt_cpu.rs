//! `simt_gemm` and `simt_conv2d` run on the CPU: the generated CUDA source, compiled by the host's
//! C++20 compiler (`$CXX`, else `c++`) behind a shim that runs one `std::thread` per CUDA thread,
//! a `std::barrier` for `__syncthreads` and the blocks one after another, on inputs of small
//! integers (every sum exact in f32), compared element by element with a float64 reference.
//! This checks what a machine without a GPU can: the indexing of every warp tile, min_blocks,
//! double buffering, split-K (and that its counters are left at zero for the next launch), each
//! layout, ragged edges, alpha/beta and the im2col gather with padding, stride and dilation. It
//! says nothing of speed or of the GPU's memory model.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use tensortune_kernels::simt::SimtGemm;
use tensortune_kernels::simt_conv::SimtConv2d;
use tensortune_kernels::template::valid_configs;
use tensortune_kernels::{Config, Target, Template, Workload, cuda};

/// What the kernels need of CUDA, on the host. `__shared__` variables are `static`: blocks run one
/// at a time, and every thread of the block sees the same one.
const SHIM: &str = r#"
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>
struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };
struct int2 { int x, y; };
inline int2 make_int2(int a, int b) { return {a, b}; }
struct dim3s { unsigned x = 0, y = 0, z = 0; };
thread_local dim3s threadIdx;
dim3s blockIdx;
namespace emu { unsigned char* smem; std::barrier<>* bar; }
#define __syncthreads() emu::bar->arrive_and_wait()
#define __threadfence() std::atomic_thread_fence(std::memory_order_seq_cst)
inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
using std::min;
#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __shared__ static
#define TT_FAULT_HOOK
"#;

/// `common.cuh`'s part that simt kernels use.
const COMMON: &str = r#"
namespace tt {
template <int BYTES> struct vec_t;
template <> struct vec_t<16> { typedef uint4 type; };
template <> struct vec_t<8> { typedef uint2 type; };
template <> struct vec_t<4> { typedef unsigned int type; };
template <typename T> inline T load_cg(const T* p) { return *(volatile const T*)p; }
}
"#;

/// Launches kernel NS (grid GX x 1 x GZ of THREADS) twice on the same buffers, so a split-K
/// launch also starts from the counters the first one left.
const LAUNCH: &str = r#"
  std::vector<unsigned char> ws(WS + 16, 0), sm(SMEM + 16);
  for (int launch = 0; launch < 2; ++launch) {
    for (unsigned bz = 0; bz < GZ; ++bz) {
      for (unsigned bx = 0; bx < GX; ++bx) {
        blockIdx = {bx, 0, bz};
        std::memset(sm.data(), 0xff, sm.size());
        emu::smem = sm.data();
        std::barrier<> bar(THREADS);
        emu::bar = &bar;
        std::vector<std::thread> threads;
        for (unsigned t = 0; t < THREADS; ++t) {
          threads.emplace_back([&, t] { threadIdx = {t, 0, 0}; NS::NS(OP_A, OP_B, c.data(), d.data(), ws.data()); });
        }
        for (auto& t : threads) t.join();
      }
    }
  }
  for (int i = 0; i < ns_counters(WS); ++i) if (ws[i] != 0) { std::printf("NS: split-K counter byte %d left at %d\n", i, ws[i]); return 1; }
"#;

const GEMM_CHECK: &str = r#"
int run_NS() {
  using namespace NS::cfg;
  std::vector<float> a((size_t)M * K), b((size_t)K * N), c((size_t)M * N), d((size_t)M * N, NAN);
  fill(a); fill(b); fill(c);
  LAUNCH
  for (int n = 0; n < N; ++n) for (int m = 0; m < M; ++m) {
    double acc = 0;
    for (int k = 0; k < K; ++k) acc += (double)(A_K_CONTIG ? a[(size_t)m * K + k] : a[(size_t)k * M + m]) * (B_K_CONTIG ? b[(size_t)n * K + k] : b[(size_t)k * N + n]);
    const double want = ALPHA * acc + (READ_C ? BETA * c[(size_t)n * M + m] : 0.0);
    if (d[(size_t)n * M + m] != want) { std::printf("NS: D[%d, %d] = %g, want %g\n", m, n, d[(size_t)n * M + m], want); return 1; }
  }
  return 0;
}
"#;

const CONV_CHECK: &str = r#"
int run_NS() {
  using namespace NS::cfg;
  const int batch = N / (P * Q);
  std::vector<float> x((size_t)batch * H * W * CI), f((size_t)KO * R * S * CI), c((size_t)M * N), d((size_t)M * N, NAN);
  fill(x); fill(f);
  LAUNCH
  for (int n = 0; n < batch; ++n) for (int p = 0; p < P; ++p) for (int q = 0; q < Q; ++q) for (int k = 0; k < KO; ++k) {
    double acc = 0;
    for (int r = 0; r < R; ++r) for (int s = 0; s < S; ++s) {
      const int h = p * STRIDE_H - PAD_H + r * DIL_H, w = q * STRIDE_W - PAD_W + s * DIL_W;
      if (h < 0 || h >= H || w < 0 || w >= W) continue;
      for (int ci = 0; ci < CI; ++ci) acc += (double)x[(((size_t)n * H + h) * W + w) * CI + ci] * f[(((size_t)k * R + r) * S + s) * CI + ci];
    }
    const float got = d[(((size_t)n * P + p) * Q + q) * KO + k];
    if (got != acc) { std::printf("NS: out[%d, %d, %d, %d] = %g, want %g\n", n, p, q, k, got, acc); return 1; }
  }
  return 0;
}
"#;

/// One valid config of each (warp_tile, min_blocks, double_buffer, split_k > 1) kind of
/// `workload`, spread over the space.
fn one_of_each_kind(template: &dyn Template, w: &Workload, turn: usize) -> Vec<Config> {
    let mut kinds: BTreeMap<String, Vec<Config>> = BTreeMap::new();
    for (_, c) in valid_configs(template, w, &Target::sm90()).unwrap() {
        let kind = format!(
            "{}/{}/{}/{}",
            c.name("warp_tile").unwrap(),
            c.int("min_blocks").unwrap(),
            c.int("double_buffer").unwrap(),
            c.int("split_k").unwrap() > 1
        );
        kinds.entry(kind).or_default().push(c);
    }
    kinds.into_values().map(|v| v[(v.len() / 3 + 7 * turn) % v.len()].clone()).collect()
}

/// The program that runs every kernel of `specs` and prints one line per failure.
fn program(specs: &[(bool, tensortune_kernels::KernelSpec)]) -> String {
    let mut out = String::from(SHIM);
    out.push_str(
        "static unsigned seed = 12345;\n\
         static void fill(std::vector<float>& v) { for (auto& e : v) { seed = seed * 1103515245u + 12345u; e = (float)((int)((seed >> 16) % 9) - 4); } }\n",
    );
    for (conv, spec) in specs {
        let body = spec.source.strip_prefix(cuda::PREAMBLE).expect("every source starts with the preamble");
        assert!(body.contains(cuda::COMMON), "{}: common.cuh is not in the source verbatim", spec.name);
        out.push_str(
            &body
                .replace(cuda::COMMON, COMMON)
                .replace("extern __shared__ __align__(16) unsigned char smem[];", "unsigned char* smem = emu::smem;"),
        );
        let ns = format!("ns_{}::{}", spec.name, spec.name);
        let counters = format!("ns_{}::tt::COUNTERS_BYTES", spec.name);
        let launch = LAUNCH
            .replace("NS::NS", &ns)
            .replace("ns_counters(WS)", &format!("(WS ? {counters} : 0)"))
            .replace("WS", &spec.workspace_bytes.to_string())
            .replace("SMEM", &spec.smem_bytes.to_string())
            .replace("GX", &spec.grid[0].to_string())
            .replace("GZ", &spec.grid[2].to_string())
            .replace("THREADS", &spec.block[0].to_string());
        // A convolution's GEMM multiplies the filter by the input.
        let (check, a, b) =
            if *conv { (CONV_CHECK, "f.data()", "x.data()") } else { (GEMM_CHECK, "a.data()", "b.data()") };
        let launch = launch.replace("OP_A", a).replace("OP_B", b).replace("NS", &spec.name);
        out.push_str(
            &check
                .replace("LAUNCH", &launch)
                .replace("NS::cfg", &format!("ns_{}::cfg", spec.name))
                .replace("NS", &spec.name),
        );
    }
    out.push_str("int main() {\n  int bad = 0;\n");
    for (_, spec) in specs {
        out.push_str(&format!("  bad += run_{}();\n", spec.name));
    }
    out.push_str("  std::printf(\"%d bad\\n\", bad);\n  return bad ? 1 : 0;\n}\n");
    out
}

fn compile_and_run(dir: &Path, source: &str) -> String {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let src = dir.join("simt.cpp");
    let exe = dir.join("simt");
    std::fs::write(&src, source).unwrap();
    let out = Command::new(&cxx)
        .args(["-std=c++20", "-O1", "-fno-strict-aliasing", "-w", "-pthread"])
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap_or_else(|e| panic!("{cxx} did not start ({e}): this test needs a C++20 compiler (set CXX)"));
    assert!(out.status.success(), "{cxx} failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let run = Command::new(&exe).output().unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout).into_owned();
    assert!(run.status.success(), "kernels computed wrong results:\n{stdout}");
    stdout
}

#[test]
fn simt_gemm_and_simt_conv2d_compute_exact_results_on_the_cpu() {
    let t = Target::sm90();
    let mut specs = Vec::new();
    let gemms = [
        "matmul/m256n256k64/nn/f32,f32,f32/alpha=1,beta=0",
        "matmul/m128n256k72/tn/f32,f32,f32/alpha=1,beta=0",
        "matmul/m200n72k260/nt/f32,f32,f32/alpha=2,beta=1",
        "matmul/m96n136k40/tt/f32,f32,f32/alpha=1,beta=-1",
    ];
    for (turn, key) in gemms.into_iter().enumerate() {
        let w = Workload::from_key(key).unwrap();
        for c in one_of_each_kind(&SimtGemm, &w, turn).into_iter().step_by(3) {
            specs.push((false, SimtGemm.generate(&w, &c, &t).unwrap()));
        }
    }
    let convs = [
        "conv2d/n2h9w7c8/k32r3s3/pad1x1,stride1x1,dil1x1/nhwc/f32,f32,f32",
        "conv2d/n1h12w10c6/k48r3s2/pad1x0,stride2x1,dil1x2/nhwc/f32,f32,f32",
        "conv2d/n3h8w8c3/k20r5s5/pad2x2,stride1x1,dil1x1/nhwc/f32,f32,f32",
    ];
    for (turn, key) in convs.into_iter().enumerate() {
        let w = Workload::from_key(key).unwrap();
        for c in one_of_each_kind(&SimtConv2d, &w, turn).into_iter().step_by(4) {
            specs.push((true, SimtConv2d.generate(&w, &c, &t).unwrap()));
        }
    }
    assert!(specs.len() >= 30, "only {} kernels", specs.len());
    for kind in ["_w8x4_mb2_", "_w4x8_mb1_", "_wnone_", "_db1_", "_k2_", "tt_simt_conv2d_"] {
        assert!(specs.iter().any(|(_, s)| s.name.contains(kind)), "no kernel of kind {kind}");
    }
    // Cargo's scratch directory for integration tests, inside the target directory.
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("simt_cpu");
    std::fs::create_dir_all(&dir).unwrap();
    // Halves, so each program compiles in a reasonable time.
    let (first, second) = specs.split_at(specs.len() / 2);
    for part in [first, second] {
        let out = compile_and_run(&dir, &program(part));
        assert!(out.contains("0 bad"), "{out}");
    }
}
