// Trackers: CSV, JSON lines and TensorBoard event files, read back exactly (TensorBoard's through
// tensorboard_reader.hpp, written from the format's documentation); the accelerator's init_trackers / log /
// end_training. Python reads the JSON lines file in tests/scripts/check_jsonl.py; 2 processes in
// test_distributed.cpp.
#include <catch2/catch.hpp>

#include <accel/tracking.hpp>

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "support.hpp"
#include "tensorboard_reader.hpp"
#include "recording_tracker.hpp"

namespace {

using Catch::Contains;
using tensorboard_reader::event_file;

std::filesystem::path tracking_scratch(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / ("accel_tracking_" + name + "_" + std::to_string(::getpid()));
  accel::detail::remove_tree(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

accel::options logging_to(const std::filesystem::path& dir, std::vector<accel::tracker> trackers) {
  return {.project = {.project_dir = dir.string()}, .log_with = std::move(trackers)};
}

double now() { return accel::detail::wall_time(); }

std::vector<std::string> lines_of(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

/// `text` with each wall time (group 2 of `pattern`, after group 1) replaced by W, having checked that it lies in
/// [from, to].
std::string without_wall_times(const std::string& text, const std::regex& pattern, double from, double to) {
  std::string out;
  auto rest = text.cbegin();
  for (std::sregex_iterator match(text.begin(), text.end(), pattern), end; match != end; ++match) {
    const double t = std::stod((*match)[2]);
    CHECK((t >= from && t <= to));
    out.append(rest, (*match)[2].first).append("W");
    rest = (*match)[2].second;
  }
  return out.append(rest, text.cend());
}
const std::regex csv_wall_time(R"((^|\n)([0-9]+(?:\.[0-9]+)?)(?=,))");
const std::regex json_wall_time(R"((\"wall_time\": )([0-9]+(?:\.[0-9]+)?))");

using accel_test::recording_tracker;

const double infinity = std::numeric_limits<double>::infinity();
const double not_a_number = std::numeric_limits<double>::quiet_NaN();

}  // namespace

TEST_CASE("CRC-32C: the standard check value, RFC 3720's vectors and TFRecord's masking", "[tracking]") {
  using accel::detail::crc32c;
  using accel::detail::masked_crc32c;
  const std::string check = "123456789";
  CHECK(crc32c(check) == 0xE3069283u);
  CHECK(crc32c("") == 0u);
  CHECK(crc32c(std::string(32, '\0')) == 0x8A9136AAu);
  CHECK(crc32c(std::string(32, '\xFF')) == 0x62A8AB43u);
  std::string ascending;
  for (int i = 0; i < 32; ++i) ascending += static_cast<char>(i);
  CHECK(crc32c(ascending) == 0x46DD794Eu);
  // ((0xE3069283 >> 15) | (0xE3069283 << 17)) + 0xa282ead8, modulo 2^32.
  CHECK(masked_crc32c(check) == 0xC78AB0E5u);
  // The test's reader computes them independently.
  CHECK(tensorboard_reader::crc32c(check) == 0xE3069283u);
  CHECK(tensorboard_reader::masked_crc32c(check) == 0xC78AB0E5u);
  CHECK(tensorboard_reader::crc32c(ascending) == 0x46DD794Eu);
}

TEST_CASE("tensorboard: every record checks out and decodes to the scalars logged", "[tracking]") {
  const auto dir = tracking_scratch("tensorboard");
  const double before = now();
  {
    accel::accelerator<> acc(logging_to(dir, {accel::tracker::tensorboard}));
    acc.init_trackers("run");
    acc.log({{"loss", 0.5}, {"lr", 0.01}}, 1);
    acc.log({{"loss", 0.25f}, {"epoch", 3}}, 2);
    acc.log({{"loss", 1.0 / 3}, {std::string(200, 't'), -7.5}}, 1'000'000'000'000);  // multi-byte varints
    acc.end_training();
  }
  const double after = now();
  const auto file = event_file(dir / "run");
  CHECK(std::regex_match(file.filename().string(), std::regex(R"(events\.out\.tfevents\.[0-9]{10}\.[^./][^/]*)")));

  const auto events = tensorboard_reader::read_events(file);
  REQUIRE(events.size() == 7);  // the file version, then one event per scalar
  CHECK(events[0].file_version == "brain.Event:2");
  CHECK(events[0].scalars.empty());
  struct expected {
    std::string tag;
    std::int64_t step;
    float value;
  };
  const std::vector<expected> scalars = {{"loss", 1, 0.5f},
                                         {"lr", 1, 0.01f},
                                         {"loss", 2, 0.25f},
                                         {"epoch", 2, 3.0f},
                                         {"loss", 1'000'000'000'000, static_cast<float>(1.0 / 3)},
                                         {std::string(200, 't'), 1'000'000'000'000, -7.5f}};
  for (std::size_t i = 0; i < scalars.size(); ++i) {
    const auto& e = events[i + 1];
    REQUIRE(e.scalars.size() == 1);
    CHECK(e.scalars[0].tag == scalars[i].tag);
    CHECK(e.scalars[0].value == scalars[i].value);  // exact: stored as float
    CHECK(e.step == scalars[i].step);
    CHECK(e.file_version.empty());
  }
  for (std::size_t i = 0; i < events.size(); ++i) {
    CHECK((events[i].wall_time >= before && events[i].wall_time <= after));
    if (i > 0) CHECK(events[i].wall_time >= events[i - 1].wall_time);
  }
  CHECK(static_cast<std::int64_t>(events[0].wall_time) ==
        std::stoll(file.filename().string().substr(std::string("events.out.tfevents.").size(), 10)));
  accel::detail::remove_tree(dir);
}

TEST_CASE("tensorboard: the reader catches a corrupted byte and a truncated file", "[tracking]") {
  const auto dir = tracking_scratch("corrupt");
  {
    accel::accelerator<> acc(logging_to(dir, {accel::tracker::tensorboard}));
    acc.init_trackers("run");
    acc.log({{"loss", 0.5}}, 1);
  }
  const auto bytes = tensorboard_reader::file_bytes(event_file(dir / "run"));
  REQUIRE(tensorboard_reader::read_events(bytes).size() == 2);
  const auto first_record = 8 + 4 + tensorboard_reader::little_endian(bytes, 0, 8) + 4;
  using tensorboard_reader::read_error;
  auto flipped = [&](std::size_t at) {
    auto copy = bytes;
    copy[at] = static_cast<char>(copy[at] ^ 0x01);
    return copy;
  };
  CHECK_THROWS_WITH(tensorboard_reader::read_events(flipped(first_record + 20)), Contains("data CRC mismatch"));
  CHECK_THROWS_WITH(tensorboard_reader::read_events(flipped(first_record + 1)), Contains("length CRC mismatch"));
  CHECK_THROWS_WITH(tensorboard_reader::read_events(flipped(bytes.size() - 1)), Contains("data CRC mismatch"));
  CHECK_THROWS_AS(tensorboard_reader::read_events(bytes.substr(0, bytes.size() - 3)), read_error);
  accel::detail::remove_tree(dir);
}

TEST_CASE("csv: one row per metric, names quoted, non-finite values as Python writes them", "[tracking]") {
  const auto dir = tracking_scratch("csv");
  const double before = now();
  {
    accel::accelerator<> acc(logging_to(dir, {accel::tracker::csv}));
    acc.init_trackers("run");
    acc.log({{"loss", 0.5}, {"a,b \"c\"", 3}}, 0);
    acc.log({{"loss", not_a_number}, {"acc", -infinity}, {"line\nbreak", 1e-5}}, 1);  // other keys than the first call
    acc.log({{"lr", 2.5e20}}, 2);
  }
  CHECK(without_wall_times(accel_test::text_of(dir / "run" / "metrics.csv"), csv_wall_time, before, now()) ==
        "wall_time,step,name,value\n"
        "W,0,loss,0.5\n"
        "W,0,\"a,b \"\"c\"\"\",3\n"
        "W,1,loss,nan\n"
        "W,1,acc,-inf\n"
        "W,1,\"line\nbreak\",1e-05\n"
        "W,2,lr,2.5e+20\n");
  accel::detail::remove_tree(dir);
}

TEST_CASE("json lines: one object per log call, keys escaped, NaN and Infinity as Python's json", "[tracking]") {
  const auto dir = tracking_scratch("jsonl");
  const double before = now();
  {
    accel::accelerator<> acc(logging_to(dir, {accel::tracker::json_lines}));
    acc.init_trackers("run");
    acc.log({{"loss", 0.5}, {"lr", 0.001}}, 3);
    acc.log({{"say \"hi\"\\\n\t", not_a_number}, {"up", infinity}, {"down", -infinity}, {"count", 42}}, 4);
  }
  CHECK(without_wall_times(accel_test::text_of(dir / "run" / "metrics.jsonl"), json_wall_time, before, now()) ==
        R"({"step": 3, "wall_time": W, "loss": 0.5, "lr": 0.001})"
        "\n"
        R"({"step": 4, "wall_time": W, "say \"hi\"\\\u000a\u0009": NaN, )"
        R"("up": Infinity, "down": -Infinity, "count": 42})"
        "\n");
  accel::detail::remove_tree(dir);
}

TEST_CASE("init_trackers writes config.json in the run directory, under logging_dir when set", "[tracking]") {
  const auto dir = tracking_scratch("config");
  accel::options opts = logging_to(dir / "project", {accel::tracker::csv, accel::tracker::json_lines});
  opts.project.logging_dir = (dir / "logs").string();
  accel::accelerator<> acc(opts);
  acc.init_trackers("run 1", {{"lr", 0.01},
                              {"batch_size", 32},
                              {"optimizer", "adamw"},
                              {"nesterov", true},
                              {"samples", std::size_t{1000}},
                              {"weight_decay", 1e-5f},
                              {"note", std::string("a \"b\"")}});
  CHECK(accel_test::text_of(dir / "logs" / "run 1" / "config.json") ==
        "{\n"
        "  \"lr\": 0.01,\n"
        "  \"batch_size\": 32,\n"
        "  \"optimizer\": \"adamw\",\n"
        "  \"nesterov\": true,\n"
        "  \"samples\": 1000,\n"
        "  \"weight_decay\": 9.999999747378752e-06,\n"
        "  \"note\": \"a \\\"b\\\"\"\n"
        "}\n");
  CHECK(std::filesystem::exists(dir / "logs" / "run 1" / "metrics.csv"));
  CHECK(std::filesystem::exists(dir / "logs" / "run 1" / "metrics.jsonl"));
  CHECK_FALSE(std::filesystem::exists(dir / "project"));
  CHECK_THROWS_WITH(acc.init_trackers("again", {{"lr", 0.1}, {"lr", 0.2}}), Contains("\"lr\" twice"));
  CHECK_THROWS_WITH(acc.init_trackers(""), Contains("project name is empty"));
  accel::detail::remove_tree(dir);
}

TEST_CASE("a tensor metric is read when written, one that is not a single element is refused", "[tracking]") {
  const auto dir = tracking_scratch("tensor");
  auto recorder = std::make_shared<recording_tracker>();
  accel::accelerator<> acc(logging_to(dir, {accel::tracker::json_lines}));
  acc.init_trackers("run", {}, {recorder});
  auto loss = torch::tensor({0.75}, torch::kDouble).sum();
  acc.log({{"loss", loss}, {"hits", torch::tensor({3}, torch::kInt)}}, 5);
  CHECK(recorder->logged == std::vector<recording_tracker::entry>{{"loss", 0.75, 5}, {"hits", 3.0, 5}});
  CHECK_THAT(lines_of(dir / "run" / "metrics.jsonl").at(0), Contains(R"("loss": 0.75, "hits": 3})"));

  // Reading is lazy: a metric on the meta device (whose item() throws) costs nothing until read.
  const accel::metric unread("loss", torch::empty({}, torch::kMeta));
  CHECK(unread.name == "loss");
  CHECK_THROWS(unread.value());
  CHECK_THROWS_WITH(accel::metric("loss", torch::ones({2, 3})), Contains("\"loss\"") && Contains("[2, 3]"));
  CHECK_THROWS_WITH(accel::metric("loss", torch::Tensor()), Contains("undefined"));
  accel::detail::remove_tree(dir);
}

TEST_CASE("log without a step uses the number of earlier log calls", "[tracking]") {
  auto recorder = std::make_shared<recording_tracker>();
  accel::accelerator<> acc;
  acc.init_trackers("run", {}, {recorder});  // no built-in tracker: no directory either
  acc.log({{"a", 1}});
  acc.log({{"b", 2}}, 10);
  acc.log({{"c", 3}});
  CHECK(recorder->logged == std::vector<recording_tracker::entry>{{"a", 1, 0}, {"b", 2, 10}, {"c", 3, 2}});
  CHECK_FALSE(std::filesystem::exists("run"));
}

TEST_CASE("log before init_trackers: an error naming the fix, without trackers, nothing", "[tracking]") {
  const auto dir = tracking_scratch("early");
  accel::accelerator<> with_trackers(logging_to(dir, {accel::tracker::csv}));
  CHECK_THROWS_AS(with_trackers.log({{"loss", 1}}), std::logic_error);
  CHECK_THROWS_WITH(with_trackers.log({{"loss", 1}}), Contains("acc.init_trackers(\"project\")"));

  accel::accelerator<> without(logging_to(dir, {}));
  without.log({{"loss", torch::empty({}, torch::kMeta)}}, 1);  // not read: no tracker
  without.init_trackers("run");
  without.log({{"loss", 1}});
  // Names that would shadow each other in metrics.jsonl are refused, with or without trackers.
  CHECK_THROWS_WITH(without.log({{"step", 1}}), Contains("may not be called 'step'"));
  CHECK_THROWS_WITH(without.log({{"wall_time", 1}}), Contains("may not be called 'wall_time'"));
  CHECK_THROWS_WITH(without.log({{"loss", 1}, {"lr", 2}, {"loss", 3}}), Contains("'loss' is given twice"));
  without.end_training();
  CHECK(accel::detail::directory_entries(dir).empty());
  accel::detail::remove_tree(dir);
}

TEST_CASE("a user-defined tracker receives the configuration, the metrics and finish, once", "[tracking]") {
  const auto dir = tracking_scratch("user");
  auto recorder = std::make_shared<recording_tracker>();
  {
    accel::accelerator<> acc(logging_to(dir, {accel::tracker::csv}));
    acc.init_trackers("run", {{"lr", 0.5}, {"name", "x"}}, {recorder});
    REQUIRE(recorder->configs.size() == 1);
    CHECK(recorder->configs[0].size() == 2);
    CHECK(recorder->configs[0][0].name == "lr");
    CHECK(std::get<double>(recorder->configs[0][0].value) == 0.5);
    CHECK(std::get<std::string>(recorder->configs[0][1].value) == "x");
    acc.log({{"loss", 2.5}}, 7);
    CHECK(recorder->logged == std::vector<recording_tracker::entry>{{"loss", 2.5, 7}});

    CHECK(&acc.get_tracker("recorder") == recorder.get());
    CHECK(acc.get_tracker(accel::tracker::csv).name() == "csv");
    CHECK_THROWS_WITH(acc.get_tracker(accel::tracker::tensorboard),
                      Contains("\"tensorboard\"") && Contains("options::log_with"));
    CHECK(recorder->finished == 0);
    acc.end_training();
    CHECK(recorder->finished == 1);
    CHECK_THROWS(acc.get_tracker("recorder"));  // finished trackers are gone
  }
  CHECK(recorder->finished == 1);  // the destructor does not finish it again

  auto unfinished = std::make_shared<recording_tracker>();
  {
    accel::accelerator<> acc;
    acc.init_trackers("run", {}, {unfinished});
  }
  CHECK(unfinished->finished == 1);  // the destructor finishes what end_training did not
  accel::detail::remove_tree(dir);
}

TEST_CASE("every file is complete after each log, without end_training, end_training closes them", "[tracking]") {
  const auto dir = tracking_scratch("flush");
  using accel::tracker;
  accel::accelerator<> acc(logging_to(dir, {tracker::csv, tracker::json_lines, tracker::tensorboard}));
  acc.init_trackers("run");
  const auto run = dir / "run";
  for (int step = 0; step < 3; ++step) {
    acc.log({{"loss", 1.0 / (step + 1)}, {"lr", 0.1}}, step);
    CHECK(lines_of(run / "metrics.csv").size() == 1 + 2 * static_cast<std::size_t>(step + 1));
    CHECK(lines_of(run / "metrics.jsonl").size() == static_cast<std::size_t>(step + 1));
    const auto events = tensorboard_reader::read_events(event_file(run));  // every record whole
    REQUIRE(events.size() == 1 + 2 * static_cast<std::size_t>(step + 1));
    CHECK(events.back().step == step);
  }
  auto& tensorboard = acc.get_tracker(accel::tracker::tensorboard);
  acc.end_training();
  CHECK_THROWS_WITH(tensorboard.log({{"late", 1}}, 3), Contains("closed") && Contains("end_training"));
  acc.log({{"late", 1}}, 3);  // after end_training: no tracker left, nothing written
  CHECK(lines_of(run / "metrics.csv").size() == 7);
  CHECK(tensorboard_reader::read_events(event_file(run)).size() == 7);
  accel::detail::remove_tree(dir);
}

TEST_CASE("a resumed run appends to its files: one CSV header", "[tracking]") {
  const auto dir = tracking_scratch("resume");
  for (int run = 0; run < 2; ++run) {
    accel::accelerator<> acc(logging_to(dir, {accel::tracker::csv, accel::tracker::json_lines}));
    acc.init_trackers("run");
    acc.log({{"loss", run}}, run);
  }
  const auto csv = lines_of(dir / "run" / "metrics.csv");
  REQUIRE(csv.size() == 3);
  CHECK(csv[0] == "wall_time,step,name,value");
  CHECK_THAT(csv[2], Catch::EndsWith(",1,loss,1"));
  CHECK(lines_of(dir / "run" / "metrics.jsonl").size() == 2);
  accel::detail::remove_tree(dir);
}

TEST_CASE("a logging directory that cannot be created names the path and the OS error", "[tracking]") {
  const auto dir = tracking_scratch("unwritable");
  std::ofstream(dir / "a_file") << "not a directory";
  accel::accelerator<> acc(logging_to(dir / "a_file", {accel::tracker::csv}));
  CHECK_THROWS_WITH(acc.init_trackers("run"), Contains((dir / "a_file" / "run").string()) &&
                                                  Contains("Not a directory") && Contains("logging_dir"));
  accel::detail::remove_tree(dir);
}

// Not run by default (hidden): tests/scripts/check_jsonl.py runs it, then reads the file with Python's json.
TEST_CASE("write a JSON lines file for Python", "[.python_jsonl]") {
  const char* where = std::getenv("ACCEL_TRACKING_DIR");
  REQUIRE(where != nullptr);
  accel::accelerator<> acc(logging_to(where, {accel::tracker::json_lines}));
  acc.init_trackers("run", {{"lr", 0.01}, {"optimizer", "adamw"}, {"nesterov", false}, {"ratio", not_a_number}});
  acc.log({{"loss", 0.5}, {"lr", 0.001}}, 0);
  acc.log({{"loss", 1.0 / 3}, {"up", infinity}, {"down", -infinity}, {"missing", not_a_number}});
  acc.log({{"say \"hi\"\\\n\t", 2.5e-300}, {"na\xc3\xafve", 1e300}, {"count", 42}, {"loss", torch::tensor(0.125)}}, 7);
  acc.end_training();
}

// Not run by default (hidden): tests/scripts/check_tensorboard.py runs it, then reads the event file with the
// tensorboard package's EventAccumulator and compares every scalar.
TEST_CASE("write a TensorBoard file for Python", "[.python_tensorboard]") {
  const char* where = std::getenv("ACCEL_TRACKING_DIR");
  REQUIRE(where != nullptr);
  accel::accelerator<> acc(logging_to(where, {accel::tracker::tensorboard}));
  acc.init_trackers("run");
  for (int step = 0; step < 50; ++step) acc.log({{"loss", 1.0 / (step + 1)}, {"lr", 0.001 * step}}, step);
  acc.log({{"train/accuracy", 0.875}, {"count", 42}, {"loss", torch::tensor(0.125)}, {"big", 1e30}, {"tiny", -2.5e-30}},
          100);
  acc.log({{"loss", infinity}, {"big", -infinity}, {"tiny", not_a_number}}, 101);
  acc.end_training();
}

// MLflow (accel::mlflow_tracker): the HTTP client's parsing, the REST API's bodies and Accelerate's rules for params.
// tests/programs/mlflow_training.cpp logs into a real `mlflow server` for tests/scripts/check_mlflow.py.
TEST_CASE("http: status lines, Content-Length, chunked and close-delimited bodies", "[tracking][mlflow]") {
  using accel::detail::parse_http_response;
  const std::string head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\ncontent-length: 10\r\n\r\n";
  CHECK_FALSE(parse_http_response("HTTP/1.1 200 OK\r\nContent-Le", false));
  CHECK_FALSE(parse_http_response(head + "{\"a\": ", false));
  auto whole = parse_http_response(head + "{\"a\": \"b\"}" + "extra", false);
  REQUIRE(whole);
  CHECK(whole->status == 200);
  CHECK(whole->body == "{\"a\": \"b\"}");
  CHECK_THROWS_WITH(parse_http_response(head + "{\"a\"", true), Contains("before the whole HTTP body"));

  const std::string chunked = "HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n";
  CHECK_FALSE(parse_http_response(chunked + "4\r\nabcd\r\n", false));
  CHECK_FALSE(parse_http_response(chunked + "4\r\nabcd\r\na;ext=1\r\n0123456789\r\n0\r\n", false));
  auto dechunked = parse_http_response(chunked + "4\r\nabcd\r\na;ext=1\r\n0123456789\r\n0\r\n\r\n", false);
  REQUIRE(dechunked);
  CHECK(dechunked->status == 404);
  CHECK(dechunked->body == "abcd0123456789");
  CHECK_THROWS_WITH(parse_http_response(chunked + "zz\r\n", false), Contains("chunk size"));

  const std::string unsized = "HTTP/1.0 503 Service Unavailable\r\nServer: x\r\n\r\ndown";
  CHECK_FALSE(parse_http_response(unsized, false));
  auto closed = parse_http_response(unsized, true);
  REQUIRE(closed);
  CHECK(closed->status == 503);
  CHECK(closed->body == "down");
  CHECK_THROWS_WITH(parse_http_response("SSH-2.0-OpenSSH\r\n\r\n", false), Contains("malformed HTTP status line"));
  CHECK_THROWS_WITH(parse_http_response("HTTP/1.1 2x0 OK\r\n\r\n", false), Contains("status code"));
  CHECK_THROWS_WITH(parse_http_response("HTTP/1.1 200", true), Contains("before a complete HTTP response"));
}

TEST_CASE("http: URIs, https refused naming the fix, the request's text", "[tracking][mlflow]") {
  using accel::detail::parse_http_uri;
  const auto plain = parse_http_uri("http://127.0.0.1:5000", "uri");
  CHECK(plain.host == "127.0.0.1");
  CHECK(plain.port == "5000");
  CHECK(plain.base_path.empty());
  const auto proxied = parse_http_uri("http://tracking.internal/mlflow/", "uri");
  CHECK(proxied.host == "tracking.internal");
  CHECK(proxied.port == "80");
  CHECK(proxied.base_path == "/mlflow");
  CHECK_THROWS_WITH(parse_http_uri("https://mlflow.example.com", "MLFLOW_TRACKING_URI"),
                    Contains("MLFLOW_TRACKING_URI") && Contains("plain http:// only") && Contains("proxy"));
  CHECK_THROWS_WITH(parse_http_uri("file:///tmp/mlruns", "uri"), Contains("expected an http://host:port URI"));
  CHECK_THROWS_WITH(parse_http_uri("http://host:50x0", "uri"), Contains("port is not a number"));
  CHECK(accel::detail::http_request_text(proxied, "POST", "/api/2.0/mlflow/runs/create", "{}") ==
        "POST /mlflow/api/2.0/mlflow/runs/create HTTP/1.1\r\nHost: tracking.internal:80\r\nContent-Type: "
        "application/json\r\nContent-Length: 2\r\nConnection: close\r\nUser-Agent: accel\r\n\r\n{}");
  CHECK(accel::detail::http_request_text(plain, "GET", "/x?name=" + accel::detail::url_encode("a b/é-_.~")) ==
        "GET /x?name=a%20b%2F%C3%A9-_.~ HTTP/1.1\r\nHost: 127.0.0.1:5000\r\nConnection: close\r\nUser-Agent: "
        "accel\r\n\r\n");
}

TEST_CASE("mlflow: the REST API's JSON bodies, exact", "[tracking][mlflow]") {
  using namespace accel::detail;
  CHECK(mlflow_log_batch_fields({{"loss", 0.1, 1795000000123, 7}, {"x\"y", not_a_number, 5, -1}}, {}, {}) ==
        R"("metrics": [{"key": "loss", "value": 0.1, "timestamp": 1795000000123, "step": 7}, )"
        R"({"key": "x\"y", "value": "NaN", "timestamp": 5, "step": -1}], "params": [], "tags": [])");
  CHECK(mlflow_log_batch_fields({}, {{"lr", "0.001"}, {"name", "a\nb"}}, {{"team", "vision"}}) ==
        R"("metrics": [], "params": [{"key": "lr", "value": "0.001"}, {"key": "name", "value": "a\u000ab"}], )"
        R"("tags": [{"key": "team", "value": "vision"}])");
  CHECK(mlflow_run_body("abc", mlflow_update_fields("FINISHED", 42)) ==
        R"({"run_id": "abc", "status": "FINISHED", "end_time": 42})");
  CHECK(mlflow_update_fields("RUNNING", 42) == R"("status": "RUNNING")");
  CHECK(mlflow_create_run_body("3", "first", 9, {{"k", "v"}}) ==
        R"({"experiment_id": "3", "start_time": 9, "tags": [{"key": "k", "value": "v"}], "run_name": "first"})");
  CHECK(proto_double(infinity) == "\"Infinity\"");
  CHECK(proto_double(-infinity) == "\"-Infinity\"");
  CHECK(proto_double(1e-300) == "1e-300");
  CHECK(json_string_field(R"({"experiment": {"experiment_id" : "12", "name": "a"}})", "experiment_id") == "12");
  CHECK(json_string_field(R"({"run": {"info": {"run_id": "ab\"c\u00e9"}}})", "run_id") == "ab\"c\xC3\xA9");
  CHECK_FALSE(json_string_field(R"({"run_idx": "1", "x": "run_id"})", "run_id"));
}

