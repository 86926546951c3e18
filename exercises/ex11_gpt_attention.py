"""Exercise 11 (lesson 11): a GPT's attention, for training and for sampling with a KV cache.

``flashlib.teach.gpt.GPT(cfg, attention=attend)`` calls your function in every layer with the new
tokens' queries, keys and values, already split into heads:

    q: (B, Hq, T, D)     k, v: (B, Hkv, T, D)     Hq % Hkv == 0 (grouped-query heads)

and must get back their attention output, (B, Hq, T, D). Token i may attend to token j <= i only
(causal), and there are three cases:

- training, ``cache is None``: the T tokens are the whole sequence. This is lesson 07's kernel:
  ``flash_attention(q, k, v, causal=True)`` (its backward is lesson 08's, through autograd).
- prefill, ``cache`` a ``flashlib.KVCache`` that holds nothing yet (``max(cache.lengths) == 0``):
  the T tokens are a prompt. They attend to each other exactly as in training, and their keys
  and values must go into the cache (``cache.append(k, v)``) for the tokens sampled after them.
- decode, ``cache`` holding L earlier tokens of every sequence (lengths may differ between
  sequences): the T new tokens (usually 1) attend to every cached token and to themselves. Append
  their keys and values first, then ``cache.attend(q)``: lesson 10's ``flash_decode`` over each
  sequence's valid positions (``cache.seqlens``), new token i seeing cached positions
  j <= i + L_total - T.

What the cache holds past a sequence's length is not keys: leave those slots alone (``cache.k``
and ``cache.v`` are (B, Hkv, max_len, D) buffers) and let ``cache.attend`` read the lengths.
Then run ``flashlib.course.check("ex11")``.
"""
from flashlib import flash_attention


def attend(q, k, v, cache=None):
    """Causal self-attention of the new tokens q, k, v; append k, v to ``cache`` when given.

    q: (B, Hq, T, D); k, v: (B, Hkv, T, D); cache: None or a ``flashlib.KVCache`` with
    (B, Hkv, max_len, D) buffers of k's dtype. Returns (B, Hq, T, D), like q.
    """
    raise NotImplementedError('ex11: your code goes here, then run `flashlib check ex11`')
