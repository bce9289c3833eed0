// gui_loop.cpp — window, engine start, frame pacing and the per-frame order (canonical
// Dear ImGui order): events in, the UI around the free rectangle, the 3D view in it,
// pointer routing to the camera only over that rectangle, PNG export of the view.
#include "app/ui/gui_loop.h"

#include <GLFW/glfw3.h>
#include <imgui.h>
#include <imgui_impl_glfw.h>
#include <imgui_impl_opengl3.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "app/options/options.h"
#include "app/ui/app_capture.h"
#include "app/ui/app_frame.h"
#include "app/ui/input_queue.h"
#include "app/ui/ui_events.h"
#include "app/scene/scene_view.h"
#include "app/ui/ui_state.h"
#include "app/ui/window.h"
#include "render/gl.h"
#include "render/offscreen.h"

namespace kvscope::app {
namespace {

// Lowers the calling thread's priority (Linux nice values are per thread; threads it
// starts later, such as llvmpipe's rasterizers, inherit it). Failure is harmless.
void lower_ui_priority(int nice) {
  if (nice <= 0) return;
  pid_t tid = pid_t(syscall(SYS_gettid));
  errno = 0;
  int now = getpriority(PRIO_PROCESS, id_t(tid));
  if (errno == 0) setpriority(PRIO_PROCESS, id_t(tid), std::min(now + nice, 19));
}

// The engine's decode step times and the frame work while they ran (--measure).
struct Measurement {
  int target = 0;
  std::vector<double> engine_ms;  // decode steps (the prefill step is left out)
  int frames = 0;
  double frame_work_ms = 0;  // UI thread time per drawn frame, summed
  double t0 = -1, t1 = -1;
  uint64_t rss_first = 0;  // resident bytes when the first decode step arrived
  bool done() const { return target > 0 && int(engine_ms.size()) >= target; }
  void print() const {
    std::vector<double> v = engine_ms;
    std::sort(v.begin(), v.end());
    double mean = v.empty() ? 0 : std::accumulate(v.begin(), v.end(), 0.0) / double(v.size());
    double median = v.empty() ? 0 : v[v.size() / 2];
    std::printf(
        "{\"measure\": \"app\", \"decode_steps\": %zu, \"engine_ms_mean\": %.3f, "
        "\"engine_ms_median\": %.3f, \"frames\": %d, \"frame_work_ms_mean\": %.2f, "
        "\"frames_per_s\": %.1f, \"wall_s\": %.2f, \"rss_first_mb\": %.1f, "
        "\"rss_last_mb\": %.1f, \"rss_peak_mb\": %.1f}\n",
        v.size(), mean, median, frames, frames ? frame_work_ms / frames : 0.0,
        t1 > t0 ? frames / (t1 - t0) : 0.0, t1 - t0, double(rss_first) / 1e6,
        double(process_resident_bytes()) / 1e6, double(process_peak_resident_bytes()) / 1e6);
    std::fflush(stdout);
  }
};

}  // namespace

double frame_wait(const FramePace& p) {
  if (p.input_waiting) return 0.0;
  const bool wanted = p.changed || p.animating || p.slow;
  if (!wanted) return kIdleWait;
  const double busy_fps = std::clamp(kBusyShare * p.cores * 1000.0 / std::max(p.frame_ms, 0.1),
                                     kBusyFpsMin, kBusyFpsMax);
  double min_dt = 1.0 / (p.engine_busy ? busy_fps : kActiveFps);
  if (p.slow && !p.changed && !p.animating) min_dt = std::max(min_dt, kSlowFrame);
  const double left = min_dt - p.since_draw;
  return left < 0.0005 ? 0.0 : left;  // within half a millisecond: now
}

namespace {

// The UI state the command line asks for, before the engine starts.
UiState initial_ui(const GuiOptions& o) {
  UiState ui;
  ui.prompts = load_prompts();
  ui.view = o.cap.view;
  ui.preset = o.cap.camera;
  ui.serving = o.serving;
  ui.mode = o.cap.mode;
  if (o.measure_steps > 0) ui.max_tokens = std::max(ui.max_tokens, o.measure_steps + 2);
  if (o.cap.max_tokens > 0) ui.max_tokens = o.cap.max_tokens;
  if (o.cap.speed < 0 || o.measure_steps > 0) ui.speed_max = true;
  if (o.cap.speed > 0) ui.speed = o.cap.speed;
  if (!o.cap.prompt_file.empty()) {
    auto p = read_prompt_file(o.cap.prompt_file);
    if (p.ok())
      ui.prompts.insert(ui.prompts.begin(), {"file", p.value()});
    else
      ui.error = p.error().message;
  }
  return ui;
}

// What the frame loop carries from one frame to the next.
struct LoopState {
  int input_events = 0;  // window input since the last look (install_input_callbacks)
  InputQueue input;      // the window's input, handed to ImGui a frame at a time
  int settle = 3;        // frames still to draw after the last change
  int frame = 0;
  double last_time = 0, last_draw = -1.0;
  double frame_ms = 20.0;  // recent cost of one frame's work (moving average)
  double cores = 1;
  double last_mx = 0, last_my = 0;
  bool dragging_view = false;  // a drag that started in the 3D view (keeps going over panels)
};

static_assert(kKeyLeftShift == GLFW_KEY_LEFT_SHIFT && kKeyLeftControl == GLFW_KEY_LEFT_CONTROL &&
                  kKeyLeftAlt == GLFW_KEY_LEFT_ALT && kKeyLeftSuper == GLFW_KEY_LEFT_SUPER &&
                  kKeyRightShift == GLFW_KEY_RIGHT_SHIFT &&
                  kKeyRightControl == GLFW_KEY_RIGHT_CONTROL &&
                  kKeyRightAlt == GLFW_KEY_RIGHT_ALT && kKeyRightSuper == GLFW_KEY_RIGHT_SUPER &&
                  kMouseButtons <= GLFW_MOUSE_BUTTON_LAST + 1,
              "input_queue.h's key codes are GLFW's");

// Any window input wakes the loop and asks for a few frames (ImGui settles in two); the
// buttons, keys, characters, wheel, pointer moves and focus changes go into the loop's input
// queue, in order, for ImGui to take a frame at a time (input_queue.h).
LoopState* loop_of(GLFWwindow* w) {
  return static_cast<LoopState*>(glfwGetWindowUserPointer(w));
}
void note_input(GLFWwindow* w) {
  if (LoopState* ls = loop_of(w)) ++ls->input_events;
}
void queue_input(GLFWwindow* w, const InputEvent& e) {
  if (LoopState* ls = loop_of(w)) {
    ++ls->input_events;
    ls->input.push(e);
  }
}
// Call after ImGui_ImplGlfw_InitForOpenGL(win, false): these replace the backend's own
// callbacks, which would write each press straight into the frame's state, where a press and
// release between two frames cancel out. Entering and leaving still go to the backend (it
// places the pointer from them).
void install_input_callbacks(GLFWwindow* w, LoopState* ls) {
  glfwSetWindowUserPointer(w, ls);
  glfwSetCursorPosCallback(w, [](GLFWwindow* win, double x, double y) {
    queue_input(win, InputEvent::pos(float(x), float(y)));
  });
  glfwSetMouseButtonCallback(w, [](GLFWwindow* win, int button, int action, int) {
    queue_input(win, InputEvent::button(button, action == GLFW_PRESS));
  });
  glfwSetScrollCallback(w, [](GLFWwindow* win, double x, double y) {
    queue_input(win, InputEvent::wheel(float(x), float(y)));
  });
  glfwSetKeyCallback(w, [](GLFWwindow* win, int key, int, int action, int) {
    if (action == GLFW_REPEAT)  // ImGui repeats held keys itself
      note_input(win);
    else
      queue_input(win, InputEvent::key(key, action == GLFW_PRESS));
  });
  glfwSetCharCallback(
      w, [](GLFWwindow* win, unsigned c) { queue_input(win, InputEvent::character(c)); });
  glfwSetWindowFocusCallback(
      w, [](GLFWwindow* win, int focused) { queue_input(win, InputEvent::focus(focused != 0)); });
  glfwSetCursorEnterCallback(w, [](GLFWwindow* win, int entered) {
    ImGui_ImplGlfw_CursorEnterCallback(win, entered);
    note_input(win);
  });
  glfwSetFramebufferSizeCallback(w, [](GLFWwindow* win, int, int) { note_input(win); });
  glfwSetWindowRefreshCallback(w, [](GLFWwindow* win) { note_input(win); });
}

// Waits until a frame is due: something changed, and the cap allows it. The events wait in
// the controller's queue until the frame takes them, where only the newest step keeps its
// attention rows (controller.h, "Queued steps"). Returns the controller's state then.
ControllerState wait_for_frame(GLFWwindow* win, const GuiOptions& o, Controller* ctl,
                               const UiState& ui, const SceneView& view, LoopState& ls) {
  const ImGuiIO& io = ImGui::GetIO();
  ControllerState cs;
  for (;;) {
    glfwPollEvents();
    bool events = false;
    if (ctl) {
      events = ctl->has_events();
      cs = ctl->state();
    }
    if (ls.input_events > 0) {
      ls.input_events = 0;
      ls.settle = 3;
    }
    FramePace pace;
    pace.input_waiting = ls.input.urgent();
    pace.changed = ls.settle > 0 || events || o.quit_after > 0 || glfwWindowShouldClose(win) ||
                   !ls.input.empty();
    pace.animating = view.animating();
    if (ui.serving && ui.serving_ui)
      pace.animating = ui.serving_ui->playing || ui.serving_ui->view.animating();
    // A focused text field's cursor blinks and timed notices expire.
    pace.slow = io.WantTextInput || std::any_of(ui.notices.begin(), ui.notices.end(),
                                                [](const Notice& n) { return n.seconds > 0; });
    pace.engine_busy = cs.busy || (cs.playing && cs.speed <= kSpeedMax);
    pace.since_draw = glfwGetTime() - ls.last_draw;
    pace.frame_ms = ls.frame_ms;
    pace.cores = ls.cores;
    const double wait = frame_wait(pace);
    if (wait <= 0) return cs;
    glfwWaitEventsTimeout(wait);  // input wakes it early
  }
}

// Applies the controller's events to the UI and the timeline; --measure notes the decode
// steps' times and the resident memory when the first one arrived.
void take_events(UiState& ui, Controller* ctl, Timeline& tl, std::vector<Event>& pending,
                 double now, Measurement& measure) {
  for (Event& e : pending) {
    if (ctl) apply_event(ui, *ctl, tl, e, now);
    if (e.kind != Event::Kind::Step || measure.target <= 0 || !e.trace || e.trace->step < 2 ||
        measure.done())
      continue;
    if (measure.t0 < 0) {
      measure.t0 = now;
      measure.rss_first = process_resident_bytes();
    }
    measure.engine_ms.push_back(e.trace->ms);
    measure.t1 = now;
  }
  pending.clear();
}

// A drawn frame's work since work_start: the moving average that paces frames (and the
// panel shows), and --measure's count of frames while the decode steps it times ran.
void note_frame_work(std::chrono::steady_clock::time_point work_start, LoopState& ls, UiState& ui,
                     Measurement& measure) {
  const double work_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - work_start)
          .count();
  ls.frame_ms += 0.2 * (work_ms - ls.frame_ms);
  ui.frame_work_ms = ls.frame_ms;
  if (measure.t0 >= 0 && !measure.done()) {
    ++measure.frames;
    measure.frame_work_ms += work_ms;
  }
}

// The pointer, for the camera: only over the view and when ImGui does not want it.
ViewInput read_pointer(GLFWwindow* win, const UiState& ui, LoopState& ls) {
  const ImGuiIO& io = ImGui::GetIO();
  double mx, my;
  glfwGetCursorPos(win, &mx, &my);
  ViewInput in;
  in.mouse_x = float(mx);
  in.mouse_y = float(my);
  in.dx = float(mx - ls.last_mx);
  in.dy = float(my - ls.last_my);
  in.hover = !io.WantCaptureMouse && ui.splitter_drag == 0 &&
             ui.layout.view.contains(in.mouse_x, in.mouse_y);
  // The buttons as ImGui sees them this frame (from the input queue).
  bool left = io.MouseDown[0];
  bool other = io.MouseDown[1] || io.MouseDown[2];
  if (!left && !other)
    ls.dragging_view = false;
  else if (in.hover &&
           (ImGui::IsMouseClicked(0) || ImGui::IsMouseClicked(1) || ImGui::IsMouseClicked(2)))
    ls.dragging_view = true;
  in.orbit = ls.dragging_view && left;
  in.pan = ls.dragging_view && other && !left;
  in.wheel = in.hover ? io.MouseWheel : 0.0f;
  ls.last_mx = mx;
  ls.last_my = my;
  return in;
}

// What the 3D view needs this frame from the UI; takes the one-shot requests (a preset
// change, a token to look at).
ViewFrame view_frame(UiState& ui, const Timeline& tl, const ControllerState& cs, double now,
                     float dt) {
  ViewFrame vf;
  vf.timeline = &tl;
  vf.view = scene_options(ui);
  vf.view.hovered_pos = ui.panel_hovered_pos >= 0 ? ui.panel_hovered_pos : ui.hovered_pos;
  vf.clock = AnimClock{now - ui.last_step_time, cs.busy, now};
  vf.preset = ui.preset;
  vf.preset_changed = ui.preset_changed;
  vf.rect = ui.layout.view;
  vf.dt = dt;
  vf.look_at_pos = ui.look_at_pos;
  ui.preset_changed = false;
  ui.look_at_pos = -1;
  return vf;
}

// Export PNG (the toolbar's button, then the save dialog): the 3D view alone, at its size
// on screen, into the file the dialog chose.
void export_view(UiState& ui, render::Renderer& renderer, const SceneView& view, float fb_scale) {
  ui.export_png = false;
  render::Viewport vp = to_viewport(ui.layout.view, fb_scale);
  auto path =
      ui.export_png_path.empty()
          ? export_view_png(renderer, view.scene(), vp.width, vp.height, ".")
          : export_view_png_to(renderer, view.scene(), vp.width, vp.height, ui.export_png_path);
  if (path.ok())
    add_notice(ui, "Saved the view as " + path.value(), 8.0);
  else
    ui.error = "Could not export the view: " + path.error().message;
}

// --window-shot: the last frame as drawn, panels included.
void save_window_shot(const std::string& path, int fbw, int fbh) {
  Expected<std::vector<uint8_t>> rgba = render::read_window_rgba(fbw, fbh);
  Status st = rgba.ok() ? render::write_png(path, fbw, fbh, *rgba) : rgba.error();
  if (!st.ok()) cli::notice(st.message());
}

std::unique_ptr<render::Renderer> make_renderer(UiState& ui) {
  render::RendererOptions ro;
  ro.shader_dir = render::find_shader_dir(executable_dir());
  auto r = render::Renderer::create(ro);
  if (r.ok()) return std::move(r).value();
  ui.error = r.error().message;  // the panels still work; the view stays empty
  return nullptr;
}

}  // namespace

