#include "tests/testing/tls.h"

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <memory>
#include <random>
#include <utility>

namespace vc::testing {
namespace {

struct PkeyFree {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};

std::string BioString(BIO* bio) {
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);
  return std::string(data, static_cast<size_t>(n));
}

}  // namespace

CertAndKey SelfSignedCert(const std::string& common_name) {
  std::unique_ptr<EVP_PKEY, PkeyFree> key(EVP_EC_gen("P-256"));
  std::unique_ptr<X509, X509Free> x(X509_new());
  if (key == nullptr || x == nullptr) return {};
  std::random_device rd;
  bool ok = X509_set_version(x.get(), 2) == 1 &&
            ASN1_INTEGER_set(X509_get_serialNumber(x.get()), static_cast<long>(rd() & 0x7fffffff)) == 1 &&
            X509_gmtime_adj(X509_getm_notBefore(x.get()), -60) != nullptr &&
            X509_gmtime_adj(X509_getm_notAfter(x.get()), 3600) != nullptr &&
            X509_set_pubkey(x.get(), key.get()) == 1;
  X509_NAME* name = X509_get_subject_name(x.get());
  ok = ok &&
       X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                                  reinterpret_cast<const unsigned char*>(common_name.c_str()), -1, -1, 0) == 1 &&
       X509_set_issuer_name(x.get(), name) == 1;
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, x.get(), x.get(), nullptr, nullptr, 0);
  for (const auto& [nid, value] : {std::pair<int, const char*>{NID_basic_constraints, "critical,CA:TRUE"},
                                   {NID_subject_alt_name, "DNS:localhost,IP:127.0.0.1"}}) {
    X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
    ok = ok && ext != nullptr && X509_add_ext(x.get(), ext, -1) == 1;
    X509_EXTENSION_free(ext);
  }
  ok = ok && X509_sign(x.get(), key.get(), EVP_sha256()) > 0;
  std::unique_ptr<BIO, BioFree> cert_bio(BIO_new(BIO_s_mem())), key_bio(BIO_new(BIO_s_mem()));
  ok = ok && PEM_write_bio_X509(cert_bio.get(), x.get()) == 1 &&
       PEM_write_bio_PrivateKey(key_bio.get(), key.get(), nullptr, nullptr, 0, nullptr, nullptr) == 1;
  if (!ok) return {};
  return {BioString(cert_bio.get()), BioString(key_bio.get())};
}

}  // namespace vc::testing
