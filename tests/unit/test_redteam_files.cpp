// Issue 56's hostile and mistaken input (tests redteam.*): files that overlap, nest, overflow or claim more than they
// hold, a second model offloaded into a folder still in use, a device-map key that names nothing, a mesh whose product
// wraps, an MLflow URI or server out of bounds, a fused layer tp cannot split. Each is refused with an error naming the
// problem (and its limit), never a crash, a wrong model or memory held for it.
#include "accel_headers.hpp"
#include <catch2/catch.hpp>
#include <caffe2/serialize/inline_container.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <torch/torch.h>
#include <unistd.h>

#include <accel/detail/tracking/http.hpp>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "offload_model.hpp"
#include "support.hpp"

namespace {

using accel::map_device;
using accel_test::OffloadLM;
using Catch::Contains;
using namespace std::string_literals;

OffloadLM small_model(std::uint64_t seed) {
  torch::manual_seed(seed);
  OffloadLM model(20, 8, 16, 2);
  model->eval();
  return model;
}

torch::Tensor logits_of(OffloadLM& model) {
  torch::NoGradGuard no_grad;
  return model->forward(torch::arange(0, 12, torch::kLong).remainder(20).view({2, 6}));
}

/// A safetensors file of `header` (JSON) and `data` bytes.
void write_raw(const std::filesystem::path& path, const std::string& header, const std::string& data) {
  std::ofstream out(path, std::ios::binary);
  const std::uint64_t length = header.size();
  out.write(reinterpret_cast<const char*>(&length), sizeof length);
  out << header << data;
}

std::string two_floats(const char* first, const char* second) {
  return std::string("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":") + first +
         "},\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":" + second + "}}";
}

/// A torch.save archive whose data.pkl is `pickle`.
std::string torch_save_archive(const std::string& pickle) {
  std::string bytes;
  caffe2::serialize::PyTorchStreamWriter archive([&bytes](const void* data, std::size_t size) {
    bytes.append(static_cast<const char*>(data), size);
    return size;
  });
  archive.writeRecord("byteorder", "little", 6);
  archive.writeRecord("data.pkl", pickle.data(), pickle.size());
  archive.writeEndOfFile();
  return bytes;
}

}  // namespace

TEST_CASE("disk_offload_same_folder", "[redteam56]") {
  // Two models offloaded into one folder: the second would replace the file the first reads, and the first would
  // compute with its weights. Refused while the first is dispatched; allowed once its handle is gone.
  const auto dir = accel_test::scratch_directory("redteam-offload-folder");
  auto first = small_model(1), second = small_model(2);
  const auto first_expected = logits_of(first), second_expected = logits_of(second);
  {
    const auto first_dispatched = accel::disk_offload(*first, dir);
    CHECK_THROWS_WITH(accel::disk_offload(*second, dir),
                      Contains("offload.safetensors holds the disk weights of another dispatched model that is still "
                               "alive") &&
                          Contains("give each model an offload folder of its own"));
    CHECK(torch::equal(logits_of(first), first_expected));
    CHECK(!second->head->module()->weight.is_meta());  // the refused dispatch changed nothing
  }
  const auto second_dispatched = accel::disk_offload(*second, dir);
  CHECK(torch::equal(logits_of(second), second_expected));
}

