"""Probe: lesson 11's training step (6 layers, B=32, T=256, 6 query heads over 2 K/V heads, d=64,
bfloat16 autocast; flashlib/teach/gpt.py) with flashlib's attention and with SDPA's flash backend, run
eagerly, under torch.compile (default and mode="reduce-overhead") and captured by hand in one CUDA
graph. Compares each mode's loss and gradient (the tied embedding's, relative to its largest
entry) with eager's, then prints the median ms per step (do_bench). At these sizes host time
decides (short_sequence_probe.py).

    PYTHONPATH=$PWD python benchmarks/probes/compile_probe.py   (on a GPU; h200/compile_probe.log)
"""
import time

import torch
import torch.nn.functional as F
import triton.testing
from torch.nn.attention import SDPBackend, sdpa_kernel

from flashlib.teach import gpt


def sdpa_attention(q, k, v, cache=None):
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


cfg = gpt.GPTConfig(vocab_size=96, block_size=256, n_layer=6, n_head=6, n_kv_head=2, n_embd=384)
torch.manual_seed(0)
x, y = (torch.randint(0, 96, (32, 256), device="cuda") for _ in range(2))
weights = gpt.GPT(cfg).cuda().state_dict()


def train_step(model):
    def step():
        torch.compiler.cudagraph_mark_step_begin()   # reduce-overhead: a new step begins
        model.zero_grad(set_to_none=True)            # as optimizer.zero_grad() in a training loop
        with torch.autocast("cuda", dtype=torch.bfloat16):
            _, loss = model(x, y)
        loss.backward()
        return loss
    return step


def graphed(step):
    """``step`` captured in one CUDA graph (after warm-up on a side stream), and its loss."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loss = step()
    return graph.replay, loss


print(f"{'attention':>12} {'mode':>16} {'first step s':>12} {'loss diff':>10} {'grad rel':>10} {'ms/step':>8}")
for name, attention in (("flashlib", gpt.attend), ("SDPA flash", sdpa_attention)):
    eager = gpt.GPT(cfg, attention=attention).cuda()
    eager.load_state_dict(weights)
    ref_loss = train_step(eager)()
    ref_grad = eager.lm_head.weight.grad.clone()
    for mode in ("eager", "compile", "reduce-overhead", "CUDA graph"):
        torch._dynamo.reset()
        model = gpt.GPT(cfg, attention=attention).cuda()
        model.load_state_dict(weights)
        start = time.perf_counter()
        if mode == "CUDA graph":
            step, loss = graphed(train_step(model))
            step()
        else:
            run = train_step(model if mode == "eager" else torch.compile(model, mode=None if mode == "compile" else mode))
            loss = run()
            step = run
        torch.cuda.synchronize()
        first = time.perf_counter() - start
        loss = step() if mode != "CUDA graph" else (step(), loss)[1]
        loss_diff = abs(loss.item() - ref_loss.item())
        grad_diff = ((model.lm_head.weight.grad.float() - ref_grad.float()).abs().max()
                     / ref_grad.float().abs().max()).item()
        ms = triton.testing.do_bench(step, return_mode="median")
        print(f"{name:>12} {mode:>16} {first:12.1f} {loss_diff:10.2e} "
              f"{grad_diff:10.2e} {ms:8.2f}", flush=True)
