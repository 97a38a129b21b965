// accel::compiled: the experiment trackers (CSV, JSON lines, TensorBoard, MLflow over HTTP). (Every impl/*.ipp is
// compiled by exactly one of src/*.cpp; lint.compiled_part checks.)
#include <accel/detail/tracking/impl/http.ipp>
#include <accel/detail/tracking/impl/mlflow.ipp>
#include <accel/detail/tracking/impl/mlflow_sender.ipp>
#include <accel/detail/tracking/impl/tensorboard.ipp>
#include <accel/impl/tracking.ipp>
