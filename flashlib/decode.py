"""Decoding with a KV cache: ``flash_decode`` (checks, then the Flash-Decoding kernels of
``flashlib.kernels.decode``) and ``KVCache``, a preallocated cache that appends and attends.

Follows the Flash-Decoding post (Dao, Haziza, Massa and Sizov, 2023): split the cache into chunks,
attend to each chunk in parallel, merge the partial results by their lse (lesson 03's merge).
The layers are those of ``flashlib.ops``: kernels -> launcher (``flash_decode_forward``) ->
``flash_decode`` (checks, keyword-only options, this docstring).

Limits: inference only (no gradient); a few new tokens per step (any number works, but more
than 64 query rows per K/V head re-read the cache once per 64 rows: use ``flash_attention``
for a prefill); ``cache_seqlens`` values are checked on the host only for CPU tensors (on a GPU
that would cost a device sync per step; the kernel clamps them to [0, Lmax] instead). Each call
costs host time (these checks, a few allocations and one Triton launch, the merge being fused
into the split-KV kernel): at short caches it can exceed the GPU time, which CUDA graphs (or
fewer, larger steps) hide; see benchmarks/NOTES.md.
"""
import numbers
from typing import Optional

import torch

from . import runtime
from .inputs import SUPPORTED_DTYPES, check_inputs, check_score_mods
from .kernels import score_mod
from .kernels.decode import flash_decode_forward


def check_decode_inputs(q, k_cache, v_cache, *, cache_seqlens=None, num_splits=None, scale=None):
    """Validate ``flash_decode``'s arguments; return the resolved scale. Errors name the argument."""
    scale = check_inputs(q, k_cache, v_cache, scale=scale)
    B, Lmax = q.shape[0], k_cache.shape[2]
    if cache_seqlens is not None:
        if not isinstance(cache_seqlens, torch.Tensor):
            raise TypeError(f"cache_seqlens must be a torch.Tensor of ints or None, got "
                            f"{type(cache_seqlens).__name__}")
        if cache_seqlens.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"cache_seqlens has dtype {cache_seqlens.dtype}; expected torch.int32 "
                            "or torch.int64")
        if tuple(cache_seqlens.shape) != (B,):
            raise ValueError(f"cache_seqlens must have shape ({B},), one length per sequence, got "
                             f"{tuple(cache_seqlens.shape)}")
        if cache_seqlens.device != q.device:
            raise ValueError(f"cache_seqlens is on {cache_seqlens.device} but q is on {q.device}")
        if cache_seqlens.device.type == "cpu" and B > 0:
            lo, hi = int(cache_seqlens.min()), int(cache_seqlens.max())
            if lo < 0 or hi > Lmax:
                raise ValueError(f"cache_seqlens must lie in [0, {Lmax}] (the caches' length), "
                                 f"got values from {lo} to {hi}")
    if num_splits is not None:
        if isinstance(num_splits, bool) or not isinstance(num_splits, numbers.Integral):
            raise TypeError(f"num_splits must be a positive int or None, got {num_splits!r}")
        if num_splits < 1:
            raise ValueError(f"num_splits must be a positive int or None, got {num_splits!r}")
    return scale


def flash_decode(q, k_cache, v_cache, *, cache_seqlens=None, num_splits=None, scale=None,
                 softcap=None, alibi_slopes=None, return_lse=False):
    """Attention of a few new query tokens over a KV cache, with Flash-Decoding's split-KV kernels.

    q: (batch, heads_q, n_new, headdim), n_new small (1 for plain decoding, a few for
    speculative decoding). k_cache, v_cache: (batch, heads_kv, max_len, headdim), heads_q %
    heads_kv == 0 (the query heads of a group share one K/V read). cache_seqlens: (batch,)
    int32/int64 tensor on q's device, the valid length L of each sequence (a ragged batch); None
    means all max_len. The new tokens are the last n_new of those L positions and attend
    bottom-right causally: new token i sees cache position j iff j <= i + L - n_new.
    num_splits: chunks each sequence's keys are split into (None: picked from the GPU's SM count,
    the batch, heads and max_len); any value gives the same result up to rounding.
    scale: multiplies q k^T; defaults to 1/sqrt(headdim). softcap, alibi_slopes: score modifiers
    as in ``flash_attention``; ALiBi's distance is from the new token's position, i + L - n_new,
    to the key's. float16, bfloat16, float32 (exact dots);
    head dims up to 256; CUDA tensors, or CPU tensors through Triton's interpreter.
    Returns out (like q) or (out, lse) with lse (batch, heads_q, n_new) float32, natural log. A
    row with nothing to attend to (L = 0, or n_new > L) gets out 0 and lse -inf. No gradient.
    """
    scale = check_decode_inputs(q, k_cache, v_cache, cache_seqlens=cache_seqlens,
                                num_splits=num_splits, scale=scale)
    softcap = check_score_mods(q, softcap=softcap, alibi_slopes=alibi_slopes)
    if torch.compiler.is_compiling():
        out, lse = _flash_decode_op(q, k_cache, v_cache, cache_seqlens, num_splits, scale, softcap,
                                    alibi_slopes)
    else:
        out, lse = flash_decode_forward(q, k_cache, v_cache, cache_seqlens, num_splits=num_splits,
                                        scale=scale, return_lse=return_lse,
                                        score_mod=score_mod.make(q, softcap, alibi_slopes))
    return (out, lse) if return_lse else out


