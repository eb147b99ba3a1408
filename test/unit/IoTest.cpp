// safetensors and token data: round trips, the batch order, and errors that
// name the file and tensor.

#include "runtime/base/subprocess.h"
#include "runtime/io/dist_checkpoint.h"
#include "runtime/io/safetensors.h"
#include "runtime/io/scalar_log.h"
#include "runtime/io/token_data.h"

#include <gtest/gtest.h>

#include <algorithm>

#include <cstdio>
#include <filesystem>
#include <fstream>

using namespace ptc;

namespace {
std::string tempPath(const std::string &name) {
  return ::testing::TempDir() + "/ptc-io-" + name;
}

TEST(Safetensors, RoundTripAndErrors) {
  std::string path = tempPath("w.safetensors");
  std::vector<float> a{1, 2, 3, 4, 5, 6}, b{7};
  ASSERT_TRUE(writeSafetensors(path, {{"a", {2, 3}, a.data()}, {"b", {1}, b.data()}}).isOk());
  auto file = SafetensorsFile::read(path);
  ASSERT_TRUE(file.isOk()) << file.status().message();
  std::vector<float> out(6);
  ASSERT_TRUE(file->copyTo("a", {2, 3}, out.data()).isOk());
  EXPECT_EQ(out, a);
  Status missing = file->copyTo("c", {1}, out.data());
  EXPECT_EQ(missing.message(), "safetensors file '" + path + "' has no tensor 'c'");
  Status shape = file->copyTo("a", {3, 2}, out.data());
  EXPECT_EQ(shape.message(), "safetensors file '" + path +
                                 "': tensor 'a' has shape [2, 3], the model expects [3, 2]");
}

TEST(Safetensors, RejectsTruncatedFile) {
  std::string path = tempPath("t.safetensors");
  std::vector<float> a(100, 1.0f);
  ASSERT_TRUE(writeSafetensors(path, {{"a", {100}, a.data()}}).isOk());
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), 200);
  auto file = SafetensorsFile::read(path);
  ASSERT_FALSE(file.isOk());
  EXPECT_NE(file.status().message().find("lies outside the"), std::string::npos)
      << file.status().message();
}

std::vector<uint8_t> safetensorsBytes(const std::string &header) {
  std::vector<uint8_t> bytes(8);
  for (int i = 0; i < 8; ++i)
    bytes[static_cast<size_t>(i)] = static_cast<uint8_t>(header.size() >> (8 * i));
  bytes.insert(bytes.end(), header.begin(), header.end());
  bytes.resize(bytes.size() + 16, 0);
  return bytes;
}

TEST(Safetensors, RejectsShapesThatOverflowAndUnprintableNames) {
  // 2^32 x 2^32 x 2 elements wraps to 0 in int64 products.
  auto huge = SafetensorsFile::parse(
      safetensorsBytes(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,2],"data_offsets":[0,16]}})"),
      "huge.safetensors");
  ASSERT_FALSE(huge.isOk());
  EXPECT_NE(huge.status().message().find("entry 'w' has a shape [4294967296, 4294967296, 2] of "
                                         "more than 281474976710656 elements"),
            std::string::npos)
      << huge.status().message();
  auto control = SafetensorsFile::parse(
      safetensorsBytes("{\"w\\u0007\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}"),
      "bell.safetensors");
  ASSERT_FALSE(control.isOk());
  EXPECT_NE(control.status().message().find("a tensor name, 'w\\x07', is not printable UTF-8"),
            std::string::npos)
      << control.status().message();
  EXPECT_EQ(elementCount({int64_t(1) << 32, int64_t(1) << 32}), -1);
  EXPECT_EQ(elementCount({3, 4}), 12);
}

