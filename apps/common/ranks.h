// What the apps share under mpirun (mg::dist): only rank 0 prints, evaluates and writes files,
// and an error names the rank that hit it.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>

#include <minigrad/dist/dist.h>

// The process group for main's lifetime (MPI_Init under mpirun). A bad MG_DIST_* setting, or an
// MPI that fails to start, is an error message and exit status 2, not an uncaught exception.
inline std::unique_ptr<mg::dist::Session> start_session(const char* app, int* argc, char*** argv) {
  try {
    return std::make_unique<mg::dist::Session>(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", app, e.what());
    std::exit(2);
  }
}

inline bool lead() { return mg::dist::rank() == 0; }

inline std::string rank_prefix() {
  return mg::dist::world_size() > 1 ? "rank " + std::to_string(mg::dist::rank()) + " of " +
                                          std::to_string(mg::dist::world_size()) + ": "
                                    : "";
}

#define LEAD_PRINTF(...) (lead() ? std::printf(__VA_ARGS__) : 0)
