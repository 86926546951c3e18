"""Benchmarks: flashlib against PyTorch's attention, each implementation checked before it is timed.

``python -m flashlib.bench --suite ...`` (``__main__``) runs the suites: ``harness`` holds the
dense ones (forward, backward, paper, memory) and the helpers the others share (inputs, the
correctness check, timing, ratios, the environment record, plots); ``decode`` (TB/s of K/V cache
read) and ``sparse`` (block-sparse masks against FlexAttention) add theirs. Results go to
``benchmarks/results/<gpu>/`` as JSON and PNG. Needs a CUDA GPU; imports only the core library.
"""