# Under torch.compile the launcher (its scratch pool, lock and memo) is opaque to the compiler as
# this custom op, as flash_attention's are (flashlib/ops.py): no graph break, and
# mode="reduce-overhead" can replay decoding steps from CUDA graphs.
@torch.library.custom_op("flashlib::flash_decode", mutates_args=())
def _flash_decode_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     cache_seqlens: Optional[torch.Tensor], num_splits: Optional[int],
                     scale: float, softcap: Optional[float], alibi_slopes: Optional[torch.Tensor]
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    return flash_decode_forward(q, k_cache, v_cache, cache_seqlens, num_splits=num_splits,
                                scale=scale, return_lse=True, cached_scratch=False,
                                score_mod=score_mod.make(q, softcap, alibi_slopes))


@_flash_decode_op.register_fake
def _(q, k_cache, v_cache, cache_seqlens, num_splits, scale, softcap, alibi_slopes):
    return q.new_empty(q.shape), q.new_empty(q.shape[:3], dtype=torch.float32)


class KVCache:
    """A preallocated KV cache for one attention layer: k, v (batch, heads_kv, max_len, headdim)
    and each sequence's length, kept both on the host (to check for room without a device sync)
    and on the device (``seqlens``, what the kernels read)::

        cache = KVCache(batch=1, heads_kv=8, max_len=4096, headdim=128, dtype=torch.float16)
        cache.append(k_prompt, v_prompt)           # (1, 8, n_prompt, 128) after the prefill
        for step in range(n_steps):
            cache.append(k_new, v_new)             # the new token's key and value first,
            out = cache.attend(q_new)              # then its query: (1, Hq, 1, 128)

    ``append`` adds the same number of tokens to every sequence; ``lengths`` may start ragged.
    """

    def __init__(self, batch, heads_kv, max_len, headdim, *, dtype=torch.float16, device=None,
                 lengths=None):
        if dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"dtype must be float16, bfloat16 or float32, got {dtype}")
        for name, n in (("batch", batch), ("heads_kv", heads_kv), ("max_len", max_len),
                        ("headdim", headdim)):
            if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
                raise ValueError(f"{name} must be a positive int, got {n!r}")
        device = runtime.DEVICE if device is None else torch.device(device)
        self.k = torch.zeros(batch, heads_kv, max_len, headdim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        host = torch.zeros(batch, dtype=torch.int64) if lengths is None else \
            torch.as_tensor(lengths, dtype=torch.int64).cpu().clone()
        if tuple(host.shape) != (batch,) or host.min() < 0 or host.max() > max_len:
            raise ValueError(f"lengths must be {batch} ints in [0, {max_len}], got {lengths!r}")
        self._lengths = host                                    # host copy: checks, no sync
        self.seqlens = host.to(device=device, dtype=torch.int32)  # device copy: the kernels'

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    @property
    def lengths(self) -> list:
        """Valid positions per sequence (a list of ints, from the host copy)."""
        return self._lengths.tolist()

    def append(self, k_new, v_new):
        """Write k_new, v_new (batch, heads_kv, n, headdim) after each sequence's last position."""
        B, Hkv, _, D = self.k.shape
        for name, t in (("k_new", k_new), ("v_new", v_new)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
            if t.ndim != 4 or t.shape[0] != B or t.shape[1] != Hkv or t.shape[3] != D:
                raise ValueError(f"{name} must have shape ({B}, {Hkv}, n, {D}), got {tuple(t.shape)}")
            if t.dtype != self.k.dtype or t.device != self.k.device:
                raise TypeError(f"{name} is {t.dtype} on {t.device}; the cache holds "
                                f"{self.k.dtype} on {self.k.device}")
        if k_new.shape != v_new.shape:
            raise ValueError(f"k_new {tuple(k_new.shape)} and v_new {tuple(v_new.shape)} differ")
        n = k_new.shape[2]
        if int(self._lengths.max()) + n > self.max_len:
            b = int(self._lengths.argmax())
            raise ValueError(f"the cache is full: sequence {b} holds {int(self._lengths[b])} of "
                             f"{self.max_len} positions, no room for {n} more")
        starts = self._lengths.tolist()
        if len(set(starts)) == 1:
            self.k[:, :, starts[0]:starts[0] + n] = k_new
            self.v[:, :, starts[0]:starts[0] + n] = v_new
        else:
            for b, start in enumerate(starts):
                self.k[b, :, start:start + n] = k_new[b]
                self.v[b, :, start:start + n] = v_new[b]
        self._lengths += n
        self.seqlens += n

    def attend(self, q, **kwargs):
        """``flash_decode(q, k, v, cache_seqlens=seqlens, **kwargs)``: append q's k, v first."""
        return flash_decode(q, self.k, self.v, cache_seqlens=self.seqlens, **kwargs)

    def reset(self):
        """Forget every sequence (lengths back to 0); the memory stays allocated."""
        self._lengths.zero_()
        self.seqlens.zero_()
