// app_main.cpp — argument parsing, the window loop (canonical Dear ImGui frame order),
// mouse routing to the camera, and hover picking.
#include "app/app_main.h"

#include <GLFW/glfw3.h>
#include <imgui.h>
#include <imgui_impl_glfw.h>
#include <imgui_impl_opengl3.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "app/capture.h"
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
    "       kvscope --screenshot OUT.png [options]  headless capture\n"
    "       kvscope generate|bench|bench-render ...\n"
    "options: --model NAME|PATH (smollm2-135m, gemma3-270m or a .gguf)\n"
    "         --backend auto|cpu|cuda  --prompt-file F  --steps N\n"
    "         --mode cache|nocache  --camera top|side|front|3/4|follow\n"
    "         --layer L  --head H|mean|max  --all-layers  --no-sink  --size WxH\n"
    "         --play  --frames N (quit after N frames)  --window-shot OUT.png\n";

ModelFacts facts_of(const EngineHandle& h) {
  ModelFacts f;
  const ModelConfig& c = h.model->config();
  f.name = c.name;
  f.backend = h.session->backend().name();
  f.n_layer = c.n_layer;
  f.n_head = c.n_head;
  f.n_head_kv = c.n_head_kv;
  f.head_dim = c.head_dim;
  f.n_embd = c.n_embd;
  f.n_vocab = c.n_vocab;
  f.block_macs_per_token = h.model->block_macs_per_token();
  KvDtype dt = h.session->config().kv_dtype;
  f.kv_dtype = kv_dtype_name(dt);
  f.kv_bytes_per_token = KvShape{c.n_layer, c.n_head_kv, c.head_dim}.bytes_per_token(dt);
  return f;
}

// Token under the mouse: nearest projected token block within a small radius.
int pick_token(const render::Scene& s, double mx, double my, int w, int h) {
  int best = -1;
  float best_d = 28.0f * 28.0f;
  for (size_t i = 0; i < s.tokens.size(); ++i) {
    auto p = render::project_to_screen(s.camera, s.tokens[i].position, w, h);
    if (!p) continue;
    float dx = p->x - float(mx), dy = p->y - float(my), d = dx * dx + dy * dy;
    if (d < best_d) {
      best_d = d;
      best = int(i);
    }
  }
  return best;
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
  io.IniFilename = nullptr;
  std::string font = render::GlyphAtlas::find_default_font();
  if (!font.empty()) {
    // Latin, Greek, Cyrillic and the arrows used to show whitespace tokens (↵ →).
    static const ImWchar kRanges[] = {0x0020, 0x024F, 0x0370, 0x03FF, 0x0400, 0x04FF,
                                      0x2000, 0x206F, 0x2190, 0x21FF, 0};
    io.Fonts->AddFontFromFileTTF(font.c_str(), 15.0f * scale, nullptr, kRanges);
  }
  ImGui::StyleColorsDark();
  ImGui::GetStyle().ScaleAllSizes(scale);
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
    ui.facts = facts_of(engine.value());
    if (ui.view.layer == kMiddleLayer) ui.view.layer = ui.facts.n_layer / 2;
    ui.notice = engine.value().notice;
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

  Timeline tl;
  render::Camera camera;
  double last_time = glfwGetTime();
  double last_mx = 0, last_my = 0;
  render::Scene scene;
  // What the cached scene was built from: rebuilt only when one of these changes; other
  // frames only animate it (no instance upload).
  struct Built {
    uint64_t run = ~0ull;
    size_t steps = 0;
    ViewOptions view;
  } built;
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

    panel_controls(ui, ctl.get(), cs, tl);
    panel_stats(ui, cs, tl);
    panel_plots(ui, tl);
    panel_candidates(tl);
    overlay_computing(cs, tl);
    if (!ui.notice.empty()) {
      ImGui::SetNextWindowPos(ImVec2(io.DisplaySize.x * 0.5f, 10), ImGuiCond_Always,
                              ImVec2(0.5f, 0));
      ImGui::Begin("##notice", nullptr,
                   ImGuiWindowFlags_NoDecoration | ImGuiWindowFlags_AlwaysAutoResize);
      ImGui::TextDisabled("%s", ui.notice.c_str());
      ImGui::End();
    }
    panel_error_modal(ui);

    // Mouse to the camera only when ImGui does not want it.
    double mx, my;
    glfwGetCursorPos(win, &mx, &my);
    if (!io.WantCaptureMouse) {
      float dx = float(mx - last_mx), dy = float(my - last_my);
      if (glfwGetMouseButton(win, GLFW_MOUSE_BUTTON_LEFT) == GLFW_PRESS)
        camera.orbit(-dx * 0.3f, dy * 0.3f);
      if (glfwGetMouseButton(win, GLFW_MOUSE_BUTTON_RIGHT) == GLFW_PRESS ||
          glfwGetMouseButton(win, GLFW_MOUSE_BUTTON_MIDDLE) == GLFW_PRESS)
        camera.pan(dx / std::max(io.DisplaySize.y, 1.0f), dy / std::max(io.DisplaySize.y, 1.0f));
      if (io.MouseWheel != 0) camera.zoom(io.MouseWheel);
    }
    last_mx = mx;
    last_my = my;

    int fbw = 0, fbh = 0;
    window.value()->framebuffer_size(&fbw, &fbh);
    ui.view.hovered_pos = io.WantCaptureMouse ? -1 : ui.hovered_pos;
    AnimClock clock{now - ui.last_step_time, cs.busy, now};
    if (built.run != tl.run() || built.steps != tl.steps().size() || !(built.view == ui.view)) {
      scene = build_scene(tl, ui.view, clock);
      built = {tl.run(), tl.steps().size(), ui.view};
    } else {
      animate_scene(&scene, tl, clock);
    }
    camera.set_aspect(fbh > 0 ? float(fbw) / float(fbh) : 1.0f);
    camera.set_content(render::scene_bounds(scene), scene.head.position);
    if (ui.preset_changed) {
      camera.set_preset(ui.preset);
      ui.preset_changed = false;
    }
    camera.update(dt);
    scene.camera = camera.view();
    // Picking works in window coordinates; the projection only needs the aspect.
    ui.hovered_pos = io.WantCaptureMouse
                         ? -1
                         : pick_token(scene, mx, my, int(io.DisplaySize.x), int(io.DisplaySize.y));
    panel_inspector(ui, tl);

    ImGui::Render();
    if (renderer && fbw > 0 && fbh > 0) renderer->draw(scene, fbw, fbh);
    ImGui_ImplOpenGL3_RenderDrawData(ImGui::GetDrawData());
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
  if (args.screenshot) return run_screenshot(args.cap);
  return run_gui(args);
}

}  // namespace kvscope::app
