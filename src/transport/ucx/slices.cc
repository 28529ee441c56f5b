// Slices (UcxTransport::State, state.h): completions of what was posted,
// flushes and bundles, the holder's answers to message slices (compressed
// or bundled), and handing completions and same-host copies to the loop.
#include "transport/ucx/state.h"

#include "baton/common/copy.h"
#include "baton/common/log.h"

namespace baton::transport {

void UcxTransport::State::on_slice_request(void* request, ucs_status_t status, void* user_data) {
  auto* op = static_cast<SliceOp*>(user_data);
  const auto recording = op->state->record();
  op->request = nullptr;
  ucp_request_free(request);
  op->state->settle(*op, status);
}

void UcxTransport::State::on_flush(void* request, ucs_status_t status, void* user_data) {
  auto* group = static_cast<FlushGroup*>(user_data);
  const auto recording = group->state->record();
  ucp_request_free(request);
  group->request = nullptr;
  State* state = group->state;
  for (SliceOp* op : group->ops) state->settle(*op, status);
  state->flushes.erase(group);
}

// One of a slice's requests (its RMA, the flush that covers its write, or
// the send of its message) ended; the slice finishes with the last, and
// not before the holder's answer where it awaits one. A message that was
// not sent gets no answer.
void UcxTransport::State::settle(SliceOp& op, ucs_status_t status) {
  if (status != UCS_OK && op.status == UCS_OK) op.status = status;
  if (status != UCS_OK) op.awaiting_reply = false;
  if (--op.pending == 0 && !op.awaiting_reply) finished.push_back(&op);
}

// Posts one flush per lane that has writes posted since its last: a put
// completes when its source may be reused, and its bytes are at the peer
// only once a flush after it completed. One flush for a lane's whole burst
// of writes (a batch, a scheduler tick) instead of one per slice.
void UcxTransport::State::flush_lanes() {
  for (Lane* lane : std::exchange(to_flush, {})) {
    if (!lane->bundled.empty()) send_bundle(*lane);
    if (lane->unflushed.empty()) continue;  // it closed since
    auto group = std::make_unique<FlushGroup>();
    group->state = this;
    group->ops = std::exchange(lane->unflushed, {});
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    param.cb.send = &State::on_flush;
    param.user_data = group.get();
    void* f = ucp_ep_flush_nbx(lane->ep, &param);
    ++flushes_posted;
    if (f == nullptr || UCS_PTR_IS_ERR(f)) {
      const ucs_status_t st = f == nullptr ? UCS_OK : UCS_PTR_STATUS(f);
      for (SliceOp* op : group->ops) settle(*op, st);
      continue;
    }
    group->request = f;
    FlushGroup* key = group.get();
    flushes.emplace(key, std::move(group));
  }
}

// A lane closes with writes that no flush covers yet: they fail (a forced
// close cancels their puts too). Its unsent bundle goes unsent: its slices
// await a reply, and the caller fails those.
void UcxTransport::State::drop_unflushed(Lane& lane) {
  for (SliceOp* op : std::exchange(lane.unflushed, {})) settle(*op, UCS_ERR_CONNECTION_RESET);
  buffers.give(std::exchange(lane.bundle, {}));
  lane.bundled.clear();
  lane.bundled_bytes = 0;
}

// Adds a small raw slice to its lane's bundle; the bundle goes when full,
// else with the lane's flush.
void UcxTransport::State::add_to_bundle(Lane& lane, MessageKind kind, const SliceOp& op, const SliceDescriptor& d,
                                        std::span<const std::uint8_t> data) {
  if (lane.bundled.empty()) {
    lane.bundle = ucx::begin_bundle(buffers.take(kBundleBytes + ucx::kBundleEntryBytes));
    if (lane.unflushed.empty()) to_flush.push_back(&lane);
  }
  ucx::add_to_bundle(lane.bundle, kind, op.submit.id, d, data);
  lane.bundled.push_back(op.submit.id);
  lane.bundled_bytes += op.wire_bytes;
  if (lane.bundled_bytes >= kBundleBytes || lane.bundled.size() == ucx::kMaxBundleEntries) send_bundle(lane);
}

void UcxTransport::State::send_bundle(Lane& lane) {
  const std::vector<SliceId> ids = std::exchange(lane.bundled, {});
  lane.bundled_bytes = 0;
  if (ids.empty() || lane.ep == nullptr) return;
  MessageHeader header;
  header.path = lane.path;
  header.lane = static_cast<std::uint32_t>(lane.index);
  Status sent = send_message(lane.ep, MessageKind::kSliceBundle, header, std::exchange(lane.bundle, {}));
  if (sent.is_ok()) {
    ++bundles_sent;
    return;
  }
  for (SliceId id : ids) {
    const auto it = slices.find(id);
    if (it != slices.end() && it->second->awaiting_reply) {
      finish_compressed(*it->second, UCS_ERR_IO_ERROR, "its bundle was not sent: " + sent.message());
    }
  }
}

// The holder answered (or never will): the slice ends, once UCX no longer
// reads its memory where it was sent from there (settle).
void UcxTransport::State::finish_compressed(SliceOp& op, ucs_status_t status, std::string error) {
  op.awaiting_reply = false;
  if (status != UCS_OK && op.status == UCS_OK) op.status = status;
  if (!error.empty() && op.error.empty()) op.error = std::move(error);
  if (op.pending == 0) finished.push_back(&op);
}

// A raw write slice as one message whose bytes UCX takes from the caller's
// region (an iov: the descriptor, then the region's bytes), instead of a
// copy into a message buffer first: one memcpy of every byte fewer on the
// sender (docs/transport.md). The slice holds the region until the send's
// callback ran (settle), besides the holder's answer.
Status UcxTransport::State::send_from_region(ucp_ep_h ep, const MessageHeader& header, const SliceDescriptor& d,
                                             const void* data, SliceOp& op) {
  op.am_header = ucx::encode_header(header);
  op.descriptor = ucx::encode_slice(d, {});
  op.iov[0] = {op.descriptor.data(), op.descriptor.size()};
  op.iov[1] = {const_cast<void*>(data), d.payload_len};
  ucp_request_param_t param{};
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_DATATYPE;
  param.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
  param.datatype = ucp_dt_make_iov();
  param.cb.send = &State::on_slice_request;
  param.user_data = &op;
  void* request = ucp_am_send_nbx(ep, static_cast<unsigned>(MessageKind::kWriteData), op.am_header.data(),
                                  op.am_header.size(), op.iov, 2, &param);
  if (UCS_PTR_IS_ERR(request)) return ucx_failure("ucx slice", "ucp_am_send_nbx", UCS_PTR_STATUS(request));
  if (request != nullptr) {
    op.request = request;
    ++op.pending;
  }
  return Status::ok();
}

const Codec* UcxTransport::State::codec_for(WireCodec id) {
  if (id == WireCodec::kLz4) {
    if (!lz4) lz4 = make_lz4_codec();
    return lz4.get();
  }
  if (id == WireCodec::kZstd) {
    if (!zstd) zstd = std::move(*make_zstd_codec(1));
    return zstd.get();
  }
  return nullptr;
}

// The local region `key` when it holds [addr, addr + length), or why not.
Result<LocalRegion*> UcxTransport::State::local_range(std::uint32_t key, std::uint64_t addr, std::uint64_t length) {
  const auto base = region_base.find(key);
  if (base == region_base.end()) return std::unexpected(Status::not_found("no region {} here", key));
  LocalRegion& r = regions.at(base->second);
  if (addr < r.base || length > r.length || addr - r.base > r.length - length) {
    return std::unexpected(Status::out_of_range("[{:#x}, +{}) is not inside region {} [{:#x}, +{})", addr, length,
                                                key, r.base, r.length));
  }
  return &r;
}

// Writes a slice's bytes (compressed or raw) to `out` (exactly its size).
Status UcxTransport::State::unpack(const SliceDescriptor& d, std::span<const std::uint8_t> data, std::byte* out) {
  const std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data.data()), data.size());
  if (d.codec == WireCodec::kRaw) {
    if (data.size() != d.payload_len) {
      return Status::invalid_argument("raw slice of {} bytes, {} announced", data.size(), d.payload_len);
    }
    copy_bytes(out, in.data(), in.size());
    return Status::ok();
  }
  return codec_for(d.codec)->decompress(in, std::span(out, d.payload_len));
}

