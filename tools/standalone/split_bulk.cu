// Standalone measurement (not part of the package): the on-chip split's structure with its chunks
// filled by per-thread cp.async (MODE 0, as softmax.cuh does) or by the bulk copy engine (MODE 1:
// cp.async.bulk into shared memory on an mbarrier, thread stores; MODE 2: bulk loads and bulk
// stores). MERGE 0 normalises each chunk by its own (m, d) (the structure alone, outputs not a
// softmax); MERGE 1 merges the row's chunks through global memory as split_cached does.
// Build and run on an sm_90 GPU:  nvcc -arch=sm_90 -O3 -std=c++17 -o split_bulk split_bulk.cu && ./split_bulk
#include "common.cuh"

constexpr int PARTS_MAX = 8;

template <typename T, int MODE, int MERGE>
__global__ void __launch_bounds__(256) proto(const T* x, T* y, unsigned long long* pairs, long rows, long cols, int chunks,
                                             int chunk_slots, int parts) {
  constexpr int VEC = 16 / sizeof(T);
  extern __shared__ float4 cache[];
  __shared__ uint64_t bars[PARTS_MAX];
  const long rows_per_round = gridDim.x / chunks;
  const int chunk = blockIdx.x % chunks;
  if (blockIdx.x / chunks >= rows_per_round) return;
  const long slots = cols / VEC;  // cols a multiple of VEC, rows 16-byte aligned
  const long begin = (long)chunk * chunk_slots;
  const int n = (int)lmin(chunk_slots, slots - begin);
  const int part_slots = (n + parts - 1) / parts;
  if (MODE != 0 && threadIdx.x == 0) {
    for (int p = 0; p < parts; ++p) bar_init(&bars[p], 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  unsigned phase = 0;
  auto issue_bulk = [&](long row) {
    if (threadIdx.x == 0) {
      const float4* src = reinterpret_cast<const float4*>(x + row * cols) + begin;
      for (int p = 0; p < parts; ++p) {
        const int a = p * part_slots, b = (int)lmin(n, a + part_slots);
        if (b <= a) { bar_expect(&bars[p], 0); continue; }
        bar_expect(&bars[p], (b - a) * 16);
        bulk_load(cache + a, src + a, (b - a) * 16, &bars[p]);
      }
    }
  };
  long row = blockIdx.x / chunks;
  if (MODE == 0) {
    const float4* src = reinterpret_cast<const float4*>(x + row * cols) + begin;
    for (int j = threadIdx.x; j < n; j += blockDim.x) cp16(cache + j, src + j);
  } else {
    issue_bulk(row);
  }
  for (; row < rows; row += rows_per_round) {
    const long next = row + rows_per_round;
    // (m, d) of this thread's slots
    float m = -INFINITY, d = 0.f;
    auto push = [&](const float4& r) {
      float v[VEC];
      widen16<T>(r, v);
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
    if (MODE == 0) {
      asm volatile("cp.async.wait_all;" ::: "memory");
      for (int j = threadIdx.x; j < n; j += blockDim.x) push(cache[j]);
    } else {
      int j = threadIdx.x;
      for (int p = 0; p < parts; ++p) {
        bar_wait(&bars[p], phase);
        const int b = (int)lmin(n, (p + 1) * part_slots);
        for (; j < b; j += blockDim.x) push(cache[j]);
      }
      phase ^= 1;
    }
    MD md = block_reduce(MD{m, d});
    if (MERGE) {
      __shared__ float tm, td;
      if (threadIdx.x == 0) {
        union { float f[2]; unsigned long long u; } w;
        w.f[0] = md.m; w.f[1] = md.d;
        *(volatile unsigned long long*)(pairs + row * chunks + chunk) = w.u;
      }
      if (threadIdx.x < 32) {
        MD acc{-INFINITY, 0.f};
        for (int c = threadIdx.x; c < chunks; c += 32) {
          union { float f[2]; unsigned long long u; } w;
          while ((w.u = *(volatile unsigned long long*)(pairs + row * chunks + c)) == 0) __nanosleep(64);
          acc = comb(acc, MD{w.f[0], w.f[1]});
        }
        for (int o = 16; o; o /= 2) acc = comb(acc, MD{__shfl_xor_sync(~0u, acc.m, o), __shfl_xor_sync(~0u, acc.d, o)});
        if (threadIdx.x == 0) { tm = acc.m; td = acc.d; }
      }
      __syncthreads();
      md = MD{tm, td};
    }
    const float L = 1.4426950408889634f;
    const float h = md.m * L + __log2f(md.d);
    float4* dst = reinterpret_cast<float4*>(y + row * cols) + begin;
    if (MODE == 0) {
      const float4* nsrc = reinterpret_cast<const float4*>(x + next * cols) + begin;
      for (int j = threadIdx.x; j < n; j += blockDim.x) {
        float v[VEC];
        widen16<T>(cache[j], v);
#pragma unroll
        for (int e = 0; e < VEC; ++e) v[e] = ex2(fmaf(v[e], L, -h));
        const float4 o = narrow16<T>(v);
        asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(dst + j), "r"(__float_as_uint(o.x)), "r"(__float_as_uint(o.y)),
                     "r"(__float_as_uint(o.z)), "r"(__float_as_uint(o.w)));
        if (next < rows) cp16(cache + j, nsrc + j);
      }
    } else if (MODE == 1) {
      for (int j = threadIdx.x; j < n; j += blockDim.x) {
        float v[VEC];
        widen16<T>(cache[j], v);
#pragma unroll
        for (int e = 0; e < VEC; ++e) v[e] = ex2(fmaf(v[e], L, -h));
        const float4 o = narrow16<T>(v);
        asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(dst + j), "r"(__float_as_uint(o.x)), "r"(__float_as_uint(o.y)),
                     "r"(__float_as_uint(o.z)), "r"(__float_as_uint(o.w)));
      }
      __syncthreads();
      if (next < rows) issue_bulk(next);
    } else {
      for (int j = threadIdx.x; j < n; j += blockDim.x) {
        float v[VEC];
        widen16<T>(cache[j], v);
#pragma unroll
        for (int e = 0; e < VEC; ++e) v[e] = ex2(fmaf(v[e], L, -h));
        cache[j] = narrow16<T>(v);
      }
      fence_async_smem();
      __syncthreads();
      if (threadIdx.x == 0) {
        bulk_store(dst, cache, n * 16);
        bulk_commit();
        bulk_wait_read();
      }
      if (next < rows) issue_bulk(next);
    }
  }
  if (MODE == 2 && threadIdx.x == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

template <typename T, int MODE, int MERGE>
float run(const T* x, T* y, unsigned long long* pairs, long rows, long cols, int chunks, int parts, void* flush, size_t flush_bytes,
          int reps, double* err) {
  constexpr int VEC = 16 / sizeof(T);
  const long slots = cols / VEC;
  const int chunk_slots = (int)((slots + chunks - 1) / chunks);
  const size_t shared = (size_t)chunk_slots * 16;
  auto k = proto<T, MODE, MERGE>;
  CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared));
  int per_sm = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, 256, shared));
  int sms;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int grid = (per_sm * sms / chunks) * chunks;
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int r = 0; r < reps; ++r) {
    CK(cudaMemsetAsync(flush, r, flush_bytes));
    CK(cudaMemsetAsync(y, 0xff, rows * cols * sizeof(T)));  // poison
    CK(cudaMemsetAsync(flush, r + 1, flush_bytes));
    CK(cudaEventRecord(a));
    if (MERGE) CK(cudaMemsetAsync(pairs, 0, rows * chunks * 8));
    k<<<grid, 256, shared>>>(x, y, pairs, rows, cols, chunks, chunk_slots, parts);
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    CK(cudaGetLastError());
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  // check the first and last rows' sums (MERGE only: else each chunk sums to 1)
  *err = 0;
  if (MERGE) {
    std::vector<T> h(cols);
    for (long rr : {0L, rows / 2, rows - 1}) {
      CK(cudaMemcpy(h.data(), y + rr * cols, cols * sizeof(T), cudaMemcpyDeviceToHost));
      double s = 0;
      for (long i = 0; i < cols; ++i) s += (double)tof(h[i]);
      *err = std::max(*err, std::abs(s - 1.0));
    }
  }
  (void)per_sm;
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
  unsigned long long* pairs;
  CK(cudaMalloc(&pairs, 1 << 24));
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
  struct Cfg { const char* dt; long cols; int chunks; };
  std::vector<Cfg> cfgs = {{"f32", 131072, 8}, {"f32", 131072, 10}, {"f32", 65536, 5}, {"f32", 262144, 20}, {"f32", 32000, 2},
                           {"bf16", 262144, 10}, {"bf16", 131072, 5}, {"bf16", 128256, 5}};
  for (auto& c : cfgs) {
    for (int parts : {1, 4}) {
      double e0, e1, e2, e3, e4, e5;
      float t0, t1, t2, t3, t4, t5;
      if (c.dt[0] == 'f') {
        const long rows = bytes / 4 / c.cols;
        t0 = run<float, 0, 0>(xf, yf, pairs, rows, c.cols, c.chunks, parts, flush, flush_bytes, reps, &e0);
        t1 = run<float, 1, 0>(xf, yf, pairs, rows, c.cols, c.chunks, parts, flush, flush_bytes, reps, &e1);
        t2 = run<float, 2, 0>(xf, yf, pairs, rows, c.cols, c.chunks, parts, flush, flush_bytes, reps, &e2);
        t3 = run<float, 0, 1>(xf, yf, pairs, rows, c.cols, c.chunks, parts, flush, flush_bytes, reps, &e3);
        t4 = run<float, 1, 1>(xf, yf, pairs, rows, c.cols, c.chunks, parts, flush, flush_bytes, reps, &e4);
        t5 = run<float, 2, 1>(xf, yf, pairs, rows, c.cols, c.chunks, parts, flush, flush_bytes, reps, &e5);
        printf("f32 %ldx%ld", rows, c.cols);
      } else {
        const long rows = bytes / 2 / c.cols;
        t0 = run<__nv_bfloat16, 0, 0>(xb, yb, pairs, rows, c.cols, c.chunks, parts, flush, flush_bytes, reps, &e0);
        t1 = run<__nv_bfloat16, 1, 0>(xb, yb, pairs, rows, c.cols, c.chunks, parts, flush, flush_bytes, reps, &e1);
        t2 = run<__nv_bfloat16, 2, 0>(xb, yb, pairs, rows, c.cols, c.chunks, parts, flush, flush_bytes, reps, &e2);
        t3 = run<__nv_bfloat16, 0, 1>(xb, yb, pairs, rows, c.cols, c.chunks, parts, flush, flush_bytes, reps, &e3);
        t4 = run<__nv_bfloat16, 1, 1>(xb, yb, pairs, rows, c.cols, c.chunks, parts, flush, flush_bytes, reps, &e4);
        t5 = run<__nv_bfloat16, 2, 1>(xb, yb, pairs, rows, c.cols, c.chunks, parts, flush, flush_bytes, reps, &e5);
        printf("bf16 %ldx%ld", rows, c.cols);
      }
      const float c1 = copy_ms();
      const float cb = std::min(c0, c1);
      printf(" chunks %d parts %d | nomerge cpasync %.1f bulk+st %.1f bulk+bulkst %.1f | merge cpasync %.1f bulk+st %.1f bulk+bulkst %.1f | err %.1e %.1e %.1e\n",
             c.chunks, parts, 100 * cb / t0, 100 * cb / t1, 100 * cb / t2, 100 * cb / t3, 100 * cb / t4, 100 * cb / t5, e3, e4, e5);
      fflush(stdout);
    }
  }
  return 0;
}
