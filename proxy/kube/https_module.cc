// The HTTPS module (https_module.h): cpp-httplib with OpenSSL, in a shared
// object of its own. It uses the C++ standard library, cpp-httplib and
// OpenSSL only, so that nothing of dpproxy is linked into it twice.
#include "proxy/kube/https_module.h"

#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <memory>

#include "proxy/kube/https_abi.h"

namespace dpproxy {
namespace https {
namespace {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
std::unique_ptr<BIO, BioFree> PemBio(const std::string& pem) {
  return std::unique_ptr<BIO, BioFree>(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// Every certificate of a PEM bundle in a new store; nullptr if none.
X509_STORE* StoreOf(const std::string& pem) {
  auto bio = PemBio(pem);
  X509_STORE* store = X509_STORE_new();
  int n = 0;
  while (X509* cert = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
    n += X509_STORE_add_cert(store, cert) == 1 ? 1 : 0;
    X509_free(cert);
  }
  if (n == 0) {
    X509_STORE_free(store);
    return nullptr;
  }
  return store;
}

bool HasCertificate(const std::string& pem) {
  X509_STORE* store = StoreOf(pem);
  if (store == nullptr) return false;
  X509_STORE_free(store);
  return true;
}

std::string TransportError(httplib::Error e, long verify_result) {
  switch (e) {
    case httplib::Error::Connection: return "cannot connect";
    case httplib::Error::ConnectionTimeout: return "no connection within the call's limit";
    case httplib::Error::Read: return "the connection ended while reading the answer";
    case httplib::Error::Write: return "the connection ended while sending the request";
    case httplib::Error::SSLConnection: return "TLS handshake failed";
    case httplib::Error::SSLLoadingCerts: return "cannot load the CA or client certificate";
    case httplib::Error::SSLServerVerification:
      return std::string("the server's certificate is not trusted: ") +
             X509_verify_cert_error_string(verify_result);
    default: return "transport error " + httplib::to_string(e);
  }
}

// The client for one exchange, or nullptr with `answer` saying why.
std::unique_ptr<httplib::ClientImpl> ClientFor(const Request& r, httplib::SSLClient** tls,
                                               Answer* answer) {
  *tls = nullptr;
  if (!r.https) return std::make_unique<httplib::ClientImpl>(r.host, r.port);
  std::unique_ptr<httplib::SSLClient> c;
  if (!r.tls.cert_data.empty()) {
    X509* cert = PEM_read_bio_X509(PemBio(r.tls.cert_data).get(), nullptr, nullptr, nullptr);
    EVP_PKEY* key =
        PEM_read_bio_PrivateKey(PemBio(r.tls.key_data).get(), nullptr, nullptr, nullptr);
    if (cert == nullptr || key == nullptr) {
      X509_free(cert);
      EVP_PKEY_free(key);
      answer->outcome = Answer::Outcome::kBadCredentials;
      answer->error = "the client certificate or key is not PEM";
      return nullptr;
    }
    c = std::make_unique<httplib::SSLClient>(r.host, r.port, cert, key);
    X509_free(cert);  // the client's SSL context holds its own references
    EVP_PKEY_free(key);
  } else if (!r.tls.cert_file.empty()) {
    c = std::make_unique<httplib::SSLClient>(r.host, r.port, r.tls.cert_file, r.tls.key_file);
  } else {
    c = std::make_unique<httplib::SSLClient>(r.host, r.port);
  }
  if (!c->is_valid()) {
    answer->outcome = Answer::Outcome::kBadCredentials;
    answer->error = "cannot load the client certificate and key";
    return nullptr;
  }
  c->enable_server_certificate_verification(!r.tls.insecure);
  if (!r.tls.insecure && !r.tls.ca_data.empty()) {
    c->set_ca_cert_store(StoreOf(r.tls.ca_data));  // the client owns it
  } else if (!r.tls.insecure && !r.tls.ca_file.empty()) {
    c->set_ca_cert_path(r.tls.ca_file);
  }
  *tls = c.get();
  return c;
}

void Exchange(const Request& r, Answer* answer) {
  *answer = Answer();
  httplib::SSLClient* tls = nullptr;
  std::unique_ptr<httplib::ClientImpl> client = ClientFor(r, &tls, answer);
  if (client == nullptr) return;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(r.timeout_ms);
  const int64_t ms = std::max<int64_t>(1, r.timeout_ms);
  client->set_connection_timeout(ms / 1000, (ms % 1000) * 1000);
  client->set_read_timeout(ms / 1000, (ms % 1000) * 1000);
  client->set_write_timeout(ms / 1000, (ms % 1000) * 1000);
  client->set_keep_alive(false);
  client->set_follow_location(false);
  httplib::Request req;
  req.method = r.method;
  req.path = r.path;
  for (const auto& [name, value] : r.headers) req.headers.emplace(name, value);
  req.body = r.body;
  // The answer, up to max_body_bytes, within the exchange's limit.
  bool over = false, late = false;
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    if (answer->body.size() + n > r.max_body_bytes) {
      over = true;
      return false;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      late = true;
      return false;
    }
    answer->body.append(data, n);
    return true;
  };
  httplib::Response res;
  httplib::Error error = httplib::Error::Success;
  const bool sent = client->send(req, res, error);
  if (over) {
    answer->outcome = Answer::Outcome::kTooLong;
  } else if (late) {
    answer->outcome = Answer::Outcome::kLate;
  } else if (!sent) {
    answer->outcome = Answer::Outcome::kTransport;
    answer->error = TransportError(error, tls != nullptr ? tls->get_openssl_verify_result() : 0);
  } else {
    answer->outcome = Answer::Outcome::kAnswered;
    answer->status = res.status;
  }
}

constexpr Module kModule = {&HasCertificate, &Exchange};

}  // namespace
}  // namespace https
}  // namespace dpproxy

extern "C" {
__attribute__((visibility("default"))) const char* dpproxy_https_abi() {
  return dpproxy::https::kHttpsAbi;
}
__attribute__((visibility("default"))) const dpproxy::https::Module* dpproxy_https_module() {
  return &dpproxy::https::kModule;
}
}
