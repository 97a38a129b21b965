// A small character-level transformer language model trained on Shakespeare's Sonnets 1 to 50.
//
// - fp32, bf16 or fp8 is chosen when the program starts, from ACCELERATE_MIXED_PRECISION (`no`, the default, `bf16` or
//   `fp8`: the Linear layers inside the blocks in float8, torchao's tensorwise scaling), with accel::dispatch: the
//   training loop is compiled once for each configuration.
// - The whole training state is saved every --save-every steps, and at the end, with acc.save_state() into
//   OUT/checkpoints/checkpoint_{i} (the last 2 are kept). When OUT holds checkpoints, the program resumes from the
//   newest one: stop it, start it again, and it goes on where it was (delete OUT to start afresh).
//
// Build and run: scripts/example.sh char_lm
//   char_lm [--steps N] [--save-every K] [--out DIR] [--text FILE]
// --text: another text to learn; its first line is skipped, as the sonnets' title line is.
#include <accel/checkpoint.hpp>
#include <accel/data_loader.hpp>
#include <accel/dispatch.hpp>
#include <accel/fp8.hpp>
#include <accel/progress.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <iterator>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "char_transformer.hpp"

struct settings {
  int64_t steps = 1000;  // optimizer steps in all, counting those of earlier runs
  int64_t save_every = 250;
  std::string out = "char_lm_run";
  std::string text = CHAR_LM_TEXT;  // examples/data/sonnets.txt, set by CMake
};

// The training examples: every window of `context` characters, with the same window shifted by one as targets.
struct text_windows {
  torch::Tensor tokens;
  int64_t context;
  int64_t size() const { return tokens.size(0) - context; }
  torch::data::Example<> get(size_t i) const {
    const auto start = static_cast<int64_t>(i);
    return {tokens.narrow(0, start, context), tokens.narrow(0, start + 1, context)};
  }
};

// The optimizer steps done so far: saved and restored with the training state (register_for_checkpointing).
struct progress {
  int64_t step = 0;
  void save(torch::serialize::OutputArchive& archive) const { archive.write("step", c10::IValue(step)); }
  void load(torch::serialize::InputArchive& archive) {
    c10::IValue value;
    archive.read("step", value);
    step = value.toInt();
  }
};

// A loss with 3 decimals, for printing.
std::string decimals3(double x) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(3) << x;
  return out.str();
}

// Characters as their indices in `alphabet`.
torch::Tensor encode(const std::string& text, const std::string& alphabet) {
  std::vector<int64_t> indices;
  for (char c : text) indices.push_back(static_cast<int64_t>(alphabet.find(c)));
  return torch::tensor(indices);
}

template <class Accelerator, class Model>
double mean_loss(Accelerator& acc, Model& model, const torch::Tensor& tokens, int64_t context) {
  // Mean next-character loss over consecutive windows of `tokens` (every character predicted once).
  torch::NoGradGuard no_grad;
  const auto windows = (tokens.size(0) - 1) / context;
  const torch::Tensor inputs = tokens.narrow(0, 0, windows * context).view({windows, context}).to(acc.device());
  const torch::Tensor targets = tokens.narrow(0, 1, windows * context).view({windows, context}).to(acc.device());
  const torch::Tensor logits = model(inputs);
  return torch::nn::functional::cross_entropy(logits.flatten(0, 1), targets.flatten()).item<double>();
}

