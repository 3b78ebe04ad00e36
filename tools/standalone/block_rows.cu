// Standalone measurement (not part of the package): a block a row with the row cached in shared
// memory (blockv: the block tier's structure with plain loops over aligned 16-byte slots; KAHAN,
// SHIFT = exps as 2^(x log2 e - h), GROUPS = cp.async commit groups), and a block a row holding
// part of its row in registers (hybrid). Its main times blockv on 256 MiB inputs against the
// device copy; helpers in common.cuh.
// Build and run on an sm_90 GPU:  nvcc -arch=sm_90 -O3 -std=c++17 -o block_rows block_rows.cu -lcuda && ./block_rows
// (./block_rows --hybrid: the hybrid kernel against blockv; ./block_rows --long: the hybrid kernel on
// rows longer than a block's shared memory; ./block_rows PATH/softmax_f32.<code object>: the
// library's block kernel beside blockv).
#include "common.cuh"

// A block per row: the first REG * blockDim slots in registers (plain 16-byte loads, all in
// flight at once), the rest cached in shared memory by cp.async in GROUPS commit groups (issued
// after the register loads, so that (m, d) takes the registers, then each group as it lands).
template <typename T, int REG, int THREADS, int GROUPS = 1>
__global__ void __launch_bounds__(THREADS, 1) hybrid(const T* x, T* y, long rows, long cols) {
  constexpr int VEC = 16 / sizeof(T);
  extern __shared__ float4 cache[];
  const long slots = cols / VEC;
  const long row = blockIdx.x;
  const float4* src = reinterpret_cast<const float4*>(x + row * cols);
  float4* dst = reinterpret_cast<float4*>(y + row * cols);
  const int in_regs = (int)lmin((long)REG * THREADS, slots);
  const int n = (int)slots - in_regs;
  float4 r[REG > 0 ? REG : 1];
#pragma unroll
  for (int j = 0; j < REG; ++j) {
    const int k = j * THREADS + threadIdx.x;
    if (k < in_regs) r[j] = __ldcs(src + k);
  }
  int j = threadIdx.x;
#pragma unroll
  for (int g = 0; g < GROUPS; ++g) {
    for (; j < n * (g + 1) / GROUPS; j += THREADS) cp16(cache + j, src + in_regs + j);
    asm volatile("cp.async.commit_group;" ::: "memory");
  }
  RowSum<T, 0, 1> sum;
#pragma unroll
  for (int k = 0; k < REG; ++k) {
    if (k * THREADS + (int)threadIdx.x < in_regs) sum.push(r[k]);
  }
  j = threadIdx.x;
#pragma unroll
  for (int g = 0; g < GROUPS; ++g) {
    wait_for_group<GROUPS>(g);
    for (; j < n * (g + 1) / GROUPS; j += THREADS) sum.push(cache[j]);
  }
  const MD md = block_reduce(sum.md());
  const float h = md.m * kLog2e + __log2f(md.d);
  auto softmax = [&](float v) { return ex2(fmaf(v, kLog2e, -h)); };
#pragma unroll
  for (int k = 0; k < REG; ++k) {
    const int s = k * THREADS + threadIdx.x;
    if (s < in_regs) store16(dst + s, map16<T>(r[k], softmax));
  }
  for (j = threadIdx.x; j < n; j += THREADS) store16(dst + in_regs + j, map16<T>(cache[j], softmax));
}

// The block tier's structure with plain loops over aligned 16-byte slots: the row's copies in
// GROUPS commit groups, (m, d) by RowSum<KAHAN, SHIFT> as each group lands, outputs from the cache.
template <typename T, int THREADS, int KAHAN, int SHIFT, int GROUPS>
__global__ void __launch_bounds__(THREADS) blockv(const T* x, T* y, long rows, long cols) {
  constexpr int VEC = 16 / sizeof(T);
  extern __shared__ float4 cache[];
  const int n = (int)(cols / VEC);
  const long row = blockIdx.x;
  const float4* src = reinterpret_cast<const float4*>(x + row * cols);
  float4* dst = reinterpret_cast<float4*>(y + row * cols);
  int j = threadIdx.x;
#pragma unroll
  for (int g = 0; g < GROUPS; ++g) {
    for (; j < n * (g + 1) / GROUPS; j += THREADS) cp16(cache + j, src + j);
    asm volatile("cp.async.commit_group;" ::: "memory");
  }
  RowSum<T, KAHAN, SHIFT> sum;
  j = threadIdx.x;
#pragma unroll
  for (int g = 0; g < GROUPS; ++g) {
    wait_for_group<GROUPS>(g);
    for (; j < n * (g + 1) / GROUPS; j += THREADS) sum.push(cache[j]);
  }
  // (Each thread reads back only its own slots: no barrier needed for the cache.)
  const MD md = block_reduce(sum.md());
  const float hh = md.m * kLog2e;
  const float l2d = __log2f(md.d);
  auto softmax = [&](float v) { return SHIFT ? ex2(fmaf(v, kLog2e, -hh) - l2d) : ex2(fmaf(v - md.m, kLog2e, -l2d)); };
  for (j = threadIdx.x; j < n; j += THREADS) store16(dst + j, map16<T>(cache[j], softmax));
}

