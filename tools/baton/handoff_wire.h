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

// invalid_argument naming the field for a malformed object.
[[nodiscard]] Result<handoff::KvLayout> layout_from_json(const nlohmann::json& j);
[[nodiscard]] Result<handoff::LoadOrder> order_from_json(const nlohmann::json& j);
[[nodiscard]] Result<handoff::LoadCompletion> completion_from_json(const nlohmann::json& j);
[[nodiscard]] Status status_from_json(const nlohmann::json& j);

}  // namespace baton::cli
