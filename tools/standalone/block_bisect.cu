// Standalone measurement (not part of the package): which of the library block tier's pieces
// costs it against the plain block-a-row kernel (blockv in block_rows.cu). One kernel template,
// `mixed`, takes each piece from the library (bit set in K) or from blockv (bit clear), so that
// single bits and their sums can be timed side by side with the library's own kernel.
// The bits name the block tier's pieces as they were at 0652c48, whose src_cuda the figures in
// docs/benchmark-history.md (eighteenth session) were taken with. The library then took kEdgeCopy,
// kEdgeStore, the unrolled waits and an OnlineSum with no early return (76eca10), so against
// today's src_cuda `library` and kOnlineSum measure those.
// Build and run on an sm_90 GPU:  nvcc -arch=sm_90 -O3 -std=c++17 -I ../../src_cuda -o block_bisect block_bisect.cu && ./block_bisect
#include "common.cuh"
#include "softmax.cuh"

enum Piece {
  kCopyTest = 1,      // copies through CachedChunk::copy_to_cache (whole-slot test, chunk addressing)
  kOnlineSum = 2,     // (m, d) by ps::OnlineSum (else RowSum<KAHAN=1, SHIFT=0>, the same arithmetic)
  kWaitChain = 4,     // the group loop rolled with the recursive wait (else unrolled, constant waits)
  kBlockReduce = 8,   // ps::md_reduce_block (else block_reduce)
  kRowFinish = 16,    // outputs by ps::RowFinish (precise log2 of d, the -inf handling)
  kStoreTest = 32,    // stores through CachedChunk::store (whole-slot test) (else store16)
  kBounds3 = 64,      // __launch_bounds__(512, 3) (else (512))
  kRowLoop = 128,     // the grid-stride row loop with 64-bit row arithmetic
  // Candidate replacements (not in the library):
  kEdgeCopy = 256,    // whole slots copied with no test, a row's partial first / last slot by its owner
  kShiftSum = 512,    // OnlineSum keeping exps relative to max(m, 0 if m = -inf): no early return
  kEdgeStore = 1024,  // whole slots stored with no test, partial ones by their owners
};

// OnlineSum (same NaN handling and rescale) with the exps taken relative to `shift`, which is m
// or 0 while nothing above -inf has come: a -inf value then adds exp(-inf) = 0 with no test.
struct ShiftSum {
  float m = -INFINITY, shift = 0.f, d = 0.f, carry = 0.f;
  template <int N> __device__ __forceinline__ void push_all(const float* v) {
    float top = v[0];
#pragma unroll
    for (int j = 1; j < N; ++j) top = ps_max_nan(top, v[j]);
    if (top > m || top != top) {
      const float scale = m == -INFINITY ? 0.f : expf(m - top);
      d *= scale;
      carry *= scale;
      m = top;
      shift = top;
    }
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < N; ++j) sum += ex2(fmaf(v[j] - shift, kLog2e, -0.0f));
    const float y = sum - carry, t = d + y;
    carry = (t - d) - y;
    d = t;
  }
};
constexpr int kLibrary = 255;

template <typename T, int GROUPS, int K>
__device__ __forceinline__ void mixed_row(const T* x, T* y, long long row, long long cols, float4* cache) {
  constexpr int VEC = 16 / sizeof(T);
  typedef ps::Vec<T, VEC> V;
  V* vcache = reinterpret_cast<V*>(cache);
  const ps::RowSlots<T, VEC> rs(x + row * cols, y + row * cols, cols);
  const ps::CachedChunk<T, VEC> chunk(rs, 0, rs.slots);
  const float4* src = reinterpret_cast<const float4*>(x + row * cols);
  float4* dst = reinterpret_cast<float4*>(y + row * cols);
  const int n = chunk.n;
  const int whole_end = chunk.whole_from + chunk.whole;
  int j = threadIdx.x;
  // A row's partial slots: at most local slot 0 (the row starts inside it) and slot n - 1 (ends inside).
  const int head = chunk.whole_from;                              // 0 or 1 partial slots at the start
  const int tail_from = whole_end > head ? whole_end : head;      // partial slots [tail_from, n): 0 or 1
  const int lo = rs.pad, hi = rs.pad + (int)cols;                 // in-row element indices from x0
  auto load_edge = [&](int k) {
    V raw;
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      const int i = k * VEC + e;
      raw.v[e] = (i >= lo && i < hi) ? chunk.x0[i] : from_compute<T>(-INFINITY);
    }
    vcache[k] = raw;
  };
  if (K & kEdgeCopy) {
    if ((int)threadIdx.x < head) load_edge(0);
    if (tail_from < n && (n - 1) % (int)blockDim.x == (int)threadIdx.x) load_edge(n - 1);
    if (j < head) j += blockDim.x;
  }
