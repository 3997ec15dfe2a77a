/* tensortune_bundle.h: load and launch the kernels of a tensortune export bundle from C.
 *
 * Header-only; needs only the CUDA driver API (cuda.h, link with -lcuda). It reads the bundle's
 * index.txt (the line-based copy of manifest.json that `tensortune export` writes beside it),
 * picks the entry for a matmul problem on the current GPU (exact, else the nearest tuned shape of
 * the same types and layout, flagged), loads its cubin and launches it on a stream with the
 * caller's device pointers.
 *
 *   tt_bundle b;
 *   if (tt_bundle_open(&b, "bundle") != 0) { fprintf(stderr, "%s\n", b.error); ... }
 *   int arch, sms; tt_device_arch(dev, &arch, &sms);
 *   tt_matmul q = {1024, 1024, 1024, "nn", "f16", "f32", "f32", 1.0, 0.0};
 *   int nearest; int i = tt_bundle_find_matmul(&b, &q, arch, sms, &nearest);
 *   tt_kernel k; tt_kernel_load(&k, &b, i, arch);   // needs a current context
 *   tt_kernel_launch(&k, stream, a, bm, c, d);       // enqueue; capture into graphs as you like
 *   tt_kernel_unload(&k); tt_bundle_close(&b);
 *
 * Every kernel is compiled for one exact problem (shape, types, layout, alpha and beta): a
 * "nearest" entry tells which tuned config is closest; launching it computes its own shape. It
 * takes no scalar parameters: only the buffers and TMA tensor maps of its param lines, in order.
 * Buffers: A, B, C, D as tensortune's workload says (BLAS convention, D column-major M x N), 16-byte
 * aligned; C is read only when beta != 0 (pass 0 otherwise). The workspace (if any) is allocated
 * and zeroed by tt_kernel_load; kernels leave it zeroed; do not run two launches of one tt_kernel
 * concurrently on different streams.
 *
 * index.txt, format 1: a first line "tensortune-bundle-index 1", then per kernel the lines
 *   kernel NAME | op matmul|conv2d | shape M N K (conv: N H W C K) | layout nn|nt|tn|tt
 *   filter R S PAD_H PAD_W STRIDE_H STRIDE_W DIL_H DIL_W (conv) | epilogue ALPHA BETA (matmul)
 *   types INPUT ACC OUTPUT | device ARCH SMS | cubin SM_XX FILE (one or more) | entry SYMBOL
 *   grid X Y Z | block X Y Z | smem BYTES | cluster X Y Z | workspace BYTES
 *   param ptr a|b|c|d|workspace | param map OPERAND DTYPE DIM0 DIM1 STRIDE_BYTES BOX0 BOX1
 *   | param im2col OPERAND DTYPE C W H N STRIDE_W STRIDE_H STRIDE_N LOWER_W LOWER_H UPPER_W UPPER_H
 *     CHANNELS PIXELS ESTRIDE_C ESTRIDE_W ESTRIDE_H ESTRIDE_N   (strides in bytes; a rank-4
 *     cuTensorMapEncodeIm2col over a convolution's NHWC input)
 *   time_us T | vendor_us T|- | vendor_kind TEXT (optional: what the vendor time is, e.g.
 *   cublasGemmEx or "cublasLt heuristic #3 of 8") | end
 * Cluster dimensions are compiled into the kernels (__cluster_dims__): cuLaunchKernel forms them.
 */
#ifndef TENSORTUNE_BUNDLE_H
#define TENSORTUNE_BUNDLE_H

#include <cuda.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TT_MAX_PARAMS 8
#define TT_MAX_CUBINS 4
#define TT_NAME 256
#define TT_PATH 1024

typedef struct {
  int is_map;        /* 0: a device pointer; 1: a tiled CUtensorMap by value; 2: an im2col one */
  char operand[16];  /* a, b, c, d, workspace */
  char dtype[8];     /* maps: f16, bf16, f32, i8, i32 */
  cuuint64_t dims[4];  /* tiled: 2 used */
  cuuint64_t stride_bytes, im2col_strides[3];
  cuuint32_t box[2];
  int lower[2], upper[2];          /* im2col: bounding-box corners (W, H) */
  cuuint32_t channels, pixels;     /* im2col: channels per pixel, pixels per column */
  cuuint32_t elem_strides[4];      /* im2col: traversal strides (C, W, H, N) */
} tt_param;

