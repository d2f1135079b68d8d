// The Triton FlashAttention kernels as a C++ autograd Function: the optional host path of
// profiler_kit/attention/flash_cpp.py, which says why it exists and how it is fed.
//
// Python registers, per input layout (a "key": q, k, v's sizes, strides, dtype, device and 16-byte
// alignment, and causal), a Plan: the four launches that layout's first call made through Triton (forward,
// D pre-pass, dK/dV, dQ), each with its compiled CUfunction, grid, block, shared memory and every kernel
// parameter's bytes. Every integer a kernel takes is a function of the key, so a later call with the same
// key only allocates the outputs, writes their addresses (and those of q, k, v, dO) into the pointer
// parameters and TMA descriptors, and launches with cuLaunchKernelEx, as Triton 3.6's own launcher does.

#include <torch/extension.h>
#include <pybind11/stl.h>

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda.h>
#include <dlfcn.h>

#include <array>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <tuple>
#include <vector>

namespace {

using LaunchKernelEx = CUresult (*)(const CUlaunchConfig*, CUfunction, void**, void**);
using TensorMapEncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                          const cuuint64_t*, const cuuint32_t*, const cuuint32_t*,
                                          CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion,
                                          CUtensorMapFloatOOBfill);
using TensorMapReplaceAddress = CUresult (*)(CUtensorMap*, void*);
using GetErrorString = CUresult (*)(CUresult, const char**);

// Driver entry points, taken from libcuda.so.1 at first use as Triton's launcher takes them, so that the
// extension links against no driver library of the build machine.
struct Driver {
  LaunchKernelEx launch;
  TensorMapEncodeTiled encode;
  TensorMapReplaceAddress replace;
  GetErrorString error;
};

const Driver& driver() {
  static const Driver d = [] {
    void* lib = dlopen("libcuda.so.1", RTLD_LAZY);
    TORCH_CHECK(lib, "flash launcher: cannot open libcuda.so.1");
    auto sym = [lib](const char* name) {
      void* p = dlsym(lib, name);
      TORCH_CHECK(p, "flash launcher: libcuda.so.1 has no ", name);
      return p;
    };
    return Driver{reinterpret_cast<LaunchKernelEx>(sym("cuLaunchKernelEx")),
                  reinterpret_cast<TensorMapEncodeTiled>(sym("cuTensorMapEncodeTiled")),
                  reinterpret_cast<TensorMapReplaceAddress>(sym("cuTensorMapReplaceAddress")),
                  reinterpret_cast<GetErrorString>(sym("cuGetErrorString"))};
  }();
  return d;
}

void check(CUresult result, const char* what) {
  if (result != CUDA_SUCCESS) {
    const char* text = nullptr;
    driver().error(result, &text);
    TORCH_CHECK(false, "flash launcher: ", what, ": ", text ? text : "unknown CUDA error");
  }
}

// The tensors a launch reads or writes; flash_cpp.ROLES numbers them the same way.
enum Role : int64_t { kQ, kK, kV, kO, kLse, kDo, kDelta, kLse2, kDq, kDk, kDv, kRoles };
using Addresses = std::array<void*, kRoles>;

// Parameter kinds of a launch spec: flash_cpp.launch_params writes them, one list of integers each.
enum Kind : int64_t { kPointer, kI32, kI64, kU32, kI8, kTensorMap };

constexpr size_t kMaxParamBytes = 4096;  // a launch here takes at most 7 tensor maps and ~60 scalars
constexpr size_t kMaxParams = 128;

struct Launch {
  CUfunction function = nullptr;
  std::array<unsigned, 3> grid{};
  unsigned threads = 0;
  unsigned shared = 0;
  std::vector<size_t> offsets;                     // where each parameter's bytes start in `bytes`
  std::vector<std::pair<size_t, int64_t>> pointers;  // (parameter, role) of each device pointer
  std::vector<std::pair<size_t, int64_t>> maps;      // (parameter, role) of each TMA descriptor
  alignas(128) std::array<uint8_t, kMaxParamBytes> bytes{};
  size_t size = 0;

  size_t place(size_t length, size_t alignment) {
    size_t at = (size + alignment - 1) / alignment * alignment;
    TORCH_CHECK(at + length <= kMaxParamBytes && offsets.size() < kMaxParams, "flash launcher: too many parameters");
    offsets.push_back(at);
    size = at + length;
    return at;
  }

  template <typename T>
  void scalar(T value) {
    std::memcpy(bytes.data() + place(sizeof(T), alignof(T)), &value, sizeof(T));
  }

