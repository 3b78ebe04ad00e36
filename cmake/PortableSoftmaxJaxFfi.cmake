# The XLA FFI handler that runs the kernels inside jax.jit (src_cuda/jax_ffi.cu, src_hip/jax_ffi.hip):
# a plain shared library per vendor, jax_ffi_cuda.so / jax_ffi_hip.so, installed beside the kernels.
# It is host code compiled by the C++ compiler against the XLA FFI headers of the jax that the
# build's Python imports (jax.ffi.include_dir()) and the vendor's driver header (cuda.h;
# hip/hip_runtime.h); it links no GPU library (the driver's entry points arrive at run time).
#   -C cmake.define.PORTABLE_SOFTMAX_JAX_FFI=auto|on|off
# auto builds it when jax is importable at build time (pip install --no-build-isolation) and a
# vendor header is found, and otherwise says why: jitted JAX calls on a GPU then take a host callback.

set(PS_JAX_FFI_COMMAND "pip install --no-build-isolation \".[jax]\"")

# The folder holding cuda.h: the CUDA toolkit's (found by FindCUDAToolkit), or none.
function(ps_cuda_header_dir out)
  set(${out} "" PARENT_SCOPE)
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    foreach(dir IN LISTS CUDAToolkit_INCLUDE_DIRS)
      if(EXISTS "${dir}/cuda.h")
        set(${out} "${dir}" PARENT_SCOPE)
        return()
      endif()
    endforeach()
  endif()
endfunction()

# The folder holding hip/hip_runtime.h (ROCm's, or a distribution's), or none.
function(ps_hip_header_dir out)
  find_path(ps_hip_include hip/hip_runtime.h
            HINTS "$ENV{ROCM_PATH}/include" "$ENV{HIP_PATH}/include" /opt/rocm/include /usr/include)
  if(ps_hip_include)
    set(${out} "${ps_hip_include}" PARENT_SCOPE)
  else()
    set(${out} "" PARENT_SCOPE)
  endif()
endfunction()

# A macro, not a function: enable_language must run in the directory's scope.
macro(ps_build_jax_ffi out)
  set(${out} "")
  set(ps_jax_ffi_why "")
  if(NOT PORTABLE_SOFTMAX_JAX_FFI MATCHES "^(auto|on|off)$")
    message(FATAL_ERROR "PORTABLE_SOFTMAX_JAX_FFI=${PORTABLE_SOFTMAX_JAX_FFI}: use auto, on or off")
  endif()
  if(NOT PORTABLE_SOFTMAX_JAX_FFI STREQUAL "off")
    find_package(Python 3.10 COMPONENTS Interpreter)
    set(ps_jax_include "")
    if(Python_Interpreter_FOUND)
      execute_process(COMMAND "${Python_EXECUTABLE}" -c "import jax.ffi; print(jax.ffi.include_dir())"
                      OUTPUT_VARIABLE ps_jax_include OUTPUT_STRIP_TRAILING_WHITESPACE
                      RESULT_VARIABLE ps_jax_status ERROR_QUIET)
      if(NOT ps_jax_status EQUAL 0 OR NOT EXISTS "${ps_jax_include}/xla/ffi/api/ffi.h")
        set(ps_jax_include "")
      endif()
    endif()
    check_language(CXX)
    if(NOT ps_jax_include)
      set(ps_jax_ffi_why "jax is not importable by the build's Python (build with ${PS_JAX_FFI_COMMAND})")
    elseif(NOT CMAKE_CXX_COMPILER)
      set(ps_jax_ffi_why "no C++ compiler found")
    else()
      enable_language(CXX)
      ps_cuda_header_dir(ps_cuda_include)
      ps_hip_header_dir(ps_hip_include)
      foreach(ps_vendor IN ITEMS cuda hip)
        if(ps_vendor STREQUAL "cuda")
          set(ps_vendor_include "${ps_cuda_include}")
          set(ps_vendor_source "${PROJECT_SOURCE_DIR}/src_cuda/jax_ffi.cu")
        else()
          set(ps_vendor_include "${ps_hip_include}")
          set(ps_vendor_source "${PROJECT_SOURCE_DIR}/src_hip/jax_ffi.hip")
        endif()
        if(NOT ps_vendor_include OR NOT EXISTS "${ps_vendor_source}")
          continue()
        endif()
        set_source_files_properties("${ps_vendor_source}" PROPERTIES LANGUAGE CXX)
        add_library(ps_jax_ffi_${ps_vendor} MODULE "${ps_vendor_source}")
        set_target_properties(ps_jax_ffi_${ps_vendor} PROPERTIES
            OUTPUT_NAME "jax_ffi_${ps_vendor}" PREFIX "" SUFFIX ".so" LINKER_LANGUAGE CXX
            CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON CXX_VISIBILITY_PRESET hidden)
        target_include_directories(ps_jax_ffi_${ps_vendor} SYSTEM PRIVATE "${ps_jax_include}" "${ps_vendor_include}")
        if(ps_vendor STREQUAL "hip")
          target_compile_definitions(ps_jax_ffi_${ps_vendor} PRIVATE __HIP_PLATFORM_AMD__)
        endif()
        install(TARGETS ps_jax_ffi_${ps_vendor} LIBRARY DESTINATION "${PS_INSTALL_DIR}")
        list(APPEND ${out} "${ps_vendor}")
      endforeach()
      if(NOT ${out})
        string(CONCAT ps_jax_ffi_why "neither cuda.h (the CUDA toolkit) nor hip/hip_runtime.h (ROCm, or "
                      "apt-get install hipcc) was found")
      endif()
    endif()
    if(${out})
      message(STATUS "portable_softmax: the JAX FFI handler is built for ${${out}} (XLA FFI headers of ${ps_jax_include})")
    else()
      if(PORTABLE_SOFTMAX_JAX_FFI STREQUAL "on")
        message(FATAL_ERROR "PORTABLE_SOFTMAX_JAX_FFI=on but the JAX FFI handler cannot be built: ${ps_jax_ffi_why}")
      endif()
      message(STATUS "portable_softmax: the JAX FFI handler is not built (${ps_jax_ffi_why}); inside jax.jit on "
                     "a GPU calls take a host callback")
    endif()
  endif()
endmacro()
