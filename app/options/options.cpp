// options.cpp — option parsing shared by every subcommand: one-line errors, exit 1,
// readable ranges, no NaN or infinity in floating-point options (see options.h).
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "app/options/options.h"
#include "engine/printable.h"

namespace kvscope::cli {
namespace {

std::string real_text(long double x) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.9Lg", x);
  return buf;
}

// Parses the whole string as a number; false when it is not one (the option's own
// conversion then reports it).
bool parse_number(const std::string& s, long double* out) {
  if (s.empty()) return false;
  errno = 0;
  char* end = nullptr;
  *out = std::strtold(s.c_str(), &end);
  return end == s.c_str() + s.size();
}

CLI::Validator range_validator(long double lo, long double hi, const std::string& shown) {
  return CLI::Validator(
      [lo, hi, shown](std::string& in) -> std::string {
        long double v;
        if (!parse_number(in, &v)) return {};
        if (std::isnan(v) || v < lo || v > hi) return in + " is outside " + shown;
        return {};
      },
      shown, "RANGE");
}

// Every floating-point option: finite, and within float's range (a double option that
// needs more is not one kvscope has).
const CLI::Validator& finite_validator() {
  static const CLI::Validator v(
      [](std::string& in) -> std::string {
        long double x;
        if (!parse_number(in, &x)) return {};
        if (std::isnan(x)) return in + " is not a number (NaN is not allowed)";
        if (!std::isfinite(x) || std::fabs(x) > std::numeric_limits<float>::max())
          return in + " is not a finite number";
        return {};
      },
      "", "FINITE");
  return v;
}

// Integer options: CLI11 would wrap "-1" around to an unsigned type's maximum and clamp
// values past 64 bits to the limit without a word.
CLI::Validator integer_validator(bool is_unsigned) {
  return CLI::Validator(
      [is_unsigned](std::string& in) -> std::string {
        long double x;
        if (!parse_number(in, &x)) return {};
        if (is_unsigned && x < 0) return in + " is negative (this option takes 0 and up)";
        const long double lo = is_unsigned ? 0.0L : -9223372036854775808.0L;
        const long double hi = is_unsigned ? 18446744073709551615.0L : 9223372036854775807.0L;
        if (x < lo || x > hi) return in + " does not fit in 64 bits";
        return {};
      },
      "", is_unsigned ? "UINT64" : "INT64");
}

// The checks every option of a type gets, whatever its own checks are.
void add_implicit_checks(CLI::App& app) {
  for (CLI::Option* opt : app.get_options()) {
    const std::string type = opt->get_type_name();
    if (type == "FLOAT") opt->check(finite_validator());
    if (type == "UINT" || type == "INT") opt->check(integer_validator(type == "UINT"));
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
    add_implicit_checks(*sub);
}

// CLI11's messages may span lines ("...\nRun with --help"); one line, escaped.
std::string one_line(std::string s) {
  std::string out;
  bool space = false;
  for (char c : s) {
    if (c == '\n' || c == '\r') {
      space = !out.empty();
      continue;
    }
    if (space) out += "; ";
    space = false;
    out += c;
  }
  return out;
}

CLI::Validator words_or_range(const std::vector<std::string>& words, long double lo,
                              long double hi, const std::string& range, bool integer) {
  // "mean, max or a whole number in 0..4095"
  std::string shown;
  for (const std::string& w : words) shown += (shown.empty() ? "" : ", ") + w;
  shown += std::string(shown.empty() ? "a " : " or a ") + (integer ? "whole " : "") +
           "number in " + range;
  return CLI::Validator(
      [words, lo, hi, shown, integer](std::string& in) -> std::string {
        for (const std::string& w : words)
          if (in == w) return {};
        long double v;
        const bool whole = parse_number(in, &v) && (!integer || in.find_first_of(".eExXpP") ==
                                                                     std::string::npos);
        if (!whole || !std::isfinite(v) || v < lo || v > hi) return in + " is not " + shown;
        return {};
      },
      shown, "WORD|NUMBER");
}

}  // namespace

CLI::Validator Range(long long lo, long long hi) {
  return range_validator(lo, hi, std::to_string(lo) + ".." + std::to_string(hi));
}
CLI::Validator Range(int lo, int hi) {
  return Range(static_cast<long long>(lo), static_cast<long long>(hi));
}
CLI::Validator Range(double lo, double hi) {
  return range_validator(lo, hi, "[" + real_text(lo) + ", " + real_text(hi) + "]");
}
CLI::Validator AtLeast(long long lo) {
  const std::string shown = std::to_string(lo);
  return CLI::Validator(
      [lo, shown](std::string& in) -> std::string {
        long double v;
        if (!parse_number(in, &v)) return {};
        if (std::isnan(v) || v < lo) return in + " is below the minimum " + shown;
        return {};
      },
      ">= " + shown, "ATLEAST");
}

CLI::Validator WordsOrRange(const std::vector<std::string>& words, long long lo, long long hi) {
  return words_or_range(words, lo, hi, std::to_string(lo) + ".." + std::to_string(hi), true);
}
CLI::Validator WordsOrRange(const std::vector<std::string>& words, double lo, double hi) {
  return words_or_range(words, lo, hi, "[" + real_text(lo) + ", " + real_text(hi) + "]", false);
}

bool parse_size(const std::string& text, int* width, int* height) {
  // Digits, 'x', digits: no sign, space or trailing text.
  const size_t x = text.find('x');
  auto side = [](const std::string& d, int* out) {
    if (d.empty() || d.size() > 5 || d.find_first_not_of("0123456789") != std::string::npos)
      return false;
    *out = std::stoi(d);
    return *out >= kImageSideMin && *out <= kImageSideMax;
  };
  int w = 0, h = 0;
  if (x == std::string::npos || !side(text.substr(0, x), &w) || !side(text.substr(x + 1), &h))
    return false;
  *width = w;
  *height = h;
  return true;
}

CLI::Validator SizeWxH() {
  const std::string shown = "WxH with both in " + std::to_string(kImageSideMin) + ".." +
                            std::to_string(kImageSideMax);
  return CLI::Validator(
      [shown](std::string& in) -> std::string {
        int w, h;
        if (parse_size(in, &w, &h)) return {};
        return "'" + in + "' is not " + shown + " (e.g. 1280x720)";
      },
      shown, "SIZE");
}

int parse_options(CLI::App& app, int argc, char** argv) {
  if (argc == 2 && std::string_view(argv[1]) == "--list-options") {
    for (const CLI::Option* opt : app.get_options()) {
      if (opt == app.get_help_ptr() || opt == app.get_help_all_ptr()) continue;
      std::printf("%s\n", opt->get_name().c_str());
    }
    return 0;
  }
  add_implicit_checks(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    return 0;
  } catch (const CLI::CallForAllHelp&) {
    std::fputs(app.help("", CLI::AppFormatMode::All).c_str(), stdout);
    return 0;
  } catch (const CLI::ParseError& e) {
    return fail(one_line(e.what()) + " (see " + app.get_name() + " --help)");
  }
  return -1;
}

int fail(std::string_view message) {
  std::fprintf(stderr, "kvscope: %s\n", printable_name(message).c_str());
  return 1;
}

void notice(std::string_view message) {
  std::fprintf(stderr, "kvscope: %s\n", printable_name(message).c_str());
}

}  // namespace kvscope::cli
