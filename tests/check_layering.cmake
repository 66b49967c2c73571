# The layering of the tree, checked (ctest: layering). Run by hand with
#   cmake -DROOT=<repository> -P tests/check_layering.cmake
# Floors, bottom up: core < kernels < ops < nn, optim, data, dist. A file may include its own floor
# and those below it, never one above:
#   - core (src/core, include/minigrad/core) includes nothing of kernels, ops, nn, optim or data;
#     it reaches the op layer only through the hooks in src/core/tape.h (Note [op layer hooks]);
#   - kernels include nothing of ops, nn, optim, data or dist; ops nothing of nn, optim, data or dist;
#   - dist (processes and collectives) includes nothing of nn, optim or data.
# And the installed headers (include/minigrad) include only each other and the standard
# library, so a user needs no include path but the package's: no "quoted" include, no Eigen,
# no CUDA header. Every header that names a fixed-width integer type includes <cstdint>.
cmake_minimum_required(VERSION 3.25)
if(NOT ROOT)
  message(FATAL_ERROR "pass -DROOT=<repository root>")
endif()

set(failures "")
function(forbid dir globs pattern why)
  foreach(g ${globs})
    file(GLOB_RECURSE files "${ROOT}/${dir}/${g}")
    foreach(f ${files})
      file(STRINGS "${f}" lines REGEX "^[ \t]*#[ \t]*include")
      foreach(line ${lines})
        if(line MATCHES "${pattern}")
          file(RELATIVE_PATH rel "${ROOT}" "${f}")
          string(STRIP "${line}" line)
          set(failures "${failures}\n  ${rel}: ${line}  (${why})" PARENT_SCOPE)
          set(failures "${failures}\n  ${rel}: ${line}  (${why})")
        endif()
      endforeach()
    endforeach()
  endforeach()
endfunction()

set(code "*.h;*.cpp;*.cu;*.cuh")
forbid(src/core "${code}" "\"(kernels|ops|nn|optim|data|dist)/|<minigrad/(ops|nn|optim|data|dist|cuda)"
       "core must not include a floor above it")
forbid(include/minigrad/core "*.h" "<minigrad/(ops|nn|optim|data|dist|cuda)"
       "core must not include a floor above it")
forbid(src/kernels "${code}" "\"(ops|nn|optim|data|dist)/|<minigrad/(ops|nn|optim|data|dist)"
       "kernels must not include ops, nn, optim, data or dist")
forbid(src/ops "${code}" "\"(nn|optim|data|dist)/|<minigrad/(nn|optim|data|dist)"
       "ops must not include nn, optim, data or dist")
forbid(src/dist "${code}" "\"(nn|optim|data)/|<minigrad/(nn|optim|data)"
       "dist must not include nn, optim or data")
forbid(include/minigrad/dist "*.h" "<minigrad/(nn|optim|data)"
       "dist must not include nn, optim or data")
forbid(include/minigrad "*.h" "#[ \t]*include[ \t]*\""
       "an installed header includes only <minigrad/...> and standard headers")
forbid(include/minigrad "*.h" "<(Eigen|eigen3|unsupported/Eigen|cuda|cublas|cudnn|nccl|mpi|nlohmann|zlib|stb)"
       "an installed header must not need a dependency's include path")

# A header that names a fixed-width integer type includes <cstdint> itself. GCC 12 (Debian 12)
# brings it in through <string> and others; newer ones do not: the GPU machine's compiler stopped
# at include/minigrad/core/device.h's uint8_t (2026-11-27).
foreach(dir include src apps tests)
  file(GLOB_RECURSE headers "${ROOT}/${dir}/*.h" "${ROOT}/${dir}/*.cuh")
  foreach(f ${headers})
    file(READ "${f}" text)
    string(REGEX REPLACE "//[^\n]*" "" code "${text}")  # comments may name the types freely
    if(code MATCHES "(^|[^A-Za-z0-9_])u?int(8|16|32|64|ptr)_t" AND NOT text MATCHES "#include <cstdint>")
      file(RELATIVE_PATH rel "${ROOT}" "${f}")
      set(failures "${failures}\n  ${rel}: names a fixed-width integer type without #include <cstdint>")
    endif()
  endforeach()
endforeach()

if(failures)
  message(FATAL_ERROR "layering violated:${failures}")
endif()
message(STATUS "layering: ok")
