// dp_accel.cpp, header-only (accel::accel): a file of its own, so that the build compiles it twice.
#include "dp_accel.cpp"
