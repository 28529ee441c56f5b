#include "handoff_wire.h"

#include <string>

namespace baton::cli {

using nlohmann::json;

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
    l.layers = j.at("layers").get<std::uint32_t>();
    l.kv_heads = j.at("kv_heads").get<std::uint32_t>();
    l.head_bytes = j.at("head_bytes").get<std::uint32_t>();
    l.page_tokens = j.at("page_tokens").get<std::uint32_t>();
    const std::string order = j.at("order").get<std::string>();
    if (order != "hnd" && order != "nhd") {
      return std::unexpected(Status::invalid_argument("layout: order \"{}\" (expected hnd or nhd)", order));
    }
    l.order = order == "hnd" ? handoff::KvOrder::kHnd : handoff::KvOrder::kNhd;
    l.tp = j.at("tp").get<std::uint32_t>();
    l.sp = j.at("sp").get<std::uint32_t>();
    l.cfg = j.at("cfg").get<std::uint32_t>();
    return l;
  } catch (const json::exception& e) {
    return std::unexpected(Status::invalid_argument("layout: {}", e.what()));
  }
}

Status status_from_json(const json& j) {
  try {
    const std::string code = j.at("code").get<std::string>();
    std::string message = j.at("message").get<std::string>();
    if (auto c = status_code_from_string(code)) return Status(*c, std::move(message));
    return Status::internal("unknown status code \"{}\": {}", code, message);
  } catch (const json::exception& e) {
    return Status::invalid_argument("status: {}", e.what());
  }
}

Result<handoff::LoadOrder> order_from_json(const json& j) {
  try {
    handoff::LoadOrder o;
    o.ticket = j.at("ticket").get<std::uint64_t>();
    o.row = j.at("row").get<std::uint32_t>();
    o.tokens = j.at("tokens").get<std::uint32_t>();
    auto producer = layout_from_json(j.at("producer"));
    if (!producer) return std::unexpected(producer.error());
    auto consumer = layout_from_json(j.at("consumer"));
    if (!consumer) return std::unexpected(consumer.error());
    o.producer = *producer;
    o.consumer = *consumer;
    o.rank = j.at("rank").get<std::uint32_t>();
    for (const auto& s : j.at("sources")) {
      o.sources.push_back({s.at("address").get<std::string>(), s.at("region").get<engine::RegionHandle>(),
                           s.at("pages").get<std::vector<std::uint32_t>>()});
    }
    o.pages = j.at("pages").get<std::vector<std::uint32_t>>();
    o.timeout_ns = j.at("timeout_ns").get<TimeNs>();
    return o;
  } catch (const json::exception& e) {
    return std::unexpected(Status::invalid_argument("load order: {}", e.what()));
  }
}

Result<handoff::LoadCompletion> completion_from_json(const json& j) {
  try {
    return handoff::LoadCompletion{j.at("ticket").get<std::uint64_t>(), j.at("row").get<std::uint32_t>(),
                                   j.at("rank").get<std::uint32_t>(), status_from_json(j.at("status"))};
  } catch (const json::exception& e) {
    return std::unexpected(Status::invalid_argument("completion: {}", e.what()));
  }
}

}  // namespace baton::cli