  // One launch from flash_cpp.launch_spec: (function, grid, threads, shared memory, parameters).
  Launch(int64_t function_handle, const std::vector<int64_t>& grid_xyz, int64_t num_threads, int64_t shared_bytes,
         const std::vector<std::vector<int64_t>>& params) {
    function = reinterpret_cast<CUfunction>(function_handle);
    TORCH_CHECK(grid_xyz.size() == 3, "flash launcher: a grid has three dimensions");
    for (size_t i = 0; i < 3; ++i) grid[i] = static_cast<unsigned>(grid_xyz[i]);
    threads = static_cast<unsigned>(num_threads);
    shared = static_cast<unsigned>(shared_bytes);
    for (const auto& p : params) {
      TORCH_CHECK(p.size() >= 2, "flash launcher: malformed parameter");
      switch (p[0]) {
        case kPointer:
          TORCH_CHECK(p[1] >= 0 && p[1] < kRoles, "flash launcher: unknown role");
          pointers.emplace_back(offsets.size(), p[1]);
          scalar<uint64_t>(0);
          break;
        case kI32: scalar<int32_t>(static_cast<int32_t>(p[1])); break;
        case kI64: scalar<int64_t>(p[1]); break;
        case kU32: scalar<uint32_t>(static_cast<uint32_t>(p[1])); break;
        case kI8: scalar<int8_t>(static_cast<int8_t>(p[1])); break;
        case kTensorMap: add_map(p); break;
        default: TORCH_CHECK(false, "flash launcher: unknown parameter kind ", p[0]);
      }
    }
  }

  // [kTensorMap, role, address, data type, swizzle, oob fill, rank, dims…, byte strides… (rank - 1), box…],
  // dims and box innermost first: what Triton's fill_tma_descriptor passes to cuTensorMapEncodeTiled.
  void add_map(const std::vector<int64_t>& p) {
    TORCH_CHECK(p.size() >= 7, "flash launcher: malformed tensor map");
    const int64_t rank = p[6];
    TORCH_CHECK(rank >= 1 && rank <= 5 && p.size() == static_cast<size_t>(7 + 3 * rank - 1),
                "flash launcher: malformed tensor map");
    std::array<cuuint64_t, 5> dims{}, strides{};
    std::array<cuuint32_t, 5> box{}, element_strides{1, 1, 1, 1, 1};
    for (int64_t i = 0; i < rank; ++i) dims[i] = static_cast<cuuint64_t>(p[7 + i]);
    for (int64_t i = 0; i + 1 < rank; ++i) strides[i] = static_cast<cuuint64_t>(p[7 + rank + i]);
    for (int64_t i = 0; i < rank; ++i) box[i] = static_cast<cuuint32_t>(p[7 + 2 * rank - 1 + i]);
    maps.emplace_back(offsets.size(), p[1]);
    auto* map = reinterpret_cast<CUtensorMap*>(bytes.data() + place(sizeof(CUtensorMap), 128));
    check(driver().encode(map, static_cast<CUtensorMapDataType>(p[3]), static_cast<cuuint32_t>(rank),
                          reinterpret_cast<void*>(p[2]), dims.data(), strides.data(), box.data(),
                          element_strides.data(), CU_TENSOR_MAP_INTERLEAVE_NONE,
                          static_cast<CUtensorMapSwizzle>(p[4]), CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                          static_cast<CUtensorMapFloatOOBfill>(p[5])),
          "cuTensorMapEncodeTiled");
  }

  // Copies the parameters, writes this call's addresses into them, and launches on `stream`. The copy keeps
  // the Launch immutable, so two threads may launch it at once.
  void run(const Addresses& at, CUstream stream) const {
    alignas(128) std::array<uint8_t, kMaxParamBytes> call;
    std::memcpy(call.data(), bytes.data(), size);
    for (const auto& [param, role] : pointers) {
      auto address = reinterpret_cast<uint64_t>(at[role]);
      std::memcpy(call.data() + offsets[param], &address, sizeof(address));
    }
    for (const auto& [param, role] : maps) {
      check(driver().replace(reinterpret_cast<CUtensorMap*>(call.data() + offsets[param]), at[role]),
            "cuTensorMapReplaceAddress");
    }
    std::array<void*, kMaxParams + 2> params{};
    for (size_t i = 0; i < offsets.size(); ++i) params[i] = call.data() + offsets[i];
    // Triton 3.6's kernels end with two scratch pointers; flash_cpp registers only kernels that need neither.
    uint64_t no_scratch[2] = {0, 0};
    params[offsets.size()] = &no_scratch[0];
    params[offsets.size() + 1] = &no_scratch[1];
    CUlaunchConfig config{};
    config.gridDimX = grid[0];
    config.gridDimY = grid[1];
    config.gridDimZ = grid[2];
    config.blockDimX = threads;
    config.blockDimY = 1;
    config.blockDimZ = 1;
    config.sharedMemBytes = shared;
    config.hStream = stream;
    config.attrs = nullptr;
    config.numAttrs = 0;
    check(driver().launch(&config, function, params.data(), nullptr), "cuLaunchKernelEx");
  }
};

struct Plan {
  std::unique_ptr<Launch> forward, preprocess, dkdv, dq;
  int64_t stat_heads = 0, stat_rows = 0;  // the (Z·H, padded N_Q) shape of the backward's LSE2 and Delta
};

using Key = std::tuple<std::vector<int64_t>, int64_t, int64_t, bool>;

