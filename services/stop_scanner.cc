#include "services/stop_scanner.h"

#include <algorithm>
#include <utility>

namespace vc {

StopScanner::StopScanner(const Tokenizer& tokenizer, std::vector<std::string> stops)
    : tokenizer_(tokenizer), stops_(std::move(stops)) {
  for (const std::string& s : stops_) longest_ = std::max(longest_, s.size());
}

std::vector<int32_t> StopScanner::Take(absl::Span<const int32_t> tokens, bool done) {
  if (stops_.empty()) return {tokens.begin(), tokens.end()};
  if (stopped()) return {};
  const size_t scanned = text_.size();  // ends of stops up to here have been looked for
  for (int32_t t : tokens) {
    text_ += tokenizer_.Decode({t});
    held_.push_back(t);
    ends_.push_back(text_.size());
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
  const size_t keep = longest_ - 1;
  const size_t limit = stopped() ? stop_at_ : done ? text_.size() : (text_.size() > keep ? text_.size() - keep : 0);
  std::vector<int32_t> out;
  while (!held_.empty() && ends_.front() <= limit) {
    out.push_back(held_.front());
    held_.pop_front();
    ends_.pop_front();
  }
  if (stopped()) {
    held_.clear();
    ends_.clear();
  }
  return out;
}

}  // namespace vc
