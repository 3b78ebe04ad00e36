# HIP: code objects from src_hip/ (filled in by the AMD build).

function(ps_find_hip out)
  set(${out} FALSE PARENT_SCOPE)
endfunction()

function(ps_build_hip_code_objects)
  message(FATAL_ERROR "HIP code objects are not built yet")
endfunction()