TEST_CASE("mlflow: params as Python's str writes them, and MLflow's length limit drops a value", "[tracking][mlflow]") {
  using accel::detail::python_float_text;
  CHECK(python_float_text(0.001) == "0.001");
  CHECK(python_float_text(1e-5) == "1e-05");
  CHECK(python_float_text(3.0) == "3.0");
  CHECK(python_float_text(100000.0) == "100000.0");
  CHECK(python_float_text(1e16) == "1e+16");
  CHECK(python_float_text(123456789012345.6) == "123456789012345.6");
  CHECK(python_float_text(-0.0) == "-0.0");
  CHECK(python_float_text(0.1 + 0.2) == "0.30000000000000004");
  CHECK(python_float_text(not_a_number) == "nan");
  CHECK(python_float_text(-infinity) == "-inf");
  const accel::hyperparameters config = {{"shuffle", true},
                                         {"epochs", 3},
                                         {"lr", 2.5e-4},
                                         {"name", "adamw"},
                                         {"fits", std::string(6000, 'x')},
                                         {"too_long", std::string(6001, 'y')}};
  std::vector<std::string> dropped;
  const auto params = accel::mlflow_tracker::params_of(config, dropped);
  CHECK(dropped == std::vector<std::string>{"too_long"});
  REQUIRE(params.size() == 5);
  CHECK(params[0] == std::pair<std::string, std::string>("shuffle", "True"));
  CHECK(params[1].second == "3");
  CHECK(params[2].second == "0.00025");
  CHECK(params[3].second == "adamw");
  CHECK(params[4].second.size() == 6000);
}

