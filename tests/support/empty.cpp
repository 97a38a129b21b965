// The translation unit that builds the compile-fail tests' precompiled header (tests/CMakeLists.txt).