// Times a kernel of one block of `threads` a row whose shared memory holds `shared_bytes`; returns
// (ms, largest |row sum - 1|, blocks a multiprocessor).
struct Timing { float ms; double err; int per_sm; };
template <typename T, typename Kernel>
Timing time_rows(const Bench& bench, Kernel kernel, int threads, size_t shared_bytes, const T* x, T* y, long rows, long cols) {
  CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared_bytes));
  Timing t;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&t.per_sm, kernel, threads, shared_bytes));
  t.ms = bench.median_ms(y, [&] { kernel<<<rows, threads, shared_bytes>>>(x, y, rows, cols); });
  t.err = row_sum_error(y, rows, cols);
  return t;
}
template <typename T, int THREADS, int KAHAN, int SHIFT, int GROUPS>
Timing run_blockv(const Bench& bench, const T* x, T* y, long rows, long cols) {
  return time_rows(bench, blockv<T, THREADS, KAHAN, SHIFT, GROUPS>, THREADS, (size_t)cols * sizeof(T), x, y, rows, cols);
}
template <typename T, int REG, int THREADS, int GROUPS = 1>
Timing run_hybrid(const Bench& bench, const T* x, T* y, long rows, long cols) {
  const long slots = cols * (long)sizeof(T) / 16;
  const size_t shared = (size_t)(slots - lmin((long)REG * THREADS, slots)) * 16;
  int most = 0;
  CK(cudaDeviceGetAttribute(&most, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
  if (shared > (size_t)most) return Timing{0, 0, 0};  // the rest of the row does not fit: reported as 0
  return time_rows(bench, hybrid<T, REG, THREADS, GROUPS>, THREADS, shared, x, y, rows, cols);
}

// The library's own block-tier float32 kernel (from its code object at `path`) under this
// harness: telling the harness from the kernel.
Timing run_library(const Bench& bench, const char* path, const float* x, float* y, long rows, long cols) {
  CUmodule mod;
  CUfunction fn;
  if (cuModuleLoad(&mod, path) != CUDA_SUCCESS) { fprintf(stderr, "cannot load %s\n", path); exit(1); }
  if (cuModuleGetFunction(&fn, mod, "ps_block_f32_softmax_w32_v4") != CUDA_SUCCESS) {
    fprintf(stderr, "no ps_block_f32_softmax_w32_v4 in %s\n", path);
    exit(1);
  }
  const unsigned shared = (unsigned)(cols * 4);
  cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)shared);
  long long r = rows, c = cols, xs = cols, ys = cols;
  int safe = 0;
  void* args[] = {(void*)&x, (void*)&y, &r, &c, &xs, &ys, &safe};
  Timing t{0, 0, 0};
  t.ms = bench.median_ms(y, [&] {
    if (cuLaunchKernel(fn, (unsigned)rows, 1, 1, 512, 1, 1, shared, 0, args, 0) != CUDA_SUCCESS) {
      fprintf(stderr, "launch failed\n");
      exit(1);
    }
  });
  t.err = row_sum_error(y, rows, cols);
  return t;
}

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IONBF, 0);
  Bench bench;
  const long bytes = Bench::kBytes;
  const float copy = bench.copy_ms();
  printf("copy %.4f ms (%.0f GB/s)\n", copy, 2.0 * bytes / copy / 1e6);
  auto rep = [&](const char* what, long rows, long cols, Timing t) {
    if (t.ms == 0) {
      printf("  %-28s %ldx%ld does not fit\n", what, rows, cols);
      return;
    }
    printf("  %-28s %ldx%ld %5.1f%% of copy  (blocks/SM %d, |sum-1| %.1e)\n", what, rows, cols, 100 * copy / t.ms, t.per_sm, t.err);
  };
  const bool hybrids = argc > 1 && std::string(argv[1]) == "--hybrid";
  const bool long_rows = argc > 1 && std::string(argv[1]) == "--long";
  if (long_rows) {  // rows longer than a block's shared memory: part of each row in registers
    for (int pass = 0; pass < 2; ++pass) {
      rep("f32 blockv g4 (ref)", bytes / 4 / 56000, 56000,
          run_blockv<float, 512, 1, 0, 4>(bench, bench.xf, bench.yf, bytes / 4 / 56000, 56000));
      for (long cols : {65536L, 80000L}) {
        const long rows = bytes / 4 / cols;
        rep("f32 reg8 512thr g4", rows, cols, run_hybrid<float, 8, 512, 4>(bench, bench.xf, bench.yf, rows, cols));
        rep("f32 reg16 512thr g4", rows, cols, run_hybrid<float, 16, 512, 4>(bench, bench.xf, bench.yf, rows, cols));
        rep("f32 reg16 512thr g1", rows, cols, run_hybrid<float, 16, 512, 1>(bench, bench.xf, bench.yf, rows, cols));
        rep("f32 reg8 1024thr g4", rows, cols, run_hybrid<float, 8, 1024, 4>(bench, bench.xf, bench.yf, rows, cols));
      }
      rep("bf16 blockv g2 (ref)", bytes / 2 / 100000, 100000,
          run_blockv<__nv_bfloat16, 512, 1, 0, 2>(bench, bench.xb, bench.yb, bytes / 2 / 100000, 100000));
      for (long cols : {131072L, 128256L, 163840L}) {
        const long rows = bytes / 2 / cols;
        rep("bf16 reg8 512thr g2", rows, cols, run_hybrid<__nv_bfloat16, 8, 512, 2>(bench, bench.xb, bench.yb, rows, cols));
        rep("bf16 reg16 512thr g2", rows, cols, run_hybrid<__nv_bfloat16, 16, 512, 2>(bench, bench.xb, bench.yb, rows, cols));
        rep("bf16 reg16 512thr g4", rows, cols, run_hybrid<__nv_bfloat16, 16, 512, 4>(bench, bench.xb, bench.yb, rows, cols));
        rep("bf16 reg8 1024thr g2", rows, cols, run_hybrid<__nv_bfloat16, 8, 1024, 2>(bench, bench.xb, bench.yb, rows, cols));
      }
    }
    return 0;
  }
  if (argc > 1 && !hybrids) {
    for (int pass = 0; pass < 2; ++pass) {
      for (long cols : {32000L, 50256L, 40000L}) {
        const long rows = bytes / 4 / cols;
        rep("library ps_block_f32 softmax", rows, cols, run_library(bench, argv[1], bench.xf, bench.yf, rows, cols));
        rep("f32 kahan1 shift0 g4", rows, cols, run_blockv<float, 512, 1, 0, 4>(bench, bench.xf, bench.yf, rows, cols));
      }
    }
    return 0;
  }
  if (hybrids) {
    for (int pass = 0; pass < 2; ++pass) {
      for (long cols : {32000L, 40000L, 24000L}) {
        const long rows = bytes / 4 / cols;
        rep("f32 smem 512thr", rows, cols, run_hybrid<float, 0, 512>(bench, bench.xf, bench.yf, rows, cols));
        rep("f32 smem 256thr", rows, cols, run_hybrid<float, 0, 256>(bench, bench.xf, bench.yf, rows, cols));
        rep("f32 reg16 256thr", rows, cols, run_hybrid<float, 16, 256>(bench, bench.xf, bench.yf, rows, cols));
        rep("f32 reg8 512thr", rows, cols, run_hybrid<float, 8, 512>(bench, bench.xf, bench.yf, rows, cols));
        rep("f32 reg8 256thr", rows, cols, run_hybrid<float, 8, 256>(bench, bench.xf, bench.yf, rows, cols));
      }
      const long cols = 50256, rows = bytes / 2 / cols;
      rep("bf16 smem 512thr", rows, cols, run_hybrid<__nv_bfloat16, 0, 512>(bench, bench.xb, bench.yb, rows, cols));
      rep("bf16 reg8 256thr", rows, cols, run_hybrid<__nv_bfloat16, 8, 256>(bench, bench.xb, bench.yb, rows, cols));
      rep("bf16 reg4 512thr", rows, cols, run_hybrid<__nv_bfloat16, 4, 512>(bench, bench.xb, bench.yb, rows, cols));
      rep("bf16 reg16 256thr", rows, cols, run_hybrid<__nv_bfloat16, 16, 256>(bench, bench.xb, bench.yb, rows, cols));
    }
    return 0;
  }
  for (int normal = 0; normal < 2; ++normal) {
    bench.fill_inputs(normal != 0);
    printf(normal ? "normal*4 data\n" : "uniform +-4 data\n");
    for (long cols : {32000L, 50256L}) {
      const long rows = bytes / 4 / cols;
      rep("f32 kahan1 shift0 g1", rows, cols, run_blockv<float, 512, 1, 0, 1>(bench, bench.xf, bench.yf, rows, cols));
      rep("f32 kahan1 shift0 g4", rows, cols, run_blockv<float, 512, 1, 0, 4>(bench, bench.xf, bench.yf, rows, cols));
      rep("f32 kahan1 shift1 g4", rows, cols, run_blockv<float, 512, 1, 1, 4>(bench, bench.xf, bench.yf, rows, cols));
    }
    const long cols = 50256, rows = bytes / 2 / cols;
    rep("bf16 kahan1 shift0 g2", rows, cols, run_blockv<__nv_bfloat16, 512, 1, 0, 2>(bench, bench.xb, bench.yb, rows, cols));
    rep("bf16 kahan1 shift1 g2", rows, cols, run_blockv<__nv_bfloat16, 512, 1, 1, 2>(bench, bench.xb, bench.yb, rows, cols));
  }
  return 0;
}