// A slice of a staged region: its copy starts now (a write's from the
// message, a compressed one's through a host buffer), or once one of the
// kMaxStagedCopies running ended; its answer goes once it ended
// (answer_staged_copies), so this side goes on serving meanwhile.
Status UcxTransport::State::start_staged_copy(LocalRegion& r, MessageKind kind, std::uint64_t session,
                                              const MessageHeader& header, const SliceDescriptor& d,
                                              std::span<const std::uint8_t> data) {
  const MessageKind answer = kind == MessageKind::kReadAsk ? MessageKind::kReadData : MessageKind::kWriteDone;
  std::vector<std::uint8_t> host;  // a write's raw bytes, when the message does not hold them
  std::span<const std::uint8_t> raw = data;
  if (answer == MessageKind::kWriteDone && d.codec == WireCodec::kRaw && data.size() != d.payload_len) {
    return Status::invalid_argument("raw slice of {} bytes, {} announced", data.size(), d.payload_len);
  }
  if (answer == MessageKind::kWriteDone && d.codec != WireCodec::kRaw) {
    host = buffers.take(d.payload_len);
    host.resize(d.payload_len);
    if (Status s = unpack(d, data, reinterpret_cast<std::byte*>(host.data())); !s.is_ok()) {
      buffers.give(std::move(host));
      return s;
    }
    raw = host;
  }
  StagedCopy copy{answer, session, header, d, r.staged, 0};
  if (staged_copies.size() >= kMaxStagedCopies) {
    // The message is not kept: a write waits with a copy of its bytes.
    if (answer == MessageKind::kWriteDone && host.empty()) {
      host = buffers.take(raw.size());
      host.assign(raw.begin(), raw.end());
    }
    staged_waiting.push_back({std::move(copy), std::move(host)});
  } else {
    auto ticket = begin_staged_copy(copy, raw);
    buffers.give(std::move(host));
    if (!ticket) return ticket.error();
    copy.ticket = *ticket;
    staged_copies.push_back(std::move(copy));
  }
  ++r.serving;
  staged_bytes += d.payload_len;
  return Status::ok();
}

