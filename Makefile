# kvattn — the two commands:
#   make run    installs what is missing, builds (CPU release), runs the main job
#   make test   installs what is missing, builds, runs every test (release, then ASan/UBSan
#               with the fuzz targets, then the Python tests)
# Other targets: build, build-asan, bench, cuda (build with nvcc), install, clean.
JOBS ?= $(shell nproc)
PREFIX ?= /usr/local
RELEASE := build/cpu-release
ASAN := build/asan-ubsan

.PHONY: run test deps build build-asan test-release test-asan bench cuda install clean

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

test-release: build
	ctest --test-dir $(RELEASE) -L 'unit|fuzz|cuda' --output-on-failure -j $(JOBS)

test-asan: build-asan
	ctest --test-dir $(ASAN) -L 'unit|fuzz' --output-on-failure -j $(JOBS)

test: test-release test-asan

bench: build
	$(RELEASE)/bench/bench_host

cuda: deps
	cmake --preset cuda-release && cmake --build build/cuda-release -j $(JOBS)

install: build
	cmake --install $(RELEASE) --prefix $(PREFIX)

clean:
	rm -rf build
