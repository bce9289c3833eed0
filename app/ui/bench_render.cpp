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
