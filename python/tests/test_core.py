"""kvattn core bindings: DLPack round trips without copies, dtypes, error translation."""
import numpy as np
import pytest

import kvattn


def test_numpy_to_kvattn_shares_memory():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = kvattn.from_dlpack(a)
    assert t.shape == (3, 4)
    assert t.strides == (4, 1)
    assert t.dtype == "float32"
    assert t.data_ptr() == a.ctypes.data
    a[2, 3] = 99.0
    assert t.tolist()[-1] == 99.0


def test_kvattn_to_numpy_shares_memory_and_keeps_storage_alive():
    src = np.arange(6, dtype=np.int32).reshape(2, 3)
    t = kvattn.from_dlpack(src).clone()  # storage owned by kvattn
    a = np.from_dlpack(t)  # NumPy marks DLPack imports read-only
    del t  # the numpy view keeps kvattn's storage alive
    assert a.dtype == np.int32
    np.testing.assert_array_equal(a, src)
    assert a.ctypes.data != src.ctypes.data


def test_strided_views_round_trip():
    a = np.arange(24, dtype=np.int64).reshape(2, 3, 4)
    t = kvattn.from_dlpack(a).permute([2, 0, 1])
    b = np.from_dlpack(t)
    assert b.shape == (4, 2, 3)
    np.testing.assert_array_equal(b, a.transpose(2, 0, 1))
    assert b.ctypes.data == a.ctypes.data


def test_non_contiguous_numpy_input():
    a = np.arange(20, dtype=np.float32).reshape(4, 5)[:, 1:4]
    t = kvattn.from_dlpack(a)
    assert t.strides == (5, 1)
    assert not t.is_contiguous()
    np.testing.assert_array_equal(np.from_dlpack(t.contiguous()), a)


def test_bf16_conversion_is_round_to_nearest_even():
    a = np.array([1.0, 1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8], dtype=np.float32)
    bf = kvattn.from_dlpack(a).to_dtype("bfloat16")
    assert bf.dtype == "bfloat16"
    assert bf.tolist() == [1.0, 1.0, 1.0 + 2.0**-6]


def test_errors_become_python_exceptions():
    t = kvattn.zeros([2, 3])
    with pytest.raises(ValueError, match=r"\[4, 2\]"):
        t.view([4, 2])
    with pytest.raises(ValueError, match="valid dtypes"):
        kvattn.zeros([2], "float64")
    with pytest.raises(ValueError, match="__dlpack__"):
        kvattn.from_dlpack([1, 2, 3])
    if not kvattn.built_with_cuda():
        with pytest.raises(NotImplementedError, match="CUDA"):
            kvattn.zeros([2], "float32", "cuda")


def test_array_interface_gives_writable_zero_copy_numpy_views():
    t = kvattn.zeros([3, 4], "int32")
    a = np.asarray(t)
    assert a.flags.writeable and a.ctypes.data == t.data_ptr() and a.dtype == np.int32
    a[1, 2] = 7
    assert t.tolist()[6] == 7.0
    del t  # the array keeps the storage alive (its base is the Tensor)
    a[0, 0] = 1
    assert a.sum() == 8
    with pytest.raises(ValueError, match="NumPy dtype"):
        np.asarray(kvattn.zeros([2], "bfloat16")).sum()


def test_results_come_back_in_the_callers_framework():
    seq = np.array([5, 9], np.int32)
    got = kvattn.get_dcp_local_seq_lens(seq, 2, 0)
    assert isinstance(got, np.ndarray) and got.flags.writeable
    np.testing.assert_array_equal(got, [3, 5])
    kt = kvattn.from_dlpack(seq)
    assert isinstance(kvattn.get_dcp_local_seq_lens(kt, 2, 0), kvattn.Tensor)
    assert kvattn.framework_of(seq) == "numpy" and kvattn.framework_of(kt) == "kvattn"


def test_bool_arrays_and_dtype_spellings():
    b = np.array([True, False, True])
    t = kvattn.from_dlpack(b)
    assert t.dtype == "uint8" and t.data_ptr() == b.ctypes.data and t.tolist() == [1.0, 0.0, 1.0]
    for d in ("float16", np.float16, np.dtype("float16"), "torch.float16", "half"):
        assert kvattn.FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=8, dtype=d).dtype == "float16"


def test_dlpack_capsule_is_consumed_once():
    a = np.arange(4, dtype=np.float32)
    cap = a.__dlpack__()
    t = kvattn.from_dlpack(cap)
    assert t.data_ptr() == a.ctypes.data
    with pytest.raises(ValueError, match="consumed"):
        kvattn.from_dlpack(cap)
