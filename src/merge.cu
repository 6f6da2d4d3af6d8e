// merge_attn_states' kernel (sm80/kernel_merge.hpp), for every dtype: one translation unit,
// built with the sm80 family's architectures.
#include "flashcute/sm80/kernel_merge.hpp"

template flashcute::Status flashcute::sm80::launch_merge<0>(const flashcute::MergeParams&, flashcute::DType,
                                                            cudaStream_t);
