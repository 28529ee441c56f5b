// CudaRuntime: the few CUDA runtime calls the CUDA transport makes (streams,
// events, asynchronous copies, pinned memory, pointer attributes), behind an
// interface so the transport's bookkeeping (lanes as streams, completion by
// polled events, the staging pipeline) is tested on machines without a GPU
// against a scripted runtime, and runs on the real one where a GPU is.
// Handles are opaque numbers; 0 is never a valid one.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "baton/common/status.h"

namespace baton::transport {

using CudaStream = std::uint64_t;
using CudaEvent = std::uint64_t;

// What cudaPointerGetAttributes says about an address.
enum class CudaMemoryType : std::uint8_t {
  kUnregistered,  // pageable host memory the runtime does not know
  kPinnedHost,    // page-locked host memory (cudaHostAlloc / cudaHostRegister)
  kDevice,        // device memory of `device`
  kManaged,       // unified memory
};

struct CudaPointer {
  CudaMemoryType type = CudaMemoryType::kUnregistered;
  int device = -1;
};

// The calls a transport may make from its loop: none of them blocks on a
// copy (synchronize() excepted: for tests, benchmarks, and after a copy
// failed, so that nothing of it runs once its buffers are reused).
class CudaRuntime {
 public:
  virtual ~CudaRuntime() = default;

  [[nodiscard]] virtual int device_count() const = 0;
  // "0000:17:00.0" (lower case), to match a topology's GPU to a CUDA device.
  [[nodiscard]] virtual std::string pci_bus_id(int device) const = 0;
  [[nodiscard]] virtual bool can_access_peer(int device, int peer) const = 0;
  // Lets `device`'s copies reach `peer`'s memory directly; ok when already on.
  [[nodiscard]] virtual Status enable_peer_access(int device, int peer) = 0;

  [[nodiscard]] virtual Result<CudaStream> create_stream(int device) = 0;
  virtual void destroy_stream(CudaStream stream) = 0;
  // Events without timing (the cheapest kind), on `device`.
  [[nodiscard]] virtual Result<CudaEvent> create_event(int device) = 0;
  virtual void destroy_event(CudaEvent event) = 0;

  // cudaMemcpyAsync with the direction inferred from the addresses (unified
  // addressing): host↔device and within one device.
  [[nodiscard]] virtual Status copy_async(void* dst, const void* src, std::size_t bytes, CudaStream stream) = 0;
  // cudaMemcpyPeerAsync between two devices.
  [[nodiscard]] virtual Status copy_peer_async(void* dst, int dst_device, const void* src, int src_device,
                                               std::size_t bytes, CudaStream stream) = 0;
  [[nodiscard]] virtual Status record(CudaEvent event, CudaStream stream) = 0;
  // Work queued on `stream` after this waits for the event's latest record.
  [[nodiscard]] virtual Status wait(CudaStream stream, CudaEvent event) = 0;
  // true when the event's latest record has completed, false while it runs;
  // an error when the work before it failed.
  [[nodiscard]] virtual Result<bool> query(CudaEvent event) = 0;
  [[nodiscard]] virtual Status synchronize(CudaStream stream) = 0;

  [[nodiscard]] virtual Result<void*> alloc_pinned(std::size_t bytes) = 0;
  virtual void free_pinned(void* ptr) = 0;
  [[nodiscard]] virtual Result<void*> alloc_device(int device, std::size_t bytes) = 0;
  virtual void free_device(void* ptr) = 0;
  // cudaHostRegister / cudaHostUnregister: pins a caller's host buffer.
  [[nodiscard]] virtual Status register_host(void* ptr, std::size_t bytes) = 0;
  virtual void unregister_host(void* ptr) = 0;
  [[nodiscard]] virtual Result<CudaPointer> pointer(const void* ptr) const = 0;
  // Bytes of `device`'s memory in use (total − free), for leak checks.
  [[nodiscard]] virtual Result<std::uint64_t> device_memory_used(int device) const = 0;
};

// ok when both ends of [ptr, ptr + length) are device memory of `device` by
// the runtime's pointer attributes; invalid_argument saying what they are
// otherwise (pageable or pinned host, managed, another GPU's), and for a
// null pointer or zero length.
[[nodiscard]] Status check_device_memory(const CudaRuntime& runtime, const void* ptr, std::size_t length, int device);

// The CUDA runtime of this process (linked statically: nothing needs
// libcudart.so at run time). unavailable, saying why, in a build without
// CUDA, without a driver, or without a visible device.
[[nodiscard]] Result<std::shared_ptr<CudaRuntime>> cuda_runtime();

}  // namespace baton::transport