// Starts the access's copy for `copy` (a write's from `raw`).
Result<std::uint64_t> UcxTransport::State::begin_staged_copy(const StagedCopy& copy,
                                                             std::span<const std::uint8_t> raw) {
  const SliceDescriptor& d = copy.reply;
  if (copy.answer == MessageKind::kReadData) {
    return copy.access->start_read(reinterpret_cast<const void*>(d.addr), d.payload_len);
  }
  return copy.access->start_write(reinterpret_cast<void*>(d.addr), raw.data(), raw.size());
}

// Staged copies that ended are answered (unless their peer left), and
// waiting ones take their places; the others wait for a later poll.
void UcxTransport::State::answer_staged_copies() {
  std::erase_if(staged_copies, [this](StagedCopy& copy) {
    auto done = copy.access->done(copy.ticket);
    if (!done) return false;
    const std::uint64_t expected = copy.answer == MessageKind::kReadData ? copy.reply.payload_len : 0;
    if (*done && (*done)->size() != expected) {
      done = std::unexpected(Status::internal("the staged copy gave {} bytes for {}", (*done)->size(), expected));
    }
    end_staged_copy(copy, *done);
    copy.access->release(copy.ticket);
    return true;
  });
  while (!staged_waiting.empty() && staged_copies.size() < kMaxStagedCopies) {
    StagedWaiting w = std::move(staged_waiting.front());
    staged_waiting.pop_front();
    auto ticket = begin_staged_copy(w.copy, w.bytes);
    buffers.give(std::move(w.bytes));
    if (!ticket) {
      end_staged_copy(w.copy, std::unexpected(ticket.error()));
      continue;
    }
    w.copy.ticket = *ticket;
    staged_copies.push_back(std::move(w.copy));
  }
}