TEST_CASE("safetensors_overlap", "[redteam56]") {
  // Python's safetensors: the byte ranges, in offset order, follow each other from 0 and cover the data exactly.
  const auto dir = accel_test::scratch_directory("redteam-overlap");
  const std::string data(16, '\0');
  write_raw(dir / "overlap.safetensors", two_floats("[0,8]", "[0,8]"), data);
  CHECK_THROWS_WITH(accel::safetensors::load(dir / "overlap.safetensors"),
                    Contains("invalid offset for tensor b: its bytes begin at 0 of the data, where the tensor before "
                             "it ends at 8"));
  write_raw(dir / "gap.safetensors", two_floats("[0,8]", "[12,20]"), std::string(20, '\0'));
  CHECK_THROWS_WITH(accel::safetensors::load(dir / "gap.safetensors"), Contains("invalid offset for tensor b"));
  write_raw(dir / "trailing.safetensors", two_floats("[0,8]", "[8,16]"), std::string(24, '\0'));
  CHECK_THROWS_WITH(accel::safetensors::load(dir / "trailing.safetensors"),
                    Contains("its tensors' bytes end at 16 of the data, which has 24"));
  write_raw(dir / "reversed.safetensors", two_floats("[8,16]", "[0,8]"), data);  // another order: valid
  CHECK(accel::safetensors::load(dir / "reversed.safetensors").size() == 2);

  // A checkpoint whose second block points at the first block's bytes: load_checkpoint_and_dispatch refuses it.
  auto model = small_model(3);
  accel::save_model(*model, dir / "checkpoint");
  const auto path = dir / "checkpoint" / "model.safetensors";
  auto header = accel::safetensors::detail::read_header(path);
  std::string text = "{";
  std::string moved;
  for (const auto& [name, entry] : header.entries) {
    auto offsets = entry.offsets;
    if (name == "blocks.1.up.weight") {
      for (const auto& [other, first] : header.entries)
        if (other == "blocks.0.up.weight") offsets = first.offsets;
      moved = name;
    }
    std::string shape;
    for (const auto d : entry.shape) shape += (shape.empty() ? "" : ",") + std::to_string(d);
    text += "\"" + name + "\":{\"dtype\":\"" + entry.dtype + "\",\"shape\":[" + shape + "],\"data_offsets\":[" +
            std::to_string(offsets[0]) + "," + std::to_string(offsets[1]) + "]},";
  }
  text.back() = '}';
  REQUIRE(moved == "blocks.1.up.weight");
  std::ifstream in(path, std::ios::binary);
  const std::string whole(std::istreambuf_iterator<char>(in), {});
  write_raw(path, text, whole.substr(header.data_begin));
  OffloadLM empty{nullptr};
  {
    accel::init_empty_weights scope;
    empty = OffloadLM(20, 8, 16, 2);
  }
  CHECK_THROWS_WITH(accel::load_checkpoint_and_dispatch(*empty, path, {.map = {{"", map_device::cpu()}}}),
                    Contains("invalid offset for tensor"));
}

TEST_CASE("safetensors_nested_index", "[redteam56]") {
  // An index nested a million levels deep in its metadata: refused at the depth limit, not a recursion that
  // overflows the stack. One reader for every index (the weight map's text scan is gone).
  const auto dir = accel_test::scratch_directory("redteam-nested-index");
  auto model = small_model(4);
  accel::save_model(*model, dir, 2048);  // several parts: an index
  const auto index = dir / "model.safetensors.index.json";
  REQUIRE(std::filesystem::exists(index));
  std::ifstream in(index);
  std::string text(std::istreambuf_iterator<char>(in), {});
  const auto metadata = text.find("{\"total_size\"");
  REQUIRE(metadata != std::string::npos);
  text.replace(metadata, 1, "{\"deep\": " + std::string(1000000, '[') + std::string(1000000, ']') + ", ");
  std::ofstream(index, std::ios::trunc) << text;
  OffloadLM empty{nullptr};
  {
    accel::init_empty_weights scope;
    empty = OffloadLM(20, 8, 16, 2);
  }
  CHECK_THROWS_AS(accel::load_checkpoint_and_dispatch(*empty, index, {.map = {{"", map_device::cpu()}}}),
                  accel::checkpoint_error);
  CHECK_THROWS_WITH(accel::load_model(*model, dir), Contains("values nest more than 128 levels deep"));
  // A \u escape without its four hex digits names the file, not std::stoul.
  std::ofstream(index, std::ios::trunc) << "{\"weight_map\": {\"a\\uzzzz\": \"model.safetensors\"}}";
  CHECK_THROWS_WITH(accel::load_model(*model, dir),
                    Contains(index.string()) && Contains("a \\u escape is not followed by 4 hexadecimal digits"));
}

