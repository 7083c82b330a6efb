// Certificates made at test time with OpenSSL, for servers that tests run over TLS.
#ifndef VC_TESTS_TESTING_TLS_H_
#define VC_TESTS_TESTING_TLS_H_

#include <string>

namespace vc::testing {

struct CertAndKey {
  std::string cert_pem, key_pem;
};

// A self-signed P-256 certificate for `common_name`, valid for an hour, naming localhost and
// 127.0.0.1; it is its own root. Empty strings when OpenSSL fails.
CertAndKey SelfSignedCert(const std::string& common_name);

}  // namespace vc::testing

#endif  // VC_TESTS_TESTING_TLS_H_
