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
  n_ = kObservationDecay * n_ + 1;
  sx_ = kObservationDecay * sx_ + rows;
  sy_ = kObservationDecay * sy_ + s;
  sxx_ = kObservationDecay * sxx_ + double(rows) * rows;
  sxy_ = kObservationDecay * sxy_ + rows * s;
}

double DraftCostModel::verify(int rows) const {
  if (n_ == 0) return 4 * draft_step();
  // Prior: a verify row costs a tenth of a draft step beyond the fixed cost.
  const double prior_w = 1.0, prior_slope = 0.1 * draft_step();
  const double mx = sx_ / n_, my = sy_ / n_;
  const double var = sxx_ / n_ - mx * mx;
  const double cov = sxy_ / n_ - mx * my;
  const double slope = std::max(0.0, (cov * n_ + prior_slope * prior_w) / (var * n_ + prior_w));
  return std::max(0.0, my + slope * (rows - mx));
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

double DraftWindow::acceptance() const { return std::clamp(accepted_ / trials_, 0.02, 0.995); }

int DraftWindow::Choose(const DraftCostModel& costs, double fetch_bytes, int remaining) {
  const int cap = std::min(max_k_, remaining - 1);
  if (cap <= 0) return 0;
  if (fixed_k_ > 0) return std::min(fixed_k_, cap);
  int k = 0;
  if (fetch_bytes > 0 || !costs.one_row_stale() || windows_since_none_ < kProbeEvery) {
    k = Best(costs, fetch_bytes, 0, cap);
    if (k == 0 && windows_since_drafts_ >= kProbeEvery) k = Best(costs, fetch_bytes, 1, cap);
  }
  windows_since_none_ = k == 0 ? 0 : windows_since_none_ + 1;
  windows_since_drafts_ = k > 0 ? 0 : windows_since_drafts_ + 1;
  return k;
}

int DraftWindow::Best(const DraftCostModel& costs, double fetch_bytes, int lo, int cap) const {
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
  return best;
}

}  // namespace vc