// Sends a staged copy's answer (a read's bytes, or why it failed) and
// lets go of what it held.
void UcxTransport::State::end_staged_copy(const StagedCopy& copy, const Result<std::span<const std::byte>>& done) {
  staged_bytes -= copy.reply.payload_len;
  if (auto base = region_base.find(copy.reply.key); base != region_base.end()) --regions.at(base->second).serving;
  const auto session = sessions.find(copy.session);
  ucp_ep_h back = session == sessions.end() ? nullptr : back_endpoint(session->second, copy.header.lane);
  if (back == nullptr) return;  // the peer left
  Answer a;
  a.reply = copy.reply;
  if (!done) {
    refuse(a, done.error());
  } else if (copy.answer == MessageKind::kReadData) {
    reply_with(a, done->data());
  }
  if (Status s = send_answer(back, copy.session, copy.answer, copy.header, a); !s.is_ok()) {
    baton::logger().warn("ucx: answer to staged slice {} not sent: {}", copy.header.seq, s.message());
  }
}

// `bytes` compressed with `id` when that shrinks them, else raw.
std::pair<WireCodec, std::vector<std::uint8_t>> UcxTransport::State::pack(WireCodec id, const Codec* with,
    const std::byte* bytes, std::uint64_t length) {
  std::vector<std::byte> packed;
  const std::span<const std::byte> in(bytes, length);
  if (with != nullptr) {
    if (auto shrunk = with->compress(in, packed); shrunk && *shrunk) {
      const auto* p = reinterpret_cast<const std::uint8_t*>(packed.data());
      return {id, std::vector<std::uint8_t>(p, p + packed.size())};
    }
  }
  const auto* p = reinterpret_cast<const std::uint8_t*>(bytes);
  return {WireCodec::kRaw, std::vector<std::uint8_t>(p, p + length)};
}

auto UcxTransport::State::answer_slice(const Session& session, ucp_ep_h from, MessageKind kind,
                                       const Result<SliceDescriptor>& d, std::span<const std::uint8_t> payload,
                                       std::uint64_t queued, const MessageHeader& header) -> Answer {
  Answer a;
  a.kind = kind == MessageKind::kWriteData ? MessageKind::kWriteDone : MessageKind::kReadData;
  Status why;
  if (!d) {
    why = d.error();
  } else if (!session.sent.contains(d->key) && !revoking_for(d->key, session_by_ep.at(from))) {
    a.reply = *d;
    why = Status::permission_denied("region {} is not exported to {}", d->key, session.name);
  } else {
    a.reply = *d;
    auto region = local_range(d->key, d->addr, d->payload_len);
    auto* at = reinterpret_cast<std::byte*>(d->addr);
    if (!region) {
      why = region.error();
    } else if (kind == MessageKind::kWriteData && !(*region)->staged) {
      why = unpack(*d, payload, at);
    } else if (outgoing_bytes + staged_bytes + queued + d->payload_len > kMaxQueuedReplyBytes) {
      // A peer asking faster than the wire drains (or the staged copies
      // end) would make us hold memory without bound: refuse, it retries
      // the slice.
      why = Status::resource_exhausted("{} bytes of replies and staged copies are waiting (at most {})",
                                       outgoing_bytes + staged_bytes + queued, kMaxQueuedReplyBytes);
    } else if ((*region)->staged && staged_waiting.size() >= kMaxStagedWaiting) {
      why = Status::resource_exhausted("{} copies of staged memory run and {} wait (at most {})",
                                       staged_copies.size(), staged_waiting.size(), kMaxStagedWaiting);
    } else if ((*region)->staged) {
      why = start_staged_copy(**region, kind, session_by_ep.at(from), header, *d, payload);
      a.deferred = why.is_ok();
    } else {
      reply_with(a, at);
    }
  }
  if (!why.is_ok()) refuse(a, why);
  return a;
}

