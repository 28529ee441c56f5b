// GPU memory on the UCX datapath. Debian's UCX has no CUDA support, so it
// cannot register or reach VRAM; a slice whose local range is in a VRAM
// region goes through a pinned host bounce buffer (registered with UCX)
// instead: a write is copied GPU → bounce (a CUDA copy, its event polled)
// before UCX sends it; a read lands in the bounce and is copied bounce → GPU
// before it completes. A Transport over the UcxTransport that every other
// slice passes straight through; it also carries this host's own GPU paths
// (a CudaTransport, for requests between the engine's own regions), first
// among its paths, UCX's path ids shifted after them. Private to engine/;
// lives on the loop.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "baton/transport/cuda_runtime.h"
#include "baton/transport/cuda_transport.h"
#include "baton/transport/ucx_transport.h"

namespace baton::engine {

class VramStaging final : public transport::Transport {
 public:
  // `cuda` null: cuda_runtime() is asked at the first VRAM registration.
  VramStaging(std::unique_ptr<transport::UcxTransport> ucx, std::shared_ptr<transport::CudaRuntime> cuda);
  // Frees bounce buffers and streams; the UcxTransport goes last.
  ~VramStaging() override;
  VramStaging(const VramStaging&) = delete;
  VramStaging& operator=(const VramStaging&) = delete;

  [[nodiscard]] transport::UcxTransport& ucx() { return *ucx_; }

  // The region is UCX's too, staged (UcxTransport::register_staged), so its
  // handle is UCX's and peers can reach it once exported: this side of
  // their slices is a CUDA copy (Served). `device`
  // -1: the GPU the pointer belongs to. unavailable without a CUDA device;
  // invalid_argument for a range that is not all device memory of `device`
  // or that overlaps a region.
  [[nodiscard]] Result<transport::RegionHandle> register_vram(void* ptr, std::size_t length, int device);
  // UCX unregisters it (peers that were told of it must acknowledge first:
  // UcxTransport::unregister_pending). not_found for an unknown handle;
  // failed_precondition while slices on it run.
  [[nodiscard]] Status unregister_vram(transport::RegionHandle region);
  [[nodiscard]] bool is_vram(transport::RegionHandle region) const { return region_base_.contains(region); }
  // The GPU of a VRAM region (-1 for an unknown one).
  [[nodiscard]] int device_of(transport::RegionHandle region) const;
  [[nodiscard]] std::size_t staged_in_flight() const { return slices_.size(); }

  // This host's GPU paths (CudaTransport over the topology), for transfers
  // between this engine's own regions; set before any peer connects (their
  // paths come after these). Null: none.
  void set_local(std::unique_ptr<transport::CudaTransport> local);
  [[nodiscard]] transport::CudaTransport* local() const { return local_.get(); }

  // --- Transport: the local GPU paths, then UCX's, with VRAM slices staged ---
  [[nodiscard]] const std::vector<transport::PathInfo>& paths() const override;
  [[nodiscard]] std::uint64_t paths_version() const override { return ucx_->paths_version(); }
  // A VRAM write's checks by UCX come once its bytes are in the bounce
  // buffer: a refusal then completes the slice with it.
  [[nodiscard]] Status submit(const transport::SliceSubmit& slice, TimeNs now_ns) override;
  // A write still being copied out of the GPU stops (nothing lands in the
  // caller's memory); a read being copied into it does not.
  transport::CancelResult cancel(transport::SliceId id, TimeNs now_ns) override;
  void poll(TimeNs now_ns, std::vector<transport::Completion>& out) override;
  [[nodiscard]] std::optional<TimeNs> next_event_ns() const override;
  [[nodiscard]] bool path_healthy(transport::PathId path, TimeNs now_ns) const override;
  [[nodiscard]] Status path_status(transport::PathId path) const override;
  [[nodiscard]] int event_fd() const override { return ucx_->event_fd(); }
  // False while CUDA copies run: their events have no fd to sleep on.
  [[nodiscard]] bool arm() override;
  [[nodiscard]] bool carries_compressed_slices() const override { return ucx_->carries_compressed_slices(); }
  [[nodiscard]] Status set_codec(std::shared_ptr<const transport::Codec> codec) override {
    return ucx_->set_codec(std::move(codec));
  }

 private:
  // While CUDA copies run, the loop polls again this soon.
  static constexpr TimeNs kCopyPollNs = 5'000;

  [[nodiscard]] transport::PathId local_paths() const {
    return local_ ? static_cast<transport::PathId>(local_->paths().size()) : 0;
  }
  // The Transport calls for UCX's paths, by UCX's path ids.
  [[nodiscard]] Status submit_remote(const transport::SliceSubmit& slice, TimeNs now_ns);
  transport::CancelResult cancel_remote(transport::SliceId id, TimeNs now_ns);
  void poll_remote(TimeNs now_ns, std::vector<transport::Completion>& out);
  [[nodiscard]] std::optional<TimeNs> next_remote_event_ns() const;
  [[nodiscard]] bool arm_remote();