int run_measure_offscreen(const GuiOptions& o, const std::string& png_path) {
  auto gl = OffscreenContext::create();
  if (!gl.ok()) return cli::fail(gl.error().message);
  const int width = o.cap.width, height = o.cap.height;
  Expected<render::OffscreenTarget> target_or = render::OffscreenTarget::create(width, height, 4);
  if (!target_or.ok()) return cli::fail(target_or.error().message);
  render::OffscreenTarget& target = *target_or;

  UiState ui = initial_ui(o);
  std::unique_ptr<Controller> ctl = start_controller(ui, o.cap, true);
  lower_ui_priority(o.ui_nice);
  IMGUI_CHECKVERSION();
  ImGui::CreateContext();
  ImGuiIO& io = ImGui::GetIO();
  setup_imgui_style(1.0f);
  ImGui_ImplOpenGL3_Init("#version 330 core");
  std::unique_ptr<render::Renderer> renderer = make_renderer(ui);

  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto seconds = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  Timeline tl;
  SceneView view;
  Measurement measure;
  measure.target = o.measure_steps;
  std::vector<Event> pending;
  LoopState ls;
  ls.cores = std::max(1u, std::thread::hardware_concurrency());
  ls.last_time = seconds();
  std::string error;
  for (;;) {
    // The window loop's pacing (frame_wait), with no input: a frame when an engine event
    // came, the view animates or frames still settle, at most the cap while it computes.
    ControllerState cs = ctl->state();
    FramePace pace;
    pace.changed = ls.settle > 0 || ctl->has_events();
    pace.animating = view.animating();
    pace.engine_busy = cs.busy || (cs.playing && cs.speed <= kSpeedMax);
    pace.since_draw = seconds() - ls.last_draw;
    pace.frame_ms = ls.frame_ms;
    pace.cores = ls.cores;
    if (const double wait = frame_wait(pace); wait > 0) {
      std::this_thread::sleep_for(std::chrono::duration<double>(wait));
      continue;
    }
    for (Event& e : ctl->poll()) pending.push_back(std::move(e));
    const auto work_start = Clock::now();
    ls.settle = std::max(ls.settle - 1, 0);
    io.DisplaySize = ImVec2(float(width), float(height));
    io.DisplayFramebufferScale = ImVec2(1.0f, 1.0f);
    ImGui_ImplOpenGL3_NewFrame();
    ImGui::NewFrame();
    const double now = seconds();
    const float dt = float(now - ls.last_time);
    io.DeltaTime = std::max(dt, 1e-4f);
    ls.last_time = now;
    ls.last_draw = now;
    take_events(ui, ctl.get(), tl, pending, now, measure);
    sync_frame(ui, tl, now);
    draw_frame_ui(ui, ctl.get(), cs, tl, ShownRange{view.shown_first(), view.shown_last()});
    view.update(view_frame(ui, tl, cs, now, dt), ViewInput{});
    ImGui::Render();
    target.bind();
    render::clear_framebuffer(width, height, 0.06f, 0.065f, 0.08f);
    if (renderer) view.draw(*renderer, width, height, 1.0f);
    ImGui_ImplOpenGL3_RenderDrawData(ImGui::GetDrawData());
    // A window's buffer swap waits for the frame's drawing; here the frame is finished
    // before the next, so the GPU's drawing is in the frame's work as on a display.
    render::finish();
    ++ls.frame;
    note_frame_work(work_start, ls, ui, measure);
    if (!ui.error.empty()) {
      error = ui.error;
      break;
    }
    if (measure.done() || (tl.finished() && tl.last())) break;
  }
  if (error.empty()) {
    measure.print();
    Expected<std::vector<uint8_t>> rgba = target.read_rgba();
    if (rgba.ok()) {
      for (size_t i = 3; i < rgba->size(); i += 4) (*rgba)[i] = 255;  // opaque, as a screenshot
      if (Status st = render::write_png(png_path, width, height, *rgba); !st.ok())
        error = st.message();
      else
        std::printf("kvscope: wrote %s (the last frame); %s\n", png_path.c_str(),
                    gl.value()->description().c_str());
    } else {
      error = rgba.error().message;
    }
  }
  render::OffscreenTarget::bind_default();
  ctl.reset();
  renderer.reset();
  ImGui_ImplOpenGL3_Shutdown();
  ImGui::DestroyContext();
  return error.empty() ? 0 : cli::fail(error);
}