#pragma unroll
  for (int g = 0; g < GROUPS; ++g) {
    if (K & kEdgeCopy) {
      const int stop = n * (g + 1) / GROUPS < whole_end ? n * (g + 1) / GROUPS : whole_end;
      for (; j < stop; j += blockDim.x) cp16(cache + j, chunk.x0 + j * VEC);
    } else {
      for (; j < n * (g + 1) / GROUPS; j += blockDim.x) {
        if (K & kCopyTest) chunk.copy_to_cache(j, vcache);
        else cp16(cache + j, src + j);
      }
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
  }
  ps::OnlineSum<float> online;
  ShiftSum shifted;
  RowSum<T, 1, 0> plain;
  auto push = [&](int at) {
    if (K & kShiftSum) {
      float v[VEC];
      ps::widen(vcache[at], v);
      shifted.template push_all<VEC>(v);
    } else if (K & kOnlineSum) {
      float v[VEC];
      ps::widen(vcache[at], v);
      online.template push_all<VEC>(v);
    } else {
      plain.push(cache[at]);
    }
  };
  j = threadIdx.x;
  if (K & kWaitChain) {
#pragma unroll 1
    for (int g = 0; g < GROUPS; ++g) {
#if PS_ASYNC_COPY
      ps::async_copy_wait_groups_but<GROUPS - 1>(GROUPS - 1 - g);
#endif
      for (; j < n * (g + 1) / GROUPS; j += blockDim.x) push(j);
    }
  } else {
#pragma unroll
    for (int g = 0; g < GROUPS; ++g) {
      wait_for_group<GROUPS>(g);
      for (; j < n * (g + 1) / GROUPS; j += blockDim.x) push(j);
    }
  }
  const MD mine = (K & kShiftSum) ? MD{shifted.m, shifted.d} : (K & kOnlineSum) ? MD{online.m, online.d} : plain.md();
  MD md;
  if (K & kBlockReduce) {
    const ps::MD<float> r = ps::md_reduce_block<32>(ps::MD<float>{mine.m, mine.d});
    md = MD{r.m, r.d};
  } else {
    md = block_reduce(mine);
  }
  if (K & kEdgeStore) {
    const ps::RowFinish<ps::kSoftmax, T> f(ps::MD<float>{md.m, md.d}, false);
    auto finish = [&](int at, float* v) {
      ps::widen(vcache[at], v);
      ps::finish_slot<ps::kSoftmax, T, VEC>(f, v);
    };
    for (j = threadIdx.x < chunk.whole_from ? threadIdx.x + blockDim.x : threadIdx.x; j < whole_end; j += blockDim.x) {
      float v[VEC];
      finish(j, v);
      store16(reinterpret_cast<float4*>(chunk.y0 + j * VEC), narrow16<T>(v));
    }
    auto store_edge = [&](int k) {
      float v[VEC];
      finish(k, v);
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const int i = k * VEC + e;
        if (i >= lo && i < hi) chunk.y0[i] = from_compute<T>(v[e]);
      }
    };
    if ((int)threadIdx.x < head) store_edge(0);
    if (tail_from < n && (n - 1) % (int)blockDim.x == (int)threadIdx.x) store_edge(n - 1);
  } else if (K & kRowFinish) {
    const ps::RowFinish<ps::kSoftmax, T> f(ps::MD<float>{md.m, md.d}, false);
    for (j = threadIdx.x; j < n; j += blockDim.x) {
      float v[VEC];
      ps::widen(vcache[j], v);
      ps::finish_slot<ps::kSoftmax, T, VEC>(f, v);
      if (K & kStoreTest) chunk.store(j, v);
      else store16(dst + j, narrow16<T>(v));
    }
  } else {
    const float l2d = __log2f(md.d);
    auto softmax = [&](float v) { return ex2(fmaf(v - md.m, kLog2e, -l2d)); };
    for (j = threadIdx.x; j < n; j += blockDim.x) {
      const float4 o = map16<T>(cache[j], softmax);
      if (K & kStoreTest) {
        V raw;
        memcpy(&raw, &o, sizeof(o));
        float v[VEC];
        ps::widen(raw, v);
        chunk.store(j, v);
      } else {
        store16(dst + j, o);
      }
    }
  }
}

