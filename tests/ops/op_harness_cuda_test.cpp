// The op harness's CUDA cases (op_harness.h): every public op x dtype x KV layout x kernel path
// on the GPU against the CPU oracle, with guard bytes checked on the copies brought back.  They
// skip without a GPU (and below a path's compute capability).  Run them all with
//   test_ops_cuda --gtest_filter='*/OpHarness.*'
#include "op_harness.h"

namespace kvattn::ops::harness {
namespace {

KVATTN_OP_HARNESS_INSTANTIATE(Dev::cuda);

}  // namespace
}  // namespace kvattn::ops::harness
