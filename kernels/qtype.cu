// qtype.cu — host-side facts about the quant types the kernels decode, and the error
// detail hook. No kernels here.
#include "kernels/cuda_compat.cuh"
#include "kernels/kernels.h"

namespace kvscope::cuda {

std::string error_detail() {
#if defined(KVSCOPE_CUDA_EMU)
  return ::kvscope::emu::last_error_detail();
#else
  return {};
#endif
}

bool qtype_supported(int id) { return qtype_block_size(id) > 0; }

int qtype_block_size(int id) {
  switch (QType(id)) {
    case QType::F32: case QType::F16: case QType::BF16: return 1;
    case QType::Q4_0: case QType::Q4_1: case QType::Q5_0: case QType::Q5_1: case QType::Q8_0:
      return 32;
    case QType::Q4_K: case QType::Q5_K: case QType::Q6_K: return 256;
  }
  return 0;
}

int qtype_block_bytes(int id) {
  switch (QType(id)) {
    case QType::F32: return 4;
    case QType::F16: case QType::BF16: return 2;
    case QType::Q4_0: return 18;
    case QType::Q4_1: return 20;
    case QType::Q5_0: return 22;
    case QType::Q5_1: return 24;
    case QType::Q8_0: return 34;
    case QType::Q4_K: return 144;
    case QType::Q5_K: return 176;
    case QType::Q6_K: return 210;
  }
  return 0;
}

}  // namespace kvscope::cuda
