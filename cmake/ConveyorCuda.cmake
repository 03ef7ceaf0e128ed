# Resolves CONVEYOR_CUDA=AUTO|ON|OFF into CONVEYOR_HAVE_CUDA.
# AUTO builds the CUDA parts when a CUDA compiler is found (our machines keep the
# toolkit at /usr/local/cuda, which is not on PATH by default); ON insists; OFF
# never looks. A machine without a GPU still compiles every kernel: GPU tests
# decide at run time whether to skip.
string(TOUPPER "${CONVEYOR_CUDA}" CONVEYOR_CUDA)
if(NOT CONVEYOR_CUDA MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "CONVEYOR_CUDA must be one of AUTO, ON, OFF (got '${CONVEYOR_CUDA}')")
endif()

set(CONVEYOR_HAVE_CUDA OFF)
if(NOT CONVEYOR_CUDA STREQUAL "OFF")
  # Point check_language at the usual toolkit path through CUDACXX rather than
  # CMAKE_CUDA_COMPILER: check_language skips its trial compile when the
  # compiler is already set, and AUTO must fall back when nvcc cannot build.
  if(NOT DEFINED CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX}
     AND EXISTS "/usr/local/cuda/bin/nvcc")
    set(ENV{CUDACXX} "/usr/local/cuda/bin/nvcc")
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      # Hopper (H100/H200) is what we deploy on; override for other GPUs.
      set(CMAKE_CUDA_ARCHITECTURES 90)
    endif()
    enable_language(CUDA)
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    # CMake 3.25.1 (Debian 12) does not know nvcc's C++20 flag; 3.25.2 does.
    if(CMAKE_VERSION VERSION_LESS 3.25.2
       AND CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.0)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    find_package(CUDAToolkit REQUIRED)
    set(CONVEYOR_HAVE_CUDA ON)
  elseif(CONVEYOR_CUDA STREQUAL "ON")
    message(FATAL_ERROR "CONVEYOR_CUDA=ON but no CUDA compiler was found; "
                        "install the CUDA toolkit or set CMAKE_CUDA_COMPILER")
  else()
    message(STATUS "No working CUDA compiler found: building without the CUDA parts")
  endif()
endif()
