// The adaptive draft window: its acceptance estimate and the window its cost model picks.
#include "worker/engines/draft_window.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace vc {
namespace {

// Verifies a window of k drafts, each accepted with probability p, until the first miss.
int AcceptedOf(int k, double p, std::mt19937& rng) {
  std::bernoulli_distribution hit(p);
  int accepted = 0;
  while (accepted < k && hit(rng)) ++accepted;
  return accepted;
}

TEST(DraftWindow, AcceptanceTracksTheRateAndOneWindowMovesItLittle) {
  for (double p : {0.3, 0.75, 0.95}) {
    DraftWindow w(/*fixed_k=*/0, /*max_k=*/16);
    std::mt19937 rng(7);
    for (int i = 0; i < 200; ++i) w.Observe(8, AcceptedOf(8, p, rng));
    EXPECT_NEAR(w.acceptance(), p, 0.1) << p;
  }
  // Settled near 0.6, a window of 10 accepted drafts nudges the estimate instead of replacing it.
  DraftWindow w(0, 16);
  for (int i = 0; i < 100; ++i) w.Observe(4, i % 2 == 0 ? 1 : 4);  // 5 of 7 trials per two windows
  const double before = w.acceptance();
  w.Observe(10, 10);
  EXPECT_GT(w.acceptance(), before);
  EXPECT_LT(w.acceptance() - before, 0.15);
  EXPECT_LT(w.acceptance(), 0.9);
}

TEST(DraftWindow, ChoosesLongWindowsWhenVerifyIsFlatAndNoneWhenDraftsCannotPay) {
  DraftCostModel flat, steep;
  for (int i = 0; i < 20; ++i) {
    flat.ObserveDraftStep(1e-3, /*first=*/false);
    steep.ObserveDraftStep(1e-3, /*first=*/false);
    for (int rows : {1, 2, 5, 9}) {
      flat.ObserveVerify(rows, 4e-3);               // one read of the KV, whatever the rows
      steep.ObserveVerify(rows, 1e-3 + rows * 2e-3);  // every row costs two draft steps
    }
  }
  EXPECT_NEAR(steep.verify(5), 11e-3, 1e-4);
  DraftWindow good(0, 16), poor(0, 16);
  std::mt19937 rng(3);
  for (int i = 0; i < 100; ++i) {
    good.Observe(8, AcceptedOf(8, 0.95, rng));
    poor.Observe(8, AcceptedOf(8, 0.3, rng));
  }
  EXPECT_GE(good.Choose(flat, 0, 1000), 8);
  const int on_steep = good.Choose(steep, 0, 1000);
  EXPECT_FALSE(good.drafting());
  EXPECT_LT(on_steep, good.Choose(flat, 0, 1000));
  EXPECT_TRUE(good.drafting());
  // On the steep pass a draft step costs as much as the pass's fixed part it saves, so even good
  // drafts do not pay: one row from the full KV (3 ms a token) beats a draft and a two-row pass
  // (6 ms for up to 2 tokens). A fetch the drafts would hide makes them pay.
  EXPECT_EQ(good.Choose(steep, 0, 1000), 0);
  EXPECT_EQ(poor.Choose(steep, 0, 1000), 0);
  DraftCostModel fetched = steep;
  fetched.ObserveFetch(1e6, 10e-3);  // 100 MB/s
  EXPECT_GE(good.Choose(fetched, 1e6, 1000), 4);
  EXPECT_GE(poor.Choose(fetched, 1e6, 1000), 1);
  // Without drafts, draft steps and multi-row passes go untimed, so drafting is tried again after
  // 16 windows (costs change: a batch forms, the KV leaves memory, a first estimate was off).
  int passes = 0;
  while (good.Choose(steep, 0, 1000) == 0 && passes < 1000) {
    steep.ObserveVerify(1, 3e-3);
    ++passes;
  }
  EXPECT_EQ(passes, 16);
  // A model fitted to multi-row passes alone takes a window of 0 to measure one, unless the pass
  // has a fetch to wait for, which drafts would hide. Once that one is old, it takes another after
  // 16 windows, then after 32 (the wait doubles), however long the model goes without one.
  DraftCostModel multi;
  for (int i = 0; i < 20; ++i) {
    multi.ObserveDraftStep(1e-3, /*first=*/false);
    for (int rows : {5, 9}) multi.ObserveVerify(rows, 4e-3);
  }
  EXPECT_TRUE(multi.one_row_stale());
  DraftWindow sure(0, 16);
  for (int i = 0; i < 100; ++i) sure.Observe(8, 8);
  EXPECT_GE(sure.Choose(multi, 1e6, 1000), 8);  // a first pass with a fetch starts drafting
  EXPECT_TRUE(sure.drafting());
  EXPECT_EQ(sure.Choose(multi, 0, 1000), 0);  // nothing to fetch, no one-row pass ever: at once
  multi.ObserveVerify(1, 4e-3);
  EXPECT_FALSE(multi.one_row_stale());
  for (int i = 0; i < 40; ++i) {
    for (int rows : {5, 9}) multi.ObserveVerify(rows, 4e-3);
  }
  EXPECT_TRUE(multi.one_row_stale());
  std::vector<int> probes;
  for (int i = 1; i <= 64; ++i) {
    if (sure.Choose(multi, 0, 1000) == 0) probes.push_back(i);
  }
  EXPECT_EQ(probes, (std::vector<int>{17, 50}));
  EXPECT_TRUE(sure.drafting());
  multi.ObserveVerify(1, 4e-3);
  EXPECT_FALSE(multi.one_row_stale());
  for (int i = 0; i < 32; ++i) EXPECT_GE(sure.Choose(multi, 0, 1000), 8);
  // Never past the tokens still to generate, and a fixed window stays fixed.
  EXPECT_LE(good.Choose(flat, 0, 3), 2);
  EXPECT_EQ(good.Choose(flat, 0, 1), 0);
  EXPECT_EQ(DraftWindow(5, 16).Choose(steep, 0, 1000), 5);
  EXPECT_EQ(DraftWindow(40, 16).Choose(steep, 0, 1000), 16);
}

// Verified tokens per second of a window of k drafts with nothing to fetch, as Choose weighs it.
double Rate(const DraftCostModel& c, double a, int k) {
  return (1 - std::pow(a, k + 1)) / (1 - a) / (c.drafts(k) + c.verify(k + 1));
}

// Costs where a one-row pass takes `one_row` seconds, each further row 0.5 ms, a draft step 1 ms.
DraftCostModel Costs(double one_row) {
  DraftCostModel c;
  for (int i = 0; i < 20; ++i) {
    c.ObserveDraftStep(1e-3, /*first=*/false);
    c.ObserveDraftStep(1e-3, /*first=*/true);
    for (int rows : {1, 3, 5}) c.ObserveVerify(rows, one_row + 0.5e-3 * (rows - 1));
  }
  return c;
}

// How much faster the best window with drafts is than plain decoding, under Costs(one_row).
double DraftingGain(double one_row, double a, int max_k) {
  const DraftCostModel c = Costs(one_row);
  double best = 0;
  for (int k = 1; k <= max_k; ++k) best = std::max(best, Rate(c, a, k));
  return best / Rate(c, a, 0);
}

// The one-row time at which drafting is `gain` times as fast as plain decoding (bisection: the
// slower the one-row pass, the more drafting gains).
double OneRowFor(double gain, double a, int max_k) {
  double lo = 0.1e-3, hi = 100e-3;
  for (int i = 0; i < 60; ++i) {
    const double mid = (lo + hi) / 2;
    (DraftingGain(mid, a, max_k) < gain ? lo : hi) = mid;
  }
  return (lo + hi) / 2;
}

TEST(DraftWindow, SwitchesModeOnlyWhenTheOtherIsClearlyBetterAndProbesLessAndLess) {
  DraftWindow w(0, 8);
  for (int i = 0; i < 100; ++i) w.Observe(4, 2);  // acceptance 2 of 3 trials
  const double a = w.acceptance();
  ASSERT_NEAR(a, 2.0 / 3, 0.05);
  const DraftCostModel plain_wins = Costs(OneRowFor(0.8, a, 8));
  ASSERT_EQ(w.Choose(plain_wins, 0, 1000), 0);  // with nothing to fetch, it starts plain
  EXPECT_FALSE(w.drafting());
  EXPECT_EQ(w.switches(), 0);
  // Drafting 3% faster does not take over from plain decoding (a switch costs a catch-up, and
  // rates that close may be noise); 8% faster does.
  const DraftCostModel slightly = Costs(OneRowFor(1.03, a, 8));
  for (int i = 0; i < 10; ++i) EXPECT_EQ(w.Choose(slightly, 0, 1000), 0);
  EXPECT_FALSE(w.drafting());
  const DraftCostModel clearly = Costs(OneRowFor(1.08, a, 8));
  EXPECT_GT(w.Choose(clearly, 0, 1000), 0);
  EXPECT_TRUE(w.drafting());
  // Drafting stays while plain decoding is no more than 1% faster, and gives way past that.
  const DraftCostModel tie = Costs(OneRowFor(0.995, a, 8));
  for (int i = 0; i < 10; ++i) EXPECT_GT(w.Choose(tie, 0, 1000), 0);
  EXPECT_TRUE(w.drafting());
  EXPECT_EQ(w.Choose(Costs(OneRowFor(0.98, a, 8)), 0, 1000), 0);
  EXPECT_FALSE(w.drafting());
  EXPECT_EQ(w.switches(), 2);
  // While plain decoding wins, drafting is probed after 16 windows (the one that switched to plain
  // and 16 more), then after twice as many each time, up to 256: the probes cost less and less. A
  // probe does not change the mode.
  std::vector<int> gaps;
  int since = 0;
  for (int i = 0; i < 1500; ++i) {
    ++since;
    if (w.Choose(plain_wins, 0, 1000) > 0) {
      gaps.push_back(since);
      since = 0;
    }
    EXPECT_FALSE(w.drafting());
  }
  ASSERT_GE(gaps.size(), 6u);
  EXPECT_EQ(std::vector<int>(gaps.begin(), gaps.begin() + 6), (std::vector<int>{16, 33, 65, 129, 257, 257}));
  EXPECT_EQ(w.switches(), 2);
  // A fresh sequence with nothing timed yet decodes plainly until a probe times drafting.
  DraftWindow fresh(0, 8);
  DraftCostModel untimed;
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(fresh.Choose(untimed, 0, 1000), 0);
    untimed.ObserveVerify(1, 3e-3);
  }
  const int probe = fresh.Choose(untimed, 0, 1000);  // the probe: a short window
  EXPECT_GT(probe, 0);
  EXPECT_LE(probe, 4);
  EXPECT_FALSE(fresh.drafting());
  // A catch-up that would cost more than 5% of the plain decoding still to come is not paid, for
  // a probe or a switch, even where drafting is twice as fast: here, one costing 10 one-row
  // passes (2 us a position before any is timed) with 100 tokens to go; with 1000 it is.
  const double one_row = OneRowFor(2.0, a, 8);
  const double positions = 10 * one_row / 2e-6;
  DraftWindow near_end(0, 8);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(near_end.Choose(Costs(one_row), 0, 100, positions), 0);
  EXPECT_FALSE(near_end.drafting());
  EXPECT_GT(near_end.Choose(Costs(one_row), 0, 1000, positions), 0);
  EXPECT_TRUE(near_end.drafting());
}

