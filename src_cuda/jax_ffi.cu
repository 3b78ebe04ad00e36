// XLA FFI handler that runs a portable_softmax plan inside a compiled JAX program.
//
// The Python side (portable_softmax/_jax_ffi.py) plans the call at trace time and passes the plan
// as attributes: for each launch its function handle and grid on each device ordinal, its block,
// dynamic shared memory, whether its blocks wait on each other, and its kernel arguments as
// (kind, value) pairs. The handler zeroes the scratch result where the plan asks, then launches
// each kernel on the stream XLA gives it. Host code only, linked to no GPU library: the driver's
// entry points arrive as addresses (PortableSoftmaxFfiInit), found by the Python runtime adapter
// in the library it loaded. tools/hipify_sources.py turns this file into src_hip/jax_ffi.hip.

#include <cuda.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// Kinds of a kernel argument (portable_softmax/_jax_ffi.py ARG_KINDS): a pointer into an operand,
// a result or the scratch result (value: the index, the index, the byte offset), or an integer.
constexpr int64_t kOperand = 0;
constexpr int64_t kResult = 1;
constexpr int64_t kScratch = 2;
constexpr int64_t kInt64 = 3;
constexpr int64_t kInt32 = 4;
constexpr int kMaxArgs = 32;

// The driver's entry points, set once before the first call: a plain launch, a cooperative launch,
// an asynchronous byte fill and an error's name (portable_softmax/_jax_ffi.py ENTRY_POINTS names them).
using LaunchFn = CUresult (*)(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int,
                              unsigned int, unsigned int, CUstream, void**, void**);
using CooperativeLaunchFn = CUresult (*)(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int,
                                         unsigned int, unsigned int, unsigned int, CUstream, void**);
using MemsetFn = CUresult (*)(CUdeviceptr, unsigned char, size_t, CUstream);
using ErrorNameFn = CUresult (*)(CUresult, const char**);
LaunchFn launch_kernel = nullptr;
CooperativeLaunchFn launch_cooperative_kernel = nullptr;
MemsetFn memset_async = nullptr;
ErrorNameFn error_name = nullptr;

std::string Describe(CUresult status) {
  const char* name = nullptr;
  if (error_name == nullptr || error_name(status, &name) != CUDA_SUCCESS || name == nullptr) {
    return "error " + std::to_string(static_cast<int>(status));
  }
  return std::string(name) + " (" + std::to_string(static_cast<int>(status)) + ")";
}

std::string Where(std::string_view op, int64_t axis, size_t launch) {
  return "portable_softmax " + std::string(op) + " (axis " + std::to_string(axis) + "), launch " +
         std::to_string(launch);
}