int run_gui(const GuiOptions& o) {
  use_mapped_memory_for_large_blocks();  // bounded memory over thousands of steps
  UiState ui = initial_ui(o);

  // The engine first: its worker starts at normal priority and opens the model (or the
  // recording) there, so the backend's threads inherit that priority and a model that fails
  // to load leaves a usable UI. Then the UI thread (and every thread the window and GL start
  // from it) steps back.
  // A serving recording is the Serving view's; the single view runs the model meanwhile.
  CaptureOptions single = o.cap;
  if (o.serving) single.replay_path.clear();
  std::unique_ptr<Controller> ctl = start_controller(ui, single, o.play || o.measure_steps > 0);
  lower_ui_priority(o.ui_nice);

  WindowOptions wo;
  if (o.size_given) {
    wo.width = o.cap.width;
    wo.height = o.cap.height;
  }
  auto window = GlWindow::create(wo);
  if (!window.ok()) return cli::fail(window.error().message);
  GLFWwindow* win = window.value()->handle();
  LoopState ls;

  IMGUI_CHECKVERSION();
  ImGui::CreateContext();
  ImGuiIO& io = ImGui::GetIO();
  setup_imgui_style(window.value()->content_scale());
  ImGui_ImplGlfw_InitForOpenGL(win, false);
  install_input_callbacks(win, &ls);
  ImGui_ImplOpenGL3_Init("#version 330 core");
  std::unique_ptr<render::Renderer> renderer = make_renderer(ui);

  // Scripted runs (--frames, --measure) park the pointer on the toolbar's empty end, so
  // a window shot shows no hover tooltip wherever the display put the pointer.
  if (o.quit_after > 0 || o.measure_steps > 0) {
    int ww = 0, wh = 0;
    glfwGetWindowSize(win, &ww, &wh);
    glfwSetCursorPos(win, std::max(ww - 4, 0), 4);
  }

  Timeline tl;
  SceneView view;
  Measurement measure;
  measure.target = o.measure_steps;
  std::vector<Event> pending;
  ls.last_time = glfwGetTime();
  ls.cores = std::max(1u, std::thread::hardware_concurrency());
  while (!glfwWindowShouldClose(win)) {
    const ControllerState cs = wait_for_frame(win, o, ctl.get(), ui, view, ls);
    if (glfwWindowShouldClose(win)) break;
    if (ctl)
      for (Event& e : ctl->poll()) pending.push_back(std::move(e));
    const auto work_start = std::chrono::steady_clock::now();
    ls.settle = std::max(ls.settle - 1, 0);

    ImGui_ImplOpenGL3_NewFrame();
    ImGui_ImplGlfw_NewFrame();
    apply_frame_input(ls.input.take_frame(io.WantTextInput), io);
    ImGui::NewFrame();
    const double now = glfwGetTime();
    const float dt = float(now - ls.last_time);
    ls.last_time = now;
    ls.last_draw = now;
    take_events(ui, ctl.get(), tl, pending, now, measure);
    sync_frame(ui, tl, now);

    ServingUi* serving = nullptr;
    if (ui.serving) {
      if (!ui.serving_ui) {
        ui.serving_ui = std::make_shared<ServingUi>();
        ui.serving_ui->settings = o.serving_settings;
        if (o.serving && !o.cap.replay_path.empty()) {
          if (Status st = serving_open_replay(*ui.serving_ui, o.cap.replay_path); !st.ok())
            ui.error = st.message();
          else
            ui.serving_ui->playing = o.play || o.quit_after > 0;
        } else if (o.serving && (o.play || o.quit_after > 0)) {
          serving_start(ui, *ui.serving_ui, true);
        }
      }
      serving = ui.serving_ui.get();
      serving_sync(*serving, now);
      draw_serving_ui(ui, *serving);
      const ViewInput in = read_pointer(win, ui, ls);
      serving->view.update(serving_frame(ui, *serving, now, dt), in);
      const bool click =
          in.hover && ImGui::IsMouseReleased(0) && io.MouseDragMaxDistanceSqr[0] < 16.0f;
      serving_overlay(ui, *serving, click);
    } else {
      draw_frame_ui(ui, ctl.get(), cs, tl, ShownRange{view.shown_first(), view.shown_last()});
      const ViewInput in = read_pointer(win, ui, ls);
      view.update(view_frame(ui, tl, cs, now, dt), in);
      ui.hovered_pos = view.hovered_token();
      if (ui.hovered_pos >= 0) panel_inspector(ui, tl);
    }

    ImGui::Render();
    int fbw = 0, fbh = 0;
    window.value()->framebuffer_size(&fbw, &fbh);
    float fb_scale = io.DisplaySize.x > 0 ? float(fbw) / io.DisplaySize.x : 1.0f;
    render::clear_framebuffer(fbw, fbh, 0.06f, 0.065f, 0.08f);
    if (renderer && fbw > 0 && fbh > 0) {
      if (serving)
        serving->view.draw(*renderer, fbw, fbh, fb_scale);
      else
        view.draw(*renderer, fbw, fbh, fb_scale);
    }
    ImGui_ImplOpenGL3_RenderDrawData(ImGui::GetDrawData());
    if (ui.export_png && renderer && !serving) export_view(ui, *renderer, view, fb_scale);
    ++ls.frame;
    bool last_frame = (o.quit_after > 0 && ls.frame >= o.quit_after) || measure.done() ||
                      (measure.target > 0 && tl.finished() && tl.last());
    if (last_frame && !o.window_shot.empty()) save_window_shot(o.window_shot, fbw, fbh);
    glfwSwapBuffers(win);
    note_frame_work(work_start, ls, ui, measure);
    if (last_frame) glfwSetWindowShouldClose(win, GLFW_TRUE);
  }
  if (measure.target > 0) measure.print();

  // Closing is immediate for the person: the window goes at once; then the worker finishes
  // the step in flight (nothing queued runs) and is joined.
  glfwHideWindow(win);
  glfwPollEvents();
  glfwSetCursorEnterCallback(win, nullptr);  // it forwards to the backend, shut down below
  if (ui.serving_ui) ui.serving_ui->run.reset();
  ctl.reset();
  renderer.reset();
  ImGui_ImplOpenGL3_Shutdown();
  ImGui_ImplGlfw_Shutdown();
  ImGui::DestroyContext();
  return 0;
}

}  // namespace kvscope::app
