// Standalone measurement (not part of the package): a block a row with the row cached in shared
// memory (blockv: the block tier's structure with plain loops over aligned 16-byte slots; KAHAN,
// SHIFT = exps as 2^(x log2 e - h), GROUPS = cp.async commit groups), and a block a row holding
// part of its row in registers (hybrid). Its main times blockv on 256 MiB inputs against the
// device copy; helpers in common.cuh.
// Build and run on an sm_90 GPU:  nvcc -arch=sm_90 -O3 -std=c++17 -o block_rows block_rows.cu -lcuda && ./block_rows
// (./block_rows PATH/softmax_f32.<code object>: the library's block kernel beside it instead).
#include "common.cuh"

// A block per row: the first REG * blockDim slots in registers (plain 16-byte loads, all in
// flight at once), the rest cached in shared memory by cp.async.
template <typename T, int REG, int THREADS>
__global__ void __launch_bounds__(THREADS) hybrid(const T* x, T* y, long rows, long cols) {
  constexpr int VEC = 16 / sizeof(T);
  extern __shared__ float4 cache[];
  const long slots = cols / VEC;
  const long row = blockIdx.x;
  const float4* src = reinterpret_cast<const float4*>(x + row * cols);
  float4* dst = reinterpret_cast<float4*>(y + row * cols);
  const int in_regs = (int)lmin((long)REG * THREADS, slots);
  const int n = (int)slots - in_regs;
  for (int j = threadIdx.x; j < n; j += THREADS) cp16(cache + j, src + in_regs + j);
  asm volatile("cp.async.commit_group;" ::: "memory");
  float4 r[REG > 0 ? REG : 1];
#pragma unroll
  for (int j = 0; j < REG; ++j) {
    const int k = j * THREADS + threadIdx.x;
    if (k < in_regs) r[j] = __ldcs(src + k);
  }
  float m = -INFINITY, d = 0.f;
  auto push = [&](const float4& raw) {
    float v[VEC];
    widen16<T>(raw, v);
    float top = v[0];
#pragma unroll
    for (int e = 1; e < VEC; ++e) top = fmaxf(top, v[e]);
    if (top > m) { d *= ex2((m - top) * 1.4426950408889634f); m = top; }
    const float h = m * 1.4426950408889634f;
    float s = 0.f;
#pragma unroll
    for (int e = 0; e < VEC; ++e) s += ex2(fmaf(v[e], 1.4426950408889634f, -h));
    d += s;
  };
#pragma unroll
  for (int j = 0; j < REG; ++j) {
    const int k = j * THREADS + threadIdx.x;
    if (k < in_regs) push(r[j]);
  }
  asm volatile("cp.async.wait_all;" ::: "memory");
  for (int j = threadIdx.x; j < n; j += THREADS) push(cache[j]);
  const MD md = block_reduce(MD{m, d});
  const float L = 1.4426950408889634f;
  const float h = md.m * L + __log2f(md.d);
  auto out = [&](float4* at, const float4& raw) {
    float v[VEC];
    widen16<T>(raw, v);
#pragma unroll
    for (int e = 0; e < VEC; ++e) v[e] = ex2(fmaf(v[e], L, -h));
    const float4 o = narrow16<T>(v);
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(at), "r"(__float_as_uint(o.x)), "r"(__float_as_uint(o.y)),
                 "r"(__float_as_uint(o.z)), "r"(__float_as_uint(o.w)));
  };
#pragma unroll
  for (int j = 0; j < REG; ++j) {
    const int k = j * THREADS + threadIdx.x;
    if (k < in_regs) out(dst + k, r[j]);
  }
  for (int j = threadIdx.x; j < n; j += THREADS) out(dst + in_regs + j, cache[j]);
}

template <typename T, int REG, int THREADS>
float run_h(const T* x, T* y, long rows, long cols, void* flush, size_t flush_bytes, int reps, double* err, int* per_sm_out) {
  constexpr int VEC = 16 / sizeof(T);
  const long slots = cols / VEC;
  const long n = slots - std::min<long>((long)REG * THREADS, slots);
  const size_t shared = (size_t)n * 16;
  auto k = hybrid<T, REG, THREADS>;
  CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared));
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(per_sm_out, k, THREADS, shared));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int r = 0; r < reps; ++r) {
    CK(cudaMemsetAsync(y, 0xff, rows * cols * sizeof(T)));  // poison
    CK(cudaMemsetAsync(flush, r + 1, flush_bytes));
    CK(cudaEventRecord(a));
    k<<<rows, THREADS, shared>>>(x, y, rows, cols);
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    CK(cudaGetLastError());
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  *err = 0;
  std::vector<T> hbuf(cols);
  for (long rr : {0L, rows / 2, rows - 1}) {
    CK(cudaMemcpy(hbuf.data(), y + rr * cols, cols * sizeof(T), cudaMemcpyDeviceToHost));
    double s = 0;
    for (long i = 0; i < cols; ++i) s += (double)tof(hbuf[i]);
    *err = std::max(*err, std::abs(s - 1.0));
  }
  return t[t.size() / 2];
}


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
  const float L = 1.4426950408889634f;
  float m = -INFINITY, d = 0.f, carry = 0.f;
  auto push = [&](const float4& raw) {
    float v[VEC];
    widen16<T>(raw, v);
    float top = v[0];
#pragma unroll
    for (int e = 1; e < VEC; ++e) top = fmaxf(top, v[e]);
    if (top > m) {
      const float sc = m == -INFINITY ? 0.f : (SHIFT ? ex2((m - top) * L) : expf(m - top));
      d *= sc; carry *= sc; m = top;
    }
    float s = 0.f;
    if (SHIFT) {
      const float h = m * L;
#pragma unroll
      for (int e = 0; e < VEC; ++e) s += ex2(fmaf(v[e], L, -h));
    } else {
#pragma unroll
      for (int e = 0; e < VEC; ++e) s += ex2(fmaf(v[e] - m, L, -0.0f));
    }
    if (KAHAN) {
      const float yk = s - carry, t = d + yk;
      carry = (t - d) - yk;
      d = t;
    } else {
      d += s;
    }
  };
  j = threadIdx.x;
