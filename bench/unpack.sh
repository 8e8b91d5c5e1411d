#!/usr/bin/env bash
# Sourced by bench/gpu.sh and bench/gpu-tests.sh on the GPU machine.
#
# unpack TARBALL DIR: unpack a carried tarball into DIR unless this very tarball (by its
# checksum, kept in DIR/.unpacked-<name>) was unpacked there before, so that a warm machine
# re-carried newer binaries uses them, and an unchanged one is not unpacked twice.
unpack() {
  local tarball=$1 dir=$2 stamp sum
  [[ -f $tarball ]] || return 0
  stamp=$dir/.unpacked-$(basename "$tarball")
  sum=$(md5sum <"$tarball" | cut -d' ' -f1)
  if [[ $(cat "$stamp" 2>/dev/null) != "$sum" ]]; then
    tar -C "$dir" -xJf "$tarball" && echo "$sum" >"$stamp"
  fi
}
