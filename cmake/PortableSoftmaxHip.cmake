# HIP: one code-object bundle per dtype from src_hip/softmax_<dtype>.hip.
#
# Each bundle (clang offload bundle, loaded by hipModuleLoadData) holds one
# fully linked code object per architecture of CMAKE_HIP_ARCHITECTURES; a
# device whose arch is missing compiles src_hip/ through hipRTC at run time.
#
# CMake's HIP language finds a ROCm installed under /opt/rocm by itself. Debian
# and Ubuntu's packaged ROCm (hipcc 5.2 in Debian 12) splits it across /usr and
# /usr/lib/<multiarch>, where CMake looks neither for the hip-lang package nor
# clang for the device libraries: _ps_hip_locate_toolchain bridges that layout.

# Default architectures when the machine shows no AMD GPU: CDNA2 (MI200), CDNA3
# (MI300), RDNA3 and RDNA4. A toolchain too old for one gets its nearest older
# relative of the same wave size, so that every family is still compiled.
set(PS_HIP_DEFAULT_ARCHITECTURES "gfx90a;gfx942;gfx1100;gfx1200")
set(PS_HIP_OLDER_RELATIVE_gfx942 "gfx940")   # ROCm 5.x knows the first MI300 ISA only
set(PS_HIP_OLDER_RELATIVE_gfx1100 "gfx1030")  # RDNA2, wave32 like RDNA3/4
set(PS_HIP_OLDER_RELATIVE_gfx1200 "gfx1030")

