#include "worker/device_backends.h"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/model_spec.h"
#include "engine/stage.h"
#include "engine/tensor_parallel_stage.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/counter.h"
#include "prometheus/registry.h"
#include "telemetry/metrics_server.h"
#include "tests/testing/http_get.h"

namespace conveyor::worker {
namespace {

using engine::Precision;
using engine::Tensor;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

// The test binary is not next to the plugin (build/bin/), so it names the
// one this build made, unless the environment already chose one.
#ifdef CONVEYOR_TEST_CUDA_PLUGIN
[[maybe_unused]] const bool kPluginPathSet =
    setenv("CONVEYOR_CUDA_PLUGIN", CONVEYOR_TEST_CUDA_PLUGIN, 0) == 0;
#endif

// Sets an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_.has_value()) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

std::string ProcessMaps() {
  std::ifstream maps("/proc/self/maps");
  return std::string(std::istreambuf_iterator<char>(maps), {});
}

Tensor On(engine::Backend* backend, const std::vector<float>& v) {
  Tensor t =
      *backend->Empty({static_cast<int64_t>(v.size())}, engine::DType::kF32);
  EXPECT_TRUE(backend->CopyFromHost(v.data(), v.size() * 4, t).ok());
  return t;
}

std::vector<float> Read(const Tensor& t) {
  std::vector<float> v(t.numel());
  EXPECT_TRUE(t.backend()->CopyToHost(t, v.data(), v.size() * 4).ok());
  return v;
}

TEST(DeviceBackendsTest, CpuWorkersComputeOnTheCpuBackendOfTheJobsPrecision) {
  absl::StatusOr<std::unique_ptr<DeviceBackends>> b =
      DeviceBackends::Create({"cpu:4"});
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->size(), 1);
  EXPECT_EQ((*b)->cuda_device(), -1);
  EXPECT_EQ((*b)->device_name(0), "cpu");
  EXPECT_EQ(*(*b)->device_uuid(0), "");
  EXPECT_FALSE((*b)->nccl_available());
  EXPECT_EQ(*(*b)->Get(Precision::kFp32), engine::CpuBackend::Get());
  EXPECT_EQ(*(*b)->Get(Precision::kBf16),
            engine::CpuBackend::Get(Precision::kBf16));
  EXPECT_EQ((*b)->Get(1, Precision::kFp32).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*b)->CreateNcclUniqueId().status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*b)->CreateNcclChannel(NcclJoin{}).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(DeviceBackendsTest, SeveralCpuEntriesMakeACpuMeshOnTheOneCpuBackend) {
  for (const std::vector<std::string>& devices :
       std::vector<std::vector<std::string>>{{"cpu:1", "cpu:1"},
                                             {"cpu:2", "2"}}) {
    absl::StatusOr<std::unique_ptr<DeviceBackends>> b =
        DeviceBackends::Create(devices);
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ((*b)->size(), 2);
    EXPECT_EQ((*b)->device_name(1), "cpu");
    EXPECT_EQ(*(*b)->Get(1, Precision::kFp32), engine::CpuBackend::Get());
    EXPECT_EQ((*b)->Get(2, Precision::kFp32).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
}

TEST(DeviceBackendsTest, CpuMeshCollectiveSumsOverItsDevices) {
  std::unique_ptr<DeviceBackends> b =
      *DeviceBackends::Create({"cpu:1", "cpu:1", "cpu:1"});
  for (int bad : {0, 4}) {
    EXPECT_EQ(b->CreateMeshCollective(bad, Precision::kFp32).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
  absl::StatusOr<std::unique_ptr<engine::MeshCollective>> mesh =
      b->CreateMeshCollective(2, Precision::kFp32);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  EXPECT_EQ((*mesh)->size(), 2);
  engine::Backend* cpu = engine::CpuBackend::Get();
  std::vector<std::vector<Tensor>> grads = {{On(cpu, {1, 2}), On(cpu, {3, 4})}};
  ASSERT_TRUE((*mesh)->ReduceSumToFirst(grads).ok());
  EXPECT_THAT(Read(grads[0][0]), ElementsAre(4, 6));
  ASSERT_TRUE((*mesh)->BroadcastFromFirst(grads).ok());
  EXPECT_THAT(Read(grads[0][1]), ElementsAre(4, 6));
}

TEST(DeviceBackendsTest, BadDevicesNameTheEntryAndTheAllowedForms) {
  for (const char* bad :
       {"gpu:0", "cpu:0", "cpu:", "cuda:-1", "cuda:x", "", "1", "cuda:0,1"}) {
    absl::Status s = DeviceBackends::Create({bad}).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("'", bad, "'"))) << bad;
    EXPECT_THAT(s.message(), HasSubstr("allowed: cpu:N (N >= 1")) << bad;
  }
  EXPECT_THAT(DeviceBackends::Create({}).status().message(),
              HasSubstr("empty"));
  // A bare number after an entry is that entry's kind, with its rules.
  EXPECT_EQ(DeviceBackends::Create({"cpu:1", "0"}).status().code(),
            absl::StatusCode::kInvalidArgument);

  for (const std::vector<std::string>& mixed :
       std::vector<std::vector<std::string>>{{"cpu:1", "cuda:0"},
                                             {"cuda:0", "cpu:1"}}) {
    absl::Status s = DeviceBackends::Create(mixed).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr("mixes"));
  }
  // A GPU listed twice is two mesh devices on it (tensor-parallel ranks on
  // one GPU): accepted as a list, whatever this build's CUDA support says.
  for (const std::vector<std::string>& repeated :
       std::vector<std::vector<std::string>>{{"cuda:0", "cuda:0"},
                                             {"cuda:1", "0", "1"}}) {
    absl::Status s = DeviceBackends::Create(repeated).status();
    EXPECT_NE(s.code(), absl::StatusCode::kInvalidArgument) << s;
  }
}

TEST(DeviceBackendsTest, CudaListsMakeACudaMesh) {
  absl::StatusOr<std::unique_ptr<DeviceBackends>> b =
      DeviceBackends::Create({"cuda:2", "0", "cuda:5"});
  if (!HaveCudaBackend()) {
    EXPECT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(b.status().message(), HasSubstr("without the CUDA plugin"));
    return;
  }
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->size(), 3);
  EXPECT_EQ((*b)->cuda_device(), 2);
  EXPECT_EQ((*b)->device_name(0), "cuda:2");
  EXPECT_EQ((*b)->device_name(1), "cuda:0");
  EXPECT_EQ((*b)->device_name(2), "cuda:5");
}

TEST(DeviceBackendsTest, CudaDevicesLoadThePluginAndReportTheDeviceError) {
  absl::StatusOr<std::unique_ptr<DeviceBackends>> b =
      DeviceBackends::Create({"cuda:0"});
  if (!HaveCudaBackend()) {
    EXPECT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(b.status().message(), HasSubstr("without the CUDA plugin"));
    return;
  }
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->cuda_device(), 0);
  EXPECT_EQ((*b)->device_name(0), "cuda:0");
  // The plugin, and cuBLAS with it, is in the process now.
  EXPECT_THAT(ProcessMaps(), HasSubstr("libconveyor_cuda.so"));
  EXPECT_THAT(ProcessMaps(), HasSubstr("libcublasLt"));
  absl::StatusOr<engine::Backend*> fp32 = (*b)->Get(Precision::kFp32);
  if (!fp32.ok() &&
      absl::StrContains(fp32.status().message(), "no CUDA device")) {
    // No GPU here: CudaBackend::Create's error, from inside the plugin (it
    // asked the CUDA runtime), which the worker reports at start.
    EXPECT_EQ(fp32.status().code(), absl::StatusCode::kFailedPrecondition)
        << fp32.status();
    EXPECT_THAT(fp32.status().message(), HasSubstr("cuda:0: no CUDA device"));
    EXPECT_THAT(fp32.status().message(), Not(HasSubstr("cuda:0: cuda:0")));
    EXPECT_FALSE((*b)->device_uuid(0).ok());
    EXPECT_EQ((*b)->CreateMeshCollective(1, Precision::kFp32).status(),
              fp32.status());
    return;
  }
  ASSERT_TRUE(fp32.ok()) << fp32.status();
  EXPECT_EQ((*fp32)->Name().substr(0, 4), "cuda");
  // One backend per precision, kept.
  EXPECT_EQ(*(*b)->Get(Precision::kFp32), *fp32);
  absl::StatusOr<engine::Backend*> bf16 = (*b)->Get(Precision::kBf16);
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_NE(*bf16, *fp32);
  absl::StatusOr<std::string> uuid = (*b)->device_uuid(0);
  ASSERT_TRUE(uuid.ok()) << uuid.status();
  EXPECT_THAT(*uuid, ::testing::MatchesRegex(
                         "GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-"
                         "[0-9a-f]{12}"));
  // A backend made by the plugin computes for the worker's code.
  Tensor x = On(*fp32, {1, 2, 3});
  (*fp32)->Scale(x, 2);
  EXPECT_THAT(Read(x), ElementsAre(2, 4, 6));
}

