# Cross-building hyflash-run for ARM64 Linux with Debian's GNU cross toolchain (g++-aarch64-linux-gnu), against
# the aarch64 ExecuTorch wheel unpacked by `make runner-arm64`. An Android build would use the NDK's toolchain
# file (build/cmake/android.toolchain.cmake, ANDROID_ABI=arm64-v8a) in place of this one.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
# the baseline ISA is named (HYFLASH_ARCH), as for every build of the kernels: never -march=native
set(HYFLASH_ARCH "armv8-a" CACHE STRING "the ARM ISA the kernels are built for (armv8-a, armv8.2-a+dotprod)")
