#include "proxy/state/journal_records.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>

#include <algorithm>

#include "proxy/state/allocation_response.h"

namespace dpproxy {
namespace {

// Allocation.stage set to WHOLE (0), encoded.
const std::string& StageWhole() {
  static const std::string* const kBytes = [] {
    using google::protobuf::internal::WireFormatLite;
    static_assert(state::Allocation::WHOLE == 0, "the default stage");
    uint8_t bytes[6];
    uint8_t* end = google::protobuf::io::CodedOutputStream::WriteVarint32ToArray(
        WireFormatLite::MakeTag(state::Allocation::kStageFieldNumber,
                                WireFormatLite::WIRETYPE_VARINT),
        bytes);
    *end++ = 0;
    return new std::string(reinterpret_cast<const char*>(bytes),
                           static_cast<size_t>(end - bytes));
  }();
  return *kBytes;
}

}  // namespace

std::vector<state::Allocation> AllocationRecords(const std::string& resource,
                                                 const v1beta1::AllocateRequest& req,
                                                 const v1beta1::AllocateResponse* resp,
                                                 const BackendSide& backend, uint64_t first_id,
                                                 int64_t now_ms) {
  std::vector<state::Allocation> records;
  records.reserve(req.container_requests_size());
  for (int i = 0; i < req.container_requests_size(); ++i) {
    state::Allocation a;
    a.set_id(first_id + static_cast<uint64_t>(i));
    a.set_resource(resource);
    for (const std::string& id : req.container_requests(i).devices_ids()) {
      a.add_device_ids(id);
    }
    if (resp == nullptr) {
      a.set_stage(state::Allocation::RESERVED);
    } else if (i < resp->container_responses_size()) {
      SetResponse(&a, resp->container_responses(i));
    }
    a.set_backend_api(backend.api);
    a.set_backend_endpoint(backend.endpoint);
    a.set_backend_resource(backend.resource);
    if (backend.request != nullptr && i < backend.request->container_requests_size()) {
      const auto& ids = backend.request->container_requests(i).devices_ids();
      if (!std::equal(ids.begin(), ids.end(), a.device_ids().begin(), a.device_ids().end())) {
        *a.mutable_backend_device_ids() = ids;
      }
    }
    if (backend.claims != nullptr && i < static_cast<int>(backend.claims->size())) {
      *a.mutable_claim() = (*backend.claims)[static_cast<size_t>(i)];
    }
    a.set_allocated_unix_ms(now_ms);
    records.push_back(std::move(a));
  }
  return records;
}

std::vector<state::Allocation> AnswerRecords(const AllocationJournal::Reservation& r,
                                             const v1beta1::AllocateResponse& resp,
                                             const std::vector<state::DraClaim>* claims) {
  std::vector<state::Allocation> records;
  records.reserve(static_cast<size_t>(std::max(r.count, 0)));
  for (int i = 0; i < r.count; ++i) {
    state::Allocation a;
    a.set_id(r.first_id + static_cast<uint64_t>(i));
    a.set_stage(state::Allocation::ANSWERED);
    if (i < resp.container_responses_size()) SetResponse(&a, resp.container_responses(i));
    if (claims != nullptr && i < static_cast<int>(claims->size())) {
      *a.mutable_claim() = (*claims)[static_cast<size_t>(i)];
    }
    records.push_back(std::move(a));
  }
  return records;
}

std::vector<state::Allocation> WithdrawalRecords(const std::vector<uint64_t>& ids) {
  std::vector<state::Allocation> records(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    records[i].set_id(ids[i]);
    records[i].set_stage(state::Allocation::WITHDRAWN);
  }
  return records;
}

std::vector<state::Allocation> WithdrawalRecords(const AllocationJournal::Reservation& r) {
  std::vector<uint64_t> ids;
  for (int i = 0; i < r.count; ++i) ids.push_back(r.first_id + static_cast<uint64_t>(i));
  return WithdrawalRecords(ids);
}

std::string AnswerFields(const state::Allocation& answer) {
  state::Allocation fields;
  fields.set_response(answer.response());
  return fields.SerializeAsString() + StageWhole();
}

}  // namespace dpproxy
