// The step agent's wire codec (common/step_agent/step_wire.h) and the plain-C
// credential (step_cred.h) against what the gRPC path and duet-bridge use:
// request_digest.h, munge_payload.h, slurm_key_cred.h and OpenSSL.


#include <cstring>
#include <string>
#include <vector>

#include "common/credential/munge_payload.h"
#include "common/credential/request_digest.h"
#include "common/credential/slurm_key_cred.h"
#include "common/step_agent/step_cred.h"
#include "common/step_agent/step_wire.h"
#include "gtest/gtest.h"

namespace duet {
namespace {

std::string Bytes(const uint8_t* p, size_t n) { return std::string(reinterpret_cast<const char*>(p), n); }

// The wrappers reach libcrypto with the right arguments: the published
// answers of FIPS 180-2 (SHA-256 of "abc") and RFC 4231 (cases 2 and 6: a
// short key, and a 131-byte key, which HMAC hashes first).
std::string Hex(const uint8_t* p, size_t n) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    out += kDigits[p[i] >> 4];
    out += kDigits[p[i] & 15];
  }
  return out;
}

class StepCredInterfaceTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { duet_crypto_prefer_evp(GetParam()); }
  void TearDown() override { duet_crypto_prefer_evp(0); }
};

INSTANTIATE_TEST_SUITE_P(BothInterfaces, StepCredInterfaceTest, ::testing::Values(0, 1),
                         [](const ::testing::TestParamInfo<int>& p) {
                           return std::string(p.param ? "Evp" : "DigestsOwn");
                         });

