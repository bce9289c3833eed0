// bench_render.cpp — `kvscope bench-render`: frame time and draw calls for synthetic
// scenes (256 / 1,024 / 4,096 tokens) rendered offscreen at a fixed size, in two cases:
//   animated: the content is unchanged and only SceneAnim moves (the app between steps:
//             no instance upload);
//   new step: the content changes every frame (a step arrives each frame: repack and
//             send the changed ranges).
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "app/ui/app_main.h"
#include "app/scene/serving_scene.h"
#include "app/options/capture_options.h"
#include "app/options/options.h"
#include "app/ui/window.h"
#include "render/camera.h"
#include "render/gl.h"
#include "render/offscreen.h"
#include "render/renderer.h"
#include "render/synthetic_scene.h"

#include <glad/gl.h>

namespace kvscope::app {
namespace {

// A serving run mid-way: `lanes` running sequences of `tokens` positions each, whose first
// two blocks are one shared system prompt (referenced by every lane), the rest private,
// plus a tenth of the pool free; lane 0 selected with its attention.
std::shared_ptr<ServingSnapshot> synthetic_serving(int lanes, int tokens, int step) {
  auto s = std::make_shared<ServingSnapshot>();
  s->run = 1;
  s->step = step;
  s->block_size = 16;
  s->max_batch_tokens = 512;
  s->max_seqs = lanes;
  s->context = tokens;
  const int per = (tokens + 15) / 16, shared = std::min(2, per);
  const int used = shared + lanes * (per - shared);
  s->n_blocks = used + used / 10 + 1;
  s->tiles.resize(size_t(s->n_blocks));
  int next = shared;
  for (int l = 0; l < lanes; ++l) {
    Lane lane;
    lane.seq = l;
    lane.request = l;
    lane.color = l;
    lane.state = LaneState::Running;
    lane.prompt_tokens = std::min(40, tokens);
    lane.cached_tokens = l > 0 ? shared * 16 : 0;
    lane.computed = tokens;
    for (int p = 0; p < tokens; ++p) {
      lane.ids.push_back(p % 1000);
      lane.pieces.push_back(p % 7 == 0 ? " the" : "tok");
    }
    for (int b = 0; b < per; ++b) lane.table.push_back(b < shared ? b : next++);
    lane.step_tokens = 1;
    if (l == 0) lane.attention.assign(size_t(tokens), 1.0f / float(tokens));
    for (int b = 0; b < per; ++b) {
      PoolTile& t = s->tiles[size_t(lane.table[size_t(b)])];
      t.state = TileState::Used;
      t.refs += 1;
      t.owners.push_back(l);
      if (t.logical < 0) {
        t.logical = b;
        t.first_pos = b * 16;
        t.n_pos = std::min(16, tokens - b * 16);
      }
      if (b == per - 1) t.flash = TileFlash::Written;
    }
    s->lanes.push_back(std::move(lane));
  }
  ServingPoint p;
  p.step = step;
  p.running = lanes;
  p.used = used;
  p.free = s->n_blocks - used;
  s->history.push_back(p);
  return s;
}

// --serving LxT: the Serving view's scene for L sequences of T tokens, framed as the app
// frames it, animated (the same snapshot) and with a new step every frame (a new snapshot:
// the scene rebuilt and uploaded, what the app pays per step).
int bench_serving(render::Renderer& r, render::OffscreenTarget& target, int lanes, int tokens,
                  int width, int height, int frames) {
  std::printf("%6s %7s %8s %8s %10s %10s %11s %6s %10s\n", "lanes", "tokens", "tiles",
              "glyphs", "case", "frame_ms", "prep_ms", "draws", "build_ms");
  target.bind();
  for (bool new_step : {false, true}) {
    ServingView view;
    ServingFrame f;
    f.snapshot = synthetic_serving(lanes, tokens, 1);
    f.view.selected_seq = 0;
    f.rect = UiRect{0, 0, float(width), float(height)};
    f.dt = 0;
    for (int i = 0; i < 2; ++i) {  // warm up
      view.update(f, ViewInput{});
      view.draw(r, width, height, 1.0f);
    }
    glFinish();
    double build = 0, prep = 0;
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < frames; ++i) {
      f.clock.since_step = 0.05 * (i % 10);
      f.clock.time += 1.0 / 60.0;
      if (new_step) f.snapshot = synthetic_serving(lanes, tokens, i + 2);
      auto b0 = std::chrono::steady_clock::now();
      view.update(f, ViewInput{});
      build += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - b0)
                   .count();
      view.draw(r, width, height, 1.0f);
      glFinish();
      prep += r.last_stats().prepare_ms;
    }
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() /
        frames;
    const render::FrameStats& st = r.last_stats();
    std::printf("%6d %7d %8zu %8zu %10s %10.2f %11.2f %6d %10.2f\n", lanes, tokens,
                f.snapshot->tiles.size(), st.glyphs, new_step ? "new step" : "animated", ms,
                prep / frames, st.draw_calls, build / frames);
  }
  render::OffscreenTarget::bind_default();
  return 0;
}

}  // namespace