TEST(DistributedCheckpoint, RejectsNonIntegerNumbersInMetadata) {
  // Found by ptc-fuzz-checkpoint: a float where an integer belongs (3e23 does
  // not fit an int64) must be a "corrupt" error, not undefined behaviour.
  const char *cases[][2] = {
      {"\"step\":355555555555555555555555", "'step' holds"},
      {"\"step\":1.5", "'step' holds"},
      {"\"step\":1", "'shape' holds"},
  };
  for (auto &c : cases) {
    std::string dir = tempPath("ckpt-meta");
    std::filesystem::create_directories(dir);
    std::string shape = std::string(c[1]).find("shape") != std::string::npos ? "[5,4.5]" : "[5,4]";
    std::ofstream(dir + "/metadata.json", std::ios::trunc)
        << "{\"format\":\"ptc-distributed-checkpoint\",\"version\":1," << c[0]
        << ",\"info\":{},\"tensors\":{\"w\":{\"kind\":\"parameter\",\"dtype\":\"F32\",\"shape\":"
        << shape << "}},\"boxes\":[],\"files\":{}}";
    auto reader = CheckpointReader::open(dir);
    ASSERT_FALSE(reader.isOk()) << c[0];
    EXPECT_NE(reader.status().message().find("is corrupt"), std::string::npos)
        << reader.status().message();
    EXPECT_NE(reader.status().message().find(c[1]), std::string::npos)
        << reader.status().message();
  }
}

TEST(DistributedCheckpoint, RejectsAFormatThatIsNotAString) {
  // Found by ptc-fuzz-checkpoint: a numeric "format" threw out of the reader.
  std::string dir = tempPath("ckpt-format");
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/metadata.json", std::ios::trunc)
      << "{\"format\":5555555555555555555,\"version\":1,\"step\":1}";
  auto reader = CheckpointReader::open(dir);
  ASSERT_FALSE(reader.isOk());
  EXPECT_NE(reader.status().message().find("not a ptc distributed checkpoint"), std::string::npos)
      << reader.status().message();
}

TEST(TokenData, BatchOrderFollowsTheStandardModel) {
  std::string path = tempPath("d.bin");
  std::vector<uint16_t> tokens(100);
  for (int i = 0; i < 100; ++i)
    tokens[i] = static_cast<uint16_t>(i);
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<char *>(tokens.data()), 200);
  auto data = TokenData::load(path, /*seq=*/8, /*vocab=*/256);
  ASSERT_TRUE(data.isOk()) << data.status().message();
  std::vector<int32_t> x(2 * 8), y(2 * 8);
  // step 6, batch 2: window j starts at ((6*2 + j) * 8) mod (100 - 8 - 1) = 96 mod 91, 104 mod 91.
  ASSERT_TRUE(data->fillBatch(6, 2, 8, 0, 2, x.data(), y.data()).isOk());
  EXPECT_EQ(x[0], 5);
  EXPECT_EQ(y[0], 6);
  EXPECT_EQ(x[8], 13);
  EXPECT_EQ(y[15], 21);
}

// Blends follow Megatron's build_blending_indices: sample i from the dataset
// with the largest w_d * max(i, 1) - n_d (the first on a tie), and that
// dataset's n_d-th window. Weights 3:1: A B A A A B A A. Going back (a resumed
// or re-read step) gives the same samples as going forward.
TEST(TokenData, BlendFollowsMegatron) {
  std::string a = tempPath("blend-a.bin"), b = tempPath("blend-b.bin");
  std::vector<uint16_t> tokens(200, 1);
  std::ofstream(a, std::ios::binary).write(reinterpret_cast<char *>(tokens.data()), 400);
  std::ofstream(b, std::ios::binary).write(reinterpret_cast<char *>(tokens.data()), 400);
  auto data = TokenData::loadBlend({{3.0, {a}}, {1.0, {b}}}, /*seq=*/8, /*vocab=*/256);
  ASSERT_TRUE(data.isOk()) << data.status().message();
  std::vector<std::pair<size_t, int64_t>> expected = {{0, 0}, {1, 0}, {0, 1}, {0, 2},
                                                      {0, 3}, {1, 1}, {0, 4}, {0, 5}};
  for (int64_t g = 0; g < 8; ++g)
    EXPECT_EQ(data->blendSample(g), expected[static_cast<size_t>(g)]) << "sample " << g;
  // Far ahead, the shares hold, and coming back reproduces the start.
  auto far = data->blendSample(400000);
  EXPECT_NEAR(static_cast<double>(far.second), far.first == 0 ? 300000 : 100000, 2);
  for (int64_t g = 7; g >= 0; --g)
    EXPECT_EQ(data->blendSample(g), expected[static_cast<size_t>(g)]) << "sample " << g;
  auto again = data->blendSample(400000);
  EXPECT_EQ(again, far);
  auto parsed = TokenData::parseBlend("0.7 x.bin 0.3 y.bin,z.bin");
  ASSERT_TRUE(parsed.isOk());
  ASSERT_EQ(parsed->size(), 2u);
  EXPECT_EQ((*parsed)[1].second, (std::vector<std::string>{"y.bin", "z.bin"}));
}

