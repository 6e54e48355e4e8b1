# kvattn — the two commands:
#   make run    installs what is missing, builds (CPU release), runs the main job
#   make test   installs what is missing, builds, runs every test: the release build with the
#               Python tests, then a clang AddressSanitizer + UBSan build that runs every unit
#               test and each libFuzzer target for a bounded time, and compiles the CUDA sources
#               when nvcc is installed
# Other targets: build, build-asan (g++ ASan/UBSan), test-asan, test-sanitize, bench, cuda
# (build with nvcc), install, clean.
JOBS ?= $(shell nproc)
PREFIX ?= /usr/local
RELEASE := build/cpu-release
ASAN := build/asan-ubsan
FUZZ := build/fuzz

.PHONY: run test deps build build-asan test-release test-asan test-sanitize test-fuzz cuda-compile bench cuda install clean

deps:
	@scripts/install-deps.sh

$(RELEASE)/build.ninja: | deps
	cmake --preset cpu-release

$(ASAN)/build.ninja: | deps
	cmake --preset asan-ubsan

build: deps $(RELEASE)/build.ninja
	cmake --build $(RELEASE) -j $(JOBS)

build-asan: deps $(ASAN)/build.ninja
	cmake --build $(ASAN) -j $(JOBS)

run: build
	$(RELEASE)/tools/kvattn run

# ctest starts the longest tests first when it knows their times (each run writes them to
# Testing/Temporary/CTestCostData.txt); a fresh build directory starts from tests/ctest_costs/
# (times measured on 2 cores), so the few long tests do not end up last, alone on one core.
seed_costs = @mkdir -p $(1)/Testing/Temporary && { test -s $(1)/Testing/Temporary/CTestCostData.txt || \
  cp tests/ctest_costs/$(2).txt $(1)/Testing/Temporary/CTestCostData.txt; }

test-release: build
	$(call seed_costs,$(RELEASE),release)
	ctest --test-dir $(RELEASE) -L 'unit|fuzz|cuda' --output-on-failure -j $(JOBS)

test-asan: build-asan
	$(call seed_costs,$(ASAN),sanitize)
	ctest --test-dir $(ASAN) -L 'unit|fuzz' --output-on-failure -j $(JOBS)

# One sanitizer build for `make test` (clang; the `fuzz` preset): AddressSanitizer + UBSan on
# every unit test, and the fuzz targets under libFuzzer, each fuzzing for KVATTN_FUZZ_SECONDS
# (10 s) from its seed corpus (fuzz/corpus/) and its crash reproducers (fuzz/regressions/).
# Without clang++ the g++ ASan/UBSan build (test-asan) runs instead, with the fuzz targets'
# corpora replayed by the deterministic driver.
CLANGXX := $(shell command -v clang++ 2>/dev/null)
test-sanitize: deps
ifneq ($(CLANGXX),)
	cmake --preset fuzz >/dev/null
	cmake --build $(FUZZ) -j $(JOBS)
	$(call seed_costs,$(FUZZ),sanitize)
	ctest --test-dir $(FUZZ) -L 'unit|fuzz' --output-on-failure -j $(JOBS)
else
	@echo "test-sanitize: clang++ not found (scripts/install-deps.sh installs it); running the g++ ASan build"
	$(MAKE) test-asan
endif

# The fuzz targets alone (the same build, only what they link).
test-fuzz: deps
	cmake --preset fuzz >/dev/null
	cmake --build $(FUZZ) -j $(JOBS) --target fuzz_targets
	$(call seed_costs,$(FUZZ),sanitize)
	ctest --test-dir $(FUZZ) -L fuzz --output-on-failure -j $(JOBS)

test: test-release test-sanitize cuda-compile

# Compiles every CUDA source (sm_90a and sm_80), the host files that exist only in CUDA builds
# (cuda/ folders), the NCCL communicator and the bench's CUDA half when nvcc is installed, so CI
# without a GPU still catches CUDA build breaks; skipped with a message otherwise.  Every other
# object is the CPU build's, already compiled by test-release, so only these are built here, and
# the tool's unity batches (its CUDA half is compiled inside them).
NVCC := $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
cuda-compile: deps
ifneq ($(NVCC),)
	cmake -S . -B build/cuda-compile -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVATTN_CUDA=ON \
	  -DKVATTN_BUILD_PYTHON=OFF -DKVATTN_BUILD_BENCHMARKS=OFF -DKVATTN_BUILD_TESTS=OFF >/dev/null
	objs=$$(ninja -C build/cuda-compile -t targets all | sed -n 's/^\([^:]*\(\/cuda\/\|nccl\|_cuda\.c\|kvattn\.dir\/Unity\/\)[^:]*\.o\):.*/\1/p'); \
	  test -n "$$objs" && ninja -C build/cuda-compile -j $(JOBS) $$objs
else
	@echo "cuda-compile: nvcc not found; CUDA sources not compiled"
endif

bench: build
	$(RELEASE)/bench/bench_host

cuda: deps
	cmake --preset cuda-release && cmake --build build/cuda-release -j $(JOBS)

install: build
	cmake --install $(RELEASE) --prefix $(PREFIX)

clean:
	rm -rf build
