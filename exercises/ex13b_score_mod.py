"""Exercise 13b (lesson 13): score modifiers, their values and their derivatives.

A score modifier changes each attention score after scaling and before the mask and the softmax
(FlexAttention's ``score_mod``, flashlib's ``SCORE_MOD`` hook). The backward needs its derivative:
the softmax's gradient dS is with respect to the *modified* score, and the chain rule turns it into
the gradient for the raw score q.k * scale, dS_raw = dS * d(s_new)/ds, before it reaches dQ and
dK. So a modifier is a function

    mod(s, q_pos, k_pos, head) -> (s_new, ds_new_ds)

s: (B, H, bm, bn) a tile of scaled scores (natural-log units, any float dtype); q_pos: (bm,)
int64, the positions of the tile's queries on the key axis; k_pos: (bn,) int64, those of its
keys; head: (H,) int64, the query heads of the tile's second axis. It returns s_new like s and
its derivative with respect to s (a tensor that broadcasts to s's shape, in s's dtype). Extra
parameters (a cap, per-head tensors) are keyword arguments after these four; the lesson and the
grader fix them with ``functools.partial``.

Write three, in PyTorch (elementwise, no loops over the tile):

- ``softcap(s, q_pos, k_pos, head, *, cap)``: Gemma 2's logit cap, s_new = cap * tanh(s / cap),
  for a positive float ``cap``; finite for every finite s (scores of 1e4 included).
- ``temperature_alibi(s, q_pos, k_pos, head, *, temperature, slopes)``: a per-head temperature,
  then ALiBi's bias: s_new = s / temperature[h] - slopes[h] * |q_pos - k_pos| for the scores of
  head h; temperature and slopes are float tensors of shape (H,) (temperature > 0).
- ``chain(first, second)``: the modifier that applies ``first`` and then ``second`` to the result
  (both modifiers as above, any extra parameters already fixed); it returns a function with the
  modifier's signature ``(s, q_pos, k_pos, head) -> (s_new, ds_new_ds)``, the derivative being
  that of the composition with respect to the raw s.

The grader compares values and derivatives with its own float64 formulas and their autograd
derivatives, then runs ``flashlib.teach.score_mods.ModifiedAttention`` (a tiled attention with the
hook, forward and backward) with your modifiers and compares out, lse, dQ, dK and dV with a dense
float64 attention differentiated by autograd.
"""
import torch


def softcap(s, q_pos, k_pos, head, *, cap):
    """Gemma 2's softcap: (cap * tanh(s / cap), its derivative with respect to s)."""
    raise NotImplementedError('ex13b: your code goes here, then run `flashlib check ex13b`')


def temperature_alibi(s, q_pos, k_pos, head, *, temperature, slopes):
    """s / temperature[h] - slopes[h] * |q_pos - k_pos|, and its derivative with respect to s."""
    raise NotImplementedError('ex13b: your code goes here, then run `flashlib check ex13b`')


def chain(first, second):
    """The modifier ``second`` after ``first``: values composed, derivatives multiplied."""
    raise NotImplementedError('ex13b: your code goes here, then run `flashlib check ex13b`')