ffi::Error Launch(CUstream stream, int32_t device, ffi::RemainingArgs operands, ffi::RemainingRets results,
                  std::string_view op, int64_t axis, bool safe, int64_t zero_bytes,
                  ffi::Span<const int64_t> devices, ffi::Span<const int64_t> functions,
                  ffi::Span<const int64_t> grids, ffi::Span<const int64_t> blocks,
                  ffi::Span<const int64_t> shared, ffi::Span<const int64_t> cooperative,
                  ffi::Span<const int64_t> arg_starts, ffi::Span<const int64_t> arg_kinds,
                  ffi::Span<const int64_t> arg_values) {
  (void)safe;  // planned into the kernels' arguments; kept so that the custom call says what it computes
  if (launch_kernel == nullptr || memset_async == nullptr) {
    return ffi::Error::Internal("portable_softmax: the FFI handler was called before PortableSoftmaxFfiInit");
  }
  const size_t launches = blocks.size();
  if (results.size() < 1 || functions.size() != devices.size() * launches || grids.size() != functions.size() ||
      shared.size() != launches || cooperative.size() != launches || arg_starts.size() != launches + 1 ||
      arg_kinds.size() != arg_values.size()) {
    return ffi::Error::InvalidArgument("portable_softmax: the plan's attributes do not agree in length");
  }
  size_t row = devices.size();
  for (size_t i = 0; i < devices.size(); ++i) {
    if (devices[i] == device) row = i;
  }
  if (row == devices.size()) {
    return ffi::Error::InvalidArgument("portable_softmax " + std::string(op) + ": no kernels were resolved for "
                                       "device ordinal " + std::to_string(device) + " when the call was traced");
  }
  auto scratch = results.get<ffi::AnyBuffer>(results.size() - 1);
  if (!scratch.has_value()) return ffi::Error::InvalidArgument("portable_softmax: no scratch result");
  char* scratch_base = static_cast<char*>(scratch.value()->untyped_data());
  if (zero_bytes > 0) {
    if (static_cast<size_t>(zero_bytes) > scratch.value()->size_bytes()) {
      return ffi::Error::InvalidArgument("portable_softmax: the scratch result is smaller than the plan's");
    }
    CUresult status = memset_async(reinterpret_cast<CUdeviceptr>(scratch_base), 0,
                                   static_cast<size_t>(zero_bytes), stream);
    if (status != CUDA_SUCCESS) {
      return ffi::Error::Internal("portable_softmax " + std::string(op) + ": zeroing the scratch failed: " +
                                  Describe(status));
    }
  }
  for (size_t l = 0; l < launches; ++l) {
    const int64_t first = arg_starts[l], last = arg_starts[l + 1];
    if (first < 0 || last < first || last > static_cast<int64_t>(arg_kinds.size()) || last - first > kMaxArgs) {
      return ffi::Error::InvalidArgument(Where(op, axis, l) + ": bad argument list");
    }
    // Each argument's value lives in its own 8-byte slot; the kernel reads 4 or 8 bytes of it.
    int64_t slots[kMaxArgs];
    void* params[kMaxArgs];
    for (int64_t a = first; a < last; ++a) {
      const int64_t kind = arg_kinds[a], value = arg_values[a];
      int64_t& slot = slots[a - first];
      if (kind == kOperand) {
        auto buffer = operands.get<ffi::AnyBuffer>(static_cast<size_t>(value));
        if (!buffer.has_value()) return ffi::Error::InvalidArgument(Where(op, axis, l) + ": no such operand");
        slot = reinterpret_cast<int64_t>(buffer.value().untyped_data());
      } else if (kind == kResult) {
        auto buffer = results.get<ffi::AnyBuffer>(static_cast<size_t>(value));
        if (!buffer.has_value()) return ffi::Error::InvalidArgument(Where(op, axis, l) + ": no such result");
        slot = reinterpret_cast<int64_t>(buffer.value()->untyped_data());
      } else if (kind == kScratch) {
        slot = reinterpret_cast<int64_t>(scratch_base + value);
      } else if (kind == kInt64) {
        slot = value;
      } else if (kind == kInt32) {
        int32_t narrow = static_cast<int32_t>(value);
        slot = 0;
        std::memcpy(&slot, &narrow, sizeof(narrow));  // the low 4 bytes on a little-endian host
      } else {
        return ffi::Error::InvalidArgument(Where(op, axis, l) + ": unknown argument kind " + std::to_string(kind));
      }
      if ((kind == kOperand || kind == kResult) && slot % 16 != 0) {  // planned for 16-byte aligned buffers
        return ffi::Error::InvalidArgument(Where(op, axis, l) + ": a buffer XLA gave is not 16-byte aligned");
      }
      params[a - first] = &slot;
    }
    auto fn = reinterpret_cast<CUfunction>(functions[row * launches + l]);
    const auto grid = static_cast<unsigned int>(grids[row * launches + l]);
    const auto block = static_cast<unsigned int>(blocks[l]);
    const auto smem = static_cast<unsigned int>(shared[l]);
    CUresult status;
    if (cooperative[l] && launch_cooperative_kernel != nullptr) {
      status = launch_cooperative_kernel(fn, grid, 1, 1, block, 1, 1, smem, stream, params);
    } else {
      status = launch_kernel(fn, grid, 1, 1, block, 1, 1, smem, stream, params, nullptr);
    }
    if (status != CUDA_SUCCESS) return ffi::Error::Internal(Where(op, axis, l) + " failed: " + Describe(status));
  }
  return ffi::Error::Success();
}

auto Bind() {
  return ffi::Ffi::Bind()
      .Ctx<ffi::PlatformStream<CUstream>>()
      .Ctx<ffi::DeviceOrdinal>()
      .RemainingArgs()
      .RemainingRets()
      .Attr<std::string_view>("op")
      .Attr<int64_t>("axis")
      .Attr<bool>("safe")
      .Attr<int64_t>("zero_bytes")
      .Attr<ffi::Span<const int64_t>>("devices")
      .Attr<ffi::Span<const int64_t>>("functions")
      .Attr<ffi::Span<const int64_t>>("grids")
      .Attr<ffi::Span<const int64_t>>("blocks")
      .Attr<ffi::Span<const int64_t>>("shared")
      .Attr<ffi::Span<const int64_t>>("cooperative")
      .Attr<ffi::Span<const int64_t>>("arg_starts")
      .Attr<ffi::Span<const int64_t>>("arg_kinds")
      .Attr<ffi::Span<const int64_t>>("arg_values");
}

}  // namespace

// The library is built with hidden visibility (the FFI headers' inline code stays its own); these are exported.
#pragma GCC visibility push(default)

// Every launch and the memset can be captured into a graph: XLA may put the call in a command buffer.
XLA_FFI_DEFINE_HANDLER_SYMBOL(PortableSoftmaxLaunch, Launch, Bind(), {ffi::Traits::kCmdBufferCompatible});
// The same handler outside command buffers, for cooperative launches (PORTABLE_SOFTMAX_COOPERATIVE_LAUNCH=1).
XLA_FFI_DEFINE_HANDLER_SYMBOL(PortableSoftmaxLaunchUncaptured, Launch, Bind());

// The driver's entry points, by address (cooperative_launch and error_name may be null). Returns the
// FFI API version the handler was built against, major * 1000 + minor.
extern "C" int PortableSoftmaxFfiInit(void* launch, void* cooperative_launch, void* memset, void* name_error) {
  launch_kernel = reinterpret_cast<LaunchFn>(launch);
  launch_cooperative_kernel = reinterpret_cast<CooperativeLaunchFn>(cooperative_launch);
  memset_async = reinterpret_cast<MemsetFn>(memset);
  error_name = reinterpret_cast<ErrorNameFn>(name_error);
  return XLA_FFI_API_MAJOR * 1000 + XLA_FFI_API_MINOR;
}

#pragma GCC visibility pop
