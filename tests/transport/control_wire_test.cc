// The control channel's frames and messages: round trips, and every bound
// checked before anything is allocated.
#include "transport/ucx/control_wire.h"

#include <gtest/gtest.h>

#include "transport/ucx/auth.h"

namespace baton::transport::ucx {
namespace {

TEST(ControlWire, FramesComeOffTheFrontOneAtATime) {
  std::vector<std::uint8_t> buffer = encode_frame(ControlKind::kRefresh, encode_seq(7));
  const auto second = encode_frame(ControlKind::kNotify, encode_text("hello"));
  buffer.insert(buffer.end(), second.begin(), second.end());
  buffer.pop_back();  // the second is incomplete
  auto first = take_frame(buffer, 64);
  ASSERT_TRUE(first.has_value() && first->has_value());
  EXPECT_EQ((*first)->kind, ControlKind::kRefresh);
  EXPECT_EQ(decode_seq((*first)->body).value(), 7u);
  auto none = take_frame(buffer, 64);
  ASSERT_TRUE(none.has_value());
  EXPECT_FALSE(none->has_value());
  buffer.push_back('o');
  auto last = take_frame(buffer, 64);
  ASSERT_TRUE(last.has_value() && last->has_value());
  EXPECT_EQ(decode_text((*last)->body, 64).value(), "hello");
  EXPECT_TRUE(buffer.empty());
}

TEST(ControlWire, AnOversizedOrUnknownFrameIsRefusedFromItsHeader) {
  std::vector<std::uint8_t> huge = {0xff, 0xff, 0xff, 0xff, static_cast<std::uint8_t>(ControlKind::kHello)};
  auto refused = take_frame(huge, kMaxHandshakeFrameBytes);
  ASSERT_FALSE(refused.has_value());
  EXPECT_NE(refused.error().message().find("4294967295 bytes"), std::string::npos) << refused.error().message();
  std::vector<std::uint8_t> unknown = {0, 0, 0, 0, 200};
  EXPECT_FALSE(take_frame(unknown, 64).has_value());
  std::vector<std::uint8_t> zero = {0, 0, 0, 0, 0};
  EXPECT_FALSE(take_frame(zero, 64).has_value());
}

TEST(ControlWire, AnotherProgramsAnswerIsNamedByItsBytes) {
  const std::string http = "HTTP/1.1 400 Bad Request\r\n\r\n";
  std::vector<std::uint8_t> buffer(http.begin(), http.end());
  auto refused = take_frame(buffer, kMaxHandshakeFrameBytes);
  ASSERT_FALSE(refused.has_value());
  const std::string& m = refused.error().message();
  EXPECT_NE(m.find("\"HTTP/1.1 400 Bad… (28 bytes)\""), std::string::npos) << m;
  EXPECT_NE(m.find("not a Baton peer"), std::string::npos) << m;
  std::vector<std::uint8_t> binary = {0, 0, 0, 0, 200, '"', 0x7f};
  auto escaped = take_frame(binary, 64);
  ASSERT_FALSE(escaped.has_value());
  EXPECT_NE(escaped.error().message().find("\"\\x00\\x00\\x00\\x00\\xc8\\x22\\x7f\""), std::string::npos)
      << escaped.error().message();
}

TEST(ControlWire, MessagesRoundTrip) {
  Hello hello;
  hello.nonce.fill(1);
  hello.proof.fill(2);
  hello.name = "10.0.0.2:7000";
  hello.lanes = 4;
  hello.worker_addresses = {{5, 6, 7}, {8}};  // two rails
  auto h = decode_hello(encode(hello));
  ASSERT_TRUE(h.has_value()) << h.error().to_string();
  EXPECT_EQ(h->name, hello.name);
  EXPECT_EQ(h->lanes, 4);
  EXPECT_EQ(h->proof, hello.proof);
  EXPECT_EQ(h->worker_addresses, hello.worker_addresses);
  Welcome welcome;
  welcome.proof.fill(3);
  welcome.session = 99;
  welcome.worker_addresses = {{1, 2, 3}};
  welcome.regions = {{5, 0x1000, 4096, {{9, 9}, {7}}}};
  auto w = decode_welcome(encode(welcome));
  ASSERT_TRUE(w.has_value()) << w.error().to_string();
  EXPECT_EQ(w->session, 99u);
  EXPECT_EQ(w->worker_addresses, welcome.worker_addresses);
  EXPECT_EQ(w->regions, welcome.regions);
  auto r = decode_revoke(encode(Revoke{3, {5, 6}}));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->keys, (std::vector<std::uint32_t>{5, 6}));
  auto g = decode_regions_update(encode(Regions{8, welcome.regions}));
  ASSERT_TRUE(g.has_value());
  EXPECT_EQ(g->seq, 8u);
  Direct direct{4242, 0x7f00'0000'1000, {}};
  direct.cookie.fill(0xc5);
  auto d = decode_direct(encode(direct));
  ASSERT_TRUE(d.has_value()) << d.error().to_string();
  EXPECT_EQ(d->pid, 4242u);
  EXPECT_EQ(d->cookie_address, direct.cookie_address);
  EXPECT_EQ(d->cookie, direct.cookie);
  EXPECT_EQ(decode_flag(encode_flag(true)).value(), true);
  EXPECT_EQ(decode_flag(encode_flag(false)).value(), false);
  // The newest kind is known; one past it is not.
  std::vector<std::uint8_t> answer = encode_frame(ControlKind::kDirectAnswer, encode_flag(true));
  auto taken = take_frame(answer, 64);
  ASSERT_TRUE(taken.has_value() && taken->has_value());
  EXPECT_EQ((*taken)->kind, ControlKind::kDirectAnswer);
  std::vector<std::uint8_t> beyond = {0, 0, 0, 0, static_cast<std::uint8_t>(ControlKind::kDirectAnswer) + 1};
  EXPECT_FALSE(take_frame(beyond, 64).has_value());
}

TEST(ControlWire, MalformedMessagesAreRefused) {
  Hello hello;
  hello.name = "x";
  hello.lanes = 1;
  hello.worker_addresses = {{1}};
  auto bytes = encode(hello);
  bytes[0] ^= 0xff;  // magic
  EXPECT_NE(decode_hello(bytes).error().message().find("not a Baton peer"), std::string::npos);
  hello.lanes = 0;
  EXPECT_FALSE(decode_hello(encode(hello)).has_value());
  hello.lanes = kMaxLanes + 1;
  EXPECT_FALSE(decode_hello(encode(hello)).has_value());
  hello.lanes = 1;
  hello.name = std::string(kMaxNameBytes + 1, 'n');
  EXPECT_FALSE(decode_hello(encode(hello)).has_value());
  hello.name = "x";
  hello.worker_addresses.clear();
  EXPECT_FALSE(decode_hello(encode(hello)).has_value());  // no worker address
  hello.worker_addresses = {{1}, {}};
  EXPECT_FALSE(decode_hello(encode(hello)).has_value());  // an empty one
  hello.worker_addresses = std::vector<std::vector<std::uint8_t>>(kMaxRails + 1, {1});
  EXPECT_FALSE(decode_hello(encode(hello)).has_value());  // more rails than any engine has
  hello.worker_addresses = {std::vector<std::uint8_t>(kMaxWorkerAddressBytes + 1, 1)};
  EXPECT_FALSE(decode_hello(encode(hello)).has_value());
  hello.worker_addresses = {{1}};
  bytes = encode(hello);
  bytes.pop_back();
  EXPECT_FALSE(decode_hello(bytes).has_value());
  bytes = encode(hello);
  bytes.push_back(0);
  EXPECT_FALSE(decode_hello(bytes).has_value());
  Welcome welcome;  // no worker address
  EXPECT_FALSE(decode_welcome(encode(welcome)).has_value());
  EXPECT_FALSE(decode_seq(std::vector<std::uint8_t>(7)).has_value());
  EXPECT_FALSE(decode_direct(std::vector<std::uint8_t>(16 + kCookieBytes - 1)).has_value());
  EXPECT_FALSE(decode_flag(std::vector<std::uint8_t>{}).has_value());
  EXPECT_FALSE(decode_flag(std::vector<std::uint8_t>{1, 0}).has_value());
  EXPECT_NE(decode_flag(std::vector<std::uint8_t>{2}).error().message().find("a flag of 2"), std::string::npos);
  EXPECT_FALSE(decode_text(std::vector<std::uint8_t>(11), 10).has_value());
  EXPECT_FALSE(decode_challenge(std::vector<std::uint8_t>(3)).has_value());
}

TEST(ControlAuth, ProofsBindTheSecretBothNoncesAndTheName) {
  const Nonce a = random_nonce().value();
  const Nonce b = random_nonce().value();
  EXPECT_NE(a, b);
  const Proof p = initiator_proof("secret-of-sixteen+", a, b, "n:1");
  EXPECT_TRUE(same_proof(p, initiator_proof("secret-of-sixteen+", a, b, "n:1")));
  EXPECT_FALSE(same_proof(p, initiator_proof("secret-of-sixteen-", a, b, "n:1")));
  EXPECT_FALSE(same_proof(p, initiator_proof("secret-of-sixteen+", b, a, "n:1")));
  EXPECT_FALSE(same_proof(p, initiator_proof("secret-of-sixteen+", a, b, "n:2")));
  // The listener's proof is not the initiator's: one cannot be replayed as the other.
  EXPECT_FALSE(same_proof(listener_proof("secret-of-sixteen+", a, b), initiator_proof("secret-of-sixteen+", a, b, "")));
}

// What the proof covers names every field of a hello, each by its length:
// bytes moved from one field to another (a rail's address into the name)
// or a lane count changed on the way describe another hello.
TEST(ControlAuth, TheDescriptionAProofCoversTellsEveryHelloApart) {
  Hello two;
  two.name = "127.0.0.1:7000";
  two.lanes = 2;
  two.worker_addresses = {{'x', 'y', 'z'}, {'u', 'v'}};
  Hello moved = two;  // the last rail's address carried in the name
  moved.name = "127.0.0.1:7000|3:xyz";
  moved.worker_addresses = {{'u', 'v'}};
  Hello fewer_lanes = two;
  fewer_lanes.lanes = 1;
  Hello split = two;  // the same bytes cut elsewhere
  split.worker_addresses = {{'x', 'y'}, {'z', 'u', 'v'}};
  const std::string described = hello_description(two);
  EXPECT_EQ(described, hello_description(two));
  for (const Hello* other : {&moved, &fewer_lanes, &split}) EXPECT_NE(described, hello_description(*other));
}

}  // namespace
}  // namespace baton::transport::ucx
