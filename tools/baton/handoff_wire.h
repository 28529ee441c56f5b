// The JSON lines `baton bench handoff` and its `baton handoff-worker` rank
// processes exchange over the worker's stdin and stdout: one object per
// line; a call carries "id" and its answer the same "id"; a consumer's load
// completions come unasked as {"completion": …}.
#pragma once

#include <nlohmann/json.hpp>

#include "baton/common/status.h"
#include "baton/handoff/layout.h"
#include "baton/handoff/rank.h"

namespace baton::cli {

[[nodiscard]] nlohmann::json to_json(const handoff::KvLayout& layout);
[[nodiscard]] nlohmann::json to_json(const handoff::LoadOrder& order);
[[nodiscard]] nlohmann::json to_json(const handoff::LoadCompletion& completion);
[[nodiscard]] nlohmann::json to_json(const Status& status);

// A field that is not an integer of the wanted type's range (nlohmann's
// get<> casts 4294967296 to 0 and 1e300 to anything). Thrown by the
// readers below; a json::exception, so one catch takes both.
class WireError : public nlohmann::json::exception {
 public:
  explicit WireError(const std::string& what) : exception(0, what.c_str()) {}
};
// `j[key]` as an integer of that range, or WireError naming `key`.
[[nodiscard]] std::uint32_t wire_u32(const nlohmann::json& j, const char* key);
[[nodiscard]] std::uint64_t wire_u64(const nlohmann::json& j, const char* key);
[[nodiscard]] std::vector<std::uint32_t> wire_u32_list(const nlohmann::json& j, const char* key);
// A json::exception's text without nlohmann's "[json.exception.…] " tag.
[[nodiscard]] std::string wire_message(const nlohmann::json::exception& e);

// invalid_argument naming the field for a malformed object.
[[nodiscard]] Result<handoff::KvLayout> layout_from_json(const nlohmann::json& j);
[[nodiscard]] Result<handoff::LoadOrder> order_from_json(const nlohmann::json& j);
[[nodiscard]] Result<handoff::LoadCompletion> completion_from_json(const nlohmann::json& j);
[[nodiscard]] Status status_from_json(const nlohmann::json& j);

}  // namespace baton::cli