TEST_CASE("safetensors_header_limit", "[redteam56]") {
  // A header that claims 1 GiB is refused before it is read (Python's safetensors refuses headers over 100 MB); a
  // shape whose element count passes 64 bits is refused naming the tensor, not read as a small count.
  const auto dir = accel_test::scratch_directory("redteam-header-limit");
  const auto path = dir / "huge-header.safetensors";
  {
    std::ofstream out(path, std::ios::binary);
    const std::uint64_t length = std::uint64_t{1} << 30;
    out.write(reinterpret_cast<const char*>(&length), sizeof length);
  }
  std::filesystem::resize_file(path, (std::uint64_t{1} << 30) + 64);  // sparse: no disk
  CHECK_THROWS_WITH(accel::safetensors::detail::read_header(path),
                    Contains("its header claims 1073741824 bytes, more than the 100000000 a header may have"));
  OffloadLM empty{nullptr};
  {
    accel::init_empty_weights scope;
    empty = OffloadLM(20, 8, 16, 2);
  }
  CHECK_THROWS_WITH(accel::load_checkpoint_and_dispatch(*empty, path, {.map = {{"", map_device::cpu()}}}),
                    Contains("more than the 100000000 a header may have"));
  std::filesystem::remove(path);
  write_raw(dir / "overflow.safetensors",
            R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,4],"data_offsets":[0,0]}})", "");
  CHECK_THROWS_WITH(accel::safetensors::load(dir / "overflow.safetensors"),
                    Contains("tensor w has a shape of more elements than 64 bits count"));
}

TEST_CASE("pickle_nested", "[redteam56]") {
  // A torch.save pickle of a list nested a million deep (PyTorch's torch.load reads it): refused at the depth limit,
  // not freed by a recursion that overflows the stack. A list that contains itself is refused too.
  const auto deep = "\x80\x02"s + std::string(1000000, ']') + std::string(999999, 'a') + ".";
  CHECK_THROWS_WITH(accel::detail::read_torch_save(torch_save_archive(deep), "deep.bin"),
                    Contains("nests lists, dicts and tuples more than 256 levels deep"));
  const auto shallow = "\x80\x02]]]aa."s;
  CHECK(accel::detail::read_torch_save(torch_save_archive(shallow), "shallow.bin").isList());
  const auto cycle = "\x80\x02]q\x00h\x00"s + "a.";  // L = []; L.append(L), through the memo
  CHECK_THROWS_WITH(accel::detail::read_torch_save(torch_save_archive(cycle), "cycle.bin"),
                    Contains("changes a list or dict after placing it in another"));

  // Through load_state of an Accelerate checkpoint: its optimizer.bin replaced by the deep pickle.
  const auto dir = accel_test::scratch_directory("redteam-pickle");
  accel::accelerator<> acc{{.cpu = true}};
  torch::nn::Linear net(2, 1);
  torch::optim::SGD sgd(net->parameters(), 0.1);
  auto prepared = acc.prepare(net, sgd);
  acc.save_state(dir / "ckpt", {.files = accel::file_set::accelerate});
  std::ofstream(dir / "ckpt" / "optimizer.bin", std::ios::binary | std::ios::trunc) << torch_save_archive(deep);
  CHECK_THROWS_WITH(acc.load_state(dir / "ckpt"), Contains("more than 256 levels deep"));
}

TEST_CASE("device_map_unknown_key", "[redteam56]") {
  // "blokc1" names no module: Accelerate warns; accel refuses it, naming it, before anything is placed.
  auto model = small_model(5);
  CHECK_THROWS_WITH(accel::dispatch_model(*model, {{"", map_device::cpu()}, {"blokc1", map_device::cpu()}}),
                    Contains("the device map's key \"blokc1\" names no module, parameter or buffer of the model") &&
                        Contains("its top-level modules are embed, blocks, head"));
  CHECK_NOTHROW(
      (void)accel::dispatch_model(*model, {{"blocks.0.up.weight", map_device::cpu()}, {"", map_device::cpu()}}));
}

