// serve_command.h — `kvscope serve`: the OpenAI-compatible endpoint (serve_command.cpp).
#pragma once

namespace kvscope::serve {

// `kvscope serve ...`: serves until SIGINT/SIGTERM, then returns 0; 1 after one
// "kvscope: ..." line for bad options, a model that does not load or a port in use.
int run_serve(int argc, char** argv);

}  // namespace kvscope::serve
