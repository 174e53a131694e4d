# EXL3 developer hook, used until the top-level CMakeLists adds src/cpu and src/cuda itself:
#   cmake -S . -B build-exl3 -DCMAKE_PROJECT_INCLUDE=$PWD/tools/exl3/dev_hooks.cmake [-DSPW_EXL3_CUDA=ON]
# adds spw_cpu (and with SPW_EXL3_CUDA spw_cuda and bench/exl3), and a test binary spw_exl3_tests
# holding only tests/unit/test_exl3*.cpp, so an EXL3 build needs none of the model/runtime layers.
option(SPW_EXL3_CUDA "Build spw_cuda and the EXL3 benchmark" OFF)
# This file runs right after project(), before the top-level settings: repeat the ones our targets need.
set(CMAKE_CXX_STANDARD 20)
set(CMAKE_CXX_STANDARD_REQUIRED ON)
add_subdirectory(${PROJECT_SOURCE_DIR}/src/cpu ${PROJECT_BINARY_DIR}/src/cpu)
set(SPW_EXL3_LIBS spw_cpu)
if(SPW_EXL3_CUDA)
  enable_language(CUDA)  # at top level: every directory that compiles .cu needs it
  # CMake 3.25 predates nvcc 13 and knows no C++20 flag for it.
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA_STANDARD 20)
  add_subdirectory(${PROJECT_SOURCE_DIR}/src/cuda ${PROJECT_BINARY_DIR}/src/cuda)
  add_subdirectory(${PROJECT_SOURCE_DIR}/bench/exl3 ${PROJECT_BINARY_DIR}/bench/exl3)
  list(APPEND SPW_EXL3_LIBS spw_cuda)
endif()
# Deferred: GTest is found later by the top-level CMakeLists.
function(spw_exl3_dev_hook)
  file(GLOB srcs ${PROJECT_SOURCE_DIR}/tests/unit/test_exl3*.cpp)
  add_executable(spw_exl3_tests ${srcs})
  target_link_libraries(spw_exl3_tests PRIVATE ${SPW_EXL3_LIBS} spw_formats GTest::gtest_main)
  target_compile_definitions(spw_exl3_tests PRIVATE SPW_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
endfunction()
cmake_language(DEFER CALL spw_exl3_dev_hook)