TEST_CASE("mesh_total_overflow", "[redteam56]") {
  // 641 x 6700417 = 2^32 + 1: an int's product wraps to 1, which took it for a mesh of one process.
  const accel::mesh_sizes wraps{.dp_replicate = 641, .dp_shard = 6700417};
  CHECK(wraps.total() == 4294967297LL);
  CHECK_THROWS_WITH(accel::validate_mesh(wraps, 1), Contains("spans 4294967297 processes"));
  const accel::mesh_sizes past_64_bits{.dp_replicate = 1 << 30, .dp_shard = 1 << 30, .cp = 1 << 30, .tp = 1 << 30};
  CHECK_THROWS_AS(accel::validate_mesh(past_64_bits, 8), accel::mesh_error);
}

TEST_CASE("mlflow_port", "[redteam56]") {
  // Port 99999 would be truncated to 16 bits by the resolver (34463): refused, naming the range.
  CHECK_THROWS_WITH(accel::detail::parse_http_uri("http://127.0.0.1:99999", "MLFLOW_TRACKING_URI"),
                    Contains("its port 99999 is not one of 1 to 65535"));
  CHECK_THROWS_WITH(accel::detail::parse_http_uri("http://127.0.0.1:0", "MLFLOW_TRACKING_URI"),
                    Contains("is not one of 1 to 65535"));
  CHECK(accel::detail::parse_http_uri("http://127.0.0.1:65535", "uri").port == "65535");
}

TEST_CASE("mlflow_response_cap", "[redteam56]") {
  // A server that announces a huge body, or streams one without a length: the client stops at its limit instead of
  // holding what it is sent (1 GiB here would be 1 GiB of resident memory).
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t size = sizeof address;
  REQUIRE(::bind(listener, reinterpret_cast<sockaddr*>(&address), size) == 0);
  REQUIRE(::listen(listener, 4) == 0);
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &size);
  std::atomic<std::int64_t> sent_unbounded{0};
  std::thread server([&] {
    for (const char* head : {"HTTP/1.1 200 OK\r\nContent-Length: 2000000000\r\n\r\n", "HTTP/1.1 200 OK\r\n\r\n"}) {
      const int client = ::accept(listener, nullptr, nullptr);
      std::string request(4096, '\0');
      (void)::recv(client, request.data(), request.size(), 0);
      std::int64_t sent = ::send(client, head, std::strlen(head), MSG_NOSIGNAL);
      const std::string chunk(1 << 20, 'x');
      while (sent < (std::int64_t{1} << 30)) {
        const auto n = ::send(client, chunk.data(), chunk.size(), MSG_NOSIGNAL);
        if (n <= 0) break;
        sent += n;
      }
      if (head[17] == '\r') sent_unbounded = sent;  // the second: a body ended by the close
      ::close(client);
    }
  });
  const accel::detail::http_endpoint endpoint{
      .host = "127.0.0.1", .port = std::to_string(ntohs(address.sin_port)), .base_path = ""};
  const auto request = accel::detail::http_request_text(endpoint, "GET", "/");
  const accel::detail::http_timeouts timeouts{std::chrono::seconds(5), std::chrono::seconds(60)};
  CHECK_THROWS_WITH(accel::detail::http_exchange(endpoint, request, timeouts),
                    Contains("announces a body of 2000000000 bytes, more than the 16777216 a response may have"));
  CHECK_THROWS_WITH(accel::detail::http_exchange(endpoint, request, timeouts),
                    Contains("response passes 16777216 bytes"));
  server.join();
  ::close(listener);
  CHECK(sent_unbounded < (std::int64_t{64} << 20));  // it stopped reading near its limit, not at 1 GiB
}

TEST_CASE("fused_parts_message", "[redteam56]") {
  // 6 output features in 2 fused parts of 3: tp = 2 divides 6, but not the parts of 3, which is what is split.
  auto weight = torch::zeros({6, 4});
  CHECK_THROWS_WITH(accel::detail::tp::keep_slice("qkv", weight, 0, 0, 2, "output features", 2),
                    "accel::parallelize_module: \"qkv\" has 6 output features in 2 fused parts of 3, which tp = 2 does "
                    "not divide; choose a tp size that divides each part, or leave the layer whole");
  CHECK_THROWS_WITH(accel::detail::tp::keep_slice("fc", weight, 0, 0, 4, "output features"),
                    Contains("\"fc\" has 6 output features, which tp = 4 does not divide"));
}
