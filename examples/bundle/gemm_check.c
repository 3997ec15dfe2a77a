/* gemm_check: loads a tensortune export bundle and, for each matmul kernel that has a cubin for
 * this GPU, checks every output element against cuBLAS (cublasGemmEx with the same types,
 * layout, alpha and beta) and times it and the vendor the way tensortune's worker does. The vendor
 * is the worker's: the fastest of cublasGemmEx and cuBLASLt's heuristic candidates (up to 8, 32
 *  MiB of workspace; worker/src/cuda/blaslt.rs), each timed twice before the rounds, so ours/vendor
 * compares with the record's like with like. Timing: a warm-up launch, then a CUDA graph holding
 * a batch of launches (batch sized so one sample lasts >= 1 ms), as the worker times. One kernel at
 * a time is loaded, checked, timed ROUNDS times, each round after an idle pause of PAUSE_MS, and
 * freed with its buffers, as the worker holds only the workloads it measures. A round times ours
 * and the vendor each alone from the full clock (it idles while NVML says the clock is held down,
 * as the worker's burst timings do), the side that goes first alternating by round: on an H200 a
 * few hundred milliseconds of 4096^3 GEMMs pull the SM clock from 1980 to 1530 MHz, and a burst
 * record is timed before that. WARM_MS of untimed replays before each timing are optional. Prints
 * one row per kernel: its fastest round, the time in its record, the ratio, the vendor's fastest,
 * ours/vendor over the record's ours/vendor ("vs-rec") and the check. TT_NO_BLAS=1
 * leaves cuBLAS out of the process (nothing is checked; only the bundle's kernels are timed).
 * TT_ONLY=S loads only the kernels whose name or "MxNxK layout input" contains S. TT_KEEP=1 checks
 * every kernel first and keeps every module and buffer until all are timed: on an H200 that holds
 * about 1.3 GB in 20 allocations for the default suite's bundle, and every 2-6 us kernel, ours and
 * cuBLAS's alike, then takes 0.15 us a launch more (docs/BENCHMARKS.md). TT_EXTRA_MB=N allocates N
 * MiB of device memory first, in TT_EXTRA_PIECES allocations.
 *
 *   nvcc -O2 -o gemm_check examples/bundle/gemm_check.c -Ibundle/c -lcuda -lcublas -lcublasLt -ldl
 *   ./gemm_check BUNDLE_DIR [SAMPLES [ROUNDS [WARM_MS [PAUSE_MS]]]]
 *
 * Inputs of the check are multiples of 1/8 in [-1, 1] (integers in [-8, 8] for i8), so with f32
 * or i32 accumulation every product and sum is exact and both libraries must agree to the
 * rounding of the output type; the timed inputs are full-precision uniform values in [-1, 1].
 * Exit status 0 when every kernel matched, 1 otherwise. */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <dlfcn.h>
#include <math.h>

#include "tensortune_bundle.h"

/* The worker's constants (worker/src/cuda/timing.rs, worker/src/plan.rs). */
#define MIN_SAMPLE_MS 1.0
#define MAX_BATCH 20000
#define PROBE_BATCH 8
#define MAX_ROUNDS 100
/* cuBLASLt's side of the vendor, as the worker asks for it (worker/src/cuda/blaslt.rs): the
 * heuristic's first LT_CANDIDATES algorithms that need at most LT_WORKSPACE bytes. */
#define LT_CANDIDATES 8
#define LT_WORKSPACE ((size_t)32 << 20)

#define CU(call)                                                                         \
  do {                                                                                   \
    CUresult r_ = (call);                                                                \
    if (r_ != CUDA_SUCCESS) {                                                            \
      const char *n_ = "?";                                                              \
      cuGetErrorName(r_, &n_);                                                           \
      fprintf(stderr, "error: %s failed: %s (%s:%d)\n", #call, n_, __FILE__, __LINE__); \
      exit(2);                                                                           \
    }                                                                                    \
  } while (0)

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) { /* xorshift64* */
  rng_state ^= rng_state >> 12, rng_state ^= rng_state << 25, rng_state ^= rng_state >> 27;
  return (uint32_t)((rng_state * 2685821657736338717ull) >> 32);
}

static uint16_t f32_to_f16(float f) { /* round to nearest even */
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000, mant = x & 0x7fffff;
  int exp = (int)((x >> 23) & 0xff) - 127 + 15;
  if (((x >> 23) & 0xff) == 0xff) return (uint16_t)(sign | 0x7c00 | (mant ? 0x200 : 0));
  if (exp >= 31) return (uint16_t)(sign | 0x7c00);
  if (exp <= 0) {
    if (exp < -10) return (uint16_t)sign;
    mant |= 0x800000;
    int shift = 14 - exp;
    uint32_t half = mant >> shift, rem = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) half++;
    return (uint16_t)(sign | half);
  }
  uint32_t half = sign | ((uint32_t)exp << 10) | (mant >> 13), rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) half++;
  return (uint16_t)half;
}

