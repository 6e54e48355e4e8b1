"""The pip route's build decisions (setup.py): CPU kernels only unless KVATTN_CUDA asks for CUDA,
then for the GPU nvidia-smi reports (or KVATTN_CUDA_ARCHS), and the build's parallelism.
setup.py is imported as a module, so setup() does not run."""
import importlib.util
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("kvattn_setup", ROOT / "setup.py")
setup_py = importlib.util.module_from_spec(spec)
spec.loader.exec_module(setup_py)


def configure(env, detect=lambda: None):
    args, note = setup_py.cmake_configure_args(env, "/tmp/b", python="/usr/bin/python3", detect=detect)
    defs = dict(a[2:].split("=", 1) for a in args if a.startswith("-D"))
    return defs, note


def test_cpu_only_by_default():
    defs, note = configure({}, detect=lambda: pytest.fail("no GPU detection for a CPU build"))
    assert defs["KVATTN_CUDA"] == "OFF" and "KVATTN_CUDA_ARCHS" not in defs
    assert defs["KVATTN_BUILD_TESTS"] == "OFF" and defs["Python3_EXECUTABLE"] == "/usr/bin/python3"
    assert note.startswith("CPU kernels only")


def test_cuda_when_asked_for_the_gpu_present_or_as_told():
    defs, note = configure({"KVATTN_CUDA": "on"}, detect=lambda: "90a")
    assert defs["KVATTN_CUDA"] == "ON" and defs["KVATTN_CUDA_ARCHS"] == "90a" and "sm_90a" in note
    defs, note = configure({"KVATTN_CUDA": "ON"}, detect=lambda: None)  # no GPU visible: both
    assert defs["KVATTN_CUDA_ARCHS"] == "90a;80" and note == "CUDA kernels for sm_90a + sm_80"
    defs, _ = configure({"KVATTN_CUDA": "ON", "KVATTN_CUDA_ARCHS": "80"}, detect=lambda: "90a")
    assert defs["KVATTN_CUDA_ARCHS"] == "80"
    defs, _ = configure({"KVATTN_CUDA": "ON", "KVATTN_CMAKE_ARGS": "-DFOO=1 -DBAR=two"}, detect=lambda: "80")
    assert defs["FOO"] == "1" and defs["BAR"] == "two"
    with pytest.raises(ValueError, match="KVATTN_CUDA='yes': choose one of OFF, ON, AUTO"):
        configure({"KVATTN_CUDA": "yes"})


def test_gpu_detection_from_nvidia_smi():
    assert [setup_py.cuda_arch_of_capability(c) for c in ("9.0", "8.0", "8.6", "8.9", "10.0", "7.5", "x")] == [
        "90a", "80", "80", "80", None, None, None]

    def smi(stdout, rc=0):
        return lambda *a, **k: subprocess.CompletedProcess(a, rc, stdout=stdout, stderr="")

    assert setup_py.detect_cuda_archs(run=smi("9.0\n9.0\n")) == "90a"
    assert setup_py.detect_cuda_archs(run=smi("9.0\n8.0\n")) == "90a;80"
    assert setup_py.detect_cuda_archs(run=smi("10.0\n")) is None  # no kernels for it: the default set
    assert setup_py.detect_cuda_archs(run=smi("", rc=9)) is None

    def missing(*a, **k):
        raise FileNotFoundError("nvidia-smi")

    assert setup_py.detect_cuda_archs(run=missing) is None


def test_build_parallelism():
    assert setup_py.cmake_build_args({"CMAKE_BUILD_PARALLEL_LEVEL": "3"}, "/b")[-2:] == ["--parallel", "3"]
    assert setup_py.cmake_build_args({}, "/b")[3:5] == ["--target", "_kvattn"]
