"""Compile CubeCL-generated CUDA sources as CubeCL's CUDA runtime does (NVRTC, then the
driver's assembler; here `ptxas`) and print a table of each kernel's registers, spills, stack
and PTX size per architecture; with the source's shared memory (its `// reel:` header) the
cubes per multiprocessor, and with `nvdisasm` the instruction mix of its hottest loop
(sass_stats.py). Usage: cuda_compile.py CUDA_TOOLS SOURCE.cu... (see bench/cuda-compile.sh;
ARCHS in the environment, default "sm_90a sm_80")."""

import ctypes
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sass_stats  # noqa: E402


def nvrtc_ptx(lib, source: bytes, options: list[str]) -> tuple[str | None, str]:
    """(PTX or None, NVRTC's log) for `source`."""
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), source, None, 0, None, None) != 0:
        return None, "nvrtcCreateProgram failed"
    opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
    status = lib.nvrtcCompileProgram(prog, len(options), opts)
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    ptx = None
    if status == 0:
        lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
        buf = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetPTX(prog, buf)
        ptx = buf.value.decode()
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return ptx, log.value.decode(errors="replace")


def ptxas_info(ptxas: str, ptx_path: str, arch: str) -> dict:
    """Registers, spill bytes and stack from `ptxas -v`."""
    run = subprocess.run(
        [ptxas, "-v", f"-arch={arch}", ptx_path, "-o", os.devnull],
        capture_output=True,
        text=True,
    )
    if run.returncode != 0:
        return {"error": run.stderr.strip()[:2000]}
    text = run.stderr
    num = lambda pat: int(m.group(1)) if (m := re.search(pat, text)) else 0
    return {
        "registers": num(r"Used (\d+) registers"),
        "spill_stores": num(r"(\d+) bytes spill stores"),
        "spill_loads": num(r"(\d+) bytes spill loads"),
        "stack": num(r"(\d+) bytes stack frame"),
    }


def main() -> int:
    tools, sources = sys.argv[1], sys.argv[2:]
    nv = os.path.join(tools, "nvidia")
    lib = ctypes.CDLL(os.path.join(nv, "cuda_nvrtc", "lib", "libnvrtc.so.12"))
    ptxas = os.path.join(nv, "cuda_nvcc", "bin", "ptxas")
    # CCCL's headers (libcu++'s `cuda/barrier`) serve the kernels that copy asynchronously.
    includes = [
        os.path.join(nv, d, "include") for d in ("cuda_runtime", "cuda_nvcc", "cuda_cccl")
    ]
    nvdisasm = os.path.join(nv, "cu13", "bin", "nvdisasm")
    archs = os.environ.get("ARCHS", "sm_90a sm_80").split()
    failed = 0
    loop_cols = ["instructions", *sass_stats.CLASSES, "inner loops"]
    print(
        "| kernel | arch | registers | spill st/ld bytes | stack | PTX lines | shared KiB "
        "| cubes/SM | " + " | ".join(f"loop {c}" for c in loop_cols) + " |"
    )
    print("|---" * (8 + len(loop_cols)) + "|")
    for path in sources:
        name = os.path.basename(path).removesuffix(".cu")
        source = open(path, "rb").read()
        header = re.search(rb"// reel: shared_bytes=(\d+) units=(\d+)", source)
        shared, units = (int(header.group(1)), int(header.group(2))) if header else (0, 0)
        for arch in archs:
            options = [f"--gpu-architecture={arch}", "-lineinfo"]
            options += [f"--include-path={i}" for i in includes]
            ptx, log = nvrtc_ptx(lib, source, options)
            if ptx is None:
                failed += 1
                print(f"| {name} | {arch} | NVRTC failed | | | |")
                print(log[:4000], file=sys.stderr)
                continue
            # Kept beside the source, to read what a change did to the instructions.
            ptx_path = os.path.join(os.path.dirname(path), f"{name}.{arch}.ptx")
            with open(ptx_path, "w") as f:
                f.write(ptx)
            info = ptxas_info(ptxas, ptx_path, arch)
            if "error" in info:
                failed += 1
                print(f"| {name} | {arch} | ptxas failed | | | |")
                print(info["error"], file=sys.stderr)
                continue
            lines = ptx.count("\n")
            cubes = sass_stats.cubes_per_sm(arch, info["registers"], shared, units) if header else ""
            sass = sass_stats.disassemble(ptxas, nvdisasm, ptx_path, arch)
            loop = sass and sass_stats.hot_loop(sass)
            looped = [str(loop[c]) if loop else "" for c in loop_cols]
            print(
                f"| {name} | {arch} | {info['registers']} | "
                f"{info['spill_stores']}/{info['spill_loads']} | {info['stack']} | {lines} | "
                f"{shared / 1024:.1f} | {cubes} | " + " | ".join(looped) + " |"
            )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