TEST_P(StepCredInterfaceTest, Sha256AndHmacGiveThePublishedAnswers) {
  EXPECT_STREQ(duet_crypto_interface(), GetParam() ? "evp" : "sha256");
  uint8_t out[32];
  char err[160] = "";
  ASSERT_EQ(duet_sha256("abc", 3, out, err, sizeof err), 0) << err;
  EXPECT_EQ(Hex(out, 32), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const std::string data = "what do ya want for nothing?";
  ASSERT_EQ(duet_hmac_sha256("Jefe", 4, data.data(), data.size(), out, err, sizeof err), 0) << err;
  EXPECT_EQ(Hex(out, 32), "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  const std::string long_key(131, '\xaa');
  const std::string text = "Test Using Larger Than Block-Size Key - Hash Key First";
  ASSERT_EQ(duet_hmac_sha256(long_key.data(), long_key.size(), text.data(), text.size(), out, err,
                             sizeof err),
            0)
      << err;
  EXPECT_EQ(Hex(out, 32), "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

// Both interfaces of libcrypto the plugin can use give the published answers
// and agree with each other on keys and texts of every length around the
// 64-byte block (the direct HMAC hashes a longer key first, pads a shorter
// one). Debian's libcrypto has the digest's own functions, so the plugin
// does not pay EVP's provider start in each slurmstepd.
TEST(StepCredTest, TheDigestsOwnFunctionsAndEvpAgree) {
  ASSERT_STREQ(duet_crypto_interface(), "sha256");
  char err[160] = "";
  uint8_t direct[32], evp[32];
  std::string key, text;
  for (size_t n = 0; n <= 140; ++n) {
    key.assign(n, '\0');
    text.assign(n, '\0');
    for (size_t i = 0; i < n; ++i) {
      key[i] = static_cast<char>(i * 37 + n);
      text[i] = static_cast<char>(i * 11 + 3 * n + 1);
    }
    duet_crypto_prefer_evp(0);
    ASSERT_EQ(duet_sha256(text.data(), n, direct, err, sizeof err), 0) << err;
    duet_crypto_prefer_evp(1);
    ASSERT_EQ(duet_sha256(text.data(), n, evp, err, sizeof err), 0) << err;
    EXPECT_EQ(Hex(direct, 32), Hex(evp, 32)) << "SHA-256 of " << n << " bytes";
    duet_crypto_prefer_evp(0);
    ASSERT_EQ(duet_hmac_sha256(key.data(), n, text.data(), n, direct, err, sizeof err), 0) << err;
    duet_crypto_prefer_evp(1);
    ASSERT_EQ(duet_hmac_sha256(key.data(), n, text.data(), n, evp, err, sizeof err), 0) << err;
    EXPECT_EQ(Hex(direct, 32), Hex(evp, 32)) << "HMAC-SHA256 with a " << n << "-byte key";
  }
  EXPECT_STREQ(duet_crypto_interface(), "evp");
  duet_crypto_prefer_evp(0);
  EXPECT_STREQ(duet_crypto_interface(), "sha256");
}

// The largest call the wire carries (a 255-byte node name, 64 GPUs, the
// largest job and step ids) still has a payload a slurm.key credential can
// sign, the same on both sides.
TEST(StepCredTest, TheLargestCallsPayloadFitsTheCredential) {
  const std::string node(DUET_WIRE_MAX_NODE, 'n');
  std::vector<uint32_t> gpus;
  v1::HoldRequest hold;
  hold.set_node(node);
  hold.mutable_owner()->mutable_slurm_step()->set_job_id(0xffffffffu);
  hold.mutable_owner()->mutable_slurm_step()->set_step_id(0xfffffffeu);
  for (uint32_t g = 0; g < DUET_WIRE_MAX_DEVICES; ++g) {
    gpus.push_back(1000 + g);
    auto* d = hold.mutable_devices()->add_devices();
    d->set_kind(v1::DEVICE_KIND_GPU);
    d->set_index(1000 + g);
  }
  char payload[DUET_CRED_MAX_PAYLOAD + 1];
  ASSERT_EQ(duet_cred_payload("Hold", node.c_str(), 0xffffffffu, 0xfffffffeu, gpus.data(),
                              gpus.size(), payload, sizeof payload),
            0);
  EXPECT_EQ(payload, slurm_munge::Payload(*slurm_munge::BindingOf(hold)));
  EXPECT_TRUE(slurm_key::Make(slurm_key::DeriveKey("0123456789abcdef"), payload, 1).ok());
  // A buffer one byte short is refused, not cut.
  std::vector<char> short_out(strlen(payload));
  EXPECT_EQ(duet_cred_payload("Hold", node.c_str(), 0xffffffffu, 0xfffffffeu, gpus.data(),
                              gpus.size(), short_out.data(), short_out.size()),
            -1);
}

TEST(StepCredTest, PayloadIsTheGrpcPathsByteForByte) {
  v1::HoldRequest hold;
  hold.set_node("gke-a-1");
  hold.mutable_owner()->mutable_slurm_step()->set_job_id(4242);
  hold.mutable_owner()->mutable_slurm_step()->set_step_id(3);
  const std::vector<uint32_t> gpus = {0, 3, 7};
  for (uint32_t g : gpus) {
    auto* d = hold.mutable_devices()->add_devices();
    d->set_kind(v1::DEVICE_KIND_GPU);
    d->set_index(g);
  }
  char canonical[512], payload[1024];
  ASSERT_EQ(duet_cred_canonical("Hold", "gke-a-1", 4242, 3, gpus.data(), gpus.size(), canonical,
                                sizeof canonical),
            0);
  EXPECT_EQ(canonical, slurm_munge::CanonicalRequest(hold));
  ASSERT_EQ(duet_cred_payload("Hold", "gke-a-1", 4242, 3, gpus.data(), gpus.size(), payload,
                              sizeof payload),
            0);
  EXPECT_EQ(payload, slurm_munge::Payload(*slurm_munge::BindingOf(hold)));

  v1::ReleaseRequest release;
  release.set_node("gke-a-1");
  release.mutable_owner()->mutable_slurm_step()->set_job_id(4242);
  release.mutable_owner()->mutable_slurm_step()->set_step_id(0xfffffffb);  // the batch step
  ASSERT_EQ(duet_cred_payload("Release", "gke-a-1", 4242, 0xfffffffb, nullptr, 0, payload,
                              sizeof payload),
            0);
  EXPECT_EQ(payload, slurm_munge::Payload(*slurm_munge::BindingOf(release)));

  release.mutable_owner()->mutable_slurm_job()->set_job_id(4242);
  ASSERT_EQ(duet_cred_payload("Release", "gke-a-1", 4242, -1, nullptr, 0, payload, sizeof payload),
            0);
  EXPECT_EQ(payload, slurm_munge::Payload(*slurm_munge::BindingOf(release)));

  EXPECT_EQ(duet_cred_payload("Steal", "n", 1, 0, nullptr, 0, payload, sizeof payload), -1);
  EXPECT_EQ(duet_cred_payload("Hold", "n", 1, -1, nullptr, 0, payload, sizeof payload), -1);
  EXPECT_EQ(duet_cred_payload("Hold", "n", 1, 0, gpus.data(), gpus.size(), payload, 20), -1);
}

TEST(StepCredTest, SlurmKeyCredentialIsOneTheBridgeAccepts) {
  char dir[] = "/tmp/step_cred_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  for (size_t key_len : {16u, 64u, 65u, 5000u}) {
    const std::string path = std::string(dir) + "/slurm.key";
    std::string key(key_len, '\0');
    for (size_t i = 0; i < key_len; ++i) key[i] = static_cast<char>(i * 31 + 7);
    FILE* f = fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    fwrite(key.data(), 1, key.size(), f);
    fclose(f);
    ASSERT_EQ(chmod(path.c_str(), 0640), 0);
    uint8_t derived[32];
    char err[256] = "";
    ASSERT_EQ(duet_cred_slurm_key_derive(path.c_str(), derived, err, sizeof err), 0) << err;
    auto theirs = slurm_key::LoadDerivedKey(path);
    ASSERT_TRUE(theirs.ok());
    EXPECT_EQ(Bytes(derived, 32), *theirs) << key_len;

    const char* payload = "duet/v3 Hold node=1:n owner=slurm_step:1.0 devices=1:0:0 generation=0";
    const uint8_t nonce[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 255};
    char cred[2048];
    ASSERT_EQ(duet_cred_slurm_key_make(derived, payload, 1700000000, nonce, cred, sizeof cred,
                                       err, sizeof err),
              0);
    auto parsed = slurm_key::Parse(cred);
    ASSERT_TRUE(parsed.ok()) << parsed.status() << " " << cred;
    EXPECT_EQ(parsed->payload, payload);
    EXPECT_EQ(parsed->unix_seconds, 1700000000);
    EXPECT_TRUE(slurm_key::MacMatches(*theirs, *parsed));
    EXPECT_FALSE(slurm_key::MacMatches(slurm_key::DeriveKey("another cluster's key"), *parsed));

    ASSERT_EQ(chmod(path.c_str(), 0644), 0);  // others may read: refused, as Slurm does
    EXPECT_EQ(duet_cred_slurm_key_derive(path.c_str(), derived, err, sizeof err), -1);
    EXPECT_NE(std::string(err).find("insecure mode 0644"), std::string::npos) << err;
    unlink(path.c_str());
  }
  char err[256] = "";
  uint8_t derived[32];
  EXPECT_EQ(duet_cred_slurm_key_derive("/nonexistent/slurm.key", derived, err, sizeof err), -1);
  EXPECT_NE(std::string(err).find("/nonexistent/slurm.key"), std::string::npos);
  rmdir(dir);
}

duet_wire_request Hold() {
  duet_wire_request r{};
  r.type = DUET_WIRE_HOLD_STEP;
  strcpy(r.node, "gke-a-1");
  r.job_id = 77;
  r.step_id = 2;
  r.n_gpus = 2;
  r.gpus[0] = 1;
  r.gpus[1] = 6;
  r.cred_kind = DUET_WIRE_CRED_MUNGE;
  strcpy(r.cred, "MUNGE:abc:");
  r.timeout_ms = 2000;
  return r;
}

std::vector<uint8_t> Encode(const duet_wire_request& r) {
  std::vector<uint8_t> buf(DUET_WIRE_MAX_FRAME);
  char err[256] = "";
  long n = duet_wire_encode_request(&r, buf.data(), buf.size(), err, sizeof err);
  EXPECT_GT(n, 0) << err;
  buf.resize(n > 0 ? static_cast<size_t>(n) : 0);
  return buf;
}

TEST(StepWireTest, RequestsRoundTrip) {
  for (uint8_t type : {DUET_WIRE_HOLD_STEP, DUET_WIRE_RELEASE_STEP, DUET_WIRE_RELEASE_JOB}) {
    duet_wire_request in = Hold();
    in.type = type;
    if (type != DUET_WIRE_HOLD_STEP) in.n_gpus = 0;
    if (type == DUET_WIRE_RELEASE_JOB) in.step_id = 0;
    std::vector<uint8_t> frame = Encode(in);
    duet_wire_request out{};
    char err[256] = "";
    ASSERT_EQ(duet_wire_decode_request(frame.data(), frame.size(), &out, err, sizeof err), 0)
        << err;
    EXPECT_EQ(out.type, type);
    EXPECT_STREQ(out.node, "gke-a-1");
    EXPECT_EQ(out.job_id, 77u);
    EXPECT_EQ(out.step_id, type == DUET_WIRE_RELEASE_JOB ? 0u : 2u);
    EXPECT_EQ(out.n_gpus, type == DUET_WIRE_HOLD_STEP ? 2u : 0u);
    EXPECT_EQ(out.cred_kind, DUET_WIRE_CRED_MUNGE);
    EXPECT_STREQ(out.cred, "MUNGE:abc:");
    EXPECT_EQ(out.timeout_ms, 2000u);
  }
}

TEST(StepWireTest, RepliesRoundTripWithReasonAndMetadata) {
  duet_wire_reply in{};
  in.code = 9;  // FAILED_PRECONDITION
  strcpy(in.reason, "POD_EVICTING");
  strcpy(in.message, "pod default/web holds gpu 1");
  in.n_meta = 2;
  strcpy(in.meta[0].key, "wait_s");
  strcpy(in.meta[0].value, "30");
  strcpy(in.meta[1].key, "holder");
  std::vector<uint8_t> buf(DUET_WIRE_MAX_FRAME);
  char err[256] = "";
  long n = duet_wire_encode_reply(&in, buf.data(), buf.size(), err, sizeof err);
  ASSERT_GT(n, 0) << err;
  duet_wire_reply out{};
  ASSERT_EQ(duet_wire_decode_reply(buf.data(), static_cast<size_t>(n), &out, err, sizeof err), 0)
      << err;
  EXPECT_EQ(out.code, 9u);
  EXPECT_STREQ(out.reason, "POD_EVICTING");
  EXPECT_STREQ(out.message, "pod default/web holds gpu 1");
  EXPECT_STREQ(duet_wire_reply_meta(&out, "wait_s"), "30");
  EXPECT_STREQ(duet_wire_reply_meta(&out, "holder"), "");
  EXPECT_EQ(duet_wire_reply_meta(&out, "device"), nullptr);
  // A request frame is not a reply, nor the reverse.
  std::vector<uint8_t> req = Encode(Hold());
  EXPECT_EQ(duet_wire_decode_reply(req.data(), req.size(), &out, err, sizeof err), -1);
  EXPECT_EQ(duet_wire_decode_request(buf.data(), static_cast<size_t>(n), nullptr, err, sizeof err),
            -1);
}

// Each bad frame is refused with a message and leaves the output as it was.
TEST(StepWireTest, BadFramesAreRefusedAndChangeNothing) {
  const std::vector<uint8_t> good = Encode(Hold());
  struct Case {
    const char* name;
    std::vector<uint8_t> frame;
    const char* says;
  };
  std::vector<Case> cases;
  auto with = [&](const char* name, auto edit, const char* says) {
    std::vector<uint8_t> f = good;
    edit(f);
    cases.push_back({name, f, says});
  };
  with("empty", [](auto& f) { f.clear(); }, "shorter than its 8-byte header");
  with("magic", [](auto& f) { f[0] = 'X'; }, "not a duet step agent frame");
  with("version", [](auto& f) { f[1] = 2; }, "version 2, this build speaks 1");
  with("reserved", [](auto& f) { f[3] = 1; }, "reserved header byte");
  with("huge", [](auto& f) { f[4] = 0x7f; }, "body longer than 16384");
  with("truncated", [](auto& f) { f.pop_back(); }, "length differs");
  with("trailing", [](auto& f) { f.push_back(0); f[7]++; }, "runs past the body");
  with("type", [](auto& f) { f[2] = 9; }, "not a request type");
  with("unknown tag", [](auto& f) { f[8] = 42; }, "unknown field");
  with("repeat", [](auto& f) {
    f.insert(f.end(), {2, 0, 4, 0, 0, 0, 1});
    f[7] += 7;
  }, "a field repeats");
  with("node NUL", [](auto& f) { f[8 + 3 + 2] = 0; }, "without NUL");
  with("no gpus", [](auto& f) { f[2] = DUET_WIRE_RELEASE_STEP; }, "gpus are named by a hold only");
  with("job without step", [](auto& f) { f[2] = DUET_WIRE_RELEASE_JOB; }, "step requests only");
  for (const Case& c : cases) {
    duet_wire_request out = Hold();
    out.job_id = 12345;  // a marker the decoder must not touch
    char err[256] = "";
    EXPECT_EQ(duet_wire_decode_request(c.frame.data(), c.frame.size(), &out, err, sizeof err), -1)
        << c.name;
    EXPECT_NE(std::string(err).find(c.says), std::string::npos) << c.name << ": " << err;
    EXPECT_NE(std::string(err).find("step agent frame refused"), std::string::npos) << c.name;
    EXPECT_EQ(out.job_id, 12345u) << c.name;
  }
}

TEST(StepWireTest, EncoderRefusesValuesOverTheirBounds) {
  std::vector<uint8_t> buf(DUET_WIRE_MAX_FRAME);
  char err[256] = "";
  duet_wire_request r = Hold();
  r.n_gpus = DUET_WIRE_MAX_DEVICES + 1;
  EXPECT_EQ(duet_wire_encode_request(&r, buf.data(), buf.size(), err, sizeof err), -1);
  r = Hold();
  r.n_gpus = 0;
  EXPECT_EQ(duet_wire_encode_request(&r, buf.data(), buf.size(), err, sizeof err), -1);
  r = Hold();
  r.node[0] = 0;
  EXPECT_EQ(duet_wire_encode_request(&r, buf.data(), buf.size(), err, sizeof err), -1);
  r = Hold();
  memset(r.node, 'a', sizeof r.node);  // no terminator within the bound
  EXPECT_EQ(duet_wire_encode_request(&r, buf.data(), buf.size(), err, sizeof err), -1);
  r = Hold();
  EXPECT_EQ(duet_wire_encode_request(&r, buf.data(), 20, err, sizeof err), -1);
  EXPECT_NE(std::string(err).find("larger than the buffer"), std::string::npos);
}

}  // namespace
}  // namespace duet
