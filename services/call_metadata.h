// Metadata keys of the Inference service's calls (proto/vericache/v1/inference.proto).
#ifndef VC_SERVICES_CALL_METADATA_H_
#define VC_SERVICES_CALL_METADATA_H_

namespace vc {

// The initial metadata key ("1") of a Generate call that its worker has queued: sent before the
// first token, so that a client learns the call was taken (not refused) before tokens come.
inline constexpr char kAdmittedKey[] = "vericache-admitted";

}  // namespace vc

#endif  // VC_SERVICES_CALL_METADATA_H_
