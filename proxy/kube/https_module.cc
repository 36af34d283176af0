// The HTTPS module (https_module.h): Boost.Beast over Boost.Asio's OpenSSL
// streams, in a shared object of its own. It uses the C++ standard library,
// Boost's header-only Asio and Beast, and OpenSSL only, so that nothing of
// dpproxy is linked into it twice and no library beyond OpenSSL is loaded.
//
// What an API server can make one call cost is bounded:
//   - time: the whole exchange (name, connect, handshake, request, answer)
//     ends at the request's deadline, however slowly the bytes come, or
//     within 100 ms of the request's `cancelled` turning true;
//   - memory: the answer's header at most kMaxHeaderBytes (Beast's parser
//     stops there) and its body at most the request's max_body_bytes.
#include "proxy/kube/https_module.h"

#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/error.hpp>
#include <boost/asio/ssl/host_name_verification.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>

#include "proxy/kube/https_abi.h"

namespace dpproxy {
namespace https {
namespace {

namespace asio = boost::asio;
namespace ssl = boost::asio::ssl;
namespace http = boost::beast::http;
using tcp = boost::asio::ip::tcp;
using boost::system::error_code;

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};

bool HasCertificate(const std::string& pem) {
  std::unique_ptr<BIO, BioFree> bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  X509* cert = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr);
  if (cert == nullptr) return false;
  X509_free(cert);
  return true;
}

bool IsAddress(const std::string& host) {
  error_code ec;
  asio::ip::make_address(host, ec);
  return !ec;
}

// The TLS context of one exchange: whom it trusts, and who it is. False
// with `answer` saying why the client's own certificate cannot be used.
bool SetUpTls(const Tls& tls, ssl::context* ctx, Answer* answer) {
  error_code ec;
  if (tls.insecure) {
    ctx->set_verify_mode(ssl::verify_none, ec);
  } else {
    ctx->set_verify_mode(ssl::verify_peer, ec);
    if (!tls.ca_data.empty()) {
      ctx->add_certificate_authority(asio::buffer(tls.ca_data), ec);
    } else if (!tls.ca_file.empty()) {
      ctx->load_verify_file(tls.ca_file, ec);
    } else {
      ctx->set_default_verify_paths(ec);
    }
    if (ec) {
      answer->outcome = Answer::Outcome::kTransport;
      answer->error = "cannot load the CA certificate: " + ec.message();
      return false;
    }
  }
  if (!tls.cert_data.empty()) {
    ctx->use_certificate_chain(asio::buffer(tls.cert_data), ec);
    if (!ec) ctx->use_private_key(asio::buffer(tls.key_data), ssl::context::pem, ec);
    if (ec) {
      answer->outcome = Answer::Outcome::kBadCredentials;
      answer->error = "the client certificate or key is not PEM";
      return false;
    }
  } else if (!tls.cert_file.empty()) {
    ctx->use_certificate_chain_file(tls.cert_file, ec);
    if (!ec) ctx->use_private_key_file(tls.key_file, ssl::context::pem, ec);
    if (ec) {
      answer->outcome = Answer::Outcome::kBadCredentials;
      answer->error = "cannot load the client certificate and key";
      return false;
    }
  }
  return true;
}

// One exchange on an io_context of its own: resolve, connect, (handshake,)
// write, read, each step started when the one before ended, all under one
// deadline. `Stream` is a tcp::socket or an ssl::stream over one.
template <typename Stream>
class Call {
 public:
  Call(const Request& r, Answer* answer, asio::io_context* io, Stream* stream,
           ssl::stream<tcp::socket>* tls)
      : r_(r),
        answer_(answer),
        io_(io),
        stream_(stream),
        tls_(tls),
        resolver_(*io),
        deadline_(*io),
        cancel_poll_(*io) {}

  void Run() {
    deadline_.expires_after(std::chrono::milliseconds(r_.timeout_ms > 0 ? r_.timeout_ms : 1));
    deadline_.async_wait([this](error_code ec) {
      if (!ec) Stop(&late_);
    });
    PollCancel();
    resolver_.async_resolve(r_.host, std::to_string(r_.port),
                            [this](error_code ec, tcp::resolver::results_type found) {
                              if (ec) return Fail(ec, "cannot resolve the server's name");
                              Connect(found);
                            });
    io_->run();
  }

 private:
  tcp::socket& Socket() {
    if constexpr (std::is_same_v<Stream, tcp::socket>) {
      return *stream_;
    } else {
      return stream_->next_layer();
    }
  }

  void PollCancel() {
    cancel_poll_.expires_after(std::chrono::milliseconds(100));
    cancel_poll_.async_wait([this](error_code ec) {
      if (ec || done_) return;
      if (r_.cancelled != nullptr && r_.cancelled->load()) return Stop(&cancelled_);
      PollCancel();
    });
  }

  // The deadline or a cancel: every operation in flight ends at once.
  void Stop(bool* why) {
    if (done_) return;
    *why = true;
    error_code ignored;
    resolver_.cancel();
    Socket().close(ignored);
  }

  void Connect(const tcp::resolver::results_type& found) {
    asio::async_connect(Socket(), found, [this](error_code ec, const tcp::endpoint&) {
      if (ec) return Fail(ec, "cannot connect");
      if constexpr (std::is_same_v<Stream, tcp::socket>) {
        Write();
      } else {
        Handshake();
      }
    });
  }

