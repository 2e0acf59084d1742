// `kdalab info`: version, git sha, compiler, build type, CUDA kernels built or not, GPUs seen.
// With --config MODEL.json (a Hugging Face config.json of Kimi Linear / K3) it also prints the
// per-layer layout and per-token cache bytes (see experiments/model_info.cpp when present).
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "experiments/build_info.hpp"
#include "experiments/cli.hpp"
#include "reference/model_config.hpp"

namespace kdalab::cli {

/// Prints the model layout of a config.json; defined by the hybrid reference (model_info.cpp).
/// Returns false when that part is not built yet.
bool print_model_info(const std::string& config_path, ResultsFile* out);

void register_info(Registry& reg) {
  auto& c = reg.add("info",
                    "Print version, git sha, compiler, build type, whether the CUDA kernels are built and the GPUs "
                    "seen. With --config MODEL.json (a Hugging Face config.json of Kimi Linear or K3) also print "
                    "the per-layer layout and per-token cache bytes of the hybrid vs full MLA.",
                    "");
  // --out is optional ("" = no file) but, when given, checked by cli::run before anything is printed: an existing file
  // without --force, a missing folder and an --out that is the --config file are refused before the banner (info
  // --config m.json --out m.json --force must not overwrite the model config)
  c.out_optional = true;
  c.app->get_option("--config")
      ->description("for info: a MODEL config (Hugging Face config.json schema, e.g. data/configs/kimi-linear-48b.json) "
                    "whose layer layout and cache bytes are printed");
  c.app->get_option("--out")->description("optional HDF5 file to record the same facts in (group /info)");
  // the common options that do nothing here say so (the generic texts "--quick: run a small version" and "--quiet:
  // no progress lines" would promise what info does not do)
  c.app->get_option("--seed")->description("no effect for info (nothing random); recorded in the --out file");
  c.app->get_option("--quick")->description("no effect for info (it always prints the same facts)");
  c.app->get_option("--quiet")->description("no effect for info (it prints no progress lines)");
  c.check = [](Context& ctx) {
    // a missing model config is refused before anything is printed (no banner above the error), and before --out is
    // checked (cli::run's order)
    if (!ctx.common.config.empty()) {
      std::error_code ec;
      require(std::filesystem::is_regular_file(ctx.common.config, ec),
              "--config '" + ctx.common.config + "': no such file; give a model config.json, e.g. one of "
              "data/configs/kimi-linear-48b.json or data/configs/kimi-k3.json (run from the repository root)");
      // the model config is parsed here too, so a file that is not one (e.g. a kdalab options file such as
      // data/configs/parity.json) is one line before the banner, not after the 7-line header.
      // The line says what the file is, once: a kdalab options file is named as one (not as a model config missing
      // hidden_size), a model config with a bad key gets the reader's message alone (not also "..., not a kdalab
      // options file"), anything else the reader's message and what info expects.
      try {
        (void)read_model_config(ctx.common.config);
      } catch (const Error& e) {
        const std::string expects = "info --config expects a Hugging Face style model config.json, e.g. "
                                    "data/configs/kimi-linear-48b.json";
        nlohmann::json j;  // the file's JSON, when it is one JSON value (null otherwise)
        try {
          std::ifstream in(ctx.common.config, std::ios::binary);
          std::string repeated;
          j = parse_json_once(std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()), repeated);
        } catch (const std::exception&) {
        }
        if (const auto subs = options_file_commands(ctx.app->get_parent(), j, "info"); !subs.empty()) {
          std::string names;
          for (const auto& n : subs) names += (names.empty() ? "kdalab " : ", kdalab ") + n;
          throw Error("--config '" + ctx.common.config + "' is a kdalab options file (its keys are options of " + names +
                      "; run it with 'kdalab " + subs.front() + " --config " + ctx.common.config +
                      "'), not a model config; " + expects);
        }
        if (looks_like_model_config(j)) throw;
        throw Error(std::string(e.what()) + "; " + expects);
      }
    }
  };
  c.run = [](Context& ctx) {
    fmt::print("kdalab {} (git {})\n", build_info::version, build_info::git_sha);
    fmt::print("compiler:      {}\n", build_info::compiler);
    fmt::print("build type:    {}\n", build_info::build_type);
    fmt::print("CUDA kernels:  {}\n", build_info::cuda_built ? "built (sm_90a)" : "not built");
    const auto gpus = build_info::gpu_devices();
    if (gpus.empty()) fmt::print("GPUs:          0 ({})\n", build_info::gpu_note());
    for (std::size_t i = 0; i < gpus.size(); ++i) fmt::print("GPU {}:         {}\n", i, gpus[i]);
    fmt::print("host:          {}\n", host_name());
    fmt::print("device:        {}\n", device_description());
    std::unique_ptr<ResultsFile> f;
    if (!ctx.common.out.empty()) {
      f = ctx.open_results();
      f->group("info", "build and machine facts printed by kdalab info");
      f->attr("info", "compiler", build_info::compiler);
      f->attr("info", "build_type", build_info::build_type);
      f->attr("info", "cuda_built", build_info::cuda_built ? "yes" : "no");
      f->attr("info", "gpus", std::to_string(gpus.size()));
    }
    if (!ctx.common.config.empty() && !print_model_info(ctx.common.config, f.get())) {
      throw Error("--config '" + ctx.common.config + "': model layouts are not built yet (hybrid reference pending)");
    }
    if (f) {
      f->commit();
      fmt::print("wrote {}\n", ctx.common.out);
    }
    return 0;
  };
}

}  // namespace kdalab::cli
