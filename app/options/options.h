// options.h — the one way every command of the kvscope executable (the subcommands and
// the app itself) parses its options, and the one printer of its errors.
//
// Options: the project rule is that every bad option gives one line "kvscope: ..." on
// stderr and exit status 1. A subcommand gets that by declaring its options on a CLI::App
// and parsing with parse_options():
//
//   CLI::App app{"What the command does.", "kvscope mycommand"};
//   cli::EngineArgs engine;
//   cli::add_engine_options(app, engine);  // --model, --backend, --threads
//   app.add_option("--rounds", rounds, "Repeats")->check(cli::Range(1, 100));
//   if (int rc = cli::parse_options(app, argc, argv); rc >= 0) return rc;
//
// An option that another command has already comes from its group (engine_options.h,
// kv_options.h, prompt_options.h, sampler_options.h, capture_options.h), never a second
// add_option: each option's bound and help are written once, and tests/cli/all_options.sh
// checks that a shared option gives the same message in every command.
// The engine, capture and window groups are named *Args (cli::EngineArgs, ...): they hold
// the command line's words, which app/ui/app_main.cpp turns into the app's own settings
// (app::EngineOptions, app::CaptureOptions, app::WindowOptions).
//
// parse_options() prints the help to stdout and returns 0 for --help; turns every CLI11
// error (unknown option, missing value, conversion, validation, exclusions, ...) into one
// "kvscope: ..." line and returns 1; returns -1 when the command should run. Before parsing
// it adds a check to every floating-point option (float, double, vectors of them): NaN,
// infinity and values beyond float's range are rejected whatever else the option checks;
// and one to every unsigned option: "-1" is rejected instead of wrapping around. Options
// added later get both for free.
// `kvscope [COMMAND] --list-options` (alone, not shown in the help) prints the command's
// options, one name a line, and returns 0: the CLI test checks it covers each of them.
// Use cli::Range / cli::AtLeast for bounds, not CLI::Range / CLI::NonNegativeNumber: those
// print their bounds as doubles ("1.79769e+308" or 300 digits); ours print "0..4096" for
// integer bounds and "[0, 1]" for real ones, and reject NaN.
// Errors found after parsing (a bad model, a bad prompt) go through cli::fail(), which
// prints one line too: the message is passed through printable_name(), so text from a file
// or the command line (control bytes, a NUL, newlines) cannot break the line or reach the
// terminal as escape sequences.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace kvscope::cli {


// Parses argv into the options declared on `app` (see the file comment). Returns -1 to
// run the command, else the exit code to return (0 after --help, 1 after an error).
int parse_options(CLI::App& app, int argc, char** argv);

// The value lies in [lo, hi] (both inclusive). Integer bounds print as "lo..hi", real
// bounds as "[lo, hi]"; NaN is outside every range.
CLI::Validator Range(long long lo, long long hi);
CLI::Validator Range(int lo, int hi);
CLI::Validator Range(double lo, double hi);
// The value is at least lo (an integer option's upper end is its type's limit).
CLI::Validator AtLeast(long long lo);

// The value is one of `words` (e.g. "max") or a number in [lo, hi]: a whole number for
// the integer form, any finite number for the real one. Unlike Range, a value that is
// neither is refused here ("xyz is not mean, max or a number in 0..4095"), as such an
// option is a string.
CLI::Validator WordsOrRange(const std::vector<std::string>& words, long long lo, long long hi);
CLI::Validator WordsOrRange(const std::vector<std::string>& words, double lo, double hi);

// An image size WxH (e.g. 1280x720), both sides in kImageSideMin..kImageSideMax, nothing
// after it: the app's --size and bench-render's --size.
inline constexpr int kImageSideMin = 16, kImageSideMax = 8192;
bool parse_size(const std::string& text, int* width, int* height);
CLI::Validator SizeWxH();

// Prints "kvscope: <message>" as one line on stderr (message escaped with printable_name)
// and returns 1, the exit status for bad input.
int fail(std::string_view message);
// The same for a note that does not stop the command (e.g. a fallback): one line on stderr.
void notice(std::string_view message);

}  // namespace kvscope::cli
