// The CUDA runtime behind CudaRuntime, over the static cudart (it loads
// libcuda.so.1 itself at run time, so a machine without CUDA runs the same
// binary and gets `unavailable`). Handles are the runtime's own pointers.
// Compiled in every build; without CUDA it only says so.
#include "baton/transport/cuda_runtime.h"

#ifdef BATON_WITH_CUDA
#include <cuda_runtime_api.h>

#include <cctype>
#include <mutex>

#include <fmt/format.h>
#endif

namespace baton::transport {

#ifdef BATON_WITH_CUDA
namespace {

std::string describe(cudaError_t error) {
  return fmt::format("{} ({})", cudaGetErrorString(error), cudaGetErrorName(error));
}

Status check(cudaError_t error, std::string_view call) {
  if (error == cudaSuccess) return Status::ok();
  return Status::unavailable("cuda: {} failed: {}", call, describe(error));
}

// Streams and events carry their device: a call on them makes it current
// first (the runtime's current device is per thread).
template <typename T>
T from_handle(std::uint64_t handle) {
  return reinterpret_cast<T>(static_cast<std::uintptr_t>(handle));
}
template <typename T>
std::uint64_t to_handle(T value) {
  return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(value));
}

class Cudart final : public CudaRuntime {
 public:
  explicit Cudart(int devices) : devices_(devices) {}

  int device_count() const override { return devices_; }

  std::string pci_bus_id(int device) const override {
    char raw[32] = {};
    if (cudaDeviceGetPCIBusId(raw, sizeof(raw), device) != cudaSuccess) return {};
    std::string id(raw);
    for (char& c : id) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return id;  // the transport compares addresses as numbers: any domain width
  }

  bool can_access_peer(int device, int peer) const override {
    int can = 0;
    return cudaDeviceCanAccessPeer(&can, device, peer) == cudaSuccess && can != 0;
  }

  // Called while an engine is created, on the caller's thread: its current
  // device (a serving framework's choice) is put back.
  Status enable_peer_access(int device, int peer) override {
    int current = -1;
    if (cudaGetDevice(&current) != cudaSuccess) current = -1;
    Status s = check(cudaSetDevice(device), "cudaSetDevice");
    if (s.is_ok()) {
      const cudaError_t error = cudaDeviceEnablePeerAccess(peer, 0);
      if (error == cudaErrorPeerAccessAlreadyEnabled) {
        (void)cudaGetLastError();  // clear it: it is not sticky, but it lingers
      } else {
        s = check(error, fmt::format("cudaDeviceEnablePeerAccess({} -> {})", device, peer));
      }
    }
    if (current >= 0) (void)cudaSetDevice(current);
    return s;
  }

  Result<CudaStream> create_stream(int device) override {
    if (Status s = check(cudaSetDevice(device), "cudaSetDevice"); !s.is_ok()) return std::unexpected(s);
    cudaStream_t stream = nullptr;
    if (Status s = check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
        !s.is_ok()) {
      return std::unexpected(s);
    }
    return to_handle(stream);
  }
  void destroy_stream(CudaStream stream) override { (void)cudaStreamDestroy(from_handle<cudaStream_t>(stream)); }

  Result<CudaEvent> create_event(int device) override {
    if (Status s = check(cudaSetDevice(device), "cudaSetDevice"); !s.is_ok()) return std::unexpected(s);
    cudaEvent_t event = nullptr;
    if (Status s = check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
        !s.is_ok()) {
      return std::unexpected(s);
    }
    return to_handle(event);
  }
  void destroy_event(CudaEvent event) override { (void)cudaEventDestroy(from_handle<cudaEvent_t>(event)); }

