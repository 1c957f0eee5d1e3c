#!/usr/bin/env python3
"""Per-kernel PTX of two commits, compared: a source change that must not change any kernel.

    eval "$(scripts/ci-deps-cuda.sh)"
    python3 scripts/kernel-ptx-diff.py BASE [HEAD] [--arch sm_90a,sm_121a] [--keep DIR] [--cache DIR] [--tries N]

Builds every module of kernels/src/lib.rs's registry at both commits (HEAD: the working tree
when left out) with NVRTC as the registry does (common.cuh, then the module's files, each after
`#line 1 "<path>"`; the registry's OPTIONS), and compares each `extern "C"` entry's PTX with
what it references (module-scope variables, called functions), after dropping the line table
(`.loc`, `.file`, the debug sections) and naming the referenced symbols and every mangled
(`_Z...`) name by first use (a static `__shared__` array of an inlined template function is
named by the template's arguments and parameter types, which a deleted parameter changes).
A kernel that differs is compiled again on both sides (--tries times in all): NVRTC's PTX of a
few kernels varies from one compilation of the same source to the next. Prints one line per
(arch, module, kernel) that differs or needed recompiling; exits 1 if a kernel differs in every
form seen or exists at only one commit (an entry deleted whose PTX is another entry's at HEAD,
names aside, counts as a duplicate removed).
"""
import argparse
import ctypes
import hashlib
import os
import re
import subprocess
import sys

ROOT = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True, check=True).stdout.strip()


def read(rev, path):
    if rev is None:
        with open(os.path.join(ROOT, path)) as f:
            return f.read()
    return subprocess.run(["git", "-C", ROOT, "show", f"{rev}:{path}"], capture_output=True, text=True, check=True).stdout


def registry(rev):
    """(name, [file paths under kernels/cu], options) of each module of kernels/src/lib.rs."""
    lib = read(rev, "kernels/src/lib.rs")
    mods = []
    for m in re.finditer(r'KernelModule\s*\{\s*name:\s*"(\w+)",\s*parts:\s*parts!\[(.*?)\]', lib, re.S):
        mods.append((m.group(1), re.findall(r'"([^"]+)"', m.group(2))))
    opts = re.findall(r'"([^"]+)"', re.search(r"pub const OPTIONS: &\[&str\] = &\[(.*?)\];", lib, re.S).group(1))
    return mods, opts


def source(rev, files):
    s = read(rev, "kernels/cu/common.cuh")
    for p in files:
        s += f'\n#line 1 "{p}"\n' + read(rev, "kernels/cu/" + p)
    return s


def nvrtc():
    for name in ["libnvrtc.so.13", "libnvrtc.so"]:
        try:
            return ctypes.CDLL(name)
        except OSError:
            pass
    sys.exit("kernel-ptx-diff: libnvrtc not found; eval \"$(scripts/ci-deps-cuda.sh)\" first")


def ptx(lib, src, name, opts):
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), f"{name}.cu".encode(), 0, None, None):
        sys.exit("nvrtcCreateProgram failed")
    inc = [f"-I{os.environ['CUDA_HOME']}/include"] if os.environ.get("CUDA_HOME") else []
    o = [x.encode() for x in opts + inc]
    arr = (ctypes.c_char_p * len(o))(*o)
    r = lib.nvrtcCompileProgram(prog, len(o), arr)
    n = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetProgramLog(prog, log)
    if r:
        sys.exit(f"{name}: NVRTC error {r}\n{log.value.decode()}")
    lib.nvrtcGetPTXSize(prog, ctypes.byref(n))
    buf = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetPTX(prog, buf)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return buf.value.decode()


DECL = re.compile(r"^\s*(?:\.visible\s+|\.extern\s+|\.weak\s+)*\.(?:global|shared|const|local)\b.*?([A-Za-z_$][\w$]*)(?:\[\d*\])?\s*(?:=.*)?;\s*$")


def split(text):
    """{symbol: declaration or body text} of a PTX module (line table dropped), entry names."""
    lines = []
    skip = 0
    for ln in text.splitlines():
        s = ln.strip()
        if s.startswith(".section") and "debug" in s:
            skip = 1
            continue
        if skip:
            if s == "}":
                skip = 0
            continue
        if s.startswith(".loc") or s.startswith(".file") or not s or s.startswith("//"):
            continue
        lines.append(ln)
    syms, entries = {}, []
    i = 0
    while i < len(lines):
        s = lines[i].strip()
        m = re.match(r"(?:\.visible\s+|\.weak\s+|\.extern\s+)*\.(entry|func)\s+(?:\([^)]*\)\s*)?([\w$]+)", s)
        if m:
            j = i
            while lines[j].strip() != "}" and not (lines[j].strip().endswith(";") and m.group(1) == "func" and j > i and "{" not in "".join(lines[i:j + 1])):
                j += 1
                if j >= len(lines):
                    break
            syms[m.group(2)] = "\n".join(lines[i:j + 1])
            if m.group(1) == "entry":
                entries.append(m.group(2))
            i = j + 1
            continue
        d = DECL.match(lines[i])
        if d:
            syms[d.group(1)] = lines[i]
        i += 1
    return syms, entries