TEST(DraftWindow, APatternGivesTheWindowsInTurn) {
  DraftWindow w(0, 8, {0, 3, 20});
  const DraftCostModel c = Costs(1e-3);
  EXPECT_EQ(w.Choose(c, 0, 1000), 0);
  EXPECT_EQ(w.Choose(c, 0, 1000), 3);
  EXPECT_EQ(w.Choose(c, 0, 1000), 8);  // capped
  EXPECT_EQ(w.Choose(c, 0, 1000), 0);
  EXPECT_EQ(w.Choose(c, 0, 3), 2);  // never past the tokens still to generate
}

TEST(DraftWindow, TheFirstDraftStepAfterAPassIsChargedOncePerWindow) {
  // A draft step after a verify pass reads what the pass pushed out of the caches again: 3 ms
  // against 0.3 for the steps after it. A pass costs 1 ms plus 0.8 per row.
  DraftCostModel costs;
  EXPECT_DOUBLE_EQ(costs.first_draft_step(), costs.draft_step());  // neither timed yet
  for (int i = 0; i < 40; ++i) {
    costs.ObserveDraftStep(i % 4 == 0 ? 3e-3 : 0.3e-3, /*first=*/i % 4 == 0);
    for (int rows : {1, 5, 9}) costs.ObserveVerify(rows, 1e-3 + 0.8e-3 * rows);
  }
  EXPECT_NEAR(costs.first_draft_step(), 3e-3, 1e-9);
  EXPECT_NEAR(costs.draft_step(), 0.3e-3, 1e-9);
  EXPECT_NEAR(costs.drafts(4), 3e-3 + 3 * 0.3e-3, 1e-9);
  EXPECT_EQ(costs.drafts(0), 0.0);
  DraftWindow w(0, 16);
  for (int i = 0; i < 200; ++i) w.Observe(8, 8 - (i % 20 == 0));  // acceptance near 0.99
  // With the first step paid once, the window goes long: each further draft costs 0.3 ms and a
  // row, against the 1.8 ms pass it likely saves. Charging every step the 0.77 ms average of the
  // windows of 4 above, as a single average did, would choose a window of 6 here.
  EXPECT_GE(w.Choose(costs, 0, 1000), 12);
  // Until a later step is timed, the first one stands for every step.
  DraftCostModel first_only;
  first_only.ObserveDraftStep(2e-3, /*first=*/true);
  EXPECT_DOUBLE_EQ(first_only.draft_step(), 2e-3);
  EXPECT_DOUBLE_EQ(first_only.drafts(3), 6e-3);
}

}  // namespace
}  // namespace vc
