// What the apps share under mpirun (mg::dist): only rank 0 prints, evaluates and writes files,
// and an error names the rank that hit it.
#pragma once

#include <cstdio>
#include <string>

#include <minigrad/dist/dist.h>

inline bool lead() { return mg::dist::rank() == 0; }

inline std::string rank_prefix() {
  return mg::dist::world_size() > 1 ? "rank " + std::to_string(mg::dist::rank()) + " of " +
                                          std::to_string(mg::dist::world_size()) + ": "
                                    : "";
}

#define LEAD_PRINTF(...) (lead() ? std::printf(__VA_ARGS__) : 0)