  struct Region {
    transport::RegionHandle handle = 0;
    std::uint64_t base = 0;
    std::uint64_t length = 0;
    int device = 0;
    std::uint64_t live_slices = 0;
  };
  struct Bounce {
    std::byte* data = nullptr;
    std::uint64_t capacity = 0;
    transport::RegionHandle ucx_region = 0;
  };
  enum class Stage : std::uint8_t { kCopyOut, kOnWire, kCopyIn };
  struct Staged {
    transport::SliceSubmit slice;  // as the scheduler posted it
    Region* region = nullptr;
    Bounce bounce;
    Stage stage = Stage::kCopyOut;
    transport::CudaEvent event = 0;
    bool cancelled = false;
    std::uint64_t wire_bytes = 0;  // what UCX says crossed the wire (0: not yet)
  };

  [[nodiscard]] Result<Bounce> take_bounce(std::uint64_t bytes);
  void give_back(Bounce bounce) { free_bounces_.emplace(bounce.capacity, bounce); }
  [[nodiscard]] Result<transport::CudaStream> stream_of(int device, bool serving = false);
  [[nodiscard]] Status copy(int device, void* dst, const void* src, std::uint64_t bytes, transport::CudaEvent& event,
                            bool serving = false);
  // UCX's access to a VRAM region of ours for peers' slices
  // (UcxTransport::StagedAccess), on a stream per GPU of its own, so it
  // never waits behind our staging copies: a write is copied from the
  // message into a pinned buffer, then to the GPU; a read, from the GPU
  // into a pinned buffer; UCX polls the copy's event before it answers.
  class Served;
  struct ServedCopy {
    int device = 0;
    transport::CudaStream stream = 0;
    std::byte* data = nullptr;  // pinned, of served_buffer()'s
    std::uint64_t capacity = 0;
    std::uint64_t bytes = 0;
    bool write = false;
    transport::CudaEvent event = 0;
  };
  // Served copies' buffers: pinned, and not registered with UCX (UCX only
  // copies into and out of them, and registering would re-enter the
  // transport, which calls us under its hold). Kept for reuse up to
  // kServedPoolBytes.
  static constexpr std::uint64_t kServedPoolBytes = 64ULL << 20;
  [[nodiscard]] Result<std::pair<std::byte*, std::uint64_t>> served_buffer(std::uint64_t bytes);
  void give_back_served(std::byte* data, std::uint64_t capacity);
  // A peer's write to `dst` (from `src`, host memory), or read of `src`.
  [[nodiscard]] Result<std::uint64_t> serve(int device, void* dst, const void* src, std::size_t bytes, bool write);
  [[nodiscard]] std::optional<Result<std::span<const std::byte>>> served(std::uint64_t ticket);
  void release_served(std::uint64_t ticket);
  void retire_serve_stream(int device, transport::CudaStream stream);
  // Ends a staged slice: its completion (unless cancelled), its bounce back.
  void finish(transport::SliceId id, Staged& s, Status status, TimeNs now_ns,
              std::vector<transport::Completion>& out);

  std::unique_ptr<transport::UcxTransport> ucx_;
  std::shared_ptr<transport::CudaRuntime> cuda_;
  std::unique_ptr<transport::CudaTransport> local_;
  std::unordered_set<transport::SliceId> local_slices_;  // in flight on local_
  mutable std::vector<transport::PathInfo> all_paths_;    // local_'s, then UCX's (paths())
  std::map<std::uint64_t, Region> regions_;  // by base
  std::unordered_map<transport::RegionHandle, std::uint64_t> region_base_;
  std::multimap<std::uint64_t, Bounce> free_bounces_;  // by capacity
  std::vector<Bounce> all_bounces_;
  std::unordered_map<int, transport::CudaStream> streams_;  // by device
  std::unordered_map<int, transport::CudaStream> serve_streams_;  // by device
  std::vector<transport::CudaStream> retired_streams_;  // failed once: destroyed with the engine
  std::unordered_map<std::uint64_t, ServedCopy> served_;  // by ticket
  std::multimap<std::uint64_t, std::byte*> served_free_;          // by capacity
  std::uint64_t served_kept_ = 0;                                  // their bytes
  std::uint64_t next_ticket_ = 1;
  bool closing_ = false;  // the destructor runs: serving refuses
  std::unordered_map<int, std::vector<transport::CudaEvent>> free_events_;  // by device
  std::vector<transport::CudaEvent> all_events_;
  std::unordered_map<transport::SliceId, Staged> slices_;
  std::vector<transport::Completion> ucx_done_;  // poll's scratch
  TimeNs last_poll_ns_ = 0;
};

}  // namespace baton::engine