static float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, x;
  if (exp == 0) {
    if (!mant) {
      x = sign;
    } else {
      exp = 127 - 15 + 1;
      while (!(mant & 0x400)) mant <<= 1, exp--;
      x = sign | (exp << 23) | ((mant & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    x = sign | 0x7f800000 | (mant << 13);
  } else {
    x = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  }
  float f;
  memcpy(&f, &x, 4);
  return f;
}

static uint16_t f32_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  x += 0x7fff + ((x >> 16) & 1);
  return (uint16_t)(x >> 16);
}

static float bf16_to_f32(uint16_t h) {
  uint32_t x = (uint32_t)h << 16;
  float f;
  memcpy(&f, &x, 4);
  return f;
}

static size_t dsize(const char *t) {
  return !strcmp(t, "i8") ? 1 : (!strcmp(t, "f16") || !strcmp(t, "bf16")) ? 2 : 4;
}

static cudaDataType dtype(const char *t) {
  if (!strcmp(t, "f16")) return CUDA_R_16F;
  if (!strcmp(t, "bf16")) return CUDA_R_16BF;
  if (!strcmp(t, "i8")) return CUDA_R_8I;
  if (!strcmp(t, "i32")) return CUDA_R_32I;
  return CUDA_R_32F;
}

/* n values of type t into host memory: exact ones (multiples of 1/8, or integers) or uniform. */
static void *fill(const char *t, size_t n, int exact) {
  void *p = malloc(n * dsize(t));
  for (size_t i = 0; i < n; i++) {
    int q = (int)(rnd() % 17) - 8;
    float v = exact ? (float)q / 8.0f : (float)((double)rnd() / 4294967296.0 * 2.0 - 1.0);
    if (!strcmp(t, "f16")) ((uint16_t *)p)[i] = f32_to_f16(v);
    else if (!strcmp(t, "bf16")) ((uint16_t *)p)[i] = f32_to_bf16(v);
    else if (!strcmp(t, "i8")) ((int8_t *)p)[i] = (int8_t)q;
    else if (!strcmp(t, "i32")) ((int32_t *)p)[i] = q;
    else ((float *)p)[i] = v;
  }
  return p;
}

static double value(const char *t, const void *p, size_t i) {
  if (!strcmp(t, "f16")) return f16_to_f32(((const uint16_t *)p)[i]);
  if (!strcmp(t, "bf16")) return bf16_to_f32(((const uint16_t *)p)[i]);
  if (!strcmp(t, "i32")) return ((const int32_t *)p)[i];
  if (!strcmp(t, "i8")) return ((const int8_t *)p)[i];
  return ((const float *)p)[i];
}

static CUdeviceptr upload(const void *host, size_t bytes) {
  CUdeviceptr d;
  CU(cuMemAlloc(&d, bytes < 256 ? 256 : bytes));
  if (host) CU(cuMemcpyHtoD(d, host, bytes));
  return d;
}

/* alpha, beta and the compute and scale types of an entry's vendor GEMM (cuBLAS and cuBLASLt
 * alike); alpha and beta point into the struct. */
typedef struct {
  float f[2];
  uint16_t h[2];
  int32_t i[2];
  cublasComputeType_t compute;
  cudaDataType scale;
  const void *alpha, *beta;
} scalars;

static void scalars_of(const tt_entry *e, scalars *s) {
  s->f[0] = (float)e->alpha, s->f[1] = (float)e->beta;
  s->h[0] = f32_to_f16(s->f[0]), s->h[1] = f32_to_f16(s->f[1]);
  s->i[0] = (int32_t)e->alpha, s->i[1] = (int32_t)e->beta;
  s->compute = CUBLAS_COMPUTE_32F, s->scale = CUDA_R_32F, s->alpha = &s->f[0], s->beta = &s->f[1];
  if (!strcmp(e->acc, "f16")) s->compute = CUBLAS_COMPUTE_16F, s->scale = CUDA_R_16F, s->alpha = &s->h[0], s->beta = &s->h[1];
  if (!strcmp(e->acc, "i32")) s->compute = CUBLAS_COMPUTE_32I, s->scale = CUDA_R_32I, s->alpha = &s->i[0], s->beta = &s->i[1];
  /* tf32 inputs are f32 in memory (dtype() says CUDA_R_32F), multiplied as TF32. */
  if (!strcmp(e->input, "tf32")) s->compute = CUBLAS_COMPUTE_32F_FAST_TF32;
}

/* An entry's matmul described to cuBLASLt, column-major as cublasGemmEx reads it (C is D), and the
 * algorithms its heuristic proposed. */
typedef struct {
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t a, b, d;
  cublasLtMatmulAlgo_t algo[LT_CANDIDATES];
  int n;
} lt_plan;

static void lt_plan_free(lt_plan *p) {
  if (p->a) cublasLtMatrixLayoutDestroy(p->a);
  if (p->b) cublasLtMatrixLayoutDestroy(p->b);
  if (p->d) cublasLtMatrixLayoutDestroy(p->d);
  if (p->desc) cublasLtMatmulDescDestroy(p->desc);
  memset(p, 0, sizeof *p);
}

/* Plans `e` and keeps the usable candidates; 0 of them (the plan freed) when cuBLASLt has none,
 * and the vendor is then cublasGemmEx alone. */
static int lt_plan_new(cublasLtHandle_t lt, const tt_entry *e, lt_plan *p) {
  memset(p, 0, sizeof *p);
  if (!lt) return 0;
  scalars s;
  scalars_of(e, &s);
  uint64_t m = e->shape[0], n = e->shape[1], k = e->shape[2];
  int a_t = e->layout[0] == 't', b_t = e->layout[1] == 't';
  cublasOperation_t ta = a_t ? CUBLAS_OP_T : CUBLAS_OP_N, tb = b_t ? CUBLAS_OP_T : CUBLAS_OP_N;
  uint64_t ws = LT_WORKSPACE;
  cublasLtMatmulPreference_t pref = NULL;
  cublasLtMatmulHeuristicResult_t rows[LT_CANDIDATES];
  int got = 0;
  int ok = cublasLtMatmulDescCreate(&p->desc, s.compute, s.scale) == CUBLAS_STATUS_SUCCESS &&
           cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) == CUBLAS_STATUS_SUCCESS &&
           cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) == CUBLAS_STATUS_SUCCESS &&
           cublasLtMatrixLayoutCreate(&p->a, dtype(e->input), a_t ? k : m, a_t ? m : k, (int64_t)(a_t ? k : m)) == CUBLAS_STATUS_SUCCESS &&
           cublasLtMatrixLayoutCreate(&p->b, dtype(e->input), b_t ? n : k, b_t ? k : n, (int64_t)(b_t ? n : k)) == CUBLAS_STATUS_SUCCESS &&
           cublasLtMatrixLayoutCreate(&p->d, dtype(e->output), m, n, (int64_t)m) == CUBLAS_STATUS_SUCCESS &&
           cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS &&
           cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws) == CUBLAS_STATUS_SUCCESS &&
           cublasLtMatmulAlgoGetHeuristic(lt, p->desc, p->a, p->b, p->d, p->d, pref, LT_CANDIDATES, rows, &got) == CUBLAS_STATUS_SUCCESS;
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  for (int i = 0; ok && i < got && i < LT_CANDIDATES; i++)
    if (rows[i].state == CUBLAS_STATUS_SUCCESS && rows[i].workspaceSize <= LT_WORKSPACE) p->algo[p->n++] = rows[i].algo;
  if (!p->n) lt_plan_free(p);
  return p->n;
}