// A read's answer carries `bytes` (a.reply.payload_len of them): raw
// without a copy before the reply's own, or compressed when asked and it
// shrinks them.
void UcxTransport::State::reply_with(Answer& a, const std::byte* bytes) {
  if (a.reply.codec == WireCodec::kRaw) {
    a.data = std::span(reinterpret_cast<const std::uint8_t*>(bytes), a.reply.payload_len);
    return;
  }
  auto [id, packed] = pack(a.reply.codec, codec_for(a.reply.codec), bytes, a.reply.payload_len);
  a.reply.codec = id;
  a.packed = std::move(packed);
  a.data = a.packed;
}

// Sends one answer alone; its packed bytes go back to the pool.
Status UcxTransport::State::send_answer(ucp_ep_h back, std::uint64_t session, MessageKind kind,
                                        const MessageHeader& header, Answer& a) {
  auto payload = ucx::encode_slice(a.reply, a.data, buffers.take(ucx::kSliceDescriptorBytes + a.data.size()));
  buffers.give(std::move(a.packed));
  return send_message(back, kind, header, std::move(payload), session);
}

// Before answering `session`: when the answers queued for peers hold more
// than kMaxSessionQueuedBytes, the peer holding the most does not drain its
// back lanes, and answering it more (refusals are never refused) would hold
// memory without bound, so its session is closed. False when that is
// `session`.
bool UcxTransport::State::answers_drain(std::uint64_t session) {
  if (session_queued_bytes <= kMaxSessionQueuedBytes) return true;
  auto most = std::ranges::max_element(sessions, {}, [](const auto& kv) { return kv.second.queued_bytes; });
  const std::uint64_t closed = most->first;
  close_session(closed, fmt::format("its answers do not drain: {} bytes wait for its lanes ({} for every peer, at "
                                    "most {})",
                                    most->second.queued_bytes, session_queued_bytes, kMaxSessionQueuedBytes));
  return closed != session;
}

// The answer says the slice was refused, and why.
void UcxTransport::State::refuse(Answer& a, const Status& why) {
  a.reply.failed = 1;
  a.reply.payload_len = std::max<std::uint64_t>(a.reply.payload_len, 1);
  const std::string text = why.message();
  a.packed.assign(text.begin(), text.end());
  a.data = a.packed;
}

// The back lane of the rail a slice came on; another when that one failed.
ucp_ep_h UcxTransport::State::back_endpoint(const Session& session, std::uint32_t lane) {
  for (std::size_t i = 0; i < session.back.size(); ++i) {
    if (ucp_ep_h ep = session.back[(lane + i) % session.back.size()]->ep) return ep;
  }
  return nullptr;
}

// The holder's side: a bound lane asks to write or read one slice.
void UcxTransport::State::handle_slice_request(const Inbound& in, const MessageHeader& header) {
  Session* session = session_of(in.reply_ep);
  if (session == nullptr) {
    // After we shut down (its session closed) this is a slice already on the wire.
    if (shut_down) baton::logger().debug("ucx: a slice message after shutdown; dropped");
    else warn_about_peer("ucx: a slice message from an endpoint no authenticated peer bound; dropped");
    return;
  }
  const std::uint64_t id = session_by_ep.at(in.reply_ep);
  if (!answers_drain(id)) return;
  std::size_t at = 0;
  auto d = ucx::decode_slice(in.payload, at);
  Answer a = answer_slice(*session, in.reply_ep, in.kind, d, in.payload.subspan(d ? at : 0), 0, header);
  if (a.deferred) return;
  ucp_ep_h back = back_endpoint(*session, header.lane);
  if (back == nullptr) {
    baton::logger().warn("ucx: reply to compressed slice {} not sent: no endpoint to {} left", header.seq, session->name);
    return;
  }
  if (Status s = send_answer(back, id, a.kind, header, a); !s.is_ok()) {
    baton::logger().warn("ucx: reply to compressed slice {} not sent: {}", header.seq, s.message());
  }
}