// ptc's token files: the header's width and count; uint32 ids above 65535.
TEST(TokenData, HeaderedUint32Files) {
  std::string path = tempPath("wide.bin");
  std::vector<uint32_t> ids(64);
  for (size_t i = 0; i < ids.size(); ++i)
    ids[i] = 70000 + static_cast<uint32_t>(i);
  TokenFileHeader h;
  h.bytesPerToken = 4;
  h.vocab = 70064;
  h.count = ids.size();
  std::string bytes = h.encode();
  ASSERT_EQ(bytes.size(), 32u);
  bytes.append(reinterpret_cast<const char *>(ids.data()), ids.size() * 4);
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  auto data = TokenData::load(path, /*seq=*/8, /*vocab=*/70064);
  ASSERT_TRUE(data.isOk()) << data.status().message();
  EXPECT_EQ(data->size(), 64);
  std::vector<int32_t> x(8), y(8);
  ASSERT_TRUE(data->fillBatch(1, 1, 8, 0, 1, x.data(), y.data()).isOk());
  EXPECT_EQ(x[0], 70008);
  EXPECT_EQ(y[7], 70016);
  // A model with a smaller vocabulary than the file's tokenizer: refused by
  // the header, before any id is read.
  auto small = TokenData::load(path, 8, 70000);
  ASSERT_FALSE(small.isOk());
  EXPECT_NE(small.status().message().find("was tokenized for a vocabulary of 70064, larger than "
                                          "the model's 70000"),
            std::string::npos)
      << small.status().message();
  // The ids are still checked against the model's vocabulary (a header that
  // understates its ids).
  h.vocab = 70001;
  bytes = h.encode();
  bytes.append(reinterpret_cast<const char *>(ids.data()), ids.size() * 4);
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  auto understated = TokenData::load(path, 8, 70001);
  ASSERT_FALSE(understated.isOk());
  EXPECT_NE(understated.status().message().find("token id 70001 at position 1"),
            std::string::npos)
      << understated.status().message();
}

// --shuffle: every window exactly once per epoch, another order each epoch,
// the same order for the same seed.
TEST(TokenData, ShuffleVisitsEveryWindowOncePerEpoch) {
  std::string path = tempPath("s.bin");
  std::vector<uint16_t> tokens(1000, 1);
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<char *>(tokens.data()), 2000);
  const int64_t seq = 8, windows = (1000 - seq - 1) / seq;
  auto a = TokenData::load(std::vector<std::string>{path}, seq, 256, 42);
  auto b = TokenData::load(std::vector<std::string>{path}, seq, 256, 42);
  auto c = TokenData::load(std::vector<std::string>{path}, seq, 256, 43);
  ASSERT_TRUE(a.isOk() && b.isOk() && c.isOk());
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    std::vector<int64_t> starts;
    bool sameSeed = true, otherSeed = true;
    for (int64_t g = epoch * windows; g < (epoch + 1) * windows; ++g) {
      starts.push_back(a->windowStart(g, seq));
      sameSeed &= a->windowStart(g, seq) == b->windowStart(g, seq);
      otherSeed &= a->windowStart(g, seq) == c->windowStart(g, seq);
    }
    std::vector<int64_t> sorted = starts;
    std::sort(sorted.begin(), sorted.end());
    for (int64_t w = 0; w < windows; ++w)
      ASSERT_EQ(sorted[static_cast<size_t>(w)], w * seq) << "epoch " << epoch;
    EXPECT_TRUE(sameSeed);
    EXPECT_FALSE(otherSeed);
    if (epoch > 0)
      EXPECT_NE(starts[0] + starts[1] * 7, a->windowStart(0, seq) + a->windowStart(1, seq) * 7);
  }
}

