// The two collectives a rank of a tensor- and expert-parallel group runs inside its forward (RankRole,
// model/parallel_model.h): the sum of the sublayers' partial outputs and the gather of the head's vocabulary blocks.
// Every rank calls them in the same order with the same sizes, from its own thread.
#include <cstring>

#include "comm/communicator.h"
#include "model/forward_context.h"

namespace spw::detail {

Status all_reduce_ranks(const RankRole& role, float* x, size_t count) {
  if (!role.comm) return {};
  if (auto st = role.comm->all_reduce(x, x, count); !st.ok())
    return make_error("rank ", role.comm->rank(), ": all_reduce of a sublayer output: ", st.error().message);
  return {};
}

Result<std::vector<float>> gather_vocab_blocks(const RankRole& role, const std::vector<float>& local, int n_rows) {
  comm::Communicator& comm = *role.comm;
  const size_t n_ranks = size_t(comm.size()), block = local.size() / size_t(n_rows);
  // all_gather gives rank-major blocks [rank, n_rows, block]; the logits are [n_rows, rank · block].
  std::vector<float> gathered(local.size() * n_ranks);
  if (auto st = comm.all_gather(local.data(), local.size(), gathered.data()); !st.ok())
    return make_error("rank ", comm.rank(), ": all_gather of the logits: ", st.error().message);
  std::vector<float> logits(gathered.size());
  for (size_t r = 0; r < n_ranks; ++r)
    for (size_t i = 0; i < size_t(n_rows); ++i)
      std::memcpy(logits.data() + (i * n_ranks + r) * block, gathered.data() + (r * size_t(n_rows) + i) * block,
                  sizeof(float) * block);
  return logits;
}

}  // namespace spw::detail
