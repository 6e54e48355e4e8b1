"""pip packaging of the kvattn Python module: setuptools drives the project's CMake build and
builds only the ``_kvattn`` target (with the kvattn libraries it links).  Nothing is
downloaded: CMake finds the system's pybind11, fmt, spdlog, ... (Debian: pybind11-dev,
python3-dev, libfmt-dev, libspdlog-dev, nlohmann-json3-dev, libcli11-dev, libdlpack-dev).

On Debian 12 (PEP 668: the system interpreter is "externally managed"), install into a
virtual environment that sees Debian's numpy/setuptools:

    /usr/bin/python3 -m venv --system-site-packages .venv
    .venv/bin/pip install -v --no-build-isolation .             # CPU only
    KVATTN_CUDA=ON .venv/bin/pip install -v --no-build-isolation .   # + CUDA kernels

``-v`` shows the build's progress (``[12/80] Building CXX object ...``); without it pip prints
only "still running...".

Environment knobs:
    KVATTN_CUDA=OFF|ON|AUTO            CUDA kernels: OFF (default) builds the CPU kernels only;
                                       ON builds the CUDA kernels too (needs nvcc) for the GPU
                                       present (nvidia-smi), else for sm_90a + sm_80; AUTO: ON
                                       when nvcc is found
    KVATTN_CUDA_ARCHS="90a;80"         CUDA architectures to build (overrides the detection)
    KVATTN_CMAKE_BUILD_DIR=<dir>       reuse an existing CMake build directory
    KVATTN_CMAKE_ARGS="-D..."          extra CMake arguments
    CMAKE_BUILD_PARALLEL_LEVEL=<n>     parallel build jobs (default: the machine's cores)
"""
import os
import shlex
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.abspath(__file__))
CUDA_CHOICES = ("OFF", "ON", "AUTO")
DEFAULT_CUDA_ARCHS = "90a;80"


def cuda_arch_of_capability(cap):
    """CUDA architecture for a compute capability as nvidia-smi prints it ("9.0" -> "90a").

    kvattn's CUDA kernels are written for sm_90a (Hopper) and sm_80 (Ampere; its code also
    runs on 8.6 / 8.9).  Returns None for a GPU neither covers."""
    try:
        major, minor = (int(x) for x in cap.strip().split("."))
    except ValueError:
        return None
    if (major, minor) == (9, 0):
        return "90a"
    if major == 8:
        return "80"
    return None


def detect_cuda_archs(run=subprocess.run):
    """Architectures of the GPUs present ("90a", "80" or both), or None when nvidia-smi is
    missing, reports no GPU, or reports one kvattn has no kernels for."""
    try:
        res = run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                  capture_output=True, text=True, check=False)
    except OSError:
        return None
    if res.returncode != 0:
        return None
    archs = []
    for line in res.stdout.splitlines():
        if not line.strip():
            continue
        arch = cuda_arch_of_capability(line)
        if arch is None:
            return None
        if arch not in archs:
            archs.append(arch)
    return ";".join(archs) or None


def cmake_configure_args(env, build_dir, python=sys.executable, detect=detect_cuda_archs):
    """The CMake configure command for ``env`` (a mapping like os.environ) and a note saying
    what will be built.  ValueError for an unknown KVATTN_CUDA value."""
    cuda = env.get("KVATTN_CUDA", "OFF").upper()
    if cuda not in CUDA_CHOICES:
        raise ValueError(f"KVATTN_CUDA={env.get('KVATTN_CUDA')!r}: choose one of {', '.join(CUDA_CHOICES)} "
                         "(OFF: CPU kernels only, the default; ON: CUDA kernels too)")
    args = [
        "cmake", "-S", ROOT, "-B", build_dir,
        "-DCMAKE_BUILD_TYPE=Release",
        f"-DKVATTN_CUDA={cuda}",
        f"-DPython3_EXECUTABLE={python}",
        "-DKVATTN_BUILD_TESTS=OFF",
        "-DKVATTN_BUILD_BENCHMARKS=OFF",
        "-DKVATTN_BUILD_PYTHON=ON",
    ]
    note = "CPU kernels only (KVATTN_CUDA=ON adds the CUDA kernels)"
    if cuda != "OFF":
        archs = env.get("KVATTN_CUDA_ARCHS") or detect() or DEFAULT_CUDA_ARCHS
        args.append(f"-DKVATTN_CUDA_ARCHS={archs}")
        note = f"CUDA kernels for sm_{archs.replace(';', ' + sm_')}" + (" when nvcc is found" if cuda == "AUTO" else "")
    if shutil.which("ninja") and not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
        args += ["-G", "Ninja"]
    args += shlex.split(env.get("KVATTN_CMAKE_ARGS", ""))
    return args, note


def cmake_build_args(env, build_dir):
    jobs = env.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 1)
    return ["cmake", "--build", build_dir, "--target", "_kvattn", "--parallel", jobs]


def _main():
    from setuptools import Extension, setup
    from setuptools.command.build_ext import build_ext
    from setuptools.command.egg_info import egg_info

    class CMakeExtension(Extension):
        def __init__(self, name):
            super().__init__(name, sources=[])

    class CMakeBuild(build_ext):
        """Configures the kvattn CMake project and builds the ``_kvattn`` target only."""

        def build_extension(self, ext):
            build_dir = os.path.abspath(os.environ.get("KVATTN_CMAKE_BUILD_DIR")
                                        or os.path.join(self.build_temp, "cmake"))
            os.makedirs(build_dir, exist_ok=True)
            configure, note = cmake_configure_args(os.environ, build_dir)
            print(f"kvattn: building the _kvattn extension in {build_dir}: {note}", flush=True)
            subprocess.run(configure, check=True)
            subprocess.run(cmake_build_args(os.environ, build_dir), check=True)

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
        license="Apache-2.0",
        packages=["kvattn"],
        package_dir={"kvattn": "python/kvattn"},
        ext_modules=[CMakeExtension("kvattn._kvattn")],
        cmdclass={"build_ext": CMakeBuild, "egg_info": EggInfoInBuild},
        python_requires=">=3.9",
        install_requires=[],
        extras_require={"numpy": ["numpy"], "torch": ["torch"]},
        zip_safe=False,
    )


if __name__ == "__main__":
    _main()