TEST(TokenData, RejectsShortFileAndLargeIds) {
  std::string path = tempPath("short.bin");
  std::vector<uint16_t> tokens{1, 2, 3, 300};
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<char *>(tokens.data()), 8);
  auto shortData = TokenData::load(path, 8, 256);
  ASSERT_FALSE(shortData.isOk());
  EXPECT_EQ(shortData.status().message(),
            "data file '" + path + "' has 4 tokens; one window of seq 8 needs at least 10");
  auto bigId = TokenData::load(path, 2, 256);
  ASSERT_FALSE(bigId.isOk());
  EXPECT_EQ(bigId.status().message(), "data file '" + path +
                                          "': token id 300 at position 3 is not below the "
                                          "model's vocab 256");
}
} // namespace

// CRC-32C's check value (RFC 3720 / the Castagnoli polynomial's catalogue
// entry) and TFRecord's masking of the CRC of an empty string.
TEST(ScalarLog, Crc32cCheckValues) {
  EXPECT_EQ(ptc::crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(ptc::crc32c("", 0), 0u);
  EXPECT_EQ(ptc::maskedCrc32c("", 0), 0xa282ead8u);
}

TEST(ScalarLog, CsvKeepsItsColumns) {
  std::string path = ::testing::TempDir() + "/scalar_log_test.csv";
  ptc::CsvScalarLog csv;
  ASSERT_TRUE(csv.open(path, false).isOk());
  ASSERT_TRUE(csv.write({{"step", 1.0}, {"loss", 2.5}, {"lr", std::nullopt}}).isOk());
  ASSERT_TRUE(csv.write({{"step", 2.0}, {"loss", 2.25}, {"lr", 0.5}}).isOk());
  ptc::Status s = csv.write({{"step", 3.0}, {"eval", 1.0}});
  EXPECT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("column 'eval' is not in the header"), std::string::npos) << s.message();
  std::ifstream in(path);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(all, "step,loss,lr\n1,2.5,\n2,2.25,0.5\n");
}

// The programs the tools start (runtime/base/subprocess.h): by argument
// vector, no shell; exit status, signals and a missing program told apart.
TEST(Subprocess, RunsByArgumentVectorAndReportsHowTheChildEnded) {
  ptc::ChildOptions capture;
  capture.captureOutput = true;
  // An argument with spaces and quotes reaches the program as one argument.
  ptc::ChildResult echoed =
      ptc::runChild({"printf", "%s|", "a b", "it's \"quoted\"", "$HOME"}, capture);
  EXPECT_EQ(echoed.status, 0);
  EXPECT_EQ(echoed.output, "a b|it's \"quoted\"|$HOME|");

  EXPECT_EQ(ptc::runChild({"sh", "-c", "exit 3"}).status, 3);
  EXPECT_EQ(ptc::runChild({"sh", "-c", "kill -TERM $$"}).status, 128 + 15);

  ptc::ChildOptions quiet;
  quiet.discardErrors = true;
  EXPECT_EQ(ptc::runChild({"ptc-no-such-program-here"}, quiet).status, 127);

  ptc::ChildOptions env = capture;
  env.environment = {{"PTC_SUBPROCESS_TEST", "x y"}};
  EXPECT_EQ(ptc::runChild({"sh", "-c", "printf %s \"$PTC_SUBPROCESS_TEST\""}, env).output, "x y");
  EXPECT_EQ(std::getenv("PTC_SUBPROCESS_TEST"), nullptr); // the child's only

  std::vector<pid_t> seen;
  ptc::ChildOptions watched;
  watched.onRunning = [&](pid_t pid) { seen.push_back(pid); };
  EXPECT_EQ(ptc::runChild({"true"}, watched).status, 0);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_GT(seen[0], 0);
  EXPECT_EQ(seen[1], 0);

  // Commands as messages and --dry-run print them: a shell takes each back as one word.
  const std::vector<std::string> words = {"ptc-opt", "a b", "it's", "--x=1"};
  EXPECT_EQ(ptc::commandText(words), "ptc-opt 'a b' 'it'\\''s' --x=1");
  ptc::ChildResult back = ptc::runChild({"sh", "-c", "printf '%s|' " + ptc::commandText(words)}, capture);
  EXPECT_EQ(back.output, "ptc-opt|a b|it's|--x=1|");
}
