// A deterministic fuzz driver for toolchains without libFuzzer (g++): feeds
// LLVMFuzzerTestOneInput every file named on the command line, or found in a directory named
// there (a seed corpus, crash reproducers), then --runs random inputs (sizes 0..4096, seeded
// by --seed).  Any exception escaping the target or any sanitizer report fails the run.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  long runs = 10000;
  unsigned long seed = 1;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--runs=", 0) == 0) runs = std::strtol(a.c_str() + 7, nullptr, 10);
    else if (a.rfind("--seed=", 0) == 0) seed = std::strtoul(a.c_str() + 7, nullptr, 10);
    else if (std::filesystem::is_directory(a)) {
      std::vector<std::string> in_dir;
      for (const auto& e : std::filesystem::directory_iterator(a))
        if (e.is_regular_file()) in_dir.push_back(e.path().string());
      std::sort(in_dir.begin(), in_dir.end());
      files.insert(files.end(), in_dir.begin(), in_dir.end());
    } else if (std::filesystem::exists(a)) {
      files.push_back(a);
    }  // a corpus folder that does not exist yet holds no input
  }
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "fuzz: cannot read %s\n", f.c_str());
      return 1;
    }
    std::vector<uint8_t> buf((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    LLVMFuzzerTestOneInput(buf.data(), buf.size());
  }
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> buf;
  for (long r = 0; r < runs; ++r) {
    // Mostly small inputs (where parsers branch most), sometimes large ones.
    const size_t size = (r % 16 == 0) ? rng() % 4097 : rng() % 257;
    buf.resize(size);
    for (auto& b : buf) b = static_cast<uint8_t>(rng());
    LLVMFuzzerTestOneInput(buf.data(), buf.size());
  }
  std::printf("fuzz: %ld random inputs, %zu files, no failure\n", runs, files.size());
  return 0;
}
