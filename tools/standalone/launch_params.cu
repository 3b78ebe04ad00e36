// Standalone measurement (not part of the package): host time of one kernel launch by how its
// parameters are passed. The kernel has the small-call tiers' parameters (two pointers, four
// 64-bit integers and an int); it is launched through cuLaunchKernel with an array of parameter
// pointers (what _fastlaunch does) and with one packed buffer (`extra`), through the runtime's
// cudaLaunchKernel and <<<>>>, beside kernels of three parameters and of one struct.
// Launches are timed in batches of 500 queued behind a spinning kernel (so that none waits for the
// GPU or for room in the queue); medians of 41 batches, the variants interleaved.
// Build and run on a GPU:  nvcc -O2 -std=c++17 -o launch_params launch_params.cu -lcuda && ./launch_params
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); exit(1);} } while (0)
#define CU(x) do { CUresult e = (x); if (e != CUDA_SUCCESS) { fprintf(stderr, "%s:%d CUresult %d\n", __FILE__, __LINE__, (int)e); exit(1);} } while (0)

struct Args { const float* x; float* y; long long rows, cols, xs, ys; int safe; };

// Each kernel writes only when safe is a value never passed, so the launches do no work.
extern "C" __global__ void seven(const float* x, float* y, long long rows, long long cols, long long xs,
                                 long long ys, int safe) {
  if (safe == 12345) y[0] = x[0] + float(rows + cols + xs + ys);
}
extern "C" __global__ void three(const float* x, float* y, int safe) {
  if (safe == 12345) y[0] = x[0];
}
extern "C" __global__ void one_struct(Args a) {
  if (a.safe == 12345) a.y[0] = a.x[0] + float(a.rows + a.cols + a.xs + a.ys);
}
__global__ void spin(long long cycles) {
  long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

int main() {
  CK(cudaSetDevice(0));
  CK(cudaFree(nullptr));
  float *x, *y;
  CK(cudaMalloc(&x, 1 << 20));
  CK(cudaMalloc(&y, 1 << 20));
  CUfunction f7, f3, f1;
  CK(cudaGetFuncBySymbol(&f7, (const void*)seven));
  CK(cudaGetFuncBySymbol(&f3, (const void*)three));
  CK(cudaGetFuncBySymbol(&f1, (const void*)one_struct));
  cudaStream_t stream = nullptr;
  long long rows = 8, cols = 1000, xs = 1000, ys = 1000;
  int safe = 0;
  Args args{x, y, rows, cols, xs, ys, safe};
  const int batch = 500, batches = 41;

  using Launch = std::function<void()>;
  std::vector<std::pair<std::string, Launch>> variants = {
      {"cuLaunchKernel, 7 parameters, kernelParams", [&] {
         void* p[] = {&x, &y, &rows, &cols, &xs, &ys, &safe};
         CU(cuLaunchKernel(f7, 1, 1, 1, 32, 1, 1, 0, stream, p, nullptr));
       }},
      {"cuLaunchKernel, 7 parameters, one packed buffer", [&] {
         alignas(8) unsigned char buf[52];
         const float* xp = x;
         memcpy(buf + 0, &xp, 8);
         memcpy(buf + 8, &y, 8);
         memcpy(buf + 16, &rows, 8);
         memcpy(buf + 24, &cols, 8);
         memcpy(buf + 32, &xs, 8);
         memcpy(buf + 40, &ys, 8);
         memcpy(buf + 48, &safe, 4);
         size_t size = sizeof buf;
         void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buf, CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                          CU_LAUNCH_PARAM_END};
         CU(cuLaunchKernel(f7, 1, 1, 1, 32, 1, 1, 0, stream, nullptr, extra));
       }},
      {"cuLaunchKernel, 3 parameters, kernelParams", [&] {
         void* p[] = {&x, &y, &safe};
         CU(cuLaunchKernel(f3, 1, 1, 1, 32, 1, 1, 0, stream, p, nullptr));
       }},
      {"cuLaunchKernel, 1 struct parameter, kernelParams", [&] {
         void* p[] = {&args};
         CU(cuLaunchKernel(f1, 1, 1, 1, 32, 1, 1, 0, stream, p, nullptr));
       }},
      {"cudaLaunchKernel, 7 parameters", [&] {
         void* p[] = {&x, &y, &rows, &cols, &xs, &ys, &safe};
         CK(cudaLaunchKernel((const void*)seven, dim3(1), dim3(32), p, 0, stream));
       }},
      {"<<<>>>, 7 parameters", [&] { seven<<<1, 32, 0, stream>>>(x, y, rows, cols, xs, ys, safe); }},
  };
  std::vector<std::vector<double>> us(variants.size());
  for (auto& v : variants) v.second();  // first launches (lazy loading) outside the timings
  CK(cudaDeviceSynchronize());
  for (int b = 0; b < batches; ++b) {
    for (size_t i = 0; i < variants.size(); ++i) {
      spin<<<1, 1, 0, stream>>>(20'000'000);  // about 10 ms: longer than a batch takes to queue
      auto t0 = std::chrono::steady_clock::now();
      for (int k = 0; k < batch; ++k) variants[i].second();
      auto t1 = std::chrono::steady_clock::now();
      CK(cudaDeviceSynchronize());
      us[i].push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / batch);
    }
  }
  printf("host time a launch, us (median; lowest and highest of %d batches of %d)\n", batches, batch);
  for (size_t i = 0; i < variants.size(); ++i) {
    std::sort(us[i].begin(), us[i].end());
    printf("  %-50s %6.3f  (%6.3f-%6.3f)\n", variants[i].first.c_str(), us[i][batches / 2], us[i].front(),
           us[i].back());
  }
  return 0;
}
