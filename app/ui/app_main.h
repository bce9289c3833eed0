// app_main.h — the GUI entry point (also handles --screenshot) and the render benchmark.
#pragma once

namespace kvscope::app {

// `kvscope [--model PATH] [--backend auto|cpu|cuda] [--prompt-file F] [--mode cache|nocache]
//  [--camera PRESET] [--layer L --head H] [--size WxH] [--steps N] [--screenshot OUT]`.
// Returns the exit code.
int run_app(int argc, char** argv);
// `kvscope bench-render [--frames N] [--size WxH] [--layers L]`: frame time and draw calls
// for synthetic scenes of 256, 1024 and 4096 tokens.
int run_bench_render(int argc, char** argv);

}  // namespace kvscope::app
