#!/usr/bin/env python3
"""Writes a large IgProf-format memory profile for benchmarking igprof-analyse.

Shape of a real multi-threaded MEM profile: one tree per thread, all threads
running the same code, so they share call paths (the merged tree has
--paths distinct nodes while the file has threads x paths lines). Functions
live in 20 shared libraries that do not exist on disk (names come from the
profile, as when profiles are analysed on another machine); a quarter have
C++ mangled names. Three counters (MEM_TOTAL, MEM_MAX, MEM_LIVE) on about half
of the nodes, hexadecimal numbers, as IgProf writes them.

usage: bench/analyse-gen-profile.py OUT [--size-mb 1024] [--paths 1500000] [--seed 1]
The output is not compressed and must not be committed (default 1 GB).
"""
import argparse
import os
import random


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--paths", type=int, default=1_500_000, help="distinct call paths (nodes of the merged tree)")
    ap.add_argument("--functions", type=int, default=50_000)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rnd = random.Random(a.seed)

    nfn = a.functions
    libs = [f"/opt/bench/lib/libbench{i}.so" for i in range(20)]
    fn_lib = [rnd.randrange(len(libs)) for _ in range(nfn)]
    fn_off = [rnd.randrange(0x1000, 0x400000) for _ in range(nfn)]

    def fn_name(f):
        if f % 4 == 0:
            ns = f"ns{f % 97}"
            return f"_ZN{len(ns)}{ns}{len('func' + str(f))}func{f}Ev"
        return f"bench_func_{f}"

    callees = [[rnd.randrange(nfn) for _ in range(8)] for _ in range(nfn)]

    # The shared tree, in pre-order: depth and function of each node, and the
    # index just past each node's subtree (to drop whole subtrees per thread).
    depth = [1]
    func = [0]
    stack = [0]
    d = 1
    while len(depth) < a.paths:
        if d < 60 and rnd.random() < 0.56:
            d += 1
        else:
            d = rnd.randint(2, max(2, d))
        parent_fn = func[stack[d - 2]] if d >= 2 else 0
        f = rnd.choice(callees[parent_fn])
        del stack[d - 1:]
        stack.append(len(depth))
        depth.append(d)
        func.append(f)
    n = len(depth)
    end = [0] * n
    open_ = []
    for i in range(n):
        while open_ and depth[open_[-1]] >= depth[i]:
            end[open_.pop()] = i
        open_.append(i)
    for i in open_:
        end[i] = n

    prefix = [f"C{depth[i]:x} FN{func[i]:x}" for i in range(n)]
    counters = []
    for _ in range(4096):
        calls = rnd.randrange(1, 5000)
        size = rnd.randrange(16, 4096)
        live = rnd.randrange(0, calls)
        counters.append(
            f" V0:({calls:x},{calls * size:x},{calls * size:x}) V1:({calls:x},{size:x},0) V2:({live:x},{live * size:x},{calls * size:x})"
        )
    has_counter = [rnd.random() < 0.5 for _ in range(n)]

    fn_defined = bytearray(nfn)
    lib_defined = bytearray(len(libs))
    target = a.size_mb << 20
    written = 0
    thread = 0
    with open(a.out, "w", buffering=1 << 22) as out:
        out.write(f"P=(HEX ID={os.getpid():x} N=(./bench) T=0.000000)\n")
        first_counter = True
        while written < target:
            thread += 1
            buf = []
            i = 0
            while i < n:
                # Each thread skips about 3% of subtrees (code it never ran).
                if i and rnd.random() < 0.03:
                    i = end[i]
                    continue
                f = func[i]
                if fn_defined[f]:
                    line = prefix[i] + "+0"
                else:
                    fn_defined[f] = 1
                    lib = fn_lib[f]
                    if lib_defined[lib]:
                        file = f"F{lib:x}"
                    else:
                        lib_defined[lib] = 1
                        file = f"F{lib:x}=({libs[lib]})"
                    line = f"C{depth[i]:x} FN{f:x}=({file}+{fn_off[f]:x} N=({fn_name(f)}))+0"
                if has_counter[i]:
                    if first_counter:
                        first_counter = False
                        line += " V0=(MEM_TOTAL):(1,1,1) V1=(MEM_MAX):(1,1,0) V2=(MEM_LIVE):(0,0,1)"
                    else:
                        line += counters[rnd.randrange(4096)]
                buf.append(line)
                i += 1
            text = "\n".join(buf) + "\n"
            out.write(text)
            written += len(text)
    print(f"{a.out}: {written / (1 << 20):.0f} MiB, {thread} threads, {n} distinct paths, {nfn} functions")


if __name__ == "__main__":
    main()
