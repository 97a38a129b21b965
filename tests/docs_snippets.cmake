# Every ```cpp block of docs/ compiled (issue 60): tests/scripts/docs_snippets.py writes the blocks into two
# translation units, each block in a namespace of its own with #line directives that name its Markdown line; the names
# fragments take from their context are declared in tests/docs/snippet_context.hpp (the script's docstring says how a
# block is compiled, and the markers that change it). docs.snippets builds them: a block that does not compile fails
# it, naming the page and line. Compiled only, never linked or run (the examples' and the README snippet's tests run
# code). All the blocks but NCCL's in one unit, so that each accelerator configuration they use is instantiated once,
# with the tests' flags, their precompiled header and accel::compiled, whose extern templates spare it the common
# configurations: about 30 s on a 2-core machine (2.1 GB), and 25 s for the NCCL unit, which cannot use that header.
set(docs_snippets_script ${accel_scripts}/docs_snippets.py)
set(docs_snippets_dir ${CMAKE_CURRENT_BINARY_DIR}/docs_snippets)
# Written when the build needs them, not at configure time: an edit of the docs reruns the script (a second), which
# rewrites only the units whose text changed, not CMake's configuration.
file(GLOB_RECURSE docs_snippets_pages CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/docs/*.md)
file(GLOB docs_snippets_compile_fail CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/compile_fail/*.cpp)
add_custom_command(OUTPUT ${docs_snippets_dir}/summary.txt
                   BYPRODUCTS ${docs_snippets_dir}/snippets_main.cpp ${docs_snippets_dir}/snippets_nccl.cpp
                   COMMAND ${ACCEL_PYTHON} ${docs_snippets_script} ${PROJECT_SOURCE_DIR} ${docs_snippets_dir}
                   DEPENDS ${docs_snippets_script} ${docs_snippets_pages} ${docs_snippets_compile_fail}
                           ${CMAKE_CURRENT_SOURCE_DIR}/docs/snippet_context.hpp
                   COMMENT "Writing the C++ blocks of docs/ as translation units" VERBATIM)

add_library(docs_snippets OBJECT EXCLUDE_FROM_ALL ${docs_snippets_dir}/snippets_main.cpp
                                                  ${docs_snippets_dir}/summary.txt)
# Catch2: docs/testing.md's case includes <catch2/catch.hpp>, which the precompiled header has too.
target_link_libraries(docs_snippets PRIVATE accel_test_support Catch2::Catch2)
target_precompile_headers(docs_snippets REUSE_FROM accel_tests)
set(docs_snippets_targets docs_snippets)
# The blocks that name accel::nccl need the accel::nccl target (ACCEL_WITH_NCCL changes what accel's headers declare,
# so that unit cannot use the precompiled header). Without NCCL they are not compiled, and the test says so.
if(ACCEL_NCCL_FOUND)
  add_library(docs_snippets_nccl OBJECT EXCLUDE_FROM_ALL ${docs_snippets_dir}/snippets_nccl.cpp
                                                         ${docs_snippets_dir}/summary.txt)
  target_link_libraries(docs_snippets_nccl PRIVATE accel_test_support accel::nccl)
  list(APPEND docs_snippets_targets docs_snippets_nccl)
endif()
string(REPLACE ";" "," docs_snippets_targets "${docs_snippets_targets}")
add_test(NAME docs.snippets
         COMMAND ${CMAKE_COMMAND} -DBUILD_DIR=${PROJECT_BINARY_DIR} -DTARGETS=${docs_snippets_targets}
                 -DSUMMARY=${docs_snippets_dir}/summary.txt -P ${accel_scripts}/build_docs_snippets.cmake)
set_tests_properties(docs.snippets PROPERTIES RESOURCE_LOCK build_tree TIMEOUT 900)
