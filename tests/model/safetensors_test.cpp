// WeightStore: memory-mapped safetensors, single file and shards, and every rejection.
#include "kvattn/model/safetensors.h"

#include <gtest/gtest.h>

#include "kvattn/core/error.h"
#include "model_test_util.h"
#include "support/error_message.h"

namespace kvattn::model {
namespace {

using kvattn::test::error_message;
using test::safetensors_bytes;
using test::StTensor;
using test::TempDir;
using test::write_file;

TEST(Safetensors, LoadsAllDtypesAsViewsOfTheMapping) {
  TempDir d;
  const std::vector<float> vals = {1.0f, -2.0f, 0.5f, 3.0f, -0.25f, 8.0f};
  write_file(d.path / "model.safetensors",
             safetensors_bytes({{"a.f32", "F32", {2, 3}, test::encode_values(vals, "F32")},
                                {"b.bf16", "BF16", {3, 2}, test::encode_values(vals, "BF16")},
                                {"c.f16", "F16", {6}, test::encode_values(vals, "F16")}},
                               R"({"format":"pt"})"));
  WeightStore ws = WeightStore::open(d.path);
  EXPECT_EQ(ws.size(), 3u);
  EXPECT_EQ(ws.names(), (std::vector<std::string>{"a.f32", "b.bf16", "c.f16"}));
  EXPECT_EQ(ws.total_bytes(), 6 * 4 + 6 * 2 + 6 * 2);
  const Tensor& a = ws.get("a.f32");
  EXPECT_EQ(a.dtype(), DType::f32);
  EXPECT_EQ(a.shape(), (Dims{2, 3}));
  EXPECT_EQ(a.get({1, 2}), 8.0);
  EXPECT_EQ(a.get({0, 1}), -2.0);
  const Tensor& b = ws.get("b.bf16");
  EXPECT_EQ(b.dtype(), DType::bf16);
  EXPECT_EQ(b.get({2, 0}), -0.25);
  const Tensor& c = ws.get("c.f16");
  EXPECT_EQ(c.dtype(), DType::f16);
  EXPECT_EQ(c.to_double_vector(), (std::vector<double>{1, -2, 0.5, 3, -0.25, 8}));
  // No copy: every tensor lies inside the one mapping of the file.
  const char* base = static_cast<const char*>(a.storage()->data());
  EXPECT_EQ(a.storage(), b.storage());
  EXPECT_EQ(a.storage()->size(), std::filesystem::file_size(d.path / "model.safetensors"));
  EXPECT_GE(static_cast<const char*>(c.data()), base);
  EXPECT_LE(static_cast<const char*>(c.data()) + c.nbytes(), base + a.storage()->size());
  // expect(): the architecture hook.
  EXPECT_EQ(&ws.expect("a.f32", {2, 3}), &a);
  EXPECT_EQ(&ws.expect("b.bf16", {3, 2}, DType::bf16), &b);
  EXPECT_EQ(ws.unclaimed(), std::vector<std::string>{});
}

TEST(Safetensors, ExpectAndGetNameTheTensor) {
  TempDir d;
  write_file(d.path / "model.safetensors",
             safetensors_bytes({{"model.norm.weight", "F32", {4}, std::string(16, '\0')},
                                {"model.embed_tokens.weight", "F32", {2, 2}, std::string(16, '\0')}}));
  WeightStore ws = WeightStore::open(d.path);
  std::string e = error_message([&] { ws.expect("model.norm.weight", {8}); });
  EXPECT_NE(e.find("model.norm.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("[4]"), std::string::npos) << e;
  EXPECT_NE(e.find("[8]"), std::string::npos) << e;
  e = error_message([&] { ws.expect("model.norm.weight", {4}, DType::bf16); });
  EXPECT_NE(e.find("bfloat16"), std::string::npos) << e;
  e = error_message([&] { ws.get("model.norm.weigth"); });
  EXPECT_NE(e.find("InvalidArgument"), std::string::npos) << e;
  EXPECT_NE(e.find("'model.norm.weigth'"), std::string::npos) << e;
  EXPECT_NE(e.find("closest: model.norm.weight"), std::string::npos) << e;
  EXPECT_EQ(ws.unclaimed(), std::vector<std::string>{"model.embed_tokens.weight"});
}

TEST(Safetensors, ShardsThroughTheIndex) {
  TempDir d;
  write_file(d.path / "model-00001-of-00002.safetensors",
             safetensors_bytes({{"x", "F32", {2}, test::encode_values({1, 2}, "F32")}}));
  write_file(d.path / "model-00002-of-00002.safetensors",
             safetensors_bytes({{"y", "BF16", {1}, test::encode_values({4}, "BF16")},
                                {"z", "F16", {1}, test::encode_values({-1}, "F16")}}));
  const std::string index = R"({"metadata":{"total_size":8},"weight_map":{"x":"model-00001-of-00002.safetensors",)"
                            R"("y":"model-00002-of-00002.safetensors","z":"model-00002-of-00002.safetensors"}})";
  write_file(d.path / "model.safetensors.index.json", index);
  WeightStore ws = WeightStore::open(d.path);
  EXPECT_EQ(ws.names(), (std::vector<std::string>{"x", "y", "z"}));
  EXPECT_EQ(ws.get("x").get({1}), 2.0);
  EXPECT_EQ(ws.get("y").get({0}), 4.0);
  EXPECT_EQ(ws.get("z").get({0}), -1.0);
  EXPECT_EQ(ws.file_of("y").filename(), "model-00002-of-00002.safetensors");
  EXPECT_NE(ws.get("x").storage(), ws.get("y").storage());

  // A missing shard names the shard and a tensor in it.
  std::filesystem::remove(d.path / "model-00002-of-00002.safetensors");
  std::string e = error_message([&] { WeightStore::open(d.path); });
  EXPECT_NE(e.find("shard 'model-00002-of-00002.safetensors'"), std::string::npos) << e;
  EXPECT_NE(e.find("missing"), std::string::npos) << e;

  // A tensor listed for a shard that does not hold it.
  write_file(d.path / "model-00002-of-00002.safetensors",
             safetensors_bytes({{"y", "BF16", {1}, test::encode_values({4}, "BF16")}}));
  e = error_message([&] { WeightStore::open(d.path); });
  EXPECT_NE(e.find("tensor 'z'"), std::string::npos) << e;
  // A shard tensor the index does not list.
  write_file(d.path / "model-00002-of-00002.safetensors",
             safetensors_bytes({{"y", "BF16", {1}, test::encode_values({4}, "BF16")},
                                {"z", "F16", {1}, test::encode_values({-1}, "F16")},
                                {"w", "F16", {1}, test::encode_values({-1}, "F16")}}));
  e = error_message([&] { WeightStore::open(d.path); });
  EXPECT_NE(e.find("tensor 'w'"), std::string::npos) << e;
  EXPECT_NE(e.find("not listed"), std::string::npos) << e;
  // A shard path leaving the directory.
  write_file(d.path / "model.safetensors.index.json", R"({"weight_map":{"x":"../evil.safetensors"}})");
  e = error_message([&] { WeightStore::open(d.path); });
  EXPECT_NE(e.find("not a file name inside the model directory"), std::string::npos) << e;
}

TEST(Safetensors, NoCheckpointIsAClearError) {
  TempDir d;
  const std::string e = error_message([&] { WeightStore::open(d.path); });
  EXPECT_NE(e.find("neither model.safetensors nor model.safetensors.index.json"), std::string::npos) << e;
}

TEST(Safetensors, TruncatedFile) {
  TempDir d;
  const std::string full = safetensors_bytes({{"w", "F32", {4, 4}, std::string(64, '\1')}});
  for (size_t keep : {size_t{0}, size_t{5}, size_t{20}, full.size() - 1}) {
    write_file(d.path / "model.safetensors", full.substr(0, keep));
    const std::string e = error_message([&] { WeightStore::open(d.path); });
    EXPECT_NE(e.find("InvalidArgument"), std::string::npos) << keep << ": " << e;
    EXPECT_NE(e.find("model.safetensors"), std::string::npos) << keep << ": " << e;
    EXPECT_TRUE(e.find("truncated") != std::string::npos || e.find("corrupt") != std::string::npos)
        << keep << ": " << e;
  }
}

TEST(Safetensors, HeaderRejections) {
  struct Case {
    std::string header;
    int64_t data_size;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {R"({"w":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", 8, "dtype 'I64' cannot be loaded"},
      {R"({"w":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[0,1]}})", 1, "valid safetensors dtypes are BF16, F16, F32"},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 4, "needs 8 bytes"},
      {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,8]}})", 4, "outside the data section"},
      {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", 4, "outside the data section"},
      {R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4, "non-negative integers"},
      {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 4, "data_offsets must be [begin, end]"},
      {R"({"w":{"dtype":"F32","shape":[1]}})", 4, "needs the fields dtype, shape and data_offsets"},
      {R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,4],"data_offsets":[0,4]}})", 4, "overflows"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 8, "without holes or overlaps"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 8, "cover 4 bytes but the data section has 8"},
      {R"([1,2])", 0, "must be a JSON object"},
      {R"({"a":)", 0, "not valid JSON"},
      {R"({"__metadata__":{"k":1}})", 0, "__metadata__ value 'k' must be a string"},
      {R"({"w":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,4]}})", 4, "at most 8"},
  };
  for (const auto& c : cases) {
    const std::string e = error_message([&] { parse_safetensors_header(c.header, c.data_size, "f.safetensors"); });
    EXPECT_NE(e.find(c.expect), std::string::npos) << c.header << "\n -> " << e;
    EXPECT_NE(e.find("f.safetensors"), std::string::npos) << e;
  }
  // A valid header parses, including an empty tensor.
  const auto entries = parse_safetensors_header(
      R"({"e":{"dtype":"F16","shape":[0,3],"data_offsets":[0,0]},"w":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}})",
      4, "ok");
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[0].shape, (Dims{0, 3}));
  EXPECT_EQ(entries[1].end, 4);
}

TEST(Safetensors, DuplicateTensorAcrossFiles) {
  TempDir d;
  write_file(d.path / "a.safetensors", safetensors_bytes({{"w", "F32", {1}, std::string(4, '\0')}}));
  write_file(d.path / "b.safetensors", safetensors_bytes({{"w", "F32", {1}, std::string(4, '\0')}}));
  const std::string e = error_message([&] { WeightStore::open_files({d.path / "a.safetensors", d.path / "b.safetensors"}); });
  EXPECT_NE(e.find("tensor 'w' appears in both"), std::string::npos) << e;
}

}  // namespace
}  // namespace kvattn::model