typedef struct {
  cublasHandle_t h;
  cublasLtHandle_t lt;
  const tt_entry *e;
  const lt_plan *plan;
  CUdeviceptr a, b, d, lt_ws;
  int pick; /* -1: cublasGemmEx; otherwise the index of cuBLASLt's candidate in `plan` */
} blas_call;

/* D = alpha op(A) op(B) + beta D with the entry's types and layout (C is D, in place), by the
 * call's pick, enqueued on `s` (cublasGemmEx's handle is bound to it already). */
static int blas_gemm(const blas_call *c, CUstream s) {
  const tt_entry *e = c->e;
  int m = (int)e->shape[0], n = (int)e->shape[1], k = (int)e->shape[2];
  int a_t = e->layout[0] == 't', b_t = e->layout[1] == 't';
  int lda = a_t ? k : m, ldb = b_t ? n : k;
  scalars sc;
  scalars_of(e, &sc);
  void *a = (void *)(uintptr_t)c->a, *b = (void *)(uintptr_t)c->b, *d = (void *)(uintptr_t)c->d;
  cublasStatus_t st;
  if (c->pick >= 0) {
    const lt_plan *p = c->plan;
    st = cublasLtMatmul(c->lt, p->desc, sc.alpha, a, p->a, b, p->b, sc.beta, d, p->d, d, p->d, &p->algo[c->pick],
                        (void *)(uintptr_t)c->lt_ws, LT_WORKSPACE, (cudaStream_t)s);
  } else {
    st = cublasGemmEx(c->h, a_t ? CUBLAS_OP_T : CUBLAS_OP_N, b_t ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, sc.alpha, a,
                      dtype(e->input), lda, b, dtype(e->input), ldb, sc.beta, d, dtype(e->output), m, sc.compute,
                      CUBLAS_GEMM_DEFAULT);
  }
  return st == CUBLAS_STATUS_SUCCESS ? 0 : -1;
}


/* The SM clock now, MHz, through NVML loaded at run time (0 when it is missing). */
/* The GPU's state through NVML (dlopen'ed, so the program runs without it): SM and memory clocks,
 * MHz, and the performance state (0 = P0). Zeros when NVML is not there. The handle is the CUDA
 * device's own (by PCI bus id), so CUDA_VISIBLE_DEVICES cannot point it at another GPU. */
typedef struct {
  unsigned sm_mhz, mem_mhz, pstate;
} gpu_state;

static struct {
  int tried;
  void *dev; /* NULL without NVML */
  int (*clock_info)(void *, unsigned, unsigned *);
  int (*perf_state)(void *, int *);
  int (*reasons)(void *, unsigned long long *);
  unsigned max_sm_mhz;
} nvml;

static void nvml_open(CUdevice cu) {
  if (nvml.tried) return;
  nvml.tried = 1;
  void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
  int (*init)(void) = lib ? (int (*)(void))dlsym(lib, "nvmlInit_v2") : NULL;
  if (!init || init() != 0) return;
  int (*by_bus)(const char *, void **) = (int (*)(const char *, void **))dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2");
  int (*max_clock)(void *, unsigned, unsigned *) =
      (int (*)(void *, unsigned, unsigned *))dlsym(lib, "nvmlDeviceGetMaxClockInfo");
  char bus[32];
  if (!by_bus || cuDeviceGetPCIBusId(bus, sizeof bus, cu) != CUDA_SUCCESS || by_bus(bus, &nvml.dev) != 0) {
    nvml.dev = NULL;
    return;
  }
  nvml.clock_info = (int (*)(void *, unsigned, unsigned *))dlsym(lib, "nvmlDeviceGetClockInfo");
  nvml.perf_state = (int (*)(void *, int *))dlsym(lib, "nvmlDeviceGetPerformanceState");
  nvml.reasons = (int (*)(void *, unsigned long long *))dlsym(lib, "nvmlDeviceGetCurrentClocksEventReasons");
  if (!nvml.reasons)
    nvml.reasons = (int (*)(void *, unsigned long long *))dlsym(lib, "nvmlDeviceGetCurrentClocksThrottleReasons");
  if (max_clock && max_clock(nvml.dev, 1 /* NVML_CLOCK_SM */, &nvml.max_sm_mhz) != 0) nvml.max_sm_mhz = 0;
  if (!nvml.clock_info) nvml.dev = NULL;
}

