"""The lessons' algorithms and figures: what a learner reads, in NumPy and plain PyTorch.

``softmax`` (lessons 01-02: naive, safe, online, merging states), ``tiled`` (lessons 03-04 and
08: one-pass and tiled FlashAttention in NumPy, forward and backward), ``iosim`` (counting HBM
traffic of the standard and tiled algorithms, Theorem 2), ``viz`` (the figures), ``gpt`` (lesson
11's capstone model, whose attention is flashlib's kernels), ``schedule`` (lesson 12: one SM's
tensor cores, exp units and copy engine under FA2's and FA3's schedules; ``fp8_error``: attention's
output through e4m3, FA3's error measure; ``mbarrier``: the mbarriers and TMA ring between FA3's
producer and consumers, modelled, which exercise 12c's grader replays a learner's loop in), ``profile`` and ``occupancy``
(lessons 05 and 07: a compiled kernel's registers, spills and shared memory, programs per SM,
profiler tables), ``trace`` (lesson 07: a profiler trace's launches, time per kernel, idle gaps and
launch latency), ``ring`` (lesson 14: a simulated ring of ranks, its causal schedule drawn, gloo processes spawned around ``flashlib.distributed``). They
import the core library (``flashlib.ops``, ``flashlib.decode``, ``flashlib.distributed``); the
core imports nothing from here.
"""
