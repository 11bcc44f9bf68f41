# Backend "tvm": the Relax VM of the apache-tvm wheel (libtvm_runtime.so) over tvm-ffi
# (libtvm_ffi.so, its headers and dlpack's). TVM_ROOT / TVM_FFI_ROOT are the wheels' folders:
# this machine's venv, or build/wheels/linux-aarch64/{tvm,tvm_ffi} for the cross build.
# Only tvm-ffi's headers are used: the wheel's tvm/runtime headers include files it lacks.

find_library(EDGE_TVM_RUNTIME_LIB NAMES tvm_runtime PATHS "${TVM_ROOT}/lib" "${TVM_ROOT}"
             NO_DEFAULT_PATH NO_CMAKE_FIND_ROOT_PATH)
find_library(EDGE_TVM_FFI_LIB NAMES tvm_ffi PATHS "${TVM_FFI_ROOT}/lib" NO_DEFAULT_PATH
             NO_CMAKE_FIND_ROOT_PATH)
find_path(EDGE_TVM_FFI_INCLUDE tvm/ffi/extra/module.h PATHS "${TVM_FFI_ROOT}/include"
          NO_DEFAULT_PATH NO_CMAKE_FIND_ROOT_PATH)
find_path(EDGE_DLPACK_INCLUDE dlpack/dlpack.h
          PATHS "${TVM_FFI_ROOT}/3rdparty/dlpack/include" "${TVM_FFI_ROOT}/include"
          NO_DEFAULT_PATH NO_CMAKE_FIND_ROOT_PATH)
foreach(_found EDGE_TVM_RUNTIME_LIB EDGE_TVM_FFI_LIB EDGE_TVM_FFI_INCLUDE EDGE_DLPACK_INCLUDE)
  if(NOT ${_found})
    message(FATAL_ERROR "EDGE_WITH_TVM: ${_found} not found under TVM_ROOT=${TVM_ROOT} / "
                        "TVM_FFI_ROOT=${TVM_FFI_ROOT} (the apache-tvm and apache-tvm-ffi "
                        "wheels' folders; `make native-deps` unpacks the aarch64 ones)")
  endif()
endforeach()

add_library(edge_tvm_runtime SHARED IMPORTED)
set_target_properties(edge_tvm_runtime PROPERTIES IMPORTED_LOCATION "${EDGE_TVM_RUNTIME_LIB}")
add_library(edge_tvm_ffi SHARED IMPORTED)
set_target_properties(edge_tvm_ffi PROPERTIES IMPORTED_LOCATION "${EDGE_TVM_FFI_LIB}"
                      INTERFACE_INCLUDE_DIRECTORIES "${EDGE_TVM_FFI_INCLUDE};${EDGE_DLPACK_INCLUDE}")

target_sources(edge_runtime PRIVATE src/backends/tvm.cc src/backends/tvm_weights.cc)
# The runner calls nothing in libtvm_runtime by name: it registers the Relax VM's loaders and
# builtins when loaded, so it must stay NEEDED even where the linker drops unused libraries.
target_link_libraries(edge_runtime PUBLIC edge_tvm_ffi
                      "$<LINK_LIBRARY:EDGE_TVM_NO_AS_NEEDED,edge_tvm_runtime>")
set(CMAKE_LINK_LIBRARY_USING_EDGE_TVM_NO_AS_NEEDED
    "LINKER:--push-state,--no-as-needed" "<LINK_ITEM>" "LINKER:--pop-state")
set(CMAKE_LINK_LIBRARY_USING_EDGE_TVM_NO_AS_NEEDED_SUPPORTED TRUE)

# The bundle's lib/ (exporter package --native): the two libraries the runner loads.
install(FILES "${EDGE_TVM_RUNTIME_LIB}" "${EDGE_TVM_FFI_LIB}" DESTINATION lib)
set(EDGE_TVM_SHARED_LIBS "${EDGE_TVM_RUNTIME_LIB};${EDGE_TVM_FFI_LIB}" CACHE INTERNAL
    "the shared libraries the tvm backend needs at run time")