static gpu_state gpu_now(void) {
  gpu_state g = {0, 0, 0};
  if (!nvml.dev) return g;
  nvml.clock_info(nvml.dev, 1 /* NVML_CLOCK_SM */, &g.sm_mhz);
  nvml.clock_info(nvml.dev, 2 /* NVML_CLOCK_MEM */, &g.mem_mhz);
  int p = 0;
  if (nvml.perf_state && nvml.perf_state(nvml.dev, &p) == 0) g.pstate = (unsigned)p;
  return g;
}

/* Whether the clock is held down, by the worker's rule (worker/src/cuda/nvml.rs): an event reason
 * that holds it under load (SW power cap 0x4, HW slowdown 0x8, SW/HW thermal 0x20/0x40, power
 * brake 0x80), or an SM clock between 50% (an idle GPU's) and 97% of its maximum, still climbing
 * back after a cap let go. False without NVML. */
static int capped(void) {
  if (!nvml.dev) return 0;
  unsigned long long r = 0;
  if (nvml.reasons && nvml.reasons(nvml.dev, &r) == 0 && (r & (0x4 | 0x8 | 0x20 | 0x40 | 0x80))) return 1;
  gpu_state g = gpu_now();
  double max = nvml.max_sm_mhz;
  return max > 0 && g.sm_mhz > 0 && g.sm_mhz < 0.97 * max && g.sm_mhz > 0.5 * max;
}

/* Idles in 10 ms polls while the clock is held down, at most 1 s (the worker's burst timings do
 * the same before each timing); returns the milliseconds waited. */
static double idle_while_capped(void) {
  double waited = 0;
  struct timespec poll = {0, 10 * 1000 * 1000};
  while (waited < 1000 && capped()) nanosleep(&poll, NULL), waited += 10;
  return waited;
}

/* Whether an entry is selected by a TT_ONLY / TT_TIME_ONLY filter: a substring of its kernel name
 * or of "MxNxK layout input" (e.g. "512x32x512", "tn i8"); no filter selects everything. */
static int selected(const tt_entry *e, const char *filter) {
  if (!filter || !*filter) return 1;
  char key[96];
  snprintf(key, sizeof key, "%llux%llux%llu %s %s", (unsigned long long)e->shape[0], (unsigned long long)e->shape[1],
           (unsigned long long)e->shape[2], e->layout, e->input);
  return strstr(key, filter) != NULL || strstr(e->name, filter) != NULL;
}

typedef int (*enqueue_fn)(void *ctx, CUstream s);