  void Handshake() {
    if (!r_.tls.insecure) {
      tls_->set_verify_callback(ssl::host_name_verification(r_.host));
    }
    if (!IsAddress(r_.host)) SSL_set_tlsext_host_name(tls_->native_handle(), r_.host.c_str());
    tls_->async_handshake(ssl::stream_base::client, [this](error_code ec) {
      if (!ec) return Write();
      const long verify = SSL_get_verify_result(tls_->native_handle());
      if (verify != X509_V_OK) {
        return Fail(ec, std::string("the server's certificate is not trusted: ") +
                            X509_verify_cert_error_string(verify));
      }
      if (ec.category() == asio::error::get_ssl_category() &&
          ERR_GET_REASON(static_cast<unsigned long>(ec.value())) ==
              SSL_R_CERTIFICATE_VERIFY_FAILED) {
        return Fail(ec, "the server's certificate is not trusted: its name does not match");
      }
      Fail(ec, "TLS handshake failed");
    });
  }

  void Write() {
    const http::verb verb = http::string_to_verb(r_.method);
    request_.method(verb == http::verb::unknown ? http::verb::get : verb);
    request_.target(r_.path);
    request_.version(11);
    request_.set(http::field::host, r_.host + ":" + std::to_string(r_.port));
    for (const auto& [name, value] : r_.headers) request_.set(name, value);
    request_.keep_alive(false);
    if (!r_.body.empty() || verb == http::verb::post || verb == http::verb::put ||
        verb == http::verb::patch) {
      request_.body() = r_.body;
      request_.prepare_payload();
    }
    http::async_write(*stream_, request_, [this](error_code ec, size_t) {
      if (ec) return Fail(ec, "the connection ended while sending the request");
      Read();
    });
  }

  // The header, then the body piece by piece: Beast's one-call read parses
  // eagerly, and then loses a body_limit error when the body's first bytes
  // came with the header (Boost 1.74), reading on past the limit.
  void Read() {
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(kMaxHeaderBytes));
    parser_->body_limit(static_cast<std::uint64_t>(r_.max_body_bytes));
    parser_->eager(false);
    http::async_read_header(*stream_, buffer_, *parser_, [this](error_code ec, size_t) {
      if (ec) return Read(ec);
      ReadBody();
    });
  }

  void ReadBody() {
    if (parser_->is_done()) return Read(error_code());
    http::async_read_some(*stream_, buffer_, *parser_, [this](error_code ec, size_t) {
      if (ec) return Read(ec);
      ReadBody();
    });
  }

  void Read(error_code ec) {
    if (ec == http::error::header_limit) {
      return Fail(ec, "the answer's header is over " + std::to_string(kMaxHeaderBytes >> 10) +
                          " KiB; not read");
    }
    if (ec == http::error::body_limit) {
      answer_->outcome = Answer::Outcome::kTooLong;
      return Finish();
    }
    if (ec) return Fail(ec, "the connection ended while reading the answer");
    answer_->outcome = Answer::Outcome::kAnswered;
    answer_->status = static_cast<int>(parser_->get().result_int());
    answer_->body = std::move(parser_->get().body());
    Finish();
  }

  void Fail(error_code, const std::string& why) {
    answer_->outcome = Answer::Outcome::kTransport;
    answer_->error = why;
    Finish();
  }

  void Finish() {
    done_ = true;
    if (late_) {
      answer_->outcome = Answer::Outcome::kLate;
      answer_->error.clear();
    } else if (cancelled_) {
      answer_->outcome = Answer::Outcome::kTransport;
      answer_->error = "dpproxy is stopping";
    }
    if (answer_->outcome != Answer::Outcome::kAnswered) answer_->body.clear();
    deadline_.cancel();
    cancel_poll_.cancel();
    error_code ignored;
    Socket().close(ignored);
  }

  const Request& r_;
  Answer* const answer_;
  asio::io_context* const io_;
  Stream* const stream_;
  ssl::stream<tcp::socket>* const tls_;  // the same stream, when it is TLS
  tcp::resolver resolver_;
  asio::steady_timer deadline_;
  asio::steady_timer cancel_poll_;
  http::request<http::string_body> request_;
  boost::beast::flat_buffer buffer_;
  std::optional<http::response_parser<http::string_body>> parser_;
  bool done_ = false;
  bool late_ = false;
  bool cancelled_ = false;
};

void Run(const Request& r, Answer* answer) {
  *answer = Answer();
  if (r.cancelled != nullptr && r.cancelled->load()) {
    answer->outcome = Answer::Outcome::kTransport;
    answer->error = "dpproxy is stopping";
    return;
  }
  asio::io_context io(1);
  if (!r.https) {
    tcp::socket socket(io);
    Call<tcp::socket>(r, answer, &io, &socket, nullptr).Run();
    return;
  }
  ssl::context ctx(ssl::context::tls_client);
  if (!SetUpTls(r.tls, &ctx, answer)) return;
  ssl::stream<tcp::socket> stream(io, ctx);
  Call<ssl::stream<tcp::socket>>(r, answer, &io, &stream, &stream).Run();
}

void Exchange(const Request& r, Answer* answer) {
  // Nothing may leave the module as an exception (the caller is a gRPC
  // handler or a publisher's loop); every step reports with error codes.
  try {
    Run(r, answer);
  } catch (const std::exception& e) {
    answer->outcome = Answer::Outcome::kTransport;
    answer->error = std::string("HTTP client error: ") + e.what();
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
