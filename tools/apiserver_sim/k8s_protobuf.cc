#include "tools/apiserver_sim/k8s_protobuf.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <google/protobuf/unknown_field_set.h>

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "tools/apiserver_sim/k8s_protobuf.pb.h"

namespace dpproxy::sim {
namespace {

using Json = nlohmann::json;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

constexpr std::string_view kMagic("k8s\0", 4);

absl::StatusOr<Json> MessageToJson(const Message& m, const std::string& path);

// One value of `f` (the `index`th if repeated, else -1) as the API's JSON.
absl::StatusOr<Json> ValueToJson(const Message& m, const FieldDescriptor* f, int index,
                                 const std::string& path) {
  const Reflection* r = m.GetReflection();
  const bool rep = index >= 0;
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT64:
      return Json(rep ? r->GetRepeatedInt64(m, f, index) : r->GetInt64(m, f));
    case FieldDescriptor::CPPTYPE_INT32:
      return Json(rep ? r->GetRepeatedInt32(m, f, index) : r->GetInt32(m, f));
    case FieldDescriptor::CPPTYPE_BOOL:
      return Json(rep ? r->GetRepeatedBool(m, f, index) : r->GetBool(m, f));
    case FieldDescriptor::CPPTYPE_STRING:
      return Json(rep ? r->GetRepeatedString(m, f, index) : r->GetString(m, f));
    case FieldDescriptor::CPPTYPE_MESSAGE: {
      const Message& sub = rep ? r->GetRepeatedMessage(m, f, index) : r->GetMessage(m, f);
      // A Quantity is its string in JSON; a Time is RFC 3339 in UTC.
      if (sub.GetDescriptor() == k8s::Quantity::descriptor()) {
        return Json(static_cast<const k8s::Quantity&>(sub).string());
      }
      if (sub.GetDescriptor() == k8s::Time::descriptor()) {
        const auto& t = static_cast<const k8s::Time&>(sub);
        if (t.seconds() == 0 && t.nanos() == 0) return Json();  // Go's zero time: null
        return Json(absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::FromUnixSeconds(t.seconds()),
                                     absl::UTCTimeZone()));
      }
      return MessageToJson(sub, path);
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": a field of a type the simulator does not read"));
  }
}

absl::StatusOr<Json> MessageToJson(const Message& m, const std::string& path) {
  const Reflection* r = m.GetReflection();
  const google::protobuf::UnknownFieldSet& unknown = r->GetUnknownFields(m);
  if (unknown.field_count() > 0) {
    return absl::UnimplementedError(absl::StrCat(
        path.empty() ? "the object" : path, " has field number ", unknown.field(0).number(),
        ", which the simulator does not read (", m.GetDescriptor()->name(),
        " in tools/apiserver_sim/k8s_protobuf.proto)"));
  }
  Json out = Json::object();
  const google::protobuf::Descriptor* d = m.GetDescriptor();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    const std::string at = path.empty() ? f->json_name() : absl::StrCat(path, ".", f->json_name());
    if (f->is_map()) {
      Json map = Json::object();
      for (int j = 0; j < r->FieldSize(m, f); ++j) {
        const Message& entry = r->GetRepeatedMessage(m, f, j);
        const FieldDescriptor* key = entry.GetDescriptor()->map_key();
        const FieldDescriptor* value = entry.GetDescriptor()->map_value();
        const std::string k = entry.GetReflection()->GetString(entry, key);
        absl::StatusOr<Json> v = ValueToJson(entry, value, -1, absl::StrCat(at, "[", k, "]"));
        if (!v.ok()) return v.status();
        map[k] = *std::move(v);
      }
      if (!map.empty()) out[f->json_name()] = std::move(map);
    } else if (f->is_repeated()) {
      Json list = Json::array();
      for (int j = 0; j < r->FieldSize(m, f); ++j) {
        absl::StatusOr<Json> v = ValueToJson(m, f, j, absl::StrCat(at, "[", j, "]"));
        if (!v.ok()) return v.status();
        list.push_back(*std::move(v));
      }
      if (!list.empty()) out[f->json_name()] = std::move(list);
    } else if (r->HasField(m, f)) {
      absl::StatusOr<Json> v = ValueToJson(m, f, -1, at);
      if (!v.ok()) return v.status();
      out[f->json_name()] = *std::move(v);
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<Json> KubernetesProtobufToJson(std::string_view body) {
  if (body.substr(0, kMagic.size()) != kMagic) {
    return absl::InvalidArgumentError(
        "not Kubernetes protobuf: the body does not start with the magic \"k8s\\0\"");
  }
  body.remove_prefix(kMagic.size());
  k8s::Unknown envelope;
  if (!envelope.ParseFromArray(body.data(), static_cast<int>(body.size()))) {
    return absl::InvalidArgumentError("not Kubernetes protobuf: the envelope does not parse");
  }
  if (!envelope.contentencoding().empty()) {
    return absl::UnimplementedError(absl::StrCat("content encoding \"",
                                                 envelope.contentencoding(),
                                                 "\" is not read by the simulator"));
  }
  const std::string& api_version = envelope.typemeta().apiversion();
  const std::string& kind = envelope.typemeta().kind();
  std::unique_ptr<Message> object;
  if (kind == "ResourceSlice" && (api_version == "resource.k8s.io/v1" ||
                                  api_version == "resource.k8s.io/v1beta2")) {
    object = std::make_unique<k8s::ResourceSlice>();
  } else if (kind == "ResourceSlice" && api_version == "resource.k8s.io/v1beta1") {
    object = std::make_unique<k8s::ResourceSliceV1beta1>();
  } else {
    return absl::UnimplementedError(absl::StrCat(
        "the simulator reads no ", kind.empty() ? "object without a kind" : kind, " of ",
        api_version.empty() ? "no apiVersion" : api_version,
        " in Kubernetes protobuf (only ResourceSlices of resource.k8s.io v1, v1beta2 and "
        "v1beta1)"));
  }
  if (!object->ParseFromString(envelope.raw())) {
    return absl::InvalidArgumentError(
        absl::StrCat("not Kubernetes protobuf: the ", kind, " does not parse"));
  }
  absl::StatusOr<Json> json = MessageToJson(*object, "");
  if (!json.ok()) return json.status();
  (*json)["apiVersion"] = api_version;
  (*json)["kind"] = kind;
  return json;
}

}  // namespace dpproxy::sim