template <typename T, int GROUPS, int K>
__global__ void __launch_bounds__(512, (K & kBounds3) ? 3 : 1) mixed(const T* x, T* y, long long rows, long long cols) {
  extern __shared__ float4 cache[];
  if (K & kRowLoop) {
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) mixed_row<T, GROUPS, K>(x, y, row, cols, cache);
  } else {
    mixed_row<T, GROUPS, K>(x, y, (long long)blockIdx.x, cols, cache);
  }
}

// The library's kernel itself, compiled here from its sources.
template <typename T, int VEC>
__global__ void __launch_bounds__(ps::kBlockTierThreads, ps::kBlockTierMinBlocks) library(const T* x, T* y, long long rows, long long cols) {
  extern __shared__ float4 cache[];
  ps::block_rows<T, ps::kSoftmax, 32, VEC>(x, y, rows, cols, cols, cols, 0, reinterpret_cast<ps::Vec<T, VEC>*>(cache));
}

template <typename T, typename Kernel>
float time_kernel(const Bench& bench, Kernel kernel, const T* x, T* y, long rows, long cols, double* err) {
  const size_t shared = (size_t)cols * sizeof(T);
  CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared));
  const float ms = bench.median_ms(y, [&] { kernel<<<rows, 512, shared>>>(x, y, rows, cols); });
  *err = row_sum_error(y, rows, cols);
  return ms;
}

template <typename T, int GROUPS, int... Ks> void sweep(const Bench& bench, float copy, const T* x, T* y, long cols, const char* dt) {
  const long rows = Bench::kBytes / (long)sizeof(T) / cols;
  double err;
  const float lib = time_kernel(bench, library<T, 16 / sizeof(T)>, x, y, rows, cols, &err);
  printf("%s %ldx%ld  library %5.1f (|sum-1| %.1e)\n", dt, rows, cols, 100 * copy / lib, err);
  auto one = [&](int k, auto kernel) {
    const float ms = time_kernel(bench, kernel, x, y, rows, cols, &err);
    printf("%s %ldx%ld  K=%3d   %5.1f (|sum-1| %.1e)\n", dt, rows, cols, k, 100 * copy / ms, err);
  };
  (one(Ks, mixed<T, GROUPS, Ks>), ...);
}

int main() {
  setvbuf(stdout, NULL, _IONBF, 0);
  Bench bench;
  bench.fill_inputs(true);
  const float copy = bench.copy_ms();
  printf("copy %.4f ms (%.0f GB/s); %% of copy\n", copy, 2.0 * Bench::kBytes / copy / 1e6);
  constexpr int kCandidate = (kLibrary & ~kWaitChain) | kShiftSum | kEdgeCopy | kEdgeStore;
  for (int pass = 0; pass < 2; ++pass) {
    for (long cols : {32000L, 50256L}) {
      sweep<float, 4, 0, kOnlineSum, kShiftSum, kEdgeCopy, kEdgeStore, kLibrary & ~kWaitChain, kLibrary | kShiftSum,
            kLibrary | kEdgeCopy | kEdgeStore, kCandidate, kCandidate | kWaitChain, kCandidate & ~kShiftSum, kLibrary>(
          bench, copy, bench.xf, bench.yf, cols, "f32");
    }
    // rows off 16-byte boundaries: only the kernels that handle partial slots
    sweep<float, 4, kLibrary & ~kWaitChain, kLibrary | kShiftSum, kLibrary | kEdgeCopy | kEdgeStore, kCandidate, kLibrary>(
        bench, copy, bench.xf, bench.yf, 50257, "f32");
    sweep<__nv_bfloat16, 2, 0, kCopyTest, kStoreTest, kEdgeCopy, kEdgeStore, kLibrary | kEdgeCopy | kEdgeStore, kCandidate,
          kCandidate | kWaitChain, kLibrary>(bench, copy, bench.xb, bench.yb, 50256, "bf16");
    sweep<__nv_bfloat16, 2, kLibrary | kEdgeCopy | kEdgeStore, kCandidate, kLibrary>(bench, copy, bench.xb, bench.yb, 50257, "bf16");
  }
  return 0;
}
