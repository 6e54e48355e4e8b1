"""Host helpers of the attention layer under vLLM's names, against hand-computed values:
per-layer hyperparameters, log2 -> ln LSE, XQA draft masks (uint16, vLLM's layout),
FlashInfer's get_seq_lens and FlashAttention's cascade heuristic (vllm-facts §7.4, §7.8)."""
import math
import types

import numpy as np
import pytest

import kvattn


def layer(name, num_heads=8, num_kv_heads=2, scale=0.125, sliding_window=None, logits_soft_cap=None,
          has_sinks=False):
    return dict(name=name, num_heads=num_heads, num_kv_heads=num_kv_heads, scale=scale,
                sliding_window=sliding_window, logits_soft_cap=logits_soft_cap, has_sinks=has_sinks)


# ---- per-layer parameters --------------------------------------------------------------

def test_get_per_layer_parameters_and_global():
    layers = [layer("model.layers.0.attn", sliding_window=(127, 0), logits_soft_cap=30.0, has_sinks=True),
              types.SimpleNamespace(name="model.layers.1.attn", num_heads=8, num_kv_heads=2, sm_scale=0.5)]
    params = kvattn.get_per_layer_parameters(layers, ["model.layers.1.attn", "model.layers.0.attn"])
    assert list(params) == ["model.layers.1.attn", "model.layers.0.attn"]
    p0, p1 = params["model.layers.0.attn"], params["model.layers.1.attn"]
    assert isinstance(p0, kvattn.PerLayerParameters)
    assert (p0.window_left, p0.logits_soft_cap, p0.sm_scale, p0.has_sinks) == (127, 30.0, 0.125, True)
    assert (p1.window_left, p1.logits_soft_cap, p1.sm_scale, p1.has_sinks) == (-1, None, 0.5, False)
    assert p0.has_same_window_lefts is None
    with pytest.raises(AttributeError):
        p0.window_left = 3

    g = kvattn.infer_global_hyperparameters(params)
    assert g.window_left == -1 and g.sm_scale == 0.5  # first entry's values
    assert g.has_same_window_lefts is False and g.has_same_all_params is False

    same = kvattn.get_per_layer_parameters([layer("a"), layer("b")])
    assert list(same) == ["a", "b"] and same["a"] == same["b"]
    g = kvattn.infer_global_hyperparameters(same)
    assert g.has_same_window_lefts is True and g.has_same_all_params is True
    # Same window, different scale.
    g = kvattn.infer_global_hyperparameters(kvattn.get_per_layer_parameters([layer("a"), layer("b", scale=1.0)]))
    assert g.has_same_window_lefts is True and g.has_same_all_params is False

    with pytest.raises(ValueError, match="nope"):
        kvattn.get_per_layer_parameters([layer("a")], ["nope"])
    with pytest.raises(ValueError):
        kvattn.infer_global_hyperparameters({})


def test_get_num_attention_heads_from_layers():
    layers = [layer("a", num_heads=8), layer("b", num_heads=8), layer("c", num_heads=4)]
    assert kvattn.get_num_attention_heads_from_layers(layers, ["a", "b"]) == 8
    assert kvattn.get_num_attention_heads_from_layers(layers, ["zzz"]) is None
    with pytest.raises(ValueError) as e:
        kvattn.get_num_attention_heads_from_layers(layers, ["a", "c"])
    assert "a=8" in str(e.value) and "c=4" in str(e.value)
    with pytest.raises(ValueError):
        kvattn.get_num_attention_heads_from_layers(layers)


def test_get_query_lens_mismatch_unsupported_backend():
    class FlashInfer:
        @staticmethod
        def get_name():
            return "FLASHINFER"

        @classmethod
        def supports_device_cpu_query_lens_mismatch(cls):
            return False

    tolerant = {"name": "FLASH_ATTN", "supports_device_cpu_query_lens_mismatch": True}
    group = types.SimpleNamespace(backend=FlashInfer)
    assert kvattn.get_query_lens_mismatch_unsupported_backend([[tolerant], [tolerant, group]]) == "FLASHINFER"
    assert kvattn.get_query_lens_mismatch_unsupported_backend([[tolerant], []]) is None
    assert kvattn.get_query_lens_mismatch_unsupported_backend([]) is None