int run_bench_render(int argc, char** argv) {
  int frames = 20, width = 1280, height = 720, layers = 30, samples = 4;
  std::string size = "1280x720";  // the default WxH
  CLI::App app{"Frame time and draw calls of synthetic scenes rendered offscreen.",
               "kvscope bench-render"};
  cli::add_frames_option(app, frames, "Frames per case");
  app.add_option("--samples", samples, "Multisample count (0 = off)")->check(cli::Range(0, 64));
  app.add_option("--layers", layers, "Layers per token")->check(cli::Range(1, 256));
  app.add_option("--size", size, "Image size WxH, e.g. 1280x720")->check(cli::SizeWxH());
  bool passes = false;
  app.add_flag("--passes", passes,
               "Also time each part of the frame (the GPU finishes after each: slower frames)");
  std::string serving;
  app.add_option("--serving", serving,
                 "The Serving view's scene instead: LANESxTOKENS sequences (e.g. 16x1000)")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            int l = 0, t = 0;
            char extra = 0;
            if (std::sscanf(v.c_str(), "%dx%d%c", &l, &t, &extra) == 2 && l >= 1 && l <= 256 &&
                t >= 1 && t <= 100000)
              return "";
            return "'" + v + "' is not LANESxTOKENS (1..256 x 1..100000)";
          },
          "LxT"));
  if (int rc = cli::parse_options(app, argc, argv); rc >= 0) return rc;
  cli::parse_size(size, &width, &height);  // checked by SizeWxH
  auto gl = OffscreenContext::create();  // EGL without a display, else a hidden window
  if (!gl.ok()) return cli::fail(gl.error().message);
  render::RendererOptions ro;
  ro.shader_dir = render::find_shader_dir(executable_dir());
  auto renderer = render::Renderer::create(ro);
  if (!renderer.ok()) return cli::fail(renderer.error().message);
  std::unique_ptr<render::Renderer> r = std::move(renderer).value();
  auto target_or = render::OffscreenTarget::create(width, height, samples);
  if (!target_or.ok()) return cli::fail(target_or.error().message);
  render::OffscreenTarget& target = *target_or;
  r->set_profile_passes(passes);
  std::printf("renderer: %s\n", gl.value()->description().c_str());
  if (!serving.empty()) {
    int lanes = 0, tokens = 0;
    std::sscanf(serving.c_str(), "%dx%d", &lanes, &tokens);
    return bench_serving(*r, target, lanes, tokens, width, height, frames);
  }
  std::printf("%8s %7s %10s %8s %8s %9s %10s %10s %11s %6s %12s %12s\n", "tokens", "layers",
              "kv_blocks", "beams", "glyphs", "case", "frame_ms", "prep_ms", "upload_B", "draws",
              "drawn_kv", "drawn_beams");
  for (int n : {256, 1024, 4096}) {
    render::SyntheticSpec spec;
    spec.n_tokens = n;
    spec.n_prompt = 8;
    spec.n_layers = layers;
    render::Scene s = render::make_synthetic_scene(spec);
    render::Camera cam;
    cam.set_aspect(float(width) / float(height));
    // Framed as the app frames it (the preset's beam shape, the recent part in 3/4).
    s.anim.beam_arc = render::preset_beam_arc(render::CameraPreset::ThreeQuarter);
    cam.set_ground(s.grid.height);
    cam.set_content(render::framing_content(s, s.anim.beam_arc));
    cam.set_preset(render::CameraPreset::ThreeQuarter, true);
    s.camera = cam.view();
    target.bind();
    for (bool new_step : {false, true}) {
      s.revision = render::next_scene_revision();
      for (int i = 0; i < 2; ++i) r->draw(s, width, height);  // warm up
      glFinish();
      double cpu = 0, kib = 0;  // packing+upload ms, bytes uploaded
      std::array<double, render::kPassCount> pass_ms{};
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < frames; ++i) {
        s.anim.flash = float(i % 10) / 10.0f;  // the animation always moves
        s.anim.fall = 1.0f - float(i % 10) / 10.0f;
        if (new_step) {
          s.revision = render::next_scene_revision();
          // A new step: the newest token's stack changes (here one block of it).
          s.kv_blocks[size_t(i) % s.kv_blocks.size()].brightness = float(i % 7 + 1) / 8.0f;
        }
        r->draw(s, width, height);
        glFinish();  // count the GPU (llvmpipe) work, not just submission
        cpu += r->last_stats().prepare_ms;
        kib += double(r->last_stats().uploaded_bytes);
        for (int p = 0; p < render::kPassCount; ++p)
          pass_ms[size_t(p)] += r->last_stats().pass_ms[size_t(p)];
      }
      double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() /
          frames;
      const render::FrameStats& st = r->last_stats();
      std::printf("%8d %7d %10zu %8zu %8zu %9s %10.2f %10.2f %11.0f %6d %12zu %12zu\n", n, layers,
                  st.kv_blocks, st.beams, st.glyphs, new_step ? "new step" : "animated", ms,
                  cpu / frames, kib / frames, st.draw_calls, st.drawn_kv_blocks, st.drawn_beams);
      if (passes) {
        std::printf("%8s ms per part:", "");
        for (int p = 0; p < render::kPassCount; ++p)
          std::printf(" %s %.2f", render::pass_name(render::Pass(p)), pass_ms[size_t(p)] / frames);
        std::printf("\n");
      }
    }
  }
  render::OffscreenTarget::bind_default();
  return 0;
}

}  // namespace kvscope::app
