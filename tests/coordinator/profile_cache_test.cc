#include "coordinator/profile_cache.h"

#include "gtest/gtest.h"

namespace conveyor::coordinator {
namespace {

std::vector<engine::LayerProfile> Layers(int n, double seconds = 1e-3) {
  return std::vector<engine::LayerProfile>(
      n, engine::LayerProfile{.forward_seconds = seconds});
}

TEST(ProfileCacheTest, KeysDifferByDeviceAndModel) {
  const std::string a = ProfileCache::Key("cpu", "model-a");
  EXPECT_EQ(a, ProfileCache::Key("cpu", "model-a"));
  EXPECT_NE(a, ProfileCache::Key("cuda:0", "model-a"));
  EXPECT_NE(a, ProfileCache::Key("cpu", "model-b"));
  // Fixed size however long the model's description.
  EXPECT_EQ(ProfileCache::Key("cpu", std::string(1 << 20, 'x')).size(),
            ProfileCache::Key("cpu", "y").size());
}

TEST(ProfileCacheTest, FindsWhatWasPutAndReplaces) {
  ProfileCache cache(4);
  EXPECT_EQ(cache.Find("k"), nullptr);
  cache.Put("k", Layers(3));
  ASSERT_NE(cache.Find("k"), nullptr);
  EXPECT_EQ(cache.Find("k")->size(), 3u);
  cache.Put("k", Layers(5, 2e-3));
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_EQ(cache.layers(), 5u);
  EXPECT_EQ((*cache.Find("k"))[0].forward_seconds, 2e-3);
}

TEST(ProfileCacheTest, DropsTheOldestBeyondTheCount) {
  ProfileCache cache(2);
  cache.Put("a", Layers(1));
  cache.Put("b", Layers(1));
  cache.Put("a", Layers(1));  // Now the newest.
  cache.Put("c", Layers(1));
  EXPECT_EQ(cache.Find("b"), nullptr);
  EXPECT_NE(cache.Find("a"), nullptr);
  EXPECT_NE(cache.Find("c"), nullptr);
  ProfileCache none(0);
  none.Put("a", Layers(1));
  EXPECT_EQ(none.size(), 0u);
}

TEST(ProfileCacheTest, DropsTheOldestBeyondTheLayers) {
  ProfileCache cache(100, /*max_layers=*/10);
  cache.Put("a", Layers(6));
  cache.Put("b", Layers(4));
  EXPECT_EQ(cache.layers(), 10u);
  cache.Put("c", Layers(1));
  EXPECT_EQ(cache.Find("a"), nullptr);
  EXPECT_EQ(cache.layers(), 5u);
  cache.Put("huge", Layers(11));  // Larger than the cache: not kept.
  EXPECT_EQ(cache.size(), 0u);
  EXPECT_EQ(cache.layers(), 0u);
}

}  // namespace
}  // namespace conveyor::coordinator
