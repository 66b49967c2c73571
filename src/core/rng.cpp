// The sample window of dropout by sample (Note [dropout by sample] in minigrad/core/rng.h).
#include <minigrad/core/error.h>
#include <minigrad/core/rng.h>

namespace mg {

namespace {
thread_local SampleWindow* t_window = nullptr;
}  // namespace

SampleWindow* current_sample_window() { return t_window; }

SampleWindowGuard::SampleWindowGuard(uint64_t key, int64_t first_sample, int64_t sample_stride, int64_t sample_lane)
    : previous_(t_window) {
  MG_CHECK(first_sample >= 0, "SampleWindowGuard: first_sample must be >= 0, got " << first_sample);
  MG_CHECK(sample_stride >= 1 && sample_lane >= 0 && sample_lane < sample_stride,
           "SampleWindowGuard: expected sample_stride >= 1 and 0 <= sample_lane < sample_stride, got stride "
               << sample_stride << ", lane " << sample_lane);
  window_.key = key;
  window_.first_sample = first_sample;
  window_.sample_stride = sample_stride;
  window_.sample_lane = sample_lane;
  t_window = &window_;
}

SampleWindowGuard::~SampleWindowGuard() { t_window = previous_; }

}  // namespace mg