def test_log2_lse_to_ln_scalar_and_in_place():
    assert kvattn.log2_lse_to_ln(2.0) == pytest.approx(2 * math.log(2), rel=1e-6)
    assert kvattn.log2_lse_to_ln(0.0) == 0.0
    lse = np.array([[0.0, 1.0], [-2.0, 10.0]], np.float32)
    ptr = lse.ctypes.data
    out = kvattn.log2_lse_to_ln(lse)
    assert out is lse and lse.ctypes.data == ptr
    np.testing.assert_allclose(lse, [[0.0, math.log(2)], [-2 * math.log(2), 10 * math.log(2)]], rtol=1e-6)
    with pytest.raises(ValueError):
        kvattn.log2_lse_to_ln(np.zeros(2, np.int32))


# ---- XQA masks -------------------------------------------------------------------------

def test_xqa_draft_block_mask_uniform():
    m = kvattn._make_xqa_draft_block_mask(3, True)
    assert m.dtype == np.uint16 and m.shape == (3, 2)
    np.testing.assert_array_equal(m, [[0b1, 0], [0b11, 0], [0b111, 0]])
    np.testing.assert_array_equal(kvattn._make_xqa_draft_block_mask(3, False), [[7, 0]] * 3)
    m = kvattn._make_xqa_draft_block_mask(33, True)
    assert m.shape == (33, 4)
    np.testing.assert_array_equal(m[0], [1, 0, 0, 0])
    np.testing.assert_array_equal(m[16], [0x1FFFF & 0xFFFF, 1, 0, 0])
    np.testing.assert_array_equal(m[31], [0xFFFF, 0xFFFF, 0, 0])
    np.testing.assert_array_equal(m[32], [0xFFFF, 0xFFFF, 1, 0])


def test_xqa_ragged_draft_block_mask():
    m = kvattn._make_xqa_ragged_draft_block_mask([1, 3], 3, True)
    assert m.dtype == np.uint16 and m.shape == (4, 2)
    np.testing.assert_array_equal(m, [[1, 0], [1, 0], [3, 0], [7, 0]])
    np.testing.assert_array_equal(kvattn._make_xqa_ragged_draft_block_mask([1, 3], 3, False),
                                  [[1, 0], [7, 0], [7, 0], [7, 0]])
    # Same bytes as the int32-word form.
    words = np.asarray(kvattn.make_xqa_draft_block_mask([1, 3], True))
    np.testing.assert_array_equal(m, words.view(np.uint16))
    with pytest.raises(ValueError):
        kvattn._make_xqa_ragged_draft_block_mask([4], 3, True)


def test_compute_decode_query_lens():
    assert kvattn._compute_decode_query_lens([0, 2, 4], 2, 4, False) == (2, False, None)
    assert kvattn._compute_decode_query_lens([0, 1, 2], 0, 0, True) == (1, False, None)


# ---- paged-KV helpers ------------------------------------------------------------------

def test_get_seq_lens():
    indptr = np.array([0, 3, 4, 6, 6], np.int32)
    last = np.array([5, 16, 1, 0], np.int32)
    out = kvattn.get_seq_lens(indptr, last, 16)
    assert isinstance(out, np.ndarray) and out.dtype == np.int32
    # (3-1)*16+5, (1-1)*16+16, (2-1)*16+1, clamp(0-1, 0)*16+0
    np.testing.assert_array_equal(out, [37, 16, 17, 0])
    with pytest.raises(ValueError):
        kvattn.get_seq_lens(indptr.astype(np.int64), last, 16)


def test_use_cascade_attention():
    def cascade(prefix, q, hq=32, hkv=8, alibi=False, sw=False, local=False, sms=132, dcp=1):
        return kvattn.use_cascade_attention(prefix, np.asarray(q, np.int32), hq, hkv, alibi, sw, local, sms, dcp)

    decodes = [1] * 64
    assert cascade(100, decodes) is False          # prefix < 256
    # 4096-token prefix, 64 decodes, GQA 4: cascade cdiv(32*1, 132)*32 = 32 < flash-decoding
    # cdiv(64*8*1*32, 132) = 125.
    assert cascade(4096, decodes) is True
    assert cascade(4096, decodes, alibi=True) is False
    assert cascade(4096, decodes, sw=True) is False
    assert cascade(4096, decodes, local=True) is False
    assert cascade(4096, decodes, dcp=2) is False
    assert cascade(4096, [1] * 7) is False         # fewer than 8 requests
    assert cascade(256, [5] * 8) is True           # no flash decoding (prefill queries)
    # 8 decodes, 8 q heads / 1 kv head, 2 prefix tiles: cascade 1*2 = 2 > flash-decoding 1.
    assert cascade(256, [1] * 8, hq=8, hkv=1) is False
    assert kvattn.use_cascade_attention(4096, decodes, 32, 8, False, False, False, 132) is True
