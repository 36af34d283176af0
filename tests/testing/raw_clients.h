// File: raw_clients.h
//
// Registration calls made by hand, as a misbehaving or foreign plugin would
// make them, for tests of a kubelet's (or dpproxy's) answers.
#ifndef DPPROXY_TESTS_TESTING_RAW_CLIENTS_H_
#define DPPROXY_TESTS_TESTING_RAW_CLIENTS_H_

#include <string>

#include <grpcpp/support/status.h>

namespace dpproxy::testing {

// /v1beta1.Registration/Register with these fields (no options).
grpc::Status RegisterV1Beta1(const std::string& socket, const std::string& version,
                             const std::string& resource, const std::string& endpoint);

// /deviceplugin.Registration/Register with these fields.
grpc::Status RegisterV1Alpha(const std::string& socket, const std::string& version,
                             const std::string& resource, const std::string& endpoint);

}  // namespace dpproxy::testing

#endif  // DPPROXY_TESTS_TESTING_RAW_CLIENTS_H_
