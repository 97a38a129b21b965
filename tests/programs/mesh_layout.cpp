// Prints the mesh layout of `accel::mesh_layout` for a world size and the four sizes (dp_replicate dp_shard cp tp),
// as JSON: every rank's coordinates and, for each dimension and flattened sub-mesh, its group's members and its index
// there. check_mesh_layout.py compares it with PyTorch's init_device_mesh through Accelerate's ParallelismConfig.
// A refused mesh prints its message on stderr and exits with 3.
#include <accel/device_mesh.hpp>

#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

namespace {

void print_list(const std::vector<int>& values) {
  std::cout << '[';
  for (std::size_t i = 0; i < values.size(); ++i) std::cout << (i == 0 ? "" : ", ") << values[i];
  std::cout << ']';
}

void print_rank(const accel::mesh_layout& layout, int rank) {
  std::cout << "{\"rank\": " << rank << ", \"coordinates\": ";
  print_list(layout.coordinates(rank));
  std::cout << ", \"groups\": {";
  const char* separator = "";
  for (const auto& dimension : layout.dimensions()) {
    std::cout << separator << '"' << dimension.name << "\": {\"members\": ";
    print_list(layout.group_of(dimension.name, rank));
    std::cout << ", \"local_rank\": " << layout.local_rank(dimension.name, rank) << '}';
    separator = ", ";
  }
  std::cout << "}}";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::cerr << "usage: mesh_layout WORLD_SIZE DP_REPLICATE DP_SHARD CP TP\n";
    return 2;
  }
  const int world = std::atoi(argv[1]);
  const accel::mesh_sizes sizes{std::atoi(argv[2]), std::atoi(argv[3]), std::atoi(argv[4]), std::atoi(argv[5])};
  try {
    const accel::mesh_layout layout(sizes, world);
    std::cout << "{\"shape\": ";
    print_list(layout.shape());
    std::cout << ", \"ranks\": [";
    for (int rank = 0; rank < world; ++rank) {
      if (rank > 0) std::cout << ", ";
      print_rank(layout, rank);
    }
    std::cout << "]}\n";
  } catch (const accel::mesh_error& e) {
    std::cerr << e.what() << '\n';
    return 3;
  }
  return 0;
}
