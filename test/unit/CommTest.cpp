// MPI communicator collectives over mesh groups. Runs under mpirun with 4 ranks
// on a dp=2 x tp=2 mesh (ctest entry comm-mpi-4).

#include "runtime/comm/communicator.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

using namespace ptc;

namespace {
std::unique_ptr<Communicator> gComm;

// Rank r = 2 * dp + tp.
int dp() { return gComm->coords()[0]; }
int tp() { return gComm->coords()[1]; }

TEST(MpiCommunicator, MeshCoordinatesAreRowMajor) {
  EXPECT_EQ(gComm->worldSize(), 4);
  EXPECT_EQ(gComm->rank(), 2 * dp() + tp());
}

TEST(MpiCommunicator, AllReduceSumsWithinTheGroupOnly) {
  std::vector<float> x{static_cast<float>(gComm->rank()), 1.0f};
  ASSERT_TRUE(gComm->allReduceSum(x.data(), 2, {1}, "test").isOk());
  // tp group of this rank: ranks 2*dp and 2*dp+1.
  EXPECT_EQ(x[0], static_cast<float>(4 * dp() + 1));
  EXPECT_EQ(x[1], 2.0f);
  std::vector<float> y{static_cast<float>(gComm->rank())};
  ASSERT_TRUE(gComm->allReduceSum(y.data(), 1, {0, 1}, "test").isOk());
  EXPECT_EQ(y[0], 6.0f);
}

TEST(MpiCommunicator, AllReduceMax) {
  std::vector<float> x{static_cast<float>(gComm->rank())};
  ASSERT_TRUE(gComm->allReduceMax(x.data(), 1, {0}, "test").isOk());
  EXPECT_EQ(x[0], static_cast<float>(2 + tp())); // dp group: tp and 2 + tp
}

TEST(MpiCommunicator, AllGatherInCoordinateOrder) {
  float mine = static_cast<float>(gComm->rank());
  std::vector<float> all(2);
  ASSERT_TRUE(gComm->allGather(&mine, all.data(), sizeof(float), 0, "test").isOk());
  EXPECT_EQ(all, (std::vector<float>{static_cast<float>(tp()), static_cast<float>(2 + tp())}));
}

TEST(MpiCommunicator, ReduceScatterKeepsOwnBlock) {
  // Every tp member contributes [r, 10 r]; member c keeps block c of the sum.
  float r = static_cast<float>(gComm->rank());
  std::vector<float> in{r, 10 * r};
  float out = 0;
  ASSERT_TRUE(gComm->reduceScatterSum(in.data(), &out, 1, 1, "test").isOk());
  float sum = static_cast<float>(4 * dp() + 1);
  EXPECT_EQ(out, tp() == 0 ? sum : 10 * sum);
}

TEST(MpiCommunicator, AllToAllExchangesBlocks) {
  // Member c sends block r = 100 c + r to member r.
  std::vector<float> in{100.0f * tp(), 100.0f * tp() + 1}, out(2);
  ASSERT_TRUE(gComm->allToAll(in.data(), out.data(), sizeof(float), 1, "test").isOk());
  EXPECT_EQ(out, (std::vector<float>{static_cast<float>(tp()), 100.0f + tp()}));
}
TEST(MpiCommunicator, RingShiftPassesToTheNextMember) {
  // Along dp (2 members): each sends its rank, receives the previous member's.
  float mine = static_cast<float>(gComm->rank()), got = -1;
  ASSERT_TRUE(gComm->ringShift(&mine, &got, sizeof(float), 0, 77, "test").isOk());
  EXPECT_EQ(got, static_cast<float>(2 * (1 - dp()) + tp()));
  ASSERT_TRUE(gComm->flushSends().isOk());
}
} // namespace

int main(int argc, char **argv) {
  ::testing::InitGoogleTest(&argc, argv);
  auto comm = createMpiCommunicator(Mesh{{"dp", "tp"}, {2, 2}}, 60.0);
  if (!comm.isOk()) {
    std::fprintf(stderr, "%s\n", comm.status().message().c_str());
    finalizeMpi();
    return 1;
  }
  gComm = std::move(*comm);
  // Only rank 0 reports, the others stay quiet unless they fail.
  if (gComm->rank() != 0) {
    auto &listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int result = RUN_ALL_TESTS();
  gComm.reset();
  finalizeMpi();
  return result;
}
