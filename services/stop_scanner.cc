#include "services/stop_scanner.h"

#include <algorithm>
#include <utility>

namespace vc {

StopScanner::StopScanner(const Tokenizer& tokenizer, std::vector<std::string> stops, absl::Span<const int32_t> context)
    : stops_(std::move(stops)), stream_(tokenizer, context) {
  for (const std::string& s : stops_) longest_ = std::max(longest_, s.size());
}

StopScanner::Sendable StopScanner::Take(absl::Span<const int32_t> tokens, bool done) {
  if (stopped()) return {};
  const size_t scanned = text_.size();  // ends of stops up to here have been looked for
  // Tokens whose character was open end where the token that closes it ends.
  const auto close_open = [&] {
    for (auto it = ends_.rbegin(); it != ends_.rend() && *it == std::string::npos; ++it) *it = text_.size();
  };
  for (int32_t t : tokens) {
    text_ += stream_.Add(t);
    held_.push_back(t);
    ends_.push_back(std::string::npos);
    if (stream_.held() == 0) close_open();
  }
  if (done) {
    text_ += stream_.Flush();
    close_open();
  }
  // Each new end position in order: the first where a stop ends wins.
  for (size_t e = scanned + 1; e <= text_.size() && !stopped(); ++e) {
    for (const std::string& s : stops_) {
      if (s.size() <= e && text_.compare(e - s.size(), s.size(), s) == 0) {
        stop_at_ = std::min(stop_at_, e - s.size());
      }
    }
  }
  // Send what ends before the stop; without one, what no stop that ends later can reach back into.
  const size_t keep = longest_ > 0 ? longest_ - 1 : 0;
  const size_t limit = stopped() ? stop_at_ : done ? text_.size() : (text_.size() > keep ? text_.size() - keep : 0);
  Sendable out;
  size_t end = sent_;
  while (!held_.empty() && ends_.front() <= limit) {
    out.tokens.push_back(held_.front());
    end = ends_.front();
    held_.pop_front();
    ends_.pop_front();
  }
  out.text = text_.substr(sent_, end - sent_);
  sent_ = end;
  if (stopped()) {
    held_.clear();
    ends_.clear();
  }
  return out;
}

}  // namespace vc