Key key_of(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal) {
  std::vector<int64_t> layout;
  for (const auto* t : {&q, &k, &v}) {
    layout.push_back(t->dim());
    layout.insert(layout.end(), t->sizes().begin(), t->sizes().end());
    layout.insert(layout.end(), t->strides().begin(), t->strides().end());
    layout.push_back(static_cast<int64_t>(t->scalar_type()));
    layout.push_back(reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 == 0);
  }
  return {std::move(layout), static_cast<int64_t>(q.device().type()), q.device().index(), causal};
}

std::map<Key, std::unique_ptr<Plan>>& plans() {
  static std::map<Key, std::unique_ptr<Plan>> registry;
  return registry;
}

CUstream current_stream(const at::Tensor& t) {
  return at::cuda::getCurrentCUDAStream(t.get_device()).stream();
}

// The addresses of the forward's tensors, which the backward's launches read too.
Addresses forward_addresses(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                            const at::Tensor& lse) {
  Addresses at{};
  at[kQ] = q.data_ptr();
  at[kK] = k.data_ptr();
  at[kV] = v.data_ptr();
  at[kO] = out.data_ptr();
  at[kLse] = lse.data_ptr();
  return at;
}

class FlashAttention : public torch::autograd::Function<FlashAttention> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, int64_t plan_address) {
    const auto* plan = reinterpret_cast<const Plan*>(plan_address);
    c10::cuda::CUDAGuard guard(q.device());
    // The Python path's allocations, in the same memory layout: O as (Z, H, N_Q, d), L as (Z·H, N_Q).
    at::Tensor out = at::empty(q.sizes(), q.options());
    at::Tensor lse = at::empty(q.sizes().slice(0, q.dim() - 1), q.options().dtype(at::kFloat));
    plan->forward->run(forward_addresses(q, k, v, out, lse), current_stream(q));
    ctx->save_for_backward({q, k, v, out, lse});
    ctx->saved_data["plan"] = plan_address;
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto* plan = reinterpret_cast<const Plan*>(ctx->saved_data["plan"].toInt());
    auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    c10::cuda::CUDAGuard guard(q.device());
    // The plan was recorded with a contiguous, 16-byte aligned dO.
    at::Tensor grad = grads[0].contiguous();
    if (reinterpret_cast<uintptr_t>(grad.data_ptr()) % 16 != 0) grad = grad.clone();
    // Delta and LSE2 in one allocation: each is (Z·H, padded N_Q) fp32, and a row size keeps 16-byte alignment.
    at::Tensor stats = at::empty({2, plan->stat_heads, plan->stat_rows}, q.options().dtype(at::kFloat));
    at::Tensor dq = at::empty(q.sizes(), q.options());
    at::Tensor dk = at::empty(k.sizes(), k.options());
    at::Tensor dv = at::empty(v.sizes(), k.options());
    Addresses at = forward_addresses(q, k, v, out, lse);
    at[kDo] = grad.data_ptr();
    at[kDelta] = stats.data_ptr<float>();
    at[kLse2] = stats.data_ptr<float>() + plan->stat_heads * plan->stat_rows;
    at[kDq] = dq.data_ptr();
    at[kDk] = dk.data_ptr();
    at[kDv] = dv.data_ptr();
    CUstream stream = current_stream(q);
    plan->preprocess->run(at, stream);
    plan->dkdv->run(at, stream);
    plan->dq->run(at, stream);
    return {dq, dk, dv, at::Tensor()};
  }
};

using Spec = std::tuple<int64_t, std::vector<int64_t>, int64_t, int64_t, std::vector<std::vector<int64_t>>>;

std::unique_ptr<Launch> make_launch(const Spec& spec) {
  const auto& [function, grid, threads, shared, params] = spec;
  return std::make_unique<Launch>(function, grid, threads, shared, params);
}

void register_plan(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal, const Spec& forward,
                   const Spec& preprocess, const Spec& dkdv, const Spec& dq, int64_t stat_heads, int64_t stat_rows) {
  auto plan = std::make_unique<Plan>();
  plan->forward = make_launch(forward);
  plan->preprocess = make_launch(preprocess);
  plan->dkdv = make_launch(dkdv);
  plan->dq = make_launch(dq);
  plan->stat_heads = stat_heads;
  plan->stat_rows = stat_rows;
  // A layout keeps its first plan: a backward in flight may still be running it.
  plans().emplace(key_of(q, k, v, causal), std::move(plan));
}

// The attention output through a registered plan, or None when q, k, v's layout has none yet.
std::optional<at::Tensor> attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal) {
  auto found = plans().find(key_of(q, k, v, causal));
  if (found == plans().end()) return std::nullopt;
  return FlashAttention::apply(q, k, v, reinterpret_cast<int64_t>(found->second.get()));
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("register_plan", &register_plan, "Register the four launches of one input layout");
  m.def("attention", &attention, "FlashAttention through a registered plan, or None");
  m.def("has_plan", [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal) {
    return plans().count(key_of(q, k, v, causal)) > 0;
  }, "Whether q, k, v's layout has a plan");
  m.def("plan_count", [] { return static_cast<int64_t>(plans().size()); }, "How many layouts have a plan");
}
