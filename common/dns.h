// DNS SRV lookups: how a worker finds the cache store's shards from a Kubernetes headless Service
// (the StatefulSet's pods as `_grpc._tcp.<service>` records, one per pod, named stably).
#ifndef VC_COMMON_DNS_H_
#define VC_COMMON_DNS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace vc {

// The targets of the SRV records of `name` as "host:port" (host without the trailing dot),
// sorted and without duplicates. The name is searched like any other (relative names take the
// resolver's search domains, as in a pod). `nameserver` ("ip:port") replaces the system's
// resolvers when given (tests). kNotFound when the name has no SRV records, kUnavailable when no
// resolver answers or its answer cannot be parsed, kInvalidArgument for a name or nameserver that
// is malformed.
absl::StatusOr<std::vector<std::string>> ResolveSrv(const std::string& name, const std::string& nameserver = "");

}  // namespace vc

#endif  // VC_COMMON_DNS_H_
