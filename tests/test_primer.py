"""Lesson 05's kernels (flashlib.kernels.primer): fused row softmax and tiled matmul vs float64.

CPU: through Triton's interpreter, irregular shapes (rows of 1, 17, 97, 130, 1000 columns;
matmuls 17x33x65, 1x1x1, 130x97x80), float32 and float16, strided views, bad input.
GPU (marked ``gpu``): real sizes, float16/bfloat16/float32.
"""
import pytest
import torch

from flashlib import runtime
from flashlib.kernels.primer import MAX_COLS, matmul, softmax
from flashlib.testing import assert_close

DEV = runtime.DEVICE
DTYPES = (torch.float32, torch.float16)


def naive_softmax(x):
    """exp(x - max) / sum in x's own dtype: the baseline of the tolerance rule."""
    z = (x - x.max(dim=-1, keepdim=True).values).exp()
    return z / z.sum(dim=-1, keepdim=True)


def check_softmax(x):
    y = softmax(x)
    assert y.shape == x.shape and y.dtype == x.dtype and y.device == x.device
    assert torch.isfinite(y).all()
    assert_close(y, torch.softmax(x.double(), dim=-1), baseline=naive_softmax(x), dtype=x.dtype,
                 name=f"softmax {tuple(x.shape)} {x.dtype}")


def check_matmul(a, b):
    c = matmul(a, b)
    assert c.shape == (a.shape[0], b.shape[1]) and c.dtype == a.dtype
    expected = a.double() @ b.double()
    baseline = (a.float() @ b.float()).to(a.dtype) if a.dtype != torch.float32 else a @ b
    assert_close(c, expected, baseline=baseline, dtype=a.dtype,
                 name=f"matmul {tuple(a.shape)} @ {tuple(b.shape)} {a.dtype}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n_cols", [1, 17, 97, 130, 1000])
def test_softmax_rows_of_any_length(n_cols, dtype):
    x = (3 * torch.randn(9, n_cols, device=DEV)).to(dtype)
    check_softmax(x)


def test_softmax_large_and_negative_values_stay_finite():
    x = torch.randn(5, 97, device=DEV) * 300
    x[0] += 1000          # exp would overflow without the max subtraction
    x[1] -= 1000          # ... and underflow to 0/0
    check_softmax(x)


def test_softmax_strided_rows_and_bfloat16():
    wide = torch.randn(7, 150, device=DEV)
    x = wide[:, 3:133]                               # (7, 130), row stride 150
    check_softmax(x)
    check_softmax(wide.t()[:17, :5])                 # columns not contiguous: copied
    xb = torch.randn(4, 97, device=DEV).bfloat16()
    yb = softmax(xb)
    assert yb.dtype == torch.bfloat16
    assert_close(yb, torch.softmax(xb.double(), -1), baseline=naive_softmax(xb),
                 dtype=torch.bfloat16, name="softmax bfloat16")


def test_softmax_rejects_bad_input():
    with pytest.raises(ValueError, match="2D"):
        softmax(torch.randn(2, 3, 4, device=DEV))
    with pytest.raises(TypeError, match="dtype"):
        softmax(torch.randn(2, 3, device=DEV).double())
    with pytest.raises(ValueError, match="MAX_COLS"):
        softmax(torch.empty(1, MAX_COLS + 1, device=DEV))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M, N, K", [(17, 33, 65), (1, 1, 1), (130, 97, 80), (65, 17, 130)])
def test_matmul_any_shape(M, N, K, dtype):
    a = torch.randn(M, K, device=DEV).to(dtype)
    b = torch.randn(K, N, device=DEV).to(dtype)
    check_matmul(a, b)


def test_matmul_strided_inputs_and_bfloat16():
    a = torch.randn(33, 97, device=DEV)
    b = torch.randn(17, 97, device=DEV).t()          # (97, 17), column-major
    check_matmul(a, b)
    check_matmul(a[::2], b)                          # row stride 2 * 97
    ab, bb = a.bfloat16(), b.bfloat16()
    assert_close(matmul(ab, bb), ab.double() @ bb.double(), baseline=ab @ bb,
                 dtype=torch.bfloat16, name="matmul bfloat16")


def test_matmul_rejects_bad_input():
    a = torch.randn(4, 5, device=DEV)
    with pytest.raises(ValueError, match="must equal"):
        matmul(a, torch.randn(4, 3, device=DEV))
    with pytest.raises(TypeError, match="same dtype"):
        matmul(a, torch.randn(5, 3, device=DEV).half())
    with pytest.raises(ValueError, match="2D"):
        matmul(a[None], torch.randn(5, 3, device=DEV))


# ------------------------------------------------------------------------------- GPU, real sizes

@pytest.mark.gpu
@pytest.mark.skipif(DEV.type != "cuda", reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(4096, 1000), (1823, 4097), (3, 65536), (1000, 2)])
def test_softmax_gpu(shape, dtype):
    check_softmax(torch.randn(*shape, device=DEV).to(dtype) * 4)


@pytest.mark.gpu
@pytest.mark.skipif(DEV.type != "cuda", reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("M, N, K", [(4096, 4096, 4096), (1000, 3001, 777), (1, 8192, 129)])
def test_matmul_gpu(M, N, K, dtype):
    a = torch.randn(M, K, device=DEV).to(dtype)
    b = torch.randn(K, N, device=DEV).to(dtype)
    check_matmul(a, b)