  Status copy_async(void* dst, const void* src, std::size_t bytes, CudaStream stream) override {
    return check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, from_handle<cudaStream_t>(stream)),
                 "cudaMemcpyAsync");
  }
  Status copy_peer_async(void* dst, int dst_device, const void* src, int src_device, std::size_t bytes,
                         CudaStream stream) override {
    return check(cudaMemcpyPeerAsync(dst, dst_device, src, src_device, bytes, from_handle<cudaStream_t>(stream)),
                 "cudaMemcpyPeerAsync");
  }
  Status record(CudaEvent event, CudaStream stream) override {
    return check(cudaEventRecord(from_handle<cudaEvent_t>(event), from_handle<cudaStream_t>(stream)),
                 "cudaEventRecord");
  }
  Status wait(CudaStream stream, CudaEvent event) override {
    return check(cudaStreamWaitEvent(from_handle<cudaStream_t>(stream), from_handle<cudaEvent_t>(event), 0),
                 "cudaStreamWaitEvent");
  }
  Result<bool> query(CudaEvent event) override {
    const cudaError_t error = cudaEventQuery(from_handle<cudaEvent_t>(event));
    if (error == cudaSuccess) return true;
    if (error == cudaErrorNotReady) return false;
    return std::unexpected(check(error, "cudaEventQuery"));
  }
  Status synchronize(CudaStream stream) override {
    return check(cudaStreamSynchronize(from_handle<cudaStream_t>(stream)), "cudaStreamSynchronize");
  }

  Result<void*> alloc_pinned(std::size_t bytes) override {
    void* ptr = nullptr;
    if (Status s = check(cudaHostAlloc(&ptr, bytes, cudaHostAllocPortable), "cudaHostAlloc"); !s.is_ok()) {
      return std::unexpected(s);
    }
    return ptr;
  }
  void free_pinned(void* ptr) override { (void)cudaFreeHost(ptr); }
  Result<void*> alloc_device(int device, std::size_t bytes) override {
    if (Status s = check(cudaSetDevice(device), "cudaSetDevice"); !s.is_ok()) return std::unexpected(s);
    void* ptr = nullptr;
    if (Status s = check(cudaMalloc(&ptr, bytes), "cudaMalloc"); !s.is_ok()) return std::unexpected(s);
    return ptr;
  }
  void free_device(void* ptr) override { (void)cudaFree(ptr); }
  Status register_host(void* ptr, std::size_t bytes) override {
    return check(cudaHostRegister(ptr, bytes, cudaHostRegisterPortable), "cudaHostRegister");
  }
  void unregister_host(void* ptr) override { (void)cudaHostUnregister(ptr); }

  Result<CudaPointer> pointer(const void* ptr) const override {
    cudaPointerAttributes attributes{};
    if (Status s = check(cudaPointerGetAttributes(&attributes, ptr), "cudaPointerGetAttributes"); !s.is_ok()) {
      return std::unexpected(s);
    }
    switch (attributes.type) {
      case cudaMemoryTypeHost: return CudaPointer{CudaMemoryType::kPinnedHost, attributes.device};
      case cudaMemoryTypeDevice: return CudaPointer{CudaMemoryType::kDevice, attributes.device};
      case cudaMemoryTypeManaged: return CudaPointer{CudaMemoryType::kManaged, attributes.device};
      default: return CudaPointer{CudaMemoryType::kUnregistered, -1};
    }
  }

  Result<std::uint64_t> device_memory_used(int device) const override {
    if (Status s = check(cudaSetDevice(device), "cudaSetDevice"); !s.is_ok()) return std::unexpected(s);
    std::size_t free = 0;
    std::size_t total = 0;
    if (Status s = check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo"); !s.is_ok()) return std::unexpected(s);
    return static_cast<std::uint64_t>(total - free);
  }

 private:
  int devices_;
};

}  // namespace
#endif

Result<std::shared_ptr<CudaRuntime>> cuda_runtime() {
#ifndef BATON_WITH_CUDA
  return std::unexpected(Status::unavailable("cuda: built without CUDA (BATON_WITH_CUDA=OFF)"));
#else
  // One runtime per process: the CUDA runtime is process-wide state.
  static std::mutex mutex;
  static std::shared_ptr<CudaRuntime> runtime;
  std::lock_guard lock(mutex);
  if (runtime) return runtime;
  int count = 0;
  if (cudaError_t error = cudaGetDeviceCount(&count); error != cudaSuccess) {
    return std::unexpected(Status::unavailable("cuda: no usable device: cudaGetDeviceCount failed: {}", describe(error)));
  }
  if (count <= 0) return std::unexpected(Status::unavailable("cuda: the runtime reports no GPU"));
  runtime = std::make_shared<Cudart>(count);
  return runtime;
#endif
}

}  // namespace baton::transport
