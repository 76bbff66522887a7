// Collectives on raw npu buffers over a ShmComm. Every entry point runs on the group's
// communication stream, is called by all ranks in the same order, and follows one
// pattern: publish a header and buffer offsets, barrier, check that all ranks called the
// same thing, move data by reading peers' buffers in place, barrier (so nobody reuses a
// buffer a peer still reads).
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <vector>

#include "comm.h"
#include "shm_comm.h"

namespace torch_npu::distributed {

enum class Coll : uint32_t { Broadcast = 1, Allreduce, Reduce, Allgather, ReduceScatter, AllToAll, Gather, Scatter, Barrier };
enum class RedOp : int32_t { Sum, Avg, Product, Min, Max, Band, Bor, Bxor };

const char* redop_name(RedOp op);
// Raises (before any communication) if `op` makes no sense for `dtype`.
void check_reduction(c10::ScalarType dtype, RedOp op);

// All-reduce algorithms: "oneshot" (every rank reduces the whole buffer from all peers into
// a private scratch, then copies it back: 2 barriers, best for small messages) and
// "twoshot" (reduce-scatter then all-gather, each rank reducing 1/size of the buffer in
// place from all peers and then copying the other parts from their owners: no second copy
// of the tensor, traffic O(bytes), best for large ones). HCCL_ALGO=oneshot|twoshot forces one.
enum class Algo { Auto, OneShot, TwoShot };
Algo algo_from_env();

void broadcast(ShmComm& c, const OpDesc& op, void* data, int64_t numel, c10::ScalarType dtype, int root);
void allreduce(ShmComm& c, const OpDesc& op, void* data, int64_t numel, c10::ScalarType dtype, RedOp redop);
void reduce(ShmComm& c, const OpDesc& op, void* data, int64_t numel, c10::ScalarType dtype, RedOp redop, int root);
// outs: one buffer of numel elements per rank.
void allgather(ShmComm& c, const OpDesc& op, const void* in, int64_t numel, c10::ScalarType dtype,
               const std::vector<void*>& outs);
// ins: one chunk of numel elements per rank (chunk r is reduced into rank r's out).
void reduce_scatter(ShmComm& c, const OpDesc& op, const std::vector<const void*>& ins, void* out, int64_t numel,
                    c10::ScalarType dtype, RedOp redop);
// ins[r] (send_bytes[r]) goes to rank r; outs[r] (recv_bytes[r]) comes from rank r.
void alltoall(ShmComm& c, const OpDesc& op, c10::ScalarType dtype, const std::vector<const void*>& ins,
              const std::vector<uint64_t>& send_bytes, const std::vector<void*>& outs,
              const std::vector<uint64_t>& recv_bytes);
// outs only on the root.
void gather(ShmComm& c, const OpDesc& op, const void* in, int64_t numel, c10::ScalarType dtype,
            const std::vector<void*>& outs, int root);
// ins only on the root.
void scatter(ShmComm& c, const OpDesc& op, const std::vector<const void*>& ins, void* out, int64_t numel,
             c10::ScalarType dtype, int root);
void barrier(ShmComm& c, const OpDesc& op);

// ---- the same collectives on a Comm: the functions above when the group is on one host,
// hierarchical (src/hierarchical.cpp) when it spans hosts. Same arguments. -------------
void broadcast(Comm& c, const OpDesc& op, void* data, int64_t numel, c10::ScalarType dtype, int root);
void allreduce(Comm& c, const OpDesc& op, void* data, int64_t numel, c10::ScalarType dtype, RedOp redop);
void reduce(Comm& c, const OpDesc& op, void* data, int64_t numel, c10::ScalarType dtype, RedOp redop, int root);
void allgather(Comm& c, const OpDesc& op, const void* in, int64_t numel, c10::ScalarType dtype,
               const std::vector<void*>& outs);
void reduce_scatter(Comm& c, const OpDesc& op, const std::vector<const void*>& ins, void* out, int64_t numel,
                    c10::ScalarType dtype, RedOp redop);
void alltoall(Comm& c, const OpDesc& op, c10::ScalarType dtype, const std::vector<const void*>& ins,
              const std::vector<uint64_t>& send_bytes, const std::vector<void*>& outs,
              const std::vector<uint64_t>& recv_bytes);
void gather(Comm& c, const OpDesc& op, const void* in, int64_t numel, c10::ScalarType dtype,
            const std::vector<void*>& outs, int root);
void scatter(Comm& c, const OpDesc& op, const std::vector<const void*>& ins, void* out, int64_t numel,
             c10::ScalarType dtype, int root);
void barrier(Comm& c, const OpDesc& op);

// ---- building blocks (algorithms.cpp), shared with hierarchical.cpp -------------------
// dst[i] = src[0][i] op ... op src[nsrc-1][i]; dst may be one of the srcs.
void reduce_into(void* dst, const void* const* src, int nsrc, size_t n, c10::ScalarType dtype, RedOp op);
// data[i] *= factor (floating types: AVG = SUM, then this).
void scale(void* data, size_t n, c10::ScalarType dtype, double factor);
// AVG after a SUM over `size` ranks: data[i] / size (integers: truncated).
void average(void* data, size_t n, c10::ScalarType dtype, int size);
// Fills this rank's header in its slot.
void publish(ShmComm& c, const OpDesc& op, Coll coll, c10::ScalarType dtype, int64_t count, int root, int redop);
bool same_call(const OpHeader& a, const OpHeader& b);
std::string describe(const OpHeader& h);  // "allreduce #7 of 1024 elements of Float, SUM"
// Arena offset of a buffer (0 for an empty one).
uint64_t off(ShmComm& c, const void* p, size_t nbytes);

}  // namespace torch_npu::distributed