# Sets CMAKE_HIP_COMPILER (clang++ of the ROCm install) and, for the packaged
# layout, the paths CMake and clang do not find; ${out} says whether a HIP
# compiler was found at all.
function(_ps_hip_locate_toolchain out)
  set(${out} FALSE PARENT_SCOPE)
  find_program(PS_HIPCONFIG hipconfig HINTS ENV ROCM_PATH ENV HIP_PATH /opt/rocm PATH_SUFFIXES bin)
  if(CMAKE_HIP_COMPILER_ROCM_ROOT)
    set(root "${CMAKE_HIP_COMPILER_ROCM_ROOT}")
  elseif(PS_HIPCONFIG)
    execute_process(COMMAND "${PS_HIPCONFIG}" --rocmpath OUTPUT_VARIABLE root OUTPUT_STRIP_TRAILING_WHITESPACE
                    RESULT_VARIABLE rc ERROR_QUIET)
    if(NOT rc EQUAL 0)
      set(root "")
    endif()
  endif()
  if(NOT CMAKE_HIP_COMPILER)
    if(NOT root OR NOT PS_HIPCONFIG)
      return()
    endif()
    execute_process(COMMAND "${PS_HIPCONFIG}" --hipclangpath OUTPUT_VARIABLE clang_dir
                    OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    # /opt/rocm/llvm/bin has clang++; Debian names it after its LLVM release.
    find_program(PS_HIP_CLANGXX NAMES clang++ amdclang++ clang++-21 clang++-20 clang++-19 clang++-18 clang++-17
                 clang++-16 clang++-15 clang++-14 HINTS "${clang_dir}" "${root}/llvm/bin" NO_DEFAULT_PATH)
    if(NOT PS_HIP_CLANGXX)
      return()
    endif()
    set(CMAKE_HIP_COMPILER "${PS_HIP_CLANGXX}" CACHE FILEPATH "HIP compiler (clang++ of ROCm)")
  endif()
  if(NOT root)
    # A compiler given by hand and no hipconfig: CMake derives the ROCm root from the compiler.
    set(PS_HIP_LAYOUT_FLAGS "" CACHE INTERNAL "clang flags for a packaged ROCm layout")
    set(${out} TRUE PARENT_SCOPE)
    return()
  endif()
  set(CMAKE_HIP_COMPILER_ROCM_ROOT "${root}" CACHE PATH "ROCm root")

  set(flags "")
  set(have_lang_package FALSE)
  foreach(lib IN ITEMS lib lib64)
    if(EXISTS "${root}/${lib}/cmake/hip-lang/hip-lang-config.cmake")
      set(have_lang_package TRUE)
    endif()
  endforeach()
  if(NOT have_lang_package AND NOT CMAKE_HIP_COMPILER_ROCM_LIB)
    file(GLOB lang_configs "${root}/lib/*/cmake/hip-lang/hip-lang-config.cmake")
    if(lang_configs)
      list(GET lang_configs 0 lang_config)
      string(REGEX REPLACE "/cmake/hip-lang/hip-lang-config.cmake$" "" lib_dir "${lang_config}")
      set(CMAKE_HIP_COMPILER_ROCM_LIB "${lib_dir}" CACHE PATH "ROCm library directory holding cmake/hip-lang")
      # hip-lang's own dependencies (amd_comgr, hsa-runtime64) live beside it; the
      # compiler checks run in separate CMake projects that see only the environment.
      set(ENV{CMAKE_PREFIX_PATH} "${lib_dir}/cmake;$ENV{CMAKE_PREFIX_PATH}")
    endif()
  endif()
  if(NOT EXISTS "${root}/amdgcn/bitcode")
    file(GLOB bitcode_dirs "${root}/lib/*/amdgcn/bitcode" "${root}/lib/amdgcn/bitcode")
    if(bitcode_dirs)
      list(GET bitcode_dirs 0 bitcode_dir)
      set(flags "--rocm-path=${root} --hip-device-lib-path=${bitcode_dir}")
    endif()
  endif()
  set(PS_HIP_LAYOUT_FLAGS "${flags}" CACHE INTERNAL "clang flags for a packaged ROCm layout")
  set(${out} TRUE PARENT_SCOPE)
endfunction()

# Whether the toolchain compiles a kernel for ${arch}: clang and the device
# libraries of older ROCm releases do not know the newest targets.
function(_ps_hip_arch_supported arch out)
  set(probe "${CMAKE_BINARY_DIR}/ps_hip_probe")
  file(MAKE_DIRECTORY "${probe}")
  file(WRITE "${probe}/probe.hip"
    "#include <hip/hip_runtime.h>\nextern \"C\" __global__ void ps_probe(float* p) { p[threadIdx.x] = 1.0f; }\n")
  separate_arguments(layout_flags NATIVE_COMMAND "${PS_HIP_LAYOUT_FLAGS}")
  execute_process(
    COMMAND "${CMAKE_HIP_COMPILER}" -x hip --cuda-device-only "--offload-arch=${arch}" ${layout_flags}
            -c "${probe}/probe.hip" -o "${probe}/probe_${arch}.o"
    RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
  if(rc EQUAL 0)
    set(${out} TRUE PARENT_SCOPE)
  else()
    set(${out} FALSE PARENT_SCOPE)
  endif()
endfunction()

# The AMD GPUs of the build machine (gfx names; the CPU agent gfx000 left out), from
# rocm_agent_enumerator or rocminfo; empty without either or without a GPU.
function(ps_hip_machine_agents out)
  set(agents "")
  find_program(PS_ROCM_AGENT_ENUMERATOR rocm_agent_enumerator
               HINTS "${CMAKE_HIP_COMPILER_ROCM_ROOT}/bin" ENV ROCM_PATH /opt/rocm PATH_SUFFIXES bin)
  find_program(PS_ROCMINFO rocminfo HINTS "${CMAKE_HIP_COMPILER_ROCM_ROOT}/bin" ENV ROCM_PATH /opt/rocm
               PATH_SUFFIXES bin)
  foreach(tool IN ITEMS PS_ROCM_AGENT_ENUMERATOR PS_ROCMINFO)
    if(${tool} AND NOT agents)
      execute_process(COMMAND "${${tool}}" OUTPUT_VARIABLE listing RESULT_VARIABLE rc ERROR_QUIET TIMEOUT 60)
      if(rc EQUAL 0)
        string(REGEX MATCHALL "gfx[0-9a-f]+" agents "${listing}")
        list(REMOVE_ITEM agents gfx000)
        list(REMOVE_DUPLICATES agents)
      endif()
    endif()
  endforeach()
  set(${out} "${agents}" PARENT_SCOPE)
endfunction()

# CMAKE_HIP_ARCHITECTURES when the user gave none: the machine's AMD GPUs, else
# the defaults above, each replaced by its older relative where unsupported.
function(_ps_hip_default_architectures out)
  ps_hip_machine_agents(archs)
  if(NOT archs)
    foreach(arch IN LISTS PS_HIP_DEFAULT_ARCHITECTURES)
      _ps_hip_arch_supported(${arch} ok)
      if(NOT ok AND DEFINED PS_HIP_OLDER_RELATIVE_${arch})
        message(STATUS "portable_softmax: this HIP toolchain cannot build ${arch}; "
                       "building ${PS_HIP_OLDER_RELATIVE_${arch}} instead (${arch} devices compile through hipRTC)")
        set(arch "${PS_HIP_OLDER_RELATIVE_${arch}}")
        _ps_hip_arch_supported(${arch} ok)
      endif()
      if(ok)
        list(APPEND archs ${arch})
      endif()
    endforeach()
    list(REMOVE_DUPLICATES archs)
  endif()
  set(${out} "${archs}" PARENT_SCOPE)
endfunction()

# Whether a HIP toolchain is installed (hipconfig, or a HIP compiler given by hand), without
# enabling the language.
function(ps_hip_toolchain_present out)
  find_program(PS_HIPCONFIG hipconfig HINTS ENV ROCM_PATH ENV HIP_PATH /opt/rocm PATH_SUFFIXES bin)
  if(CMAKE_HIP_COMPILER OR PS_HIPCONFIG)
    set(${out} TRUE PARENT_SCOPE)
  else()
    set(${out} FALSE PARENT_SCOPE)
  endif()
endfunction()

# A macro, not a function: enable_language must run in the directory's scope.
macro(ps_find_hip out)
  set(${out} FALSE)
  # Kernels are built for AMD GPUs; with nvcc installed too, hipconfig (and so
  # CMake) would otherwise pick HIP's NVIDIA platform.
  if(NOT DEFINED CMAKE_HIP_PLATFORM)
    set(CMAKE_HIP_PLATFORM amd)
  endif()
  set(ENV{HIP_PLATFORM} amd)
  _ps_hip_locate_toolchain(ps_hip_found)
  if(ps_hip_found)
    ps_architectures_given(HIP ps_hip_archs_given)
    if(NOT ps_hip_archs_given)
      _ps_hip_default_architectures(ps_hip_archs)
      if(ps_hip_archs)
        # A plain variable, not a cache entry: a later configure of this build directory decides afresh.
        set(CMAKE_HIP_ARCHITECTURES "${ps_hip_archs}")
      else()
        message(WARNING "portable_softmax: ${CMAKE_HIP_COMPILER} built none of ${PS_HIP_DEFAULT_ARCHITECTURES}")
        set(ps_hip_found FALSE)
      endif()
    endif()
  endif()
  if(ps_hip_found)
    set(CMAKE_HIP_FLAGS_INIT "${CMAKE_HIP_FLAGS_INIT} ${PS_HIP_LAYOUT_FLAGS}")
    enable_language(HIP)
    set(${out} TRUE)
  endif()
endmacro()

function(ps_build_hip_code_objects)
  list(LENGTH PS_KERNEL_DTYPES n)
  list(JOIN PS_KERNEL_DTYPES " " dtypes)
  message(STATUS "portable_softmax: compiling ${n} HIP code-object bundles (${dtypes}) for "
                 "${CMAKE_HIP_ARCHITECTURES} with ${CMAKE_HIP_COMPILER}; several minutes on a few cores "
                 "(`pip install -v .` shows each)")
  foreach(dt IN LISTS PS_KERNEL_DTYPES)
    add_library(ps_hip_${dt} OBJECT "${PROJECT_SOURCE_DIR}/src_hip/softmax_${dt}.hip")
    # Device code only: the object is then the bundle of linked code objects.
    # -O3 whatever the build type: nobody debugs these kernels at -O0 through pip.
    target_compile_options(ps_hip_${dt} PRIVATE --cuda-device-only -O3)
    set_target_properties(ps_hip_${dt} PROPERTIES HIP_STANDARD 17 HIP_STANDARD_REQUIRED ON
                          HIP_SEPARABLE_COMPILATION OFF)
    install(FILES $<TARGET_OBJECTS:ps_hip_${dt}> DESTINATION "${PS_INSTALL_DIR}" RENAME "softmax_${dt}.hsaco")
  endforeach()
  set(PS_HIP_ARCHS_BUILT "${CMAKE_HIP_ARCHITECTURES}" PARENT_SCOPE)
endfunction()
