#include "coordinator/data_plane_choice.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace conveyor::coordinator {
namespace {

v1::JobReady Gpu(const std::string& uuid, bool nccl = true,
                 const std::string& id = "") {
  v1::JobReady r;
  r.set_device_uuid(uuid);
  r.set_nccl(nccl);
  r.set_nccl_unique_id(id);
  return r;
}

const std::string kId(128, '\x07');

TEST(DataPlaneChoiceTest, EveryRankOnItsOwnGpuWithNcclUsesRankZerosId) {
  const DataPlaneChoice c =
      ChooseDataPlane({Gpu("GPU-a", true, kId), Gpu("GPU-b"), Gpu("GPU-c")});
  EXPECT_EQ(c.description, "nccl");
  EXPECT_EQ(c.nccl_unique_id, kId);
}

TEST(DataPlaneChoiceTest, FallsBackToTcpSayingWhy) {
  struct Case {
    std::vector<v1::JobReady> ready;
    std::string description;
  };
  const Case cases[] = {
      {{Gpu("GPU-a", true, kId)}, "tcp (one rank: nothing travels)"},
      {{Gpu("GPU-a", true, kId), Gpu("")}, "tcp (rank 1 runs on the CPU)"},
      {{Gpu("GPU-a", true, kId), Gpu("GPU-b", false)},
       "tcp (rank 1's worker has no NCCL)"},
      {{Gpu("GPU-a", true, kId), Gpu("GPU-b"), Gpu("GPU-a")},
       "tcp (ranks 0 and 2 share GPU GPU-a)"},
      {{Gpu("GPU-a", true, ""), Gpu("GPU-b")},
       "tcp (rank 0 reported an NCCL id of 0 bytes, not 128)"},
  };
  for (const Case& c : cases) {
    const DataPlaneChoice choice = ChooseDataPlane(c.ready);
    EXPECT_EQ(choice.description, c.description);
    EXPECT_TRUE(choice.nccl_unique_id.empty()) << c.description;
  }
}

}  // namespace
}  // namespace conveyor::coordinator
