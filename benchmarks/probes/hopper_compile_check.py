"""Check flashlib's FA3 forward (flashlib/kernels/fa3_fwd.py) for sm90 without a GPU.

1. The barrier protocol, modelled: the producer's and the consumers' sequences of mbarrier
   waits (with the kernel's parity formulas), arrivals, expect-tx, TMA loads and wgmma reads,
   replayed in random interleavings (TMA completing in any order) against a model of mbarriers.
   Fails on a deadlock, a barrier two phases ahead of its waiter (a parity wait that passes on
   the wrong phase), a TMA write into a stage a wgmma still reads, or a read of a stage that
   does not hold the block expected. It checks the protocol as written in
   ``flashlib.teach.mbarrier``'s ``producer`` and ``consumer``, which mirror ``fa3_fwd._producer``
   and ``fa3_fwd._consumer`` step by step: change both.
2. Every variant compiled with ``triton.compile`` for ``GPUTarget("cuda", 90, 32)`` through
   ptxas, from CPU stand-ins (the tensor descriptors' types only need shapes, strides and
   layouts) and Triton's own specialisation rules; prints shared memory, warps, registers and
   spills (ptxas -v), the partitions' setmaxnreg, global scratch and the cubin's size.

Exit status 1 if anything fails. The compiles need Triton 3.6 (the GPU machines' version:
Gluon's API changes between releases):

    TRITON_INTERPRET=0 PYTHONPATH=$PWD /tmp/t36/bin/python benchmarks/probes/hopper_compile_check.py [-v]

-v also prints each kernel's setmaxnreg and mbarrier instructions from the PTX.
"""
import os
import random
import re
import sys
import traceback

os.environ["TRITON_INTERPRET"] = "0"     # before flashlib: it turns the interpreter on without a GPU

import torch  # noqa: E402

from flashlib.kernels import fa3_fwd  # noqa: E402
from flashlib.teach import mbarrier  # noqa: E402

TARGET_ARCH = 90


# ----------------------------------------------------------------------------- 1. protocol model


def model_run(n_blocks, num_wg, stages, overlap, pingpong, seed):
    """One random interleaving of the partitions and the TMA completions; raises ProtocolError."""
    rng = random.Random(seed)
    ring = mbarrier.Ring(num_wg, stages)
    parts = {"producer": mbarrier.producer(ring, n_blocks),
             **{f"consumer {w}": mbarrier.consumer(ring, w, n_blocks, overlap, pingpong) for w in range(num_wg)}}
    mbarrier.interleave(ring, parts, rng)


def check_protocol(seeds=40):
    """model_run over every variant's (NUM_WG, OVERLAP, PINGPONG), 1-4 stages, 0-13 key blocks."""
    combos = sorted({(v.num_wg, v.overlap, v.pingpong and v.num_wg > 1) for v in fa3_fwd.VARIANTS.values()})
    runs, failures = 0, []
    for num_wg, overlap, pingpong in combos:
        for stages in (1, 2, 3, 4):
            for n_blocks in (0, 1, 2, 3, 4, 5, 8, 13):
                for seed in range(seeds):
                    runs += 1
                    try:
                        model_run(n_blocks, num_wg, stages, overlap, pingpong, seed)
                    except mbarrier.ProtocolError as e:
                        failures.append(f"num_wg={num_wg} overlap={overlap} pingpong={pingpong} "
                                        f"stages={stages} n_blocks={n_blocks} seed={seed}: {e}")
    print(f"barrier protocol model: {runs} random interleavings of {len(combos)} partition layouts, "
          f"{len(failures)} failures")
    for f in failures[:10]:
        print("  FAIL", f)
    return len(failures)


# ----------------------------------------------------------------------------- 2. compiles


def specialize(fn, args, constexprs, backend):
    """signature, constants and attributes of ``fn`` for ``args`` as Triton's launcher would
    give them: an int equal to 1 becomes a constexpr, a pointer or an int that is a multiple of
    16 gets the divisibility attribute, unless the parameter is in do_not_specialize."""
    from triton._C.libtriton import native_specialize_impl
    signature, attrs, consts = {}, {}, {}
    for i, p in enumerate(fn.params):
        if p.name in constexprs:
            signature[p.name] = "constexpr"
            consts[(i,)] = constexprs[p.name]
            continue
        ty, key = native_specialize_impl(type(backend), args[p.name], False, not p.do_not_specialize, True)
        signature[p.name] = ty
        if ty == "constexpr":
            consts[(i,)] = args[p.name]
        elif isinstance(key, str) and key:
            attrs[(i,)] = backend.parse_attr(key)
    return signature, consts, attrs


