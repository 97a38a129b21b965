// For tests/checkpoint/interop.cmake: `checkpoint_tool write FILE` writes known tensors for Python to check;
// `checkpoint_tool check FILE` reads a file Python wrote and checks its values (exit code 0 when they match).
#include <accel/accel.hpp>
#include <torch/torch.h>

#include <cstdio>
#include <string>

namespace {
/// A model large enough (~40 MB) that saving it takes a while: the crash test kills the saver mid-write.
struct saver {
  accel::accelerator<> acc{{.cpu = true}};
  torch::nn::Linear net{2000, 5000};
  accel::prepared_model<torch::nn::Linear, accel::accelerator<>> model = acc.prepare(net);
};
}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  const std::string mode = argv[1];
  if (mode == "save-loop") {  // saves checkpoint after checkpoint into the same directory until killed
    saver s;
    for (int i = 0;; ++i) {
      {
        torch::NoGradGuard no_grad;
        s.net->bias.fill_(i);
      }
      s.acc.save_state(argv[2]);
      std::printf("saved %d\n", i);
      std::fflush(stdout);
    }
  }
  if (mode == "verify") {  // the checkpoint there loads, whole
    saver s;
    s.acc.load_state(argv[2]);
    const bool whole = torch::all(s.net->bias == s.net->bias[0]).item<bool>();
    std::printf("checkpoint with bias %g loaded: %s\n", s.net->bias[0].item<double>(), whole ? "whole" : "mixed");
    return whole ? 0 : 1;
  }
  if (mode == "write") {
    accel::safetensors::save(argv[2], {{"fc.weight", torch::arange(6, torch::kFloat).reshape({2, 3}) / 4},
                                       {"fc.bias", torch::tensor({-1.5, 2.25}, torch::kDouble)},
                                       {"steps", torch::tensor({7, 8, 9}, torch::kLong)},
                                       {"half", torch::tensor({0.5f, -2.0f}).to(torch::kBFloat16)}});
    return 0;
  }
  // Python's state dict of a Linear(4, 3) loads into LibTorch's Linear(4, 3), by name.
  torch::nn::Linear linear(4, 3);
  accel::load_model(*linear, argv[2]);
  const bool ok = torch::equal(linear->weight, torch::arange(12, torch::kFloat).reshape({3, 4}) * 0.5) &&
                  torch::equal(linear->bias, torch::tensor({1.0f, -2.0f, 3.0f}));
  std::printf("python's state dict loaded into torch::nn::Linear: %s\n", ok ? "values match" : "values differ");
  return ok ? 0 : 1;
}