static CUgraphExec capture(CUstream s, int batch, enqueue_fn f, void *ctx) {
  CUgraph g;
  CUgraphExec x;
  CU(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  int failed = 0;
  for (int i = 0; i < batch && !failed; i++) failed = f(ctx, s) != 0;
  CU(cuStreamEndCapture(s, &g));
  if (failed) {
    fprintf(stderr, "error: a launch failed during capture\n");
    exit(2);
  }
  CU(cuGraphInstantiate(&x, g, 0));
  CU(cuGraphDestroy(g));
  CU(cuGraphUpload(x, s));
  return x;
}

static double replay_ms(CUgraphExec x, CUstream s) {
  CUevent a, b;
  float ms;
  CU(cuEventCreate(&a, CU_EVENT_DEFAULT));
  CU(cuEventCreate(&b, CU_EVENT_DEFAULT));
  CU(cuEventRecord(a, s));
  CU(cuGraphLaunch(x, s));
  CU(cuEventRecord(b, s));
  CU(cuEventSynchronize(b));
  CU(cuEventElapsedTime(&ms, a, b));
  cuEventDestroy(a), cuEventDestroy(b);
  return ms;
}

static int cmp_double(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return (a > b) - (a < b);
}

/* A warm-up launch, a probe graph of 8 launches, then the graph of `batch` launches (sized so one
 * sample lasts >= 1 ms) that samples replay, as the worker captures it; NULL when a launch failed. */
static CUgraphExec prepared(CUstream s, enqueue_fn f, void *ctx, int *batch_out) {
  if (f(ctx, s) != 0) return NULL;
  CU(cuStreamSynchronize(s));
  CUgraphExec probe = capture(s, PROBE_BATCH, f, ctx);
  replay_ms(probe, s);
  double per = replay_ms(probe, s) / PROBE_BATCH;
  cuGraphExecDestroy(probe);
  if (per < 1e-6) per = 1e-6;
  int batch = (int)(MIN_SAMPLE_MS / per + 0.999);
  if (batch < 1) batch = 1;
  if (batch > MAX_BATCH) batch = MAX_BATCH;
  *batch_out = batch;
  return capture(s, batch, f, ctx);
}

/* Per-launch microseconds, as the worker takes a burst timing: a prepared graph, one untimed replay
 * (more, until `warm_ms` have passed), then `samples` back-to-back replays of it, the fastest
 * sample (the kernel at the full clock: a 1.4 ms GEMM meets the power cap within its own samples,
 * so their median lands anywhere between the full-clock and the capped time; see the worker's
 * cuda/timing.rs). */
static double time_us(CUstream s, int samples, double warm_ms, enqueue_fn f, void *ctx, int *batch_out) {
  int batch = 0;
  CUgraphExec g = prepared(s, f, ctx, &batch);
  if (!g) return -1;
  double warm = replay_ms(g, s);
  while (warm < warm_ms) warm += replay_ms(g, s);
  CUevent *ev = (CUevent *)malloc(sizeof(CUevent) * (size_t)(samples + 1));
  for (int i = 0; i <= samples; i++) CU(cuEventCreate(&ev[i], CU_EVENT_DEFAULT));
  CU(cuEventRecord(ev[0], s));
  for (int i = 0; i < samples; i++) {
    CU(cuGraphLaunch(g, s));
    CU(cuEventRecord(ev[i + 1], s));
  }
  CU(cuEventSynchronize(ev[samples]));
  double *us = (double *)malloc(sizeof(double) * (size_t)samples);
  for (int i = 0; i < samples; i++) {
    float ms;
    CU(cuEventElapsedTime(&ms, ev[i], ev[i + 1]));
    us[i] = ms * 1e3 / batch;
  }
  qsort(us, (size_t)samples, sizeof *us, cmp_double);
  double fastest = us[0];
  for (int i = 0; i <= samples; i++) cuEventDestroy(ev[i]);
  free(ev), free(us);
  cuGraphExecDestroy(g);
  *batch_out = batch;
  return fastest;
}

typedef struct {
  tt_kernel *k;
  CUdeviceptr a, b, c, d;
} ours_call;

/* One checked kernel, kept loaded with its timing inputs until the rounds are done. */
typedef struct {
  tt_kernel k;
  const tt_entry *entry; /* kept after the kernel is unloaded */
  CUdeviceptr at, bt, c, d, dref;
  ours_call ours;
  blas_call blas; /* its pick: the vendor, chosen by pick_vendor */
  lt_plan plan;
  char key[64], check[160], vendor[48];
  double ours_us[MAX_ROUNDS], blas_us[MAX_ROUNDS]; /* each round's time of ours and of the vendor */
  int batch, timed;
} slot;

static int enqueue_ours(void *p, CUstream s) {
  ours_call *c = (ours_call *)p;
  if (tt_kernel_launch(c->k, s, c->a, c->b, c->c, c->d) != 0) {
    fprintf(stderr, "error: %s\n", c->k->error);
    return -1;
  }
  return 0;
}

static int enqueue_blas(void *p, CUstream s) { return blas_gemm((const blas_call *)p, s); }

/* The vendor, as the worker's baseline: the fastest of cublasGemmEx and cuBLASLt's candidates (the
 * record's vendor time is the fastest of the same set). Each is timed in two passes over all of
 * them and scored by the slower of its two times, so that one lucky measurement does not pick it:
 * an i8 512x64x512 pick read 3.31 us in every round after a pick pass had it fastest, where the
 * other runs' pick read 2.97 (H200, 2026-11-28). Prints every candidate's two times. */
static void pick_vendor(slot *sl, CUstream stream, int samples) {
  double t[2][LT_CANDIDATES + 1];
  int batch = 0;
  for (int pass = 0; pass < 2; pass++)
    for (int pick = -1; pick < sl->plan.n; pick++) {
      blas_call c = sl->blas;
      c.pick = pick;
      idle_while_capped(); /* each candidate from the full clock, as the worker's baseline is */
      t[pass][pick + 1] = time_us(stream, samples, 0, enqueue_blas, &c, &batch);
    }
  double best = -1;
  int best_pick = -1;
  printf("vendor candidates %s:", sl->key);
  for (int pick = -1; pick < sl->plan.n; pick++) {
    double a = t[0][pick + 1], b = t[1][pick + 1], score = a > b ? a : b;
    printf(" %s%d %.2f/%.2f", pick < 0 ? "gemmex" : "lt#", pick < 0 ? 0 : pick + 1, a, b);
    if (a > 0 && b > 0 && (best < 0 || score < best)) best = score, best_pick = pick;
  }
  printf("\n");
  sl->blas.pick = best_pick;
  if (best_pick < 0) snprintf(sl->vendor, sizeof sl->vendor, "cublasGemmEx");
  else snprintf(sl->vendor, sizeof sl->vendor, "cublasLt #%d of %d", best_pick + 1, sl->plan.n);
}

/* The vendor call the record timed, when its kind names one this process has (cublasGemmEx, or
 * cuBLASLt's heuristic candidate #k of n where this process's heuristic also returns n): the check
 * then times the same call as the record, like with like, and times no candidates (whose timings,
 * back to back, heat the GPU: a pick made from them chose cuBLASLt #3 at 681.6 us where the record's
 * call read 633-644; H200, 2026-11-29). Returns 0 when the kind names none (TT_OWN_PICK=1: always). */
static int record_pick(slot *sl) {
  const char *kind = sl->entry->vendor_kind;
  int k = 0, n = 0;
  if (getenv("TT_OWN_PICK") && !strcmp(getenv("TT_OWN_PICK"), "1")) return 0;
  if (!strncmp(kind, "cublasGemmEx", 12)) {
    sl->blas.pick = -1;
    snprintf(sl->vendor, sizeof sl->vendor, "cublasGemmEx (rec)");
  } else if (sscanf(kind, "cublasLt heuristic #%d of %d", &k, &n) == 2 && n == sl->plan.n && k >= 1 && k <= n) {
    sl->blas.pick = k - 1;
    snprintf(sl->vendor, sizeof sl->vendor, "cublasLt #%d/%d (rec)", k, n);
  } else {
    return 0;
  }
  printf("vendor %s: the record's %s\n", sl->key, kind);
  return 1;
}

/* Times one checked kernel ROUNDS times as the worker times a burst finalist: each round after an
 * idle pause of PAUSE_MS, ours and the vendor each timed alone (SAMPLES samples, their median) from
 * the full clock (idle_while_capped before each), the side that goes first alternating from round
 * to round; a kernel's time is its fastest round, the vendor's its fastest, as a burst record and
 * its vendor are kept. Before (2026-11-29), a round timed both sample by sample in one stretch: a
 * 1.5 ms kernel's stretch reached the power cap within its own samples (f16 8192^3 read 1560 us
 * against the vendor's 1628 where both read 1446/1432 at the full clock; H200), and the pair's
 * ratio at the cap is not the record's ratio at the full clock. */
static void time_slot(slot *sl, CUstream stream, int samples, int rounds, double warm_ms, double pause_ms,
                      int no_blas) {
  if (!no_blas && !record_pick(sl)) pick_vendor(sl, stream, samples);
  for (int r = 0; r < rounds; r++) {
    if (pause_ms > 0) {
      struct timespec ts = {(time_t)(pause_ms / 1000), (long)(fmod(pause_ms, 1000.0) * 1e6)};
      nanosleep(&ts, NULL);
    }
    int blas_batch = 0, vendor_first = r % 2;
    double t[2] = {0, 0}, waited[2] = {0, 0};
    gpu_state g[2] = {{0, 0, 0}, {0, 0, 0}}; /* each side's state as its timing starts */
    for (int k = 0; k < 2; k++) {
      int side = k ^ vendor_first; /* 0: ours, 1: the vendor */
      if (side == 1 && no_blas) continue;
      waited[side] = idle_while_capped();
      g[side] = gpu_now();
      t[side] = side == 0 ? time_us(stream, samples, warm_ms, enqueue_ours, &sl->ours, &sl->batch)
                          : time_us(stream, samples, warm_ms, enqueue_blas, &sl->blas, &blas_batch);
    }
    double ratio = no_blas || t[1] <= 0 ? -1 : t[0] / t[1];
    if (t[0] > 0 && (no_blas || t[1] > 0))
      sl->ours_us[sl->timed] = t[0], sl->blas_us[sl->timed++] = t[1];
    printf("round %d %-30s kernel %9.2f us (SM %u MHz, idled %.0f ms)  vendor %9.2f us (%s; SM %u MHz, idled %.0f "
           "ms)  ratio %.4f%s  memory %u MHz  P%u\n",
           r + 1, sl->key, t[0], g[0].sm_mhz, waited[0], t[1], sl->vendor, g[1].sm_mhz, waited[1], ratio,
           vendor_first ? "  vendor first" : "", g[0].mem_mhz, g[0].pstate);
  }
}

static void release_slot(slot *sl) {
  CUdeviceptr *bufs[] = {&sl->at, &sl->bt, &sl->c, &sl->d, &sl->dref};
  for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) {
    if (*bufs[i]) cuMemFree(*bufs[i]);
    *bufs[i] = 0;
  }
  if (sl->k.module) tt_kernel_unload(&sl->k);
  lt_plan_free(&sl->plan);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s BUNDLE_DIR [SAMPLES [ROUNDS [WARM_MS [PAUSE_MS]]]]\n", argv[0]);
    return 2;
  }
  int samples = argc > 2 ? atoi(argv[2]) : 10;
  if (samples < 1 || samples > 1000) {
    fprintf(stderr, "error: SAMPLES must be 1 ..= 1000, not %s\n", argv[2]);
    return 2;
  }
  int rounds = argc > 3 ? atoi(argv[3]) : 1;
  if (rounds < 1 || rounds > MAX_ROUNDS) {
    fprintf(stderr, "error: ROUNDS must be 1 ..= %d, not %s\n", MAX_ROUNDS, argv[3]);
    return 2;
  }
  double warm_ms = argc > 4 ? atof(argv[4]) : 0.0;
  if (!(warm_ms >= 0 && warm_ms <= 1000)) {
    fprintf(stderr, "error: WARM_MS must be 0 ..= 1000, not %s\n", argv[4]);
    return 2;
  }
  double pause_ms = argc > 5 ? atof(argv[5]) : 2000.0;
  if (!(pause_ms >= 0 && pause_ms <= 60000)) {
    fprintf(stderr, "error: PAUSE_MS must be 0 ..= 60000, not %s\n", argv[5]);
    return 2;
  }
  tt_bundle bundle;
  if (tt_bundle_open(&bundle, argv[1]) != 0) {
    fprintf(stderr, "error: %s\n", bundle.error);
    return 2;
  }
  CUdevice dev;
  CUcontext ctx;
  CUstream stream;
  CU(cuInit(0));
  CU(cuDeviceGet(&dev, 0));
  nvml_open(dev);
  CU(cuDevicePrimaryCtxRetain(&ctx, dev)); /* cuBLAS (runtime API) shares the primary context */
  CU(cuCtxSetCurrent(ctx));
  CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  int arch, sms;
  CU(tt_device_arch(dev, &arch, &sms));
  char gpu[256];
  CU(cuDeviceGetName(gpu, sizeof gpu, dev));
  /* TT_NO_BLAS=1: no cuBLAS in the process (nothing checked; only the bundle's kernels timed). */
  int no_blas = getenv("TT_NO_BLAS") && !strcmp(getenv("TT_NO_BLAS"), "1");
  /* TT_ONLY: only the selected kernels are loaded at all. TT_KEEP=1: every kernel is checked first
   * and keeps its module and buffers until all are timed (the other kernels' buffers stay in the
   * process while one is timed). TT_EXTRA_MB=N (in TT_EXTRA_PIECES allocations): device memory
   * allocated and written before any kernel is loaded. */
  const char *only = getenv("TT_ONLY");
  int keep = getenv("TT_KEEP") && !strcmp(getenv("TT_KEEP"), "1");
  int pieces = getenv("TT_EXTRA_PIECES") ? atoi(getenv("TT_EXTRA_PIECES")) : 1;
  CUdeviceptr extra[64] = {0};
  if (pieces < 1 || pieces > 64) {
    fprintf(stderr, "error: TT_EXTRA_PIECES must be 1 ..= 64, not %s\n", getenv("TT_EXTRA_PIECES"));
    return 2;
  }
  if (getenv("TT_EXTRA_MB") && atoi(getenv("TT_EXTRA_MB")) > 0) {
    size_t bytes = ((size_t)atoi(getenv("TT_EXTRA_MB")) << 20) / (size_t)pieces;
    for (int p = 0; p < pieces; p++) {
      CU(cuMemAlloc(&extra[p], bytes));
      CU(cuMemsetD8(extra[p], 1, bytes));
    }
    printf("%zu MiB of extra device memory in %d allocations\n", (bytes * (size_t)pieces) >> 20, pieces);
  }
  cublasHandle_t h = NULL;
  cublasLtHandle_t lt = NULL;
  CUdeviceptr blas_ws = 0, lt_ws = 0;
  if (!no_blas) {
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
      fprintf(stderr, "error: cublasCreate failed\n");
      return 2;
    }
    cublasSetStream(h, (cudaStream_t)stream);
    size_t blas_ws_bytes = 32u << 20; /* set up front: no allocation inside a graph capture */
    blas_ws = upload(NULL, blas_ws_bytes);
    cublasSetWorkspace(h, (void *)(uintptr_t)blas_ws, blas_ws_bytes);
    if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) {
      fprintf(stderr, "error: cublasLtCreate failed\n");
      return 2;
    }
    lt_ws = upload(NULL, LT_WORKSPACE);
  }

  printf("%s (sm_%d, %d SMs), bundle %s: %d kernels, %d samples a measurement, %d rounds (each side alone from the full clock), %g ms "
         "warm-up, %g ms pause before each\n",
         gpu, arch, sms, argv[1], bundle.n, samples, rounds, warm_ms, pause_ms);
  slot *slots = (slot *)calloc((size_t)bundle.n, sizeof(slot));
  int checked = 0, failures = 0, within = 0, timed = 0;
  for (int i = 0; i < bundle.n; i++) {
    const tt_entry *e = &bundle.entries[i];
    if (strcmp(e->op, "matmul")) {
      printf("%-46s skipped: %s (this example checks matmul)\n", e->name, e->op);
      continue;
    }
    if (!tt_entry_cubin(e, arch)) {
      printf("%-46s skipped: no cubin for sm_%d\n", e->name, arch);
      continue;
    }
    if (!selected(e, only)) {
      printf("%-46s skipped: not selected by TT_ONLY=%s\n", e->name, only);
      continue;
    }
    /* The loader's lookup of this entry's own problem must be exact. */
    tt_matmul q = {e->shape[0], e->shape[1], e->shape[2], e->layout, e->input, e->acc, e->output, e->alpha, e->beta};
    int nearest = 1, found = tt_bundle_find_matmul(&bundle, &q, arch, sms, &nearest);
    int lookup_ok = found >= 0 && !nearest && !memcmp(bundle.entries[found].shape, e->shape, sizeof e->shape);
    slot *sl = &slots[checked];
    if (tt_kernel_load(&sl->k, &bundle, i, arch) != 0) {
      printf("%s: cannot load: %s\n", e->name, sl->k.error);
      failures++;
      continue;
    }
    e = sl->k.entry;
    sl->entry = e;
    size_t m = e->shape[0], n = e->shape[1], kk = e->shape[2];
    size_t in = dsize(e->input), out = dsize(e->output);
    void *ha = fill(e->input, m * kk, 1), *hb = fill(e->input, kk * n, 1), *hc = fill(e->output, m * n, 1);
    void *ta = fill(e->input, m * kk, 0), *tb = fill(e->input, kk * n, 0);
    CUdeviceptr a = upload(ha, m * kk * in), b = upload(hb, kk * n * in), c = upload(hc, m * n * out);
    CUdeviceptr at = upload(ta, m * kk * in), bt = upload(tb, kk * n * in);
    CUdeviceptr d = upload(NULL, m * n * out), dref = upload(hc, m * n * out);
    CU(cuMemsetD8(d, 0xff, m * n * out)); /* poison: unwritten elements show */

    ours_call oc = {&sl->k, a, b, e->beta != 0 ? c : 0, d};
    blas_call bc = {h, lt, e, NULL, a, b, dref, lt_ws, -1}; /* checked against cublasGemmEx */
    int ok_launch = enqueue_ours(&oc, stream) == 0 && (no_blas || blas_gemm(&bc, stream) == 0);
    CU(cuStreamSynchronize(stream));
    void *got = malloc(m * n * out), *want = malloc(m * n * out);
    CU(cuMemcpyDtoH(got, d, m * n * out));
    CU(cuMemcpyDtoH(want, dref, m * n * out));
    /* Tolerance per type: with f32 or i32 accumulation the sums are exact, so the two outputs may
     * differ by the rounding of the output type alone (2 units in the last place: f16 2^-10, bf16
     * 2^-7, f32 2^-23, relative; integers exactly). f16 accumulation rounds partial sums: as
     * tensortune's worker, 2^-10 per 16 products of K, of the sums' typical magnitude (K / 4 for
     * these inputs), absolute. */
    double rel = !strcmp(e->output, "f16") ? 2.0 / 1024 : !strcmp(e->output, "bf16") ? 2.0 / 128
               : !strcmp(e->output, "f32") ? 2.0 / 8388608 : 0.0;
    double abs_tol = !strcmp(e->acc, "f16") ? ldexp(ceil(kk / 16.0), -10) * (double)kk / 4.0 : 0.0;
    size_t bad = 0, first = 0;
    double max_err = 0;
    for (size_t j = 0; j < m * n; j++) {
      double x = value(e->output, got, j), y = value(e->output, want, j), err = fabs(x - y);
      if (!(err <= abs_tol + rel * fabs(y))) {
        if (!bad) first = j;
        bad++;
      }
      if (err > max_err || err != err) max_err = err;
    }
    char *check = sl->check;
    if (!ok_launch) snprintf(check, sizeof sl->check, "FAILED: a launch failed");
    else if (!lookup_ok) snprintf(check, sizeof sl->check, "FAILED: the lookup of its own shape was not exact");
    else if (no_blas) snprintf(check, sizeof sl->check, "not checked (TT_NO_BLAS=1)"), bad = 0;
    else if (bad)
      snprintf(check, sizeof sl->check, "FAILED: %zu of %zu differ, first D[%zu, %zu] = %g, cuBLAS %g", bad, m * n,
               first % m, first / m, value(e->output, got, first), value(e->output, want, first));
    else snprintf(check, sizeof sl->check, "ok: all %zu match (max |diff| %.3g)", m * n, max_err);
    failures += !ok_launch || !lookup_ok || bad;
    printf("%-46s checked: %s\n", e->name, check);
    fflush(stdout);
    snprintf(sl->key, sizeof sl->key, "%zux%zux%zu %s %s>%s", m, n, kk, e->layout, e->input, e->output);
    sl->at = at, sl->bt = bt, sl->c = c, sl->d = d, sl->dref = dref;
    sl->ours = (ours_call){&sl->k, at, bt, e->beta != 0 ? c : 0, d};
    lt_plan_new(lt, e, &sl->plan);
    sl->blas = (blas_call){h, lt, e, &sl->plan, at, bt, dref, lt_ws, -1};
    checked++;
    free(ha), free(hb), free(hc), free(ta), free(tb), free(got), free(want);
    cuMemFree(a), cuMemFree(b);
    if (!keep) time_slot(sl, stream, samples, rounds, warm_ms, pause_ms, no_blas), release_slot(sl);
  }
  for (int i = 0; keep && i < checked; i++) time_slot(&slots[i], stream, samples, rounds, warm_ms, pause_ms, no_blas);

  printf("%-46s %-10s %10s %10s %7s %10s %10s %7s %7s  %-18s %s\n", "workload", "template", "kernel", "record", "ratio",
         "vendor", "record-vnd", "vs-rec", "batch", "vendor pick", "check");
  int ratio_within = 0, ratio_timed = 0;
  for (int i = 0; i < checked; i++) {
    slot *sl = &slots[i];
    const tt_entry *e = sl->entry;
    /* Issue 39's bar: ours / vendor, each its fastest round from the full clock, against the
     * record's ours / vendor (a burst record and its vendor, each its fastest from the full clock). */
    double ours = -1, blas = -1;
    for (int r = 0; r < sl->timed; r++) {
      if (ours < 0 || sl->ours_us[r] < ours) ours = sl->ours_us[r];
      if (sl->blas_us[r] > 0 && (blas < 0 || sl->blas_us[r] < blas)) blas = sl->blas_us[r];
    }
    double vs_rec = ours > 0 && blas > 0 && e->vendor_us > 0 ? (ours / blas) / (e->time_us / e->vendor_us) : -1;
    ratio_within += vs_rec > 0 && fabs(vs_rec - 1.0) <= 0.03;
    ratio_timed += vs_rec > 0;
    char vendor[32] = "-";
    if (e->vendor_us >= 0) snprintf(vendor, sizeof vendor, "%.2f us", e->vendor_us);
    const char *tmpl = strstr(e->name, "wgmma") ? "wgmma_gemm" : strstr(e->name, "wmma") ? "wmma_gemm" : "?";
    within += ours > 0 && fabs(ours / e->time_us - 1.0) <= 0.03;
    timed += sl->timed > 0;
    printf("%-46s %-10s %7.2f us %7.2f us %7.3f %7.2f us %10s %7.3f %7d  %-18s %s\n", sl->key, tmpl, ours, e->time_us,
           ours / e->time_us, blas, vendor, vs_rec, sl->batch, sl->vendor, sl->check);
    release_slot(sl);
  }
  free(slots);
  printf("%d kernels checked, %d failed; %d of %d timed within 3%% of their record's time; %d of %d within 3%% of "
         "their record's ours/vendor ratio\n",
         checked, failures, within, timed, ratio_within, ratio_timed);
  if (h) cublasDestroy(h);
  if (lt) cublasLtDestroy(lt);
  cuMemFree(blas_ws), cuMemFree(lt_ws);
  for (int p = 0; p < pieces; p++) cuMemFree(extra[p]);
  tt_bundle_close(&bundle);
  return failures ? 1 : 0;
}
