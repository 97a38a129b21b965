// expect-error: accel::fixed_mesh: tp or cp beside pure replication \(dp_replicate > 1, dp_shard == 1\) is refused
#include <accel/device_mesh.hpp>
constexpr auto sizes = accel::fixed_mesh<accel::mesh_sizes{.dp_replicate = 2, .tp = 2}>::sizes;