// The holder's side: a bundle of small slices, answered as one bundle
// (more than one when the replies outgrow kBundleBytes).
void UcxTransport::State::handle_bundle(const Inbound& in, const MessageHeader& header) {
  Session* session = session_of(in.reply_ep);
  if (session == nullptr) {
    if (shut_down) baton::logger().debug("ucx: a bundle after shutdown; dropped");
    else warn_about_peer("ucx: a bundle from an endpoint no authenticated peer bound; dropped");
    return;
  }
  const std::uint64_t id = session_by_ep.at(in.reply_ep);
  if (!answers_drain(id)) return;
  auto entries = ucx::decode_bundle(in.payload);
  if (!entries) {
    // Its slices stall and fail on the initiator's stall timeout: only a
    // corrupt or hostile peer sends one.
    warn_about_peer(fmt::format("ucx: dropped a bundle from {}: {}", session->name, entries.error().message()));
    return;
  }
  ucp_ep_h back = back_endpoint(*session, header.lane);
  if (back == nullptr) {
    baton::logger().warn("ucx: replies to a bundle not sent: no endpoint to {} left", session->name);
    return;
  }
  std::vector<std::uint8_t> reply;
  auto send = [&] {
    if (Status s = send_message(back, MessageKind::kReplyBundle, header, std::move(reply), id); !s.is_ok()) {
      baton::logger().warn("ucx: replies to a bundle not sent: {}", s.message());
    }
    reply = {};
  };
  for (const ucx::BundleEntry& e : *entries) {
    if (e.kind != MessageKind::kWriteData && e.kind != MessageKind::kReadAsk) {
      warn_about_peer(fmt::format("ucx: a bundle from {} holds a reply (kind {}); skipped", session->name,
                                  static_cast<unsigned>(e.kind)));
      continue;
    }
    MessageHeader entry = header;
    entry.seq = e.seq;  // a deferred answer goes alone, named by its slice
    Answer a = answer_slice(*session, in.reply_ep, e.kind, e.descriptor, e.data, reply.size(), entry);
    if (a.deferred) continue;
    if (a.data.size() > kMaxBundledSliceBytes) {
      // A large read's bytes go at once, alone (from a bundle they would
      // wait for the rest and be copied once more).
      if (Status s = send_answer(back, id, a.kind, entry, a); !s.is_ok()) {
        baton::logger().warn("ucx: reply to slice {} not sent: {}", e.seq, s.message());
      }
      continue;
    }
    if (reply.empty()) reply = ucx::begin_bundle(buffers.take(kBundleBytes + ucx::kBundleEntryBytes));
    ucx::add_to_bundle(reply, a.kind, e.seq, a.reply, a.data);
    buffers.give(std::move(a.packed));
    if (reply.size() >= kBundleBytes || ucx::bundle_entries(reply) == ucx::kMaxBundleEntries) send();
  }
  if (!reply.empty()) send();
}

