// File: apiserver_sim_reply.h
//
// How ApiServerSim answers (apiserver_sim.cc and apiserver_sim_watch.cc):
// an object as JSON, or an error as the API server's Status object.
#ifndef DPPROXY_TOOLS_APISERVER_SIM_APISERVER_SIM_REPLY_H_
#define DPPROXY_TOOLS_APISERVER_SIM_APISERVER_SIM_REPLY_H_

#include <string>

#include <nlohmann/json.hpp>

namespace httplib {
struct Response;
}

namespace dpproxy::sim {

void Reply(httplib::Response& res, int code, const nlohmann::json& body);
// A Kubernetes Status: code, reason ("NotFound", "Conflict", ...) and message.
void Fail(httplib::Response& res, int code, const std::string& reason,
          const std::string& message);

}  // namespace dpproxy::sim

#endif  // DPPROXY_TOOLS_APISERVER_SIM_APISERVER_SIM_REPLY_H_
