# Cross-compiling the native runtime for linux-aarch64 on a Debian x86_64 host:
#   cmake -S native -B build/native/linux-aarch64 \
#         -DCMAKE_TOOLCHAIN_FILE=native/cmake/aarch64-linux-gnu.cmake
# Compilers: Debian's gcc-aarch64-linux-gnu / g++-aarch64-linux-gnu. Libraries (minizip,
# libsodium) come from the arm64 multiarch packages (/usr/lib/aarch64-linux-gnu), the C++
# runtime from the cross toolchain's sysroot (/usr/aarch64-linux-gnu). Run the result with
# `qemu-aarch64 -L /usr/aarch64-linux-gnu` (tests/native/qemu.py).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(EDGE_CROSS_TRIPLE aarch64-linux-gnu)

set(CMAKE_C_COMPILER ${EDGE_CROSS_TRIPLE}-gcc)
set(CMAKE_CXX_COMPILER ${EDGE_CROSS_TRIPLE}-g++)
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64 -L /usr/${EDGE_CROSS_TRIPLE})

# Headers and libraries are looked up only in the target's folders, programs (cmake,
# pkg-config) only on the host. /usr stays a root so that the arm64 multiarch libraries in
# /usr/lib/aarch64-linux-gnu and the architecture-independent headers (nlohmann-json,
# minizip's, zlib's and libsodium's, which multiarch shares) are found; the library architecture
# keeps the x86_64 ones in /usr/lib/x86_64-linux-gnu out.
set(CMAKE_FIND_ROOT_PATH /usr/${EDGE_CROSS_TRIPLE} /usr)
set(CMAKE_LIBRARY_ARCHITECTURE ${EDGE_CROSS_TRIPLE})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
# only the aarch64 libraries: never an x86_64 .so from /usr/lib
set(CMAKE_IGNORE_PATH /usr/lib/x86_64-linux-gnu /lib/x86_64-linux-gnu)

# pkg-config (FindPkgConfig) reads the arm64 .pc files only
set(ENV{PKG_CONFIG_LIBDIR} "/usr/lib/${EDGE_CROSS_TRIPLE}/pkgconfig:/usr/share/pkgconfig")
set(ENV{PKG_CONFIG_PATH} "")
set(ENV{PKG_CONFIG_SYSROOT_DIR} "")
