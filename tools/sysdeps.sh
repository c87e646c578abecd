#!/bin/sh
# The system packages the generated kernels need: a C compiler, libc headers with glibc's
# vector math library (libmvec), and OpenMP (libgomp). Installed with apt-get when missing and
# run as root; otherwise the missing packages are named and the script fails.
set -eu
missing=""
command -v "${CC:-cc}" >/dev/null 2>&1 || missing="gcc"
if [ -z "$missing" ]; then
    mvec=$("${CC:-cc}" -print-file-name=libmvec.so)
    gomp=$("${CC:-cc}" -print-file-name=libgomp.so)
    [ "$mvec" != "libmvec.so" ] || missing="$missing libc6-dev"
    [ "$gomp" != "libgomp.so" ] || missing="$missing libgomp1 gcc"
    printf '#include <stdint.h>\n#include <math.h>\n' | "${CC:-cc}" -E -x c - >/dev/null 2>&1 \
        || missing="$missing libc6-dev"
fi
[ -n "$missing" ] || exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing the kernel toolchain: gcc libc6-dev libgomp1" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc libc6-dev libgomp1 >/dev/null
else
    echo "graph-autofusion kernels need: $missing (e.g. apt-get install gcc libc6-dev libgomp1)" >&2
    exit 1
fi
