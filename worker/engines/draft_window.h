// Chooses the draft window k of a sequence: an online estimate of its per-token acceptance rate
// a and a cost model measured at run time (the first draft step after a verify pass c_1, each
// later one c_d, verify pass of r rows c_v(r) = c_v(1) + slope * (r - 1), fetch time f, which
// overlaps the drafting; each a sequence's share of a batched pass), maximizing expected verified
// tokens per second:
//   E[tokens](k) = (1 - a^(k+1)) / (1 - a),   T(k) = max(c_1 + (k - 1) * c_d, f) + c_v(k + 1).
// The first step is timed apart: a verify pass streams the full KV through the caches, and the step
// after it reads the weights and the compressed KV back from memory (on a 2-core CPU at 16K,
// 0.95-1.08 ms against mostly 0.6-0.8). Averaged over all steps, that cost made short windows look
// dearer per draft than long ones by the first step's share, and the shorter the windows chosen, the
// larger that share.
// k = 0 (no drafts: the pass decodes one token from the full KV; with the full KV staged, plain
// decoding) is the other mode. It wins where a draft step plus a verify row cost more than the pass
// they save, as with the full KV already in memory on a CPU, where every row of a pass costs its
// own arithmetic. A sequence switches mode only when the other looks clearly better (hysteresis:
// kToPlain, kToDrafting), so rates within a few percent do not make it flap. Each mode keeps the
// costs of the other from being measured, so the other is tried now and then: a window with drafts
// after kProbeEvery windows without, and a window of 0 when the model has no recent one-row pass
// (with no fetch to hide). Each probe that does not change the mode doubles the wait before the
// next, up to kMaxProbeEvery windows, so a mode that keeps losing costs less and less. A sequence
// starts drafting when its first pass has a fetch to hide, and decoding plainly otherwise; it
// changes mode only on measured costs (a draft step and a pass timed).
#ifndef VC_WORKER_ENGINES_DRAFT_WINDOW_H_
#define VC_WORKER_ENGINES_DRAFT_WINDOW_H_

#include <cstddef>
#include <utility>
#include <vector>

namespace vc {

// Costs shared by the sequences of one engine. Not thread-safe.
class DraftCostModel {
 public:
  // `first`: the first draft step since a verify pass.
  void ObserveDraftStep(double seconds, bool first);
  void ObserveVerify(int rows, double seconds);
  void ObserveFetch(double bytes, double seconds);
  // A catch-up of `positions` (the tier and the compressed cache brought up to date in bulk).
  void ObserveCatchUp(double positions, double seconds);

  // A draft step after the first of a window; 1 ms until one is timed.
  double draft_step() const;
  // The first draft step of a window; draft_step() until one is timed.
  double first_draft_step() const { return first_step_ > 0 ? first_step_ : draft_step(); }
  // The time of a window of k draft steps.
  double drafts(int k) const { return k <= 0 ? 0.0 : first_draft_step() + (k - 1) * draft_step(); }
  // c_v(rows): a one-row pass as timed (the average of the recent ones), plus a per-row slope from
  // the multi-row passes; each part is averaged over its own passes only, so a long run of one
  // kind does not wash out what was measured of the other. Before both are timed, a least-squares
  // line over all passes.
  double verify(int rows) const;
  // Whether one-row passes are missing from the recent observations. A line fitted to multi-row
  // passes alone misjudges the one-row pass, the cost of not drafting, by its extrapolation.
  bool one_row_stale() const { return one_row_ < kOneRowStale; }
  bool one_row_timed() const { return one_row_seconds_ > 0; }
  // Whether both modes' costs rest on measurements: a draft step and a verify pass were timed.
  bool timed() const { return (draft_step_ > 0 || first_step_ > 0) && n_ > 0; }
  double fetch(double bytes) const { return bytes_per_second_ > 0 ? bytes / bytes_per_second_ : 0.0; }
  bool fetch_timed() const { return bytes_per_second_ > 0; }
  // The time of a catch-up of `positions`; 2 us a position until one is timed.
  double catch_up(double positions) const { return positions * (catch_up_per_position_ > 0 ? catch_up_per_position_ : 2e-6); }

