// cli_common.h — the headless subcommands of the kvscope executable and their helpers,
// and the one way every subcommand parses its options.
//
// Options: the project rule is that every bad option gives one line "kvscope: ..." on
// stderr and exit status 1. A subcommand gets that by declaring its options on a CLI::App
// and parsing with parse_options():
//
//   CLI::App app{"What the command does.", "kvscope mycommand"};
//   app.add_option("--threads", threads, "CPU threads (0 = all)")->check(cli::Range(0, 4096));
//   app.add_option("--temp", temp, "Temperature")->check(cli::Range(0.0, 100.0));
//   if (int rc = cli::parse_options(app, argc, argv); rc >= 0) return rc;
//
// parse_options() prints the help to stdout and returns 0 for --help; turns every CLI11
// error (unknown option, missing value, conversion, validation, exclusions, ...) into one
// "kvscope: ..." line and returns 1; returns -1 when the command should run. Before parsing
// it adds a check to every floating-point option (float, double, vectors of them): NaN,
// infinity and values beyond float's range are rejected whatever else the option checks;
// and one to every unsigned option: "-1" is rejected instead of wrapping around. Options
// added later get both for free.
// Use cli::Range / cli::AtLeast for bounds, not CLI::Range / CLI::NonNegativeNumber: those
// print their bounds as doubles ("1.79769e+308" or 300 digits); ours print "0..4096" for
// integer bounds and "[0, 1]" for real ones, and reject NaN.
// Errors found after parsing (a bad model, a bad prompt) go through cli::fail(), which
// prints one line too: the message is passed through printable_name(), so text from a file
// or the command line (control bytes, a NUL, newlines) cannot break the line or reach the
// terminal as escape sequences.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/backend.h"
#include "engine/model.h"
#include "engine/session.h"
#include "engine/status.h"

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

// Upper bound of every --threads option; values above the hardware's threads are accepted
// and clamped with a notice (make_backend).
inline constexpr int kMaxThreadsOption = 65536;

// Prints "kvscope: <message>" as one line on stderr (message escaped with printable_name)
// and returns 1, the exit status for bad input.
int fail(std::string_view message);
// The same for a note that does not stop the command (e.g. a fallback): one line on stderr.
void notice(std::string_view message);

// `kvscope generate ...`: streams text (or JSON lines with --json). Returns the exit code.
int run_generate(int argc, char** argv);
// `kvscope bench ...`: prefill / decode / NO CACHE timings. Returns the exit code.
int run_bench(int argc, char** argv);
// `kvscope compare ...`: a KV cache configuration against a reference (cli_compare.cpp).
int run_compare(int argc, char** argv);
// `kvscope perplexity ...`: perplexity of a text under a cache configuration.
int run_perplexity(int argc, char** argv);

// A model kvscope knows by name; `scripts/fetch_model.sh NAME` puts its file under
// assets/models/. The first one is the default.
struct BuiltinModel {
  const char* name;  // "smollm2-135m"
  const char* file;  // "SmolLM2-135M-Instruct.Q4_1.gguf"
};
const std::vector<BuiltinModel>& builtin_models();
// Where built-in model files are looked for, in order: assets/models/ next to the
// executable and each of its parent directories, in the source tree, in the cwd.
std::vector<std::string> asset_model_dirs();

// The default model path: $KVSCOPE_MODEL, else assets/models/<default> next to the
// executable's source tree or in the current directory.
std::string default_model_path();
// The file --model names: "" is the default model, a built-in name its file (found as
// the default is), anything else a path. An unknown name that is no file, or a built-in
// model not fetched yet, is one clear error saying what to do.
Expected<std::string> resolve_model(const std::string& name_or_path);
// Loads a model (NAME|PATH as resolve_model) with one clear message on failure.
Expected<std::shared_ptr<Model>> load_model(const std::string& name_or_path);
// Backend by name: "auto", "cpu", "cuda". `notice` receives a one-line note when auto
// falls back to the CPU (gpu_fallback_notice) or when `threads` is clamped to the
// hardware. An error when the CPU threads cannot be started.
Expected<std::unique_ptr<Backend>> make_backend(const std::string& name, const Model& model,
                                                int threads, std::string* notice);

// A session with `cfg` on the model `model` names (load_model; "" is the default) and the
// backend `backend` names (make_backend, with `threads` and `notice`): how generate and
// record start. Errors are load_model's, make_backend's or Session::create's, unchanged.
Expected<std::unique_ptr<Session>> open_session(const std::string& model,
                                                const std::string& backend, int threads,
                                                const SessionConfig& cfg, std::string* notice);

// The one plain sentence shown when `auto` falls back to the CPU, from the CUDA backend's
// error (e.g. "cuda: no usable GPU: no CUDA-capable device; use the CPU backend" becomes
// "No usable GPU (no CUDA-capable device); running on the CPU backend.").
std::string gpu_fallback_notice(const std::string& cuda_error);

}  // namespace kvscope::cli
