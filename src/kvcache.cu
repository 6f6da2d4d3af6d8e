// The KV-cache call's append and combine kernels (sm80/kernel_kvcache.hpp), for every dtype: one
// translation unit, built with the sm80 family's architectures.
#include "flashcute/sm80/kernel_kvcache.hpp"

template flashcute::Status flashcute::sm80::launch_append_kv<0>(const flashcute::FwdParams&,
                                                                const flashcute::AppendKvParams&, cudaStream_t);
template flashcute::Status flashcute::sm80::launch_combine<0>(const flashcute::FwdParams&, flashcute::DType,
                                                              cudaStream_t);
