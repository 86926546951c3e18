"""Mutant of ex13b: chain adds the two derivatives."""
import torch

EXPECTED_HINT = 'chain rule multiplies'


def softcap(s, q_pos, k_pos, head, *, cap):
    """Gemma 2's softcap: (cap * tanh(s / cap), its derivative with respect to s)."""
    t = torch.tanh(s / cap)                       # (B, H, bm, bn) in (-1, 1): no overflow
    return cap * t, 1.0 - t * t                   # d/ds cap tanh(s / cap) = 1 - tanh^2


def temperature_alibi(s, q_pos, k_pos, head, *, temperature, slopes):
    """s / temperature[h] - slopes[h] * |q_pos - k_pos|, and its derivative with respect to s."""
    temp = temperature.to(s)[head][None, :, None, None]                 # (1, H, 1, 1)
    slope = slopes.to(s)[head][None, :, None, None]                     # (1, H, 1, 1)
    distance = (q_pos[:, None] - k_pos[None, :]).abs().to(s)            # (bm, bn)
    return s / temp - slope * distance, 1.0 / temp                      # derivative per head


def chain(first, second):
    """The modifier ``second`` after ``first``: values composed, derivatives multiplied."""
    def mod(s, q_pos, k_pos, head):
        s1, d1 = first(s, q_pos, k_pos, head)
        s2, d2 = second(s1, q_pos, k_pos, head)   # second's derivative at first's output
        return s2, d2 + d1
    return mod
