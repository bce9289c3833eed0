// app_main.cpp — argument parsing and the window loop (canonical Dear ImGui frame order):
// events in, the UI around the free rectangle, the 3D view in it, pointer routing to the
// camera only over that rectangle, PNG export of the view.
#include "app/app_main.h"

#include <GLFW/glfw3.h>
#include <imgui.h>
#include <imgui_impl_glfw.h>
#include <imgui_impl_opengl3.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include "app/app_capture.h"
#include "app/app_frame.h"
#include "app/capture.h"
#include "app/scene_view.h"
#include "app/ui_state.h"
#include "app/window.h"
#include "render/gl.h"
#include "render/glyph_atlas.h"
#include "render/offscreen.h"
#include "render/synthetic_scene.h"

namespace kvscope::app {
namespace {

struct Args {
  CaptureOptions cap;
  bool screenshot = false;
  bool size_given = false;
  bool play = false;        // start playing right away
  int quit_after = 0;       // > 0: close after this many frames (smoke tests)
  std::string window_shot;  // save the last frame, panels included, as a PNG
  bool scene_only = false;  // --screenshot without the panels (the 3D view fills the image)
};

bool parse_size(const char* s, int* w, int* h) {
  return std::sscanf(s, "%dx%d", w, h) == 2 && *w >= 16 && *h >= 16 && *w <= 8192 && *h <= 8192;
}

// Returns "" or an error line.
std::string parse_args(int argc, char** argv, Args* a) {
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto value = [&](const char** out) {
      if (i + 1 >= argc) return false;
      *out = argv[++i];
      return true;
    };
    const char* v = nullptr;
    if (k == "--help" || k == "-h") return "help";
    if (k == "--screenshot") {
      if (!value(&v)) return "--screenshot needs an output path";
      a->screenshot = true;
      a->cap.out_path = v;
    } else if (k == "--prompt-file") {
      if (!value(&v)) return "--prompt-file needs a path";
      a->cap.prompt_file = v;
    } else if (k == "--steps") {
      if (!value(&v)) return "--steps needs a number";
      a->cap.steps = std::atoi(v);
      if (a->cap.steps < 1) return std::string("--steps ") + v + " must be >= 1";
    } else if (k == "--mode") {
      if (!value(&v)) return "--mode needs cache or nocache";
      if (!std::strcmp(v, "cache"))
        a->cap.mode = CacheMode::Cache;
      else if (!std::strcmp(v, "nocache"))
        a->cap.mode = CacheMode::NoCache;
      else
        return std::string("--mode ") + v + " (choose cache or nocache)";
    } else if (k == "--camera") {
      if (!value(&v)) return "--camera needs a preset";
      auto p = render::parse_camera_preset(v);
      if (!p) return std::string("--camera ") + v + " (choose top, side, front, 3/4, follow)";
      a->cap.camera = *p;
    } else if (k == "--layer") {
      if (!value(&v)) return "--layer needs a number";
      a->cap.view.layer = std::atoi(v);
      a->cap.view.all_layers = false;
    } else if (k == "--head") {
      if (!value(&v)) return "--head needs a number (or mean / max)";
      if (!std::strcmp(v, "mean"))
        a->cap.view.aggregation = HeadAggregation::Mean;
      else if (!std::strcmp(v, "max"))
        a->cap.view.aggregation = HeadAggregation::Max;
      else
        a->cap.view.head = std::atoi(v);
    } else if (k == "--play") {
      a->play = true;
    } else if (k == "--frames") {
      if (!value(&v) || std::atoi(v) < 1) return "--frames needs a number >= 1";
      a->quit_after = std::atoi(v);
    } else if (k == "--window-shot") {
      if (!value(&v)) return "--window-shot needs an output path";
      a->window_shot = v;
    } else if (k == "--scene-only") {
      a->scene_only = true;
    } else if (k == "--all-layers") {
      a->cap.view.all_layers = true;
    } else if (k == "--no-sink") {
      a->cap.view.renormalize_sink = true;
    } else if (k == "--size") {
      if (!value(&v) || !parse_size(v, &a->cap.width, &a->cap.height))
        return "--size needs WxH with both in [16, 8192], e.g. 1280x720";
      a->size_given = true;
    } else if (k == "--model") {
      if (!value(&v)) return "--model needs a built-in model name or a GGUF file path";
      a->cap.model_path = v;
    } else if (k == "--backend") {
      if (!value(&v)) return "--backend needs auto, cpu or cuda";
      a->cap.backend = v;
    } else {
      return "unknown option '" + k + "' (see kvscope --help)";
    }
  }
  return "";
}

const char* kUsage =
    "usage: kvscope [options]              the desktop app\n"
    "       kvscope --screenshot OUT.png [options]  the app drawn offscreen (no display needed)\n"
    "       kvscope generate|bench|bench-render ...\n"
    "options: --model NAME|PATH (smollm2-135m, gemma3-270m or a .gguf)\n"
    "         --backend auto|cpu|cuda  --prompt-file F  --steps N\n"
    "         --mode cache|nocache  --camera top|side|front|3/4|follow\n"
    "         --layer L  --head H|mean|max  --all-layers  --no-sink  --size WxH\n"
    "         --scene-only (screenshot without the panels)\n"
    "         --play  --frames N (quit after N frames)  --window-shot OUT.png\n";

// A file name for an exported view that does not overwrite an earlier one.
std::string next_export_path() {
  for (int i = 1; i < 10000; ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "kvscope-view-%03d.png", i);
    if (!std::filesystem::exists(name)) return name;
  }
  return "kvscope-view.png";
}