def compile_variant(name, D, causal, dtype, sizes=(2, 4, 2, 1000, 1531), mod=None, varlen=False, fold=True,
                    kv_loader=None):
    """Compile one (variant, head dim, causal, dtype) for inputs of sizes (B, Hq, Hkv, Nq, Nk)
    (Triton specialises ints on being 1 or a multiple of 16), with the score modifier ``mod`` (a
    ``kernels.score_mod`` function; None: the identity); varlen: B sequences of at most Nq and Nk
    rows packed, as fa3_forward's cu_seqlens path views them; fold: the scores' factor in exp2's
    FFMA where the launcher puts it (``fa3_fwd._fold``), else never; return the CompiledKernel."""
    from flashlib.kernels import score_mod
    from triton.backends.compiler import GPUTarget
    from triton.compiler import compile as triton_compile
    from triton.compiler.compiler import make_backend
    from triton.experimental.gluon._runtime import GluonASTSource
    fp8 = dtype == torch.float8_e4m3fn
    config = fa3_fwd.kernel_config(name, D, fp8=fp8)
    B, Hq, Hkv, Nq, Nk = sizes
    q = torch.empty(B, Hq, Nq, D, dtype=dtype)
    k = torch.empty(B, Hkv, Nk, D, dtype=dtype)
    cu = torch.zeros(B + 1, dtype=torch.int32)
    if varlen:   # (1, H, total, D) views of packed (total, H, D) tensors
        q = fa3_fwd.packed_view(torch.empty(B * Nq - 3, Hq, D, dtype=dtype))
        k = fa3_fwd.packed_view(torch.empty(B * Nk - 5, Hkv, D, dtype=dtype))
    out = torch.empty(B, Hq, Nq, D, dtype=torch.bfloat16) if fp8 else q
    lse = torch.empty(B, Hq, Nq, dtype=torch.float32)
    if fp8:   # V^T, rows padded to 16 bytes, as fa3_forward_fp8 makes it
        v_t = torch.empty(B, Hkv, D, -(-Nk // 16) * 16, dtype=dtype)
        v_desc = fa3_fwd.descriptor(v_t, (1, 1, D, config["BLOCK_N"]), shape=(B, Hkv, D, Nk))
    else:
        v_desc = fa3_fwd.descriptor(k, (1, 1, config["BLOCK_N"], D))
    args = dict(q_desc=fa3_fwd.descriptor(q, (1, 1, fa3_fwd.BLOCK_M, D)),
                k_desc=fa3_fwd.descriptor(k, (1, 1, config["BLOCK_N"], D)),
                v_desc=v_desc, o_desc=fa3_fwd.descriptor(out, (1, 1, fa3_fwd.BLOCK_M, D)),
                Lse=lse, Descale=lse, ModArgs=lse, Out=q, CuSeqQ=cu, CuSeqK=cu, Hq=Hq, Nq=Nq, Nk=Nk,
                qk_scale=0.1, GROUP=Hq // Hkv, n_descale=B * Hkv, stride_om=Hq * D, stride_oh=D, total_q=B * Nq - 3,
                n_seq=B)
    mod = mod or score_mod.identity
    constexprs = dict(CAUSAL=causal, SCORE_MOD=mod, FOLD=fa3_fwd._fold(mod, 0.1) if fold else 0,
                      KV_LOADER=kv_loader or fa3_fwd.load_kv_ring,
                      ALIBI_SPLIT=mod is score_mod.alibi_bias, VARLEN=varlen, MAX_SEQS=128, **config)
    target = GPUTarget("cuda", TARGET_ARCH, 32)
    backend = make_backend(target)
    fn = fa3_fwd._fa3_fwd_kernel
    signature, consts, attrs = specialize(fn, args, constexprs, backend)
    src = GluonASTSource(fn, signature, consts, attrs)
    return triton_compile(src, target=target, options=fa3_fwd.launch_options(name))


def ptxas_report(ptx):
    """(registers, spill bytes) of the kernel, from ptxas -v on its PTX (Triton discards the log)."""
    import subprocess
    import tempfile

    from triton import knobs
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        log = subprocess.run([knobs.nvidia.ptxas.path, "-v", f"--gpu-name=sm_{TARGET_ARCH}a", src,
                              "-o", os.path.join(tmp, "k.o")], capture_output=True, text=True).stderr
    regs = re.search(r"Used (\d+) registers", log)
    spills = [int(x) for x in re.findall(r"(\d+) bytes spill (?:stores|loads)", log)]
    for line in log.splitlines():   # e.g. "wgmma.mma_async instructions are serialized ..."
        if "warning" in line.lower():
            WARNINGS.add(line.strip())
    return (int(regs.group(1)) if regs else None), sum(spills)


def report(tag, compile_kernel):
    """Compile (``compile_kernel()``), print shared memory, registers and spills after ``tag``;
    1 for a failure or a spill, else 0."""
    try:
        ck = compile_kernel()
    except Exception as e:  # noqa: BLE001  (report every failure, keep going)
        print(f"{tag} FAILED: {type(e).__name__}: {str(e).strip().splitlines()[:6]}")
        return 1
    regs, spill = ptxas_report(ck.asm["ptx"])
    ok = bool(ck.asm.get("cubin")) and spill == 0
    print(f"{tag} smem {ck.metadata.shared}, regs {regs}, spill {spill}: {'ok: cubin' if ok else 'PROBLEM'}")
    return int(not ok)


WARNINGS = set()
SETMAXNREG = re.compile(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)")


def main(verbose=False):
    import triton
    failures = check_protocol()
    print(f"triton {triton.__version__}, torch {torch.__version__}, target sm{TARGET_ARCH}; "
          f"gluon hopper available: {fa3_fwd._GLUON}")
    if not fa3_fwd._GLUON:
        print("FAIL: this Triton has no (3.6-compatible) Gluon Hopper module")
        return 1
    print("smem: shared memory per CTA in bytes (H100: at most 232448); warps: with the partitions';"
          " regs: ptxas's launch registers per thread; setmaxnreg: the partitions' register counts;"
          " spill: ptxas spill bytes; scratch: global scratch bytes (must be 0: no allocator set)")
    print(f"{'variant':>14} {'D':>4} {'causal':>6} {'dtype':>9} | {'smem':>6} {'warps':>5} "
          f"{'regs':>4} {'setmaxnreg':>18} {'spill':>5} {'scratch':>7} {'cubin B':>8}  status")
    for name, variant in fa3_fwd.VARIANTS.items():
        for D in variant.head_dims:
            for causal in (False, True):
                for dtype in (torch.float16, torch.bfloat16, torch.float8_e4m3fn):
                    tag = f"{name:>14} {D:>4} {causal!s:>6} {str(dtype)[6:]:>9} |"
                    try:
                        ck = compile_variant(name, D, causal, dtype)
                    except Exception as e:  # noqa: BLE001  (report every failure, keep going)
                        failures += 1
                        msg = str(e).strip().splitlines()
                        print(f"{tag} FAILED: {type(e).__name__}: {' / '.join(msg[:12])}")
                        if verbose:
                            traceback.print_exc()
                        continue
                    md = ck.metadata
                    ptx = ck.asm.get("ptx", "")
                    setmaxnreg = sorted({int(r) for r in SETMAXNREG.findall(ptx)})
                    regs, spill = ptxas_report(ptx)
                    cubin = ck.asm.get("cubin", b"")
                    scratch = getattr(md, "global_scratch_size", 0)
                    ok = bool(cubin) and md.shared <= 232448 and spill == 0 and not scratch
                    print(f"{tag} {md.shared:>6} {md.num_warps:>5} {str(regs):>4} "
                          f"{','.join(map(str, setmaxnreg)) or '-':>18} {spill:>5} {scratch:>7} "
                          f"{len(cubin):>8}  "
                          f"{'ok: cubin' if ok else 'PROBLEM'}")
                    if not ok:
                        failures += 1
                    if verbose:
                        for line in ptx.splitlines():
                            if re.search(r"setmaxnreg|mbarrier\.(arrive|init)|maxnreg|maxntid", line):
                                print("      ", line.strip())
    # other sizes: the kernel does not specialise on them (do_not_specialize), so these must
    # compile as above; they would not if that were dropped and a size of 1 became a constexpr
    print("other sizes (B, Hq, Hkv, Nq, Nk): compiled for the default variants, float16")
    for sizes in [(1, 1, 1, 1, 1), (2, 4, 4, 4096, 4096)]:
        for D in fa3_fwd.HEAD_DIMS:
            name = fa3_fwd.DEFAULT_VARIANT[D]
            for causal in (False, True):
                failures += report(f"{name:>14} {D:>4} {causal!s:>6} {str(sizes):>22} |",
                                   lambda: compile_variant(name, D, causal, torch.float16, sizes))
    # the score modifiers (softcap, ALiBi, both) through the hook, the default 16-bit variants
    from flashlib.kernels import score_mod
    print("score modifiers: compiled for the default variants, causal, bfloat16")
    for mod in (score_mod.tanh_softcap, score_mod.tanh_softcap_approx, score_mod.alibi_bias,
                score_mod.tanh_softcap_approx_alibi_bias):
        for D in fa3_fwd.HEAD_DIMS:
            name = fa3_fwd.DEFAULT_VARIANT[D]
            failures += report(f"{name:>14} {D:>4} {mod.__name__:>32} |",
                               lambda: compile_variant(name, D, True, torch.bfloat16, mod=mod))
    print("packed sequences (cu_seqlens): compiled for the default variants, float16")
    for D in fa3_fwd.HEAD_DIMS:
        name = fa3_fwd.DEFAULT_VARIANT[D]
        for causal in (False, True):
            failures += report(f"{name:>14} {D:>4} {causal!s:>6} {'varlen':>22} |",
                               lambda: compile_variant(name, D, causal, torch.float16, varlen=True))
    for w in sorted(WARNINGS):
        print("ptxas:", w)
    print("all variants compiled" if not failures else f"{failures} compile failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(verbose="-v" in sys.argv[1:]))
