#include "coordinator/data_plane_choice.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace conveyor::coordinator {
namespace {

v1::JobReady Gpu(const std::string& uuid, bool nccl = true) {
  v1::JobReady r;
  r.set_device_uuid(uuid);
  r.set_nccl(nccl);
  return r;
}

TEST(DataPlaneChoiceTest, EveryRankOnItsOwnGpuWithNcclUsesNccl) {
  const DataPlaneChoice c =
      ChooseDataPlane({Gpu("GPU-a"), Gpu("GPU-b"), Gpu("GPU-c")});
  EXPECT_EQ(c.description, "nccl");
  EXPECT_TRUE(c.nccl);
}

TEST(DataPlaneChoiceTest, FallsBackToTcpSayingWhy) {
  struct Case {
    std::vector<v1::JobReady> ready;
    std::string description;
  };
  const Case cases[] = {
      {{Gpu("GPU-a")}, "tcp (one rank: nothing travels)"},
      {{Gpu("GPU-a"), Gpu("")}, "tcp (rank 1 runs on the CPU)"},
      {{Gpu("GPU-a"), Gpu("GPU-b", false)},
       "tcp (rank 1's worker has no NCCL)"},
      {{Gpu("GPU-a"), Gpu("GPU-b"), Gpu("GPU-a")},
       "tcp (ranks 0 and 2 share GPU GPU-a)"},
  };
  for (const Case& c : cases) {
    const DataPlaneChoice choice = ChooseDataPlane(c.ready);
    EXPECT_EQ(choice.description, c.description);
    EXPECT_FALSE(choice.nccl) << c.description;
  }
}

}  // namespace
}  // namespace conveyor::coordinator
