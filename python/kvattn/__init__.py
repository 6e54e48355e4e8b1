"""kvattn — the attention layer of an LLM serving engine (paged KV cache, batch preparation,
attention kernels), callable from NumPy and PyTorch without copies, under vLLM's names.

Tensors cross the boundary through DLPack: ``kvattn.from_dlpack(x)`` views any object with
``__dlpack__`` (NumPy arrays, PyTorch/CuPy tensors), and ``numpy.asarray(t)`` /
``torch.from_dlpack(t)`` view a kvattn Tensor.  Functions that compute a new tensor return it
in the framework of their first array argument.  Ops write into the arrays the caller passes
(vLLM's ``out=`` style).  Errors from the C++ library arrive as ``ValueError`` (invalid
argument), ``NotImplementedError`` (unsupported), ``MemoryError`` (out of memory) or
``RuntimeError`` (internal error), carrying the library's message.  See python/DESIGN.md.
"""
from ._kvattn import *  # noqa: F401,F403
from ._kvattn import __version__  # noqa: F401
from . import _kvattn
from ._convert import framework_of, like, to_framework  # noqa: F401
from .metadata import CommonAttentionMetadata  # noqa: F401
from .specs import (  # noqa: F401
    ChunkedLocalAttentionSpec, CrossAttentionSpec, EncoderOnlyAttentionSpec, FullAttentionSpec,
    MLAAttentionSpec, SinkFullAttentionSpec, SlidingWindowMLASpec, SlidingWindowSpec)
from .wrappers import *  # noqa: F401,F403
from .llm import LLM  # noqa: F401,E402
