// Size and option parsing: strict, and the same under any C locale (vramkit top
// calls setlocale(LC_ALL, "") and a German locale writes 0,5 for one half).
#include <gtest/gtest.h>

#include <clocale>
#include <cstdlib>
#include <string>

#include "vramkit/error.hpp"
#include "vramkit/pool_options.hpp"

using namespace vramkit;

namespace {
// Switches LC_ALL to a decimal-comma locale for the test's lifetime.
class GermanLocale : public ::testing::Test {
 protected:
  void SetUp() override {
    old_ = std::setlocale(LC_ALL, nullptr);
    if (!std::setlocale(LC_ALL, "de_DE.UTF-8"))
      GTEST_SKIP() << "locale de_DE.UTF-8 is not installed (scripts/setup.sh with VRAMKIT_SETUP_TEST_TOOLS=1 "
                      "generates it)";
  }
  void TearDown() override { std::setlocale(LC_ALL, old_.c_str()); }
  std::string old_;
};
}  // namespace

TEST_F(GermanLocale, SizesWithAFractionKeepIt) {
  EXPECT_EQ(parse_size("1.5GiB"), std::size_t{3} << 29);
  EXPECT_EQ(parse_size("0.5MiB"), std::size_t{1} << 19);
  EXPECT_EQ(parse_size(".25KiB"), 256u);
}

TEST_F(GermanLocale, OptionsParseAndPrintWithADot) {
  pool_options o;
  o.parse("growth_slack:0.05,va_factor:2.5");
  EXPECT_DOUBLE_EQ(o.growth_slack, 0.05);
  EXPECT_DOUBLE_EQ(o.va_factor, 2.5);
  std::string s = o.to_string();
  EXPECT_NE(s.find("growth_slack:0.0500,"), std::string::npos) << s;
  EXPECT_NE(s.find("va_factor:2.50"), std::string::npos) << s;
  pool_options back;
  back.parse(s);  // the printed string is a valid options string
  EXPECT_DOUBLE_EQ(back.growth_slack, 0.05);
  EXPECT_EQ(format_fixed(0.5, 3), "0.500");
}

TEST(Parsing, SizesRefuseGarbage) {
  EXPECT_THROW(parse_size("1.2.3GiB"), invalid_argument);
  EXPECT_THROW(parse_size("."), invalid_argument);
  EXPECT_THROW(parse_size("1e3"), invalid_argument);
  EXPECT_THROW(parse_size("-1"), invalid_argument);
  EXPECT_EQ(parse_size("1.5 GiB"), std::size_t{3} << 29);
  EXPECT_EQ(parse_size("2MB"), 2000000u);
}

TEST(Parsing, FractionsInOptionsAreWholeNumbers) {
  pool_options o;
  EXPECT_THROW(o.parse("growth_slack:5%"), invalid_argument);
  EXPECT_THROW(o.parse("growth_slack:0.05abc"), invalid_argument);
  EXPECT_THROW(o.parse("growth_slack:1e-2"), invalid_argument);
  EXPECT_THROW(o.parse("growth_slack:"), invalid_argument);
  EXPECT_DOUBLE_EQ(o.growth_slack, pool_options{}.growth_slack);  // a refused string changes nothing
}

TEST(Parsing, RemovedDeferUnmapIsRefusedWhenAskedForAndIgnoredWhenOff) {
  pool_options o;
  o.parse("defer_unmap:false,growth_slack:0.03");  // an old configuration that turned it off still parses
  EXPECT_DOUBLE_EQ(o.growth_slack, 0.03);
  try {
    o.parse("defer_unmap:true,growth_slack:0.07");
    FAIL() << "defer_unmap:true was accepted";
  } catch (const invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("removed"), std::string::npos) << e.what();
  }
  EXPECT_DOUBLE_EQ(o.growth_slack, 0.03);  // nothing changed
  EXPECT_EQ(o.to_string().find("defer_unmap"), std::string::npos);
}

