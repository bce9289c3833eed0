// decode_graph.cpp — see decode_graph.h.
#include "engine/cuda/decode_graph.h"

#include <cstring>
#include <string>

#include "kernels/kernels.h"

namespace kvscope {
namespace {

Status check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::Ok();
  std::string s = std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ")";
  const std::string d = kvscope::cuda::error_detail();
  if (!d.empty()) s += ": " + d;
  return make_error("cuda: ", what, " failed: ", s);
}

}  // namespace

DecodeGraph::~DecodeGraph() {
  for (Cached& c : graphs_) cudaGraphExecDestroy(c.exec);
  if (params_dev_) cudaFree(params_dev_);
}

namespace {
constexpr size_t kStageAlign = 16;
constexpr size_t kParamsBytes =
    (sizeof(DecodeGraph::Params) + kStageAlign - 1) / kStageAlign * kStageAlign;
}  // namespace

Status DecodeGraph::init(cudaStream_t stream, size_t staged_bytes) {
  stream_ = stream;
  cap_ = (staged_bytes + kStageAlign - 1) / kStageAlign * kStageAlign;
  staged_.assign(kParamsBytes + cap_, 0);
  return check(cudaMalloc(reinterpret_cast<void**>(&params_dev_), kParamsBytes + cap_),
               "allocating the decode step parameters");
}

void DecodeGraph::begin(int32_t token) {
  recording_ = true;
  graphable_ = true;
  have_pos0_ = false;
  params_host_ = Params{token, 0};
  used_ = 0;
  ++serial_;
  key_.clear();
  launches_.clear();
}

const void* DecodeGraph::stage(const void* src, size_t bytes) {
  const size_t need = (bytes + kStageAlign - 1) / kStageAlign * kStageAlign;
  if (!recording_ || used_ + need > cap_) return nullptr;
  std::memcpy(staged_.data() + kParamsBytes + used_, src, bytes);
  const void* dev = reinterpret_cast<const unsigned char*>(params_dev_) + kParamsBytes + used_;
  used_ += need;
  return dev;
}

bool DecodeGraph::use_pos0(int pos0) {
  if (!have_pos0_) {
    have_pos0_ = true;
    params_host_.pos0 = pos0;
    return true;
  }
  if (params_host_.pos0 == pos0) return true;
  graphable_ = false;
  return false;
}

void DecodeGraph::add(std::vector<int64_t> key, Launch launch) {
  key_.push_back(int64_t(key.size()));
  key_.insert(key_.end(), key.begin(), key.end());
  launches_.push_back(std::move(launch));
}

Status DecodeGraph::run_eagerly() {
  ++eager_steps_;
  for (Launch& l : launches_) KV_TRY(check(l(), "a decode step kernel"));
  return Status::Ok();
}

Status DecodeGraph::flush() {
  if (!recording_) return Status::Ok();
  recording_ = false;
  // Pageable source: the call returns once the bytes are staged, so params_host_ may
  // change afterwards; the copy is ordered before the launches below on the stream.
  // One copy: Params and whatever the step staged after them.
  std::memcpy(staged_.data(), &params_host_, sizeof(Params));
  const size_t bytes = used_ > 0 ? kParamsBytes + used_ : sizeof(Params);
  KV_TRY(check(cudaMemcpyAsync(params_dev_, staged_.data(), bytes, cudaMemcpyHostToDevice, stream_),
               "copying the decode step parameters"));
  if (!graphable_ || launches_.empty()) return run_eagerly();
  for (size_t i = 0; i < graphs_.size(); ++i) {
    if (graphs_[i].key != key_) continue;
    Cached hit = std::move(graphs_[i]);
    graphs_.erase(graphs_.begin() + int64_t(i));
    graphs_.push_back(std::move(hit));
    ++replays_;
    return check(cudaGraphLaunch(graphs_.back().exec, stream_), "replaying the decode graph");
  }
  // New sequence: capture it. A launch that fails during capture still ends the capture.
  KV_TRY(check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal),
               "starting the decode graph capture"));
  cudaError_t launch_error = cudaSuccess;
  for (Launch& l : launches_)
    if ((launch_error = l()) != cudaSuccess) break;
  cudaGraph_t graph = nullptr;
  const cudaError_t end_error = cudaStreamEndCapture(stream_, &graph);
  if (launch_error != cudaSuccess || end_error != cudaSuccess) {
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
    if (launch_error != cudaSuccess) return check(launch_error, "capturing the decode graph");
    return check(end_error, "ending the decode graph capture");
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  KV_TRY(check(inst, "instantiating the decode graph"));
  if (graphs_.size() >= kMaxGraphs) {
    cudaGraphExecDestroy(graphs_.front().exec);
    graphs_.erase(graphs_.begin());
  }
  graphs_.push_back(Cached{key_, exec});
  ++captures_;
  return check(cudaGraphLaunch(exec, stream_), "launching the decode graph");
}

}  // namespace kvscope