// The initiator's side: the holder answered slice `seq` on `lane`.
void UcxTransport::State::take_answer(Lane* lane, std::uint64_t seq, MessageKind kind, const Result<SliceDescriptor>& d,
                                      std::span<const std::uint8_t> data, std::size_t wire_bytes) {
  const auto it = slices.find(seq);
  if (lane == nullptr || it == slices.end() || !it->second->awaiting_reply || it->second->submit.path != lane->path ||
      (kind == MessageKind::kReadData) != (it->second->submit.memory.op == Op::kRead)) {
    // Expected once the slice's path failed or we shut down: its slices
    // ended then, and replies already on the wire still come in.
    const bool late = shut_down || lane == nullptr || peers[lane->path].state != PathState::kReady;
    if (late) baton::logger().debug("ucx: a late reply for slice {}; dropped", seq);
    else warn_about_peer(fmt::format("ucx: a reply for slice {} that is not waiting for one; dropped", seq));
    return;
  }
  SliceOp& op = *it->second;
  if (!d) {
    finish_compressed(op, UCS_ERR_INVALID_PARAM, d.error().message());
    return;
  }
  if (d->failed != 0) {
    finish_compressed(op, UCS_ERR_REJECTED, "the holder refused: " + std::string(data.begin(), data.end()));
    return;
  }
  if (kind == MessageKind::kReadData) {
    op.wire_bytes += wire_bytes;
    if (d->payload_len != op.submit.bytes) {
      finish_compressed(op, UCS_ERR_INVALID_PARAM, fmt::format("{} bytes came back, {} asked", d->payload_len,
                                                               op.submit.bytes));
      return;
    }
    if (Status s = unpack(*d, data, static_cast<std::byte*>(op.submit.memory.local)); !s.is_ok()) {
      finish_compressed(op, UCS_ERR_INVALID_PARAM, s.message());
      return;
    }
  }
  finish_compressed(op, UCS_OK, {});
}

void UcxTransport::State::handle_slice_reply(const Inbound& in, const MessageHeader& header) {
  std::size_t at = 0;
  auto d = ucx::decode_slice(in.payload, at);
  take_answer(lane_of(header), header.seq, in.kind, d, in.payload.subspan(d ? at : 0), in.payload.size());
}

void UcxTransport::State::handle_bundle_reply(const Inbound& in, const MessageHeader& header) {
  Lane* lane = lane_of(header);
  auto entries = ucx::decode_bundle(in.payload);
  if (!entries) {
    warn_about_peer(fmt::format("ucx: dropped a reply bundle: {}", entries.error().message()));
    return;
  }
  for (const ucx::BundleEntry& e : *entries) {
    if (e.kind != MessageKind::kWriteDone && e.kind != MessageKind::kReadData) {
      warn_about_peer(fmt::format("ucx: a reply bundle holds a request (kind {}); skipped", static_cast<unsigned>(e.kind)));
      continue;
    }
    take_answer(lane, e.seq, e.kind, e.descriptor, e.data, ucx::kBundleEntryBytes + e.data.size());
  }
}

// The lane a listener's message is for, or null when it is stale or forged.
auto UcxTransport::State::lane_of(const MessageHeader& header) -> Lane* {
  if (header.path >= peers.size()) return nullptr;
  Peer& peer = peers[header.path];
  if (peer.state == PathState::kFailed || header.lane >= peer.lanes.size()) return nullptr;
  Lane* lane = peer.lanes[header.lane].get();
  return lane->ep == nullptr ? nullptr : lane;
}

void UcxTransport::State::handle_recorded() {
  // Acting may record more (a forced close completes requests at once), so
  // go round until nothing is left.
  while (!lane_errors.empty() || !back_errors.empty() || !inbox.empty()) {
    for (const BackError& e : std::exchange(back_errors, {})) fail_back_rail(e);
    for (auto [lane, status] : std::exchange(lane_errors, {})) {
      if (lane->ep == nullptr) continue;
      fail_rail(lane->path, lane->rail,
                Status::unavailable("path {} to {}: lane {}{} failed: {}", lane->path, peers[lane->path].address,
                                    lane->index, rail_name(lane->rail), ucs_status_string(status)));
    }
    for (Inbound& in : std::exchange(inbox, {})) {
      auto header = ucx::decode_header(in.header);
      if (!header) {
        warn_about_peer(fmt::format("ucx: dropped a message: {}", header.error().message()));
        continue;
      }
      switch (in.kind) {
        case MessageKind::kQuery: handle_bind(in); break;
        case MessageKind::kWriteData:
        case MessageKind::kReadAsk: handle_slice_request(in, *header); break;
        case MessageKind::kWriteDone:
        case MessageKind::kReadData: handle_slice_reply(in, *header); break;
        case MessageKind::kSliceBundle: handle_bundle(in, *header); break;
        case MessageKind::kReplyBundle: handle_bundle_reply(in, *header); break;
      }
      buffers.give(std::move(in.copy));
    }
  }
}