int run_gui(const Args& args) {
  WindowOptions wo;
  if (args.size_given) {
    wo.width = args.cap.width;
    wo.height = args.cap.height;
  }
  auto window = GlWindow::create(wo);
  if (!window.ok()) {
    std::fprintf(stderr, "kvscope: %s\n", window.error().message.c_str());
    return 1;
  }
  GLFWwindow* win = window.value()->handle();
  float scale = window.value()->content_scale();

  IMGUI_CHECKVERSION();
  ImGui::CreateContext();
  ImGuiIO& io = ImGui::GetIO();
  setup_imgui_style(scale);
  ImGui_ImplGlfw_InitForOpenGL(win, true);
  ImGui_ImplOpenGL3_Init("#version 330 core");

  UiState ui;
  ui.prompts = load_prompts();
  ui.view = args.cap.view;
  ui.preset = args.cap.camera;
  ui.mode = args.cap.mode;

  std::unique_ptr<render::Renderer> renderer;
  render::RendererOptions ro;
  ro.shader_dir = render::find_shader_dir(executable_dir());
  if (render::Result r = render::Renderer::create(ro, &renderer); !r.ok()) ui.error = r.error;

  std::unique_ptr<Controller> ctl;
  EngineOptions eo;
  eo.model_path = args.cap.model_path;
  eo.backend = args.cap.backend;
  eo.mode = ui.mode;
  eo.max_tokens = ui.max_tokens;
  auto engine = open_engine(eo);
  std::shared_ptr<Model> model;
  if (!engine.ok()) {
    ui.error = "Could not start the engine:\n" + engine.error().message;
  } else {
    ui.facts = model_facts(engine.value());
    if (ui.view.layer == kMiddleLayer) ui.view.layer = ui.facts.n_layer / 2;
    add_notice(ui, engine.value().notice);
    model = engine.value().model;
    ctl = std::make_unique<Controller>(std::move(engine.value().session));
    ui.engine_ready = true;
    ctl->send(CmdSpeed{ui.speed});
    if (!args.cap.prompt_file.empty()) {
      auto p = read_prompt_file(args.cap.prompt_file);
      if (p.ok())
        ui.prompts.insert(ui.prompts.begin(), {"file", p.value()});
      else
        ui.error = p.error().message;
    }
    ctl->send(CmdReset{ui.prompts.front().spec, args.play});
  }

  // Scripted runs (--frames) park the pointer on the toolbar's empty end, so a window
  // shot shows no hover tooltip wherever the display put the pointer.
  if (args.quit_after > 0) {
    int ww = 0, wh = 0;
    glfwGetWindowSize(win, &ww, &wh);
    glfwSetCursorPos(win, std::max(ww - 4, 0), 4);
  }

  Timeline tl;
  SceneView view;
  double last_time = glfwGetTime();
  double last_mx = 0, last_my = 0;
  bool dragging_view = false;  // a drag that started in the 3D view (keeps going over panels)
  int frame = 0;
  while (!glfwWindowShouldClose(win)) {
    glfwPollEvents();
    ImGui_ImplOpenGL3_NewFrame();
    ImGui_ImplGlfw_NewFrame();
    ImGui::NewFrame();

    double now = glfwGetTime();
    float dt = float(now - last_time);
    last_time = now;
    ControllerState cs;
    if (ctl) {
      for (Event& e : ctl->poll()) {
        if (e.kind == Event::Kind::Error) ui.error = e.error;
        if (e.kind == Event::Kind::Step) {
          ui.last_step_time = now;
          ui.step_arrivals.push_back(now);
          while (ui.step_arrivals.size() > 12) ui.step_arrivals.pop_front();
        }
        if (e.kind == Event::Kind::Reset) ui.step_arrivals.clear();
        tl.apply(e);
      }
      cs = ctl->state();
    }

    draw_frame_ui(ui, ctl.get(), cs, tl, ShownRange{view.shown_first(), view.shown_last()});

    // Pointer to the camera only over the view and when ImGui does not want it.
    double mx, my;
    glfwGetCursorPos(win, &mx, &my);
    ViewInput in;
    in.mouse_x = float(mx);
    in.mouse_y = float(my);
    in.dx = float(mx - last_mx);
    in.dy = float(my - last_my);
    in.hover = !io.WantCaptureMouse && ui.layout.view.contains(in.mouse_x, in.mouse_y);
    bool left = glfwGetMouseButton(win, GLFW_MOUSE_BUTTON_LEFT) == GLFW_PRESS;
    bool other = glfwGetMouseButton(win, GLFW_MOUSE_BUTTON_RIGHT) == GLFW_PRESS ||
                 glfwGetMouseButton(win, GLFW_MOUSE_BUTTON_MIDDLE) == GLFW_PRESS;
    if (!left && !other)
      dragging_view = false;
    else if (in.hover &&
             (ImGui::IsMouseClicked(0) || ImGui::IsMouseClicked(1) || ImGui::IsMouseClicked(2)))
      dragging_view = true;
    in.orbit = dragging_view && left;
    in.pan = dragging_view && other && !left;
    in.wheel = in.hover ? io.MouseWheel : 0.0f;
    last_mx = mx;
    last_my = my;

    ViewFrame vf;
    vf.timeline = &tl;
    vf.view = ui.view;
    vf.view.hovered_pos = ui.panel_hovered_pos >= 0 ? ui.panel_hovered_pos : ui.hovered_pos;
    vf.clock = AnimClock{now - ui.last_step_time, cs.busy, now};
    vf.preset = ui.preset;
    vf.preset_changed = ui.preset_changed;
    vf.rect = ui.layout.view;
    vf.dt = dt;
    vf.look_at_pos = ui.look_at_pos;
    ui.preset_changed = false;
    ui.look_at_pos = -1;
    view.update(vf, in);
    ui.hovered_pos = view.hovered_token();
    if (ui.hovered_pos >= 0) panel_inspector(ui, tl);

    ImGui::Render();
    int fbw = 0, fbh = 0;
    window.value()->framebuffer_size(&fbw, &fbh);
    float fb_scale = io.DisplaySize.x > 0 ? float(fbw) / io.DisplaySize.x : 1.0f;
    render::clear_framebuffer(fbw, fbh, 0.06f, 0.065f, 0.08f);
    if (renderer && fbw > 0 && fbh > 0) view.draw(*renderer, fbw, fbh, fb_scale);
    ImGui_ImplOpenGL3_RenderDrawData(ImGui::GetDrawData());
    if (ui.export_png && renderer) {
      ui.export_png = false;
      render::Viewport vp = to_viewport(ui.layout.view, fb_scale);
      std::string path = next_export_path();
      auto px = render_offscreen(*renderer, view.scene(), vp.width, vp.height);
      render::Result r = px.ok() ? render::write_png(path, vp.width, vp.height, px.value())
                                 : render::Result::fail(px.error().message);
      if (r.ok())
        add_notice(ui, "Saved the view as " + std::filesystem::absolute(path).string(), 8.0);
      else
        ui.error = "Could not export the view: " + r.error;
    }
    ++frame;
    bool last_frame = args.quit_after > 0 && frame >= args.quit_after;
    if (last_frame && !args.window_shot.empty()) {
      std::vector<uint8_t> rgba;
      render::Result r = render::read_window_rgba(fbw, fbh, &rgba);
      if (r.ok()) r = render::write_png(args.window_shot, fbw, fbh, rgba);
      if (!r.ok()) std::fprintf(stderr, "kvscope: %s\n", r.error.c_str());
    }
    glfwSwapBuffers(win);
    if (last_frame) glfwSetWindowShouldClose(win, GLFW_TRUE);
  }

  ctl.reset();  // finishes the step in flight, joins the worker
  renderer.reset();
  ImGui_ImplOpenGL3_Shutdown();
  ImGui_ImplGlfw_Shutdown();
  ImGui::DestroyContext();
  return 0;
}

}  // namespace

int run_app(int argc, char** argv) {
  Args args;
  std::string err = parse_args(argc, argv, &args);
  if (err == "help") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (!err.empty()) {
    std::fprintf(stderr, "kvscope: %s\n", err.c_str());
    return 2;
  }
  if (args.screenshot) return run_screenshot(args.cap, !args.scene_only);
  return run_gui(args);
}

}  // namespace kvscope::app
