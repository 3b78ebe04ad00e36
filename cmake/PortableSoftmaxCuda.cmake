# CUDA: one fatbin per dtype from src_cuda/softmax_<dtype>.cu.

# Default architectures: the machine's GPU when one is present, else sm_80 and
# sm_90 machine code plus sm_90 PTX that newer GPUs compile at load time.
set(PS_CUDA_DEFAULT_ARCHITECTURES "80-real;90-real;90-virtual")

# A macro, not a function: enable_language must run in the directory's scope.
macro(ps_find_cuda out)
  set(${out} FALSE)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR CMAKE_CUDA_ARCHITECTURES STREQUAL "")
      execute_process(COMMAND nvidia-smi -L RESULT_VARIABLE ps_smi_rc OUTPUT_QUIET ERROR_QUIET)
      if(ps_smi_rc EQUAL 0)
        set(CMAKE_CUDA_ARCHITECTURES native CACHE STRING "CUDA architectures" FORCE)
      else()
        set(CMAKE_CUDA_ARCHITECTURES "${PS_CUDA_DEFAULT_ARCHITECTURES}" CACHE STRING "CUDA architectures" FORCE)
      endif()
    endif()
    enable_language(CUDA)
    set(${out} TRUE)
  endif()
endmacro()

function(ps_build_cuda_fatbins)
  foreach(dt IN LISTS PS_KERNEL_DTYPES)
    add_library(ps_cuda_${dt} OBJECT "${PROJECT_SOURCE_DIR}/src_cuda/softmax_${dt}.cu")
    set_target_properties(ps_cuda_${dt} PROPERTIES CUDA_FATBIN_COMPILATION ON CUDA_STANDARD 17
                          CUDA_STANDARD_REQUIRED ON)
    install(FILES $<TARGET_OBJECTS:ps_cuda_${dt}> DESTINATION "${PS_INSTALL_DIR}" RENAME "softmax_${dt}.fatbin")
  endforeach()
  set(PS_CUDA_ARCHS_BUILT "${CMAKE_CUDA_ARCHITECTURES}" PARENT_SCOPE)
  message(STATUS "portable_softmax: CUDA fatbins for ${CMAKE_CUDA_ARCHITECTURES}")
endfunction()