def canon(syms, entry):
    """The entry's code, then the declarations of everything it reaches (sorted), with module
    symbols and mangled names renamed by first use in the code. A `__shared__` array that only
    one kernel uses is declared inside its body ("demoted"), one that several use at module
    scope: the declarations are taken out of the body so both compare alike."""
    ident = re.compile(r"[A-Za-z_$][\w$]*")
    decl = re.compile(r"\s*(?:\.extern\s+)?\.shared\s")
    lines = syms[entry].split("\n")
    code = [ln for ln in lines if not decl.match(ln)]
    inner = {}
    for ln in lines:
        if decl.match(ln):
            m = DECL.match(ln)
            inner[m.group(1) if m else ln] = ln.strip()
    names, order = {entry: entry}, []

    def visit(text):
        for t in ident.findall(text):
            if t != entry and t not in names and (t in syms or t in inner or t.startswith("_Z")):
                names[t] = f"S{len(names)}"
                order.append(t)
                if t in syms:
                    visit(syms[t])

    visit("\n".join(code))
    rename = lambda text: ident.sub(lambda m: names.get(m.group(0), m.group(0)), text)
    out = [rename("\n".join(code))]
    out += sorted(rename(inner[t] if t in inner else syms[t].strip()) for t in order if t in inner or t in syms)
    body = "\n".join(out)
    body = re.sub(r"\$L__BB\d+_", "$L__BB_", body)
    return re.sub(r"__local_depot\d+", "__local_depot", body)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base")
    ap.add_argument("head", nargs="?")
    ap.add_argument("--arch", default="sm_90a,sm_121a")
    ap.add_argument("--keep", help="write each kernel's compared text under DIR/<rev>/<arch>/")
    ap.add_argument("--cache", help="keep each module's PTX in DIR by a hash of its source and options")
    ap.add_argument("--tries", type=int, default=8, help="compilations of each side before a kernel counts as changed")
    a = ap.parse_args()
    lib = nvrtc()
    ver = (ctypes.c_int(), ctypes.c_int())
    lib.nvrtcVersion(ctypes.byref(ver[0]), ctypes.byref(ver[1]))
    print(f"NVRTC {ver[0].value}.{ver[1].value}")
    revs = (a.base, a.head)
    regs = {rev: registry(rev) for rev in revs}

    def kernels(rev, name, files, arch, fresh=False):
        """{entry: compared text} of one module; `fresh`: compiled now, whatever the cache holds."""
        src, o = source(rev, files), regs[rev][1] + [f"--gpu-architecture={arch}"]
        key = hashlib.sha256((src + "\0".join(o) + f"{ver[0].value}.{ver[1].value}").encode()).hexdigest()[:16]
        path = a.cache and os.path.join(a.cache, f"{name}-{key}.ptx")
        if path and os.path.exists(path) and not fresh:
            with open(path) as f:
                text = f.read()
        else:
            text = ptx(lib, src, name, o)
            if path and not fresh:
                os.makedirs(a.cache, exist_ok=True)
                with open(path, "w") as f:
                    f.write(text)
        syms, entries = split(text)
        return {e: canon(syms, e) for e in entries}

    bad = same = retried = merged = 0
    for arch in a.arch.split(","):
        mods = {rev: dict(regs[rev][0]) for rev in revs}
        for name in sorted(set(mods[a.base]) | set(mods[a.head])):
            if name not in mods[a.base] or name not in mods[a.head]:
                print(f"{arch} {name}: module only at {'base' if name in mods[a.base] else 'head'}")
                bad += 1
                continue
            got = {rev: kernels(rev, name, mods[rev][name], arch) for rev in revs}
            if a.keep:
                for rev in revs:
                    d = os.path.join(a.keep, rev or "worktree", arch)
                    os.makedirs(d, exist_ok=True)
                    for e, t in got[rev].items():
                        with open(os.path.join(d, f"{name}.{e}.ptx"), "w") as f:
                            f.write(t + "\n")
            b, h = got[a.base], got[a.head]
            # An entry deleted as a duplicate: its PTX is another entry's at HEAD (names aside).
            anon = lambda t, e: re.sub(rf"\b{e}(_param_\d+)?\b", lambda m: "ENTRY" + (m.group(1) or ""), t)
            for e in sorted(set(b) - set(h)):
                twin = [f for f in sorted(h) if anon(h[f], f) == anon(b[e], e)]
                if twin:
                    merged += 1
                    print(f"{arch} {name} {e}: deleted; its PTX is {twin[0]}'s")
                else:
                    print(f"{arch} {name} {e}: only at base")
                    bad += 1
            for e in sorted(set(h) - set(b)):
                print(f"{arch} {name} {e}: only at head")
                bad += 1
            # NVRTC's PTX of some kernels varies from one compilation of the same source to the
            # next (linear_bf16_1 on sm_90a: the order of a few address computations): a kernel
            # that differs is compiled again on both sides, and it is the same if any of its
            # forms at one commit is one of its forms at the other.
            diff = [e for e in b if e in h and b[e] != h[e]]
            seen = {e: ({b[e]}, {h[e]}) for e in diff}
            for _ in range(a.tries - 1):
                diff = [e for e in diff if not (seen[e][0] & seen[e][1])]
                if not diff:
                    break
                for i, rev in enumerate(revs):
                    k = kernels(rev, name, mods[rev][name], arch, fresh=True)
                    for e in diff:
                        seen[e][i].add(k[e])
            for e in seen:
                if seen[e][0] & seen[e][1]:
                    retried += 1
                    print(f"{arch} {name} {e}: the same after recompiling ({len(seen[e][0])} / {len(seen[e][1])} forms seen)")
                else:
                    print(f"{arch} {name} {e}: PTX differs ({len(seen[e][0])} / {len(seen[e][1])} forms seen)")
                    bad += 1
            same += sum(1 for e in b if e in h) - sum(1 for e in seen if not (seen[e][0] & seen[e][1]))
    print(f"{same} kernel PTX identical ({retried} after recompiling), {merged} deleted as duplicates, "
          f"{bad} differ or missing")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
