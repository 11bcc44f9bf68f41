# The executorch backend, linked against the executorch wheel's own libraries
# (EXECUTORCH_ROOT: this machine's venv, or build/wheels/<platform>/executorch for a cross
# build). Included by native/CMakeLists.txt after edge_runtime exists.
#
# The runner links the runtime (libexecutorch.so: program loading, data loaders, primitive
# ops) and the XNNPACK delegate, which registers itself from a static initializer and so
# has to stay on the link line (--no-as-needed). The CPU and quantized kernel libraries
# are opened on demand by the backend when a program calls kernels outside its delegates
# (src/backends/executorch_support.cc), so a bundle ships them only when its programs do.

if(NOT EXISTS "${EXECUTORCH_ROOT}/share/cmake/executorch-config.cmake")
  message(FATAL_ERROR "EXECUTORCH_ROOT=${EXECUTORCH_ROOT} is not an executorch wheel's folder "
                      "(no share/cmake/executorch-config.cmake); point it at "
                      "site-packages/executorch or build/wheels/<platform>/executorch")
endif()

# The wheel's config gives the include folders and the definitions its libraries were
# built with; its imported targets need CMake 3.28, so the libraries are linked by path.
# NO_CMAKE_FIND_ROOT_PATH: a cross toolchain's sysroot must not reroot the wheel's folder.
find_package(executorch CONFIG REQUIRED PATHS "${EXECUTORCH_ROOT}/share/cmake"
             NO_DEFAULT_PATH NO_CMAKE_FIND_ROOT_PATH)

set(_ET_LIB "${EXECUTORCH_ROOT}/lib")
foreach(_et_library libexecutorch libexecutorch_threadpool libexecutorch_backend_xnnpack)
  if(NOT EXISTS "${_ET_LIB}/${_et_library}.so")
    message(FATAL_ERROR "the executorch wheel at ${EXECUTORCH_ROOT} has no lib/${_et_library}.so")
  endif()
endforeach()

target_sources(edge_runtime PRIVATE
  "${CMAKE_CURRENT_LIST_DIR}/../src/backends/executorch.cc"
  "${CMAKE_CURRENT_LIST_DIR}/../src/backends/executorch_parallel.cc"
  "${CMAKE_CURRENT_LIST_DIR}/../src/backends/executorch_support.cc")
# SYSTEM: the wheel's headers are not held to our warning flags.
target_include_directories(edge_runtime SYSTEM PRIVATE ${EXECUTORCH_INCLUDE_DIRS})
set_source_files_properties(
  "${CMAKE_CURRENT_LIST_DIR}/../src/backends/executorch.cc"
  "${CMAKE_CURRENT_LIST_DIR}/../src/backends/executorch_parallel.cc"
  "${CMAKE_CURRENT_LIST_DIR}/../src/backends/executorch_support.cc"
  PROPERTIES COMPILE_DEFINITIONS "${EXECUTORCH_COMPILE_DEFINITIONS}")
target_link_libraries(edge_runtime PUBLIC
  "${_ET_LIB}/libexecutorch.so"
  "${_ET_LIB}/libexecutorch_threadpool.so"
  "-Wl,--push-state,--no-as-needed,${_ET_LIB}/libexecutorch_backend_xnnpack.so,--pop-state"
  ${CMAKE_DL_LIBS})
# The runner's parallel_for takes the wheel's place (src/backends/executorch_parallel.cc):
# linked from the archive though nothing of ours calls it, and exported from every
# executable that links the runtime, so the kernel libraries bind to it.
set(_ET_PARALLEL_FOR _ZN10executorch9extension12parallel_forElllNS_7runtime11FunctionRefIFvllEEE)
target_link_options(edge_runtime INTERFACE "LINKER:--undefined=${_ET_PARALLEL_FOR}"
                    "LINKER:--export-dynamic-symbol=${_ET_PARALLEL_FOR}")
# The build tree's runner finds the wheel's libraries where they are (CMake's build
# RPATH); a bundled one finds them in ../lib (the core's INSTALL_RPATH).
set(EDGE_EXECUTORCH_LIBRARY_DIR "${_ET_LIB}" CACHE INTERNAL "the executorch wheel's lib/")
