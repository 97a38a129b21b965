/// \file
/// `ring_for`: the ring (detail/context_parallel/ring.hpp) of this process's "cp" group, over the communicator of the
/// accelerator's parallel policy, made once per process.
// IWYU pragma: private, include <accel/context_parallel.hpp>
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>

#include "../../collectives.hpp"
#include "../../device_mesh.hpp"
#include "ring.hpp"

namespace accel::detail::cp {

/// The ring of this process's "cp" group of `mesh` over the job's communicator `world`, made once per process (the
/// group is the mesh's, kept for the process's life, so that autograd may reach it after the scope).
template <class Communicator>
ring& ring_for(Communicator& world, const mesh_layout& mesh) {
  auto& group = mesh_group(world, "cp", mesh.group_of("cp", world.rank()));
  static std::mutex guard;
  static auto* const made = new std::map<const void*, ring>();
  std::lock_guard lock(guard);
  auto [found, fresh] = made->try_emplace(&group);
  if (fresh) {
    auto& made_ring = found->second;
    made_ring.rank = group.rank();
    made_ring.size = group.size();
    made_ring.all_gather = [&group](at::Tensor& output, at::Tensor& input) {
      group.all_gather_into(output, input).wait();
    };
    made_ring.reduce_scatter = [&group](at::Tensor& output, at::Tensor& input) {
      group.reduce_scatter_into(output, input).wait();
    };
    made_ring.exchange = [&group](at::Tensor& send, at::Tensor& receive) {
      const int size = group.size();
      auto pending = std::make_shared<typename Communicator::work>(
          group.exchange(send, (group.rank() + 1) % size, receive, (group.rank() + size - 1) % size));
      return std::function<void()>([pending] { pending->wait(); });
    };
  }
  return found->second;
}

/// One process is its own cp group: nothing to pass around.
inline ring& ring_for(const local_communicator&, const mesh_layout&) {
  static ring alone;
  return alone;
}

}  // namespace accel::detail::cp