TEST(Parsing, RemapOwnNeedsKeptMappings) {
  pool_options o;
  o.parse("remap_own:true");
  EXPECT_TRUE(o.remap_own);
  EXPECT_NE(o.to_string().find("remap_own:true"), std::string::npos);
  pool_options back;
  back.parse(o.to_string());  // what it prints parses back
  EXPECT_TRUE(back.remap_own);
  try {
    o.parse("remap_own:true,keep_mappings:false");
    FAIL() << "remap_own without keep_mappings was accepted";
  } catch (const invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("keep_mappings"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(o.keep_mappings);  // nothing changed
  o.parse("remap_own:false,keep_mappings:false");
  EXPECT_FALSE(o.keep_mappings);
  pool_options d;  // remap_own is on by default; keep_mappings:false alone turns it off
  EXPECT_TRUE(d.remap_own);
  d.parse("keep_mappings:false");
  EXPECT_FALSE(d.remap_own);
  EXPECT_FALSE(d.keep_mappings);
  pool_options c;  // a C++ caller clearing keep_mappings alone is told why
  c.keep_mappings = false;
  EXPECT_THROW(c.validate(), invalid_argument);
  EXPECT_THROW(o.parse("remap_own:maybe"), invalid_argument);
  o.parse("remap_own_slack:0.08");
  EXPECT_DOUBLE_EQ(o.remap_own_slack, 0.08);
  EXPECT_NE(o.to_string().find("remap_own_slack:0.0800"), std::string::npos) << o.to_string();
  for (const char* bad : {"remap_own_slack:-0.1", "remap_own_slack:101", "remap_own_slack:8%", "remap_own_slack:"})
    EXPECT_THROW(o.parse(bad), invalid_argument) << bad;
  EXPECT_DOUBLE_EQ(o.remap_own_slack, 0.08);  // a refused string changes nothing
}

namespace {
std::string message_of(const std::string& conf) {
  try {
    pool_options o;
    o.parse(conf);
  } catch (const invalid_argument& e) {
    return e.what();
  }
  return "(accepted)";
}
}  // namespace

// A bad option names the option and the problem; only a setting read from the
// environment says it came from VRAMKIT_ALLOC_CONF (make_resource specs and
// --allocator are other sources).
TEST(Parsing, MessagesNameTheOptionAndTheirSource) {
  EXPECT_EQ(message_of("growth_slack:-1"), "growth_slack cannot be negative (got -1)");
  EXPECT_EQ(message_of("remap_own:maybe"), "remap_own takes true or false, not 'maybe'");
  EXPECT_EQ(message_of("nope:1").rfind("unknown key 'nope'", 0), 0u) << message_of("nope:1");
  EXPECT_EQ(message_of("reserve_limit:-1GiB"), "reserve_limit: size '-1GiB' cannot be negative");
  EXPECT_EQ(message_of("chunk_size:lots"), "chunk_size: size 'lots' does not start with a number");
  EXPECT_EQ(message_of("page_size:"), "page_size: empty size");
  pool_options o;
  o.parse("remap:TRUE,keep_mappings:Off,wait_to_remap:yes");  // any case of the usual words
  EXPECT_TRUE(o.remap);
  EXPECT_FALSE(o.keep_mappings);
  EXPECT_TRUE(o.wait_to_remap);
  const char* old = std::getenv("VRAMKIT_ALLOC_CONF");
  const std::string saved = old ? old : "";
  ::setenv("VRAMKIT_ALLOC_CONF", "page_size:3MiB", 1);
  try {
    pool_options::from_env();
    ADD_FAILURE() << "page_size:3MiB was accepted";
  } catch (const invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()).rfind("VRAMKIT_ALLOC_CONF: page_size", 0), 0u) << e.what();
  }
  if (old) ::setenv("VRAMKIT_ALLOC_CONF", saved.c_str(), 1); else ::unsetenv("VRAMKIT_ALLOC_CONF");
}
