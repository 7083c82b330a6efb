// The adaptive draft window: its acceptance estimate and the window its cost model picks.
#include "worker/engines/draft_window.h"

#include <random>

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
  EXPECT_LT(good.Choose(steep, 0, 1000), good.Choose(flat, 0, 1000));
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
  // has a fetch to wait for, which drafts would hide; a sequence probes again only after 16
  // windows with drafts, however long the model goes without a one-row pass.
  DraftCostModel multi;
  for (int i = 0; i < 20; ++i) {
    multi.ObserveDraftStep(1e-3, /*first=*/false);
    for (int rows : {5, 9}) multi.ObserveVerify(rows, 4e-3);
  }
  EXPECT_TRUE(multi.one_row_stale());
  DraftWindow sure(0, 16);
  for (int i = 0; i < 100; ++i) sure.Observe(8, 8);
  EXPECT_GE(sure.Choose(multi, 1e6, 1000), 8);
  EXPECT_EQ(sure.Choose(multi, 0, 1000), 0);
  int probes = 0;
  for (int i = 0; i < 64; ++i) probes += sure.Choose(multi, 0, 1000) == 0;
  EXPECT_EQ(probes, 3);
  multi.ObserveVerify(1, 4e-3);
  EXPECT_FALSE(multi.one_row_stale());
  for (int i = 0; i < 32; ++i) EXPECT_GE(sure.Choose(multi, 0, 1000), 8);
  // Never past the tokens still to generate, and a fixed window stays fixed.
  EXPECT_LE(good.Choose(flat, 0, 3), 2);
  EXPECT_EQ(good.Choose(flat, 0, 1), 0);
  EXPECT_EQ(DraftWindow(5, 16).Choose(steep, 0, 1000), 5);
  EXPECT_EQ(DraftWindow(40, 16).Choose(steep, 0, 1000), 16);
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
