// expect-error: accel::fixed_mesh: dp_shard must be at least 1 \(1: no sharding\)
#include <accel/device_mesh.hpp>
constexpr auto sizes = accel::fixed_mesh<accel::mesh_sizes{.dp_replicate = 2, .dp_shard = 0}>::sizes;