// The copier, made and watched on first use; false (copy inline) when the
// kernel refuses its eventfd.
bool UcxTransport::State::cma_copier() {
  if (copier) return true;
  auto made = ucx::CmaCopier::create();
  if (!made) {
    baton::logger().warn("ucx: CMA copies stay on the loop: {}", made.error().message());
    return false;
  }
  copier = std::move(*made);
  poller->watch(copier->fd(), false);
  return true;
}

// CMA copies the copier finished become completions. A copy that failed
// because its holder is exiting fails the holder's path at once: that
// shows within a millisecond of a SIGKILL, while its control connection
// closes only after the kernel tore down its memory.
void UcxTransport::State::collect_copies() {
  if (workers) {
    workers->take(worker_done);
    for (std::uint64_t tag : worker_done) {
      if (const auto it = slices.find(tag); it != slices.end()) finished.push_back(it->second.get());
    }
    worker_done.clear();
  }
  if (!copier) return;
  for (ucx::CmaCopier::Done& done : copier->take()) {
    const auto it = slices.find(done.tag);
    if (it == slices.end()) continue;
    SliceOp& op = *it->second;
    if (!done.status.is_ok()) op.error = done.status.message();
    finished.push_back(&op);
    const PathId path = op.submit.path;
    if (done.holder_exiting && peers[path].state != PathState::kFailed) {
      fail_path(path, Status::unavailable("path {} to {}: its process {} died", path, peers[path].address,
                                          peers[path].same_host_pid));
    }
  }
}

void UcxTransport::State::check_holders(TimeNs now_ns) {
  for (PathId id = 0; id < peers.size(); ++id) {
    Peer& peer = peers[id];
    if (peer.state != PathState::kReady || peer.same_host_pid == 0 || peer.inflight == 0) continue;
    if (now_ns < peer.next_holder_check_ns) continue;
    peer.next_holder_check_ns = now_ns + kHolderCheckNs;
    if (ucx::process_exiting(peer.same_host_pid)) {
      fail_path(id, Status::unavailable("path {} to {}: its process {} died", id, peer.address,
                                        peer.same_host_pid));
    }
  }
}

void UcxTransport::State::hand_out(TimeNs now_ns, std::vector<Completion>& out) {
  for (SliceOp* op : std::exchange(finished, {})) {
    const SliceSubmit& s = op->submit;
    Completion c{s.id, s.path, s.lane, s.bytes, now_ns, Status::ok(), op->compressed ? op->wire_bytes : s.bytes};
    if (!op->error.empty()) {
      c.status = Status::unavailable("ucx: slice {} ({} bytes, path {} lane {}): {}", s.id, s.bytes, s.path, s.lane,
                                     op->error);
    } else if (op->status != UCS_OK) {
      c.status = Status::unavailable("ucx: slice {} ({} bytes, path {} lane {}) failed: {}", s.id, s.bytes,
                                     s.path, s.lane, ucs_status_string(op->status));
    }
    --op->local->inflight;
    Peer& peer = peers[s.path];
    --peer.inflight;
    --peer.rails[op->rail].inflight;
    peer.rails[op->rail].last_progress_ns = now_ns;
    out.push_back(std::move(c));
    slices.erase(s.id);
  }
}

}  // namespace baton::transport
