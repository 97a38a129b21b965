// expect-error: accel::pipeline runs its stages in fp32 or bf16
#include <accel/accel.hpp>
#include <accel/pipeline.hpp>
#include <torch/nn/modules/container/sequential.h>
void cut(accel::accelerator<accel::fp16, accel::data_parallel<accel::gloo>>& acc, torch::nn::Sequential net) {
  accel::pipeline pipe(acc, net, {});  // fp16's loss scaling is the accelerator's, not the pipeline's
}
