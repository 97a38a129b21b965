// The launch environment: what each launcher's variables mean, and the errors for environments that cannot work.
#include <catch2/catch.hpp>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <optional>
#include <string>

#include "support.hpp"

namespace {

const char* const launch_variables[] = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_RANK", "PMI_SIZE",
    "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_LOCAL_RANK",
    "MV2_COMM_WORLD_LOCAL_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_STEP_NUM_TASKS",
    "SLURM_STEP_TASKS_PER_NODE"};

/// Sets exactly `variables` among the launch variables for the scope, restoring the previous environment after.
class scoped_environment {
 public:
  explicit scoped_environment(const std::map<std::string, std::string>& variables) {
    for (const char* name : launch_variables) {
      if (const char* value = std::getenv(name)) saved_[name] = value;
      unsetenv(name);
    }
    for (const auto& [name, value] : variables) setenv(name.c_str(), value.c_str(), 1);
  }
  ~scoped_environment() {
    for (const char* name : launch_variables) unsetenv(name);
    for (const auto& [name, value] : saved_) setenv(name.c_str(), value.c_str(), 1);
  }

 private:
  std::map<std::string, std::string> saved_;
};

}  // namespace

TEST_CASE("no launcher: a world of one", "[launch]") {
  scoped_environment env({});
  auto e = accel::read_process_environment();
  CHECK(e.rank == 0);
  CHECK(e.world_size == 1);
  CHECK(e.standalone());
}

TEST_CASE("torchrun's and accel launch's variables", "[launch]") {
  scoped_environment env({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"},
                          {"MASTER_ADDR", "10.1.2.3"}, {"MASTER_PORT", "1234"}});
  auto e = accel::read_process_environment();
  CHECK(e.rank == 5);
  CHECK(e.world_size == 8);
  CHECK(e.local_rank == 1);
  CHECK(e.local_world_size == 4);
  CHECK(e.master_addr == "10.1.2.3");
  CHECK(e.master_port == 1234);
  CHECK_FALSE(e.single_node());
}

TEST_CASE("mpirun's and SLURM's variables", "[launch]") {
  SECTION("Open MPI") {
    scoped_environment env({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                            {"OMPI_COMM_WORLD_LOCAL_RANK", "2"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}});
    auto e = accel::read_process_environment();
    CHECK(e.rank == 2);
    CHECK(e.world_size == 4);
    CHECK(e.local_rank == 2);
    CHECK(e.master_addr == "127.0.0.1");  // one machine: loopback and the default port, as Accelerate
    CHECK(e.master_port == 29500);
  }
  SECTION("MPICH (PMI)") {
    scoped_environment env({{"PMI_RANK", "1"}, {"PMI_SIZE", "3"}, {"MPI_LOCALRANKID", "1"}, {"MPI_LOCALNRANKS", "3"}});
    auto e = accel::read_process_environment();
    CHECK(e.rank == 1);
    CHECK(e.world_size == 3);
    CHECK(e.local_rank == 1);
    CHECK(e.single_node());
  }
  SECTION("a local size nobody gave is not taken for one machine") {
    scoped_environment env({{"PMI_RANK", "1"}, {"PMI_SIZE", "3"}});
    CHECK_THROWS_WITH(accel::read_process_environment(),
                      Catch::Contains("MASTER_ADDR is not set") && Catch::Contains("MPI_LOCALNRANKS is not set"));
  }
  SECTION("SLURM's srun, uniform layout written as 2(x2)") {
    scoped_environment env({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}, {"SLURM_STEP_NUM_TASKS", "4"},
                            {"SLURM_LOCALID", "1"}, {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"}, {"MASTER_ADDR", "node0"}});
    auto e = accel::read_process_environment();
    CHECK(e.rank == 3);
    CHECK(e.world_size == 4);
    CHECK(e.local_rank == 1);
    CHECK(e.local_world_size == 2);
    CHECK(e.master_addr == "node0");
  }
  SECTION("a SLURM batch script outside srun is one process") {
    scoped_environment env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}});
    CHECK(accel::read_process_environment().world_size == 1);
  }
  SECTION("torchrun's variables win over the surrounding SLURM job's") {
    scoped_environment env({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_WORLD_SIZE", "2"}, {"SLURM_PROCID", "0"},
                            {"SLURM_STEP_NUM_TASKS", "1"}});
    auto e = accel::read_process_environment();
    CHECK(e.rank == 1);
    CHECK(e.world_size == 2);
  }
}

