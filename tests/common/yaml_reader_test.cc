#include "common/yaml_reader.h"

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "yaml-cpp/yaml.h"

namespace conveyor {
namespace {

using ::testing::HasSubstr;

// Parses `text` (one document) and returns it as the top-level value of
// "f.yaml". Fails the test on a syntax error.
YamlValue Doc(const YamlReader& reader, const std::string& text) {
  absl::StatusOr<YAML::Node> doc =
      LoadYaml(text, "f.yaml", YamlDocuments::kExactlyOne);
  EXPECT_TRUE(doc.ok()) << doc.status();
  return reader.Root(doc.ok() ? *doc : YAML::Node());
}

// The value of `key` in the top-level map of `text`.
YamlValue Field(const YamlReader& reader, const std::string& text,
                const std::string& key) {
  absl::StatusOr<YamlMap> map = reader.ReadAnyMap(Doc(reader, text));
  EXPECT_TRUE(map.ok()) << map.status();
  const YamlMapEntry* entry = map.ok() ? map->Find(key) : nullptr;
  EXPECT_NE(entry, nullptr) << key;
  return entry != nullptr ? entry->value : YamlValue{};
}

std::string ErrorOf(const absl::Status& status) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  return std::string(status.message());
}

TEST(SourceLocationTest, ToStringOmitsUnknownPosition) {
  EXPECT_EQ((SourceLocation{"f.yaml", 0, 0}).ToString(), "f.yaml");
  EXPECT_EQ((SourceLocation{"f.yaml", 3, 4}).ToString(), "f.yaml:3:4");
}

TEST(YamlErrorTest, FormatsPositionPathAndMessage) {
  const absl::Status s = YamlError({"f.yaml", 2, 5}, "a.b", "bad");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "f.yaml:2:5: a.b: bad");
  EXPECT_EQ(YamlError({"f.yaml", 1, 1}, "", "bad").message(),
            "f.yaml:1:1: (top level): bad");
}

TEST(DescribeYamlTest, NamesEachKindOfNode) {
  const YAML::Node doc =
      YAML::Load("{a: 1, b: \"2\", c: [1], d: {x: 1}, e: null}");
  EXPECT_EQ(DescribeYaml(doc["a"]), "'1'");
  EXPECT_EQ(DescribeYaml(doc["b"]), "the quoted string \"2\"");
  EXPECT_EQ(DescribeYaml(doc["c"]), "a list");
  EXPECT_EQ(DescribeYaml(doc["d"]), "a map");
  EXPECT_EQ(DescribeYaml(doc["e"]), "null");
  const YAML::Node& const_doc = doc;
  EXPECT_EQ(DescribeYaml(const_doc["missing"]), "nothing");
}

TEST(LoadYamlTest, ReportsSyntaxErrorPosition) {
  absl::StatusOr<YAML::Node> doc =
      LoadYaml("a: 1\nb: [1, 2\n", "f.yaml", YamlDocuments::kExactlyOne);
  EXPECT_THAT(ErrorOf(doc.status()),
              HasSubstr("f.yaml:3:1: YAML syntax error"));
}

