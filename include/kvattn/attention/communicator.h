// kvattn/attention/communicator.h — the decode-context-parallel (DCP) group and the
// cross-rank combine of partial attention results (vLLM get_dcp_group(), cp_lse_ag_out_rs and
// dcp_a2a_lse_reduce of vllm/v1/attention/ops/dcp.py).
//
// Under DCP every rank holds a token-interleaved shard of each request's KV.  A rank
// all-gathers the query over heads ([T, H, D] -> [T, W*H, D]), attends over its local shard
// with the W*H heads, returning (out, lse); the combine rescales every rank's partial output by
// exp(lse_r - lse_global) and reduce-scatters over heads, so rank r ends with heads
// [r*H, (r+1)*H) of the exact attention.
//
// Two transports implement DcpCommunicator:
//   * InProcessDcpGroup — W ranks as threads of one process; collectives rendezvous on a
//     barrier and move data through host memory (CPU or CUDA tensors).  The tests' and the
//     CPU engine's transport.
//   * NcclDcpGroup — W ranks on W GPUs of this process (one thread drives each rank), the
//     collectives are NCCL's.  Built when NCCL is found (NcclDcpGroup::available()).
// Every rank of a group must call the same collectives in the same order (as NCCL requires);
// results are ordered after the rank's earlier work on its device (same stream).  A rank that
// fails outside a collective calls its group's abort() so its peers throw instead of waiting
// (NCCL: ncclCommAbort stops the kernels waiting for the failed rank).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kvattn/core/tensor.h"

namespace kvattn {

class DcpCommunicator {
 public:
  virtual ~DcpCommunicator() = default;
  virtual int64_t world_size() const = 0;
  virtual int64_t rank() const = 0;
  // Concatenation of every rank's `t` along `dim` (rank order).  Shapes must match.
  virtual Tensor all_gather(const Tensor& t, int dim) = 0;
  // Sum over ranks of `t`, then this rank's slice [rank*n/W, (rank+1)*n/W) along `dim`.
  // Float dtypes only; the sum is in `t`'s dtype (pass f32 for an exact-enough sum).
  virtual Tensor reduce_scatter(const Tensor& t, int dim) = 0;
  // Splits `t` along `dim` into W equal parts, sends part j to rank j; returns the W parts
  // received stacked in a new leading dimension [W, ...] (rank order).
  virtual Tensor all_to_all(const Tensor& t, int dim) = 0;
  // "in-process" or "nccl".
  virtual const char* transport() const noexcept = 0;
};

// W ranks in one process.  Create once, hand communicator(r) to the thread running rank r.
class InProcessDcpGroup {
 public:
  explicit InProcessDcpGroup(int64_t world_size);
  ~InProcessDcpGroup();
  int64_t world_size() const noexcept { return world_size_; }
  DcpCommunicator& communicator(int64_t rank);
  // Called by a rank's thread that failed outside a collective: every rank waiting in a
  // collective, and every later collective, throws instead of waiting for it forever.  The
  // group cannot be used again.
  void abort() noexcept;

 private:
  class Rank;
  friend class Rank;
  void sync();  // the barrier: every rank arrives; throws once the group was aborted
  int64_t world_size_;
  std::vector<Tensor> slots_;  // one contribution per rank (contiguous host copies)
  // An abortable barrier (std::barrier cannot release its waiters on a failure).
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t arrived_ = 0;
  uint64_t generation_ = 0;
  bool aborted_ = false;
  std::vector<std::unique_ptr<Rank>> ranks_;
};

// W ranks on the GPUs `devices` (distinct CUDA ordinals) of this process, over NCCL
// (ncclCommInitAll).  Rank r's tensors must live on cuda:devices[r]; its collectives run on
// that device's default stream.  Throws Unsupported in builds without NCCL, InvalidArgument
// for a bad device list.
class NcclDcpGroup {
 public:
  static bool available() noexcept;  // this build has NCCL
  explicit NcclDcpGroup(const std::vector<int>& devices);
  ~NcclDcpGroup();
  NcclDcpGroup(const NcclDcpGroup&) = delete;
  NcclDcpGroup& operator=(const NcclDcpGroup&) = delete;
  int64_t world_size() const noexcept;
  DcpCommunicator& communicator(int64_t rank);
  // e.g. "NCCL 2.27.7, 2 ranks on cuda:0 cuda:1".
  std::string describe() const;
  // Called by a rank's thread that failed outside a collective: aborts every comm of the group
  // (ncclCommAbort), so peers whose device work waits for the failed rank get their streams back,
  // and every later collective throws.  Waits for ranks inside an NCCL enqueue call to leave it.
  // The group cannot be used again.
  void abort() noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// ---------------------------------------------------------------------------------------
// Combines (vLLM's is_lse_base_on_e selects exp vs exp2 for the LSE); any device, through
// ops::dcp_lse_scale_pack / ops::dcp_lse_combine and the group's collectives.
//   cp_attn_out [T, W*H, D] f32/f16/bf16: this rank's partial output over its shard
//   cp_attn_lse [T, W*H] f32: its LSE (-inf for rows that saw no key)
// Returns out [T, H, D] (dtype of cp_attn_out) = this rank's heads of the combined attention;
// when lse_out is given it receives the combined LSE [T, H] f32 in the same base.
Tensor cp_lse_ag_out_rs(const Tensor& cp_attn_out, const Tensor& cp_attn_lse, DcpCommunicator& group,
                        bool is_lse_base_on_e, Tensor* lse_out = nullptr);
// Same result through all-to-all (vLLM's "a2a" DCP communication backend).
Tensor dcp_a2a_lse_reduce(const Tensor& cp_attn_out, const Tensor& cp_attn_lse, DcpCommunicator& group,
                          bool is_lse_base_on_e, Tensor* lse_out = nullptr);

}  // namespace kvattn
