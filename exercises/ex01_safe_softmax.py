"""Exercise 01 (lesson 01): the safe, three-pass softmax.

softmax(x)_i = exp(x_i) / sum_j exp(x_j). Computed as written it overflows: in float32,
exp(x) is inf once x > 88.72 (709.78 in float64), and inf / inf is NaN. Softmax does not
change when the same number is subtracted from every x_j, so subtract the row's max m first:
every exponent x_j - m is then <= 0, every exp is in (0, 1], and the largest is exactly 1.

Three passes over each row (Milakov & Gimelshein 2018, Algorithm 2):

    1. m = max_j x_j
    2. d = sum_j exp(x_j - m)
    3. y_i = exp(x_i - m) / d

Compare ``flashlib.teach.softmax.naive_softmax``, which overflows; ``flashlib.teach.softmax.safe_softmax``
is the library's answer (look at it after you are done).

Write ``safe_softmax`` below; then run ``flashlib check ex01``.
"""
import numpy as np


def safe_softmax(x):
    """Softmax over the last axis of ``x``, stable for any finite input.

    x: NumPy array (..., N) of float32 or float64, N >= 1; any number of leading axes.
    Returns an array of the same shape and dtype whose rows (last axis) sum to 1.
    Does not modify ``x``.
    """
    raise NotImplementedError('ex01: your code goes here, then run `flashlib check ex01`')