template <class Accelerator>
void train(Accelerator& acc, const settings& s) {
  // The text, without its first line (which says what it is), as character indices; the last 10% for validation.
  std::ifstream file(s.text);
  if (!file) throw std::runtime_error("cannot read " + s.text);
  std::string text(std::istreambuf_iterator<char>(file), {});
  text.erase(0, text.find('\n') + 1);
  std::string alphabet = text;  // the characters that occur, sorted
  std::sort(alphabet.begin(), alphabet.end());
  alphabet.erase(std::unique(alphabet.begin(), alphabet.end()), alphabet.end());
  const auto tokens = encode(text, alphabet);
  const auto train_size = tokens.size(0) * 9 / 10;
  const auto train_tokens = tokens.narrow(0, 0, train_size);
  const auto validation_tokens = tokens.narrow(0, train_size, tokens.size(0) - train_size);

  const int64_t context = 64;
  torch::manual_seed(0);
  CharTransformer net(static_cast<int64_t>(alphabet.size()), context, /*dim=*/96, /*heads=*/4, /*layers=*/2,
                      /*dropout=*/0.2);
  torch::optim::AdamW optimizer(net->parameters(), torch::optim::AdamWOptions(2e-3).weight_decay(0.01));
  accel::data_loader loader(text_windows{train_tokens, context}, {.batch_size = 32, .shuffle = true, .seed = 0});
  auto [model, opt, batches] = acc.prepare(net, optimizer, loader);
  int64_t parameters = 0;
  for (const auto& p : net->parameters()) parameters += p.numel();
  const auto precision = std::string(Accelerator::precision_type::name());  // what dispatch chose
  acc.print(parameters, "parameters,", alphabet.size(), "different characters,", precision);

  progress done;
  acc.register_for_checkpointing(done);
  if (std::filesystem::exists(std::filesystem::path(s.out) / "checkpoints")) {
    acc.load_state();  // the newest checkpoint: weights, optimizer, data position, random generator, `done`
    acc.print("resumed from step", done.step);
  } else {
    model->eval();  // no dropout while measuring
    acc.print("initial validation loss =", decimals3(mean_loss(acc, model, validation_tokens, context)));
    model->train();
  }

  // Training: each pass over `batches` is an epoch in a new order; a resumed run finishes the interrupted one. The
  // progress bar (main process only) counts the steps left, with the batch loss beside it.
  accel::progress_bar bar({.description = "train",
                           .total = static_cast<std::size_t>(s.steps - done.step),
                           .output = &std::cout,  // with the program's other output
                           .enabled = acc.is_local_main_process()});
  while (done.step < s.steps) {
    for (auto&& batch : batches) {
      const torch::Tensor logits = model(batch.data);
      const torch::Tensor loss = torch::nn::functional::cross_entropy(logits.flatten(0, 1), batch.target.flatten());
      acc.backward(loss);
      opt.step();
      opt.zero_grad();
      ++done.step;
      bar.set_postfix({{"loss", loss.item<double>()}});
      bar.update();
      if (done.step % s.save_every == 0 || done.step == s.steps) {
        model->eval();
        const double validation = mean_loss(acc, model, validation_tokens, context);
        const auto saved = acc.save_state();
        // Through the bar, which would otherwise be garbled by the line on a terminal.
        bar.write("step " + std::to_string(done.step) + " validation loss = " + decimals3(validation) + " saved to " +
                  saved.string());
        model->train();
      }
      if (done.step == s.steps) break;
    }
  }

  bar.close();
  model->eval();
  acc.print("final loss: train =", decimals3(mean_loss(acc, model, train_tokens, context)),
            "validation =", decimals3(mean_loss(acc, model, validation_tokens, context)));

  // Sample 300 characters after a prompt, one at a time, from the model's distribution (a fixed seed).
  torch::NoGradGuard no_grad;
  torch::manual_seed(1);
  std::string sample = "Shall I compare thee";
  for (int i = 0; i < 300; ++i) {
    const auto input = encode(sample.substr(sample.size() - std::min<size_t>(sample.size(), context)), alphabet);
    const torch::Tensor next_logits = model(input.unsqueeze(0).to(acc.device()))[0][-1];  // after the last one
    sample += alphabet[torch::multinomial(next_logits.softmax(-1), 1).item<int64_t>()];
  }
  acc.print("sample:\n" + sample);
}

// The command line, or std::nullopt when it is not understood.
std::optional<settings> parse(int argc, char** argv) {
  settings s;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string flag = argv[i];
      if (i + 1 < argc && flag == "--steps")
        s.steps = std::stoll(argv[++i]);
      else if (i + 1 < argc && flag == "--save-every")
        s.save_every = std::stoll(argv[++i]);
      else if (i + 1 < argc && flag == "--out")
        s.out = argv[++i];
      else if (i + 1 < argc && flag == "--text")
        s.text = argv[++i];
      else
        return std::nullopt;
    }
  } catch (const std::logic_error&) {  // std::stoll: not a number
    return std::nullopt;
  }
  if (s.steps < 0 || s.save_every < 1) return std::nullopt;
  return s;
}

int main(int argc, char** argv) {
  const auto s = parse(argc, argv);
  if (!s) {
    std::cerr << "usage: char_lm [--steps N (>= 0)] [--save-every K (>= 1)] [--out DIR] [--text FILE]\n";
    return 2;
  }
  // Checkpoints go to OUT/checkpoints/checkpoint_{i}; save_state() removes all but the newest 2.
  const accel::options options{
      .project = {.project_dir = s->out, .automatic_checkpoint_naming = true, .total_limit = 2}};
  // The configurations this program is compiled for; ACCELERATE_MIXED_PRECISION picks one when it starts.
  using supported = accel::configs<accel::accelerator<accel::fp32>, accel::accelerator<accel::bf16>,
                                   accel::accelerator<accel::fp8<>>>;
  try {
    accel::dispatch<supported>(accel::read_run_config(), [&](auto& acc) { train(acc, *s); }, options);
  } catch (const std::exception& error) {  // a missing file, an unsupported configuration, a bad checkpoint...
    std::cerr << "char_lm: " << error.what() << "\n";
    return 1;
  }
}