#pragma unroll
  for (int g = 0; g < GROUPS; ++g) {
    if (g == 0) asm volatile("cp.async.wait_group %0;" ::"n"(GROUPS - 1) : "memory");
    else if (g == 1) asm volatile("cp.async.wait_group %0;" ::"n"(GROUPS > 2 ? GROUPS - 2 : 0) : "memory");
    else if (g == 2) asm volatile("cp.async.wait_group %0;" ::"n"(GROUPS > 3 ? GROUPS - 3 : 0) : "memory");
    else asm volatile("cp.async.wait_group 0;" ::: "memory");
    for (; j < n * (g + 1) / GROUPS; j += THREADS) push(cache[j]);
  }
  // (Each thread reads back only its own slots: no barrier needed for the cache.)
  const MD md = block_reduce(MD{m, d});
  const float hh = md.m * L;
  const float l2d = __log2f(md.d);
  auto out = [&](float4* at, const float4& raw) {
    float v[VEC];
    widen16<T>(raw, v);
#pragma unroll
    for (int e = 0; e < VEC; ++e) v[e] = SHIFT ? ex2(fmaf(v[e], L, -hh) - l2d) : ex2(fmaf(v[e] - md.m, L, -l2d));
    const float4 o = narrow16<T>(v);
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(at), "r"(__float_as_uint(o.x)), "r"(__float_as_uint(o.y)),
                 "r"(__float_as_uint(o.z)), "r"(__float_as_uint(o.w)));
  };
  for (j = threadIdx.x; j < n; j += THREADS) out(dst + j, cache[j]);
}

template <typename T, int THREADS, int KAHAN, int SHIFT, int GROUPS>
float run_b(const T* x, T* y, long rows, long cols, void* flush, size_t flush_bytes, int reps, double* err) {
  const size_t shared = (size_t)cols * sizeof(T);
  auto k = blockv<T, THREADS, KAHAN, SHIFT, GROUPS>;
  CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int r = 0; r < reps; ++r) {
    CK(cudaMemsetAsync(y, 0xff, rows * cols * sizeof(T)));  // poison
    CK(cudaMemsetAsync(flush, r + 1, flush_bytes));
    CK(cudaEventRecord(a));
    k<<<rows, THREADS, shared>>>(x, y, rows, cols);
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    CK(cudaGetLastError());
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  *err = 0;
  std::vector<T> hbuf(cols);
  for (long rr : {0L, rows / 2, rows - 1}) {
    CK(cudaMemcpy(hbuf.data(), y + rr * cols, cols * sizeof(T), cudaMemcpyDeviceToHost));
    double s = 0;
    for (long i = 0; i < cols; ++i) s += (double)tof(hbuf[i]);
    *err = std::max(*err, std::abs(s - 1.0));
  }
  return t[t.size() / 2];
}

