"""kvattn — the attention layer of an LLM serving engine (paged KV cache, batch preparation,
attention kernels), callable from NumPy and PyTorch without copies.

Tensors cross the boundary through DLPack: ``kvattn.from_dlpack(x)`` views any object with
``__dlpack__`` (NumPy arrays, PyTorch/CuPy tensors), and ``numpy.from_dlpack(t)`` /
``torch.from_dlpack(t)`` view a kvattn Tensor.  Errors from the C++ library arrive as
``ValueError`` (invalid argument), ``NotImplementedError`` (unsupported), ``MemoryError``
(out of memory) or ``RuntimeError`` (internal error), carrying the library's message.
"""
from ._kvattn import *  # noqa: F401,F403
from ._kvattn import __version__  # noqa: F401
