// flashcute/common/seqlen.hpp: where one batch entry's rows are, and how many there are.
//
// The one place a kernel learns the extent and the start of its sequences. Today every batch
// entry has seqlen_q queries and seqlen_k keys at a fixed batch stride; variable-length batches
// (cu_seqlens) and a paged KV cache change this constructor, not the kernels that use it.
#pragma once

#include <cstdint>

#include <cute/config.hpp>

#include "flashcute/common/params.hpp"

namespace flashcute {

struct FwdSeqlen {
  int seqlen_q;       // query rows of this batch entry
  int seqlen_k;       // keys of this batch entry
  int64_t q_offset;   // element offsets of row 0 of this batch entry, head 0
  int64_t k_offset;
  int64_t v_offset;
  int64_t o_offset;
  int64_t lse_offset;

  CUTE_HOST_DEVICE FwdSeqlen(const FwdParams& p, int batch)
      : seqlen_q(p.seqlen_q),
        seqlen_k(p.seqlen_k),
        q_offset(batch * p.q_batch_stride),
        k_offset(batch * p.k_batch_stride),
        v_offset(batch * p.v_batch_stride),
        o_offset(batch * p.o_batch_stride),
        lse_offset(batch * p.lse_batch_stride) {}
};

}  // namespace flashcute