// A stray byte once reached a submission's protobuf string, which must be
// UTF-8, and failed with an empty message. It is refused where it is.
TEST(LoadYamlTest, RefusesTextThatIsNotUtf8NamingTheByte) {
  EXPECT_TRUE(LoadYaml("name: caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\n",
                       "f.yaml", YamlDocuments::kExactlyOne)
                  .ok());
  const struct {
    std::string text;
    std::string want;
  } cases[] = {
      {"a: 1\nname: \xff x\n", "f.yaml:2:7: not UTF-8 text (byte 0xff)"},
      {"a: \xc3", "f.yaml:1:4: not UTF-8 text (byte 0xc3)"},          // Cut.
      {"a: \xc3(", "f.yaml:1:4: not UTF-8 text (byte 0xc3)"},         // Bad.
      {"a: \xc0\xaf", "f.yaml:1:4: not UTF-8 text (byte 0xc0)"},      // Long.
      {"a: \xed\xa0\x80", "f.yaml:1:4: not UTF-8 text (byte 0xed)"},  // D800.
      {"a: \xf4\x90\x80\x80", "f.yaml:1:4: not UTF-8 text (byte 0xf4)"},
  };
  for (const auto& c : cases) {
    absl::StatusOr<YAML::Node> doc =
        LoadYaml(c.text, "f.yaml", YamlDocuments::kExactlyOne);
    EXPECT_EQ(doc.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(ErrorOf(doc.status()), HasSubstr(c.want)) << c.want;
  }
}

TEST(LoadYamlTest, EmptyTextIsNull) {
  for (YamlDocuments d : {YamlDocuments::kFirst, YamlDocuments::kExactlyOne}) {
    absl::StatusOr<YAML::Node> doc = LoadYaml("", "f.yaml", d);
    ASSERT_TRUE(doc.ok()) << doc.status();
    EXPECT_TRUE(doc->IsNull());
  }
}

TEST(LoadYamlTest, SecondDocumentIsAnErrorOnlyWhenExactlyOneIsWanted) {
  const std::string text = "a: 1\n---\nb: 2\n";
  absl::StatusOr<YAML::Node> first =
      LoadYaml(text, "f.yaml", YamlDocuments::kFirst);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ((*first)["a"].Scalar(), "1");
  EXPECT_EQ(
      ErrorOf(LoadYaml(text, "f.yaml", YamlDocuments::kExactlyOne).status()),
      "f.yaml:3:1: expected one YAML document; found 2 (separated by "
      "'---')");
}

// yaml-cpp 0.7's LoadAll never returns on a top-level ',' (it allocates
// until memory runs out); found by fuzz/job_spec_fuzzer. Both are errors now,
// at the comma.
TEST(LoadYamlTest, ATopLevelCommaIsAnErrorNotAHang) {
  EXPECT_EQ(
      ErrorOf(LoadYaml(",", "f.yaml", YamlDocuments::kExactlyOne).status()),
      "f.yaml:1:1: YAML syntax error: unexpected token at the top level");
  EXPECT_EQ(
      ErrorOf(LoadYaml("name: x\n---\n,", "f.yaml", YamlDocuments::kExactlyOne)
                  .status()),
      "f.yaml:3:1: YAML syntax error: unexpected token at the top level");
}

TEST(CatchYamlExceptionsTest, TurnsExceptionsIntoStatus) {
  const absl::StatusOr<int> yaml =
      CatchYamlExceptions("f.yaml", "the thing", []() -> absl::StatusOr<int> {
        throw YAML::ParserException(YAML::Mark::null_mark(), "boom");
      });
  EXPECT_EQ(ErrorOf(yaml.status()), "f.yaml: YAML error: boom");
  const absl::Status other = CatchYamlExceptions(
      "f.yaml", "the thing",
      []() -> absl::Status { throw std::runtime_error("oops"); });
  EXPECT_EQ(other.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(other.message(),
            "f.yaml: unexpected error parsing the thing: oops");
  EXPECT_EQ(*CatchYamlExceptions("f.yaml", "x",
                                 []() -> absl::StatusOr<int> { return 7; }),
            7);
}

TEST(YamlReaderTest, RootOfEmptyDocumentIsAtOneOne) {
  const YamlReader reader("f.yaml");
  const YamlValue root = Doc(reader, "");
  EXPECT_EQ(root.where.ToString(), "f.yaml:1:1");
  EXPECT_EQ(root.path, "");
  EXPECT_EQ(ErrorOf(reader.ReadAnyMap(root).status()),
            "f.yaml:1:1: (top level): must be a map; got null");
}

TEST(YamlReaderTest, ReadMapKeepsOrderPathsAndPositions) {
  const YamlReader reader("f.yaml");
  absl::StatusOr<YamlMap> top =
      reader.ReadMap(Doc(reader, "x: 1\nsub:\n  b: hi\n  a:\n"), {"x", "sub"});
  ASSERT_TRUE(top.ok()) << top.status();
  ASSERT_EQ(top->entries.size(), 2u);
  EXPECT_EQ(top->entries[0].key, "x");
  EXPECT_EQ(top->entries[0].value.path, "x");
  EXPECT_EQ(top->entries[0].value.where.ToString(), "f.yaml:1:4");
  EXPECT_EQ(top->entries[0].key_where.ToString(), "f.yaml:1:1");
  const YamlMapEntry* sub = top->Find("sub");
  ASSERT_NE(sub, nullptr);
  EXPECT_EQ(top->Find("nope"), nullptr);

  absl::StatusOr<YamlMap> inner = reader.ReadMap(sub->value, {"a", "b"});
  ASSERT_TRUE(inner.ok()) << inner.status();
  ASSERT_EQ(inner->entries.size(), 2u);
  EXPECT_EQ(inner->entries[0].key, "b");
  EXPECT_EQ(inner->entries[0].value.path, "sub.b");
  EXPECT_EQ(inner->entries[0].value.where.ToString(), "f.yaml:3:6");
  // A null value is reported at its key: yaml-cpp marks the next token.
  EXPECT_EQ(inner->entries[1].value.path, "sub.a");
  EXPECT_TRUE(inner->entries[1].value.node.IsNull());
  EXPECT_EQ(inner->entries[1].value.where.ToString(), "f.yaml:4:3");
}

TEST(YamlReaderTest, ReadMapRejectsUnknownKeysListingTheAllowedOnes) {
  const YamlReader reader("f.yaml");
  const YamlValue sub = Field(reader, "sub:\n  a: 1\n  bb: 2\n", "sub");
  EXPECT_EQ(ErrorOf(reader.ReadMap(sub, {"a", "b"}).status()),
            "f.yaml:3:3: sub: unknown key 'bb'; allowed: a, b");
  EXPECT_EQ(ErrorOf(reader.ReadMap(sub, {}).status()),
            "f.yaml:2:3: sub: unknown key 'a'; this takes no options");
}

TEST(YamlReaderTest, ReadMapRejectsDuplicateKeys) {
  const YamlReader reader("f.yaml");
  EXPECT_EQ(
      ErrorOf(reader.ReadMap(Doc(reader, "a: 1\nb: 2\na: 3\n"), {"a", "b"})
                  .status()),
      "f.yaml:3:1: (top level): duplicate key 'a'");
}

TEST(YamlReaderTest, ReadMapRejectsNonScalarKeys) {
  const YamlReader reader("f.yaml");
  EXPECT_EQ(ErrorOf(reader.ReadAnyMap(Doc(reader, "a: 1\n[x]: 2\n")).status()),
            "f.yaml:2:1: (top level): keys must be strings; got a list");
}

TEST(YamlReaderTest, NullReadsAsEmptyMapOnlyWhenAsked) {
  const YamlReader reader("f.yaml");
  const YamlValue opts = Field(reader, "k:\nz: 1\n", "k");
  absl::StatusOr<YamlMap> empty = reader.ReadMap(opts, {}, true);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE(empty->entries.empty());
  EXPECT_EQ(ErrorOf(reader.ReadMap(opts, {}, false).status()),
            "f.yaml:1:1: k: must be a map; got null");
  EXPECT_EQ(
      ErrorOf(
          reader.ReadMap(Field(reader, "k: [1]\n", "k"), {}, true).status()),
      "f.yaml:1:4: k: must be a map; got a list");
}

TEST(YamlReaderTest, RequireNamesTheMissingKeyAtTheMap) {
  const YamlReader reader("f.yaml");
  absl::StatusOr<YamlMap> map =
      reader.ReadAnyMap(Field(reader, "top: 0\nm:\n  a: 1\n", "m"));
  ASSERT_TRUE(map.ok()) << map.status();
  absl::StatusOr<const YamlMapEntry*> a = reader.Require(*map, "a");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ((*a)->key, "a");
  EXPECT_EQ(ErrorOf(reader.Require(*map, "b").status()),
            "f.yaml:3:3: m: missing required key 'b'");
}

TEST(YamlReaderTest, CheckKeysAcceptsAllowedKeys) {
  const YamlReader reader("f.yaml");
  absl::StatusOr<YamlMap> map = reader.ReadAnyMap(Doc(reader, "a: 1\nb: 2\n"));
  ASSERT_TRUE(map.ok());
  EXPECT_TRUE(reader.CheckKeys(*map, {"b", "a", "c"}).ok());
  EXPECT_EQ(ErrorOf(reader.CheckKeys(*map, {"a"})),
            "f.yaml:2:1: (top level): unknown key 'b'; allowed: a");
}

TEST(YamlReaderTest, ElementPathsAndPositions) {
  const YamlReader reader("f.yaml");
  const YamlValue list = Field(reader, "l:\n  - 5\n  -\n  - 7\n", "l");
  ASSERT_TRUE(list.node.IsSequence());
  const YamlValue first = reader.Element(list, 0);
  EXPECT_EQ(first.path, "l[0]");
  EXPECT_EQ(first.where.ToString(), "f.yaml:2:5");
  // A null item takes the list's position, not the next token's.
  const YamlValue null_item = reader.Element(list, 1);
  EXPECT_EQ(null_item.path, "l[1]");
  EXPECT_EQ(null_item.where.ToString(), list.where.ToString());
  EXPECT_EQ(reader.Element(list, 2).where.ToString(), "f.yaml:4:5");
}

TEST(YamlReaderTest, ParseIntAcceptsDecimalInRange) {
  const YamlReader reader("f.yaml");
  EXPECT_EQ(*reader.ParseInt(Field(reader, "n: 42", "n"), 1, 100), 42);
  EXPECT_EQ(*reader.ParseInt(Field(reader, "n: -3", "n"), -5, 5), -3);
  EXPECT_EQ(*reader.ParseInt(Field(reader, "n: +0", "n"), 0, 5), 0);
  EXPECT_EQ(*reader.ParseInt(Field(reader, "n: 9223372036854775807", "n"), 0,
                             INT64_MAX),
            INT64_MAX);
}

TEST(YamlReaderTest, ParseIntRejectsWithRangeSpecificMessages) {
  const YamlReader reader("f.yaml");
  auto error = [&](const std::string& text, int64_t min, int64_t max) {
    return ErrorOf(
        reader.ParseInt(Field(reader, text, "n"), min, max).status());
  };
  EXPECT_EQ(error("n: 0", 1, 10),
            "f.yaml:1:4: n: must be a positive integer; got '0'");
  EXPECT_EQ(error("n: -1", 0, 10),
            "f.yaml:1:4: n: must be a non-negative integer; got '-1'");
  EXPECT_EQ(error("n: 1", 2, 10),
            "f.yaml:1:4: n: must be an integer in [2, 10]; got '1'");
  EXPECT_EQ(error("n: 11", 1, 10), "f.yaml:1:4: n: must be at most 10; got 11");
  EXPECT_EQ(error("n: 99999999999999999999", 1, 10),
            "f.yaml:1:4: n: must be at most 10; got 99999999999999999999");
  EXPECT_EQ(error("n: -99999999999999999999", 1, 10),
            "f.yaml:1:4: n: must be a positive integer; got "
            "'-99999999999999999999'");
  EXPECT_EQ(error("n: \"3\"", 1, 10),
            "f.yaml:1:4: n: must be a positive integer; got the quoted string "
            "\"3\"");
  EXPECT_THAT(error("n: 0x10", 1, 100), HasSubstr("got '0x10'"));
  EXPECT_THAT(error("n: 1e3", 1, 10000), HasSubstr("got '1e3'"));
  EXPECT_THAT(error("n: 2.0", 1, 10), HasSubstr("got '2.0'"));
  EXPECT_THAT(error("n: [1]", 1, 10), HasSubstr("got a list"));
  EXPECT_EQ(error("n:\nm: 1", 1, 10),
            "f.yaml:1:1: n: must be a positive integer; got null");
}

TEST(YamlReaderTest, ParseUint64TakesTheFullRange) {
  const YamlReader reader("f.yaml");
  EXPECT_EQ(*reader.ParseUint64(Field(reader, "s: 18446744073709551615", "s")),
            UINT64_MAX);
  EXPECT_EQ(*reader.ParseUint64(Field(reader, "s: 0", "s")), 0u);
  EXPECT_EQ(
      ErrorOf(reader.ParseUint64(Field(reader, "s: 18446744073709551616", "s"))
                  .status()),
      "f.yaml:1:4: s: must be at most 2^64 - 1; got 18446744073709551616");
  EXPECT_EQ(ErrorOf(reader.ParseUint64(Field(reader, "s: -1", "s")).status()),
            "f.yaml:1:4: s: must be a non-negative integer; got '-1'");
}

TEST(YamlReaderTest, ParseBoolFollowsYaml12) {
  const YamlReader reader("f.yaml");
  for (const char* t : {"true", "True", "TRUE"}) {
    EXPECT_TRUE(*reader.ParseBool(Field(reader, std::string("b: ") + t, "b")));
  }
  for (const char* f : {"false", "False", "FALSE"}) {
    EXPECT_FALSE(*reader.ParseBool(Field(reader, std::string("b: ") + f, "b")));
  }
  EXPECT_EQ(ErrorOf(reader.ParseBool(Field(reader, "b: yes", "b")).status()),
            "f.yaml:1:4: b: must be true or false; got 'yes'");
  EXPECT_THAT(
      ErrorOf(reader.ParseBool(Field(reader, "b: \"true\"", "b")).status()),
      HasSubstr("got the quoted string \"true\""));
}

TEST(YamlReaderTest, ParseNumberAcceptsDecimalAndExponentForms) {
  const YamlReader reader("f.yaml");
  EXPECT_DOUBLE_EQ(*reader.ParseNumber(Field(reader, "x: 1e-3", "x")), 1e-3);
  EXPECT_DOUBLE_EQ(*reader.ParseNumber(Field(reader, "x: 1.0e-8", "x")),
                   1.0e-8);
  EXPECT_DOUBLE_EQ(*reader.ParseNumber(Field(reader, "x: -2.5", "x")), -2.5);
  EXPECT_DOUBLE_EQ(*reader.ParseNumber(Field(reader, "x: 3", "x")), 3.0);
  for (const char* bad : {"x: .inf", "x: nan", "x: inf", "x: 1e999",
                          "x: \"1.0\"", "x: 1.0.0", "x: [1]"}) {
    EXPECT_THAT(ErrorOf(reader.ParseNumber(Field(reader, bad, "x")).status()),
                HasSubstr("f.yaml:1:4: x: must be a number; got "))
        << bad;
  }
}

TEST(YamlReaderTest, ParseSignedDoubles) {
  const YamlReader reader("f.yaml");
  EXPECT_DOUBLE_EQ(*reader.ParsePositiveDouble(Field(reader, "x: 1e-5", "x")),
                   1e-5);
  EXPECT_EQ(
      ErrorOf(reader.ParsePositiveDouble(Field(reader, "x: 0", "x")).status()),
      "f.yaml:1:4: x: must be a positive number; got '0'");
  EXPECT_EQ(*reader.ParseNonNegativeDouble(Field(reader, "x: 0.0", "x")), 0.0);
  EXPECT_FALSE(std::signbit(
      *reader.ParseNonNegativeDouble(Field(reader, "x: -0.0", "x"))));
  EXPECT_EQ(
      ErrorOf(reader.ParseNonNegativeDouble(Field(reader, "x: -1e-9", "x"))
                  .status()),
      "f.yaml:1:4: x: must be a non-negative number; got '-1e-9'");
}

TEST(YamlReaderTest, ParseEnumReturnsIndexOrListsNames) {
  const YamlReader reader("f.yaml");
  EXPECT_EQ(*reader.ParseEnum(Field(reader, "k: b", "k"), {"a", "b", "c"}), 1);
  EXPECT_EQ(
      ErrorOf(
          reader.ParseEnum(Field(reader, "k: d", "k"), {"a", "b"}).status()),
      "f.yaml:1:4: k: must be one of: a, b; got 'd'");
  EXPECT_THAT(
      ErrorOf(
          reader.ParseEnum(Field(reader, "k: {a: 1}", "k"), {"a"}).status()),
      HasSubstr("got a map"));
}

TEST(YamlReaderTest, ParseStringTakesAnyNonEmptyScalar) {
  const YamlReader reader("f.yaml");
  EXPECT_EQ(*reader.ParseString(Field(reader, "s: abc", "s")), "abc");
  EXPECT_EQ(*reader.ParseString(Field(reader, "s: 123", "s")), "123");
  EXPECT_EQ(*reader.ParseString(Field(reader, "s: \"x y\"", "s")), "x y");
  EXPECT_EQ(ErrorOf(reader.ParseString(Field(reader, "s: \"\"", "s")).status()),
            "f.yaml:1:4: s: must be a non-empty string; got the quoted "
            "string \"\"");
  EXPECT_THAT(
      ErrorOf(reader.ParseString(Field(reader, "s: [a]", "s")).status()),
      HasSubstr("got a list"));
}

}  // namespace
}  // namespace conveyor
