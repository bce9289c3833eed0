// commands.h — the headless subcommands of the kvscope executable. Each takes the
// arguments after its name, parses them with cli::parse_options (app/options/options.h)
// and returns the exit code: 0 on success, else 1 after one "kvscope: ..." line.
#pragma once

namespace kvscope::cli {

// `kvscope generate ...`: streams text (or JSON lines with --json). Returns the exit code.
int run_generate(int argc, char** argv);
// `kvscope bench ...`: prefill / decode / NO CACHE timings. Returns the exit code.
int run_bench(int argc, char** argv);
// `kvscope compare ...`: a KV cache configuration against a reference (compare.cpp).
int run_compare(int argc, char** argv);
// `kvscope perplexity ...`: perplexity of a text under a cache configuration.
int run_perplexity(int argc, char** argv);
// `kvscope record ...`: a run to a run file (docs/run_file.md).
// `kvscope export ...`: a run file's per-step numbers as CSV.
int run_record(int argc, char** argv);
// `kvscope batch ...`: many prompts served at once from one KV block pool (batch.cpp).
int run_batch(int argc, char** argv);
int run_export(int argc, char** argv);

}  // namespace kvscope::cli
