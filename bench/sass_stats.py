"""What a compiled kernel will do on the GPU, read without one: cubes per multiprocessor
from its registers, shared memory and units, and the instruction mix of its hottest loop in
the machine code (SASS, from `ptxas` and `nvdisasm`). Used by cuda_compile.py.

The hot loop is the outermost loop holding the most tensor-core instructions (HMMA): in the
attention kernels, the loop over key (or query) tiles. Its counts are static (each inner
loop's body counted once), so they compare kernels whose products are unrolled; a kernel
with inner loops says so in `inner loops`.
"""

import os
import re
import subprocess

# Per multiprocessor: registers, shared memory (bytes) and the most a cube may take, units.
LIMITS = {
    "sm_90a": {"regs": 65536, "shared": 228 << 10, "per_cube": 227 << 10, "units": 2048},
    "sm_80": {"regs": 65536, "shared": 164 << 10, "per_cube": 163 << 10, "units": 2048},
}
# Shared memory the driver reserves per resident cube (compute capability 8.0 and later).
RESERVED = 1 << 10

INSTRUCTION = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
LABEL = re.compile(r"^\s*(\.L_x_\d+):")
TARGET = re.compile(r"\(\s*(\.L_x_\d+)\s*\)")
# Instruction classes counted, by opcode prefix.
CLASSES = {
    "HMMA": ("HMMA",),
    "LDSM": ("LDSM",),
    "LDS/STS": ("LDS", "STS"),
    "generic LD/ST": ("LD.", "ST."),
    "BAR": ("BAR",),
}


def cubes_per_sm(arch: str, registers: int, shared: int, units: int) -> int:
    """Cubes of `units` units a multiprocessor holds at once (0 if the cube does not fit)."""
    lim = LIMITS.get(arch)
    if lim is None or units == 0 or shared > lim["per_cube"]:
        return 0
    warps = -(-units // 32)
    # Registers are allocated per warp, in steps of 256.
    per_warp = -(-max(registers, 1) * 32 // 256) * 256
    by_regs = lim["regs"] // (warps * per_warp)
    by_shared = lim["shared"] // (shared + RESERVED)
    by_units = lim["units"] // (warps * 32)
    return min(by_regs, by_shared, by_units, 32)


def disassemble(ptxas: str, nvdisasm: str, ptx_path: str, arch: str) -> str | None:
    """The SASS of `ptx_path` for `arch`, or None when a tool is missing or fails."""
    if not (os.path.exists(nvdisasm) and os.path.exists(ptxas)):
        return None
    cubin = ptx_path.removesuffix(".ptx") + ".cubin"
    run = subprocess.run([ptxas, f"-arch={arch}", ptx_path, "-o", cubin], capture_output=True)
    if run.returncode != 0:
        return None
    run = subprocess.run([nvdisasm, "-c", cubin], capture_output=True, text=True)
    return run.stdout if run.returncode == 0 else None


def opcode(text: str) -> str:
    """The opcode of one SASS instruction, its predicate (`@P0`, `@!PT`) removed."""
    words = re.sub(r"^@!?U?P[T0-9]+\s+", "", text).split()
    return words[0] if words else ""


def hot_loop(sass: str) -> dict | None:
    """Counts of the hottest loop (see the module doc), or None when no loop holds HMMA."""
    instructions, labels, pending = [], {}, []
    for line in sass.splitlines():
        if m := LABEL.match(line):
            pending.append(m.group(1))
        elif m := INSTRUCTION.match(line):
            address = int(m.group(1), 16)
            labels.update((name, address) for name in pending)
            pending = []
            instructions.append((address, opcode(m.group(2)), m.group(2)))
    loops = []
    for address, op, text in instructions:
        target = TARGET.search(text)
        if op.startswith("BRA") and target and labels.get(target.group(1), address + 1) <= address:
            loops.append((labels[target.group(1)], address))

    def count(lo: int, hi: int) -> dict:
        inside = [op for a, op, _ in instructions if lo <= a <= hi]
        counts = {k: sum(op.startswith(p) for op in inside for p in ps) for k, ps in CLASSES.items()}
        counts["instructions"] = len(inside)
        counts["inner loops"] = sum(1 for l, h in loops if lo <= l and h <= hi and (l, h) != (lo, hi))
        return counts

    stats = [count(lo, hi) for lo, hi in loops]
    stats = [s for s in stats if s["HMMA"]]
    if not stats:
        return None
    # The most HMMA; of those, the outermost (the most instructions).
    return max(stats, key=lambda s: (s["HMMA"], s["instructions"]))
