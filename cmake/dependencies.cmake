# Third-party libraries, all from Debian packages (see the Makefile's deps target and docs/dependencies.md).
find_package(absl REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(OpenMP REQUIRED COMPONENTS CXX)
find_package(GTest REQUIRED)
find_package(Threads REQUIRED)
if(LOOM_BENCH)
  find_package(benchmark REQUIRED)
endif()

# OpenBLAS: Debian ships a CMake config but its include dir points at the generic path; use the
# pthread variant's headers explicitly so cblas.h is found without alternatives.
find_library(LOOM_OPENBLAS_LIB NAMES openblas REQUIRED)
find_path(LOOM_CBLAS_INCLUDE cblas.h
  PATHS /usr/include/x86_64-linux-gnu/openblas-pthread /usr/include/openblas /usr/include
  REQUIRED)
add_library(loom_blas INTERFACE)
target_link_libraries(loom_blas INTERFACE ${LOOM_OPENBLAS_LIB})
target_include_directories(loom_blas SYSTEM INTERFACE ${LOOM_CBLAS_INCLUDE})
