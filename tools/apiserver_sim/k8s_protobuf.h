// File: k8s_protobuf.h
//
// Reads a request body in Kubernetes' protobuf encoding (content type
// application/vnd.kubernetes.protobuf): the magic "k8s\0", a runtime.Unknown
// envelope naming the object's apiVersion and kind, and the object's own
// protobuf. The result is the object as the API server's JSON has it, so
// that the simulator stores and checks one form.
//
//   absl::StatusOr<nlohmann::json> s = KubernetesProtobufToJson(req.body);
//   // s->at("spec").at("pool").at("generation") is a number, as in JSON.
//
// Kinds read: ResourceSlice of resource.k8s.io v1, v1beta2 and v1beta1. Any
// other kind, and any field k8s_protobuf.proto does not declare, is an
// error that names it: the simulator refuses what it cannot read whole.
#ifndef DPPROXY_TOOLS_APISERVER_SIM_K8S_PROTOBUF_H_
#define DPPROXY_TOOLS_APISERVER_SIM_K8S_PROTOBUF_H_

#include <string_view>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"

namespace dpproxy::sim {

inline constexpr char kKubernetesProtobuf[] = "application/vnd.kubernetes.protobuf";

absl::StatusOr<nlohmann::json> KubernetesProtobufToJson(std::string_view body);

}  // namespace dpproxy::sim

#endif  // DPPROXY_TOOLS_APISERVER_SIM_K8S_PROTOBUF_H_
