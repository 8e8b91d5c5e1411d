#!/usr/bin/env bash
# Install Open MPI (mpirun, and the headers and libraries the `mpi` crate links) and libclang
# (its bindings are generated at build time): what `cargo build --release --features mpi`
# and runs of several processes (`[runtime] launcher = "mpi"`) need. Optional: a run in one
# process needs neither.
set -euo pipefail
have_clang() { ls /usr/lib/llvm-*/lib/libclang*.so* >/dev/null 2>&1 || ldconfig -p | grep -q libclang; }
if command -v mpirun >/dev/null && command -v mpicc >/dev/null && have_clang; then
    echo "MPI is installed: $(mpirun --version 2>&1 | head -1)"
    exit 0
fi
sudo_=""
[ "$(id -u)" -ne 0 ] && sudo_="sudo"
if command -v apt-get >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    $sudo_ apt-get install -y -q --no-install-recommends libopenmpi-dev openmpi-bin libclang-dev \
        || { $sudo_ apt-get update -q && $sudo_ apt-get install -y -q --no-install-recommends \
             libopenmpi-dev openmpi-bin libclang-dev; }
elif command -v dnf >/dev/null; then
    $sudo_ dnf install -y openmpi-devel clang-devel
    echo "dnf installs Open MPI under /usr/lib64/openmpi: run 'module load mpi/openmpi-x86_64' first" >&2
elif command -v brew >/dev/null; then
    brew install open-mpi llvm
else
    echo "install Open MPI (or MPICH) with its headers, and libclang, with your package manager" >&2
    exit 1
fi
mpirun --version 2>&1 | head -1
