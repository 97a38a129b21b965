# Gloo's code comes from LibTorch alone: the binaries that use data_parallel<gloo> define no gloo:: symbol (Gloo's
# headers, from Debian's libgloo-dev when LibTorch is PyTorch's wheel, contribute declarations only) and link no Gloo
# library. Arguments: -DBINARIES=a;b -DNM=nm.
foreach(binary IN LISTS BINARIES)
  execute_process(COMMAND ${NM} --defined-only --demangle ${binary} RESULT_VARIABLE rc OUTPUT_VARIABLE symbols
                  ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${NM} failed on ${binary}: ${err}")
  endif()
  string(REGEX MATCHALL "[^\n]*gloo::[^\n]*" candidates "${symbols}")
  # Gloo's namespace, not accel::gloo (the backend policy, whose static members -Og emits).
  set(gloo_symbols "")
  foreach(symbol IN LISTS candidates)
    string(REPLACE "accel::gloo::" "" rest "${symbol}")
    if(rest MATCHES "gloo::")
      list(APPEND gloo_symbols "${symbol}")
    endif()
  endforeach()
  list(LENGTH gloo_symbols count)
  if(count GREATER 0)
    list(SUBLIST gloo_symbols 0 5 first)
    string(REPLACE ";" "\n  " first "${first}")
    message(FATAL_ERROR "${binary} defines ${count} gloo:: symbols (a second copy of Gloo's code), such as:\n  ${first}")
  endif()
  file(GET_RUNTIME_DEPENDENCIES EXECUTABLES ${binary} RESOLVED_DEPENDENCIES_VAR libraries
       UNRESOLVED_DEPENDENCIES_VAR unresolved)
  foreach(library IN LISTS libraries)
    get_filename_component(name ${library} NAME)
    if(name MATCHES "gloo")
      message(FATAL_ERROR "${binary} links ${library}: Gloo must come from libtorch_cpu alone")
    endif()
  endforeach()
  message(STATUS "${binary}: no gloo:: symbol defined, no Gloo library among ${libraries}")
endforeach()
