#include "worker/engines/draft_window.h"

#include <algorithm>
#include <cmath>

namespace vc {
namespace {

// A moving average that the first observation (while `average` is still 0) sets outright.
double Blend(double average, double x) { return average == 0 ? x : 0.8 * average + 0.2 * x; }

}  // namespace

double DraftCostModel::draft_step() const {
  if (draft_step_ > 0) return draft_step_;
  return first_step_ > 0 ? first_step_ : 1e-3;
}

void DraftCostModel::ObserveDraftStep(double s, bool first) {
  double& average = first ? first_step_ : draft_step_;
  average = Blend(average, s);
}

void DraftCostModel::ObserveVerify(int rows, double s) {
  one_row_ = kObservationDecay * one_row_ + (rows == 1 ? 1 : 0);
  if (rows == 1) {
    one_row_seconds_ = Blend(one_row_seconds_, s);
  } else if (rows > 1 && one_row_seconds_ > 0) {
    const double slope = std::max(0.0, (s - one_row_seconds_) / (rows - 1));
    row_slope_ = row_slope_ < 0 ? slope : 0.8 * row_slope_ + 0.2 * slope;
  }
  n_ = kObservationDecay * n_ + 1;
  sx_ = kObservationDecay * sx_ + rows;
  sy_ = kObservationDecay * sy_ + s;
  sxx_ = kObservationDecay * sxx_ + double(rows) * rows;
  sxy_ = kObservationDecay * sxy_ + rows * s;
}

double DraftCostModel::verify(int rows) const {
  if (one_row_seconds_ > 0 && row_slope_ >= 0) return one_row_seconds_ + row_slope_ * (rows - 1);
  if (n_ == 0) return 4 * draft_step();
  // Prior: a verify row costs a tenth of a draft step beyond the fixed cost.
  const double prior_w = 1.0, prior_slope = 0.1 * draft_step();
  const double mx = sx_ / n_, my = sy_ / n_;
  const double var = sxx_ / n_ - mx * mx;
  const double cov = sxy_ / n_ - mx * my;
  const double slope = std::max(0.0, (cov * n_ + prior_slope * prior_w) / (var * n_ + prior_w));
  return std::max(0.0, my + slope * (rows - mx));
}

void DraftCostModel::ObserveCatchUp(double positions, double s) {
  if (s <= 0 || positions <= 0) return;
  catch_up_per_position_ = Blend(catch_up_per_position_, s / positions);
}

void DraftCostModel::ObserveFetch(double bytes, double s) {
  if (s <= 0 || bytes <= 0) return;
  bytes_per_second_ = Blend(bytes_per_second_, bytes / s);
}

void DraftWindow::Observe(int drafted, int accepted) {
  if (drafted <= 0) return;
  // Drafts are accepted until the first miss: accepted successes, then one failure if any.
  const double trials = accepted + (accepted < drafted ? 1 : 0);
  const double keep = std::pow(kDecay, trials);
  accepted_ = keep * accepted_ + accepted;
  trials_ = keep * trials_ + trials;
}

void DraftWindow::ObserveWindow(int drafted, int tokens, double seconds) {
  if (seconds <= 0 || tokens <= 0) return;
  double& rate = drafted > 0 ? drafting_rate_ : plain_rate_;
  rate = Blend(rate, tokens / seconds);
}

double DraftWindow::acceptance() const { return std::clamp(accepted_ / trials_, 0.02, 0.995); }

int DraftWindow::Choose(const DraftCostModel& costs, double fetch_bytes, int remaining, double catch_up_positions) {
  const int cap = std::min(max_k_, remaining - 1);
  if (!pattern_.empty()) {
    const int k = pattern_[next_in_pattern_++ % pattern_.size()];
    return std::clamp(k, 0, std::max(cap, 0));
  }
  if (cap <= 0) return 0;
  if (fixed_k_ > 0) return std::min(fixed_k_, cap);
  double with = 0, without = 0;
  const int best = Best(costs, fetch_bytes, 1, cap, &with);
  Best(costs, fetch_bytes, 0, 0, &without);
  if (!started_) {
    // Drafts where they would hide a fetch, else decode as a full-KV decoder would until drafting
    // is measured to pay.
    started_ = true;
    drafting_ = fetch_bytes > 0;
  }
  if (fetch_bytes <= 0 && plain_rate_ > 0 && drafting_rate_ > 0) {
    with = drafting_rate_;  // realized rates where both were seen
    without = plain_rate_;
  }
  const bool affordable =
      without <= 0 || costs.catch_up(catch_up_positions) <= kCatchUpShare * remaining / without;
  if (costs.timed() && (drafting_ ? without > with * kToPlain : (with > without * kToDrafting && affordable))) {
    drafting_ = !drafting_;
    ++switches_;
    probe_every_ = kProbeEvery;
    since_probe_ = 0;
  }
  // Drafting where nothing is fetched (a sequence whose first pass hid a fetch and now keeps its
  // full KV staged) and no one-row pass was ever timed: time one now.
  if (drafting_ && fetch_bytes <= 0 && !costs.one_row_timed()) return 0;
  // The other mode's costs go untimed in this one: probe it now and then. Without drafts, draft
  // steps and multi-row passes; with drafts and nothing to fetch, the one-row pass (with a fetch,
  // drafts hide it, and a pass without them would wait for all of it).
  const bool other_stale = !drafting_ || (fetch_bytes <= 0 && costs.one_row_stale());
  if (other_stale && ++since_probe_ > probe_every_ && (drafting_ || affordable)) {
    since_probe_ = 0;
    probe_every_ = std::min(2 * probe_every_, kMaxProbeEvery);
    // A short window suffices to time draft steps (the first and a later one) and a multi-row
    // pass, and costs less where drafting loses.
    return drafting_ ? 0 : std::min(best, kProbeWindow);
  }
  // Until drafting is timed, a short window: it hides the start of a first fetch, and costs little
  // where drafting turns out to lose.
  if (drafting_ && !costs.timed()) return std::min(best, kProbeWindow);
  return drafting_ ? best : 0;
}

int DraftWindow::Best(const DraftCostModel& costs, double fetch_bytes, int lo, int cap, double* rate) const {
  const double a = acceptance(), f = costs.fetch(fetch_bytes);
  int best = lo;
  double best_rate = -1;
  for (int k = lo; k <= cap; ++k) {
    const double tokens = (1 - std::pow(a, k + 1)) / (1 - a);
    const double time = std::max(costs.drafts(k), f) + costs.verify(k + 1);
    if (tokens / time > best_rate) {
      best_rate = tokens / time;
      best = k;
    }
  }
  if (rate != nullptr) *rate = best_rate;
  return best;
}

}  // namespace vc
