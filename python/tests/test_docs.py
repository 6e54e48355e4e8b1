"""`help(kvattn)` is a usable reference: __all__ names every public class and function, the
module docstring's index lists exactly those by topic, and each has a docstring of its own."""
import inspect
import pydoc
import re

import kvattn


def index_names():
    """Names listed in the module docstring under 'Contents by topic'."""
    section = kvattn.__doc__.split("Contents by topic", 1)[1]
    names = set()
    for line in section.splitlines():
        if line.startswith("    "):  # an indented list line under a topic heading
            names.update(n.strip() for n in line.split(",") if n.strip())
    return names


def test_all_covers_every_public_name_and_the_index_lists_exactly_all():
    public_ext = {n for n in dir(kvattn._kvattn) if not n.startswith("_")}
    assert public_ext <= set(kvattn.__all__)
    for n in kvattn.__all__:
        assert hasattr(kvattn, n), n
    python_level = {"CommonAttentionMetadata", "PagedKVMetadata", "FullAttentionSpec", "bind_kv_cache",
                    "_make_xqa_draft_block_mask", "_merge_supported_layouts", "framework_of"}
    assert python_level <= set(kvattn.__all__)
    assert index_names() == set(kvattn.__all__)
    assert len(kvattn.__all__) == len(set(kvattn.__all__)) >= 130


def test_every_class_and_function_has_its_own_docstring():
    for name in kvattn.__all__:
        obj = getattr(kvattn, name)
        if inspect.isclass(obj):
            assert obj.__doc__ and len(obj.__doc__.strip()) > 20, f"class {name} has no docstring"
        elif callable(obj):
            doc = (obj.__doc__ or "").strip()
            if not inspect.isfunction(obj):  # pybind11: first line is the signature
                doc = "\n".join(doc.splitlines()[1:]).strip()
            assert len(doc) > 20, f"function {name} has no description: {obj.__doc__!r}"
    # The classes of the backend path explain how they are used, not just what they are.
    for name in ("Tensor", "InputBatch", "BatchPreparer", "CommonAttentionMetadata", "FlashInferBackend",
                 "AttentionImpl", "FlashInferImpl", "AttentionLayer", "AttentionMetadataBuilder",
                 "FlashInferMetadataBuilder", "FlashInferMetadata", "KVCacheConfig", "AttentionGroup",
                 "KVBlockZeroer", "PagedKVMetadataBuilder", "BackendConfig"):
        lines = [l for l in getattr(kvattn, name).__doc__.strip().splitlines() if l.strip()]
        assert len(lines) >= 3, f"{name}: {lines}"


def test_help_text_lists_every_class_and_function():
    text = pydoc.render_doc(kvattn, renderer=pydoc.plaintext)
    for name in kvattn.__all__:
        obj = getattr(kvattn, name)
        if inspect.isclass(obj):
            assert re.search(rf"\bclass {re.escape(name)}\b", text), f"help(kvattn) misses class {name}"
        elif callable(obj):
            assert re.search(rf"^    {re.escape(name)}\(", text, re.M), f"help(kvattn) misses function {name}"
