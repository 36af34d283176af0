// File: journal_records.h
//
// The journal's records of an allocation's steps (state.proto's
// Allocation.stage): what a Record or a reservation writes, an answer, a
// withdrawal. Pure functions of their inputs; the keeper takes the ids and
// the time, and applies the records to its allocations.
#ifndef DPPROXY_PROXY_STATE_JOURNAL_RECORDS_H_
#define DPPROXY_PROXY_STATE_JOURNAL_RECORDS_H_

#include <stdint.h>

#include <string>
#include <vector>

#include "proto/v1beta1/api.pb.h"
#include "proxy/state/allocation_journal.h"
#include "proxy/state/state.pb.h"

namespace dpproxy {

// One record per container request of `req`, with ids from `first_id` on:
// WHOLE with `resp`, or RESERVED (everything but the response) when
// `resp` is null. The plugin's side from `backend`; allocated at `now_ms`.
std::vector<state::Allocation> AllocationRecords(const std::string& resource,
                                                 const v1beta1::AllocateRequest& req,
                                                 const v1beta1::AllocateResponse* resp,
                                                 const BackendSide& backend, uint64_t first_id,
                                                 int64_t now_ms);

// The ANSWERED records of reservation `r`: each container's response, and
// with `claims` (may be null) its DRA claim.
std::vector<state::Allocation> AnswerRecords(const AllocationJournal::Reservation& r,
                                             const v1beta1::AllocateResponse& resp,
                                             const std::vector<state::DraClaim>* claims);

// WITHDRAWN records of `ids`: the allocations end.
std::vector<state::Allocation> WithdrawalRecords(const std::vector<uint64_t>& ids);
std::vector<state::Allocation> WithdrawalRecords(const AllocationJournal::Reservation& r);

// Bytes that, appended to a reservation's encoding, give it the response of
// `answer` and end its stage (the stage set to WHOLE): the answer applied
// without parsing the reservation.
std::string AnswerFields(const state::Allocation& answer);

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_STATE_JOURNAL_RECORDS_H_
