"""Correct variant of ex13b: softcap's derivative from its output, 1 - (s_new / cap)^2;
the ALiBi distance by broadcasting subtraction then abs in the tile's dtype; chain through a
small class."""
import torch


def softcap(s, q_pos, k_pos, head, *, cap):
    """Gemma 2's softcap: (cap * tanh(s / cap), its derivative with respect to s)."""
    t = torch.tanh(s / cap)                       # (B, H, bm, bn) in (-1, 1): no overflow
    value = cap * t
    return value, 1.0 - (value / cap) ** 2


def temperature_alibi(s, q_pos, k_pos, head, *, temperature, slopes):
    """s / temperature[h] - slopes[h] * |q_pos - k_pos|, and its derivative with respect to s."""
    temp = temperature.to(s)[head][None, :, None, None]                 # (1, H, 1, 1)
    slope = slopes.to(s)[head][None, :, None, None]                     # (1, H, 1, 1)
    distance = (q_pos.to(s)[:, None] - k_pos.to(s)[None, :]).abs()            # (bm, bn)
    return s / temp - slope * distance, 1.0 / temp                      # derivative per head


def chain(first, second):
    """The modifier ``second`` after ``first``: values composed, derivatives multiplied."""
    class Chained:
        def __call__(self, s, q_pos, k_pos, head):
            inner, d_inner = first(s, q_pos, k_pos, head)
            outer, d_outer = second(inner, q_pos, k_pos, head)
            return outer, d_inner * d_outer
    return Chained()