typedef struct {
  char name[TT_NAME], op[16], entry[TT_NAME], layout[4];
  char input[8], acc[8], output[8]; /* f16, bf16, tf32 (f32 in memory), f32, i8, i32 */
  uint64_t shape[5]; /* matmul: M N K; conv2d: N H W C K */
  uint64_t filter[8];
  double alpha, beta;
  int arch, sm_count;
  int ncubins;
  char cubin_arch[TT_MAX_CUBINS][16], cubin_file[TT_MAX_CUBINS][TT_NAME + 32];
  unsigned grid[3], block[3], cluster[3], smem;
  uint64_t workspace;
  int nparams;
  tt_param params[TT_MAX_PARAMS];
  double time_us, vendor_us; /* vendor_us < 0: unknown */
  char vendor_kind[128];      /* empty: unknown */
} tt_entry;

typedef struct {
  char dir[TT_PATH];
  int n;
  tt_entry *entries;
  char error[512];
} tt_bundle;

typedef struct {
  uint64_t m, n, k;
  const char *layout, *input, *acc, *output;
  double alpha, beta;
} tt_matmul;

typedef struct {
  const tt_entry *entry;
  CUmodule module;
  CUfunction func;
  CUdeviceptr workspace;
  char error[512];
} tt_kernel;

static inline void tt__fail(char *buf, size_t len, const char *what, CUresult r) {
  const char *name = NULL;
  if (cuGetErrorName(r, &name) != CUDA_SUCCESS || !name) name = "unknown CUDA error";
  snprintf(buf, len, "%s: %s", what, name);
}

