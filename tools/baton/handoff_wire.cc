#include "handoff_wire.h"

#include <limits>
#include <string>

#include <fmt/format.h>

namespace baton::cli {

using nlohmann::json;

namespace {

template <typename T>
T integer(const json& value, std::string_view what) {
  if (value.is_number_unsigned()) {
    const auto v = value.get<std::uint64_t>();
    if (v <= std::uint64_t{std::numeric_limits<T>::max()}) return static_cast<T>(v);
  } else if (value.is_number_integer()) {
    const auto v = value.get<std::int64_t>();
    if (v >= std::int64_t{std::numeric_limits<T>::min()} && (v < 0 || std::uint64_t(v) <= std::numeric_limits<T>::max())) {
      return static_cast<T>(v);
    }
  }
  std::string shown = value.dump(-1, ' ', false, json::error_handler_t::replace);
  if (shown.size() > 40) shown = shown.substr(0, 40) + "…";
  throw WireError(fmt::format("\"{}\" is {}, not an integer in {}..{}", what, shown, std::numeric_limits<T>::min(),
                              std::numeric_limits<T>::max()));
}

}  // namespace

std::uint32_t wire_u32(const json& j, const char* key) { return integer<std::uint32_t>(j.at(key), key); }
std::uint64_t wire_u64(const json& j, const char* key) { return integer<std::uint64_t>(j.at(key), key); }

std::vector<std::uint32_t> wire_u32_list(const json& j, const char* key) {
  const json& list = j.at(key);
  if (!list.is_array()) throw WireError(fmt::format("\"{}\" is not an array", key));
  std::vector<std::uint32_t> out;
  out.reserve(list.size());
  for (const json& v : list) out.push_back(integer<std::uint32_t>(v, key));
  return out;
}

std::string wire_message(const json::exception& e) {
  const std::string_view what = e.what();
  const auto tag = what.starts_with("[json.exception.") ? what.find("] ") : std::string_view::npos;
  return std::string(tag == std::string_view::npos ? what : what.substr(tag + 2));
}

json to_json(const handoff::KvLayout& l) {
  return {{"layers", l.layers}, {"kv_heads", l.kv_heads}, {"head_bytes", l.head_bytes},
          {"page_tokens", l.page_tokens}, {"order", l.order == handoff::KvOrder::kHnd ? "hnd" : "nhd"},
          {"tp", l.tp}, {"sp", l.sp}, {"cfg", l.cfg}};
}

json to_json(const Status& s) { return {{"code", std::string(to_string(s.code()))}, {"message", s.message()}}; }

json to_json(const handoff::LoadOrder& o) {
  json sources = json::array();
  for (const auto& s : o.sources) sources.push_back({{"address", s.address}, {"region", s.region}, {"pages", s.pages}});
  return {{"ticket", o.ticket},   {"row", o.row},       {"tokens", o.tokens},   {"producer", to_json(o.producer)},
          {"consumer", to_json(o.consumer)}, {"rank", o.rank}, {"sources", sources}, {"pages", o.pages},
          {"timeout_ns", o.timeout_ns}};
}

json to_json(const handoff::LoadCompletion& c) {
  return {{"ticket", c.ticket}, {"row", c.row}, {"rank", c.rank}, {"status", to_json(c.status)}};
}

Result<handoff::KvLayout> layout_from_json(const json& j) {
  try {
    handoff::KvLayout l;
    l.layers = wire_u32(j, "layers");
    l.kv_heads = wire_u32(j, "kv_heads");
    l.head_bytes = wire_u32(j, "head_bytes");
    l.page_tokens = wire_u32(j, "page_tokens");
    const std::string order = j.at("order").get<std::string>();
    if (order != "hnd" && order != "nhd") {
      return std::unexpected(Status::invalid_argument("layout: order \"{}\" (expected hnd or nhd)", order));
    }
    l.order = order == "hnd" ? handoff::KvOrder::kHnd : handoff::KvOrder::kNhd;
    l.tp = wire_u32(j, "tp");
    l.sp = wire_u32(j, "sp");
    l.cfg = wire_u32(j, "cfg");
    return l;
  } catch (const json::exception& e) {
    return std::unexpected(Status::invalid_argument("layout: {}", wire_message(e)));
  }
}

Status status_from_json(const json& j) {
  try {
    const std::string code = j.at("code").get<std::string>();
    std::string message = j.at("message").get<std::string>();
    if (auto c = status_code_from_string(code)) return Status(*c, std::move(message));
    return Status::internal("unknown status code \"{}\": {}", code, message);
  } catch (const json::exception& e) {
    return Status::invalid_argument("status: {}", wire_message(e));
  }
}

Result<handoff::LoadOrder> order_from_json(const json& j) {
  try {
    handoff::LoadOrder o;
    o.ticket = wire_u64(j, "ticket");
    o.row = wire_u32(j, "row");
    o.tokens = wire_u32(j, "tokens");
    auto producer = layout_from_json(j.at("producer"));
    if (!producer) return std::unexpected(producer.error());
    auto consumer = layout_from_json(j.at("consumer"));
    if (!consumer) return std::unexpected(consumer.error());
    o.producer = *producer;
    o.consumer = *consumer;
    o.rank = wire_u32(j, "rank");
    for (const auto& s : j.at("sources")) {
      o.sources.push_back({s.at("address").get<std::string>(), wire_u32(s, "region"), wire_u32_list(s, "pages")});
    }
    o.pages = wire_u32_list(j, "pages");
    o.timeout_ns = integer<TimeNs>(j.at("timeout_ns"), "timeout_ns");
    return o;
  } catch (const json::exception& e) {
    return std::unexpected(Status::invalid_argument("load order: {}", wire_message(e)));
  }
}

Result<handoff::LoadCompletion> completion_from_json(const json& j) {
  try {
    return handoff::LoadCompletion{wire_u64(j, "ticket"), wire_u32(j, "row"), wire_u32(j, "rank"),
                                   status_from_json(j.at("status"))};
  } catch (const json::exception& e) {
    return std::unexpected(Status::invalid_argument("completion: {}", wire_message(e)));
  }
}

}  // namespace baton::cli
