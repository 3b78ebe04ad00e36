// Standalone measurement (not part of the package): rows longer than a multiprocessor holds, split
// into chunks whose second read comes from the L2 cache rather than from shared memory. A resident
// grid takes the chunks in rounds of one chunk a block; a block reads its chunk of round j (phase 1:
// the chunk's (m, d), published as one 64-bit word), then normalises its chunk of round j - LAG
// (phase 2: the row's pairs merged, the chunk read again, now from the L2, and stored). Between its
// two reads a chunk waits LAG rounds, so the L2 holds about (LAG + 1) rounds of chunks, and the
// merge wait is over before it is asked for. The on-chip split, by contrast, keeps each chunk in
// shared memory and waits for the row's other chunks at once.
// Build and run on an sm_90 GPU:  nvcc -arch=sm_90 -O3 -std=c++17 -o split_l2 split_l2.cu -lcuda && ./split_l2
#include "common.cuh"

// L2 eviction policies (createpolicy) and loads/stores that carry them.
__device__ __forceinline__ uint64_t policy_evict_last() {
  uint64_t p;
  asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
  return p;
}
__device__ __forceinline__ uint64_t policy_evict_first() {
  uint64_t p;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
  return p;
}
__device__ __forceinline__ float4 load_hint(const float4* at, uint64_t policy) {
  float4 r;
  asm volatile("ld.global.L1::no_allocate.L2::cache_hint.v4.f32 {%0, %1, %2, %3}, [%4], %5;"
               : "=f"(r.x), "=f"(r.y), "=f"(r.z), "=f"(r.w) : "l"(at), "l"(policy));
  return r;
}
__device__ __forceinline__ void store_hint(float4* at, const float4& o, uint64_t policy) {
  asm volatile("st.global.L2::cache_hint.v4.b32 [%0], {%1, %2, %3, %4}, %5;" ::"l"(at), "r"(__float_as_uint(o.x)),
               "r"(__float_as_uint(o.y)), "r"(__float_as_uint(o.z)), "r"(__float_as_uint(o.w)), "l"(policy) : "memory");
}

union PairWord { MD md; unsigned long long bits; };

// HINT 0: plain loads and stores (.cg reads, .cs second reads and stores); 1: L2 policies
// (evict_last on the first read, evict_first on the second read and the stores).
template <typename T, int THREADS, int SLOTS, int LAG, int HINT>
__global__ void __launch_bounds__(THREADS) split_l2(const T* x, T* y, unsigned long long* pairs, long rows, long cols,
                                                    long chunks_per_row) {
  constexpr int VEC = 16 / sizeof(T);
  constexpr long kChunk = (long)THREADS * SLOTS;  // slots a chunk
  const long slots = cols / VEC;
  const long tasks = rows * chunks_per_row;
  const long per_round = gridDim.x;
  const long rounds = (tasks + per_round - 1) / per_round;
  __shared__ MD row_md;
  const uint64_t keep = HINT ? policy_evict_last() : 0, drop = HINT ? policy_evict_first() : 0;
  for (long round = 0; round < rounds + LAG; ++round) {
    // Phase 1: the (m, d) of this round's chunk.
    const long t1 = round * per_round + blockIdx.x;
    if (round < rounds && t1 < tasks) {
      const long row = t1 / chunks_per_row, begin = (t1 % chunks_per_row) * kChunk;
      const long n = lmin(kChunk, slots - begin);
      const float4* src = reinterpret_cast<const float4*>(x + row * cols) + begin;
      float4 r[SLOTS];
#pragma unroll
      for (int s = 0; s < SLOTS; ++s) {
        const long k = s * THREADS + threadIdx.x;
        if (k < n) r[s] = HINT ? load_hint(src + k, keep) : __ldcg(src + k);
      }
      RowSum<T, 1, 1> sum;
#pragma unroll
      for (int s = 0; s < SLOTS; ++s) {
        if (s * THREADS + (long)threadIdx.x < n) sum.push(r[s]);
      }
      const MD md = block_reduce(sum.md());
      if (threadIdx.x == 0) {
        PairWord w;
        w.md = md;
        asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" ::"l"(pairs + t1), "l"(w.bits) : "memory");
      }
    }
    // Phase 2: normalise the chunk read LAG rounds ago.
    const long t2 = (round - LAG) * per_round + blockIdx.x;
    if (round >= LAG && t2 < tasks) {
      const long row = t2 / chunks_per_row, begin = (t2 % chunks_per_row) * kChunk;
      if (threadIdx.x < 32) {
        MD md{-INFINITY, 0.f};
        for (long c = threadIdx.x; c < chunks_per_row; c += 32) {
          PairWord w;
          do {
            asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(w.bits) : "l"(pairs + row * chunks_per_row + c) : "memory");
          } while (w.bits == 0);
          md = comb(md, w.md);
        }
        for (int o = 16; o; o /= 2) md = comb(md, MD{__shfl_xor_sync(~0u, md.m, o), __shfl_xor_sync(~0u, md.d, o)});
        if (threadIdx.x == 0) row_md = md;
      }
      __syncthreads();
      const MD md = row_md;
      __syncthreads();  // row_md is rewritten next round
      const long n = lmin(kChunk, slots - begin);
      const float4* src = reinterpret_cast<const float4*>(x + row * cols) + begin;
      float4* dst = reinterpret_cast<float4*>(y + row * cols) + begin;
      const float h = md.m * kLog2e + __log2f(md.d);
      auto softmax = [&](float v) { return ex2(fmaf(v, kLog2e, -h)); };
      float4 r[SLOTS];
#pragma unroll
      for (int s = 0; s < SLOTS; ++s) {
        const long k = s * THREADS + threadIdx.x;
        if (k < n) r[s] = HINT ? load_hint(src + k, drop) : __ldcs(src + k);
      }
#pragma unroll
      for (int s = 0; s < SLOTS; ++s) {
        const long k = s * THREADS + threadIdx.x;
        if (k < n) {
          const float4 o = map16<T>(r[s], softmax);
          if (HINT) store_hint(dst + k, o, drop);
          else __stcs(dst + k, o);
        }
      }
    }
  }
}