/* Reads DIR/index.txt. Returns 0, or -1 with b->error set. */
static inline int tt_bundle_open(tt_bundle *b, const char *dir) {
  memset(b, 0, sizeof *b);
  snprintf(b->dir, sizeof b->dir, "%s", dir);
  char path[TT_PATH + 16];
  snprintf(path, sizeof path, "%s/index.txt", dir);
  FILE *f = fopen(path, "r");
  if (!f) {
    snprintf(b->error, sizeof b->error, "cannot open %.400s (is it a tensortune export bundle?)", path);
    return -1;
  }
  char line[1024];
  int version = 0, lineno = 1, cap = 0;
  tt_entry *e = NULL;
  if (!fgets(line, sizeof line, f) || sscanf(line, "tensortune-bundle-index %d", &version) != 1 || version != 1) {
    snprintf(b->error, sizeof b->error, "%.400s: the first line must read \"tensortune-bundle-index 1\"", path);
    fclose(f);
    return -1;
  }
  while (fgets(line, sizeof line, f)) {
    lineno++;
    char key[32] = {0};
    if (sscanf(line, "%31s", key) != 1) continue;
    int ok = 1;
    if (!strcmp(key, "kernel")) {
      if (b->n == cap) {
        cap = cap ? 2 * cap : 16;
        tt_entry *grown = (tt_entry *)realloc(b->entries, (size_t)cap * sizeof *grown);
        if (!grown) { snprintf(b->error, sizeof b->error, "out of memory"); fclose(f); return -1; }
        b->entries = grown;
      }
      e = &b->entries[b->n++];
      memset(e, 0, sizeof *e);
      e->vendor_us = -1;
      ok = sscanf(line, "kernel %255s", e->name) == 1;
    } else if (!e) {
      ok = 0;
    } else if (!strcmp(key, "op")) {
      ok = sscanf(line, "op %15s", e->op) == 1;
    } else if (!strcmp(key, "shape")) {
      unsigned long long v[5] = {0};
      int got = sscanf(line, "shape %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4]);
      ok = got == 3 || got == 5;
      for (int i = 0; i < 5; i++) e->shape[i] = v[i];
    } else if (!strcmp(key, "filter")) {
      unsigned long long v[8] = {0};
      ok = sscanf(line, "filter %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
                  &v[6], &v[7]) == 8;
      for (int i = 0; i < 8; i++) e->filter[i] = v[i];
    } else if (!strcmp(key, "layout")) {
      ok = sscanf(line, "layout %3s", e->layout) == 1;
    } else if (!strcmp(key, "epilogue")) {
      ok = sscanf(line, "epilogue %lf %lf", &e->alpha, &e->beta) == 2;
    } else if (!strcmp(key, "types")) {
      ok = sscanf(line, "types %7s %7s %7s", e->input, e->acc, e->output) == 3;
    } else if (!strcmp(key, "device")) {
      ok = sscanf(line, "device %d %d", &e->arch, &e->sm_count) == 2;
    } else if (!strcmp(key, "cubin")) {
      ok = e->ncubins < TT_MAX_CUBINS &&
           sscanf(line, "cubin %15s %287s", e->cubin_arch[e->ncubins], e->cubin_file[e->ncubins]) == 2;
      if (ok) e->ncubins++;
    } else if (!strcmp(key, "entry")) {
      ok = sscanf(line, "entry %255s", e->entry) == 1;
    } else if (!strcmp(key, "grid")) {
      ok = sscanf(line, "grid %u %u %u", &e->grid[0], &e->grid[1], &e->grid[2]) == 3;
    } else if (!strcmp(key, "block")) {
      ok = sscanf(line, "block %u %u %u", &e->block[0], &e->block[1], &e->block[2]) == 3;
    } else if (!strcmp(key, "cluster")) {
      ok = sscanf(line, "cluster %u %u %u", &e->cluster[0], &e->cluster[1], &e->cluster[2]) == 3;
    } else if (!strcmp(key, "smem")) {
      ok = sscanf(line, "smem %u", &e->smem) == 1;
    } else if (!strcmp(key, "workspace")) {
      unsigned long long v;
      ok = sscanf(line, "workspace %llu", &v) == 1;
      e->workspace = v;
    } else if (!strcmp(key, "param")) {
      ok = e->nparams < TT_MAX_PARAMS;
      if (ok) {
        tt_param *p = &e->params[e->nparams];
        memset(p, 0, sizeof *p);
        unsigned long long d0, d1, st;
        unsigned b0, b1;
        if (sscanf(line, "param ptr %15s", p->operand) == 1) {
          p->is_map = 0;
        } else if (sscanf(line, "param map %15s %7s %llu %llu %llu %u %u", p->operand, p->dtype, &d0, &d1, &st, &b0,
                          &b1) == 7) {
          p->is_map = 1;
          p->dims[0] = d0, p->dims[1] = d1, p->stride_bytes = st, p->box[0] = b0, p->box[1] = b1;
        } else if (!strncmp(line, "param im2col ", 13)) {
          unsigned long long d[4], sb[3];
          unsigned ch, px, es[4];
          ok = sscanf(line, "param im2col %15s %7s %llu %llu %llu %llu %llu %llu %llu %d %d %d %d %u %u %u %u %u %u",
                      p->operand, p->dtype, &d[0], &d[1], &d[2], &d[3], &sb[0], &sb[1], &sb[2], &p->lower[0],
                      &p->lower[1], &p->upper[0], &p->upper[1], &ch, &px, &es[0], &es[1], &es[2], &es[3]) == 19;
          p->is_map = 2;
          for (int j = 0; j < 4; j++) p->dims[j] = d[j], p->elem_strides[j] = es[j];
          for (int j = 0; j < 3; j++) p->im2col_strides[j] = sb[j];
          p->channels = ch, p->pixels = px;
        } else {
          ok = 0;
        }
        if (ok) e->nparams++;
      }
    } else if (!strcmp(key, "time_us")) {
      ok = sscanf(line, "time_us %lf", &e->time_us) == 1;
    } else if (!strcmp(key, "vendor_us")) {
      if (sscanf(line, "vendor_us %lf", &e->vendor_us) != 1) e->vendor_us = -1;
    } else if (!strcmp(key, "vendor_kind")) {
      const char *text = line + strlen("vendor_kind");
      while (*text == ' ' || *text == '\t') text++;
      snprintf(e->vendor_kind, sizeof e->vendor_kind, "%.127s", text);
      e->vendor_kind[strcspn(e->vendor_kind, "\r\n")] = 0;
    } else if (!strcmp(key, "end")) {
      ok = e->entry[0] && e->grid[0] && e->block[0];
      e = NULL;
    } /* unknown keys are skipped: later formats may add lines */
    if (!ok) {
      snprintf(b->error, sizeof b->error, "%.300s:%d: cannot read %.150s", path, lineno, line);
      fclose(f);
      free(b->entries);
      b->entries = NULL;
      b->n = 0;
      return -1;
    }
  }
  fclose(f);
  return 0;
}

static inline void tt_bundle_close(tt_bundle *b) {
  free(b->entries);
  b->entries = NULL;
  b->n = 0;
}

/* The GPU's compute capability as major*10 + minor and its SM count. */
static inline CUresult tt_device_arch(CUdevice dev, int *arch, int *sm_count) {
  int major = 0, minor = 0;
  CUresult r = cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
  if (r == CUDA_SUCCESS) r = cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
  if (r == CUDA_SUCCESS) r = cuDeviceGetAttribute(sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
  *arch = major * 10 + minor;
  return r;
}

/* The entry's cubin file for `arch` (sm_XXa first, then sm_XX), or NULL. */
static inline const char *tt_entry_cubin(const tt_entry *e, int arch) {
  char want[2][16];
  snprintf(want[0], sizeof want[0], "sm_%da", arch);
  snprintf(want[1], sizeof want[1], "sm_%d", arch);
  for (int w = 0; w < 2; w++)
    for (int i = 0; i < e->ncubins; i++)
      if (!strcmp(e->cubin_arch[i], want[w])) return e->cubin_file[i];
  return NULL;
}

/* The index of the entry for matmul `q` on a GPU of `arch` with `sm_count` SMs, or -1. Among the
 * entries with a cubin for `arch` and the same types and layout, the smallest distance first (the
 * sum of |ln(a/b)| over M, N, K, plus 0.001 when alpha or beta differ), then one tuned with the same
 * SM count, then the fastest. *nearest is 1 when the entry is of another shape or epilogue. */
static inline int tt_bundle_find_matmul(const tt_bundle *b, const tt_matmul *q, int arch, int sm_count, int *nearest) {
  int best = -1;
  double best_d = 0;
  int best_same = 0;
  for (int i = 0; i < b->n; i++) {
    const tt_entry *e = &b->entries[i];
    if (strcmp(e->op, "matmul") || strcmp(e->layout, q->layout) || strcmp(e->input, q->input) ||
        strcmp(e->acc, q->acc) || strcmp(e->output, q->output) || !tt_entry_cubin(e, arch))
      continue;
    double d = fabs(log((double)q->m / (double)e->shape[0])) + fabs(log((double)q->n / (double)e->shape[1])) +
               fabs(log((double)q->k / (double)e->shape[2]));
    if (e->alpha != q->alpha || e->beta != q->beta) d += 1e-3;
    int same = e->sm_count == sm_count;
    if (best < 0 || d < best_d || (d == best_d && same > best_same) ||
        (d == best_d && same == best_same && e->time_us < b->entries[best].time_us)) {
      best = i, best_d = d, best_same = same;
    }
  }
  if (nearest) *nearest = best >= 0 && best_d > 0;
  return best;
}

/* Loads entry `index`'s cubin for `arch` into the current context, opts it into its dynamic shared
 * memory and allocates and zeroes its workspace. Returns 0, or -1 with k->error set. */
static inline int tt_kernel_load(tt_kernel *k, const tt_bundle *b, int index, int arch) {
  memset(k, 0, sizeof *k);
  if (index < 0 || index >= b->n) {
    snprintf(k->error, sizeof k->error, "entry %d is not in the bundle (0 ..= %d)", index, b->n - 1);
    return -1;
  }
  const tt_entry *e = k->entry = &b->entries[index];
  const char *file = tt_entry_cubin(e, arch);
  if (!file) {
    snprintf(k->error, sizeof k->error, "%s has no cubin for sm_%d", e->name, arch);
    return -1;
  }
  char path[TT_PATH + TT_NAME + 40];
  snprintf(path, sizeof path, "%s/%s", b->dir, file);
  FILE *f = fopen(path, "rb");
  if (!f) {
    snprintf(k->error, sizeof k->error, "cannot open %s", path);
    return -1;
  }
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fseek(f, 0, SEEK_SET);
  void *image = size > 0 ? malloc((size_t)size) : NULL;
  size_t got = image ? fread(image, 1, (size_t)size, f) : 0;
  fclose(f);
  if (!image || got != (size_t)size) {
    free(image);
    snprintf(k->error, sizeof k->error, "cannot read %s", path);
    return -1;
  }
  CUresult r = cuModuleLoadData(&k->module, image);
  free(image);
  if (r != CUDA_SUCCESS) return tt__fail(k->error, sizeof k->error, "cuModuleLoadData", r), -1;
  r = cuModuleGetFunction(&k->func, k->module, e->entry);
  if (r != CUDA_SUCCESS) return tt__fail(k->error, sizeof k->error, "cuModuleGetFunction", r), -1;
  int static_smem = 0;
  cuFuncGetAttribute(&static_smem, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, k->func);
  if (static_smem + (int)e->smem > 48 * 1024) {
    r = cuFuncSetAttribute(k->func, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)e->smem);
    if (r != CUDA_SUCCESS) return tt__fail(k->error, sizeof k->error, "opting into dynamic shared memory", r), -1;
  }
  if (e->workspace > 0) {
    r = cuMemAlloc(&k->workspace, (size_t)e->workspace);
    if (r == CUDA_SUCCESS) r = cuMemsetD8(k->workspace, 0, (size_t)e->workspace);
    if (r != CUDA_SUCCESS) return tt__fail(k->error, sizeof k->error, "allocating the workspace", r), -1;
  }
  return 0;
}

static inline CUtensorMapDataType tt__map_type(const char *dtype) {
  if (!strcmp(dtype, "f16")) return CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  if (!strcmp(dtype, "bf16")) return CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  if (!strcmp(dtype, "f32") || !strcmp(dtype, "tf32")) return CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
  if (!strcmp(dtype, "i32")) return CU_TENSOR_MAP_DATA_TYPE_INT32;
  return CU_TENSOR_MAP_DATA_TYPE_UINT8; /* i8: a copy does not care about signedness */
}

/* Enqueues one launch of the kernel on `stream` over the caller's buffers (c may be 0 when beta
 * is 0). Tensor maps are encoded here, over these pointers: 128-byte swizzle, no interleave, L2
 * promotion 256 B, out-of-bounds elements read as zero. Returns 0, or -1 with k->error set. */
static inline int tt_kernel_launch(tt_kernel *k, CUstream stream, CUdeviceptr a, CUdeviceptr b, CUdeviceptr c,
                            CUdeviceptr d) {
  const tt_entry *e = k->entry;
  CUdeviceptr ptrs[TT_MAX_PARAMS];
  CUtensorMap maps[TT_MAX_PARAMS];
  void *args[TT_MAX_PARAMS];
  for (int i = 0; i < e->nparams; i++) {
    const tt_param *p = &e->params[i];
    CUdeviceptr ptr = 0;
    if (!strcmp(p->operand, "a")) ptr = a;
    else if (!strcmp(p->operand, "b")) ptr = b;
    else if (!strcmp(p->operand, "c")) ptr = c;
    else if (!strcmp(p->operand, "d")) ptr = d;
    else if (!strcmp(p->operand, "workspace")) ptr = k->workspace ? k->workspace : d; /* never dereferenced */
    if (!ptr && strcmp(p->operand, "c")) {
      snprintf(k->error, sizeof k->error, "%s needs operand %s, which is null", e->name, p->operand);
      return -1;
    }
    if (!p->is_map) {
      ptrs[i] = ptr;
      args[i] = &ptrs[i];
      continue;
    }
    if (p->is_map == 2) {
      CUresult r = cuTensorMapEncodeIm2col(&maps[i], tt__map_type(p->dtype), 4, (void *)(uintptr_t)ptr, p->dims,
                                           p->im2col_strides, p->lower, p->upper, p->channels, p->pixels,
                                           p->elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                           CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
      if (r != CUDA_SUCCESS) return tt__fail(k->error, sizeof k->error, "cuTensorMapEncodeIm2col", r), -1;
      args[i] = &maps[i];
      continue;
    }
    const cuuint64_t strides[1] = {p->stride_bytes};
    const cuuint32_t elem_strides[2] = {1, 1};
    CUresult r = cuTensorMapEncodeTiled(&maps[i], tt__map_type(p->dtype), 2, (void *)(uintptr_t)ptr, p->dims, strides,
                                        p->box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                        CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) return tt__fail(k->error, sizeof k->error, "cuTensorMapEncodeTiled", r), -1;
    args[i] = &maps[i];
  }
  CUresult r = cuLaunchKernel(k->func, e->grid[0], e->grid[1], e->grid[2], e->block[0], e->block[1], e->block[2],
                              e->smem, stream, args, NULL);
  if (r != CUDA_SUCCESS) return tt__fail(k->error, sizeof k->error, "cuLaunchKernel", r), -1;
  return 0;
}

static inline void tt_kernel_unload(tt_kernel *k) {
  if (k->workspace) cuMemFree(k->workspace);
  if (k->module) cuModuleUnload(k->module);
  memset(k, 0, sizeof *k);
}

#endif /* TENSORTUNE_BUNDLE_H */
