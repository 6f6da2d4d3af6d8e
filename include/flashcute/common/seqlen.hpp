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

// The backward's extra arrays: dout and dq have q's rows, dk and dv k's; dsum is (batch, nheads,
// seqlen_q) contiguous.
struct BwdSeqlen : FwdSeqlen {
  int64_t do_offset;
  int64_t dq_offset;
  int64_t dk_offset;
  int64_t dv_offset;
  int64_t dsum_offset;

  CUTE_HOST_DEVICE BwdSeqlen(const BwdParams& p, int batch)
      : FwdSeqlen(p, batch),
        do_offset(batch * p.do_batch_stride),
        dq_offset(batch * p.dq_batch_stride),
        dk_offset(batch * p.dk_batch_stride),
        dv_offset(batch * p.dv_batch_stride),
        dsum_offset(int64_t(batch) * p.nheads * p.seqlen_q) {}
};

}  // namespace flashcute
