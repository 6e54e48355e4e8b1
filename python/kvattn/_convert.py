"""Framework conversion of kvattn results: a tensor produced by kvattn comes back as the same
kind of array the caller passed in (NumPy, PyTorch, CuPy), always as a zero-copy view."""
from __future__ import annotations

from ._kvattn import Tensor


def framework_of(obj) -> str:
    """'numpy', 'torch', 'cupy' or 'kvattn' for an array-like."""
    mod = type(obj).__module__.split(".")[0]
    if mod in ("numpy", "torch", "cupy"):
        return mod
    return "kvattn"


def to_framework(t, framework: str):
    """A zero-copy view of kvattn Tensor ``t`` as a ``framework`` array.

    NumPy views are built through ``__array_interface__`` (writable, unlike ``np.from_dlpack``);
    dtypes NumPy lacks (bfloat16, fp8) stay kvattn Tensors."""
    if not isinstance(t, Tensor) or framework == "kvattn":
        return t
    if framework == "numpy":
        import numpy as np
        if t.device != "cpu" or t.dtype in ("bfloat16", "fp8_e4m3", "fp8_e5m2"):
            return t
        return np.asarray(t)
    if framework == "torch":
        import torch
        return torch.from_dlpack(t)
    if framework == "cupy":
        import cupy
        return cupy.from_dlpack(t)
    return t


def like(t, reference):
    """``t`` in the framework of ``reference``."""
    return to_framework(t, framework_of(reference))
