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
    RowSum<T, 0, 1> sum;  // (m, d) of this thread's slots
    if (MODE == 0) {
      asm volatile("cp.async.wait_all;" ::: "memory");
      for (int j = threadIdx.x; j < n; j += blockDim.x) sum.push(cache[j]);
    } else {
      int j = threadIdx.x;
      for (int p = 0; p < parts; ++p) {
        bar_wait(&bars[p], phase);
        const int b = (int)lmin(n, (p + 1) * part_slots);
        for (; j < b; j += blockDim.x) sum.push(cache[j]);
      }
      phase ^= 1;
    }
    MD md = block_reduce(sum.md());
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
    const float h = md.m * kLog2e + __log2f(md.d);
    auto softmax = [&](float v) { return ex2(fmaf(v, kLog2e, -h)); };
    float4* dst = reinterpret_cast<float4*>(y + row * cols) + begin;
    if (MODE == 2) {  // outputs in place, then bulk stores
      for (int j = threadIdx.x; j < n; j += blockDim.x) cache[j] = map16<T>(cache[j], softmax);
      fence_async_smem();
      __syncthreads();
      if (threadIdx.x == 0) {
        bulk_store(dst, cache, n * 16);
        bulk_commit();
        bulk_wait_read();
      }
    } else {  // thread stores; MODE 0 refills each slot with the next row's after its store
      const float4* next_src = reinterpret_cast<const float4*>(x + next * cols) + begin;
      for (int j = threadIdx.x; j < n; j += blockDim.x) {
        store16(dst + j, map16<T>(cache[j], softmax));
        if (MODE == 0 && next < rows) cp16(cache + j, next_src + j);
      }
      if (MODE == 1) __syncthreads();
    }
    if (MODE != 0 && next < rows) issue_bulk(next);
  }
  if (MODE == 2 && threadIdx.x == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

// Times proto<T, MODE, MERGE> on rows x cols (chunks a row, parts a chunk) with every block
// resident; returns (ms, largest |row sum - 1| where MERGE, else 0).
template <typename T, int MODE, int MERGE>
std::pair<float, double> run(const Bench& bench, const T* x, T* y, unsigned long long* pairs, long rows, long cols, int chunks,
                             int parts) {
  const long slots = cols * (long)sizeof(T) / 16;
  const int chunk_slots = (int)((slots + chunks - 1) / chunks);
  const size_t shared = (size_t)chunk_slots * 16;
  auto k = proto<T, MODE, MERGE>;
  CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared));
  int per_sm = 0, sms = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, 256, shared));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int grid = (per_sm * sms / chunks) * chunks;
  const float ms = bench.median_ms(y, [&] {
    if (MERGE) CK(cudaMemsetAsync(pairs, 0, rows * chunks * 8));  // part of the call, as the library's scratch
    k<<<grid, 256, shared>>>(x, y, pairs, rows, cols, chunks, chunk_slots, parts);
  });
  return {ms, MERGE ? row_sum_error(y, rows, cols) : 0.0};  // without the merge each chunk sums to 1
}

// The six (MODE, MERGE) variants on one shape: "nomerge" then "merge", each cp.async / bulk loads
// and thread stores / bulk loads and bulk stores.
template <typename T>
void run_all(const Bench& bench, const T* x, T* y, unsigned long long* pairs, const char* dtype, long cols, int chunks,
             int parts) {
  const long rows = Bench::kBytes / (long)sizeof(T) / cols;
  const std::pair<float, double> r[6] = {
      run<T, 0, 0>(bench, x, y, pairs, rows, cols, chunks, parts), run<T, 1, 0>(bench, x, y, pairs, rows, cols, chunks, parts),
      run<T, 2, 0>(bench, x, y, pairs, rows, cols, chunks, parts), run<T, 0, 1>(bench, x, y, pairs, rows, cols, chunks, parts),
      run<T, 1, 1>(bench, x, y, pairs, rows, cols, chunks, parts), run<T, 2, 1>(bench, x, y, pairs, rows, cols, chunks, parts)};
  const float copy = bench.copy_ms();
  printf("%s %ldx%ld chunks %d parts %d | nomerge cpasync %.1f bulk+st %.1f bulk+bulkst %.1f | merge cpasync %.1f bulk+st "
         "%.1f bulk+bulkst %.1f | err %.1e %.1e %.1e\n",
         dtype, rows, cols, chunks, parts, 100 * copy / r[0].first, 100 * copy / r[1].first, 100 * copy / r[2].first,
         100 * copy / r[3].first, 100 * copy / r[4].first, 100 * copy / r[5].first, r[3].second, r[4].second, r[5].second);
}

int main() {
  setvbuf(stdout, NULL, _IONBF, 0);
  Bench bench;
  unsigned long long* pairs;
  CK(cudaMalloc(&pairs, 1 << 24));
  const float copy = bench.copy_ms();
  printf("copy %.4f ms (%.0f GB/s)\n", copy, 2.0 * Bench::kBytes / copy / 1e6);
  for (int parts : {1, 4}) {
    for (auto [cols, chunks] : {std::pair{131072L, 8}, {131072L, 10}, {65536L, 5}, {262144L, 20}, {32000L, 2}}) {
      run_all(bench, bench.xf, bench.yf, pairs, "f32", cols, chunks, parts);
    }
    for (auto [cols, chunks] : {std::pair{262144L, 10}, {131072L, 5}, {128256L, 5}}) {
      run_all(bench, bench.xb, bench.yb, pairs, "bf16", cols, chunks, parts);
    }
  }
  return 0;
}
