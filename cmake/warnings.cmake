# Common compile options for Loom's own targets (sanitizers come from the presets' flags).
function(loom_target_options target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers -Werror=return-type>)
endfunction()
