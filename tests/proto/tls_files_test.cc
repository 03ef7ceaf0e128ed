#include "proto/tls_files.h"

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/credentials.h"

namespace conveyor::proto {
namespace {

using ::testing::HasSubstr;

int64_t Now() { return absl::ToUnixSeconds(absl::Now()); }

struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using Key = std::unique_ptr<EVP_PKEY, KeyFree>;

Key NewKey() { return Key(EVP_EC_gen("P-256")); }

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/tls_files_test_" + name;
}

std::string WriteText(const std::string& name, const std::string& text) {
  const std::string path = TempPath(name);
  std::ofstream(path) << text;
  return path;
}

std::string KeyPem(EVP_PKEY* key, bool encrypted = false) {
  BIO* bio = BIO_new(BIO_s_mem());
  char pass[] = "secret";
  PEM_write_bio_PrivateKey(
      bio, key, encrypted ? EVP_aes_128_cbc() : nullptr,
      encrypted ? reinterpret_cast<unsigned char*>(pass) : nullptr,
      encrypted ? 6 : 0, nullptr, nullptr);
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);
  std::string pem(data, static_cast<size_t>(n));
  BIO_free(bio);
  return pem;
}

// A certificate for `key`, valid from now + `from` to now + `to` seconds,
// self-signed or signed by `issuer_key` under `issuer_name`.
std::string CertPem(EVP_PKEY* key, const std::string& cn, int64_t from,
                    int64_t to, bool san, EVP_PKEY* issuer_key = nullptr,
                    const std::string& issuer_cn = "") {
  X509* cert = X509_new();
  X509_set_version(cert, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(cert), 7);
  X509_gmtime_adj(X509_getm_notBefore(cert), from);
  X509_gmtime_adj(X509_getm_notAfter(cert), to);
  X509_set_pubkey(cert, key);
  X509_NAME* name = X509_get_subject_name(cert);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(cn.c_str()),
                             -1, -1, 0);
  X509_NAME* issuer = X509_NAME_new();
  const std::string& icn = issuer_key != nullptr ? issuer_cn : cn;
  X509_NAME_add_entry_by_txt(
      issuer, "CN", MBSTRING_ASC,
      reinterpret_cast<const unsigned char*>(icn.c_str()), -1, -1, 0);
  X509_set_issuer_name(cert, issuer);
  X509_NAME_free(issuer);
  if (san) {
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, cert, cert, nullptr, nullptr, 0);
    X509_EXTENSION* ext = X509V3_EXT_conf_nid(
        nullptr, &ctx, NID_subject_alt_name, "IP:127.0.0.1, DNS:localhost");
    X509_add_ext(cert, ext, -1);
    X509_EXTENSION_free(ext);
  }
  X509_sign(cert, issuer_key != nullptr ? issuer_key : key, EVP_sha256());
  BIO* bio = BIO_new(BIO_s_mem());
  PEM_write_bio_X509(bio, cert);
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);
  std::string pem(data, static_cast<size_t>(n));
  BIO_free(bio);
  X509_free(cert);
  return pem;
}

constexpr int64_t kDay = 86400;

class TlsFilesTest : public ::testing::Test {
 protected:
  TlsFilesTest() : ca_key_(NewKey()), key_(NewKey()), other_key_(NewKey()) {
    ca_ = WriteText("ca.pem", CertPem(ca_key_.get(), "ca", -kDay, 365 * kDay,
                                      /*san=*/false));
    key_path_ = WriteText("key.pem", KeyPem(key_.get()));
    cert_ =
        WriteText("cert.pem", CertPem(key_.get(), "coordinator", -kDay,
                                      365 * kDay, true, ca_key_.get(), "ca"));
  }

  Key ca_key_, key_, other_key_;
  std::string ca_, key_path_, cert_;
};

TEST_F(TlsFilesTest, GoodFilesPassAndReportTheirValidity) {
  absl::StatusOr<TlsFilesReport> report = CheckTlsFiles(
      {.cert = cert_, .key = key_path_, .ca = ca_}, TlsRole::kServer, Now());
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(report->certificates.size(), 2u);
  EXPECT_EQ(report->certificates[0].flag, "--tls-cert");
  EXPECT_EQ(report->certificates[0].subject, "CN=coordinator");
  EXPECT_NEAR(report->certificates[0].not_after_unix, Now() + 365 * kDay, 60);
  EXPECT_EQ(report->certificates[1].flag, "--tls-ca");
  EXPECT_TRUE(report->warnings.empty());
}