TEST(DeviceBackendsTest, NcclUniqueIdsComeFromThePluginWithoutAGpu) {
  if (!HaveCudaBackend()) GTEST_SKIP() << "no CUDA plugin in this build";
  std::unique_ptr<DeviceBackends> b = *DeviceBackends::Create({"cuda:0"});
  if (!b->nccl_available()) GTEST_SKIP() << "plugin built without NCCL";
  absl::StatusOr<std::string> id = b->CreateNcclUniqueId();
  // NCCL needs only a network interface for its bootstrap socket.
  if (id.ok()) {
    EXPECT_EQ(id->size(), 128u);
  } else {
    EXPECT_EQ(id.status().code(), absl::StatusCode::kUnavailable)
        << id.status();
  }
}

// cpu:N is the worker's thread count (SetCpuThreads(cpu_threads())): a
// mesh's devices add up, `cpu` is every core the process may use, and the
// listing spells both out.
TEST(DeviceBackendsTest, CpuDevicesCountThreadsAndSpellThemOut) {
  auto mesh = DeviceBackends::Create({"cpu:2", "3"});
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  EXPECT_EQ((*mesh)->cpu_threads(), 5);
  EXPECT_THAT((*mesh)->spelled_out(), ElementsAre("cpu:2", "cpu:3"));

  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  auto all = DeviceBackends::Create({"cpu"});
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ((*all)->cpu_threads(), CPU_COUNT(&set));
  EXPECT_THAT((*all)->spelled_out(),
              ElementsAre(absl::StrCat("cpu:", CPU_COUNT(&set))));

  // A typo must not start a million threads.
  const absl::Status huge = DeviceBackends::Create({"cpu:100000"}).status();
  EXPECT_EQ(huge.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(huge.message(), HasSubstr("asks for 100000 cores; at most 1024"));
  EXPECT_TRUE(DeviceBackends::Create({"cpu:1024"}).ok());
}

TEST(DeviceBackendsTest, AMissingPluginIsAFailedPreconditionNamingTheFile) {
  if (!HaveCudaBackend()) GTEST_SKIP() << "no CUDA plugin in this build";
  const std::string path = "/nonexistent/libconveyor_cuda.so";
  ScopedEnv env("CONVEYOR_CUDA_PLUGIN", path);
  absl::Status s = DeviceBackends::Create({"cuda:0"}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr(path));
  EXPECT_THAT(s.message(), HasSubstr("No such file"));  // dlerror().
  // CPU workers never look for it.
  EXPECT_TRUE(DeviceBackends::Create({"cpu:1"}).ok());
}

TEST(DeviceBackendsTest, APluginWithoutTheEntryPointIsRefused) {
  if (!HaveCudaBackend()) GTEST_SKIP() << "no CUDA plugin in this build";
  // Any shared library will do: libc has no ConveyorCudaPlugin.
  ScopedEnv env("CONVEYOR_CUDA_PLUGIN", "libc.so.6");
  absl::Status s = DeviceBackends::Create({"cuda:0"}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("no entry point ConveyorCudaPlugin"));
}

// The regression the plugin exists for: linked into the process, cuBLAS's
// static TLS took civetweb's small thread stacks and the metrics server
// could not start ("null context when constructing CivetServer"). Loaded
// with dlopen, it must not matter.
TEST(DeviceBackendsTest, MetricsServerStartsAndServesAfterThePluginLoaded) {
  if (!HaveCudaBackend()) GTEST_SKIP() << "no CUDA plugin in this build";
  std::unique_ptr<DeviceBackends> b = *DeviceBackends::Create({"cuda:0"});
  (void)b->Get(Precision::kFp32);  // Initializes CUDA where there is a GPU.
  ASSERT_THAT(ProcessMaps(), HasSubstr("libcublasLt"));

  auto registry = std::make_shared<prometheus::Registry>();
  prometheus::BuildCounter()
      .Name("conveyor_test_plugin_total")
      .Help("Things")
      .Register(*registry)
      .Add({})
      .Increment(7);
  absl::StatusOr<std::unique_ptr<telemetry::MetricsServer>> server =
      telemetry::MetricsServer::Start("127.0.0.1:0", {registry});
  ASSERT_TRUE(server.ok()) << server.status();
  absl::StatusOr<std::string> body =
      conveyor::testing::HttpGet((*server)->address(), "/metrics");
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_THAT(*body, HasSubstr("conveyor_test_plugin_total 7"));
}

// Two GPUs through the plugin's NCCL collective; skipped with fewer.
TEST(DeviceBackendsTest, CudaMeshCollectiveSumsAndBroadcasts) {
  if (!HaveCudaBackend()) GTEST_SKIP() << "no CUDA plugin in this build";
  std::unique_ptr<DeviceBackends> b =
      *DeviceBackends::Create({"cuda:0", "cuda:1"});
  std::vector<engine::Backend*> gpus;
  for (int d = 0; d < 2; ++d) {
    absl::StatusOr<engine::Backend*> backend = b->Get(d, Precision::kFp32);
    if (!backend.ok()) GTEST_SKIP() << "needs 2 GPUs: " << backend.status();
    gpus.push_back(*backend);
  }
  absl::StatusOr<std::unique_ptr<engine::MeshCollective>> mesh =
      b->CreateMeshCollective(2, Precision::kFp32);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  std::vector<std::vector<Tensor>> grads = {
      {On(gpus[0], {1, 2, 3}), On(gpus[1], {10, 20, 30})},
      {On(gpus[0], {0.5f}), On(gpus[1], {0.25f})}};
  ASSERT_TRUE((*mesh)->ReduceSumToFirst(grads).ok());
  EXPECT_THAT(Read(grads[0][0]), ElementsAre(11, 22, 33));
  EXPECT_THAT(Read(grads[0][1]), ElementsAre(10, 20, 30));
  EXPECT_THAT(Read(grads[1][0]), ElementsAre(0.75f));
  ASSERT_TRUE((*mesh)->BroadcastFromFirst(grads).ok());
  EXPECT_THAT(Read(grads[0][1]), ElementsAre(11, 22, 33));
  EXPECT_THAT(Read(grads[1][1]), ElementsAre(0.75f));
  Tensor row = On(gpus[1], {0, 0, 0});
  ASSERT_TRUE((*mesh)->Copy(grads[0][0], row).ok());
  EXPECT_THAT(Read(row), ElementsAre(11, 22, 33));
  mesh->reset();  // Before the backends, which `b` owns.
}

// Two mesh devices on one GPU: separate backends (each its own stream), a
// host-staged collective (NCCL takes one rank a device), and tensor-parallel
// ranks that compute what one CPU stage does.
TEST(DeviceBackendsTest, AGpuListedTwiceRunsTensorParallelRanks) {
  if (!HaveCudaBackend()) GTEST_SKIP() << "no CUDA plugin in this build";
  std::unique_ptr<DeviceBackends> b =
      *DeviceBackends::Create({"cuda:0", "cuda:0"});
  std::vector<engine::Backend*> gpus;
  for (int d = 0; d < 2; ++d) {
    absl::StatusOr<engine::Backend*> backend = b->Get(d, Precision::kFp32);
    if (!backend.ok()) GTEST_SKIP() << "needs a GPU: " << backend.status();
    gpus.push_back(*backend);
  }
  EXPECT_NE(gpus[0], gpus[1]);
  absl::StatusOr<std::unique_ptr<engine::MeshCollective>> mesh =
      b->CreateMeshCollective(2, Precision::kFp32);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  std::vector<std::vector<Tensor>> grads = {
      {On(gpus[0], {1, 2, 3}), On(gpus[1], {10, 20, 30})}};
  ASSERT_TRUE((*mesh)->ReduceSumToFirst(grads).ok());
  EXPECT_THAT(Read(grads[0][0]), ElementsAre(11, 22, 33));

  absl::StatusOr<engine::ModelSpec> spec = engine::ParseModelSpecYaml(
      "model:\n  input_shape: [8, 32]\n  init: {seed: 3}\n  loss: mse\n"
      "  layers:\n"
      "    - llama_block: {heads: 4, kv_heads: 2, mlp_features: 64}\n",
      "tp.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto tp = engine::TensorParallelStage::Create(mesh->get(), *spec, 0, 2);
  ASSERT_TRUE(tp.ok()) << tp.status();
  auto cpu = *engine::Stage::Create(engine::CpuBackend::Get(), *spec, 0);
  ASSERT_TRUE((*tp)->InitializeFromSeed(3).ok());
  ASSERT_TRUE(cpu->InitializeFromSeed(3).ok());
  std::vector<float> x(2 * 8 * 32);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * i);
  Tensor host =
      *engine::CpuBackend::Get()->Empty({2, 8, 32}, engine::DType::kF32);
  ASSERT_TRUE(engine::CpuBackend::Get()
                  ->CopyFromHost(x.data(), x.size() * 4, host)
                  .ok());
  absl::StatusOr<Tensor> y_gpu = (*tp)->Forward(0, host);
  ASSERT_TRUE(y_gpu.ok()) << y_gpu.status();
  absl::StatusOr<Tensor> y_cpu = cpu->Forward(0, host);
  ASSERT_TRUE(y_cpu.ok()) << y_cpu.status();
  // fp32 on both (no TF32): the GPU's kernels and the split reorder sums
  // over at most 64 terms of the output's size, ~1e-5 of it at most.
  const std::vector<float> got = Read(*y_gpu), want = Read(*y_cpu);
  float scale = 0;
  for (float v : want) scale = std::max(scale, std::abs(v));
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 1e-4 * scale) << i;
  }
  tp->reset();
  mesh->reset();  // Before the backends, which `b` owns.
}

}  // namespace
}  // namespace conveyor::worker
