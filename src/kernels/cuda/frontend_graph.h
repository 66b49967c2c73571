// What the files that build cuDNN frontend graphs share (attention_cudnn.cpp, conv_cudnn.cpp; only
// compiled where the build has the frontend's headers, MINIGRAD_WITH_CUDNN_FRONTEND): a built graph
// or the reason cuDNN refused it, the steps that build one, and a cache of them per key.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

#include <cudnn_frontend.h>

#include <minigrad/core/tensor.h>
#include "kernels/cuda/common.cuh"

namespace mg::cuda::frontend {

namespace fe = cudnn_frontend;

// A built graph and its workspace, or a refusal (graph null, `why` set).
struct BuiltGraph {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace = 0;
  std::string why;
};

// Asks cuDNN for a described graph: the frontend's validation, the operation graph, plans from the
// heuristics `modes`, `filter` on them (numeric notes, workspace), the support check, the plans'
// build and their workspace. A refusal says `what`, the step that refused and cuDNN's message.
inline std::shared_ptr<const BuiltGraph> build_graph(std::shared_ptr<fe::graph::Graph> g, cudnnHandle_t handle,
                                                     const std::string& what, const std::vector<fe::HeurMode_t>& modes,
                                                     const std::function<void(fe::graph::Graph&)>& filter = {}) {
  auto out = std::make_shared<BuiltGraph>();
  const auto failed = [&](const char* step, fe::error_t e) {
    out->why = what + ": " + step + ": " + e.get_message();
    return out;
  };
  if (auto e = g->validate(); e.is_bad()) return failed("validate", e);
  if (auto e = g->build_operation_graph(handle); e.is_bad()) return failed("build_operation_graph", e);
  if (auto e = g->create_execution_plans(modes); e.is_bad()) return failed("create_execution_plans", e);
  if (filter) filter(*g);
  if (auto e = g->check_support(); e.is_bad()) return failed("check_support", e);
  if (auto e = g->build_plans(); e.is_bad()) return failed("build_plans", e);
  if (auto e = g->get_workspace_size(out->workspace); e.is_bad()) return failed("get_workspace_size", e);
  out->graph = std::move(g);
  return out;
}

// For tests without a GPU: a described graph for a device given as cuDNN's JSON description and
// compute capability, through the frontend's validation and cuDNN's operation-graph build (no
// engine: that needs a driver). "" when both pass, else `what`, the step and the message.
template <class Describe>
std::string check_description(const std::string& device_json, int sm_version, const std::string& what, Describe describe) {
  auto device = std::make_shared<fe::DeviceProperties>();
  if (auto e = device->deserialize(std::vector<uint8_t>(device_json.begin(), device_json.end())); e.is_bad())
    return "device description: " + e.get_message();
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_device_properties(device).set_sm_version(sm_version);
  describe(*g);
  if (auto e = g->validate(); e.is_bad()) return what + ": validate: " + e.get_message();
  if (auto e = g->build_operation_graph(); e.is_bad()) return what + ": build_operation_graph: " + e.get_message();
  return "";
}

// Graphs by key, each built once (a graph another thread built first wins). Made with new and never
// destroyed, as the devices' contexts are: the graphs hold cuDNN plans, whose release at exit could
// come after cuDNN's and the CUDA runtime's teardown.
template <class Key> class GraphCache {
 public:
  template <class Build> std::shared_ptr<const BuiltGraph> get(const Key& k, Build build) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (auto it = graphs_.find(k); it != graphs_.end()) return it->second;
    }
    std::shared_ptr<const BuiltGraph> b;
    try {
      b = build();
    } catch (const Error&) {
      throw;  // ours (a CUDA error, out of memory): not a refusal to remember
    } catch (const std::bad_alloc&) {
      throw;  // the host's memory, for now: not this graph's fault
    } catch (const std::exception& e) {
      // The frontend also throws where it returns no error_t ("No suitable implementation for
      // given SDPA_attributes"): a refusal like the others, so the caller falls back.
      auto refused = std::make_shared<BuiltGraph>();
      refused->why = std::string("the cuDNN frontend threw: ") + e.what();
      b = std::move(refused);
    }
    std::lock_guard<std::mutex> lock(mu_);
    return graphs_.emplace(k, std::move(b)).first->second;
  }

 private:
  std::mutex mu_;
  std::map<Key, std::shared_ptr<const BuiltGraph>> graphs_;
};

// Whether every defined tensor's data is 16-byte aligned, as the graphs' kernels load it.
inline bool aligned16(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    if (t->defined() && reinterpret_cast<uintptr_t>(t->raw_data()) % 16 != 0) return false;
  return true;
}

// Runs a built graph on the device's stream (cudnn_handle) with its workspace from the caching
// allocator; `what` names it in the error where the run fails.
inline void run_graph(const BuiltGraph& b, int dev, std::unordered_map<int64_t, void*>& pack, const std::string& what) {
  Workspace ws(dev, static_cast<size_t>(b.workspace));
  const fe::error_t e = b.graph->execute(cudnn_handle(dev), pack, ws.get());
  MG_CHECK(e.is_good(), what << " failed to run: " << e.err_msg);
}

}  // namespace mg::cuda::frontend
