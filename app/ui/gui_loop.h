// gui_loop.h — the desktop app's window loop.
//
// Thread split: the engine runs on the controller's worker thread plus its backend's
// pool threads, at normal priority; the UI (events, panels, scene building, drawing, and
// with software OpenGL the rasterizer threads it starts) runs on the main thread at a
// lower priority (ui_nice). Frames are drawn only when something changed. While a step
// computes or the engine plays flat out, the frame rate is capped so that drawing takes
// at most kBusyShare of the machine's cores, from the measured cost of a frame (software
// OpenGL: a few frames a second; a GPU: up to kBusyFpsMax), so it never starves the engine.
#pragma once

#include <string>

#include "app/scene/capture.h"
#include "app/ui/serving_ui.h"

namespace kvscope::app {

inline constexpr double kActiveFps = 60.0;  // cap while animating or handling input
inline constexpr double kBusyShare = 0.05;  // of all cores, for frames while the engine computes
inline constexpr double kBusyFpsMin = 2.0, kBusyFpsMax = 20.0;
inline constexpr double kSlowFrame = 0.25;  // a blinking cursor, a notice's timer
inline constexpr double kIdleWait = 0.05;   // nothing to draw: look for engine events this often

// What decides when the next frame is drawn.
struct FramePace {
  bool input_waiting = false;  // a press, release, key or character waits: draw now
  bool changed = false;        // input, a controller event, frames still settling
  bool animating = false;      // the camera or a step's animation is moving
  bool slow = false;           // only a cursor blink or a notice timer wants frames
  bool engine_busy = false;    // a step is computing, or the engine plays flat out
  double since_draw = 0;       // seconds since the last frame
  double frame_ms = 20;        // what a frame's work costs lately
  double cores = 1;            // hardware threads
};
// Seconds to wait before the next frame (input wakes the wait early); 0: draw now. Input
// waiting in the queue comes before the cap: the UI answers a click within a frame or two
// however slow frames are (only the pointer's moves wait for the cap).
double frame_wait(const FramePace& p);

struct GuiOptions {
  CaptureOptions cap;       // model, backend, prompt file, mode, camera, view, size
  bool size_given = false;  // cap.width/height set the window size
  bool play = false;        // start playing right away
  int quit_after = 0;       // > 0: close after this many frames (smoke tests)
  std::string window_shot;  // save the last frame, panels included, as a PNG
  // > 0: play this many steps as fast as possible, print the engine's step times and the
  // frame work as one JSON line, and close (the app-versus-CLI speed measurement).
  int measure_steps = 0;
  int ui_nice = 5;  // added to the UI thread's nice value (0: leave it)
  // --view serving: open on the Serving view with these settings (its run starts at once
  // with --play).
  bool serving = false;
  ServingSettings serving_settings;
};

// Opens the window and runs until it closes; returns the exit code.
int run_gui(const GuiOptions& opts);

// --measure with --screenshot PNG: the same measurement with no window or display. The
// app's frames (panels and 3D view, paced as the window loop paces them) are drawn into an
// offscreen framebuffer at --size while the engine plays flat out; the JSON line is the
// window's, and the last frame is written to PNG.
int run_measure_offscreen(const GuiOptions& opts, const std::string& png_path);

}  // namespace kvscope::app