struct Timing { float ms; double err; int per_sm; };

template <typename T, int THREADS, int SLOTS, int LAG, int HINT>
Timing run_split_l2(const Bench& bench, const T* x, T* y, long rows, long cols, int per_sm_cap) {
  constexpr int VEC = 16 / sizeof(T);
  const long slots = cols / VEC, chunk = (long)THREADS * SLOTS;
  const long chunks_per_row = (slots + chunk - 1) / chunk;
  auto kernel = split_l2<T, THREADS, SLOTS, LAG, HINT>;
  int per_sm = 0, sms = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, THREADS, 0));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  per_sm = std::min(per_sm, per_sm_cap);
  const long grid = (long)per_sm * sms;
  unsigned long long* pairs;
  CK(cudaMalloc(&pairs, rows * chunks_per_row * 8));
  Timing t{0, 0, per_sm};
  t.ms = bench.median_ms(y, [&] {
    CK(cudaMemsetAsync(pairs, 0, rows * chunks_per_row * 8));
    kernel<<<grid, THREADS>>>(x, y, pairs, rows, cols, chunks_per_row);
  });
  t.err = row_sum_error(y, rows, cols);
  CK(cudaFree(pairs));
  return t;
}

int main() {
  setvbuf(stdout, NULL, _IONBF, 0);
  Bench bench;
  const long bytes = Bench::kBytes;
  const float copy = bench.copy_ms();
  printf("copy %.4f ms (%.0f GB/s)\n", copy, 2.0 * bytes / copy / 1e6);
  auto rep = [&](const char* what, long rows, long cols, Timing t) {
    printf("  %-30s %ldx%ld %5.1f%% of copy  (blocks/SM %d, |sum-1| %.1e)\n", what, rows, cols, 100 * copy / t.ms, t.per_sm, t.err);
  };
  for (int pass = 0; pass < 2; ++pass) {
    for (long cols : {131072L, 262144L, 128256L}) {
      const long rows = bytes / 4 / cols;
      float* x = bench.xf;
      float* y = bench.yf;
      rep("f32 512t s4 lag1 plain", rows, cols, run_split_l2<float, 512, 4, 1, 0>(bench, x, y, rows, cols, 4));
      rep("f32 512t s4 lag1 hint", rows, cols, run_split_l2<float, 512, 4, 1, 1>(bench, x, y, rows, cols, 4));
      rep("f32 512t s4 lag2 hint", rows, cols, run_split_l2<float, 512, 4, 2, 1>(bench, x, y, rows, cols, 4));
      rep("f32 512t s8 lag1 hint", rows, cols, run_split_l2<float, 512, 8, 1, 1>(bench, x, y, rows, cols, 4));
      rep("f32 256t s8 lag1 hint", rows, cols, run_split_l2<float, 256, 8, 1, 1>(bench, x, y, rows, cols, 8));
      rep("f32 1024t s4 lag1 hint", rows, cols, run_split_l2<float, 1024, 4, 1, 1>(bench, x, y, rows, cols, 2));
    }
    for (long cols : {262144L, 131072L, 100000L}) {
      const long rows = bytes / 2 / cols;
      __nv_bfloat16* x = bench.xb;
      __nv_bfloat16* y = bench.yb;
      rep("bf16 512t s4 lag1 plain", rows, cols, run_split_l2<__nv_bfloat16, 512, 4, 1, 0>(bench, x, y, rows, cols, 4));
      rep("bf16 512t s4 lag1 hint", rows, cols, run_split_l2<__nv_bfloat16, 512, 4, 1, 1>(bench, x, y, rows, cols, 4));
      rep("bf16 512t s4 lag2 hint", rows, cols, run_split_l2<__nv_bfloat16, 512, 4, 2, 1>(bench, x, y, rows, cols, 4));
      rep("bf16 512t s8 lag1 hint", rows, cols, run_split_l2<__nv_bfloat16, 512, 8, 1, 1>(bench, x, y, rows, cols, 4));
      rep("bf16 256t s8 lag1 hint", rows, cols, run_split_l2<__nv_bfloat16, 256, 8, 1, 1>(bench, x, y, rows, cols, 8));
    }
  }
  return 0;
}