// It once made the coordinator say "cannot listen (address in use)", a
// worker retry "empty address list" forever.
TEST_F(TlsFilesTest, AKeyThatIsNotTheCertificatesIsNamed) {
  const std::string other = WriteText("other.key", KeyPem(other_key_.get()));
  for (const TlsRole role : {TlsRole::kServer, TlsRole::kClient}) {
    const absl::Status s =
        CheckTlsFiles({.cert = cert_, .key = other, .ca = ca_}, role, Now())
            .status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(s.message(),
              absl::StrCat("--tls-key ", other,
                           " does not belong to "
                           "--tls-cert ",
                           cert_,
                           " (the certificate holds another public key); "
                           "give the key the certificate was issued for"));
  }
  // Through the credentials every program makes.
  EXPECT_THAT(
      MakeServerCredentials({.cert = cert_, .key = other}).status().message(),
      HasSubstr("does not belong to --tls-cert"));
  EXPECT_THAT(MakeChannelCredentials({.cert = cert_, .key = other, .ca = ca_})
                  .status()
                  .message(),
              HasSubstr("does not belong to --tls-cert"));
}

TEST_F(TlsFilesTest, ExpiredAndNotYetValidCertificatesAreRefused) {
  const std::string expired =
      WriteText("expired.pem", CertPem(key_.get(), "old", -400 * kDay,
                                       -30 * kDay, true, ca_key_.get(), "ca"));
  absl::Status s = CheckTlsFiles({.cert = expired, .key = key_path_},
                                 TlsRole::kServer, Now())
                       .status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--tls-cert " + expired +
                                     ": the certificate CN=old expired on "));
  EXPECT_THAT(s.message(), HasSubstr(" UTC; issue a new one"));
  const std::string future = WriteText(
      "future.pem", CertPem(key_.get(), "new", 10 * kDay, 400 * kDay, true));
  EXPECT_THAT(
      CheckTlsFiles({.cert = future, .key = key_path_}, TlsRole::kClient, Now())
          .status()
          .message(),
      HasSubstr("is not valid until"));
  const std::string old_ca = WriteText(
      "old-ca.pem",
      CertPem(ca_key_.get(), "old-ca", -400 * kDay, -1 * kDay, false));
  EXPECT_THAT(
      CheckTlsFiles({.ca = old_ca}, TlsRole::kClient, Now()).status().message(),
      HasSubstr("--tls-ca " + old_ca + ": the certificate CN=old-ca expired"));
}

TEST_F(TlsFilesTest, CertificatesExpiringWithin30DaysAreWarnedAbout) {
  const std::string soon =
      WriteText("soon.pem", CertPem(key_.get(), "soon", -kDay, 10 * kDay + 600,
                                    true, ca_key_.get(), "ca"));
  absl::StatusOr<TlsFilesReport> report = CheckTlsFiles(
      {.cert = soon, .key = key_path_, .ca = ca_}, TlsRole::kServer, Now());
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(report->warnings.size(), 1u);
  EXPECT_THAT(report->warnings[0], HasSubstr("--tls-cert " + soon));
  EXPECT_THAT(report->warnings[0], HasSubstr("in 10 day(s)"));
}

TEST_F(TlsFilesTest, AServerCertificateNeedsASubjectAltName) {
  const std::string bare =
      WriteText("bare.pem", CertPem(key_.get(), "bare", -kDay, 365 * kDay,
                                    false, ca_key_.get(), "ca"));
  EXPECT_THAT(
      CheckTlsFiles({.cert = bare, .key = key_path_}, TlsRole::kServer, Now())
          .status()
          .message(),
      HasSubstr("has no subjectAltName"));
  // A client certificate needs none.
  EXPECT_TRUE(CheckTlsFiles({.cert = bare, .key = key_path_, .ca = ca_},
                            TlsRole::kClient, Now())
                  .ok());
}

TEST_F(TlsFilesTest, KeysThatCannotBeReadAreRefused) {
  const std::string encrypted =
      WriteText("encrypted.key", KeyPem(key_.get(), /*encrypted=*/true));
  EXPECT_THAT(
      CheckTlsFiles({.cert = cert_, .key = encrypted}, TlsRole::kServer, Now())
          .status()
          .message(),
      HasSubstr("no PEM private key in it (an encrypted key is "
                "refused"));
  // A certificate given as the key.
  EXPECT_THAT(
      CheckTlsFiles({.cert = cert_, .key = cert_}, TlsRole::kServer, Now())
          .status()
          .message(),
      HasSubstr("--tls-key " + cert_ + ": no PEM private key"));
  // A key given as the certificate.
  EXPECT_THAT(
      CheckTlsFiles({.cert = key_path_, .key = key_path_}, TlsRole::kServer,
                    Now())
          .status()
          .message(),
      HasSubstr("--tls-cert " + key_path_ + ": no PEM certificate in it"));
  // A directory.
  EXPECT_EQ(CheckTlsFiles({.cert = ::testing::TempDir(), .key = key_path_},
                          TlsRole::kServer, Now())
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(FormatUnixTimeTest, Utc) {
  EXPECT_EQ(FormatUnixTime(1577836800), "2020-01-01 00:00:00 UTC");
}

}  // namespace
}  // namespace conveyor::proto
