// flashcute/common/seqlen.hpp: where one batch entry's rows are, and how many there are.
//
// The one place a kernel learns the extent and the start of its sequences: every batch entry has
// seqlen_q queries and seqlen_k keys at a fixed batch stride, or, in a variable-length batch, the
// rows that cu_seqlens gives it (FwdParams). A paged KV cache changes this constructor too, not
// the kernels that use it.
#pragma once

#include <cstdint>

#include <cute/config.hpp>
#include <cute/numeric/math.hpp>

#include "flashcute/common/params.hpp"

namespace flashcute {

// Entry b of a cu_seqlens array, clamped into [lo, total]: whatever the device array holds, the
// rows a kernel derives from it stay inside the array they index.
CUTE_HOST_DEVICE int clamped_row(const int* cu_seqlens, int b, int lo, int total) {
  const int r = cu_seqlens[b];
  return r < lo ? lo : (r > total ? total : r);
}

// Sequence b of a varlen batch, from its cu_seqlens: its first rows and its lengths, clamped
// into [0, total] (a decreasing pair gives 0). FwdSeqlen and the sm90 varlen walk read it here.
struct VarlenRows {
  int q_start, k_start, seqlen_q, seqlen_k;
};
CUTE_HOST_DEVICE VarlenRows varlen_rows(const int* cu_q, const int* cu_k, int total_q, int total_k, int b) {
  VarlenRows r;
  r.q_start = clamped_row(cu_q, b, 0, total_q);
  r.k_start = clamped_row(cu_k, b, 0, total_k);
  r.seqlen_q = clamped_row(cu_q, b + 1, r.q_start, total_q) - r.q_start;
  r.seqlen_k = clamped_row(cu_k, b + 1, r.k_start, total_k) - r.k_start;
  return r;
}

// Entry b of a KV-cache call: its cache_seqlens entry plus the appended keys, clamped into
// [0, seqlen_k] (the capacity); without cache_seqlens, the whole capacity.
CUTE_HOST_DEVICE int cache_keys(const FwdParams& p, int batch) {
  if (p.cache_seqlens == nullptr) return p.seqlen_k;
  const int64_t used = int64_t(p.cache_seqlens[batch]) + p.seqlen_new;
  return used < 0 ? 0 : (used > p.seqlen_k ? p.seqlen_k : int(used));
}

struct FwdSeqlen {
  int seqlen_q;       // query rows of this batch entry
  int seqlen_k;       // keys of this batch entry
  int q_start = 0;    // varlen: this entry's first row of q/o (and column of lse), and of k/v
  int k_start = 0;
  int64_t q_offset;   // element offsets of row 0 of this batch entry, head 0
  int64_t k_offset;
  int64_t v_offset;
  int64_t o_offset;
  int64_t lse_offset;

  CUTE_HOST_DEVICE FwdSeqlen(const FwdParams& p, int batch) {
    if (p.cu_seqlens_q == nullptr) {
      seqlen_q = p.seqlen_q;
      seqlen_k = p.seqlen_k;
      q_offset = batch * p.q_batch_stride;
      k_offset = batch * p.k_batch_stride;
      v_offset = batch * p.v_batch_stride;
      o_offset = batch * p.o_batch_stride;
      lse_offset = batch * p.lse_batch_stride;
      seqlen_k = cache_keys(p, batch);  // a KV cache (device only): its filled length, clamped
      if (p.block_table != nullptr) k_offset = v_offset = 0;  // paged: each row finds its page
      return;
    }
    // Varlen (device only: the arrays are device memory). A decreasing pair gives length 0.
    const VarlenRows r = varlen_rows(p.cu_seqlens_q, p.cu_seqlens_k, p.total_q, p.total_k, batch);
    q_start = r.q_start, k_start = r.k_start, seqlen_q = r.seqlen_q, seqlen_k = r.seqlen_k;
    q_offset = q_start * p.q_row_stride;
    k_offset = k_start * p.k_row_stride;
    v_offset = k_start * p.v_row_stride;
    o_offset = q_start * p.o_row_stride;
    lse_offset = q_start;  // lse is (nheads, total_q) with unit row stride
  }
};

// A paged KV cache's page table, for one batch entry (FwdParams::block_table).
struct PagedKv {
  const int* table;  // this entry's row of block_table
  int max_pages;     // its length
  int num_pages;     // pages in the cache
  int log2;          // log2(page_size)

  CUTE_HOST_DEVICE PagedKv(const FwdParams& p, int batch)
      : table(p.block_table + batch * p.block_table_batch_stride),
        max_pages(p.max_pages_per_seq),
        num_pages(p.num_pages),
        log2(p.page_size_log2) {}

  // The page holding key `key` (>= 0), as the table says: the index is clamped into the table,
  // the entry is not (valid() tells).
  CUTE_DEVICE int page_of(int key) const { return table[index_of(key)]; }
  // The table index page_of reads for key `key`.
  CUTE_HOST_DEVICE int index_of(int key) const { return cute::min(key >> log2, max_pages - 1); }
  // Whether `page` is in the cache. A key on a page outside it is never read or written: the
  // attention gives the rows that see it NaN, the append drops it.
  CUTE_HOST_DEVICE bool valid(int page) const { return page >= 0 && page < num_pages; }
  // The row of key `key` (>= 0) on its page.
  CUTE_HOST_DEVICE uint32_t on_page(int key) const { return uint32_t(key) & ((1u << log2) - 1); }
  // Element offset of key `key`, on page `page`, in a cache whose pages are page_stride apart. An
  // invalid page gives page 0's, so no address outside the cache is ever formed.
  CUTE_DEVICE int64_t offset(int page, int key, int64_t page_stride, int64_t row_stride) const {
    return (valid(page) ? page : 0) * page_stride + on_page(key) * row_stride;
  }
};

// The backward's extra arrays: dout and dq have q's rows, dk and dv k's; dsum is (batch, nheads,
// seqlen_q) contiguous, or (nheads, total_q) for a varlen batch.
struct BwdSeqlen : FwdSeqlen {
  int64_t do_offset;
  int64_t dq_offset;
  int64_t dk_offset;
  int64_t dv_offset;
  int64_t dsum_offset;       // of this entry's row 0, head 0
  int64_t dsum_head_stride;  // between the heads of dsum

  CUTE_HOST_DEVICE BwdSeqlen(const BwdParams& p, int batch) : FwdSeqlen(p, batch) {
    if (p.cu_seqlens_q == nullptr) {
      do_offset = batch * p.do_batch_stride;
      dq_offset = batch * p.dq_batch_stride;
      dk_offset = batch * p.dk_batch_stride;
      dv_offset = batch * p.dv_batch_stride;
      dsum_offset = int64_t(batch) * p.nheads * p.seqlen_q;
      dsum_head_stride = p.seqlen_q;
    } else {
      do_offset = q_start * p.do_row_stride;
      dq_offset = q_start * p.dq_row_stride;
      dk_offset = k_start * p.dk_row_stride;
      dv_offset = k_start * p.dv_row_stride;
      dsum_offset = q_start;
      dsum_head_stride = p.total_q;
    }
  }
};

}  // namespace flashcute
