#!/usr/bin/env python3
"""Generate the expected bytes of trampoline/tests/aarch64_relocate.rs.

Each case: original instructions at SRC, a trampoline address, and the
expected trampoline written as assembly with absolute targets in {0x...}.
Both are assembled with GNU as and LINKED at their addresses with GNU ld
(absolute targets become --defsym symbols), so every PC-relative offset in
the expected bytes is computed by the linker, independently of our encoder.

Run: python3 trampoline/tests/aarch64_relocate_gen.py > trampoline/tests/aarch64_data/relocate_cases.rs
Needs binutils-aarch64-linux-gnu (installed with gcc-aarch64-linux-gnu).
"""
import re, struct, subprocess, tempfile

def asm(lines, at):
    syms = {}
    def sub(m):
        v = int(m.group(1), 0)
        syms["A_%x" % v] = v
        return "A_%x" % v
    body = [re.sub(r"\{(0x[0-9a-fA-F]+)\}", sub, l) for l in lines]
    src = ".text\n.globl _start\n_start:\n" + "\n".join(body) + "\n"
    with tempfile.TemporaryDirectory() as d:
        open(d + "/a.s", "w").write(src)
        subprocess.run(["aarch64-linux-gnu-as", "-march=armv8.5-a", "-o", d + "/a.o", d + "/a.s"], check=True)
        ds = sum((["--defsym", "%s=%#x" % kv] for kv in syms.items()), [])
        subprocess.run(["aarch64-linux-gnu-ld", "-Ttext=%#x" % at, "-o", d + "/a.elf", d + "/a.o", "--no-relax"] + ds, check=True)
        subprocess.run(["aarch64-linux-gnu-objcopy", "-O", "binary", "-j", ".text", d + "/a.elf", d + "/a.bin"], check=True)
        b = open(d + "/a.bin", "rb").read()
    return list(struct.unpack("<%dI" % (len(b) // 4), b))

S = 0x5555_0000_1000          # original function (8-aligned)
P = 0x5555_0000_6000          # a page address for adrp
GiB = 1 << 30
MiB = 1 << 20
NEAR, FAR = 4, 20             # patch lengths
def h(x): return "{%#x}" % x
def q(x): return ".quad %#x" % x

cases = []
def case(name, orig, tramp, expect, patch=NEAR, size=0x40, src=S):
    pad = ["nop"] * ((size // 4) - len(orig))
    full = asm(orig + pad, src)
    assert full[len(orig):] == [0xd503201f] * len(pad)
    cases.append((name, src, size, patch, tramp, full[:len(orig)], asm(expect, tramp), orig, expect))

J = S + 4   # continuation after a near patch
# ldr literal: x, w, sw, s, d, q, prfm -- in reach (+-1 MiB), beyond it but within b, far.
L = S + 0x100
for kind, reg in [("ldr", "x1"), ("ldr", "w2"), ("ldrsw", "x3"), ("ldr", "s4"), ("ldr", "d5"), ("ldr", "q6"), ("prfm", "pldl1keep")]:
    nm = kind + "_" + (reg if kind != "prfm" else "pldl1keep")
    orig = ["%s %s, %s" % (kind, reg, h(L))]
    case(nm + "_in_reach", orig, S - 0x8000, ["%s %s, %s" % (kind, reg, h(L)), "b " + h(J)])
    gpr = reg[0] in "xw" and kind != "prfm"
    base = ("x" + reg[1:]) if gpr else "x16"
    case(nm + "_beyond_1mib", orig, S + 2 * MiB,
         ["ldr %s, 1f" % base, "%s %s, [%s]" % (kind, reg, base), "b " + h(J), ".word 0", "1: " + q(L)])
    case(nm + "_64gib", orig, S + 64 * GiB,
         ["ldr %s, 1f" % base, "%s %s, [%s]" % (kind, reg, base), "ldr x16, 2f", "br x16", "1: " + q(L), "2: " + q(J)])
# adr
case("adr_in_reach", ["adr x7, " + h(S + 0x41)], S + 0x1000, ["adr x7, " + h(S + 0x41), "b " + h(J)])
case("adr_beyond_1mib", ["adr x7, " + h(S + 0x41)], S - 2 * MiB, ["ldr x7, 1f", "b " + h(J), "1: " + q(S + 0x41)])
# adrp: in reach (+-4 GiB) near and far from the patch; beyond 4 GiB both ways
case("adrp_in_reach", ["adrp x8, " + h(P)], S + 100 * MiB, ["adrp x8, " + h(P), "b " + h(J)])
case("adrp_in_reach_3gib", ["adrp x8, " + h(P)], S + 3 * GiB,
     ["adrp x8, " + h(P), "ldr x16, 1f", "br x16", ".word 0", "1: " + q(J)])
case("adrp_beyond_4gib", ["adrp x8, " + h(P)], S + 5 * GiB,
     ["ldr x8, 1f", "ldr x16, 2f", "br x16", ".word 0", "1: " + q(P), "2: " + q(J)])
case("adrp_beyond_minus_4gib", ["adrp x8, " + h(P)], S - 5 * GiB,
     ["ldr x8, 1f", "ldr x16, 2f", "br x16", ".word 0", "1: " + q(P), "2: " + q(J)])
# b, bl
T = S + 0x2000
case("b_in_reach", ["b " + h(T)], S + 100 * MiB, ["b " + h(T), "b " + h(J)])
case("b_beyond_128mib", ["b " + h(T)], S + 4 * GiB, ["ldr x16, 1f", "br x16", "ldr x16, 2f", "br x16", "1: " + q(T), "2: " + q(J)])
case("bl_in_reach", ["bl " + h(T)], S - 100 * MiB, ["bl " + h(T), "b " + h(J)])
case("bl_beyond_128mib", ["bl " + h(T)], S - 4 * GiB, ["ldr x30, 1f", "blr x30", "ldr x16, 2f", "br x16", "1: " + q(T), "2: " + q(J)])
# conditional branches: in reach, beyond own reach but within b, beyond b
C = S + 0x40
for nm, ins, inv, own in [("b_ne", "b.ne", "b.eq", MiB), ("cbz_w9", "cbz w9,", "cbnz w9,", MiB), ("cbnz_x10", "cbnz x10,", "cbz x10,", MiB),
                          ("tbz_x11_40", "tbz x11, #40,", "tbnz x11, #40,", 32 * 1024), ("tbnz_w12_3", "tbnz w12, #3,", "tbz w12, #3,", 32 * 1024)]:
    orig = ["%s %s" % (ins, h(C))]
    case(nm + "_in_reach", orig, S + own // 2, ["%s %s" % (ins, h(C)), "b " + h(J)])
    case(nm + "_beyond_own_reach", orig, S + 2 * own, ["%s 1f" % inv, "b " + h(C), "1: b " + h(J)])
    case(nm + "_beyond_own_reach_back", orig, S - 2 * own, ["%s 1f" % inv, "b " + h(C), "1: b " + h(J)])
    case(nm + "_beyond_128mib", orig, S + 8 * GiB,
         ["%s 1f" % inv, "ldr x16, 2f", "br x16", "1: ldr x16, 3f", "br x16", ".word 0", "2: " + q(C), "3: " + q(J)])
case("b_al_is_b", ["b.al " + h(C)], S + 8 * GiB, ["ldr x16, 1f", "br x16", "ldr x16, 2f", "br x16", "1: " + q(C), "2: " + q(J)])
# far patch: 16 bytes (4 instructions) at an 8-aligned site, 20 bytes (5) at 4 mod 8;
# branches between taken instructions go to the copies
JF = S + 16
case("far_internal_branches", ["cbz x0, " + h(S + 12), "add x1, x1, #1", "b.eq " + h(S + 4), "mov x2, x3"],
     S + 4 * GiB, ["cbz x0, 1f", "2: add x1, x1, #1", "b.eq 2b", "1: mov x2, x3", "ldr x16, 3f", "br x16", "3: " + q(JF)], patch=FAR)
case("far_free_prologue", ["cbz x0, " + h(S + 0x110), "stp x29, x30, [sp, #-64]!", "mov x29, sp", "stp x21, x22, [sp, #32]"],
     S + 8 * GiB, ["cbnz x0, 1f", "ldr x16, 3f", "br x16", "1: stp x29, x30, [sp, #-64]!", "mov x29, sp", "stp x21, x22, [sp, #32]",
                   "ldr x16, 5f", "br x16", "3: " + q(S + 0x110), "5: " + q(JF)], patch=FAR, size=0x200)
case("far_scratch_x17_when_x16_used", ["mov x16, x0", "b.ne " + h(C), "nop", "nop"], S + 8 * GiB,
     ["mov x16, x0", "b.eq 1f", "ldr x17, 2f", "br x17", "1: nop", "nop", "ldr x17, 3f", "br x17", "2: " + q(C), "3: " + q(JF)], patch=FAR)
# bti c is kept in place and repeated at the start of the trampoline
case("bti_kept", ["bti c", "adr x0, " + h(S + 0x40)], S + 2 * MiB, ["bti c", "ldr x0, 1f", "b " + h(S + 8), ".word 0", "1: " + q(S + 0x40)])
# function at an address that is 4 mod 8: 20-byte far patch, 5 instructions taken
case("odd_source_far_patch", ["stp x29, x30, [sp, #-16]!", "mov x29, sp", "ldr x0, " + h(S + 0x104), "adrp x1, " + h(P), "nop"], S + 8 * GiB,
     ["stp x29, x30, [sp, #-16]!", "mov x29, sp", "ldr x0, 1f", "ldr x0, [x0]", "ldr x1, 2f", "nop", "ldr x16, 3f", "br x16",
      "1: " + q(S + 0x104), "2: " + q(P), "3: " + q(S + 4 + 20)],
     patch=FAR, src=S + 4)

def words(ws): return ", ".join("0x%08x" % w for w in ws)
print("// Original functions are these words followed by nops up to `size`.")
print("// @generated by aarch64_relocate_gen.py -- do not edit; re-run the script.")
print("// Expected bytes were assembled and linked by GNU as/ld at the trampoline address.")
print("pub const CASES: &[Case] = &[")
for name, src, size, patch, tramp, o, e, ol, el in cases:
    print("    // %s\n    //   original: %s\n    //   expected: %s" % (name, "; ".join(ol), "; ".join(el)))
    print("    Case { name: \"%s\", src: %#x, size: %#x, patch_len: %d, tramp: %#x,\n           orig: &[%s],\n           expect: &[%s] }," %
          (name, src, size, patch, tramp, words(o), words(e)))
print("];")
