// Builds against an installed kvattn and checks a real value.
#include <kvattn/core/tensor.h>

#include <cstdio>

int main() {
  kvattn::Tensor t = kvattn::Tensor::zeros({2, 3}, kvattn::DType::bf16);
  t.set({1, 2}, 1.5);
  const double v = t.permute({1, 0}).get({2, 1});
  std::printf("consumer: %g\n", v);
  return v == 1.5 ? 0 : 1;
}
