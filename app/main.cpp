// main.cpp — the kvscope executable: headless subcommands, else the desktop app.
#include <cstdio>
#include <cstring>

#include "app/cli/commands.h"
#include "app/options/options.h"

#if defined(KVSCOPE_WITH_APP)
#include "app/ui/app_main.h"
#endif
#if defined(KVSCOPE_WITH_SERVE)
#include "app/serve/serve_command.h"
#endif

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "generate") == 0)
    return kvscope::cli::run_generate(argc - 1, argv + 1);
  if (argc >= 2 && std::strcmp(argv[1], "bench") == 0)
    return kvscope::cli::run_bench(argc - 1, argv + 1);
  if (argc >= 2 && std::strcmp(argv[1], "compare") == 0)
    return kvscope::cli::run_compare(argc - 1, argv + 1);
  if (argc >= 2 && std::strcmp(argv[1], "perplexity") == 0)
    return kvscope::cli::run_perplexity(argc - 1, argv + 1);
  if (argc >= 2 && std::strcmp(argv[1], "record") == 0)
    return kvscope::cli::run_record(argc - 1, argv + 1);
  if (argc >= 2 && std::strcmp(argv[1], "batch") == 0)
    return kvscope::cli::run_batch(argc - 1, argv + 1);
  if (argc >= 2 && std::strcmp(argv[1], "export") == 0)
    return kvscope::cli::run_export(argc - 1, argv + 1);
  if (argc >= 2 && std::strcmp(argv[1], "serve") == 0) {
#if defined(KVSCOPE_WITH_SERVE)
    return kvscope::serve::run_serve(argc - 1, argv + 1);
#else
    return kvscope::cli::fail(
        "serve: built without cpp-httplib (install libcpp-httplib-dev, e.g. with "
        "scripts/setup.sh, and configure again)");
#endif
  }
#if defined(KVSCOPE_WITH_APP)
  if (argc >= 2 && std::strcmp(argv[1], "bench-render") == 0)
    return kvscope::app::run_bench_render(argc - 1, argv + 1);
  return kvscope::app::run_app(argc, argv);
#else
  kvscope::cli::fail(
      "built without the desktop app (KVSCOPE_APP=OFF); use `kvscope generate`, `bench`, "
      "`compare`, `perplexity` or `batch`");
  return 2;
#endif
}