// The library's own block-tier kernel (argv[1]: the package's softmax_f32 code object) under this
// harness: telling the harness from the kernel.
float run_lib(const char* path, const char* name, const float* x, float* y, long rows, long cols, void* flush,
              size_t flush_bytes, int reps, double* err) {
  CUmodule mod;
  CUfunction fn;
  if (cuModuleLoad(&mod, path) != CUDA_SUCCESS) { fprintf(stderr, "cannot load %s\n", path); exit(1); }
  if (cuModuleGetFunction(&fn, mod, name) != CUDA_SUCCESS) { fprintf(stderr, "no %s\n", name); exit(1); }
  const unsigned shared = (unsigned)(cols * 4);
  cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)shared);
  long long r = rows, c = cols, xs = cols, ys = cols;
  int safe = 0;
  void* args[] = {(void*)&x, (void*)&y, &r, &c, &xs, &ys, &safe};
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int k = 0; k < reps; ++k) {
    CK(cudaMemsetAsync(y, 0xff, rows * cols * sizeof(float)));
    CK(cudaMemsetAsync(flush, k + 1, flush_bytes));
    CK(cudaEventRecord(a));
    if (cuLaunchKernel(fn, (unsigned)rows, 1, 1, 512, 1, 1, shared, 0, args, 0) != CUDA_SUCCESS) { fprintf(stderr, "launch\n"); exit(1); }
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  std::vector<float> h(cols);
  *err = 0;
  for (long rr : {0L, rows - 1}) {
    CK(cudaMemcpy(h.data(), y + rr * cols, cols * 4, cudaMemcpyDeviceToHost));
    double s = 0;
    for (long i = 0; i < cols; ++i) s += h[i];
    *err = std::max(*err, std::abs(s - 1.0));
  }
  return t[t.size() / 2];
}

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IONBF, 0);
  const long bytes = 256L << 20;
  float *xf, *yf;
  void* flush;
  const size_t flush_bytes = 256L << 20;
  CK(cudaMalloc(&xf, bytes));
  CK(cudaMalloc(&yf, bytes));
  CK(cudaMalloc(&flush, flush_bytes));
  fill<<<1024, 256>>>(xf, bytes / 4, 7);
  __nv_bfloat16 *xb, *yb;
  CK(cudaMalloc(&xb, bytes));
  CK(cudaMalloc(&yb, bytes));
  float* tmp;
  CK(cudaMalloc(&tmp, bytes * 2));
  fill<<<1024, 256>>>(tmp, bytes / 2, 9);
  tobf<<<1024, 256>>>(tmp, xb, bytes / 2);
  CK(cudaDeviceSynchronize());
  const int reps = 10;
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  auto copy_ms = [&]() {
    std::vector<float> t;
    for (int r = 0; r < reps; ++r) {
      CK(cudaMemsetAsync(flush, r, flush_bytes));
      CK(cudaEventRecord(a));
      CK(cudaMemcpyAsync(yf, xf, bytes, cudaMemcpyDeviceToDevice));
      CK(cudaEventRecord(b));
      CK(cudaEventSynchronize(b));
      float ms;
      CK(cudaEventElapsedTime(&ms, a, b));
      t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  };
  const float c0 = copy_ms();
  printf("copy %.4f ms (%.0f GB/s)\n", c0, 2.0 * bytes / c0 / 1e6);
  double e;
  int ps;
  auto rep = [&](const char* what, long rows, long cols, float t) {
    printf("  %-28s %ldx%ld %5.1f%% of copy  (blocks/SM %d, |sum-1| %.1e)\n", what, rows, cols, 100 * c0 / t, ps, e);
  };
  ps = 0;
  if (argc > 1) {
    for (int pass = 0; pass < 2; ++pass) {
      for (long cols : {32000L, 50256L, 40000L}) {
        const long rows = bytes / 4 / cols;
        rep("library ps_block_f32 softmax", rows, cols, run_lib(argv[1], "ps_block_f32_softmax_w32_v4", xf, yf, rows, cols, flush, flush_bytes, reps, &e));
        rep("f32 kahan1 shift0 g4", rows, cols, run_b<float, 512, 1, 0, 4>(xf, yf, rows, cols, flush, flush_bytes, reps, &e));
      }
    }
    return 0;
  }
  for (int data = 0; data < 2; ++data) {
    fill<<<1024, 256>>>(xf, bytes / 4, data ? 0x107 : 7);
    fill<<<1024, 256>>>(tmp, bytes / 2, data ? 0x109 : 9);
    tobf<<<1024, 256>>>(tmp, xb, bytes / 2);
    CK(cudaDeviceSynchronize());
    printf(data ? "normal*4 data\n" : "uniform +-4 data\n");
    for (long cols : {32000L, 50256L}) {
      const long rows = bytes / 4 / cols;
      rep("f32 kahan1 shift0 g1", rows, cols, run_b<float, 512, 1, 0, 1>(xf, yf, rows, cols, flush, flush_bytes, reps, &e));
      rep("f32 kahan1 shift0 g4", rows, cols, run_b<float, 512, 1, 0, 4>(xf, yf, rows, cols, flush, flush_bytes, reps, &e));
      rep("f32 kahan1 shift1 g4", rows, cols, run_b<float, 512, 1, 1, 4>(xf, yf, rows, cols, flush, flush_bytes, reps, &e));
    }
    for (long cols : {50256L}) {
      const long rows = bytes / 2 / cols;
      rep("bf16 kahan1 shift0 g2", rows, cols, run_b<__nv_bfloat16, 512, 1, 0, 2>(xb, yb, rows, cols, flush, flush_bytes, reps, &e));
      rep("bf16 kahan1 shift1 g2", rows, cols, run_b<__nv_bfloat16, 512, 1, 1, 2>(xb, yb, rows, cols, flush, flush_bytes, reps, &e));
    }
  }
  return 0;
}
