// cli_record.h — `kvscope record` (a run to a run file) and `kvscope export` (a run file's
// per-step numbers as CSV). Both exit 0 on success, else print one "kvscope: ..." line and
// exit 1.
#pragma once

namespace kvscope::cli {

int run_record(int argc, char** argv);
int run_export(int argc, char** argv);

}  // namespace kvscope::cli