TEST_CASE("mlflow: MLFLOW_TAGS and MLFLOW_NESTED_RUN read as Accelerate reads them", "[tracking][mlflow]") {
  using accel::detail::parse_flat_json_object;
  const auto tags = parse_flat_json_object(R"( {"team": "vi\"sion", "trial": 3, "ok": true} )", "MLFLOW_TAGS");
  REQUIRE(tags.size() == 3);
  CHECK(tags[0] == std::pair<std::string, std::string>("team", "vi\"sion"));
  CHECK(tags[1] == std::pair<std::string, std::string>("trial", "3"));
  CHECK(tags[2] == std::pair<std::string, std::string>("ok", "True"));
  CHECK(parse_flat_json_object("{}", "MLFLOW_TAGS").empty());
  CHECK_THROWS_WITH(parse_flat_json_object("team=vision", "MLFLOW_TAGS"), Contains("MLFLOW_TAGS is not a flat JSON"));
  CHECK_THROWS_WITH(parse_flat_json_object(R"({"a": [1]})", "MLFLOW_TAGS"), Contains("not a string or a number"));
  CHECK(accel::detail::parse_python_bool("Yes", "MLFLOW_NESTED_RUN"));
  CHECK_FALSE(accel::detail::parse_python_bool("0", "MLFLOW_NESTED_RUN"));
  CHECK_THROWS_WITH(accel::detail::parse_python_bool("maybe", "MLFLOW_NESTED_RUN"), Contains("MLFLOW_NESTED_RUN"));
  accel::mlflow_settings https;
  https.tracking_uri = "https://mlflow.example.com";
  https.experiment_name = "e";
  CHECK_THROWS_WITH(accel::mlflow_tracker(https), Contains("proxy"));
  accel::mlflow_settings nowhere;
  nowhere.experiment_name = "e";
  CHECK_THROWS_WITH(accel::mlflow_tracker(nowhere), Contains("MLFLOW_TRACKING_URI"));
}

TEST_CASE("mlflow: with the queue full, new metric batches are dropped, params and the end kept",
          "[tracking][mlflow]") {
  accel::mlflow_settings settings;
  settings.tracking_uri = "http://127.0.0.1:1";  // nothing listens: no request ever leaves the queue
  settings.experiment_name = "full";
  settings.queue_capacity = 3;
  settings.finish_timeout = std::chrono::milliseconds(100);
  accel::mlflow_tracker tracker(settings);
  tracker.log({{"loss", 1.0}}, 0);
  tracker.store_init_configuration({{"lr", 0.1}});  // essential: queued beyond the capacity
  for (int step = 1; step < 10; ++step) tracker.log({{"loss", 1.0}}, step);
  CHECK(tracker.dropped() == 8);  // steps 2-9: step 0, the params and step 1 fill the queue
  const auto start = std::chrono::steady_clock::now();
  tracker.finish();
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(2));
  CHECK(tracker.run_id().empty());
}