TEST_CASE("inconsistent environments name the variable and the fix", "[launch]") {
  using Catch::Contains;
  SECTION("RANK without WORLD_SIZE") {
    scoped_environment env(std::map<std::string, std::string>{{"RANK", "0"}});
    CHECK_THROWS_WITH(accel::read_process_environment(), Contains("RANK is set but WORLD_SIZE is not") && Contains("accel launch"));
  }
  SECTION("one launcher's variables are never mixed with another's") {
    scoped_environment env({{"OMPI_COMM_WORLD_SIZE", "2"}, {"RANK", "0"}});
    CHECK_THROWS_WITH(accel::read_process_environment(), Contains("RANK is set but WORLD_SIZE is not"));
  }
  SECTION("Open MPI's names in Open MPI's message") {
    scoped_environment env(std::map<std::string, std::string>{{"OMPI_COMM_WORLD_SIZE", "2"}});
    CHECK_THROWS_WITH(accel::read_process_environment(),
                      Contains("OMPI_COMM_WORLD_SIZE is set but OMPI_COMM_WORLD_RANK is not"));
  }
  SECTION("WORLD_SIZE without RANK") {
    scoped_environment env(std::map<std::string, std::string>{{"WORLD_SIZE", "2"}});
    CHECK_THROWS_WITH(accel::read_process_environment(), Contains("WORLD_SIZE is set but RANK is not"));
  }
  SECTION("RANK >= WORLD_SIZE") {
    scoped_environment env({{"RANK", "2"}, {"WORLD_SIZE", "2"}});
    CHECK_THROWS_WITH(accel::read_process_environment(), Contains("RANK=2 must be smaller than WORLD_SIZE=2"));
  }
  SECTION("several machines without MASTER_ADDR") {
    scoped_environment env({{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_WORLD_SIZE", "2"}});
    CHECK_THROWS_WITH(accel::read_process_environment(), Contains("MASTER_ADDR is not set") && Contains("--master_addr"));
  }
  SECTION("not a number") {
    scoped_environment env({{"RANK", "zero"}, {"WORLD_SIZE", "2"}});
    CHECK_THROWS_WITH(accel::read_process_environment(), Contains("RANK=\"zero\" is not an integer"));
  }
  SECTION("port out of range") {
    scoped_environment env({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}});
    CHECK_THROWS_WITH(accel::read_process_environment(), Contains("MASTER_PORT=\"70000\""));
  }
  SECTION("LOCAL_RANK beyond LOCAL_WORLD_SIZE") {
    scoped_environment env({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}});
    CHECK_THROWS_WITH(accel::read_process_environment(), Contains("LOCAL_RANK=\"2\" is not an integer in [0, 1]"));
  }
}

TEST_CASE("a rendezvous port in use is named with the fix", "[launch]") {
  // Hold a port, then ask rank 0 of a 2-process job to serve the rendezvous on it.
  int holder = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(holder >= 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(holder, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
  REQUIRE(::listen(holder, 1) == 0);
  socklen_t length = sizeof address;
  ::getsockname(holder, reinterpret_cast<sockaddr*>(&address), &length);
  accel::process_environment env;
  env.world_size = 2;
  env.local_world_size = 2;
  env.master_port = ntohs(address.sin_port);
  CHECK_THROWS_WITH(accel::detail::gloo_communicator(env, std::chrono::seconds(5)),
                    Catch::Contains("MASTER_PORT=127.0.0.1:" + std::to_string(env.master_port)) &&
                        Catch::Contains("--master_port 0"));
  ::close(holder);
}

TEST_CASE("a process whose peers never come gives up after the timeout", "[launch]") {
  accel::process_environment env;
  env.rank = 1;
  env.world_size = 2;
  env.local_world_size = 2;
  env.master_port = 1;  // nobody serves there
  CHECK_THROWS_WITH(accel::detail::gloo_communicator(env, std::chrono::seconds(2)),
                    Catch::Contains("rank 1 could not join the rendezvous"));
}

TEST_CASE("single process collectives are the identity", "[collectives]") {
  accel::accelerator<> acc{accel::options{.cpu = true}};
  auto t = torch::arange(3);
  CHECK(torch::equal(acc.gather(t), t));
  CHECK(torch::equal(acc.reduce(t), t));
  CHECK(torch::equal(acc.reduce(t, accel::reduction::mean), t));
  CHECK(torch::equal(acc.pad_across_processes(t), t));
  CHECK(torch::equal(acc.broadcast(t), t));
  CHECK(acc.gather_object(std::vector<std::int64_t>{7}) == std::vector<std::int64_t>{7});
  CHECK(acc.gather_object(std::string("x")) == std::vector<std::string>{"x"});
  CHECK_FALSE(acc.check_trigger());
  acc.set_trigger();
  CHECK(acc.check_trigger());
  CHECK_FALSE(acc.check_trigger());
  { auto scope = acc.main_process_first(); }
  CHECK(acc.on_main_process([] { return 3; }) == std::optional<int>(3));
  auto net = torch::nn::Linear(2, 1);
  auto model = acc.prepare(net);
  {
    auto scope = acc.no_sync(model);  // one process: nothing to skip, gradients as usual
    model(torch::ones({1, 2})).sum().backward();
  }
  CHECK(torch::equal(net->weight.grad(), torch::ones({1, 2})));
}

namespace {
/// Sets Accelerate's run variables for the scope.
struct run_variables {
  run_variables(const char* precision, const char* steps) {
    setenv("ACCELERATE_MIXED_PRECISION", precision, 1);
    setenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", steps, 1);
  }
  ~run_variables() {
    unsetenv("ACCELERATE_MIXED_PRECISION");
    unsetenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS");
  }
};

using supported = accel::configs<accel::accelerator<>, accel::accelerator<accel::bf16>,
                                 accel::accelerator<accel::bf16, accel::single_process, accel::accumulate<4>>>;

/// Which configuration dispatch built: its precision and accumulation steps.
std::string picked() {
  return accel::dispatch<supported>(
      accel::read_run_config(),
      [](auto& acc) {
        using type = std::remove_cvref_t<decltype(acc)>;
        return std::string(std::is_same_v<typename type::precision_type, accel::bf16> ? "bf16" : "fp32") + "/" +
               std::to_string(acc.gradient_accumulation_steps());
      },
      {.cpu = true});
}
}  // namespace

TEST_CASE("dispatch builds the compiled configuration the environment asks for", "[dispatch]") {
  scoped_environment no_launcher({});
  {
    run_variables run("no", "1");
    CHECK(picked() == "fp32/1");
  }
  {
    run_variables run("bf16", "1");
    CHECK(picked() == "bf16/1");
  }
  {
    run_variables run("bf16", "4");
    CHECK(picked() == "bf16/4");
  }
  CHECK(picked() == "fp32/1");  // nothing set: full precision, no accumulation
  {
    run_variables run("fp16", "2");
    CHECK_THROWS_WITH(picked(), Catch::Contains("no compiled configuration fits mixed_precision=fp16, "
                                                "gradient_accumulation_steps=2, processes=1") &&
                                    Catch::Contains("accelerator<bf16, single_process, accumulate<4>>"));
  }
}
