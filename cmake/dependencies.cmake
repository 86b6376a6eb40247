# Third-party libraries, all from Debian packages (see the Makefile's deps target and docs/dependencies.md).
find_package(absl REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(OpenMP REQUIRED COMPONENTS CXX)
find_package(GTest REQUIRED)
find_package(Threads REQUIRED)
if(LOOM_BENCH)
  find_package(benchmark REQUIRED)
endif()

# OpenBLAS, its OpenMP build (Debian libopenblas-openmp-dev) by preference: Loom's own CPU kernels
# run on OpenMP, and with the pthreads build two thread pools spin against each other between
# calls (libgomp's active wait, OpenBLAS's sched_yield loop). On 2 cores that made a 32-token
# prefill ~7x slower (bench/results/serve-cpu.md); one shared pool removes it. The variant's
# directory is not a default search path, so CMake puts it in the binaries' RUNPATH and they load
# this variant whatever the system's libopenblas.so.0 alternative points at.
find_library(LOOM_OPENBLAS_OPENMP_LIB NAMES openblas
  PATHS /usr/lib/x86_64-linux-gnu/openblas-openmp NO_DEFAULT_PATH)
find_path(LOOM_CBLAS_OPENMP_INCLUDE cblas.h
  PATHS /usr/include/x86_64-linux-gnu/openblas-openmp NO_DEFAULT_PATH)
if(LOOM_OPENBLAS_OPENMP_LIB AND LOOM_CBLAS_OPENMP_INCLUDE)
  set(LOOM_BLAS_LIB ${LOOM_OPENBLAS_OPENMP_LIB})
  set(LOOM_BLAS_INCLUDE ${LOOM_CBLAS_OPENMP_INCLUDE})
  set(LOOM_BLAS_VARIANT "OpenMP build")
else()
  message(WARNING "OpenBLAS's OpenMP build (libopenblas-openmp-dev) not found; using the default "
    "OpenBLAS. A pthreads OpenBLAS contends with OpenMP for cores: run with "
    "OMP_WAIT_POLICY=PASSIVE (see docs/operations.md).")
  find_library(LOOM_OPENBLAS_LIB NAMES openblas REQUIRED)
  find_path(LOOM_CBLAS_INCLUDE cblas.h
    PATHS /usr/include/x86_64-linux-gnu/openblas-pthread /usr/include/openblas /usr/include
    REQUIRED)
  set(LOOM_BLAS_LIB ${LOOM_OPENBLAS_LIB})
  set(LOOM_BLAS_INCLUDE ${LOOM_CBLAS_INCLUDE})
  set(LOOM_BLAS_VARIANT "default build")
endif()
message(STATUS "OpenBLAS (${LOOM_BLAS_VARIANT}): ${LOOM_BLAS_LIB}")
add_library(loom_blas INTERFACE)
target_link_libraries(loom_blas INTERFACE ${LOOM_BLAS_LIB})
target_include_directories(loom_blas SYSTEM INTERFACE ${LOOM_BLAS_INCLUDE})
