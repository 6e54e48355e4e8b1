"""pip packaging of the kvattn Python module: setuptools drives the project's CMake build and
builds only the ``_kvattn`` target (with the kvattn libraries it links).  Nothing is
downloaded: CMake finds the system's pybind11, fmt, spdlog, ... (Debian: pybind11-dev,
python3-dev, libfmt-dev, libspdlog-dev, nlohmann-json3-dev, libcli11-dev).

    pip install .                          # pip <= 23 with setuptools and wheel installed
    pip install --no-build-isolation .     # any pip, offline

Environment knobs:
    KVATTN_CUDA=AUTO|ON|OFF            build the CUDA kernels (default AUTO: when nvcc is found)
    KVATTN_CMAKE_BUILD_DIR=<dir>       reuse an existing CMake build directory
    KVATTN_CMAKE_ARGS="-D..."          extra CMake arguments
    CMAKE_BUILD_PARALLEL_LEVEL=<n>     parallel build jobs
"""
import os
import shlex
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.egg_info import egg_info

ROOT = os.path.dirname(os.path.abspath(__file__))


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    """Configures the kvattn CMake project and builds the ``_kvattn`` target only."""

    def build_extension(self, ext):
        build_dir = os.path.abspath(os.environ.get("KVATTN_CMAKE_BUILD_DIR") or os.path.join(self.build_temp, "cmake"))
        os.makedirs(build_dir, exist_ok=True)
        configure = [
            "cmake", "-S", ROOT, "-B", build_dir,
            "-DCMAKE_BUILD_TYPE=Release",
            f"-DKVATTN_CUDA={os.environ.get('KVATTN_CUDA', 'AUTO')}",
            f"-DPython3_EXECUTABLE={sys.executable}",
            "-DKVATTN_BUILD_TESTS=OFF",
            "-DKVATTN_BUILD_BENCHMARKS=OFF",
            "-DKVATTN_BUILD_PYTHON=ON",
        ]
        if shutil.which("ninja") and not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
            configure += ["-G", "Ninja"]
        configure += shlex.split(os.environ.get("KVATTN_CMAKE_ARGS", ""))
        subprocess.run(configure, check=True)
        build = ["cmake", "--build", build_dir, "--target", "_kvattn"]
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL")
        if jobs:
            build += ["--parallel", jobs]
        subprocess.run(build, check=True)

        # python/CMakeLists.txt puts the extension in <build>/python/kvattn/.
        built_pkg = os.path.join(build_dir, "python", "kvattn")
        candidates = [f for f in os.listdir(built_pkg) if f.startswith("_kvattn") and f.endswith((".so", ".pyd"))]
        if not candidates:
            raise RuntimeError(f"CMake built no _kvattn extension in {built_pkg}")
        target = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(os.path.join(built_pkg, candidates[0]), target)


class EggInfoInBuild(egg_info):
    """Keeps kvattn.egg-info under build/ (ignored) instead of the source tree's root."""

    def initialize_options(self):
        super().initialize_options()
        self.egg_base = os.path.join(ROOT, "build", "python-egg-info")
        os.makedirs(self.egg_base, exist_ok=True)


setup(
    name="kvattn",
    version="0.1.0",
    description="Paged KV cache, batch preparation and attention kernels of a vLLM-style serving engine",
    packages=["kvattn"],
    package_dir={"kvattn": "python/kvattn"},
    ext_modules=[CMakeExtension("kvattn._kvattn")],
    cmdclass={"build_ext": CMakeBuild, "egg_info": EggInfoInBuild},
    python_requires=">=3.9",
    install_requires=[],
    extras_require={"numpy": ["numpy"], "torch": ["torch"]},
    zip_safe=False,
)
