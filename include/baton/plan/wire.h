// The plan's wire form (proto/baton/plan.proto), as bytes: protobuf stays an
// implementation detail of this unit.
#pragma once

#include <string>
#include <string_view>

#include "baton/common/status.h"
#include "baton/plan/plan.h"

namespace baton::plan {

// The packed protobuf TransferPlan of `plan` (which should pass validate();
// serialize_plan does not check it).
[[nodiscard]] std::string serialize_plan(const Plan& plan);

// Parses and validates: bytes that are not a TransferPlan, a version other
// than kPlanVersion, column lengths that disagree, and everything validate()
// refuses → invalid_argument.
[[nodiscard]] Result<Plan> parse_plan(std::string_view bytes);

}  // namespace baton::plan