 private:
  double draft_step_ = 0;        // 0 until a draft step after the first is timed
  double first_step_ = 0;        // 0 until a first draft step is timed
  double bytes_per_second_ = 0;  // 0 until the first fetch
  double catch_up_per_position_ = 0;  // 0 until the first catch-up
  // Least squares of verify time on rows, with a weak prior so one k alone still gives a slope,
  // each observation's weight decayed by kObservationDecay per later one.
  static constexpr double kObservationDecay = 0.95;
  double n_ = 0, sx_ = 0, sy_ = 0, sxx_ = 0, sxy_ = 0;
  double one_row_seconds_ = 0;  // 0 until a one-row pass is timed
  double row_slope_ = -1;       // < 0 until a multi-row pass is timed after a one-row one
  // The decayed weight of one-row passes: stale after about 30 passes without one.
  static constexpr double kOneRowStale = 0.2;
  double one_row_ = 0;
};

// Per-sequence acceptance estimate and window choice. Not thread-safe.
class DraftWindow {
 public:
  // fixed_k > 0 always returns fixed_k (capped); 0 adapts. A non-empty `pattern` (tests,
  // benchmarks) gives the windows in turn, each capped, instead of choosing.
  DraftWindow(int fixed_k, int max_k, std::vector<int> pattern = {})
      : fixed_k_(fixed_k), max_k_(max_k), pattern_(std::move(pattern)) {}

  // After a verification: `accepted` of `drafted` drafts matched.
  void Observe(int drafted, int accepted);
  // A whole window with the full KV staged throughout (nothing fetched): `tokens` verified in
  // `seconds` of the sequence's shares of the steps (drafts, verify pass). Once both
  // modes have such windows, their realized rates, not the model's, decide the mode where nothing
  // is fetched: they include what the model leaves out (the batch's scheduling).
  void ObserveWindow(int drafted, int tokens, double seconds);
  // The window for the next draft, in [0, max_k] (never more than `remaining` - 1). `fetch_bytes`
  // is what the verify pass must fetch first (0 when the full KV is already in memory);
  // `catch_up_positions`, what drafting must first bring up to date (plain decoding deferred it).
  // The mode (drafting or not) changes with hysteresis; probes of the other mode as in the header.
  // Plain decoding turns to drafting, or probes it, only when the catch-up costs at most
  // kCatchUpShare of the time plain decoding needs for the tokens still to generate: a sequence
  // near its end does not pay to build a compressed cache it would barely use.
  int Choose(const DraftCostModel& costs, double fetch_bytes, int remaining, double catch_up_positions = 0);
  double acceptance() const;
  // The sequence's mode: drafting, or decoding one token a pass. (Probes do not change it.)
  bool drafting() const { return drafting_; }
  // Times the mode changed.
  int switches() const { return switches_; }

 private:
  // The k in [lo, cap] with the most expected verified tokens per second, and that rate.
  int Best(const DraftCostModel& costs, double fetch_bytes, int lo, int cap, double* rate = nullptr) const;

  // The acceptance rate is accepted / trials of drafts, both counts decayed by kDecay per trial
  // (about the last 1 / (1 - kDecay) trials count), from a prior of kPriorTrials trials at 0.7:
  // one fully accepted window moves it a little, not to the cap.
  static constexpr double kDecay = 0.97;
  static constexpr double kPriorTrials = 4;
  static constexpr int kProbeEvery = 16;
  static constexpr int kMaxProbeEvery = 256;
  // Drafting takes over from plain decoding only when it looks 5% faster (a switch costs a catch-up
  // of the compressed cache); plain decoding takes over when it looks 1% faster.
  static constexpr double kToDrafting = 1.05;
  static constexpr double kToPlain = 1.01;
  static constexpr double kCatchUpShare = 0.05;
  int fixed_k_, max_k_;
  std::vector<int> pattern_;
  size_t next_in_pattern_ = 0;
  static constexpr int kProbeWindow = 4;  // drafts in a probe of drafting, at most
  bool started_ = false;
  bool drafting_ = false;
  int switches_ = 0;
  int probe_every_ = kProbeEvery;
  int since_probe_ = 0;  // windows in this mode since it changed or since the last probe
  double plain_rate_ = 0, drafting_rate_ = 0;  // realized tokens/s (ObserveWindow); 0 until one
  double accepted_ = 0.7 * kPriorTrials, trials_ = kPriorTrials;
};

}  // namespace vc

#endif  // VC_WORKER_ENGINES_DRAFT_WINDOW_H_
