// Summaries of what the apps measure.
#pragma once

#include <algorithm>
#include <vector>

// The median of v (0 for none): the apps' step time.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}
