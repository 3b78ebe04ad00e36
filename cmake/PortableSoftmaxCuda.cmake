# CUDA: one fatbin per dtype from src_cuda/softmax_<dtype>.cu.

# Default architectures when none are given: the machine's GPU when one is present, else
# sm_80 and sm_90 machine code plus sm_90 PTX that newer GPUs compile at load time.
set(PS_CUDA_DEFAULT_ARCHITECTURES "80-real;90-real;90-virtual")

# Whether `nvidia-smi -L` lists a GPU on the build machine.
function(ps_cuda_gpu_present out)
  set(${out} FALSE PARENT_SCOPE)
  execute_process(COMMAND nvidia-smi -L RESULT_VARIABLE rc OUTPUT_VARIABLE gpus ERROR_QUIET)
  if(rc EQUAL 0 AND gpus MATCHES "GPU [0-9]")
    set(${out} TRUE PARENT_SCOPE)
  endif()
endfunction()

# Where nvcc is, without enabling the language (that runs CMake's compiler checks, seconds of work).
function(ps_cuda_compiler_path out)
  if(CMAKE_CUDA_COMPILER)
    set(${out} "${CMAKE_CUDA_COMPILER}" PARENT_SCOPE)
    return()
  endif()
  if(DEFINED ENV{CUDACXX} AND NOT "$ENV{CUDACXX}" STREQUAL "")
    set(${out} "$ENV{CUDACXX}" PARENT_SCOPE)
    return()
  endif()
  find_program(PS_NVCC nvcc HINTS ENV CUDA_PATH ENV CUDA_HOME /usr/local/cuda PATH_SUFFIXES bin)
  if(PS_NVCC)
    set(${out} "${PS_NVCC}" PARENT_SCOPE)
  else()
    set(${out} "" PARENT_SCOPE)
  endif()
endfunction()

# Whether the build was given target architectures for ${lang} (CUDA or HIP): the CMake variable
# or CMake's environment variable that initialises it (CUDAARCHS, HIPARCHS).
function(ps_architectures_given lang out)
  set(${out} FALSE PARENT_SCOPE)
  if((DEFINED CMAKE_${lang}_ARCHITECTURES AND NOT CMAKE_${lang}_ARCHITECTURES STREQUAL "")
     OR (DEFINED ENV{${lang}ARCHS} AND NOT "$ENV{${lang}ARCHS}" STREQUAL ""))
    set(${out} TRUE PARENT_SCOPE)
  endif()
endfunction()

# A macro, not a function: enable_language must run in the directory's scope.
macro(ps_find_cuda out)
  set(${out} FALSE)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    ps_architectures_given(CUDA ps_cuda_archs_given)
    if(NOT ps_cuda_archs_given)
      # A plain variable, not a cache entry: a later configure of this build directory decides afresh.
      ps_cuda_gpu_present(ps_cuda_gpu)
      if(ps_cuda_gpu)
        set(CMAKE_CUDA_ARCHITECTURES native)
      else()
        set(CMAKE_CUDA_ARCHITECTURES "${PS_CUDA_DEFAULT_ARCHITECTURES}")
      endif()
    endif()
    enable_language(CUDA)
    set(${out} TRUE)
  endif()
endmacro()

function(ps_build_cuda_fatbins)
  list(LENGTH PS_KERNEL_DTYPES n)
  list(JOIN PS_KERNEL_DTYPES " " dtypes)
  message(STATUS "portable_softmax: compiling ${n} CUDA fatbins (${dtypes}) for "
                 "${CMAKE_CUDA_ARCHITECTURES}; several minutes on a few cores (`pip install -v .` shows each)")
  foreach(dt IN LISTS PS_KERNEL_DTYPES)
    add_library(ps_cuda_${dt} OBJECT "${PROJECT_SOURCE_DIR}/src_cuda/softmax_${dt}.cu")
    set_target_properties(ps_cuda_${dt} PROPERTIES CUDA_FATBIN_COMPILATION ON CUDA_STANDARD 17
                          CUDA_STANDARD_REQUIRED ON)
    install(FILES $<TARGET_OBJECTS:ps_cuda_${dt}> DESTINATION "${PS_INSTALL_DIR}" RENAME "softmax_${dt}.fatbin")
  endforeach()
  set(PS_CUDA_ARCHS_BUILT "${CMAKE_CUDA_ARCHITECTURES}" PARENT_SCOPE)
endfunction()
