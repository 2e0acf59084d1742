#!/usr/bin/env python3
"""Splits a PTX file into one normalised file per kernel (.entry), so that two builds of a kernel can be diffed
for "the same operations in the same order" while register numbering may differ.

Usage: scripts/ptx_norm.py FILE.ptx OUTDIR      (writes OUTDIR/<kernel>.ptx, one per .entry)

Normalised: .loc / .file / comment lines and trailing // comments dropped; the anonymous-namespace hash in names
(_GLOBAL__N__<hash>_<n>_<file>_cu_<hash>) replaced by ANON; virtual registers (%r %rd %f %fd %p %rs %h %hh %rq)
and $L__BB / $L__tmp labels renamed by first appearance within the kernel (%r#1, %r#2, ...); .reg declarations kept
as they are (virtual register counts). A zero-initialisation block (contiguous "mov.u32 %rX, 0;" and
"mov.u32 %rY, %rX;" lines) names its registers in an arbitrary order (a permutation of equivalent zero-initialised
phi registers), so its lines are rewritten to "mov.u32 %rY, 0;", left out of the first-appearance renaming and
sorted.

Make the PTX reproducible first: nvcc 13's cicc output varies between identical runs with address-space layout
randomisation on (the load-store vectoriser of the state passes; docs/kernels/kda_prefill.md, shared phases); run
nvcc under `setarch x86_64 -R`. Errors: a missing input file raises; exit status 0 otherwise.
"""
import os
import re
import sys

ANON = re.compile(r'_GLOBAL__N__[0-9a-f]+_\d+_\w+?_cu_[0-9a-f]+')
REG = re.compile(r'%(r|rd|f|fd|p|rs|h|hh|rq)\d+\b|\$L__[A-Za-z]+\d+(_\d+)?')
ZERO = re.compile(r'mov\.(u32|b32|f32)\s+(%\w+), (0|0f00000000|%\w+);$')


def clean(line):
    s = line.strip()
    if not s or s.startswith(('.loc', '.file', '//')):
        return None
    s = re.sub(r'\s*//.*$', '', s)
    s = ANON.sub('ANON', s)
    return s or None


def normalise(body):
    names, counters = {}, {}

    def rename(m):
        tok = m.group(0)
        if tok not in names:
            kind = re.match(r'(%[a-z]+|\$L__[A-Za-z]+)', tok).group(1)
            counters[kind] = counters.get(kind, 0) + 1
            names[tok] = f'{kind}#{counters[kind]}'
        return names[tok]

    lines = [c for c in (clean(l) for l in body) if c is not None]
    zero, zregs = [False] * len(lines), set()
    for k, c in enumerate(lines):
        m = ZERO.match(c)
        if m and (m.group(3) in ('0', '0f00000000') or m.group(3) in zregs):
            zregs.add(m.group(2))
            lines[k] = f'mov.{m.group(1)} {m.group(2)}, 0;'
            zero[k] = True
        else:
            zregs = set()
    for k, c in enumerate(lines):
        if not zero[k] and not c.startswith('.reg'):
            lines[k] = REG.sub(rename, c)
    out, run = [], []
    for k, c in enumerate(lines):
        if zero[k]:
            run.append(REG.sub(rename, c))
            continue
        if run:
            out.extend(sorted(run))
            run = []
        out.append(c)
    out.extend(sorted(run))
    return out


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    src, outdir = sys.argv[1], sys.argv[2]
    os.makedirs(outdir, exist_ok=True)
    lines = open(src).read().split('\n')
    i = 0
    while i < len(lines):
        m = re.match(r'\s*(\.visible\s+|\.weak\s+)?\.entry\s+(\S+)\(', lines[i])
        if not m:
            i += 1
            continue
        body, depth, started = [], 0, False
        while i < len(lines):
            body.append(lines[i])
            depth += lines[i].count('{') - lines[i].count('}')
            started = started or '{' in lines[i]
            i += 1
            if started and depth == 0:
                break
        with open(os.path.join(outdir, ANON.sub('ANON', m.group(2)) + '.ptx'), 'w') as f:
            f.write('\n'.join(normalise(body)) + '\n')


if __name__ == '__main__':
    main()
