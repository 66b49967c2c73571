// The error of a load that does not match its model (load_into, load_gpt2_hf_weights).
#pragma once

#include <string>
#include <vector>

namespace mg::nn {

// Throws mg::Error "<what>\n  missing from the file (n):\n    ..." listing each non-empty list,
// unless all three are empty.
void throw_if_mismatched(const std::string& what, const std::vector<std::string>& missing,
                         const std::vector<std::string>& unexpected, const char* mismatched_title,
                         const std::vector<std::string>& mismatched);

}  // namespace mg::nn
