# The compiled repeat-call launcher: portable_softmax/_fastlaunch.c, a CPython extension module.
# It includes no CUDA or HIP header and links no GPU library (the launch entry point arrives
# as an address at run time), so it builds the same whatever PORTABLE_SOFTMAX_BACKEND is.
#   -C cmake.define.PORTABLE_SOFTMAX_FASTLAUNCH=auto|on|off
# auto builds it when a C compiler and Python's development headers are found, and otherwise
# warns: the package still works, launching repeat calls from Python (slower per call).

# A macro, not a function: enable_language must run in the directory's scope.
macro(ps_build_fastlaunch out)
  set(${out} FALSE)
  set(ps_fastlaunch_why "")
  if(NOT PORTABLE_SOFTMAX_FASTLAUNCH MATCHES "^(auto|on|off)$")
    message(FATAL_ERROR "PORTABLE_SOFTMAX_FASTLAUNCH=${PORTABLE_SOFTMAX_FASTLAUNCH}: use auto, on or off")
  endif()
  if(NOT PORTABLE_SOFTMAX_FASTLAUNCH STREQUAL "off")
    check_language(C)
    if(CMAKE_C_COMPILER)
      enable_language(C)
      # scikit-build-core names the stable-ABI component (Development.SABIModule) when the wheel
      # is abi3 (wheel.py-api = "cp310"); a plain CMake run builds for this interpreter only.
      find_package(Python 3.10 COMPONENTS Interpreter Development.Module ${SKBUILD_SABI_COMPONENT})
      if(Python_FOUND)
        set(ps_sources "${PROJECT_SOURCE_DIR}/portable_softmax/_fastlaunch.c")
        if(SKBUILD_SABI_VERSION)
          python_add_library(_fastlaunch MODULE WITH_SOABI USE_SABI ${SKBUILD_SABI_VERSION} ${ps_sources})
        else()
          python_add_library(_fastlaunch MODULE WITH_SOABI ${ps_sources})
        endif()
        set_target_properties(_fastlaunch PROPERTIES C_STANDARD 99 C_STANDARD_REQUIRED ON C_VISIBILITY_PRESET hidden)
        if(CMAKE_C_COMPILER_ID MATCHES "GNU|Clang")
          target_compile_options(_fastlaunch PRIVATE -Wall -Wextra -Wno-missing-field-initializers)
        endif()
        install(TARGETS _fastlaunch LIBRARY DESTINATION "${PS_PACKAGE_DIR}" RUNTIME DESTINATION "${PS_PACKAGE_DIR}")
        set(${out} TRUE)
      else()
        set(ps_fastlaunch_why "Python ${SKBUILD_SABI_COMPONENT} development files not found (install python3-dev)")
      endif()
    else()
      set(ps_fastlaunch_why "no C compiler found")
    endif()
    if(NOT ${out})
      if(PORTABLE_SOFTMAX_FASTLAUNCH STREQUAL "on")
        message(FATAL_ERROR "PORTABLE_SOFTMAX_FASTLAUNCH=on but the launcher cannot be built: ${ps_fastlaunch_why}")
      endif()
      message(WARNING "portable_softmax: the compiled launcher is not built (${ps_fastlaunch_why}); "
                      "repeat calls launch from Python instead")
    endif()
  endif()
endmacro()
