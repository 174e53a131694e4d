#include "comm/nccl_communicator.h"

#include <nccl.h>

#include <numeric>

namespace spw::comm {
namespace {

#define SPW_NCCL_TRY(call)                                                                 \
  do {                                                                                     \
    const ncclResult_t spw_nccl_r_ = (call);                                               \
    if (spw_nccl_r_ != ncclSuccess)                                                        \
      return make_error(#call, " failed: ", ncclGetErrorString(spw_nccl_r_));              \
  } while (0)

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int rank, int size, cudaStream_t stream)
      : comm_(comm), rank_(rank), size_(size), stream_(stream) {}
  ~NcclCommunicator() override { ncclCommDestroy(comm_); }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend() const override { return "nccl"; }

  Status all_reduce(const float* in, float* out, size_t n) override {
    SPW_NCCL_TRY(ncclAllReduce(in, out, n, ncclFloat32, ncclSum, comm_, stream_));
    return {};
  }
  Status all_gather(const float* in, size_t n, float* out) override {
    SPW_NCCL_TRY(ncclAllGather(in, out, n, ncclFloat32, comm_, stream_));
    return {};
  }
  Status reduce_scatter(const float* in, size_t n, float* out) override {
    SPW_NCCL_TRY(ncclReduceScatter(in, out, n, ncclFloat32, ncclSum, comm_, stream_));
    return {};
  }
  Status all_to_all(const float* in, std::span<const size_t> send_counts, float* out,
                    std::span<const size_t> recv_counts) override {
    if (send_counts.size() != size_t(size_) || recv_counts.size() != size_t(size_))
      return make_error("all_to_all: ", send_counts.size(), " send and ", recv_counts.size(), " receive counts for ",
                        size_, " ranks");
    SPW_NCCL_TRY(ncclGroupStart());
    size_t sent = 0, received = 0;
    for (int j = 0; j < size_; ++j) {
      if (send_counts[size_t(j)] > 0)
        SPW_NCCL_TRY(ncclSend(in + sent, send_counts[size_t(j)], ncclFloat32, j, comm_, stream_));
      if (recv_counts[size_t(j)] > 0)
        SPW_NCCL_TRY(ncclRecv(out + received, recv_counts[size_t(j)], ncclFloat32, j, comm_, stream_));
      sent += send_counts[size_t(j)];
      received += recv_counts[size_t(j)];
    }
    SPW_NCCL_TRY(ncclGroupEnd());
    return {};
  }

 private:
  ncclComm_t comm_;
  int rank_, size_;
  cudaStream_t stream_;
};

}  // namespace

Result<std::vector<std::unique_ptr<Communicator>>> make_nccl_group(std::span<const int> devices,
                                                                   std::span<const cudaStream_t> streams) {
  if (devices.empty() || devices.size() != streams.size())
    return make_error("make_nccl_group: ", devices.size(), " devices and ", streams.size(), " streams");
  std::vector<ncclComm_t> comms(devices.size());
  SPW_NCCL_TRY(ncclCommInitAll(comms.data(), int(devices.size()), devices.data()));
  std::vector<std::unique_ptr<Communicator>> out;
  for (size_t i = 0; i < devices.size(); ++i)
    out.push_back(std::make_unique<NcclCommunicator>(comms[i], int(i), int(devices.size()), streams[i]));
  return out;
}

}  // namespace spw::comm
